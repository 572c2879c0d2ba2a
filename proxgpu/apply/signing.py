"""Signatures on what proxgpu writes and later trusts: saved plans and journal entries.

``apply --plan FILE`` and ``rollback`` act on documents that lie where others could write them (a
plan file in a shared folder, the journal under ``/var/lib/proxgpu`` on the host). Each is
signed when proxgpu writes it, with an HMAC-SHA256 over a canonical form of the whole document
(sorted keys, no spaces), keyed by a secret of the admin's own: 32 random bytes kept on the
admin's machine in ``$XDG_CONFIG_HOME/proxgpu/key`` (default ``~/.config/proxgpu/key``), made
with mode 0600 on first use and refused when anyone else may read it. The signed form includes
the host the document was made for and the SHA-256 of every file read, so a signature binds the
document to the host and to the files as they were.

What it protects against: someone who can write the plan file or the host's journal but does
not have the key. A path or an action added to a plan, a backup name or a hash edited in a
journal entry, an entry copied from another host: each breaks the signature and is refused.

Journal entries are also chained (:mod:`proxgpu.apply.trust`): each signature covers a link
to the entry before it, so an entry deleted from the journal, or put in from another one, is
found out too.

What it does not: root on the admin's machine (who can read the key and sign anything); a host
that lies consistently (a compromised host can still answer probes and reads with whatever it
wants: the signature proves who wrote a document, not what the host holds); deleting the newest
entries (nothing after them records them); an entry put back to an earlier state of itself that
proxgpu wrote (its status before a rollback). Documents written before proxgpu signed (or
chained) them are refused with the way out named: ``--trust-unsigned``
(``trust_unsigned=True``).

>>> key = b"k" * 32
>>> signed = sign({"host": "pve1", "files": ["/etc/modules"]}, key)
>>> signed["signature"].startswith("hmac-sha256:")
True
>>> check({**signed, "files": ["/etc/modules", "/root/.ssh/authorized_keys"]}, key)
'its signature does not match: edited since proxgpu wrote it'
>>> check(signed, key) is None
True
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxgpu.errors import UsageError

#: The field of a signed document that holds its signature.
FIELD = "signature"
_SCHEME = "hmac-sha256"
KEY_BYTES = 32


def key_path() -> Path:
    """Where the admin's signing key is kept (``$XDG_CONFIG_HOME/proxgpu/key``).

    >>> key_path().name
    'key'
    """
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "proxgpu" / "key"


def load_key(path: Path | None = None) -> bytes:
    """The signing key, made on first use (32 random bytes, mode 0600, in a 0700 directory).

    :raises UsageError: when the key file is readable by others, not a regular file, not
        the user's own, or of the wrong size.
    """
    path = path or key_path()
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return _make_key(path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the signing key ({exc.strerror})") from None
    try:
        # Checked on the descriptor, before it is read: a directory opens too (and Python's
        # file object refuses it with IsADirectoryError).
        _check_key_file(path, os.fstat(descriptor))
    except BaseException:
        os.close(descriptor)
        raise
    with os.fdopen(descriptor, "rb") as source:
        key = source.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise UsageError(f"{path}: not a proxgpu signing key ({len(key)} bytes, not 32)")
    return key


def _check_key_file(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{path}: the signing key is not a regular file")
    if info.st_uid != os.getuid():
        raise UsageError(f"{path}: the signing key belongs to uid {info.st_uid}, not to you")
    if info.st_mode & 0o077:
        raise UsageError(
            f"{path}: the signing key is readable by others (mode {info.st_mode & 0o777:o}): "
            f"chmod 600 {path}"
        )


def _make_key(path: Path) -> bytes:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = secrets.token_bytes(KEY_BYTES)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return load_key(path)  # another proxgpu made it meanwhile
    with os.fdopen(descriptor, "wb") as out:
        out.write(key)
        out.flush()
        os.fsync(out.fileno())
    return key


def key_id(key: bytes) -> str:
    """A short name of ``key`` that gives nothing of it away, shown when a signature is by
    another key.

    >>> key_id(b"k" * 32)
    '6dab344ec2e7a48d'
    """
    return hashlib.sha256(b"proxgpu key id\0" + key).hexdigest()[:16]


def canonical(document: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: ``document`` without its signature, keys sorted.

    >>> canonical({"b": 1, "a": [1, 2], "signature": "x"})
    b'{"a":[1,2],"b":1}'
    """
    unsigned = {k: v for k, v in document.items() if k != FIELD}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _mac(document: Mapping[str, Any], key: bytes) -> str:
    return hmac.new(key, canonical(document), hashlib.sha256).hexdigest()


def sign(document: Mapping[str, Any], key: bytes) -> dict[str, Any]:
    """``document`` with its ``signature`` field set (see the module example)."""
    return {**document, FIELD: f"{_SCHEME}:{key_id(key)}:{_mac(document, key)}"}


def check(document: Mapping[str, Any], key: bytes) -> str | None:
    """Why ``document`` is not signed with ``key`` (``None``: it is).

    >>> check({"host": "pve1"}, b"k" * 32)
    'it is not signed (written before proxgpu signed what it writes)'
    """
    signature = document.get(FIELD)
    if signature is None:
        return "it is not signed (written before proxgpu signed what it writes)"
    scheme, _, rest = str(signature).partition(":")
    signer, _, mac = rest.partition(":")
    if scheme != _SCHEME or not mac:
        return "its signature is not one proxgpu writes"
    if signer != key_id(key):
        return f"it is signed by another key ({signer}), not by yours ({key_id(key)})"
    if not hmac.compare_digest(mac, _mac(document, key)):
        return "its signature does not match: edited since proxgpu wrote it"
    return None
