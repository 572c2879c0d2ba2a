"""Fetch the Proxmox VE sources the tests run, exactly as ``tests/proxmox/sources.toml`` pins them.

``python3 -m tests.proxmox.fetch`` (from the repository's root; standard library and git only)
fetches each pinned commit shallowly (``git fetch --depth 1 URL COMMIT``) from Proxmox's git
server, else its mirror, keeps only the manifest's paths of it, and writes them to the cache
(``$XDG_CACHE_HOME/proxgpu/proxmox-src``, see :func:`tests.proxmox.sources.cache_dir`) or to
``--dest DIR``, one folder per repository with its ``COMMIT``: the layout ``PROXGPU_PROXMOX_SRC``
takes. A repository already there at its commit is not fetched again. A folder is replaced only
once its new copy is complete, so an interrupted fetch leaves the old one.

>>> main(["--help"])  # doctest: +ELLIPSIS
usage: python3 -m tests.proxmox.fetch ...
0
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.proxmox.sources import (
    ENV,
    MANIFEST,
    Repository,
    cache_dir,
    load_manifest,
    problems,
)
from tests.support.pinned import last_line

#: Seconds one git command may take: a repository at depth 1 is a few MB.
GIT_TIMEOUT = 300

# Never ask for credentials (a mirror that moved would otherwise wait for a password), and give
# up on a connection that stalls.
GIT_CONFIG = ["-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=30"]


class FetchError(Exception):
    """A repository could not be fetched; the message is one line naming it and what to do."""


def _git(arguments: list[str], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    git = shutil.which("git")
    if git is None:
        raise FetchError("git not found: install it (apt-get install git), or set " + ENV)
    environment = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        return subprocess.run(
            [git, *GIT_CONFIG, *arguments],
            cwd=cwd,
            env=environment,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as timeout:
        raise FetchError(f"git {arguments[0]} took over {GIT_TIMEOUT} s in {cwd}") from timeout


def _fetch_commit(repository: Repository, git_dir: Path) -> None:
    """Fetch the pinned commit into ``git_dir`` from the server, else the mirror."""
    _git(["init", "-q", str(git_dir)], cwd=git_dir.parent)
    failures = []
    for url in (repository.url, repository.mirror):
        result = _git(
            ["fetch", "-q", "--depth", "1", "--no-tags", url, repository.commit], cwd=git_dir
        )
        if result.returncode == 0:
            return
        failures.append(f"{url}: {last_line(result.stderr)}")
    raise FetchError(
        f"cannot fetch {repository.name} at {repository.commit} ({'; '.join(failures)}): "
        f"check the network, or set {ENV}=DIR to an offline copy"
    )


def _export(repository: Repository, git_dir: Path, tree: Path) -> None:
    """Write the manifest's paths of the pinned commit to ``tree``, with its ``COMMIT``."""
    tree.mkdir()
    result = _git(
        ["--work-tree", str(tree), "checkout", repository.commit, "--", *repository.paths],
        cwd=git_dir,
    )
    if result.returncode != 0:
        raise FetchError(
            f"{repository.name} at {repository.commit} lacks a path of {MANIFEST.name} "
            f"({last_line(result.stderr)}): correct its paths"
        )
    (tree / "COMMIT").write_text(repository.commit + "\n")


def fetch_repository(repository: Repository, destination: Path) -> bool:
    """Make ``destination/NAME`` the pinned paths of ``repository``; False when it already was.

    Raises :class:`FetchError`.
    """
    if not problems(destination, [repository]):
        return False
    destination.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{repository.name}-", dir=destination) as work:
        git_dir = Path(work) / "git"
        git_dir.mkdir()
        _fetch_commit(repository, git_dir)
        tree = Path(work) / "tree"
        _export(repository, git_dir, tree)
        target = destination / repository.name
        if target.exists():
            target.rename(Path(work) / "old")
        tree.rename(target)
    return True


def fetch(repositories: Sequence[Repository], destination: Path) -> list[str]:
    """Fetch every repository (see :func:`fetch_repository`); one report line each."""
    reports = []
    for repository in repositories:
        fetched = fetch_repository(repository, destination)
        state = "fetched" if fetched else "already there"
        reports.append(f"{repository.name} {repository.commit[:12]}: {state}")
    return reports


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m tests.proxmox.fetch",
        description="Fetch the Proxmox VE sources pinned in tests/proxmox/sources.toml.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--dest", type=Path, default=cache_dir(), help="the folder to fill (default: %(default)s)"
    )
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: 0 when every repository is there, 1 (one line on stderr) when not."""
    try:
        options = _parser().parse_args(argv)
    except SystemExit as done:
        return int(done.code or 0)
    try:
        for line in fetch(load_manifest(options.manifest), options.dest):
            print(line)
    except FetchError as error:
        print(f"tests.proxmox.fetch: {error}", file=sys.stderr)
        return 1
    print(f"{options.dest}: ready for the tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
