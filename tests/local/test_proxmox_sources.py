"""Fetching and finding the pinned Proxmox sources (tests/proxmox), against real git repositories.

The fetch is never tried against the internet here: each test makes its repositories with git
and serves them by ``file://`` URLs, as Proxmox's server serves the real ones over HTTPS.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from tests.proxmox.fetch import FetchError, fetch, fetch_repository, main
from tests.proxmox.sources import (
    ENV,
    Repository,
    SourcesUnavailableError,
    cache_dir,
    load_manifest,
    locate,
    problems,
)
from tests.support.pvevalidate import PVE_CHECK, proxmox_sources
from tests.support.tools import require_tool

GIT_IDENTITY = ["-c", "user.name=proxgpu tests", "-c", "user.email=tests@proxgpu.invalid"]


def git(repo: Path, *arguments: str) -> str:
    result = subprocess.run(
        ["git", *GIT_IDENTITY, "-C", str(repo), *arguments],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def commit_tree(repo: Path, files: dict[str, str]) -> str:
    """Write ``files`` into ``repo`` (made if absent) and commit them; the commit's id."""
    repo.mkdir(parents=True, exist_ok=True)
    if not (repo / ".git").is_dir():
        git(repo, "init", "-q")
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a commit")
    return git(repo, "rev-parse", "HEAD")


def pinned(repo: Path, commit: str, *, url: str | None = None) -> Repository:
    """A manifest entry for ``repo``: server ``url`` (default: ``repo``), mirror ``repo``."""
    return Repository(
        name=repo.name,
        url=url or repo.as_uri(),
        mirror=repo.as_uri(),
        commit=commit,
        paths=("src/PVE", "debian/copyright"),
    )


@pytest.fixture(autouse=True)
def _git() -> None:
    require_tool("git", "git")


def test_the_pinned_commit_is_fetched_not_the_newest_and_only_its_paths(tmp_path: Path) -> None:
    repo = tmp_path / "upstream" / "pve-common"
    old = commit_tree(
        repo, {"src/PVE/Tools.pm": "old\n", "debian/copyright": "AGPL\n", "Makefile": "all:\n"}
    )
    commit_tree(repo, {"src/PVE/Tools.pm": "new\n"})
    cache = tmp_path / "cache"

    assert fetch_repository(pinned(repo, old), cache) is True

    copy = cache / "pve-common"
    assert (copy / "src/PVE/Tools.pm").read_text() == "old\n"
    assert (copy / "COMMIT").read_text() == f"{old}\n"
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == [
        "COMMIT",
        "debian/copyright",
        "src/PVE/Tools.pm",
    ]
    assert [p.name for p in cache.iterdir()] == ["pve-common"], "no work folder is left"


def test_the_mirror_serves_when_the_server_does_not(tmp_path: Path) -> None:
    repo = tmp_path / "upstream" / "qemu-server"
    commit = commit_tree(repo, {"src/PVE/QemuServer.pm": "1;\n", "debian/copyright": "AGPL\n"})
    gone = (tmp_path / "no-such-server" / "qemu-server").as_uri()

    assert fetch([pinned(repo, commit, url=gone)], tmp_path / "cache") == [
        f"qemu-server {commit[:12]}: fetched"
    ]
    assert not problems(tmp_path / "cache", [pinned(repo, commit)])


def test_a_copy_at_its_commit_is_not_fetched_again(tmp_path: Path) -> None:
    repo = tmp_path / "upstream" / "pve-storage"
    commit = commit_tree(repo, {"src/PVE/Storage.pm": "1;\n", "debian/copyright": "AGPL\n"})
    fetch_repository(pinned(repo, commit), tmp_path / "cache")
    shutil.rmtree(repo)  # no server at all now

    assert fetch_repository(pinned(repo, commit), tmp_path / "cache") is False


def test_a_new_pin_replaces_the_old_copy(tmp_path: Path) -> None:
    repo = tmp_path / "upstream" / "pve-storage"
    first = commit_tree(repo, {"src/PVE/Storage.pm": "first\n", "debian/copyright": "AGPL\n"})
    second = commit_tree(repo, {"src/PVE/Storage.pm": "second\n"})
    fetch_repository(pinned(repo, first), tmp_path / "cache")

    assert fetch_repository(pinned(repo, second), tmp_path / "cache") is True
    assert (tmp_path / "cache/pve-storage/src/PVE/Storage.pm").read_text() == "second\n"


def test_a_commit_no_server_has_is_one_line_naming_the_repository_and_both_urls(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "upstream" / "pve-container"
    commit_tree(repo, {"src/PVE/LXC.pm": "1;\n", "debian/copyright": "AGPL\n"})
    missing = "0123456789abcdef0123456789abcdef01234567"
    entry = pinned(repo, missing, url=(tmp_path / "elsewhere").as_uri())

    with pytest.raises(FetchError) as raised:
        fetch_repository(entry, tmp_path / "cache")

    message = str(raised.value)
    assert "\n" not in message
    assert f"cannot fetch pve-container at {missing}" in message
    assert entry.url in message and entry.mirror in message
    assert message.endswith(f"or set {ENV}=DIR to an offline copy")
    assert not (tmp_path / "cache" / "pve-container").exists()


def test_a_path_the_commit_lacks_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "upstream" / "pve-cluster"
    commit = commit_tree(repo, {"src/PVE/Cluster.pm": "1;\n"})  # no debian/copyright

    with pytest.raises(FetchError, match=r"lacks a path of sources\.toml"):
        fetch_repository(pinned(repo, commit), tmp_path / "cache")


def test_the_command_line_fills_dest_and_says_why_it_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "upstream" / "pve-guest-common"
    commit = commit_tree(repo, {"src/PVE/Mapping/PCI.pm": "1;\n", "debian/copyright": "AGPL\n"})
    manifest = tmp_path / "sources.toml"
    entry = pinned(repo, commit)
    manifest.write_text(
        f'[[repository]]\nname = "{entry.name}"\nurl = "{entry.url}"\nmirror = "{entry.mirror}"\n'
        f'commit = "{commit}"\npaths = ["src/PVE", "debian/copyright"]\n'
    )
    dest = tmp_path / "dest"

    assert main(["--manifest", str(manifest), "--dest", str(dest)]) == 0
    assert (dest / "pve-guest-common/src/PVE/Mapping/PCI.pm").is_file()
    assert "pve-guest-common" in capsys.readouterr().out

    shutil.rmtree(dest)
    shutil.rmtree(repo)
    assert main(["--manifest", str(manifest), "--dest", str(dest)]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("tests.proxmox.fetch: cannot fetch")


# --- finding a copy -------------------------------------------------------------------------------


def _copy_at(directory: Path, repositories: list[Repository]) -> Path:
    for repository in repositories:
        for path in repository.paths:
            (directory / repository.name / path).mkdir(parents=True)
        (directory / repository.name / "COMMIT").write_text(repository.commit + "\n")
    return directory


def test_the_given_copy_wins_and_must_be_complete(tmp_path: Path) -> None:
    pins = load_manifest()
    given = _copy_at(tmp_path / "given", pins)
    beside = _copy_at(tmp_path / "beside", pins)

    assert locate({ENV: str(given)}, pins, beside) == given
    (given / "pve-storage" / "COMMIT").write_text("f" * 40 + "\n")
    with pytest.raises(SourcesUnavailableError, match=f"not in {ENV}=.*pve-storage is not"):
        locate({ENV: str(given)}, pins, beside)


def test_beside_the_repository_then_the_cache(tmp_path: Path) -> None:
    pins = load_manifest()
    environ = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    beside = tmp_path / "shared" / "proxmox-src"
    cached = _copy_at(cache_dir(environ), pins)

    assert locate(environ, pins, beside) == cached
    _copy_at(beside, pins)
    assert locate(environ, pins, beside) == beside


def test_without_any_copy_one_line_names_both_ways_to_get_one(tmp_path: Path) -> None:
    environ = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}

    with pytest.raises(SourcesUnavailableError) as raised:
        locate(environ, load_manifest(), tmp_path / "shared" / "proxmox-src")

    message = str(raised.value)
    assert "\n" not in message
    assert "`python3 -m tests.proxmox.fetch`" in message and f"set {ENV}=DIR" in message


# --- what a fetch gives is what the harness runs ------------------------------------------------


def test_a_fetched_copy_runs_proxmoxs_parsers(tmp_path: Path) -> None:
    """Every pinned repository, rebuilt as a git repository from the copy the suite uses and
    fetched from it, gives pve-check all it loads: the real parsers accept a valid VM and
    container config and reject a broken one in Proxmox's words."""
    perl = require_tool("perl", "perl")
    sources = proxmox_sources()
    entries = []
    for repository in load_manifest():
        repo = tmp_path / "upstream" / repository.name
        for path in repository.paths:
            source, target = sources / repository.name / path, repo / path
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
        entries.append(replace(pinned(repo, commit_tree(repo, {})), paths=repository.paths))
    fetch(entries, tmp_path / "cache")
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "300.conf").write_text("memory: 4096\ncores: 4\nhostpci0: 0000:81:00.0,pcie=1\n")
    (configs / "301.conf").write_text("cores: 0\n")
    (configs / "200.conf").write_text("arch: amd64\ndev0: /dev/nvidia0,mode=0666\n")

    vms, container = (
        [str(configs / "300.conf"), str(configs / "301.conf")],
        str(configs / "200.conf"),
    )
    result = subprocess.run(
        [
            perl,
            str(PVE_CHECK),
            "--sources",
            str(tmp_path / "cache"),
            "qemu",
            *vms,
            "lxc",
            container,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        f"OK {configs / '300.conf'}",
        f"FAIL {configs / '301.conf'}: cores: value must have a minimum value of 1",
        f"OK {configs / '200.conf'}",
    ]
