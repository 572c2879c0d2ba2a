"""The gather script's archives: the config files' exact bytes, read by GNU tar on the host.

The script names each file's member (``PATH\\0@N/NAME``, N numbering its directory) and then
sends its archives (one per seven directories) concatenated and base64-encoded on one
``#archive`` line (see ``gather.sh``). A file whose member is missing, or is not a plain regular
file (a link or FIFO swapped in after the script looked: tar archives it as what it is, never
following or reading it), is unreadable.

The archives are the host's words, so what they unpack into is bounded as the answer that
carried them is: only the members named for a file are read, only plain regular ones (a sparse
member, a few hundred bytes that would unpack into gigabytes of zeros, is unreadable), and
together at most :data:`~proxgpu.host.base.MAX_OUTPUT` bytes; a member past that is unreadable.

>>> import base64, io, tarfile
>>> buffer = io.BytesIO()
>>> with tarfile.open(fileobj=buffer, mode="w") as tar:
...     member = tarfile.TarInfo("1/200.conf")
...     member.size = 6
...     tar.addfile(member, io.BytesIO(b"cores\\n"))
>>> archived = Archived()
>>> archived.want("/etc/pve/lxc/200.conf", b"1/200.conf")
>>> archived.want("/etc/pve/lxc/201.conf", b"1/201.conf")
>>> archived.unpack(base64.b64encode(buffer.getvalue()))
>>> archived.files()
[('/etc/pve/lxc/200.conf', b'cores\\n'), ('/etc/pve/lxc/201.conf', None)]
"""

from __future__ import annotations

import base64
import binascii
import io

from proxgpu.host.base import MAX_OUTPUT

#: The start of the line that carries the archives.
ARCHIVE_MARKER = b"#archive\t"


class Archived:
    """The files the script put in its archives, and the archives that hold them."""

    def __init__(self, limit: int = MAX_OUTPUT) -> None:
        self._wanted: dict[str, bytes] = {}
        self._archives: list[bytes] = []
        self._limit = limit

    def want(self, path: str, member: bytes) -> None:
        """``path``'s bytes are those of the archive member named ``member``."""
        self._wanted[path] = member

    def unpack(self, encoded: bytes) -> None:
        """Keep the base64 archives ``encoded``, to be read by :meth:`files`."""
        self._archives.append(encoded)

    def files(self) -> list[tuple[str, bytes | None]]:
        """Each wanted file with its bytes, or ``None`` when the archives do not hold them as a
        plain regular member within the bound (see the module's text)."""
        members = self._read(set(self._wanted.values()))
        return [(path, members.get(member)) for path, member in self._wanted.items()]

    def _read(self, names: set[bytes]) -> dict[bytes, bytes]:
        """The plain regular members named in ``names``; a damaged archive ends the reading
        there (what came before is kept; the files it cut off are unreadable)."""
        # Here, not at the top: about 4 ms of imports that only a parsed gather needs.
        import tarfile  # noqa: PLC0415

        found: dict[bytes, bytes] = {}
        budget = self._limit
        for encoded in self._archives:
            try:
                data = base64.b64decode(encoded, validate=True)
                # ignore_zeros: read on past each archive's end, into the next one.
                with tarfile.open(
                    fileobj=io.BytesIO(data),
                    mode="r:",
                    ignore_zeros=True,
                    encoding="utf-8",
                    errors="surrogateescape",
                ) as tar:
                    for member in tar:
                        name = member.name.encode("utf-8", "surrogateescape")
                        # REGTYPE and AREGTYPE only: GNU sparse members (isreg() too) expand.
                        plain = member.type in (tarfile.REGTYPE, tarfile.AREGTYPE)
                        if name not in names or not plain or member.size > budget:
                            continue
                        content = tar.extractfile(member)
                        if content is not None:
                            found[name] = content.read(member.size)
                            budget -= member.size
            except (binascii.Error, tarfile.TarError, EOFError):
                break
        return found
