"""Apply a change set as one transaction; roll it back; list the journal; verify the result.

:func:`apply_changes` runs preflight (root, the host-wide lock, compare-and-swap on every file's
hash, ``lock:`` keys, running guests, busy GPUs), then backs up every file it touches and writes a
journal entry, then replaces each file atomically (a temp file in the same directory, renamed over
it), then runs the post-actions and, when asked, the live rebind. On any failure it puts every file
back from the backup.

On a live host with pvesh, a VM config (``/etc/pve/qemu-server/<vmid>.conf``) is changed through
the Proxmox API instead (:mod:`proxgpu.pveapi`: ``PUT /nodes/<node>/qemu/<vmid>/config`` with the
main-section keys that change, ``delete`` for those that go, and ``digest`` so that Proxmox itself
refuses a concurrent edit); container configs (the API cannot set raw ``lxc.*`` keys), the PCI
mapping file and host files are written as files. Proxmox rewrites a config in its own order, so
the hash journalled for such a file is the one read back after the write. Backups, the
compare-and-swap checks, restore on failure and rollback (a byte-for-byte file restore under
Proxmox's per-guest lock) treat both kinds alike.

The number of commands it sends does not grow with the number of files: one locks and reads every
file's hash (and the node name, and whether pvesh is there), one stages the backups and temp
files, one renames them all (and reads back the configs written through the API), one records the
outcome and unlocks, plus one per post-action; on a Proxmox host also one API call per guest
whose status is checked and one per VM config written through the API.

What it keeps on the host, under ``host.root``:

- ``/run/lock/proxgpu/owner``: the host-wide lock, a directory that appears by one ``rename``;
  it lives in /run so that a reboot clears a lock left by a dropped connection.
- ``/var/lib/proxgpu/journal/<id>.json``: one entry per apply (:class:`JournalEntry`).
- ``/var/lib/proxgpu/backups/<id>/``: the files as they were, by position, and ``meta.json``.

>>> new_journal_id(datetime(2026, 11, 30, 1, 15, tzinfo=UTC))[:24]
'20261130T011500.000000Z-'
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import json
import os
import re
import secrets
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxgpu import live as live_rebind
from proxgpu.changes import Action, ChangeSet, FileChange
from proxgpu.errors import (
    ApplyError,
    CommandError,
    ConcurrentApplyError,
    FileChangedError,
    JournalError,
    NotRootError,
    PreflightError,
    ProxgpuError,
    RollbackError,
    UsageError,
)
from proxgpu.hosts import Host
from proxgpu.inspection import inspect
from proxgpu.inventory import Inventory
from proxgpu.live import Binding
from proxgpu.planning import VFIO_DRIVER, Plan
from proxgpu.pveapi import (
    PveApiError,
    PveResource,
    config_digest,
    config_update,
    guest_status,
    proxmox_api,
    same_config,
)
from proxgpu.pveconfig import GuestConfig

JOURNAL_DIR = "/var/lib/proxgpu/journal"
BACKUP_DIR = "/var/lib/proxgpu/backups"
LOCK_DIR = "/run/lock/proxgpu"
#: Seconds a post-action may run (an initramfs rebuild for every kernel takes minutes).
ACTION_TIMEOUT = 900.0
SCRIPT_TIMEOUT = 300.0

Status = Literal["in-progress", "applied", "rolled-back", "failed"]
#: Called with a step (``lock``, ``backup``, ``write``, ``action``, ...) and a line for people.
Progress = Callable[[str, str], None]

_GUEST = re.compile(r"^/etc/pve/(lxc|qemu-server)/(\d+)\.conf$")
_PVE = "/etc/pve/"
# Journal ids of the applies and rollbacks running in this process: a lock they hold is not stale.
_ACTIVE: set[str] = set()

# Usage: sh -c PROBE sh MODE LOCK OWNER TAKEOVER NEED_ROOT JOURNAL_DIR PATH...
# MODE "lock" takes the lock (a directory made complete, owner file inside, then renamed into
# place, so it never exists without its owner); "read" only reads. Records:
#   #uid N | #node NAME | #pvesh | #notroot | #lock | #locked B64(owner) | #held B64(owner)
#   #inprogress ID | #file I other | #file I file SHA256 MODE UID GID
#   #file I absent PARENT_EXISTS | #end
_PROBE = r"""
set -u
mode=$1 lock=$2 owner=$3 takeover=$4 need_root=$5 journal=$6
shift 6
uid=$(id -u)
echo "#uid $uid"
echo "#node $(uname -n)"
if command -v pvesh >/dev/null 2>&1; then echo "#pvesh"; fi
if [ "$need_root" = 1 ] && [ "$uid" != 0 ]; then echo "#notroot"; exit 0; fi
if [ "$mode" = lock ]; then
    mkdir -p "${lock%/*}" || exit 1
    held=$(sed -n 's/^id=//p' "$lock/owner" 2>/dev/null)
    if [ -n "$takeover" ] && [ "$held" = "$takeover" ]; then
        printf '%s\n' "$owner" > "$lock/owner.$$" && mv -f "$lock/owner.$$" "$lock/owner" || exit 1
    else
        new=$lock.$$
        mkdir "$new" && printf '%s\n' "$owner" > "$new/owner" || exit 1
        if ! mv -T "$new" "$lock" 2>/dev/null; then
            rm -rf "$new"
            echo "#locked $(base64 -w0 < "$lock/owner" 2>/dev/null)"
            exit 0
        fi
    fi
    echo "#lock"
elif [ -f "$lock/owner" ]; then
    echo "#held $(base64 -w0 < "$lock/owner")"
fi
for j in "$journal"/*.json; do
    [ -f "$j" ] && grep -q '^  "status": "in-progress"' "$j" || continue
    n=${j##*/}
    echo "#inprogress ${n%.json}"
done
i=0
for p; do
    if [ -L "$p" ] || { [ -e "$p" ] && [ ! -f "$p" ]; }; then
        echo "#file $i other"
    elif [ -f "$p" ]; then
        sum=$(sha256sum < "$p") || exit 1
        echo "#file $i file ${sum%% *} $(stat -c '%a %u %g' "$p")"
    elif [ -d "${p%/*}" ]; then
        echo "#file $i absent 1"
    else
        echo "#file $i absent 0"
    fi
    i=$((i + 1))
done
echo "#end"
"""

# Usage: sh -c STAGE sh JOURNAL BACKUPS [PATH BACKUP SHA TMP MODE UMASK OWNER PARENT_EXISTS]...
# stdin: base64 lines: the journal entry, meta.json, then the new text of each file with a TMP.
# The backup is hashed after copying, so the bytes kept are the bytes compared. A temp file is
# created under UMASK, then given MODE with chmod unless MODE is "-" (/etc/pve). Records:
#   #changed I | #end
_STAGE = r"""
set -u
umask 077  # the journal and backups hold guest configs: root only
journal=$1 backups=$2
shift 2
IFS= read -r entry || exit 1
IFS= read -r meta || exit 1
mkdir -p "${journal%/*}" && printf '%s' "$entry" | base64 -d > "$journal.tmp" || exit 1
mv -f "$journal.tmp" "$journal" || exit 1
mkdir -p "${backups%/*}" && mkdir "$backups" || exit 1
printf '%s' "$meta" | base64 -d > "$backups/meta.json" || exit 1
i=0
while [ $# -ge 8 ]; do
    p=$1 backup=$2 sum=$3 tmp=$4 mode=$5 mask=$6 owner=$7 parent=$8
    shift 8
    if [ "$backup" != - ]; then
        cp -p "$p" "$backups/$backup" || exit 1
        got=$(sha256sum < "$backups/$backup") || exit 1
        [ "${got%% *}" = "$sum" ] || { echo "#changed $i"; exit 0; }
    elif [ -e "$p" ] || [ -L "$p" ]; then
        echo "#changed $i"; exit 0
    fi
    if [ "$tmp" != - ]; then
        IFS= read -r data || exit 1
        [ "$parent" = 1 ] || (umask 022 && mkdir -p "${p%/*}") || exit 1
        (umask "$mask" && printf '%s' "$data" | base64 -d > "$tmp") || exit 1
        if [ "$owner" != - ] && [ "$(stat -c %u:%g "$tmp")" != "$owner" ]; then
            chown "$owner" "$tmp" || exit 1
        fi
        if [ "$mode" != - ]; then chmod "$mode" "$tmp" || exit 1; fi
    fi
    i=$((i + 1))
done
echo "#end"
"""

# Usage: sh -c COMMIT sh [PATH TMP WANT_SHA GUEST_LOCK]...   (TMP "-": remove; TMP "=": written
# through the API, only report its hash; WANT_SHA "-": must be absent; GUEST_LOCK "-": none).
# Each file is checked once more and renamed under Proxmox's own config lock, so a concurrent
# `qm set` cannot slip in between. Records:
#   #api I SHA256|- | #done I | #changed I | #guestlocked I | #failed I RC | #end
_COMMIT = r"""
set -u
one='p=$1 tmp=$2 want=$3
if [ "$want" = - ]; then
    if [ -e "$p" ] || [ -L "$p" ]; then exit 3; fi
else
    if [ -L "$p" ] || [ ! -f "$p" ]; then exit 3; fi
    got=$(sha256sum < "$p") || exit 1
    [ "${got%% *}" = "$want" ] || exit 3
fi
if [ "$tmp" = - ]; then rm -f "$p"; else mv -f "$tmp" "$p"; fi'
i=0
while [ $# -ge 4 ]; do
    p=$1 tmp=$2 want=$3 lock=$4
    shift 4
    if [ "$tmp" = = ]; then
        sum=-
        if [ -f "$p" ] && [ ! -L "$p" ]; then sum=$(sha256sum < "$p") || sum=-; fi
        echo "#api $i ${sum%% *}"
        i=$((i + 1))
        continue
    fi
    if [ "$lock" = - ]; then
        sh -c "$one" sh "$p" "$tmp" "$want"
    else
        mkdir -p "${lock%/*}" && flock -E 75 -w 10 "$lock" sh -c "$one" sh "$p" "$tmp" "$want"
    fi
    rc=$?
    case $rc in
    0) echo "#done $i" ;;
    3) echo "#changed $i"; exit 0 ;;
    75) echo "#guestlocked $i"; exit 0 ;;
    *) echo "#failed $i $rc"; exit 0 ;;
    esac
    i=$((i + 1))
done
echo "#end"
"""

# Usage: sh -c RESTORE sh N [PATH TMP BACKUP BACKUP_SHA MODE UMASK OWNER ONLY_IF GUEST_LOCK]xN
#        DIR...   (MODE and UMASK as for STAGE)
# Puts back each file whose current hash is ONLY_IF ("-": absent; "any": whatever it is; "keep":
# never, the file was not written);
# BACKUP "-" means the file did not exist, so it is removed. Leftover temp files go first, empty
# directories the apply created last. Records: #rc I RC (0 restored, 10 already as before,
# 11 changed by someone else, 12 backup damaged, 13 failed, 75 guest config locked) | #end
_RESTORE = r"""
set -u
one='p=$1 tmp=$2 backup=$3 bsum=$4 mode=$5 mask=$6 owner=$7 cond=$8
rm -f "$tmp"
[ "$cond" = keep ] && exit 10
cur=-
if [ -L "$p" ] || { [ -e "$p" ] && [ ! -f "$p" ]; }; then exit 11; fi
if [ -f "$p" ]; then cur=$(sha256sum < "$p") || exit 13; cur=${cur%% *}; fi
[ "$cur" = "$bsum" ] && exit 10
[ "$cond" = any ] || [ "$cond" = "$cur" ] || exit 11
if [ "$backup" = - ]; then rm -f "$p" || exit 13; exit 0; fi
got=$(sha256sum < "$backup") || exit 12
[ "${got%% *}" = "$bsum" ] || exit 12
mkdir -p "${p%/*}" && (umask "$mask" && cat "$backup" > "$tmp") || exit 13
if [ "$owner" != - ] && [ "$(stat -c %u:%g "$tmp")" != "$owner" ]; then
    chown "$owner" "$tmp" || exit 13
fi
if [ "$mode" != - ]; then chmod "$mode" "$tmp" || exit 13; fi
mv -f "$tmp" "$p" || exit 13'
n=$1
shift
i=0
while [ "$i" -lt "$n" ]; do
    lock=$9
    if [ "$lock" = - ]; then
        sh -c "$one" sh "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8"
    else
        mkdir -p "${lock%/*}" &&
            flock -E 75 -w 10 "$lock" sh -c "$one" sh "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8"
    fi
    echo "#rc $i $?"
    shift 9
    i=$((i + 1))
done
for d; do rmdir "$d" 2>/dev/null; done
echo "#end"
"""

# Usage: sh -c FINISH sh JOURNAL LOCK ID RELEASE; stdin: the entry in base64, or nothing.
# Only the owner's own lock is released. Records: #end
_FINISH = r"""
set -u
umask 077
journal=$1 lock=$2 id=$3 release=$4
IFS= read -r entry || entry=
if [ -n "$entry" ]; then
    printf '%s' "$entry" | base64 -d > "$journal.tmp" && mv -f "$journal.tmp" "$journal" || exit 1
fi
if [ "$release" = 1 ] && [ "$(sed -n 's/^id=//p' "$lock/owner" 2>/dev/null)" = "$id" ]; then
    rm -f "$lock/owner" && rmdir "$lock" || exit 1
fi
echo "#end"
"""

# Usage: sh -c JOURNAL sh DIR. Records: #entry ID B64(json) | #end
_READ_JOURNAL = r"""
set -u
for j in "$1"/*.json; do
    [ -f "$j" ] || continue
    n=${j##*/}
    echo "#entry ${n%.json} $(base64 -w0 < "$j")"
done
echo "#end"
"""

# Usage: sh -c TEXTS sh PATH...  Records: #text I B64(content) | #text I - (absent) | #end
_READ_TEXTS = r"""
set -u
i=0
for p; do
    if [ -f "$p" ] && [ ! -L "$p" ]; then
        echo "#text $i $(base64 -w0 < "$p")"
    else
        echo "#text $i -"
    fi
    i=$((i + 1))
done
echo "#end"
"""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class JournalFile(_Model):
    """One file an apply touched: how it was (``existed``, mode as octal text, owner), the hashes
    before and after, and its copy's name in the backup directory (``None`` when it was absent).
    ``via`` says how it was written: as a file, or through the Proxmox API (``sha256_after`` is
    then the hash read back from the file Proxmox wrote, once known).

    >>> JournalFile(path="/etc/modules", existed=False, sha256_before=None,
    ...             sha256_after="ab" * 32).backup is None
    True
    """

    path: str
    existed: bool
    mode: str | None = None
    uid: int | None = None
    gid: int | None = None
    sha256_before: str | None
    sha256_after: str | None
    backup: str | None = None
    via: Literal["file", "api"] = "file"


class JournalEntry(_Model):
    """One apply as the journal records it; ``status`` moves from ``in-progress`` to ``applied``,
    ``failed`` (everything was restored) or, later, ``rolled-back``.

    ``created_dirs`` lists directories the apply created (rollback removes them when empty),
    ``live`` the drivers changed at runtime, ``actions_run`` the post-actions that ran.
    """

    id: str
    status: Status
    host: str
    client: str
    started: str
    finished: str | None = None
    changeset: ChangeSet
    plan: Plan | None = None
    files: list[JournalFile]
    created_dirs: list[str] = Field(default_factory=list)
    live: list[Binding] = Field(default_factory=list)
    actions_run: list[list[str]] = Field(default_factory=list)
    message: str = ""


class ApplyResult(_Model):
    """What an apply did (or, with ``dry_run``, would do).

    ``files`` are the paths written; ``actions`` every action of the change set, ``actions_run``
    those that ran (none on a directory tree or in a dry run).

    >>> ApplyResult(host="pve1", changed=False).messages
    []
    """

    host: str
    changed: bool
    dry_run: bool = False
    journal_id: str | None = None
    files: list[str] = Field(default_factory=list)
    actions: list[Action] = Field(default_factory=list)
    actions_run: list[list[str]] = Field(default_factory=list)
    live: list[Binding] = Field(default_factory=list)
    reboot_required: bool = False
    messages: list[str] = Field(default_factory=list)


class RollbackResult(_Model):
    """What a rollback restored (``files``), removed and ran.

    >>> RollbackResult(host="pve1", journal_id=None).files
    []
    """

    host: str
    journal_id: str | None
    files: list[str] = Field(default_factory=list)
    actions_run: list[list[str]] = Field(default_factory=list)
    live: list[Binding] = Field(default_factory=list)
    messages: list[str] = Field(default_factory=list)


class VerifyReport(_Model):
    """Whether the host still matches an apply: ``drift`` holds one line per difference.

    >>> VerifyReport(host="pve1", drifted=False).drift
    []
    """

    host: str
    drifted: bool
    drift: list[str] = Field(default_factory=list)


def new_journal_id(now: datetime | None = None) -> str:
    """A journal id that sorts by time: UTC time to the microsecond, four random hex digits.

    Applies are serialised by the lock, so ids of one host never share a microsecond.
    """
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{stamp}-{secrets.token_hex(2)}"


# --- where things live ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    prefix: str

    @classmethod
    def of(cls, host: Host) -> _Layout:
        return cls(host.root.rstrip("/"))

    def on_host(self, path: str) -> str:
        return self.prefix + path

    @property
    def lock(self) -> str:
        return self.on_host(LOCK_DIR)

    @property
    def journal_dir(self) -> str:
        return self.on_host(JOURNAL_DIR)

    def journal(self, journal_id: str) -> str:
        return f"{self.journal_dir}/{journal_id}.json"

    def backups(self, journal_id: str) -> str:
        return self.on_host(f"{BACKUP_DIR}/{journal_id}")


@dataclass(frozen=True)
class _Where:
    """A target file's paths on the host: itself, its temp file, Proxmox's lock for it."""

    path: str
    tmp: str
    guest_lock: str
    in_pve: bool


def _where(layout: _Layout, path: str, journal_id: str, is_live: bool) -> _Where:
    directory, _, name = layout.on_host(path).rpartition("/")
    # A leading dot and a suffix keep the temp file out of every *.conf and run-parts glob, and
    # pmxcfs only treats NNN.conf as a guest.
    tmp = f"{directory}/.{name}.proxgpu-{journal_id}.tmp"
    guest_lock = "-"
    match = _GUEST.match(path)
    if match and is_live:
        kind, vmid = match.groups()
        lock = (
            f"/var/lock/qemu-server/lock-{vmid}.conf"
            if kind == "qemu-server"
            else f"/run/lock/lxc/pve-config-{vmid}.lock"
        )
        guest_lock = layout.on_host(lock)
    return _Where(layout.on_host(path), tmp, guest_lock, path.startswith(_PVE))


@dataclass(frozen=True)
class _FileState:
    kind: Literal["file", "absent", "other"]
    sha256: str | None = None
    mode: str | None = None
    uid: int | None = None
    gid: int | None = None
    parent_exists: bool = True


@dataclass(frozen=True)
class _Probe:
    locked: bool
    owner: dict[str, str] | None
    in_progress: list[str]
    files: list[_FileState]
    node: str = ""
    pvesh: bool = False


# --- running the scripts -------------------------------------------------------------------------


def _script(
    host: Host,
    name: str,
    script: str,
    args: Sequence[str],
    *,
    payload: bytes = b"",
    timeout: float = SCRIPT_TIMEOUT,
) -> list[list[str]]:
    result = host.run(["sh", "-c", script, "sh", *args], stdin=payload, timeout=timeout)
    if not result.ok:
        raise CommandError(host.name, [f"the {name} step"], result.returncode, result.stderr_text)
    return [
        line.split(" ")
        for line in result.stdout.decode("utf-8", "replace").splitlines()
        if line.startswith("#")
    ]


def _b64_line(data: bytes) -> bytes:
    return base64.b64encode(data) + b"\n"


def _sha(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _owner_text(lock_id: str, op: str) -> str:
    return "\n".join(
        [
            f"id={lock_id}",
            f"op={op}",
            f"client={socket.gethostname()}",
            f"pid={os.getpid()}",
            f"user={getpass.getuser()}",
            f"since={_now()}",
        ]
    )


def _parse_owner(b64: str) -> dict[str, str]:
    text = base64.b64decode(b64 or "").decode("utf-8", "replace")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _probe(
    host: Host,
    layout: _Layout,
    paths: Sequence[str],
    *,
    lock_id: str | None,
    op: str = "apply",
    takeover: str = "",
) -> _Probe:
    """Read every file's state in one command, taking the host-wide lock when ``lock_id``."""
    args = [
        "lock" if lock_id else "read",
        layout.lock,
        _owner_text(lock_id or "", op),
        takeover,
        "1" if host.is_live else "0",
        layout.journal_dir,
        *paths,
    ]
    records = _script(host, "preflight", _PROBE, args)
    words = {r[0] for r in records}
    if "#notroot" in words:
        raise NotRootError(host.name, "proxgpu must run as root to change this host")
    owner = next((_parse_owner(r[1]) for r in records if r[0] in ("#locked", "#held")), None)
    node = next((r[1] for r in records if r[0] == "#node" and len(r) > 1), "")
    return _Probe(
        locked="#lock" in words,
        owner=owner,
        in_progress=[r[1] for r in records if r[0] == "#inprogress"],
        files=[_file_state(r[2:]) for r in records if r[0] == "#file"],
        node=node.split(".")[0],  # Proxmox's node name is the hostname up to the first dot
        pvesh="#pvesh" in words,
    )


def _read_files(host: Host, paths: Sequence[str]) -> list[bytes | None]:
    """The bytes of each file (``None``: absent or not a regular file), in one command."""
    records = _script(host, "read back", _READ_TEXTS, paths)
    found: list[bytes | None] = [None] * len(paths)
    for record in records:
        if record[0] == "#text" and record[2] != "-":
            found[int(record[1])] = base64.b64decode(record[2])
    return found


def _with_hashes(entry: JournalEntry, hashes: Mapping[str, str]) -> JournalEntry:
    """``entry`` with the ``sha256_after`` of the files in ``hashes`` replaced."""
    files = [
        f.model_copy(update={"sha256_after": hashes[f.path]}) if f.path in hashes else f
        for f in entry.files
    ]
    return entry.model_copy(update={"files": files})


def _recognise(
    host: Host, layout: _Layout, entry: JournalEntry, paths: Iterable[str]
) -> JournalEntry:
    """Read the VM configs in ``paths`` (one command) and take as ``entry``'s result each one that
    says what the change set's ``after`` says, in whatever order Proxmox wrote it."""
    wanted = sorted(set(paths))
    planned = {f.path: f.after for f in entry.changeset.files}
    hashes = {}
    for path, data in zip(
        wanted, _read_files(host, [layout.on_host(p) for p in wanted]), strict=True
    ):
        after = planned.get(path)
        if data is None or after is None:
            continue
        try:
            text = data.decode()
        except UnicodeDecodeError:
            continue
        if same_config(text, after):
            hashes[path] = hashlib.sha256(data).hexdigest()
    return _with_hashes(entry, hashes)


def _file_state(fields: list[str]) -> _FileState:
    if fields[0] == "file":
        sha, mode, uid, gid = fields[1:5]
        return _FileState("file", sha, mode, int(uid), int(gid))
    if fields[0] == "absent":
        return _FileState("absent", parent_exists=fields[1] == "1")
    return _FileState("other")


def _finish(
    host: Host, layout: _Layout, lock_id: str, entry: JournalEntry | None, release: bool
) -> None:
    payload = _b64_line(entry.model_dump_json(indent=2).encode()) if entry else b""
    journal = layout.journal(entry.id) if entry else "-"
    args = [journal, layout.lock, lock_id, "1" if release else "0"]
    _script(host, "finish", _FINISH, args, payload=payload)


def _release_quietly(host: Host, layout: _Layout, lock_id: str) -> None:
    # Called on the way out of a failure: the host may be gone, and the lock then stays until
    # a rollback or a reboot clears it; the original error is the one to report.
    try:
        _finish(host, layout, lock_id, None, release=True)
    except ProxgpuError:
        return


def _lock_held_error(host: Host, layout: _Layout, owner: dict[str, str]) -> ConcurrentApplyError:
    who = (
        f"{owner.get('op', 'apply')} {owner.get('id', '?')} ({owner.get('user', '?')}@"
        f"{owner.get('client', '?')} pid {owner.get('pid', '?')}, since {owner.get('since', '?')})"
    )
    return ConcurrentApplyError(
        host.name,
        f"{layout.lock} is held by {who}: wait for it to finish; if it was interrupted, run "
        "`proxgpu rollback`, which recovers or releases it",
        owner,
    )


def _is_stale(owner: dict[str, str]) -> bool:
    """Whether the lock's owner is known to be gone: only decidable for this machine's processes."""
    if owner.get("client") != socket.gethostname() or not owner.get("pid", "").isdigit():
        return False
    pid = int(owner["pid"])
    if pid == os.getpid():
        return owner.get("id") not in _ACTIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# --- preflight -----------------------------------------------------------------------------------


def _refuse_locked_guests(host: Host, changes: Sequence[FileChange]) -> None:
    # The compare-and-swap check guarantees the file is still `before`, so reading it is enough.
    for change in changes:
        if _GUEST.match(change.path) and change.before is not None:
            lock = GuestConfig.parse(change.before).get("lock")
            if lock:
                raise PreflightError(
                    host.name,
                    f"{change.path}: the guest is locked ({lock}): Proxmox is busy with it; "
                    "wait for that to finish (or `qm unlock`/`pct unlock` a stale lock), then "
                    "plan again",
                )


def _check_guests(
    host: Host,
    changes: Sequence[FileChange],
    has_pvesh: bool,
    api: Callable[[], PveResource],
    node: str,
) -> None:
    """Refuse unless every guest whose config changes is stopped, asking the Proxmox API."""
    guests = sorted(
        {
            ("qemu" if m[1] == "qemu-server" else "lxc", m[2])
            for c in changes
            if c.before is not None and (m := _GUEST.match(c.path))
        }
    )
    if not guests:
        return
    if not has_pvesh:
        names = ", ".join(f"{kind} {vmid}" for kind, vmid in guests)
        raise PreflightError(
            host.name,
            f"pvesh is not on this host, so whether {names} are running cannot be checked; "
            "stop them and pass skip_guest_check (--skip-guest-check) to apply anyway",
        )
    for kind, vmid in guests:
        label = f"{'VM' if kind == 'qemu' else 'container'} {vmid}"
        try:
            status = guest_status(api(), node, kind, vmid)
        except PveApiError as exc:
            raise PreflightError(
                host.name, f"cannot read the status of {label} ({exc.detail})"
            ) from exc
        if status != "stopped":
            tool = "qm" if kind == "qemu" else "pct"
            raise PreflightError(
                host.name,
                f"{label} is {status or 'in an unknown state'}: its config may only change while "
                f"it is stopped (a running guest keeps its devices); run `{tool} shutdown {vmid}` "
                "first",
            )


def _is_vm_config(path: str) -> bool:
    match = _GUEST.match(path)
    return match is not None and match[1] == "qemu-server"


def _todo(host: Host, changes: Sequence[FileChange], states: Sequence[_FileState]) -> list[int]:
    """Positions of the files to write; refuse any that is neither ``before`` nor ``after``.

    A VM config that Proxmox rewrote in its own order from ``after`` (an earlier apply through
    the API) counts as ``after``: its text is read (one more command, only then) and compared.
    """
    todo, unsure = [], []
    for index, (change, state) in enumerate(zip(changes, states, strict=True)):
        if state.kind == "other":
            raise FileChangedError(
                host.name, change.path, "is not a regular file; proxgpu only replaces files"
            )
        if state.sha256 == _sha(change.after):
            continue  # already as planned: a second apply writes nothing
        if state.sha256 != _sha(change.before):
            if not (_is_vm_config(change.path) and state.kind == "file" and change.after):
                raise _cas_failed(host, change.path)
            unsure.append(index)
            continue
        todo.append(index)
    if unsure:
        layout = _Layout.of(host)
        found = _read_files(host, [layout.on_host(changes[i].path) for i in unsure])
        for index, data in zip(unsure, found, strict=True):
            after = changes[index].after
            now = None if data is None else data.decode("utf-8", "replace")
            if now is None or after is None or not same_config(now, after):
                raise _cas_failed(host, changes[index].path)
    return todo


def _cas_failed(host: Host, path: str) -> FileChangedError:
    return FileChangedError(
        host.name,
        path,
        "changed since it was read (compare-and-swap failed); inspect and plan again",
    )


# --- apply ---------------------------------------------------------------------------------------


def _quiet(step: str, message: str) -> None:
    """The default progress callback: say nothing."""


def apply_changes(
    host: Host,
    changeset: ChangeSet,
    *,
    plan: Plan | None = None,
    dry_run: bool = False,
    live: bool = False,
    progress: Progress | None = None,
    inventory: Inventory | None = None,
    skip_guest_check: bool = False,
    action_timeout: float = ACTION_TIMEOUT,
) -> ApplyResult:
    """Apply ``changeset`` to ``host`` as one transaction; see the module docstring for the steps.

    Files already as planned are left alone, so applying the same change set twice changes nothing
    the second time. ``dry_run`` runs the read-only checks and writes nothing. ``live`` moves the
    plan's vfio groups to vfio-pci now (``plan`` required). On a directory tree
    (``host.is_live`` false) post-actions and live steps are listed, not run. ``inventory``, when
    given, says whether the host has pvesh; ``skip_guest_check`` applies without asking whether
    the guests are running (for hosts without pvesh, guests known to be stopped).

    >>> from proxgpu.hosts import DirectoryHost
    >>> apply_changes(DirectoryHost("/"), ChangeSet(host="pve1")).messages
    ['no changes: the host already matches the plan']

    :raises PreflightError: (and its subclasses) when refusing before anything was written.
    :raises ApplyError: when a step failed after writing; the message says what was restored.
    """
    changes = changeset.changed_files()
    if live and plan is None:
        raise UsageError("a live apply needs the plan: it says which GPUs move to vfio-pci")
    _refuse_locked_guests(host, changes)
    if not changes:
        return _unchanged(host, live)
    run = _Apply(host, changeset, plan, progress or _quiet, action_timeout)
    return run.run(dry_run, live, inventory, skip_guest_check)


_NO_CHANGES = "no changes: the host already matches the plan"


def _unchanged(host: Host, live: bool) -> ApplyResult:
    messages = [_NO_CHANGES]
    if live:
        # The journal ties a runtime rebind to the files it goes with; with none to write there
        # is no entry to roll it back by.
        messages.append("nothing was rebound: --live acts together with an apply that writes")
    return ApplyResult(host=host.name, changed=False, messages=messages)


class _Apply:
    """One apply's state, so that a failure at any step knows what to undo."""

    def __init__(
        self,
        host: Host,
        changeset: ChangeSet,
        plan: Plan | None,
        say: Progress,
        action_timeout: float,
    ) -> None:
        self.host = host
        self.changeset = changeset
        self.changes = changeset.changed_files()
        self.plan = plan
        self.say = say
        self.action_timeout = action_timeout
        self.id = new_journal_id()
        self.layout = _Layout.of(host)
        self.where = [_where(self.layout, c.path, self.id, host.is_live) for c in self.changes]
        self.locked = False
        self.entry: JournalEntry | None = None
        self.actions_run: list[list[str]] = []
        self.bindings: list[Binding] = []
        # Files certainly not renamed into place (or not sent to the API), which undo must not
        # restore.
        self.not_written: frozenset[str] = frozenset()
        # Positions of the VM configs written through the Proxmox API, with their parameters.
        self.updates: dict[int, dict[str, str]] = {}
        # Paths written through the API whose resulting hash is not known yet.
        self.unconfirmed: set[str] = set()
        self.node = ""
        self._api: PveResource | None = None

    def api(self) -> PveResource:
        """The host's Proxmox API, over the host's own connection (made on first use)."""
        if self._api is None:
            self._api = proxmox_api(self.host)
        return self._api

    def run(
        self, dry_run: bool, live: bool, inventory: Inventory | None, skip_guest_check: bool
    ) -> ApplyResult:
        self.say("preflight", f"checking {len(self.changes)} files on {self.host.name}")
        _ACTIVE.add(self.id)
        try:
            probe = _probe(
                self.host,
                self.layout,
                [w.path for w in self.where],
                lock_id=None if dry_run else self.id,
            )
            if not dry_run and not probe.locked:
                raise _lock_held_error(self.host, self.layout, probe.owner or {})
            self.locked = not dry_run
            todo = self._preflight(probe, live, inventory, skip_guest_check)
            if not todo:
                return _unchanged(self.host, live)
            if dry_run:
                return self._dry_result(todo, probe)
            return self._transaction(todo, probe, live)
        finally:
            _ACTIVE.discard(self.id)
            if self.locked:
                _release_quietly(self.host, self.layout, self.id)

    def _preflight(
        self, probe: _Probe, live: bool, inventory: Inventory | None, skip_guest_check: bool
    ) -> list[int]:
        if probe.in_progress:
            other = probe.in_progress[0]
            raise PreflightError(
                self.host.name,
                f"journal entry {other} is still in progress: an earlier apply did not finish; "
                f"run `proxgpu rollback --to {other}` first",
            )
        todo = _todo(self.host, self.changes, probe.files)
        # inventory, when given, must agree that pvesh is there (a tree may lack it).
        has_pvesh = probe.pvesh and (inventory is None or "pvesh" in inventory.commands)
        self.node = probe.node
        if todo and self.host.is_live:
            if not skip_guest_check:
                self.say("guests", "asking Proxmox whether the guests are stopped")
                changes = [self.changes[i] for i in todo]
                _check_guests(self.host, changes, has_pvesh, self.api, self.node)
            if has_pvesh and self.node:
                self.updates = self._api_updates(todo)
            if live and self.plan is not None:
                self.say("busy", "checking that no process holds the GPUs that move")
                live_rebind.check_not_busy(self.host, live_rebind.vfio_functions(self.plan))
        return todo

    def _api_updates(self, todo: list[int]) -> dict[int, dict[str, str]]:
        """The VM configs to write through the API, each with its ``PUT .../config`` parameters."""
        updates = {}
        for index in todo:
            change = self.changes[index]
            if not _is_vm_config(change.path) or change.before is None or change.after is None:
                continue
            update = config_update(change.before, change.after)
            if update is not None:
                # Proxmox refuses the write unless the file is still what the plan was made from.
                updates[index] = {**update, "digest": config_digest(change.before)}
        return updates

    def _api_note(self, indices: Sequence[int]) -> list[str]:
        paths = [self.changes[i].path for i in indices if i in self.updates]
        if not paths:
            return []
        return [f"through the Proxmox API (PUT .../config): {', '.join(paths)}"]

    def _dry_result(self, todo: list[int], probe: _Probe) -> ApplyResult:
        messages = ["dry run: nothing was written", *self._api_note(todo)]
        if probe.owner:
            messages.append(f"another {probe.owner.get('op', 'apply')} holds the lock right now")
        return ApplyResult(
            host=self.host.name,
            changed=True,
            dry_run=True,
            files=[self.changes[i].path for i in todo],
            actions=self.changeset.actions,
            reboot_required=self.changeset.reboot_required,
            messages=messages,
        )

    def _transaction(self, todo: list[int], probe: _Probe, live: bool) -> ApplyResult:
        try:
            self._stage(todo, probe.files)
            self._commit(todo)
            messages = self._post_actions()
            messages += self._live(live)
            self._record("applied", "")
        except BaseException as exc:
            if self.entry is None:
                raise
            error = self._undo(exc)
            if error is exc:
                raise
            raise error from exc
        assert self.entry is not None  # _stage wrote it
        return ApplyResult(
            host=self.host.name,
            changed=True,
            journal_id=self.id,
            files=[f.path for f in self.entry.files],
            actions=self.changeset.actions,
            actions_run=self.actions_run,
            live=self.bindings,
            reboot_required=self.changeset.reboot_required,
            messages=[
                f"{len(todo)} files written; journal entry {self.id}",
                *self._api_note(todo),
                *messages,
            ],
        )

    def _stage(self, todo: list[int], states: Sequence[_FileState]) -> None:
        self.say("backup", f"backing up {len(todo)} files and staging the new ones")
        self.not_written = frozenset(self.changes[i].path for i in todo)
        files, args, contents = [], [], []
        for n, index in enumerate(todo):
            change, state, where = self.changes[index], states[index], self.where[index]
            existed = state.kind == "file"
            via_api = index in self.updates
            files.append(
                JournalFile(
                    path=change.path,
                    existed=existed,
                    mode=state.mode,
                    uid=state.uid,
                    gid=state.gid,
                    sha256_before=state.sha256,
                    # For the API, what the plan says until the file Proxmox wrote is read back.
                    sha256_after=_sha(change.after),
                    backup=str(n) if existed else None,
                    via="api" if via_api else "file",
                )
            )
            staged = change.after is not None and not via_api
            args += [
                where.path,
                str(n) if existed else "-",
                state.sha256 or "-",
                where.tmp if staged else "-",
                *_mode_and_umask(change.mode, state.mode, where),
                f"{state.uid}:{state.gid}" if existed and not where.in_pve else "-",
                "1" if state.parent_exists else "0",
            ]
            if change.after is not None and staged:
                contents.append(_b64_line(change.after.encode()))
        created = sorted(
            {
                f.path.rpartition("/")[0]
                for f, i in zip(files, todo, strict=True)
                if not states[i].parent_exists
            }
        )
        self.entry = JournalEntry(
            id=self.id,
            status="in-progress",
            host=self.host.name,
            client=f"{getpass.getuser()}@{socket.gethostname()}",
            started=_now(),
            changeset=self.changeset,
            plan=self.plan,
            files=files,
            created_dirs=created,
        )
        meta = json.dumps([f.model_dump() for f in files], indent=2).encode()
        payload = _b64_line(self.entry.model_dump_json(indent=2).encode()) + _b64_line(meta)
        records = _script(
            self.host,
            "stage",
            _STAGE,
            [self.layout.journal(self.id), self.layout.backups(self.id), *args],
            payload=payload + b"".join(contents),
        )
        self._refuse_changed(records, [self.changes[i].path for i in todo], "#changed")

    def _refuse_changed(self, records: list[list[str]], paths: list[str], word: str) -> None:
        for record in records:
            if record[0] == word:
                raise FileChangedError(
                    self.host.name,
                    paths[int(record[1])],
                    "changed while being applied (compare-and-swap failed); plan again",
                )

    def _commit(self, todo: list[int]) -> None:
        through_api = [i for i in todo if i in self.updates]
        as_files = [i for i in todo if i not in self.updates]
        self._api_writes(through_api)
        self.say("write", f"replacing {len(as_files)} files")
        # The configs written through the API come first: their hashes are read back before
        # anything can stop the script.
        args = []
        for index in through_api:
            args += [self.where[index].path, "=", "-", "-"]
        for index in as_files:
            change, where = self.changes[index], self.where[index]
            tmp = where.tmp if change.after is not None else "-"
            args += [where.path, tmp, _sha(change.before) or "-", where.guest_lock]
        paths = [self.changes[i].path for i in through_api + as_files]
        renamed = frozenset(self.changes[i].path for i in as_files)
        self.not_written -= renamed  # unknown until the host answers
        records = _script(self.host, "commit", _COMMIT, args)
        self._confirm({paths[int(r[1])]: r[2] for r in records if r[0] == "#api" and r[2] != "-"})
        done = {paths[int(r[1])] for r in records if r[0] == "#done"}
        self.not_written |= renamed - done
        self._refuse_changed(records, paths, "#changed")
        for record in records:
            if record[0] == "#guestlocked":
                raise PreflightError(
                    self.host.name,
                    f"{paths[int(record[1])]}: Proxmox held the guest's config lock for 10 s "
                    "(another edit is running); retry when it is done",
                )
            if record[0] == "#failed":
                raise CommandError(
                    self.host.name, ["rename", paths[int(record[1])]], int(record[2]), ""
                )

    def _api_writes(self, indices: list[int]) -> None:
        """``PUT /nodes/<node>/qemu/<vmid>/config`` for each VM config, one pvesh call each."""
        for index in indices:
            change = self.changes[index]
            vmid = change.path.rsplit("/", 1)[1].removesuffix(".conf")
            self.say("api", f"setting VM {vmid}'s options through the Proxmox API")
            try:
                self.api().nodes(self.node).qemu(vmid).config.put(**self.updates[index])
            except PveApiError:
                # Proxmox checks the digest and the guest's lock before it writes: refused, the
                # file is as it was (and may now be someone else's edit, which must stay).
                raise
            except BaseException:
                self.not_written -= {change.path}  # the call may or may not have landed
                self.unconfirmed.add(change.path)
                raise
            self.not_written -= {change.path}
            self.unconfirmed.add(change.path)

    def _confirm(self, hashes: dict[str, str]) -> None:
        """Journal the hashes of the files Proxmox wrote, as read back from the host."""
        assert self.entry is not None
        self.unconfirmed -= set(hashes)
        self.entry = _with_hashes(self.entry, hashes)

    def _post_actions(self) -> list[str]:
        post = [a for a in self.changeset.actions if a.kind == "post"]
        if not self.host.is_live:
            return [f"listed, not run (a directory tree): {' '.join(a.argv)}" for a in post]
        for action in post:
            self.say("action", " ".join(action.argv))
            self.host.check(action.argv, timeout=self.action_timeout)
            self.actions_run.append(action.argv)
        return []

    def _live(self, live: bool) -> list[str]:
        live_actions = [a for a in self.changeset.actions if a.kind == "live"]
        if not live:
            return [f"live step not run (no --live): {' '.join(a.argv)}" for a in live_actions]
        assert self.plan is not None  # apply_changes refuses live without a plan
        functions = live_rebind.vfio_functions(self.plan)
        if not functions:
            return ["live: the plan moves no function to vfio-pci"]
        if not self.host.is_live:
            return [
                f"listed, not run (a directory tree): rebind {', '.join(functions)} to vfio-pci"
            ]
        self.say("live", f"binding {len(functions)} functions to vfio-pci")
        self.bindings = live_rebind.bind_to_vfio(self.host, functions)
        for action in live_actions:
            self.say("live", " ".join(action.argv))
            self.host.check(action.argv, timeout=self.action_timeout)
            self.actions_run.append(action.argv)
        return [f"bound to vfio-pci now: {', '.join(b.address for b in self.bindings)}"]

    def _record(self, status: Status, message: str) -> None:
        assert self.entry is not None
        self.entry = self.entry.model_copy(
            update={
                "status": status,
                "finished": _now(),
                "live": self.bindings,
                "actions_run": self.actions_run,
                "message": message,
            }
        )
        _finish(self.host, self.layout, self.id, self.entry, release=True)
        self.locked = False

    def _undo(self, exc: BaseException) -> ProxgpuError:
        assert self.entry is not None
        what = _describe(exc)
        self.say("restore", f"{what}; restoring every file from the backup")
        problems = self._undo_steps()
        if problems:
            status: Status = "in-progress"
            outcome = (
                f"restoring did not finish ({'; '.join(problems)}); the apply is left in "
                "progress: run `proxgpu rollback` once the host is reachable"
            )
        else:
            status = "failed"
            outcome = "every file was restored from the backup" + self._rerun_actions()
        try:
            self._record(status, f"{what}; {outcome}")
        except ProxgpuError as record_exc:
            outcome += f" (the journal could not be updated: {_describe(record_exc)})"
        if isinstance(exc, PreflightError) and not problems:
            return exc  # refused at the last moment: nothing of the apply is left on the host
        return ApplyError(
            self.host.name, f"apply {self.id} failed: {what}; {outcome}", self.id, not problems
        )

    def _undo_steps(self) -> list[str]:
        assert self.entry is not None
        problems = []
        if self.bindings:
            try:
                live_rebind.restore_drivers(self.host, self.bindings)
            except ProxgpuError as exc:
                problems.append(f"returning the drivers failed: {_describe(exc)}")
        try:
            if self.unconfirmed:
                # Written through the API, but the file Proxmox wrote was never read back:
                # recognise it by its content, so that it is restored and another's edit is not.
                self.entry = _recognise(self.host, self.layout, self.entry, self.unconfirmed)
            keep = self.not_written
            problems += _restore(self.host, self.layout, self.entry, force=False, keep=keep)[1]
        except ProxgpuError as exc:
            return [*problems, f"restoring the files failed: {_describe(exc)}"]
        return problems

    def _rerun_actions(self) -> str:
        # Post-actions rebuild things from the files (the initramfs): rebuild from the old ones.
        for argv in self.actions_run:
            try:
                self.host.check(argv, timeout=self.action_timeout)
            except ProxgpuError as exc:
                return f"; re-running {argv[0]} failed ({_describe(exc)}): run it by hand"
        return f"; re-ran {len(self.actions_run)} post-actions" if self.actions_run else ""


def _mode_and_umask(wanted: int | None, current: str | None, where: _Where) -> tuple[str, str]:
    """The mode to chmod a new temp file to, and the umask to create it under.

    pmxcfs refuses a chmod to anything but its own 0640, so in /etc/pve the mode comes from the
    umask alone (pmxcfs ignores it; a tree copy keeps the file's mode). Elsewhere the file is
    created private and then given its mode, which may carry bits no umask can give (0755).
    """
    mode = wanted if wanted is not None else int(current or ("640" if where.in_pve else "644"), 8)
    if where.in_pve:
        return "-", f"{0o777 & ~mode:03o}"
    return f"{mode:o}", "077"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ProxgpuError):
        return getattr(exc, "detail", str(exc))
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"{type(exc).__name__}: {exc}"


# --- restore, rollback, history ------------------------------------------------------------------

_RESTORE_OUTCOMES = {
    10: "already as before",
    11: "changed by someone else since the apply; left alone",
    12: "its backup is damaged; left alone",
    13: "could not be written back",
    75: "Proxmox held the guest's config lock for 10 s; left alone",
}


def _restore(
    host: Host,
    layout: _Layout,
    entry: JournalEntry,
    *,
    force: bool,
    keep: frozenset[str] = frozenset(),
) -> tuple[list[str], list[str]]:
    """Put back ``entry``'s files in one command; return (paths restored, problems).

    Files in ``keep`` were never written: only their temp files are removed.
    """
    args = [str(len(entry.files))]
    for f in entry.files:
        only_if = "any" if force else (f.sha256_after or "-")
        where = _where(layout, f.path, entry.id, host.is_live)
        args += [
            where.path,
            where.tmp,
            f"{layout.backups(entry.id)}/{f.backup}" if f.backup else "-",
            f.sha256_before or "-",
            *_mode_and_umask(None, f.mode, where),
            f"{f.uid}:{f.gid}" if f.existed and not where.in_pve else "-",
            "keep" if f.path in keep else only_if,
            where.guest_lock,
        ]
    args += [layout.on_host(d) for d in sorted(entry.created_dirs, reverse=True)]
    records = _script(host, "restore", _RESTORE, args)
    restored, problems = [], []
    for _, index, rc in (r for r in records if r[0] == "#rc"):
        path, code = entry.files[int(index)].path, int(rc)
        if code == 0:
            restored.append(path)
        elif code != 10:
            problems.append(f"{path}: {_RESTORE_OUTCOMES.get(code, f'failed ({code})')}")
    if not records or records[-1] != ["#end"]:
        problems.append("the restore step stopped before the end")
    return restored, problems


def history(host: Host) -> list[JournalEntry]:
    """Every journal entry on ``host``, oldest first, in one command.

    >>> from proxgpu.hosts import DirectoryHost
    >>> history(DirectoryHost("examples/hosts/ct200"))
    []

    :raises JournalError: when an entry cannot be read.
    """
    layout = _Layout.of(host)
    records = _script(host, "journal", _READ_JOURNAL, [layout.journal_dir])
    entries = []
    for _, journal_id, b64 in (r for r in records if r[0] == "#entry"):
        try:
            entries.append(JournalEntry.model_validate_json(base64.b64decode(b64)))
        except (ValidationError, ValueError) as exc:
            raise JournalError(host.name, layout.journal(journal_id), f"unreadable: {exc}") from exc
    return sorted(entries, key=lambda e: e.id)


def _choose(host: Host, entries: list[JournalEntry], to: str | None) -> JournalEntry | None:
    if to is None:
        candidates = [e for e in entries if e.status in ("applied", "in-progress")]
        return candidates[-1] if candidates else None
    entry = next((e for e in entries if e.id == to), None)
    if entry is None:
        path = _Layout.of(host).journal(to)
        raise JournalError(host.name, path, "no such journal entry (see `proxgpu history`)")
    if entry.status == "rolled-back":
        raise RollbackError(host.name, f"journal entry {to} was already rolled back")
    if entry.status == "failed":
        raise RollbackError(
            host.name, f"journal entry {to} failed and was restored then; nothing to roll back"
        )
    return entry


def rollback(
    host: Host,
    to: str | None = None,
    *,
    run_actions: bool = True,
    force: bool = False,
    live: bool = False,
    break_lock: bool = False,
    progress: Progress | None = None,
    action_timeout: float = ACTION_TIMEOUT,
) -> RollbackResult:
    """Restore the files of journal entry ``to`` (default: the latest applied or unfinished one)
    byte for byte, remove the files it created, and re-run its post-actions.

    Refuses when a file changed since the apply, unless ``force``. An entry left in progress by a
    dropped connection is recovered here, taking over the lock it left behind when that apply ran
    from this machine and is gone (``break_lock`` takes over any lock). ``live`` also returns
    the functions the apply rebound at runtime to their drivers.

    :raises RollbackError: when there is nothing to roll back or a step failed.
    :raises FileChangedError: when a file changed since the apply and ``force`` is not given.
    :raises ConcurrentApplyError: when another apply or rollback holds the lock.
    """
    say = progress or _quiet
    entries = history(host)
    entry = _choose(host, entries, to)
    layout = _Layout.of(host)
    lock_id = new_journal_id()
    paths = [layout.on_host(f.path) for f in entry.files] if entry else []
    _ACTIVE.add(lock_id)
    locked = False
    try:
        say("lock", f"taking the lock on {host.name}")
        probe, stale = _lock_for_rollback(host, layout, paths, lock_id, break_lock)
        locked = True
        known = {e.id for e in entries}
        if stale is not None and to is None and stale.get("id") not in known:
            return RollbackResult(
                host=host.name,
                journal_id=None,
                messages=[
                    f"released the lock left by {stale.get('op')} {stale.get('id')}, "
                    "which had written nothing"
                ],
            )
        if entry is None:
            raise RollbackError(host.name, "nothing to roll back: no applied journal entry")
        if not force:
            entry = _recognise_api_writes(host, layout, entry, probe.files)
            _check_rollback_files(host, entry, probe.files)
        result = _Rollback(host, layout, entry, say, action_timeout).run(run_actions, live, force)
        _finish(host, layout, lock_id, result[1], release=True)
        locked = False
        return result[0]
    finally:
        _ACTIVE.discard(lock_id)
        if locked:
            _release_quietly(host, layout, lock_id)


def _lock_for_rollback(
    host: Host, layout: _Layout, paths: list[str], lock_id: str, break_lock: bool
) -> tuple[_Probe, dict[str, str] | None]:
    probe = _probe(host, layout, paths, lock_id=lock_id, op="rollback")
    if probe.locked:
        return probe, None
    owner = probe.owner or {}
    if not (break_lock or _is_stale(owner)):
        raise _lock_held_error(host, layout, owner)
    probe = _probe(
        host, layout, paths, lock_id=lock_id, op="rollback", takeover=owner.get("id", "")
    )
    if not probe.locked:
        raise _lock_held_error(host, layout, probe.owner or {})
    return probe, owner


def _recognise_api_writes(
    host: Host, layout: _Layout, entry: JournalEntry, states: list[_FileState]
) -> JournalEntry:
    """Recognise the VM configs an unfinished apply wrote through the API but never read back."""
    paths = [
        f.path
        for f, state in zip(entry.files, states, strict=True)
        if f.via == "api"
        and state.kind == "file"
        and state.sha256 not in (f.sha256_after, f.sha256_before)
    ]
    return _recognise(host, layout, entry, paths) if paths else entry


def _check_rollback_files(host: Host, entry: JournalEntry, states: list[_FileState]) -> None:
    for f, state in zip(entry.files, states, strict=True):
        if state.kind == "other" or state.sha256 not in (f.sha256_after, f.sha256_before):
            raise FileChangedError(
                host.name,
                f.path,
                f"changed since apply {entry.id} wrote it; look at it, then roll back with force "
                "to overwrite it with the backup",
            )


class _Rollback:
    def __init__(
        self, host: Host, layout: _Layout, entry: JournalEntry, say: Progress, timeout: float
    ) -> None:
        self.host = host
        self.layout = layout
        self.entry = entry
        self.say = say
        self.timeout = timeout

    def run(
        self, run_actions: bool, live: bool, force: bool
    ) -> tuple[RollbackResult, JournalEntry]:
        messages: list[str] = []
        bindings: list[Binding] = []
        if live and self.entry.live and self.host.is_live:
            self.say("live", "returning the rebound functions to their drivers")
            moved = [b for b in self.entry.live if b.moved]
            live_rebind.check_not_busy(self.host, [b.address for b in moved])
            bindings = live_rebind.restore_drivers(self.host, moved)
        self.say("restore", f"restoring {len(self.entry.files)} files of {self.entry.id}")
        restored, problems = _restore(self.host, self.layout, self.entry, force=force)
        if problems:
            raise RollbackError(
                self.host.name, f"rollback of {self.entry.id} incomplete: {'; '.join(problems)}"
            )
        actions_run = self._actions(run_actions, messages)
        entry = self.entry.model_copy(
            update={"status": "rolled-back", "finished": _now(), "message": "rolled back"}
        )
        result = RollbackResult(
            host=self.host.name,
            journal_id=self.entry.id,
            files=restored,
            actions_run=actions_run,
            live=bindings,
            messages=[
                f"{len(restored)} files restored from journal entry {self.entry.id}",
                *messages,
            ],
        )
        return result, entry

    def _actions(self, run_actions: bool, messages: list[str]) -> list[list[str]]:
        post = [a for a in self.entry.changeset.actions if a.kind == "post"]
        if not (run_actions and self.host.is_live):
            messages += [f"listed, not run: {' '.join(a.argv)}" for a in post]
            return []
        ran = []
        for action in post:
            self.say("action", " ".join(action.argv))
            self.host.check(action.argv, timeout=self.timeout)
            ran.append(action.argv)
        return ran


# --- verify --------------------------------------------------------------------------------------


def verify(
    host: Host, target: JournalEntry | Plan, *, inventory: Inventory | None = None
) -> VerifyReport:
    """Compare the host with an applied journal entry (its files and plan) or with a plan alone.

    Drivers come from a fresh inspection (``inventory`` replaces it when given): each function of
    a vfio group must be on vfio-pci, each GPU of the host group on the group's driver. An entry's
    files must hold what the apply wrote (or, rolled back, what was there before).

    :raises HostUnreachableError: when the host cannot be read.
    """
    plan = target if isinstance(target, Plan) else target.plan
    drift: list[str] = []
    if isinstance(target, JournalEntry):
        drift += _file_drift(host, target)
    if plan is not None and (isinstance(target, Plan) or target.status == "applied"):
        note = ""
        if (
            isinstance(target, JournalEntry)
            and target.changeset.reboot_required
            and not target.live
        ):
            note = f" (apply {target.id} takes effect after a reboot)"
        current = inventory or inspect(host)
        drift += [line + note for line in _driver_drift(current, plan)]
    return VerifyReport(host=host.name, drifted=bool(drift), drift=drift)


def _file_drift(host: Host, entry: JournalEntry) -> list[str]:
    if entry.status == "in-progress":
        return [f"journal entry {entry.id} is still in progress: run `proxgpu rollback`"]
    layout = _Layout.of(host)
    paths = [layout.on_host(f.path) for f in entry.files]
    states = _probe(host, layout, paths, lock_id=None).files
    wrote = entry.status == "applied"
    lines = []
    for f, state in zip(entry.files, states, strict=True):
        want = f.sha256_after if wrote else f.sha256_before
        if state.sha256 == want and state.kind != "other":
            continue
        if want is None:
            lines.append(f"{f.path}: exists, but apply {entry.id} left it absent")
        elif state.kind == "absent":
            lines.append(f"{f.path}: missing, but apply {entry.id} left it in place")
        else:
            lines.append(f"{f.path}: differs from what apply {entry.id} left there")
    return lines


def _driver_drift(inventory: Inventory, plan: Plan) -> list[str]:
    drivers = {
        f.address: f.driver
        for gpu in inventory.gpus
        for f in (*gpu.function_info, *gpu.iommu_group_peers)
    }
    lines = []
    for group in plan.groups:
        for function in group.functions:
            if function not in drivers:
                lines.append(f"{function}: not found on the host")
                continue
            have = drivers[function] or "no driver"
            if group.role == "vfio" or function in group.gpus:
                want = VFIO_DRIVER if group.role == "vfio" else group.driver
                if have != want:
                    lines.append(f"{function}: bound to {have}, the plan says {want}")
            elif have == VFIO_DRIVER:
                lines.append(f"{function}: bound to vfio-pci, the plan keeps it on the host")
    return lines
