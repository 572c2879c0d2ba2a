"""Where the tests find the kmod builds that ``tests/kmod/versions.toml`` pins.

Standard library only: ``.ci/run`` runs :mod:`tests.kmod.build` with the system's python3 before
any virtual environment exists. A build of kmod VERSION is ``DIR/VERSION/bin/`` holding ``kmod``
and its other names ``depmod`` and ``modprobe``. The tests use ``PROXGPU_KMOD_BUILDS=DIR``
(prebuilt ones; used as given, never passed over), else the cache that ``python3 -m
tests.kmod.build`` fills (``$XDG_CACHE_HOME/proxgpu/kmod``).

>>> [(release.version, release.proxmox) for release in load_manifest()]
[('28', '7'), ('34.2', '9')]
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.pinned import cache_dir as cache_in

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "versions.toml"
ENV = "PROXGPU_KMOD_BUILDS"
BUILD_COMMAND = "python3 -m tests.kmod.build"
#: The names a build answers to: one binary, which acts on the name it is called by.
TOOLS = ("kmod", "depmod", "modprobe")


class KmodUnavailableError(Exception):
    """No build of a pinned kmod; the message is one line saying how to get one."""


@dataclass(frozen=True)
class Release:
    """One pinned kmod release: Debian's source tarball and what builds it."""

    version: str
    debian: str
    proxmox: str
    url: str
    sha256: str
    build: str

    def __str__(self) -> str:
        return f"kmod {self.version} (Proxmox VE {self.proxmox}, Debian {self.debian})"


def load_manifest(path: Path = MANIFEST) -> list[Release]:
    """The releases ``path`` pins, in its order."""
    data = tomllib.loads(path.read_text())
    return [Release(**entry) for entry in data["kmod"]]


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CACHE_HOME/proxgpu/kmod`` (``~/.cache`` without it), outside the tree.

    >>> cache_dir({"XDG_CACHE_HOME": "/var/cache/me"})
    PosixPath('/var/cache/me/proxgpu/kmod')
    """
    return cache_in("kmod", environ)


def bin_dir(directory: Path, release: Release) -> Path:
    """Where a build of ``release`` keeps its tools under ``directory``."""
    return directory / release.version / "bin"


def missing(directory: Path, release: Release) -> list[str]:
    """The tools of ``release`` that ``directory`` lacks (or holds but cannot run)."""
    tools = bin_dir(directory, release)
    return [str(tools / name) for name in TOOLS if not os.access(tools / name, os.X_OK)]


def _how_to_get(release: Release, where: str) -> str:
    return (
        f"{release} is not built {where}: build it with `{BUILD_COMMAND}` (needs Debian's "
        f"archive once, gcc, make, autotools, meson and ninja), or set {ENV}=DIR to prebuilt "
        f"ones laid out like its cache (DIR/VERSION/bin/kmod, depmod, modprobe)"
    )


def locate(release: Release, environ: Mapping[str, str] = os.environ) -> Path:
    """The directory holding ``release``'s tools (see the module's order); else
    :class:`KmodUnavailableError`.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as empty:
    ...     locate(load_manifest()[0], {ENV: empty})
    Traceback (most recent call last):
    ...
    tests.kmod.builds.KmodUnavailableError: kmod 28 (Proxmox VE 7, Debian 11 bullseye) is not ...
    """
    given = environ.get(ENV)
    directory = Path(given) if given else cache_dir(environ)
    lacking = missing(directory, release)
    if lacking:
        where = f"in {ENV}={given} ({lacking[0]} is missing)" if given else f"in {directory}"
        raise KmodUnavailableError(_how_to_get(release, where))
    return bin_dir(directory, release)
