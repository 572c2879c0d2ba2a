"""Apply a change set as one transaction.

:func:`apply_changes` runs preflight (root, the host-wide lock, compare-and-swap on every file's
hash, ``lock:`` keys, running guests, busy GPUs), then backs up every file it touches and writes a
journal entry, then replaces each file atomically (a temp file in the same directory, renamed over
it), then runs the post-actions and, when asked, the live rebind (the GPUs are checked for users
once more right before it). On any failure it puts every file back from the backup.

On a live host with pvesh, a VM config and the PCI mapping are changed through the Proxmox API
instead (:mod:`~proxgpu.apply.vmapi`; the mapping is put back through it too,
:mod:`~proxgpu.apply.mapapi`); container configs (the API cannot set raw ``lxc.*`` keys) and host
files are written as files. Backups, the compare-and-swap checks, restore on failure and
rollback treat both kinds alike.

The commands it sends do not grow with the number of files: one locks and reads every file's
state (``scripts/probe.sh``), one stages backups and temp files (``stage.sh``), one renames them
all (``commit.sh``), one records the outcome and unlocks (``finish.sh``), plus one per
post-action; on a Proxmox host also one API call per guest status and per VM config written.
Checks are in :mod:`~proxgpu.apply.preflight`, the host side in :mod:`~proxgpu.apply.remote`.
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Sequence
from typing import NoReturn

from proxgpu.apply import lock, signing
from proxgpu.apply.actions import run_actions
from proxgpu.apply.busy import check_not_busy
from proxgpu.apply.journal import JournalEntry, Status, entry_json, new_journal_id
from proxgpu.apply.layout import Layout, where
from proxgpu.apply.options import ApplyOptions
from proxgpu.apply.preflight import (
    cas_failed,
    check_guests,
    check_mig_instances,
    files_to_write,
    refuse_locked_guests,
    refuse_unfinished,
)
from proxgpu.apply.rebind import Binding, bind_to_vfio, vfio_functions
from proxgpu.apply.remote import (
    CommitItem,
    Probe,
    Progress,
    created_dirs,
    describe,
    finish,
    lock_and_probe,
    now,
    probe,
    progress_of,
    release_quietly,
    sha,
    stage_file,
    with_hashes,
)
from proxgpu.apply.result import ApplyResult
from proxgpu.apply.trust import host_root, link_after
from proxgpu.apply.undo import rerun_actions, undo_writes
from proxgpu.apply.vmapi import VmApiWriter
from proxgpu.errors import (
    ApplyError,
    CommandError,
    FileChangedError,
    HostUnreachableError,
    PreflightError,
    ProxgpuError,
    PveApiError,
    StepNotFinishedError,
    UsageError,
)
from proxgpu.host.base import Host
from proxgpu.host.scripts import ScriptRecord, run_script
from proxgpu.inspection.inventory import Inventory
from proxgpu.planning.model import Plan
from proxgpu.rendering.changes import ChangeSet


def apply_changes(
    host: Host,
    changeset: ChangeSet,
    options: ApplyOptions | None = None,
    *,
    plan: Plan | None = None,
    progress: Progress | None = None,
    inventory: Inventory | None = None,
) -> ApplyResult:
    """Apply ``changeset`` to ``host`` as one transaction, as ``options`` say (default: for
    real, guests checked); see the module docstring for the steps.

    Files already as planned are left alone, so applying the same change set twice changes
    nothing the second time. A dry run runs the read-only checks and writes nothing. A live one
    moves the plan's vfio groups to vfio-pci now (``plan`` required). On a directory tree
    (``host.is_live`` false) post-actions and live steps are listed, not run. ``inventory``, when
    given, says whether the host has pvesh. A lock another apply or rollback left is taken over
    with ``break_lock`` (one of this machine's whose process is gone is taken over anyway).

    >>> from proxgpu.host import DirectoryHost
    >>> apply_changes(DirectoryHost("/"), ChangeSet(host="pve1")).messages
    ['nothing to do: the host already matches the plan']

    :raises PreflightError: (and its subclasses) when refusing before anything was written.
    :raises ApplyError: when a step failed after writing; the message says what was restored.
    """
    how = options or ApplyOptions()
    changes = changeset.changed_files()
    if how.live and plan is None:
        raise UsageError("a live apply needs the plan: it says which GPUs move to vfio-pci")
    refuse_locked_guests(host, changes)
    if not changes:
        return ApplyResult.unchanged(host.name, how.live)
    return _Apply(host, changeset, plan, progress_of(progress), how).run(inventory)


class _Apply:
    """One apply's state, so that a failure at any step knows what to undo."""

    def __init__(
        self,
        host: Host,
        changeset: ChangeSet,
        plan: Plan | None,
        say: Progress,
        how: ApplyOptions,
    ) -> None:
        self.host = host
        self.changeset = changeset
        self.changes = changeset.changed_files()
        self.plan = plan
        self.say = say
        self.how = how
        #: The lock's id, fixed before the journal is read; the entry's id (``id``) may then
        #: move past the journal's newest (see :meth:`_follow`).
        self.lock_id = new_journal_id()
        self.id = self.lock_id
        self.layout = Layout.of(host)
        self.where = [where(self.layout, c.path, self.id, host.is_live) for c in self.changes]
        self.locked = False
        self.entry: JournalEntry | None = None
        self.actions_run: list[list[str]] = []
        self.bindings: list[Binding] = []
        # Files certainly not renamed into place (or not sent to the API), which undo must not
        # restore.
        self.not_written: frozenset[str] = frozenset()
        self.vm_api = VmApiWriter(host, say)
        #: Lines for the result about the lock (broken to get it, or not released).
        self.notes: list[str] = []

    def run(self, inventory: Inventory | None) -> ApplyResult:
        dry_run, live = self.how.dry_run, self.how.live
        self.say("preflight", f"checking {len(self.changes)} files on {self.host.name}")
        with lock.held_here(self.lock_id):
            try:
                paths = [w.path for w in self.where]
                if dry_run:
                    found = probe(self.host, self.layout, paths, lock_id=None)
                    owner = found.owner
                    if owner is not None and not self.how.break_lock and not lock.is_stale(owner):
                        raise lock.held_error(self.host.name, self.layout.lock, owner)
                else:
                    # The journal entry is signed with the admin's key: a key that cannot be
                    # used is said now, before the lock is taken and anything is written.
                    signing.load_key()
                    found, broken = lock_and_probe(
                        self.host,
                        self.layout,
                        paths,
                        self.lock_id,
                        op="apply",
                        break_lock=self.how.break_lock,
                    )
                    self.locked = True
                    if broken is not None:
                        self.notes.append(lock.broken_note(self.layout.lock, broken))
                todo = self._preflight(found, inventory)
                if not todo:
                    return ApplyResult.unchanged(self.host.name, live, self.notes)
                if dry_run:
                    return self._dry_result(todo, found)
                return self._transaction(todo, found, live)
            finally:
                if self.locked:
                    release_quietly(self.host, self.layout, self.lock_id)

    def _preflight(self, probe: Probe, inventory: Inventory | None) -> list[int]:
        refuse_unfinished(self.host, probe.in_progress)
        todo = files_to_write(self.host, self.changes, probe.files)
        if self.plan is not None:
            check_mig_instances(self.host, self.plan)
        # inventory, when given, must agree that pvesh is there (a tree may lack it).
        has_pvesh = probe.pvesh and (inventory is None or "pvesh" in inventory.commands)
        if todo and self.host.is_live:
            changes = [self.changes[i] for i in todo]
            if not self.how.skip_guest_check:
                self.say("guests", "asking Proxmox whether the guests are stopped")
                check_guests(self.host, changes, has_pvesh, self.vm_api.api, probe.node)
            if has_pvesh and probe.node:
                self.vm_api.choose(probe.node, changes)
            if self.how.live and self.plan is not None:
                self.say("busy", "checking that no process holds the GPUs that move")
                check_not_busy(self.host, vfio_functions(self.plan))
        return todo

    def _dry_result(self, todo: list[int], probe: Probe) -> ApplyResult:
        paths = [self.changes[i].path for i in todo]
        messages = ["dry run: nothing was written", *self.vm_api.note(paths)]
        if probe.owner:
            messages.append(f"another {probe.owner.get('op', 'apply')} holds the lock right now")
        messages += self.vm_api.warnings()
        return ApplyResult(
            host=self.host.name,
            changed=True,
            dry_run=True,
            files=[self.changes[i].path for i in todo],
            actions=self.changeset.actions,
            reboot_required=self.changeset.reboot_required,
            messages=messages,
        )

    def _transaction(self, todo: list[int], probe: Probe, live: bool) -> ApplyResult:
        self._follow(probe)
        try:
            self._stage(todo, probe)
            self._commit(todo)
            messages = self._post_actions()
            messages += self._live(live)
        except BaseException as exc:
            self._fail(exc)
        self._record_applied()
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
                *self.vm_api.note([self.changes[i].path for i in todo]),
                *messages,
                *self.vm_api.warnings(),
                *self.notes,
            ],
        )

    def _follow(self, probe: Probe) -> None:
        """Give the entry an id after the journal's newest: the journal's order is its ids'
        order, and an id made by a clock behind the newest entry's would sort before it (a
        rollback would then take the newest for the latest apply)."""
        newest = probe.last_entry[0] if probe.last_entry else None
        if newest is None or newest < self.id:
            return
        self.id = new_journal_id(after=newest)
        self.where = [where(self.layout, c.path, self.id, self.host.is_live) for c in self.changes]
        self.notes.append(
            f"this machine's clock is behind {newest}, the newest entry of the journal of "
            f"{self.host.name}: entry {self.id} follows it (check both machines' clocks)"
        )

    def _stage(self, todo: list[int], probe: Probe) -> None:
        states = probe.files
        self.say("backup", f"backing up {len(todo)} files and staging the new ones")
        self.not_written = frozenset(self.changes[i].path for i in todo)
        staged = [
            stage_file(
                str(n),
                self.changes[index],
                states[index],
                self.where[index],
                via_api=self.vm_api.covers(self.changes[index].path),
            )
            for n, index in enumerate(todo)
        ]
        files = [s.record for s in staged]
        items = [s.item for s in staged]
        contents = [s.content for s in staged]
        created = created_dirs(
            (self.changes[i].path, states[i]) for i in todo if self.changes[i].after is not None
        )
        self.entry = JournalEntry(
            id=self.id,
            status="in-progress",
            host=self.host.name,
            root=host_root(self.host),
            previous=link_after(probe.last_entry),
            lock=self.lock_id if self.lock_id != self.id else None,
            client=f"{getpass.getuser()}@{socket.gethostname()}",
            started=now(),
            boot_id=probe.boot_id,
            machine=probe.machine,
            changeset=self.changeset,
            plan=self.plan,
            files=files,
            created_dirs=created,
        )
        journal = entry_json(self.entry)
        meta = json.dumps([f.model_dump() for f in files], indent=2).encode()
        output = run_script(
            self.host,
            "stage",
            self.layout.journal(self.id),
            self.layout.backups(self.id),
            str(len(journal)),
            str(len(meta)),
            *(arg for item in items for arg in item.argv()),
            payload=journal + meta + b"".join(contents),
        )
        self._refuse_changed(output.records, [self.changes[i].path for i in todo])

    def _refuse_changed(self, records: Sequence[ScriptRecord], paths: list[str]) -> None:
        for record in records:
            if record.kind == "changed":
                raise cas_failed(self.host, paths[int(record[0])], applying=True)

    def _commit(self, todo: list[int]) -> None:
        through_api = [i for i in todo if self.vm_api.covers(self.changes[i].path)]
        as_files = [i for i in todo if i not in through_api]
        self._api_writes(through_api)
        self.say("write", f"replacing {len(as_files)} files")
        # The configs written through the API come first: their hashes are read back before
        # anything can stop the script.
        items = [CommitItem(self.where[i].path, "=", None, None) for i in through_api]
        for index in as_files:
            change, at = self.changes[index], self.where[index]
            tmp = at.tmp if change.after is not None else None
            items.append(CommitItem(at.path, tmp, sha(change.before), at.guest_lock))
        paths = [self.changes[i].path for i in through_api + as_files]
        renamed = frozenset(self.changes[i].path for i in as_files)
        self.not_written -= renamed  # unknown until the host answers
        output = run_script(self.host, "commit", *(arg for item in items for arg in item.argv()))
        read_back = {paths[int(r[0])]: r[1] for r in output.of("api") if r[1] != "-"}
        self._confirm(read_back)
        self._refuse_unwritten(read_back)
        done = {paths[int(r[0])] for r in output.of("done")}
        self.not_written |= renamed - done
        self._refuse_changed(output.records, paths)
        for record in output.of("guestlocked"):
            raise PreflightError(
                self.host.name,
                f"{paths[int(record[0])]}: Proxmox held the guest's config lock for 10 s "
                "(another edit is running); retry when it is done",
            )
        for record in output.of("failed"):
            path = paths[int(record[0])]
            raise CommandError(self.host.name, [f"replacing {path}"], int(record[1]), record[2])

    def _refuse_unwritten(self, read_back: dict[str, str]) -> None:
        """A config the API call answered for, yet read back as it was before: pvesh (or a
        wrapper in its place) said done without writing, which is no write at all.

        :raises StepNotFinishedError: naming the call and the config.
        """
        for change in self.changes:
            if change.path not in read_back:
                continue  # written as a file, not through the API
            if read_back[change.path] == sha(change.before) != sha(change.after):
                raise StepNotFinishedError(
                    self.host.name,
                    f"config write through the API ({change.path})",
                    "pvesh answered, but the config read back afterwards is as it was before",
                )

    def _api_writes(self, indices: list[int]) -> None:
        """``PUT /nodes/<node>/qemu/<vmid>/config`` for each VM config, one pvesh call each."""
        for index in indices:
            path = self.changes[index].path
            try:
                self.vm_api.write(path)
            except (PveApiError, FileChangedError):
                raise  # refused before writing: the file may now be someone else's edit
            except BaseException:
                self.not_written -= {path}  # the call may or may not have landed
                raise
            self.not_written -= {path}

    def _confirm(self, hashes: dict[str, str]) -> None:
        """Journal the hashes of the files Proxmox wrote, as read back from the host."""
        assert self.entry is not None
        self.vm_api.confirm(hashes)
        self.entry = with_hashes(self.entry, hashes)

    def _post_actions(self) -> list[str]:
        actions = self.changeset.actions
        return run_actions(
            self.host,
            actions,
            self.actions_run,
            self.say,
            self.how.action_timeout,
            follow=self.how.action_output,
        )

    def _live(self, live: bool) -> list[str]:
        if not live:
            return []
        assert self.plan is not None  # apply_changes refuses live without a plan
        functions = vfio_functions(self.plan)
        if not functions:
            return ["live: the plan moves no function to vfio-pci"]
        if not self.host.is_live:
            return [
                f"listed, not run (a directory tree): rebind {', '.join(functions)} to vfio-pci"
            ]
        # Preflight checked too, but the post-actions ran since (minutes, for an initramfs): a
        # process that opened a GPU meanwhile would block the unbind in the kernel forever.
        self.say("busy", "checking again that no process holds the GPUs that move")
        check_not_busy(self.host, functions)
        self.say("live", f"binding {len(functions)} functions to vfio-pci")
        self.bindings = bind_to_vfio(self.host, functions)
        return [f"bound to vfio-pci now: {', '.join(b.address for b in self.bindings)}"]

    def _fail(self, exc: BaseException) -> NoReturn:
        """Undo what was written (if anything was), then raise what says so."""
        if self.entry is None:
            raise exc
        error = self._undo(exc)
        if error is exc:
            raise exc
        raise error from exc

    def _record_applied(self) -> None:
        """Record the apply as done; a connection lost while doing so leaves nothing to undo,
        but a journal that cannot be written (a full disk) undoes the apply."""
        try:
            self._record("applied", "")
        except HostUnreachableError as exc:
            # Every file is written and every step ran; only the journal's last word is in
            # doubt, and a host that cannot be reached cannot be restored either.
            raise HostUnreachableError(
                self.host.name,
                f"{exc.detail}, after apply {self.id} had written every file and run every "
                "step: the apply is done; `proxgpu history` shows whether the journal recorded "
                "it, `proxgpu verify` checks the host, `proxgpu rollback` undoes it",
            ) from exc
        except BaseException as exc:
            self._fail(exc)

    def _record(self, status: Status, message: str) -> None:
        assert self.entry is not None
        self.entry = self.entry.model_copy(
            update={
                "status": status,
                "finished": now(),
                "live": self.bindings,
                "actions_run": self.actions_run,
                "message": message,
            }
        )
        # The entry is recorded before the lock is released, and a release that fails never
        # undoes what the entry records: the next apply or rollback breaks the lock.
        problem = finish(self.host, self.layout, self.lock_id, self.entry, release=True)
        self.locked = False
        if problem is not None:
            self.notes.append(lock.unreleased_note(problem))

    def _undo(self, exc: BaseException) -> ProxgpuError:
        assert self.entry is not None
        what = describe(exc)
        self.say("restore", f"{what}; restoring every file from the backup")
        self.entry, problems = undo_writes(
            self.host,
            self.layout,
            self.entry,
            bindings=self.bindings,
            vm_api=self.vm_api,
            not_written=self.not_written,
        )
        if problems:
            status: Status = "in-progress"
            outcome = (
                f"restoring did not finish ({'; '.join(problems)}); the apply is left in "
                "progress: run `proxgpu rollback` once the host is reachable"
            )
        else:
            status = "failed"
            outcome = "every file was restored from the backup" + rerun_actions(
                self.host, self.actions_run, self.how.action_timeout
            )
        try:
            self._record(status, f"{what}; {outcome}")
        except ProxgpuError as record_exc:
            outcome += f" (the journal could not be updated: {describe(record_exc)})"
        if isinstance(exc, PreflightError) and not problems and not self.actions_run:
            # Refused at the last moment, before any post-action ran: nothing of the apply is
            # left on the host.
            return exc
        return ApplyError(
            self.host.name, f"apply {self.id} failed: {what}; {outcome}", self.id, not problems
        )
