"""Rollback: put the files of a journal entry back, and recover an apply a dropped connection left
in progress.

The files come back byte for byte from the entry's backups under Proxmox's per-guest config
lock, the files the apply created are removed, and the follow-up actions run again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

from proxgpu.apply import lock, signing
from proxgpu.apply.actions import run_actions as run_actions_on
from proxgpu.apply.busy import check_not_busy
from proxgpu.apply.entries import entry_drift, partly_ours, undo_entries
from proxgpu.apply.journal import (
    JournalEntry,
    Status,
    new_journal_id,
    read_journal,
    select_entry,
)
from proxgpu.apply.layout import Layout
from proxgpu.apply.mapapi import put_back, through_api
from proxgpu.apply.options import ApplyOptions
from proxgpu.apply.rebind import Binding, restore_drivers
from proxgpu.apply.remote import (
    FileState,
    Progress,
    finish,
    lock_and_probe,
    now,
    progress_of,
    recognise,
    release_quietly,
)
from proxgpu.apply.restore import Merged, restore
from proxgpu.apply.trust import check_trusted
from proxgpu.errors import FileChangedError, RollbackError
from proxgpu.host.base import Host
from proxgpu.host.scripts import as_text, read_files
from proxgpu.paths import PCI_MAPPING, guest_label, with_guest
from proxgpu.rendering.changes import ChangeSet, FileChange


@dataclass(frozen=True, kw_only=True)
class RollbackResult:
    """What a rollback restored (``files``), removed and ran.

    >>> RollbackResult(host="pve1", journal_id=None).files
    []
    """

    host: str
    journal_id: str | None
    files: list[str] = field(default_factory=list)
    actions_run: list[list[str]] = field(default_factory=list)
    live: list[Binding] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    #: A dry run's answer: each file as it is now (``before``) and as the rollback would leave
    #: it (``after``; ``None``: removed), and the actions it would run again. ``None`` otherwise.
    preview: ChangeSet | None = None


def rollback(
    host: Host,
    to: str | None = None,
    options: ApplyOptions | None = None,
    *,
    progress: Progress | None = None,
) -> RollbackResult:
    """Restore the files of journal entry ``to`` (default: the latest applied or unfinished one)
    byte for byte, remove the files it created, and re-run its post-actions (unless
    ``options.run_actions`` is off), as ``options`` say.

    Refuses when a file changed since the apply, unless ``force``. An entry left in progress by a
    dropped connection is recovered here, taking over the lock it left behind when that apply ran
    from this machine and is gone (``break_lock`` takes over any lock). ``live`` also returns
    the functions the apply rebound at runtime to their drivers. The entry must carry this
    machine's signature (:mod:`proxgpu.apply.signing`) and be in its place in the journal's chain
    (:mod:`proxgpu.apply.trust`) unless ``trust_unsigned``, and have been made for this
    root. A dry run takes no lock and writes nothing: the result's ``preview`` says what the
    rollback would do, decided as it decides it, refusals included.

    >>> from proxgpu.host import DirectoryHost
    >>> rollback(DirectoryHost("examples/hosts/ct200"), options=ApplyOptions(dry_run=True)).messages
    ['nothing to roll back: no applied or unfinished journal entry']

    :raises RollbackError: when there is nothing to roll back or a step failed.
    :raises JournalError: when the entry is not signed with this machine's key, out of its
        place in the chain, or made for another root.
    :raises FileChangedError: when a file changed since the apply and ``force`` is not given.
    :raises ConcurrentApplyError: when another apply or rollback holds the lock.
    """
    how = options or ApplyOptions()
    latest: tuple[Status, ...] = ("applied", "in-progress")
    journal = read_journal(host, to=to, latest=latest)
    entry = select_entry(host, journal, to, latest=latest)
    if entry is not None:
        _refuse_finished(host, entry)
        check_trusted(host, journal, entry, trust_unsigned=how.trust_unsigned)
    if how.dry_run:
        return _preview(host, entry, force=how.force)
    # The entry is signed again when its rollback is recorded: a key that cannot be used is
    # said now, before the lock is taken and a file is touched.
    signing.load_key()
    run = _Rollback(host, entry, progress_of(progress), how)
    known = {e.id for e in journal.entries} | {e.lock for e in journal.entries if e.lock}
    known |= {path.rsplit("/", 1)[1].removesuffix(".json") for path in journal.unreadable}
    with lock.held_here(run.lock_id):
        return run.locked_run(explicit=to is not None, known=known)


def _refuse_finished(host: Host, entry: JournalEntry) -> None:
    if entry.status == "rolled-back":
        raise RollbackError(host.name, f"journal entry {entry.id} was already rolled back")
    if entry.status == "failed":
        raise RollbackError(
            host.name,
            f"journal entry {entry.id} failed and was restored then; nothing to roll back",
        )


def _recognise_api_writes(host: Host, entry: JournalEntry, states: list[FileState]) -> JournalEntry:
    """Recognise the VM configs an unfinished apply wrote through the API but never read back."""
    paths = [
        f.path
        for f, state in zip(entry.files, states, strict=True)
        if f.via == "api"
        and state.kind == "file"
        and state.sha256 not in (f.sha256_after, f.sha256_before)
    ]
    return recognise(host, entry, paths) if paths else entry


def _merge_changed(host: Host, entry: JournalEntry, states: list[FileState]) -> dict[str, Merged]:
    """The files changed since the apply, with only the apply's entries undone in each.

    A file proxgpu shares (guest config, ``pci.cfg``, kernel command line) that changed since
    keeps every change made after the apply; only when one of the apply's own entries changed
    since is the rollback refused. A file proxgpu owns outright must be as the apply left it.

    :raises FileChangedError: naming the file and the entries that changed since the apply.
    """
    changes = {c.path: c for c in entry.changeset.files}
    shared = []
    for f, state in zip(entry.files, states, strict=True):
        if state.kind != "other" and state.sha256 in (f.sha256_after, f.sha256_before):
            continue
        change = changes.get(f.path)
        if state.kind != "file" or not partly_ours(f.path) or change is None or not change.after:
            raise _changed_since(host, entry, f.path, "")
        shared.append((f, state, change))
    texts = read_files(host, [f.path for f, _, _ in shared])
    merged = {}
    for (f, state, change), data in zip(shared, texts, strict=True):
        assert change.after is not None and state.sha256 is not None  # checked above
        now = _decoded(host, entry, f.path, data)
        drift = entry_drift(f.path, change.after, change.before or "", now, f"apply {entry.id}")
        if drift:
            raise _changed_since(host, entry, f.path, "; ".join(drift))
        undone = undo_entries(f.path, change.before or "", change.after, now)
        gone = change.before is None and not undone.strip()
        merged[f.path] = Merged(state.sha256, None if gone else undone.encode())
    return merged


def _decoded(host: Host, entry: JournalEntry, path: str, data: bytes | None) -> str:
    if data is None:
        raise _changed_since(host, entry, path, "it is gone")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise _changed_since(host, entry, path, f"it is no longer UTF-8 ({exc.reason})") from exc


def _changed_since(host: Host, entry: JournalEntry, path: str, what: str) -> FileChangedError:
    detail = f": {what}" if what else ""
    label = guest_label(path)
    subject = "changed" if label is None else f"{label}'s config changed"
    return FileChangedError(
        host.name,
        path,
        f"{subject} since apply {entry.id} wrote it{detail}; look at it, then roll back with "
        "--force (force=True in Python) to overwrite it with the backup",
    )


def _finished_elsewhere(entry: JournalEntry, broken: dict[str, str] | None) -> bool:
    """Whether ``--break-lock`` found a finished apply and no rollback of it to complete: breaking
    a lock recovers what its holder left unfinished, never a finished apply (its lock may simply
    have been released before this rollback took it)."""
    return entry.status == "applied" and (broken or {}).get("op") != "rollback"


def _kept_note(lock_path: str, entry: JournalEntry, broken: dict[str, str] | None) -> str:
    held = "" if broken is not None else f"{lock_path} was free, so there was no lock to break; "
    return (
        f"{held}apply {entry.id} had finished, so nothing was rolled back: roll it back with "
        "`proxgpu rollback` (without --break-lock)"
    )


def _wrote_nothing(owner: dict[str, str], known: set[str]) -> bool:
    """Whether the lock's owner was an apply cut off before it wrote its journal entry (and so
    before it wrote any file); a rollback's lock has an id of its own, never an entry's (nor an
    entry's ``lock``)."""
    return owner.get("op", "apply") == "apply" and owner.get("id") not in known


def _preview(host: Host, entry: JournalEntry | None, *, force: bool) -> RollbackResult:
    """What rolling back ``entry`` would do (see :func:`rollback`'s ``dry_run``): the files
    read as the rollback's probe reads them, merged or refused as it merges and refuses them.

    :raises FileChangedError: as the rollback itself would.
    """
    if entry is None:
        note = "nothing to roll back: no applied or unfinished journal entry"
        return RollbackResult(host=host.name, journal_id=None, messages=[note])
    now = read_files(host, [f.path for f in entry.files])
    states = [_state(data) for data in now]
    merged: dict[str, Merged] = {}
    if not force:
        entry = _recognise_api_writes(host, entry, states)
        merged = _merge_changed(host, entry, states)
    wrote = {c.path: c for c in entry.changeset.files}
    files = []
    for f, data in zip(entry.files, now, strict=True):
        whole = f.path not in merged
        after = wrote[f.path].before if whole else as_text(merged[f.path].content)
        files.append(
            FileChange(path=f.path, before=as_text(data), after=after, why=f"undo {entry.id}")
        )
    # Putting the files back takes effect as writing them did: at the reboot the apply needed.
    preview = ChangeSet(
        host=host.name,
        files=files,
        actions=entry.changeset.actions,
        reboot_required=entry.changeset.reboot_required,
    )
    changed = [f.path for f in preview.changed_files()]
    messages = [
        f"would restore {len(changed)} files from journal entry {entry.id}",
        *[f"would run again: {' '.join(a.argv)}" for a in entry.changeset.actions],
    ]
    return RollbackResult(
        host=host.name, journal_id=entry.id, files=changed, messages=messages, preview=preview
    )


def _state(data: bytes | None) -> FileState:
    if data is None:
        return FileState(kind="absent")
    return FileState(kind="file", sha256=hashlib.sha256(data).hexdigest())


class _Rollback:
    """One rollback: the entry it undoes (``None``: only a lock to recover) and its choices."""

    def __init__(
        self, host: Host, entry: JournalEntry | None, say: Progress, options: ApplyOptions
    ) -> None:
        self.host = host
        self.layout = Layout.of(host)
        self.entry = entry
        self.say = say
        self.options = options
        self.timeout = options.action_timeout
        self.lock_id = new_journal_id()
        #: Files changed since the apply, to be written with only its entries undone.
        self.merged: dict[str, Merged] = {}
        #: Whether the host has pvesh, for a PCI mapping an apply wrote through the API.
        self.pvesh = False

    def locked_run(self, *, explicit: bool, known: set[str]) -> RollbackResult:
        """Take the lock (recovering a stale one), check the files, restore, release."""
        host, layout, entry = self.host, self.layout, self.entry
        paths = [layout.on_host(f.path) for f in entry.files] if entry else []
        locked = False
        try:
            self.say("lock", f"taking the lock on {host.name}")
            found, stale = lock_and_probe(
                host, layout, paths, self.lock_id, op="rollback", break_lock=self.options.break_lock
            )
            locked = True
            self.pvesh = found.pvesh
            notes = [] if stale is None else [lock.broken_note(layout.lock, stale)]
            if stale is not None and _wrote_nothing(stale, known) and not explicit:
                # The apply that held it never wrote its journal entry, so it wrote no file.
                notes.append("it had written nothing, so there is nothing to roll back")
                return RollbackResult(host=host.name, journal_id=None, messages=notes)
            if entry is None:
                notes.append("nothing to roll back: no applied or unfinished journal entry")
                return RollbackResult(host=host.name, journal_id=None, messages=notes)
            if self.options.break_lock and not explicit and _finished_elsewhere(entry, stale):
                notes.append(_kept_note(layout.lock, entry, stale))
                return RollbackResult(host=host.name, journal_id=None, messages=notes)
            if not self.options.force:
                entry = _recognise_api_writes(host, entry, found.files)
                self.merged = _merge_changed(host, entry, found.files)
            self.entry = entry
            result, done = self.run(self.options.run_actions, self.options.live, self.options.force)
            problem = finish(host, layout, self.lock_id, done, release=True)
            locked = False
            if problem is not None:
                notes.append(lock.unreleased_note(problem))
            return replace(result, messages=[*result.messages, *notes])
        finally:
            if locked:
                release_quietly(host, layout, self.lock_id)

    def run(
        self, run_actions: bool, live: bool, force: bool
    ) -> tuple[RollbackResult, JournalEntry]:
        assert self.entry is not None  # locked_run returned early otherwise
        messages: list[str] = []
        bindings: list[Binding] = []
        if live and self.entry.live and self.host.is_live:
            self.say("live", "returning the rebound functions to their drivers")
            moved = [b for b in self.entry.live if b.moved]
            check_not_busy(self.host, [b.address for b in moved])
            bindings = restore_drivers(self.host, moved)
        self.say("restore", f"restoring {len(self.entry.files)} files of {self.entry.id}")
        keep, restored = self._mapping_back(force)
        merged = {path: m for path, m in self.merged.items() if path not in keep}
        done, problems = restore(
            self.host, self.layout, self.entry, force=force, keep=keep, merged=merged
        )
        restored += done
        if problems:
            raise RollbackError(
                self.host.name, f"rollback of {self.entry.id} incomplete: {'; '.join(problems)}"
            )
        actions_run = self._actions(run_actions, messages)
        entry = self.entry.model_copy(
            update={"status": "rolled-back", "finished": now(), "message": "rolled back"}
        )
        result = RollbackResult(
            host=self.host.name,
            journal_id=self.entry.id,
            files=restored,
            actions_run=actions_run,
            live=bindings,
            messages=[
                f"{len(restored)} files restored from journal entry {self.entry.id}",
                *[
                    f"{with_guest(path)}: only the apply's entries were undone; what changed "
                    "since is kept"
                    for path in self.merged
                ],
                *messages,
            ],
        )
        return result, entry

    def _mapping_back(self, force: bool) -> tuple[frozenset[str], list[str]]:
        """A PCI mapping the apply wrote through the Proxmox API goes back through it, before
        any other file (a refusal then leaves everything as it is); the files restore must leave
        alone, and those put back."""
        entry = self.entry
        assert entry is not None
        if not (self.host.is_live and self.pvesh and through_api(entry)):
            return frozenset(), []
        f = next(f for f in entry.files if f.path == PCI_MAPPING)
        change = next(c for c in entry.changeset.files if c.path == PCI_MAPPING)
        merged = self.merged.get(PCI_MAPPING)
        target = change.before or ""
        expect: list[str] | None = [f.sha256_after or "", f.sha256_before or ""]
        if force:
            expect = None
        elif merged is not None:
            target, expect = (merged.content or b"").decode(), [merged.sha256_now]
        self.say("api", "putting the PCI mapping back through the Proxmox API")
        wrote = put_back(self.host, entry, target, expect)
        return frozenset({PCI_MAPPING}), [PCI_MAPPING] if wrote else []

    def _actions(self, run_actions: bool, messages: list[str]) -> list[list[str]]:
        assert self.entry is not None
        post = self.entry.changeset.actions
        if not run_actions:
            messages += [f"listed, not run: {' '.join(a.argv)}" for a in post]
            return []
        ran: list[list[str]] = []
        follow = self.options.action_output
        messages += run_actions_on(self.host, post, ran, self.say, self.timeout, follow=follow)
        return ran
