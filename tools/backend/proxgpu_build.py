"""setuptools' build backend, with ``examples/`` and ``tests/`` in the sdist exactly as they are.

The example hosts are trees of sysfs: ``bus/pci/devices/*`` are symbolic links to the devices'
own directories, and ``driver`` and ``iommu_group`` links whose targets the snapshot does not
hold. setuptools follows links and drops the ones it cannot follow, so an sdist built by it alone
holds each device under one of its two paths, as plain files, and GPUs without drivers.
:func:`build_sdist` replaces those two directories in setuptools' archive with the checkout's,
links kept as links.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

# setuptools ships no type information.
from setuptools import build_meta  # type: ignore[import-untyped]
from setuptools.build_meta import *  # type: ignore[import-untyped]  # noqa: F403 - the rest, as is

SOURCE = Path(__file__).resolve().parents[2]
AS_THEY_ARE = ("examples", "tests")


def entries(top: Path) -> list[Path]:
    """Every directory, file and link under ``top`` (``top`` too), never inside a linked
    directory, without Python's caches."""
    found = [top]
    for where, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [Path(where, name) for name in dirs + sorted(files) if not name.endswith(".pyc")]
    return found


def member(path: Path, name: str) -> tuple[tarfile.TarInfo, bytes | None]:
    """The archive entry for ``path`` under ``name``, with its content if it is a file."""
    info = tarfile.TarInfo(name)
    stat = path.lstat()
    info.mtime = int(stat.st_mtime)
    info.mode = stat.st_mode & 0o7777
    if path.is_symlink():
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
        return info, None
    if path.is_dir():
        info.type = tarfile.DIRTYPE
        return info, None
    content = path.read_bytes()
    info.size = len(content)
    return info, content


def build_sdist(sdist_directory: str, config_settings: dict[str, object] | None = None) -> str:
    """setuptools' sdist, with ``examples/`` and ``tests/`` as the checkout holds them."""
    name = str(build_meta.build_sdist(sdist_directory, config_settings))
    path = Path(sdist_directory) / name
    top = name.removesuffix(".tar.gz")
    replaced = tuple(f"{top}/{under}" for under in AS_THEY_ARE)
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    with tarfile.open(path) as archive:
        for info in archive:
            if info.name in replaced or info.name.startswith(tuple(r + "/" for r in replaced)):
                continue
            data = archive.extractfile(info) if info.isfile() else None
            members.append((info, data.read() if data is not None else None))
    for under in AS_THEY_ARE:
        for entry in entries(SOURCE / under):
            members.append(member(entry, f"{top}/{entry.relative_to(SOURCE).as_posix()}"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, content in members:
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    # mtime=0 in the gzip header: the same sources give the same bytes.
    path.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))
    return name
