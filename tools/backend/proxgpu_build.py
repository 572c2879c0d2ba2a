"""setuptools' build backend, with the example hosts' symbolic links kept in the sdist.

The example hosts are trees of sysfs, where ``driver`` and ``iommu_group`` are symbolic links
whose targets the snapshot does not hold; setuptools lists only files that exist, so it leaves
them out, and the tests run from an sdist would see GPUs without drivers. :func:`build_sdist`
adds every symbolic link under ``examples/`` and ``tests/`` to the archive setuptools made.
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
LINKED = ("examples", "tests")


def build_sdist(sdist_directory: str, config_settings: dict[str, object] | None = None) -> str:
    """setuptools' sdist, with the symbolic links under ``examples/`` and ``tests/`` added."""
    name = str(build_meta.build_sdist(sdist_directory, config_settings))
    path = Path(sdist_directory) / name
    top = name.removesuffix(".tar.gz")
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    with tarfile.open(path) as archive:
        for member in archive:
            data = archive.extractfile(member) if member.isfile() else None
            members.append((member, data.read() if data is not None else None))
    present = {m.name for m, _ in members}
    for under in LINKED:
        for link in sorted((SOURCE / under).rglob("*")):
            if not link.is_symlink() or "__pycache__" in link.parts:
                continue
            info = tarfile.TarInfo(f"{top}/{link.relative_to(SOURCE).as_posix()}")
            if info.name in present:  # a link to a file, which setuptools copied: keep the link
                members = [(m, d) for m, d in members if m.name != info.name]
            info.type = tarfile.SYMTYPE
            info.linkname = os.readlink(link)
            info.mtime = int(link.lstat().st_mtime)
            info.mode = 0o777
            members.append((info, None))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for member, content in members:
            archive.addfile(member, io.BytesIO(content) if content is not None else None)
    # mtime=0: the same sources give the same bytes, as setuptools' own archive does not promise.
    path.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))
    return name
