"""Rollback: put the files of a journal entry back, and recover an apply a dropped connection left
in progress.

The files come back byte for byte from the entry's backups under Proxmox's per-guest config
lock, the files the apply created are removed, and the follow-up actions run again.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from proxgpu.apply import lock
from proxgpu.apply.actions import ACTION_TIMEOUT
from proxgpu.apply.actions import run_actions as run_actions_on
from proxgpu.apply.busy import check_not_busy
from proxgpu.apply.journal import JournalEntry, history, new_journal_id, select_entry
from proxgpu.apply.layout import Layout
from proxgpu.apply.rebind import Binding, restore_drivers
from proxgpu.apply.remote import (
    FileState,
    Probe,
    Progress,
    finish,
    now,
    probe,
    quiet,
    recognise,
    release_quietly,
    restore,
)
from proxgpu.errors import FileChangedError, RollbackError
from proxgpu.host.base import Host
from proxgpu.model import FrozenModel


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
    entries = history(host)
    entry = select_entry(host, entries, to, latest=("applied", "in-progress"))
    if entry is not None:
        _refuse_finished(host, entry)
    options = _Options(run_actions, force, live, break_lock, action_timeout)
    run = _Rollback(host, entry, progress or quiet, options)
    with lock.holding(run.lock_id):
        return run.locked_run(explicit=to is not None, known={e.id for e in entries})


@dataclass(frozen=True)
class _Options:
    run_actions: bool
    force: bool
    live: bool
    break_lock: bool
    action_timeout: float


def _refuse_finished(host: Host, entry: JournalEntry) -> None:
    if entry.status == "rolled-back":
        raise RollbackError(host.name, f"journal entry {entry.id} was already rolled back")
    if entry.status == "failed":
        raise RollbackError(
            host.name,
            f"journal entry {entry.id} failed and was restored then; nothing to roll back",
        )


def _lock_for_rollback(
    host: Host, layout: Layout, paths: list[str], lock_id: str, break_lock: bool
) -> tuple[Probe, dict[str, str] | None]:
    found = probe(host, layout, paths, lock_id=lock_id, op="rollback")
    if found.locked:
        return found, None
    owner = found.owner or {}
    if not (break_lock or lock.is_stale(owner)):
        raise lock.held_error(host.name, layout.lock, owner)
    found = probe(host, layout, paths, lock_id=lock_id, op="rollback", takeover=owner.get("id", ""))
    if not found.locked:
        raise lock.held_error(host.name, layout.lock, found.owner or {})
    return found, owner


def _recognise_api_writes(
    host: Host, layout: Layout, entry: JournalEntry, states: list[FileState]
) -> JournalEntry:
    """Recognise the VM configs an unfinished apply wrote through the API but never read back."""
    paths = [
        f.path
        for f, state in zip(entry.files, states, strict=True)
        if f.via == "api"
        and state.kind == "file"
        and state.sha256 not in (f.sha256_after, f.sha256_before)
    ]
    return recognise(host, layout, entry, paths) if paths else entry


def _check_rollback_files(host: Host, entry: JournalEntry, states: list[FileState]) -> None:
    for f, state in zip(entry.files, states, strict=True):
        if state.kind == "other" or state.sha256 not in (f.sha256_after, f.sha256_before):
            raise FileChangedError(
                host.name,
                f.path,
                f"changed since apply {entry.id} wrote it; look at it, then roll back with force "
                "to overwrite it with the backup",
            )


class _Rollback:
    """One rollback: the entry it undoes (``None``: only a lock to recover) and its choices."""

    def __init__(
        self, host: Host, entry: JournalEntry | None, say: Progress, options: _Options
    ) -> None:
        self.host = host
        self.layout = Layout.of(host)
        self.entry = entry
        self.say = say
        self.options = options
        self.timeout = options.action_timeout
        self.lock_id = new_journal_id()

    def locked_run(self, *, explicit: bool, known: set[str]) -> RollbackResult:
        """Take the lock (recovering a stale one), check the files, restore, release."""
        host, layout, entry = self.host, self.layout, self.entry
        paths = [layout.on_host(f.path) for f in entry.files] if entry else []
        locked = False
        try:
            self.say("lock", f"taking the lock on {host.name}")
            found, stale = _lock_for_rollback(
                host, layout, paths, self.lock_id, self.options.break_lock
            )
            locked = True
            if stale is not None and not explicit and stale.get("id") not in known:
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
            if not self.options.force:
                entry = _recognise_api_writes(host, layout, entry, found.files)
                _check_rollback_files(host, entry, found.files)
            self.entry = entry
            result, done = self.run(self.options.run_actions, self.options.live, self.options.force)
            finish(host, layout, self.lock_id, done, release=True)
            locked = False
            return result
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
        restored, problems = restore(self.host, self.layout, self.entry, force=force)
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
                *messages,
            ],
        )
        return result, entry

    def _actions(self, run_actions: bool, messages: list[str]) -> list[list[str]]:
        assert self.entry is not None
        post = self.entry.changeset.actions
        if not run_actions:
            messages += [f"listed, not run: {' '.join(a.argv)}" for a in post]
            return []
        ran: list[list[str]] = []
        messages += run_actions_on(self.host, post, ran, self.say, self.timeout)
        return ran
