"""The host side of the write path, shared by apply, rollback and verify.

Each function here is one command on the host, whatever the number of files: :func:`probe` reads
every file's state (and takes the lock), :func:`read_files` their bytes, :func:`restore` puts an
entry's files back, :func:`finish` records an entry and releases the lock. The scripts they run
are ``proxgpu/scripts/{probe,read,restore,finish}.sh``.

>>> deepest_first(["/usr/local", "/etc/initramfs-tools/hooks", "/etc/initramfs-tools"])
['/etc/initramfs-tools/hooks', '/etc/initramfs-tools', '/usr/local']
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from proxgpu.apply import lock
from proxgpu.apply.journal import (
    KEEP_ENTRIES,
    JournalEntry,
    JournalFile,
    entry_json,
    machine_of,
)
from proxgpu.apply.layout import Layout, Where, mode_and_umask
from proxgpu.callback import require_callable
from proxgpu.errors import NotRootError, PreflightError, ProxgpuError
from proxgpu.host.base import Host
from proxgpu.host.scripts import ScriptArgs, ScriptRecord, read_files, run_script
from proxgpu.paths import BACKUP_DIR, PCI_MAPPING
from proxgpu.pve.api import same_config
from proxgpu.pve.mapping import same_mapping
from proxgpu.rendering.changes import FileChange

#: Called with a step (``lock``, ``backup``, ``write``, ``action``, ...) and a line for people.
Progress = Callable[[str, str], None]


def quiet(step: str, message: str) -> None:
    """The default progress callback: say nothing."""


def progress_of(progress: Progress | None) -> Progress:
    """The caller's progress callback, checked before anything runs, else :func:`quiet`.

    :raises TypeError: for one that cannot be called as ``progress(step, message)``.
    """
    if progress is None:
        return quiet
    require_callable(progress, "progress", "progress(step, message)", 2)
    return progress


def now() -> str:
    """The time now, as the journal records it."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def sha(text: str | None) -> str | None:
    """The SHA-256 of ``text`` as the host would hash the file holding it."""
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def describe(exc: BaseException) -> str:
    """What went wrong, in words for a message."""
    if isinstance(exc, ProxgpuError):
        return getattr(exc, "detail", str(exc))
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"{type(exc).__name__}: {exc}"


def deepest_first(dirs: Iterable[str]) -> list[str]:
    """Directories in an order that empties each before its parent (see the module example)."""
    return sorted(set(dirs), key=lambda d: (-d.count("/"), d))


@dataclass(frozen=True)
class FileState:
    """A target file as the probe found it."""

    kind: Literal["file", "absent", "other", "escapes"]
    sha256: str | None = None
    mode: str | None = None
    uid: int | None = None
    gid: int | None = None
    #: How many of an absent file's ancestors are missing too (0: its directory is there).
    missing_dirs: int = 0


@dataclass(frozen=True)
class Probe:
    """What one probe found: the lock, unfinished entries, each file's state, the node."""

    locked: bool
    owner: dict[str, str] | None
    in_progress: list[str]
    files: list[FileState]
    node: str = ""
    pvesh: bool = False
    #: The kernel's id of the running boot (``None`` in a tree): it changes at every reboot.
    boot_id: str | None = None
    #: The newest journal entry's id and bytes, which the next entry is chained to.
    last_entry: tuple[str, bytes] | None = None
    #: Which machine the host is (see :func:`~proxgpu.apply.journal.machine_of`).
    machine: str | None = None


def _file_state(fields: Sequence[str]) -> FileState:
    if fields[0] == "file":
        digest, mode, uid, gid = fields[1:5]
        return FileState("file", digest, mode, int(uid), int(gid))
    if fields[0] == "absent":
        return FileState("absent", missing_dirs=int(fields[1]))
    if fields[0] == "escapes":
        return FileState("escapes")
    return FileState("other")


def probe(
    host: Host,
    layout: Layout,
    paths: Sequence[str],
    *,
    lock_id: str | None,
    op: str = "apply",
    takeover: str | None = None,
) -> Probe:
    """Read every file's state in one command, taking the host-wide lock when ``lock_id``
    (``takeover``: the owner id of a lock to break first, ``""`` for one without an owner).

    :raises NotRootError: when a live host is not written to as root.
    """
    output = run_script(
        host,
        "probe",
        "lock" if lock_id else "read",
        layout.lock,
        lock.owner_text(lock_id or "", op),
        "-" if takeover is None else takeover,
        "1" if host.is_live else "0",
        layout.journal_dir,
        host.root,
        *paths,
    )
    if output.has("notroot"):
        raise NotRootError(host.name, "proxgpu must run as root to change this host")
    for record in output.of("outside"):
        if lock_id and output.has("lock"):
            release_quietly(host, layout, lock_id)  # taken in the same command
        raise PreflightError(
            host.name,
            f"{record[0]}: resolves to {record[1]}, outside {host.root}, through a symlink; "
            "proxgpu keeps its journal and backups only inside the host's root: fix the link",
        )
    for record in output.of("file"):
        if record[1] == "escapes":
            path = paths[int(record[0])]
            if lock_id and output.has("lock"):
                release_quietly(host, layout, lock_id)  # taken in the same command
            raise PreflightError(
                host.name,
                f"{path}: its directory resolves to {record[2]}, outside {host.root}, through a "
                "symlink; proxgpu writes only inside the host's root: fix the link",
            )
    held = [r for r in output.records if r.kind in ("locked", "held")]
    owner = lock.parse_owner(held[0][0]) if held else None
    node = output.first("node")
    return Probe(
        locked=output.has("lock"),
        owner=owner,
        in_progress=[r[0] for r in output.of("inprogress")],
        files=[_file_state(r.fields[1:]) for r in output.of("file")],
        # Proxmox's node name is the hostname up to the first dot.
        node=node[0].split(".")[0] if node and node.fields else "",
        pvesh=output.has("pvesh"),
        boot_id=_boot_id(output.first("boot")),
        last_entry=_last_entry(output.first("last")),
        machine=machine_of(output.first("machine")),
    )


def _last_entry(record: ScriptRecord | None) -> tuple[str, bytes] | None:
    return (record[0], base64.b64decode(record[1])) if record is not None else None


def _boot_id(record: ScriptRecord | None) -> str | None:
    return record[0] if record is not None and record.fields and record[0] != "-" else None


def lock_and_probe(
    host: Host,
    layout: Layout,
    paths: Sequence[str],
    lock_id: str,
    *,
    op: str,
    break_lock: bool,
) -> tuple[Probe, dict[str, str] | None]:
    """Take the host-wide lock and read every file's state; return the probe and the owner of
    the lock that was broken to get it (``None``: it was free).

    A lock whose owner is gone (a process of this machine that no longer runs) is taken over;
    any other only with ``break_lock``.

    :raises ConcurrentApplyError: naming the owner, when the lock is held.
    """
    found = probe(host, layout, paths, lock_id=lock_id, op=op)
    if found.locked:
        return found, None
    owner = found.owner or {}
    if not (break_lock or lock.is_stale(owner)):
        raise lock.held_error(host.name, layout.lock, owner)
    found = probe(host, layout, paths, lock_id=lock_id, op=op, takeover=owner.get("id", ""))
    if not found.locked:
        raise lock.held_error(host.name, layout.lock, found.owner or {})
    return found, owner


def finish(
    host: Host, layout: Layout, lock_id: str, entry: JournalEntry | None, release: bool
) -> str | None:
    """Write ``entry`` (if any) durably to the journal, prune the journal's oldest finished
    entries past :data:`~proxgpu.apply.journal.KEEP_ENTRIES` (see ``scripts/finish.sh``) and,
    with ``release``, release our own lock; return why the release failed, if it did (the
    entry is recorded all the same).

    :raises CommandError: when the entry could not be written.
    """
    data = entry_json(entry) if entry else b""
    journal = layout.journal(entry.id) if entry else "-"
    release_flag = "1" if release else "0"
    output = run_script(
        host,
        "finish",
        journal,
        layout.lock,
        lock_id,
        release_flag,
        str(len(data)),
        str(KEEP_ENTRIES),
        layout.on_host(BACKUP_DIR),
        payload=data,
    )
    failed = output.first("notreleased")
    return None if failed is None else f"{layout.lock}: {failed[0] or 'could not be released'}"


def release_quietly(host: Host, layout: Layout, lock_id: str) -> None:
    """Release our lock on the way out of a failure, saying nothing if that fails too."""
    # The host may be gone: the lock then stays until a rollback or a reboot clears it, and the
    # original error is the one to report.
    try:
        finish(host, layout, lock_id, None, release=True)
    except ProxgpuError:
        return


def with_hashes(entry: JournalEntry, hashes: Mapping[str, str]) -> JournalEntry:
    """``entry`` with the ``sha256_after`` of the files in ``hashes`` replaced."""
    files = [
        f.model_copy(update={"sha256_after": hashes[f.path]}) if f.path in hashes else f
        for f in entry.files
    ]
    return entry.model_copy(update={"files": files})


def recognise(host: Host, entry: JournalEntry, paths: Iterable[str]) -> JournalEntry:
    """Read the files written through the API in ``paths`` (VM configs, the PCI mapping; one
    command) and take as ``entry``'s result each one that says what the change set's ``after``
    says, in whatever order Proxmox wrote it."""
    wanted = sorted(set(paths))
    planned = {f.path: f.after for f in entry.changeset.files}
    hashes = {}
    found = read_files(host, wanted)
    for path, data in zip(wanted, found, strict=True):
        after = planned.get(path)
        if data is None or after is None:
            continue
        try:
            text = data.decode()
        except UnicodeDecodeError:
            continue
        same = same_mapping if path == PCI_MAPPING else same_config
        if same(text, after):
            hashes[path] = hashlib.sha256(data).hexdigest()
    return with_hashes(entry, hashes)


@dataclass(frozen=True)
class StageItem(ScriptArgs):
    """One file for ``scripts/stage.sh``, its fields in the script's order."""

    path: str
    backup: str | None
    sha256: str | None
    tmp: str | None
    mode: str
    umask: str
    owner: str | None
    size: int


@dataclass(frozen=True)
class CommitItem(ScriptArgs):
    """One file for ``scripts/commit.sh``: ``tmp`` ``=`` for a file the API wrote, ``None`` to
    remove it; ``want_sha`` what it must still be (``None``: absent)."""

    path: str
    tmp: str | None
    want_sha: str | None
    guest_lock: str | None


def created_dirs(created: Iterable[tuple[str, FileState]]) -> list[str]:
    """The directories an apply makes for the files it creates: every missing ancestor, deepest
    first (the order rollback removes them in).

    >>> state = FileState("absent", missing_dirs=2)
    >>> created_dirs([("/usr/local/sbin/x", state), ("/usr/local/sbin/y", state)])
    ['/usr/local/sbin', '/usr/local']
    """
    dirs: set[str] = set()
    for path, state in created:
        directory = path
        for _ in range(state.missing_dirs):
            directory = directory.rpartition("/")[0]
            if not directory:
                break  # the host's root directory itself was missing
            dirs.add(directory)
    return deepest_first(dirs)


@dataclass(frozen=True)
class Staged:
    """One file of an apply, staged: its journal record, its stage-script item, its new bytes."""

    record: JournalFile
    item: StageItem
    content: bytes


def stage_file(
    backup: str, change: FileChange, state: FileState, at: Where, *, via_api: bool
) -> Staged:
    """What stage.sh needs for one file, and what the journal keeps of it (``backup`` names its
    copy in the entry's backup directory; a file written through the API is backed up but not
    staged: Proxmox writes it)."""
    existed = state.kind == "file"
    record = JournalFile(
        path=change.path,
        existed=existed,
        mode=state.mode,
        uid=state.uid,
        gid=state.gid,
        sha256_before=state.sha256,
        # For the API, what the plan says until the file Proxmox wrote is read back.
        sha256_after=sha(change.after),
        backup=backup if existed else None,
        via="api" if via_api else "file",
    )
    staged = change.after is not None and not via_api
    mode, umask = mode_and_umask(change.mode, state.mode, at)
    content = change.after.encode() if change.after is not None and staged else b""
    item = StageItem(
        path=at.path,
        backup=backup if existed else None,
        sha256=state.sha256,
        tmp=at.tmp if staged else None,
        mode=mode,
        umask=umask,
        owner=f"{state.uid}:{state.gid}" if existed and not at.in_pve else None,
        size=len(content),
    )
    return Staged(record, item, content)
