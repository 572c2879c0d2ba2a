"""Where the tests find Proxmox VE's own sources, pinned in ``tests/proxmox/sources.toml``.

Standard library only: ``.ci/run`` runs :mod:`tests.proxmox.fetch` with the system's python3
before any virtual environment exists. A copy of the sources lays out one folder per repository,
``DIR/NAME/``, holding the manifest's paths of it and a file ``COMMIT`` naming the commit. The
tests use the first of

1. ``PROXGPU_PROXMOX_SRC=DIR`` (an offline copy; used as given, never passed over);
2. ``../shared/proxmox-src`` beside the repository (this project's CI machines);
3. the cache that ``python3 -m tests.proxmox.fetch`` fills (``$XDG_CACHE_HOME/proxgpu``).

>>> [repository.name for repository in load_manifest()][:2]
['qemu-server', 'pve-container']
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.pinned import cache_dir as cache_in

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MANIFEST = HERE / "sources.toml"
ENV = "PROXGPU_PROXMOX_SRC"
BESIDE = REPO.parent / "shared" / "proxmox-src"
FETCH_COMMAND = "python3 -m tests.proxmox.fetch"


class SourcesUnavailableError(Exception):
    """No usable copy of the pinned sources; the message is one line saying how to get one."""


@dataclass(frozen=True)
class Repository:
    """One pinned repository of the manifest."""

    name: str
    url: str
    mirror: str
    commit: str
    paths: tuple[str, ...]


def load_manifest(path: Path = MANIFEST) -> list[Repository]:
    """The repositories ``path`` pins, in its order."""
    data = tomllib.loads(path.read_text())
    return [
        Repository(
            name=entry["name"],
            url=entry["url"],
            mirror=entry["mirror"],
            commit=entry["commit"],
            paths=tuple(entry["paths"]),
        )
        for entry in data["repository"]
    ]


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CACHE_HOME/proxgpu/proxmox-src`` (``~/.cache`` without it), outside the tree.

    >>> cache_dir({"XDG_CACHE_HOME": "/var/cache/me"})
    PosixPath('/var/cache/me/proxgpu/proxmox-src')
    """
    return cache_in("proxmox-src", environ)


def problems(directory: Path, repositories: list[Repository]) -> list[str]:
    """What ``directory`` lacks of the pinned sources: a missing folder, commit or path."""
    found: list[str] = []
    for repository in repositories:
        folder = directory / repository.name
        commit_file = folder / "COMMIT"
        commit = commit_file.read_text().strip() if commit_file.is_file() else None
        if commit != repository.commit:
            found.append(f"{folder} is not {repository.name} at {repository.commit}")
            continue
        found += [f"{folder / p} is missing" for p in repository.paths if not (folder / p).exists()]
    return found


def _how_to_get(where: str) -> str:
    return (
        f"Proxmox VE's sources that the tests run (tests/proxmox/sources.toml) are not {where}: "
        f"fetch them with `{FETCH_COMMAND}` (needs git and network), or set {ENV}=DIR to an "
        f"offline copy laid out like its cache"
    )


def locate(
    environ: Mapping[str, str] = os.environ,
    repositories: list[Repository] | None = None,
    beside: Path = BESIDE,
) -> Path:
    """The directory holding the pinned sources (see the module's order); else
    :class:`SourcesUnavailableError`.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as empty:
    ...     locate({ENV: empty})
    Traceback (most recent call last):
    ...
    tests.proxmox.sources.SourcesUnavailableError: Proxmox VE's sources ...
    """
    pinned = load_manifest() if repositories is None else repositories
    if given := environ.get(ENV):
        wrong = problems(Path(given), pinned)
        if wrong:
            raise SourcesUnavailableError(_how_to_get(f"in {ENV}={given} ({wrong[0]})"))
        return Path(given)
    for candidate in (beside, cache_dir(environ)):
        if not problems(candidate, pinned):
            return candidate
    raise SourcesUnavailableError(_how_to_get(f"beside the repository ({beside}) nor cached"))


def corpus(directory: Path, kind: str) -> list[Path]:
    """Proxmox's own test guest configs of ``kind`` (``qemu`` or ``lxc``) in ``directory``.

    qemu-server's are every ``.conf`` under its ``src/test``; pve-container's are its snapshot
    tests' ``lxc/*.conf`` and each distribution test's ``config`` (not the ``etc/`` files that
    test puts into a container).
    """
    if kind == "qemu":
        return sorted((directory / "qemu-server" / "src" / "test").rglob("*.conf"))
    tests = directory / "pve-container" / "src" / "test"
    return sorted([*tests.glob("snapshot-*/*/lxc/*.conf"), *tests.glob("test-*/config")])
