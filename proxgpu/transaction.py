"""Apply a change set as one transaction.

:func:`apply_changes` runs preflight (root, the host-wide lock, compare-and-swap on every file's
hash, ``lock:`` keys, running guests, busy GPUs), then backs up every file it touches and writes a
journal entry, then replaces each file atomically (a temp file in the same directory, renamed over
it), then runs the post-actions and, when asked, the live rebind (the GPUs are checked for users
once more right before it). On any failure it puts every file back from the backup.

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

The journal, the lock and the backups, and rollback, history and verify, live in
:mod:`proxgpu.journal`; the names callers use (:class:`JournalEntry`, :func:`history`,
:func:`rollback`, :func:`verify`, :data:`Progress`) can be imported from here too.
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Callable, Iterable, Sequence

from pydantic import Field

from proxgpu import live as live_rebind
from proxgpu.changes import Action, ChangeSet, FileChange
from proxgpu.claims import GUEST_CONFIG
from proxgpu.errors import (
    ApplyError,
    CommandError,
    FileChangedError,
    PreflightError,
    ProxgpuError,
    UsageError,
)
from proxgpu.hosts import Host
from proxgpu.inventory import FrozenModel, Inventory
from proxgpu.journal import (
    _ACTIVE,
    _SHELL_PRELUDE,
    ACTION_TIMEOUT,
    JournalEntry,
    JournalFile,
    Progress,
    Status,
    _b64_line,
    _deepest_first,
    _describe,
    _FileState,
    _finish,
    _Layout,
    _lock_held_error,
    _mode_and_umask,
    _now,
    _Probe,
    _probe,
    _quiet,
    _read_files,
    _recognise,
    _release_quietly,
    _restore,
    _script,
    _sha,
    _where,
    _with_hashes,
    history,
    new_journal_id,
    rollback,
    verify,
)
from proxgpu.live import Binding
from proxgpu.planning import Plan
from proxgpu.pveapi import (
    PveApiError,
    PveResource,
    config_digest,
    config_update,
    guest_status,
    proxmox_api,
    pvesh_warnings,
    same_config,
)
from proxgpu.pveconfig import GuestConfig

# Usage: sh -c STAGE sh JOURNAL BACKUPS [PATH BACKUP SHA TMP MODE UMASK OWNER PARENT_EXISTS]...
# stdin: base64 lines: the journal entry, meta.json, then the new text of each file with a TMP.
# The backup is hashed after copying, so the bytes kept are the bytes compared. A temp file is
# written by put_tmp (MODE, UMASK and OWNER as it takes them). Records: #changed I | #end
_STAGE = (
    _SHELL_PRELUDE
    + r"""
umask 077  # the journal and backups hold guest configs: root only
journal=$1 backups=$2
shift 2
IFS= read -r entry || exit 1
IFS= read -r meta || exit 1
mkdir -p "${journal%/*}" && printf '%s' "$entry" | base64 -d > "$journal.tmp" || exit 1
mv -f "$journal.tmp" "$journal" || exit 1
mkdir -p "${backups%/*}" && mkdir "$backups" || exit 1
printf '%s' "$meta" | base64 -d > "$backups/meta.json" || exit 1
decode() { printf '%s' "$1" | base64 -d; }
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
        put_tmp "$tmp" "$mode" "$mask" "$owner" decode "$data" || exit 1
    fi
    i=$((i + 1))
done
echo "#end"
"""
)

# Usage: sh -c COMMIT sh [PATH TMP WANT_SHA GUEST_LOCK]...   (TMP "-": remove; TMP "=": written
# through the API, only report its hash; WANT_SHA "-": must be absent; GUEST_LOCK "-": none).
# Each file is checked once more and renamed under Proxmox's own config lock, so a concurrent
# `qm set` cannot slip in between. Records:
#   #api I SHA256|- | #done I | #changed I | #guestlocked I | #failed I RC | #end
_COMMIT = (
    _SHELL_PRELUDE
    + r"""
replace() {  # PATH TMP WANT_SHA: 3 unless PATH is still WANT_SHA, else TMP goes over it
    if [ "$3" = - ]; then
        if [ -e "$1" ] || [ -L "$1" ]; then return 3; fi
    else
        if [ -L "$1" ] || [ ! -f "$1" ]; then return 3; fi
        got=$(sha256sum < "$1") || return 1
        [ "${got%% *}" = "$3" ] || return 3
    fi
    if [ "$2" = - ]; then rm -f "$1"; else mv -f "$2" "$1"; fi
}
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
    under_lock "$lock" replace "$p" "$tmp" "$want"
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
)


class ApplyResult(FrozenModel):
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


# --- preflight -----------------------------------------------------------------------------------


def _refuse_locked_guests(host: Host, changes: Sequence[FileChange]) -> None:
    # The compare-and-swap check guarantees the file is still `before`, so reading it is enough.
    for change in changes:
        if GUEST_CONFIG.match(change.path) and change.before is not None:
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
            if c.before is not None and (m := GUEST_CONFIG.match(c.path))
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
    match = GUEST_CONFIG.match(path)
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


def _created_dirs(created: Iterable[tuple[str, _FileState]]) -> list[str]:
    """The directories an apply makes for the files it creates: every missing ancestor, deepest
    first (the order rollback removes them in).

    >>> state = _FileState("absent", missing_dirs=2)
    >>> _created_dirs([("/usr/local/sbin/x", state), ("/usr/local/sbin/y", state)])
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
    return _deepest_first(dirs)


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

    def _pvesh_warnings(self) -> list[str]:
        """What pvesh printed on stderr in calls that succeeded (a lock wait, a deprecation)."""
        if self._api is None:
            return []
        return [f"pvesh warned: {line}" for line in pvesh_warnings(self._api)]

    def _api_note(self, indices: Sequence[int]) -> list[str]:
        paths = [self.changes[i].path for i in indices if i in self.updates]
        if not paths:
            return []
        return [f"through the Proxmox API (PUT .../config): {', '.join(paths)}"]

    def _dry_result(self, todo: list[int], probe: _Probe) -> ApplyResult:
        messages = ["dry run: nothing was written", *self._api_note(todo)]
        if probe.owner:
            messages.append(f"another {probe.owner.get('op', 'apply')} holds the lock right now")
        messages += self._pvesh_warnings()
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
                *self._pvesh_warnings(),
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
        created = _created_dirs(
            (self.changes[i].path, states[i]) for i in todo if self.changes[i].after is not None
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
        if not self.host.is_live:
            return [
                f"listed, not run (a directory tree): {' '.join(a.argv)}"
                for a in self.changeset.actions
            ]
        for action in self.changeset.actions:
            self.say("action", " ".join(action.argv))
            self.host.check(action.argv, timeout=self.action_timeout)
            self.actions_run.append(action.argv)
        return []

    def _live(self, live: bool) -> list[str]:
        if not live:
            return []
        assert self.plan is not None  # apply_changes refuses live without a plan
        functions = live_rebind.vfio_functions(self.plan)
        if not functions:
            return ["live: the plan moves no function to vfio-pci"]
        if not self.host.is_live:
            return [
                f"listed, not run (a directory tree): rebind {', '.join(functions)} to vfio-pci"
            ]
        # Preflight checked too, but the post-actions ran since (minutes, for an initramfs): a
        # process that opened a GPU meanwhile would block the unbind in the kernel forever.
        self.say("busy", "checking again that no process holds the GPUs that move")
        live_rebind.check_not_busy(self.host, functions)
        self.say("live", f"binding {len(functions)} functions to vfio-pci")
        self.bindings = live_rebind.bind_to_vfio(self.host, functions)
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
        if isinstance(exc, PreflightError) and not problems and not self.actions_run:
            # Refused at the last moment, before any post-action ran: nothing of the apply is
            # left on the host.
            return exc
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


__all__ = [
    "ACTION_TIMEOUT",
    "ApplyResult",
    "JournalEntry",
    "Progress",
    "apply_changes",
    "history",
    "rollback",
    "verify",
]
