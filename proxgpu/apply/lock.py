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
    who = _owner(owner)
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
    return f"took over {lock} from {_owner(owner)}; check `proxgpu history` for what it left"


def unreleased_note(problem: str) -> str:
    """What an apply or rollback that finished says of a lock it could not release (its journal
    entry is recorded: nothing it did is undone for that).

    >>> unreleased_note("rmdir: Device or resource busy")
    'the lock was not released (rmdir: Device or resource busy): the next apply or rollback \
takes it over with --break-lock'
    """
    return (
        f"the lock was not released ({problem}): the next apply or rollback takes it over with "
        "--break-lock"
    )


def _owner(owner: dict[str, str]) -> str:
    """Who holds a lock, as its owner file says: ``apply ID (user@client pid N, since T)``."""
    get = owner.get
    return (
        f"{get('op', 'apply')} {get('id', '?')} ({get('user', '?')}@{get('client', '?')} "
        f"pid {get('pid', '?')}, since {get('since', '?')})"
    )
