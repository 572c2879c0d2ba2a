"""The gather script's archives: the config files' exact bytes, read by GNU tar on the host.

The script names each file's member (``PATH\\0@N/NAME``, N numbering its directory) and then
sends its archives (one per seven directories) concatenated and base64-encoded on one
``#archive`` line (see ``gather.sh``). A file whose member is missing, or is not a regular file
(a link or FIFO swapped in after the script looked: tar archives it as what it is, never
following or reading it), is unreadable.

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

#: The start of the line that carries the archives.
ARCHIVE_MARKER = b"#archive\t"


class Archived:
    """The files the script put in its archives, and the archives' regular members."""

    def __init__(self) -> None:
        self._wanted: dict[str, bytes] = {}
        self._members: dict[bytes, bytes] = {}

    def want(self, path: str, member: bytes) -> None:
        """``path``'s bytes are those of the archive member named ``member``."""
        self._wanted[path] = member

    def unpack(self, encoded: bytes) -> None:
        """Take the regular members of the base64 archives ``encoded``; a damaged one ends the
        reading there (what came before is kept; the files it cut off are unreadable)."""
        # Here, not at the top: about 4 ms of imports that only a parsed gather needs.
        import tarfile  # noqa: PLC0415

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
                    content = tar.extractfile(member) if member.isreg() else None
                    if content is not None:
                        self._members[member.name.encode("utf-8", "surrogateescape")] = (
                            content.read()
                        )
        except (binascii.Error, tarfile.TarError, EOFError):
            return

    def files(self) -> list[tuple[str, bytes | None]]:
        """Each wanted file with its bytes, or ``None`` when the archives do not hold them."""
        return [(path, self._members.get(member)) for path, member in self._wanted.items()]
