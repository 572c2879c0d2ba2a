"""The journal of applies, and what reads or undoes it: history, rollback, verify.

Every apply (:mod:`proxgpu.transaction`) leaves a :class:`JournalEntry` on the host, with a backup
of each file it touched. This module holds that record and everything built on it:
:func:`history` lists the entries, :func:`rollback` puts an entry's files back byte for byte (and
recovers an apply a dropped connection left in progress), :func:`verify` compares the host with an
entry. It also holds the host-side machinery apply shares with rollback: the host-wide lock, the
one-command probe of every file's state, the restore script, and the shell functions those
scripts have in common (:data:`_SHELL_PRELUDE`). The names with one leading underscore that
:mod:`proxgpu.transaction` imports are shared with it and with nothing else.

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
import os
import re
import secrets
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pydantic import Field, ValidationError

from proxgpu import live as live_rebind
from proxgpu.changes import ChangeSet
from proxgpu.claims import GUEST_CONFIG, PCI_MAPPING_PATH
from proxgpu.errors import (
    CommandError,
    ConcurrentApplyError,
    FileChangedError,
    JournalError,
    NotRootError,
    ProxgpuError,
    RollbackError,
)
from proxgpu.hosts import Host
from proxgpu.inspection import inspect
from proxgpu.inventory import FrozenModel, Inventory
from proxgpu.live import Binding
from proxgpu.planning import VFIO_DRIVER, Plan
from proxgpu.pveapi import same_config
from proxgpu.pveconfig import GuestConfig, PciMappingConfig
from proxgpu.rendering import GRUB_DEFAULT, KERNEL_CMDLINE

JOURNAL_DIR = "/var/lib/proxgpu/journal"
BACKUP_DIR = "/var/lib/proxgpu/backups"
LOCK_DIR = "/run/lock/proxgpu"
#: Seconds a post-action may run (an initramfs rebuild for every kernel takes minutes).
ACTION_TIMEOUT = 900.0
SCRIPT_TIMEOUT = 300.0

Status = Literal["in-progress", "applied", "rolled-back", "failed"]
#: Called with a step (``lock``, ``backup``, ``write``, ``action``, ...) and a line for people.
Progress = Callable[[str, str], None]

_PVE = "/etc/pve/"
# Journal ids of the applies and rollbacks running in this process: a lock they hold is not stale.
_ACTIVE: set[str] = set()

# Shell functions the scripts that write files share; a script using them starts with this.
#   put_tmp TMP MODE UMASK OWNER CMD...: write CMD's output into the new file TMP, created under
#     UMASK, then give it OWNER (uid:gid) and MODE, each unless "-" (pmxcfs takes no chmod or
#     chown: /etc/pve files pass "-" for both).
#   under_lock LOCK CMD...: run CMD in a subshell holding LOCK, a Proxmox config lock file, as
#     `qm set` and `pct set` take it ("-": no lock); 75 when another holder keeps it for 10 s.
_SHELL_PRELUDE = r"""
set -u
put_tmp() {
    pt_tmp=$1 pt_mode=$2 pt_mask=$3 pt_owner=$4
    shift 4
    (umask "$pt_mask" && "$@" > "$pt_tmp") || return 1
    if [ "$pt_owner" != - ] && [ "$(stat -c %u:%g "$pt_tmp")" != "$pt_owner" ]; then
        chown "$pt_owner" "$pt_tmp" || return 1
    fi
    if [ "$pt_mode" != - ]; then chmod "$pt_mode" "$pt_tmp" || return 1; fi
}
under_lock() {
    if [ "$1" = - ]; then shift; ( "$@" ); return; fi
    mkdir -p "${1%/*}" || return 1
    ul_lock=$1
    shift
    ( flock -E 75 -w 10 9 || exit; "$@" ) 9>>"$ul_lock"
}
"""

# Usage: sh -c PROBE sh MODE LOCK OWNER TAKEOVER NEED_ROOT JOURNAL_DIR PATH...
# MODE "lock" takes the lock (a directory made complete, owner file inside, then renamed into
# place, so it never exists without its owner); "read" only reads. Records:
#   #uid N | #node NAME | #pvesh | #notroot | #lock | #locked B64(owner) | #held B64(owner)
#   #inprogress ID | #file I other | #file I file SHA256 MODE UID GID
#   #file I absent MISSING_DIRS (how many of its ancestors do not exist) | #end
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
    else
        d=${p%/*} n=0
        while [ -n "$d" ] && [ ! -d "$d" ]; do n=$((n + 1)); d=${d%/*}; done
        echo "#file $i absent $n"
    fi
    i=$((i + 1))
done
echo "#end"
"""

# Usage: sh -c RESTORE sh N [PATH TMP BACKUP BACKUP_SHA MODE UMASK OWNER ONLY_IF GUEST_LOCK]xN
#        DIR...   (MODE, UMASK and OWNER as for put_tmp; DIR deepest first)
# Puts back each file whose current hash is ONLY_IF ("-": absent; "any": whatever it is; "keep":
# never, the file was not written);
# BACKUP "-" means the file did not exist, so it is removed. Leftover temp files go first, empty
# directories the apply created last. Records: #rc I RC (0 restored, 10 already as before,
# 11 changed by someone else, 12 backup damaged, 13 failed, 75 guest config locked) | #end
_RESTORE = (
    _SHELL_PRELUDE
    + r"""
restore() {  # PATH TMP BACKUP BACKUP_SHA MODE UMASK OWNER ONLY_IF
    rm -f "$2"
    [ "$8" = keep ] && return 10
    cur=-
    if [ -L "$1" ] || { [ -e "$1" ] && [ ! -f "$1" ]; }; then return 11; fi
    if [ -f "$1" ]; then cur=$(sha256sum < "$1") || return 13; cur=${cur%% *}; fi
    [ "$cur" = "$4" ] && return 10
    [ "$8" = any ] || [ "$8" = "$cur" ] || return 11
    if [ "$3" = - ]; then rm -f "$1" || return 13; return 0; fi
    got=$(sha256sum < "$3") || return 12
    [ "${got%% *}" = "$4" ] || return 12
    mkdir -p "${1%/*}" && put_tmp "$2" "$5" "$6" "$7" cat "$3" && mv -f "$2" "$1" || return 13
}
n=$1
shift
i=0
while [ "$i" -lt "$n" ]; do
    under_lock "$9" restore "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8"
    echo "#rc $i $?"
    shift 9
    i=$((i + 1))
done
for d; do rmdir "$d" 2>/dev/null; done
echo "#end"
"""
)

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


class JournalFile(FrozenModel):
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


class JournalEntry(FrozenModel):
    """One apply as the journal records it; ``status`` moves from ``in-progress`` to ``applied``,
    ``failed`` (everything was restored) or, later, ``rolled-back``.

    ``created_dirs`` lists every directory the apply created, deepest first (rollback removes
    them when empty; older entries name only the directory of each new file),
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


class RollbackResult(FrozenModel):
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


class VerifyReport(FrozenModel):
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
    match = GUEST_CONFIG.match(path)
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
    #: How many of an absent file's ancestors are missing too (0: its directory is there).
    missing_dirs: int = 0

    @property
    def parent_exists(self) -> bool:
        return self.missing_dirs == 0


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
        return _FileState("absent", missing_dirs=int(fields[1]))
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


# --- small helpers -------------------------------------------------------------------------------


def _quiet(step: str, message: str) -> None:
    """The default progress callback: say nothing."""


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


def _deepest_first(dirs: Iterable[str]) -> list[str]:
    """Directories in an order that empties each before its parent.

    >>> _deepest_first(["/usr/local", "/etc/initramfs-tools/hooks", "/etc/initramfs-tools"])
    ['/etc/initramfs-tools/hooks', '/etc/initramfs-tools', '/usr/local']
    """
    return sorted(set(dirs), key=lambda d: (-d.count("/"), d))


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
    args += [layout.on_host(d) for d in _deepest_first(entry.created_dirs)]
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
        post = self.entry.changeset.actions
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
    files must hold what the apply wrote (or, rolled back, what was there before): the files
    proxgpu owns byte for byte; in the files it only edits (guest configs, the PCI mapping file,
    the kernel command line) only what it changed, so that an edit of anything else is no drift.

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
    """One line per file that is not as ``entry`` left it, in the entry's order.

    One command reads every file's hash; one more reads the text of the partly-owned files whose
    hash differs, to compare only what the apply changed in them.
    """
    if entry.status == "in-progress":
        return [f"journal entry {entry.id} is still in progress: run `proxgpu rollback`"]
    layout = _Layout.of(host)
    paths = [layout.on_host(f.path) for f in entry.files]
    states = _probe(host, layout, paths, lock_id=None).files
    wrote = entry.status == "applied"
    who = {
        "applied": f"apply {entry.id}",
        "rolled-back": f"the rollback of {entry.id}",
    }.get(entry.status, f"the restore of failed apply {entry.id}")
    planned = {c.path: c for c in entry.changeset.files}
    lines: list[list[str]] = []
    compare: dict[int, tuple[str, str]] = {}  # position -> (the text left, the other one)
    for n, (f, state) in enumerate(zip(entry.files, states, strict=True)):
        want = f.sha256_after if wrote else f.sha256_before
        change = planned.get(f.path)
        lines.append([])
        if state.sha256 == want and state.kind != "other":
            continue
        if want is None:
            lines[n].append(f"{f.path}: exists, but {who} left it absent")
        elif state.kind == "absent":
            lines[n].append(f"{f.path}: missing, but {who} left it in place")
        elif state.kind == "file" and change is not None and _partly_ours(f.path):
            left, other = (change.after, change.before) if wrote else (change.before, change.after)
            if left is not None:
                compare[n] = (left, other or "")
                continue
            lines[n].append(f"{f.path}: differs from what {who} left there")
        else:
            lines[n].append(f"{f.path}: differs from what {who} left there")
    if compare:
        texts = _read_files(host, [paths[n] for n in compare])
        for (n, (left, other)), data in zip(compare.items(), texts, strict=True):
            path = entry.files[n].path
            if data is None:  # replaced by something else than a file since the probe
                lines[n].append(f"{path}: differs from what {who} left there")
                continue
            now = data.decode("utf-8", "replace")
            lines[n] += [f"{path}: {line}" for line in _entry_drift(path, left, other, now, who)]
    return [line for per_file in lines for line in per_file]


def _is_raw(key: str) -> bool:
    return key.startswith("lxc.")


def _partly_ours(path: str) -> bool:
    """Whether proxgpu edits only some entries of ``path``, the rest being Proxmox's or the
    admin's (the files it owns entirely are compared byte for byte).

    >>> _partly_ours("/etc/pve/qemu-server/300.conf"), _partly_ours("/etc/modules-load.d/x.conf")
    (True, False)
    """
    return bool(GUEST_CONFIG.match(path)) or path in (
        PCI_MAPPING_PATH,
        KERNEL_CMDLINE,
        GRUB_DEFAULT,
    )


def _entry_drift(path: str, left: str, other: str, now: str, who: str) -> list[str]:
    """What of the change from ``other`` to ``left`` (the text the apply, or the rollback, left)
    is no longer in ``now``; everything else in the file may change freely.

    >>> _entry_drift("/etc/kernel/cmdline", "root=x quiet iommu=pt\\n", "root=x quiet\\n",
    ...              "root=y iommu=pt\\n", "apply 1")
    []
    """
    if path in (KERNEL_CMDLINE, GRUB_DEFAULT):
        return _word_drift(
            _kernel_parameters(path, left),
            _kernel_parameters(path, other),
            _kernel_parameters(path, now),
            who,
            "kernel parameter ",
        )
    if path == PCI_MAPPING_PATH:
        return _mapping_drift(left, other, now, who)
    return _config_drift(left, other, now, who)


def _config_drift(left: str, other: str, now: str, who: str) -> list[str]:
    """Drift in the main section of a guest config: each key the change added, changed or
    removed must still have the value it was left with; raw ``lxc.*`` keys, which repeat, line by
    line. Other sections (snapshots, pending changes) and the description are not compared.

    >>> _config_drift("cores: 4\\nnuma: 1\\n", "cores: 2\\n", "numa: 1\\ntags: x\\ncores: 8\\n",
    ...               "apply 1")
    ['cores is now "8", but apply 1 set "4"']
    """
    want, was, have = (GuestConfig.parse(t).entries() for t in (left, other, now))
    lines = _word_drift(
        [f"{k}: {v}" for k, v in want if _is_raw(k)],
        [f"{k}: {v}" for k, v in was if _is_raw(k)],
        [f"{k}: {v}" for k, v in have if _is_raw(k)],
        who,
        "",
    )
    # The last entry of a key wins, as in Proxmox.
    want_keys, was_keys, have_keys = (
        {k: v for k, v in entries if not _is_raw(k)} for entries in (want, was, have)
    )
    for key in dict.fromkeys([*want_keys, *was_keys]):
        wanted, found = want_keys.get(key), have_keys.get(key)
        if wanted == was_keys.get(key) or wanted == found:
            continue
        if wanted is None:
            lines.append(f'"{key}: {found}" is back, but {who} removed it')
        elif found is None:
            lines.append(f'"{key}: {wanted}" is gone, but {who} put it there')
        else:
            lines.append(f'{key} is now "{found}", but {who} set "{wanted}"')
    return lines


def _mapping_drift(left: str, other: str, now: str, who: str) -> list[str]:
    """Drift in ``/etc/pve/mapping/pci.cfg``, line by line within each mapping id, so that
    another node's ``map`` lines or a description added later are no drift.

    >>> mapping = "gpu\\n\\tmap node=a\\n"
    >>> _mapping_drift(mapping, "", mapping + "\\tmap node=b\\n", "apply 1")
    []
    """
    want, was, have = (PciMappingConfig.parse(t) for t in (left, other, now))
    lines = []
    for mapping_id in dict.fromkeys([*want.ids(), *was.ids()]):
        wanted, before, found = (
            [f"{k} {v}" for k, v in c.entries(mapping_id)] if mapping_id in c.ids() else []
            for c in (want, was, have)
        )
        gone = [line for line in wanted if line not in before and line not in found]
        if gone and mapping_id not in have.ids():
            lines.append(f"mapping {mapping_id} is gone, but {who} put it there")
            continue
        lines += _word_drift(wanted, before, found, who, f"mapping {mapping_id}: ")
    return lines


def _word_drift(
    left: Sequence[str], other: Sequence[str], now: Sequence[str], who: str, what: str
) -> list[str]:
    """Each item ``left`` has and ``other`` lacks must be in ``now``; each the other way round
    must not be.

    >>> _word_drift(["a", "b"], ["b", "c"], ["c"], "apply 1", "word ")
    ['word "a" is gone, but apply 1 put it there', 'word "c" is back, but apply 1 removed it']
    """
    gone = [
        f'{what}"{w}" is gone, but {who} put it there'
        for w in left
        if w not in other and w not in now
    ]
    back = [
        f'{what}"{w}" is back, but {who} removed it' for w in other if w not in left and w in now
    ]
    return gone + back


_GRUB_CMDLINE = re.compile(
    r"^\s*(?:export\s+)?GRUB_CMDLINE_LINUX(?:_DEFAULT)?=([\"']?)(.*?)\1\s*$", re.MULTILINE
)


def _kernel_parameters(path: str, text: str) -> list[str]:
    """The kernel parameters a boot loader file gives: all of ``/etc/kernel/cmdline``, the
    ``GRUB_CMDLINE_LINUX`` and ``GRUB_CMDLINE_LINUX_DEFAULT`` values of ``/etc/default/grub``.

    >>> _kernel_parameters(GRUB_DEFAULT, 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"\\n')
    ['quiet', 'iommu=pt']
    """
    if path == KERNEL_CMDLINE:
        return text.split()
    return [word for match in _GRUB_CMDLINE.finditer(text) for word in match[2].split()]


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
