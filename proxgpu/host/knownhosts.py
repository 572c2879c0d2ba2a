"""known_hosts files read as OpenSSH reads them (sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT").

Each line is ``[@marker] patterns keytype base64 [comment]``: the marker is ``@cert-authority``
(the key is a CA whose host certificates are trusted for those hosts) or ``@revoked`` (the key
must never be accepted); patterns are comma-separated, with ``*``, ``?`` and ``!`` negation, or
one hashed name (``|1|salt|hash``, ``HashKnownHosts``). OpenSSH skips a line it cannot read; here
a damaged line is an error naming its file and line, since a silently skipped line turns a known
host into an unknown (or a revoked key into an accepted) one.

>>> import tempfile
>>> path = Path(tempfile.mkdtemp()) / "known_hosts"
>>> blob = base64.b64encode(b"\\0\\0\\0\\x0bssh-ed25519" + b"\\0\\0\\0\\x20" + bytes(32)).decode()
>>> _ = path.write_text(f"# a comment\\npve*,!pve9 ssh-ed25519 {blob}\\n")
>>> [entry.line for entry in read_known_hosts([str(path)]).matching("pve1")]
[2]
>>> read_known_hosts([str(path)]).matching("pve9")
[]
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from proxgpu.errors import KnownHostsDamagedError

#: Markers a known_hosts line may start with.
MARKERS = frozenset({"@cert-authority", "@revoked"})
#: Where OpenSSH looks for the system-wide known_hosts (its GlobalKnownHostsFile's first entry).
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


@dataclass(frozen=True)
class Entry:
    """One line of a known_hosts file: ``marker`` is ``""`` for a plain host key."""

    path: str
    line: int
    marker: str
    patterns: str
    keytype: str
    blob: bytes

    def matches(self, name: str) -> bool:
        """Whether this line is about the host known_hosts files as ``name``."""
        if self.patterns.startswith("|1|"):
            return _hashed_match(self.patterns, name)
        matched = False
        for pattern in self.patterns.split(","):
            negated = pattern.startswith("!")
            if _glob(pattern[1:] if negated else pattern).fullmatch(name.lower()):
                if negated:
                    return False
                matched = True
        return matched


@dataclass(frozen=True)
class KnownHosts:
    """The lines of several known_hosts files, in the order OpenSSH reads them."""

    entries: tuple[Entry, ...]

    def matching(self, name: str, marker: str = "") -> list[Entry]:
        """The lines with ``marker`` (``""``: plain keys) that are about host ``name``."""
        return [e for e in self.entries if e.marker == marker and e.matches(name)]

    def revoked(self, name: str, blob: bytes) -> Entry | None:
        """The ``@revoked`` line that refuses key ``blob`` for ``name``, if any."""
        return next((e for e in self.matching(name, "@revoked") if e.blob == blob), None)


def read_known_hosts(paths: Iterable[str]) -> KnownHosts:
    """Every line of the files at ``paths`` (a missing file has none).

    :raises KnownHostsDamagedError: for a line that is not a known_hosts line (exit 5).
    """
    entries: list[Entry] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                entries.append(_parse(path, number, line.split()))
    return KnownHosts(tuple(entries))


def _parse(path: str, number: int, fields: Sequence[str]) -> Entry:
    marker = fields[0] if fields[0].startswith("@") else ""
    rest = fields[1:] if marker else fields
    if (marker and marker not in MARKERS) or len(rest) < 3:
        raise _damaged(path, number, "expected [@cert-authority|@revoked] HOSTS KEYTYPE KEY")
    patterns, keytype, encoded = rest[:3]
    try:
        blob = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise _damaged(path, number, f"the {keytype} key is not base64") from None
    if _blob_type(blob) != keytype:
        raise _damaged(path, number, f"the key is not a {keytype} key")
    if patterns.startswith("|1|") and not _valid_hash(patterns):
        raise _damaged(path, number, "the hashed host name is not |1|SALT|HASH")
    return Entry(path, number, marker, patterns, keytype, blob)


def _damaged(path: str, number: int, why: str) -> KnownHostsDamagedError:
    return KnownHostsDamagedError(
        f"{path}:{number}",
        f"damaged known_hosts line ({why}); fix or delete line {number} of {path}",
        "",
        path,
    )


def _blob_type(blob: bytes) -> str | None:
    # A key's wire form starts with its type as an SSH string (a 4-byte length, then the text).
    if len(blob) < 4:
        return None
    (length,) = struct.unpack(">I", blob[:4])
    return blob[4 : 4 + length].decode("ascii", "replace") if len(blob) >= 4 + length else None


_HASHED = re.compile(r"\|1\|[A-Za-z0-9+/=]+\|[A-Za-z0-9+/=]+")


def _valid_hash(hashed: str) -> bool:
    if _HASHED.fullmatch(hashed) is None:
        return False
    _, _, salt, digest = hashed.split("|")
    try:
        base64.b64decode(salt, validate=True)
        base64.b64decode(digest, validate=True)
    except binascii.Error:
        return False
    return True


def _hashed_match(hashed: str, name: str) -> bool:
    # Here, not at the top: OpenSSL's hashes take some 2 ms to load, and the files are read
    # (their lines checked) on the way to every host, before the OpenSSH transport starts ssh,
    # which compares the names itself.
    import hashlib  # noqa: PLC0415
    import hmac  # noqa: PLC0415

    _, _, salt, digest = hashed.split("|")
    mac = hmac.new(base64.b64decode(salt), name.lower().encode(), hashlib.sha1).digest()
    return hmac.compare_digest(mac, base64.b64decode(digest))


def _glob(pattern: str) -> re.Pattern[str]:
    # OpenSSH's match_pattern: only * and ? are special; [ and ] are literal (as in [host]:port).
    parts = ("." if c == "?" else ".*" if c == "*" else re.escape(c) for c in pattern.lower())
    return re.compile("".join(parts))


__all__ = ["GLOBAL_KNOWN_HOSTS", "Entry", "KnownHosts", "read_known_hosts"]
