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
from proxgpu.apply.journal import JournalEntry
from proxgpu.apply.layout import Layout, mode_and_umask, where
from proxgpu.errors import NotRootError, ProxgpuError
from proxgpu.host.base import Host
from proxgpu.host.scripts import ScriptArgs, run_script
from proxgpu.pve.api import same_config

#: Called with a step (``lock``, ``backup``, ``write``, ``action``, ...) and a line for people.
Progress = Callable[[str, str], None]


def quiet(step: str, message: str) -> None:
    """The default progress callback: say nothing."""


def now() -> str:
    """The time now, as the journal records it."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def sha(text: str | None) -> str | None:
    """The SHA-256 of ``text`` as the host would hash the file holding it."""
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def b64_line(data: bytes) -> bytes:
    """``data`` as one base64 line, the way the scripts read contents from stdin."""
    return base64.b64encode(data) + b"\n"


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

    kind: Literal["file", "absent", "other"]
    sha256: str | None = None
    mode: str | None = None
    uid: int | None = None
    gid: int | None = None
    #: How many of an absent file's ancestors are missing too (0: its directory is there).
    missing_dirs: int = 0

    @property
    def parent_exists(self) -> bool:
        """Whether the file's directory exists."""
        return self.missing_dirs == 0


@dataclass(frozen=True)
class Probe:
    """What one probe found: the lock, unfinished entries, each file's state, the node."""

    locked: bool
    owner: dict[str, str] | None
    in_progress: list[str]
    files: list[FileState]
    node: str = ""
    pvesh: bool = False


def _file_state(fields: Sequence[str]) -> FileState:
    if fields[0] == "file":
        digest, mode, uid, gid = fields[1:5]
        return FileState("file", digest, mode, int(uid), int(gid))
    if fields[0] == "absent":
        return FileState("absent", missing_dirs=int(fields[1]))
    return FileState("other")


def probe(
    host: Host,
    layout: Layout,
    paths: Sequence[str],
    *,
    lock_id: str | None,
    op: str = "apply",
    takeover: str = "",
) -> Probe:
    """Read every file's state in one command, taking the host-wide lock when ``lock_id``
    (``takeover``: the id of a lock to take over from its owner).

    :raises NotRootError: when a live host is not written to as root.
    """
    output = run_script(
        host,
        "probe",
        "lock" if lock_id else "read",
        layout.lock,
        lock.owner_text(lock_id or "", op),
        takeover,
        "1" if host.is_live else "0",
        layout.journal_dir,
        *paths,
    )
    if output.has("notroot"):
        raise NotRootError(host.name, "proxgpu must run as root to change this host")
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
    )


def read_files(host: Host, paths: Sequence[str]) -> list[bytes | None]:
    """The bytes of each file (``None``: absent or not a regular file), in one command."""
    found: list[bytes | None] = [None] * len(paths)
    for record in run_script(host, "read", *paths).of("text"):
        if record[1] != "-":
            found[int(record[0])] = base64.b64decode(record[1])
    return found


def finish(
    host: Host, layout: Layout, lock_id: str, entry: JournalEntry | None, release: bool
) -> None:
    """Write ``entry`` (if any) to the journal and, with ``release``, release our own lock."""
    payload = b64_line(entry.model_dump_json(indent=2).encode()) if entry else b""
    journal = layout.journal(entry.id) if entry else "-"
    release_flag = "1" if release else "0"
    run_script(host, "finish", journal, layout.lock, lock_id, release_flag, payload=payload)


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


def recognise(
    host: Host, layout: Layout, entry: JournalEntry, paths: Iterable[str]
) -> JournalEntry:
    """Read the VM configs in ``paths`` (one command) and take as ``entry``'s result each one that
    says what the change set's ``after`` says, in whatever order Proxmox wrote it."""
    wanted = sorted(set(paths))
    planned = {f.path: f.after for f in entry.changeset.files}
    hashes = {}
    found = read_files(host, [layout.on_host(p) for p in wanted])
    for path, data in zip(wanted, found, strict=True):
        after = planned.get(path)
        if data is None or after is None:
            continue
        try:
            text = data.decode()
        except UnicodeDecodeError:
            continue
        if same_config(text, after):
            hashes[path] = hashlib.sha256(data).hexdigest()
    return with_hashes(entry, hashes)


@dataclass(frozen=True)
class RestoreItem(ScriptArgs):
    """One file for ``scripts/restore.sh``, its fields in the script's order."""

    path: str
    tmp: str
    backup: str | None
    backup_sha: str | None
    mode: str
    umask: str
    owner: str | None
    only_if: str
    guest_lock: str


_RESTORE_OUTCOMES = {
    10: "already as before",
    11: "changed by someone else since the apply; left alone",
    12: "its backup is damaged; left alone",
    13: "could not be written back",
    75: "Proxmox held the guest's config lock for 10 s; left alone",
}


def _restore_item(
    host: Host, layout: Layout, entry: JournalEntry, index: int, only_if: str
) -> RestoreItem:
    f = entry.files[index]
    at = where(layout, f.path, entry.id, host.is_live)
    mode, umask = mode_and_umask(None, f.mode, at)
    return RestoreItem(
        path=at.path,
        tmp=at.tmp,
        backup=f"{layout.backups(entry.id)}/{f.backup}" if f.backup else None,
        backup_sha=f.sha256_before,
        mode=mode,
        umask=umask,
        owner=f"{f.uid}:{f.gid}" if f.existed and not at.in_pve else None,
        only_if=only_if,
        guest_lock=at.guest_lock,
    )


def restore(
    host: Host,
    layout: Layout,
    entry: JournalEntry,
    *,
    force: bool,
    keep: frozenset[str] = frozenset(),
) -> tuple[list[str], list[str]]:
    """Put back ``entry``'s files in one command; return (paths restored, problems).

    A file is put back only if it is still what the apply left (any state with ``force``); files
    in ``keep`` were never written: only their temp files are removed.
    """
    items = []
    for index, f in enumerate(entry.files):
        only_if = "any" if force else (f.sha256_after or "-")
        only_if = "keep" if f.path in keep else only_if
        items.append(_restore_item(host, layout, entry, index, only_if))
    dirs = [layout.on_host(d) for d in deepest_first(entry.created_dirs)]
    args = [arg for item in items for arg in item.argv()]
    output = run_script(host, "restore", str(len(items)), *args, *dirs)
    restored, problems = [], []
    for record in output.of("rc"):
        path, code = entry.files[int(record[0])].path, int(record[1])
        if code == 0:
            restored.append(path)
        elif code != 10:
            problems.append(f"{path}: {_RESTORE_OUTCOMES.get(code, f'failed ({code})')}")
    if not output.complete:
        problems.append("the restore step stopped before the end")
    return restored, problems


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
    parent_exists: int


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
