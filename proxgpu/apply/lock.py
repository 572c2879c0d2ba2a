"""The host-wide lock: one apply or rollback at a time on a host.

The lock is the directory ``/run/lock/proxgpu`` holding an ``owner`` file (``id=``, ``op=``,
``client=``, ``pid=``, ``user=``, ``since=`` lines). ``scripts/probe.sh`` takes it in the same
command that reads every file's state: it builds a complete directory beside the lock and renames
it into place, so the lock never exists without its owner (and an empty directory there, which
the rename replaces, is nobody's lock). ``scripts/finish.sh`` releases it, and
only for its own owner. It lives in /run, so a reboot clears a lock left by a dropped connection.

>>> parse_owner(base64.b64encode(b"id=1\\nop=apply\\n").decode())
{'id': '1', 'op': 'apply'}
"""

from __future__ import annotations

import base64
import getpass
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from proxgpu.errors import ConcurrentApplyError
from proxgpu.host.local import process_running

# Lock ids of the applies and rollbacks running in this process: a lock they hold is not stale.
_held_here: set[str] = set()


@contextmanager
def held_here(lock_id: str) -> Iterator[None]:
    """Mark ``lock_id`` as held by a running operation of this process while the block runs."""
    _held_here.add(lock_id)
    try:
        yield
    finally:
        _held_here.discard(lock_id)


def owner_text(lock_id: str, op: str) -> str:
    """The owner file of a lock taken now by this process for ``op``."""
    return "\n".join(
        [
            f"id={lock_id}",
            f"op={op}",
            f"client={socket.gethostname()}",
            f"pid={os.getpid()}",
            f"user={getpass.getuser()}",
            f"since={datetime.now(UTC).isoformat(timespec='seconds')}",
        ]
    )


def parse_owner(b64: str) -> dict[str, str]:
    """The fields of an owner file sent as base64 (empty when it could not be read)."""
    text = base64.b64decode(b64 or "").decode("utf-8", "replace")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def is_stale(owner: dict[str, str]) -> bool:
    """Whether the lock's owner is known to be gone: only decidable for this machine's processes.

    A lock without an owner file is no one's; a process that exited but was not reaped yet (a
    zombie, as a killed apply is until its parent waits for it) is gone.
    """
    if not owner:
        return False  # unreadable or ownerless: only --break-lock takes it
    if owner.get("client") != socket.gethostname() or not owner.get("pid", "").isdigit():
        return False
    pid = int(owner["pid"])
    if pid == os.getpid():
        return owner.get("id") not in _held_here
    return not process_running(pid)


def held_error(host: str, lock: str, owner: dict[str, str]) -> ConcurrentApplyError:
    """The refusal when another apply or rollback holds ``lock``, naming its owner."""
    who = (
        f"{owner.get('op', 'apply')} {owner.get('id', '?')} ({owner.get('user', '?')}@"
        f"{owner.get('client', '?')} pid {owner.get('pid', '?')}, since {owner.get('since', '?')})"
    )
    if not owner:
        who = "no one (it has no owner file: an apply or rollback was cut off while taking it)"
    return ConcurrentApplyError(
        host,
        f"{lock} is held by {who}: wait for it to finish; if it was interrupted, run "
        "`proxgpu rollback --break-lock`, which takes the lock over and recovers the unfinished "
        "apply (`proxgpu history` shows it)",
        owner,
    )


def broken_note(lock: str, owner: dict[str, str]) -> str:
    """What was done when a lock was taken over, and what to check next."""
    if not owner:
        return f"took over {lock}, which had no owner"
    return (
        f"took over {lock} from {owner.get('op', 'apply')} {owner.get('id', '?')} "
        f"({owner.get('user', '?')}@{owner.get('client', '?')} pid {owner.get('pid', '?')}, "
        f"since {owner.get('since', '?')}); check `proxgpu history` for what it left"
    )
