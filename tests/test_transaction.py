"""Transactional apply, rollback, history and verify, against copies of an example host tree.

Three kinds of host write into a temporary copy of ``examples/hosts/ct200``: a directory tree
(files only, nothing run), this machine with that copy as its root (live: the post-actions run,
the guests' status is asked of pvesh), and a real OpenSSH server on 127.0.0.1 with the copy as
the remote root.

pvesh is not installable here. Where a live host must answer for the guests or take a VM's
options through the Proxmox API, a stand-in ``pvesh`` (see :func:`fake_pvesh`) goes first on PATH.
It answers only the two calls apply makes, the status query (the ``{"status": ...}`` object of the
Proxmox API) and ``set .../qemu/<vmid>/config``, which it carries out the way
qemu-server does it: ``delete`` and ``digest`` honoured, a stale digest refused with a ``400
Parameter verification failed`` on stderr and a non-zero exit, the file rewritten in Proxmox's own
order (description, then the main keys sorted, then the other sections) through a temp file and a
rename.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from proxgpu.apply.journal import JournalEntry, history, new_journal_id
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.apply.verify import verify
from proxgpu.errors import (
    ApplyError,
    ConcurrentApplyError,
    FileChangedError,
    HostUnreachableError,
    NotRootError,
    PreflightError,
    ProxgpuError,
    RollbackError,
    UsageError,
)
from proxgpu.host.base import Host
from proxgpu.host.local import DirectoryHost, LocalHost
from proxgpu.host.ssh import SSHHost, SSHOptions
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.planning import plan_split
from proxgpu.planning.model import Plan, SplitPolicy
from proxgpu.pve.api import config_digest, same_config
from proxgpu.rendering import render
from proxgpu.rendering.changes import Action, ChangeSet, FileChange
from tests.support.sshd import Sshd
from tests.support.standins import fake_pvesh, fake_tool, on_path, pvesh_calls

LXC = "/etc/pve/lxc/200.conf"
VM = "/etc/pve/qemu-server/300.conf"
MODULES = "/etc/modules"
BLACKLIST = "/etc/modprobe.d/pve-blacklist.conf"
DRIVERCTL = "/etc/driverctl.d/pci-0000:81:00.0"  # its directory does not exist yet
VFIO_CONF = "/etc/modprobe.d/proxgpu-vfio.conf"
# proxgpu's own state, and the lock files Proxmox's editors share with it.
OWN_STATE = ("var/lib/proxgpu", "run/lock", "var/lock")
OTHER_ID = "20261130T011500.000000Z-beef"


# --- helpers --------------------------------------------------------------------------------------


def snapshot(root: Path, ignore: tuple[str, ...] = ()) -> dict[str, tuple[str, object, int]]:
    """Every entry under ``root`` but proxgpu's own state and ``ignore``: type, content or
    target, mode."""
    entries: dict[str, tuple[str, object, int]] = {}
    skip = OWN_STATE + ignore
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(skip) or any(own.startswith(rel + "/") for own in skip):
            continue
        info = path.lstat()
        if path.is_symlink():
            entries[rel] = ("link", os.readlink(path), 0)
        elif path.is_dir():
            entries[rel] = ("dir", None, stat.S_IMODE(info.st_mode))
        elif stat.S_ISFIFO(info.st_mode):
            entries[rel] = ("fifo", None, stat.S_IMODE(info.st_mode))
        else:
            entries[rel] = ("file", path.read_bytes(), stat.S_IMODE(info.st_mode))
    return entries


def text(root: Path, path: str) -> str | None:
    """The file's text under ``root``, or None when absent."""
    target = root / path.lstrip("/")
    return target.read_text() if target.exists() else None


def changeset(root: Path, actions: Sequence[list[str]] = ()) -> ChangeSet:
    """Edits two guest configs and a host file, removes one file, creates two (one in a new
    directory), all from the tree's current content."""
    lxc, vm, modules = text(root, LXC), text(root, VM), text(root, MODULES)
    assert lxc is not None and vm is not None and modules is not None
    return ChangeSet(
        host="ct200",
        files=[
            FileChange(path=LXC, before=lxc, after=lxc + "lxc.cgroup2.cpuset.cpus: 0-31\n"),
            FileChange(path=VM, before=vm, after=vm + "hostpci0: 0000:81:00,pcie=1\n"),
            FileChange(path=MODULES, before=modules, after=modules + "vfio\nvfio_pci\n"),
            FileChange(path=BLACKLIST, before=text(root, BLACKLIST), after=None),
            FileChange(path=DRIVERCTL, before=None, after="vfio-pci\n"),
            FileChange(
                path=VFIO_CONF, before=None, after="softdep nvidia pre: vfio-pci\n", mode=0o600
            ),
        ],
        actions=[Action(argv=list(argv)) for argv in actions],
        reboot_required=True,
    )


def contents(root: Path, cs: ChangeSet) -> list[tuple[str | None, str | None, str | None]]:
    """(now, before, after) for each file of the change set."""
    return [(text(root, f.path), f.before, f.after) for f in cs.files]


def sha256(root: Path, path: str) -> str:
    """The hash of a file in the tree."""
    return hashlib.sha256((root / path.lstrip("/")).read_bytes()).hexdigest()


def drop_after(monkeypatch: pytest.MonkeyPatch, host: Host, commands: int) -> None:
    """Make ``host`` lose its connection once it has run ``commands`` commands."""
    real = host.run

    def run(
        argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> object:
        if host.commands_run >= commands:
            if isinstance(host, SSHHost):
                # Kill the real transport: paramiko then fails the command as a network would.
                transport = host._clients[-1].get_transport()
                assert transport is not None
                transport.close()
            else:
                raise HostUnreachableError(host.name, "connection lost")
        return real(argv, stdin=stdin, timeout=timeout)

    monkeypatch.setattr(host, "run", run)


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory first on PATH, holding a stand-in pvesh."""
    directory = tmp_path / "bin"
    fake_pvesh(directory)
    on_path(monkeypatch, directory)
    return directory


@pytest.fixture
def live_host(root: Path, bin_dir: Path) -> LocalHost:
    """This machine with the tree as its root: post-actions run, guests are asked about."""
    return LocalHost(str(root))


def ssh_options(sshd: Sshd, tmp_path: Path) -> SSHOptions:
    empty = tmp_path / "ssh_config"
    empty.touch()
    return SSHOptions(
        identity_file=str(sshd.identity_file),
        known_hosts=str(sshd.known_hosts),
        ssh_config=str(empty),
        connect_timeout=5.0,
    )


@pytest.fixture
def ssh_host(sshd: Sshd, tmp_path: Path, root: Path) -> Iterator[Callable[[], SSHHost]]:
    """Opens SSH connections to 127.0.0.1 whose root is the tree; closes them afterwards.

    A remote tree is not a live host; ``live=True`` makes it one so that these tests drive the
    live path (locks, post-actions) into the scratch tree instead of this machine's /.
    """
    opened: list[SSHHost] = []

    def connect() -> SSHHost:
        opened.append(SSHHost(sshd.target, ssh_options(sshd, tmp_path), root=str(root), live=True))
        return opened[-1]

    yield connect
    for host in opened:
        host.close()


# --- apply, second apply, rollback, history ------------------------------------------------------


def test_apply_writes_every_file_atomically_and_journals_it(root: Path) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root, actions=[["update-initramfs", "-u", "-k", "all"]])
    lxc_mode = stat.S_IMODE((root / LXC.lstrip("/")).stat().st_mode)
    result = apply_changes(host, cs)
    assert result.changed and result.journal_id
    assert [now for now, _, _ in contents(root, cs)] == [f.after for f in cs.files]
    assert result.files == [f.path for f in cs.files]
    assert host.commands_run == 4, "lock+read, stage, commit, finish: whatever the file count"
    assert result.actions_run == [] and "listed, not run" in result.messages[1]
    assert stat.S_IMODE((root / VFIO_CONF.lstrip("/")).stat().st_mode) == 0o600
    assert stat.S_IMODE((root / LXC.lstrip("/")).stat().st_mode) == lxc_mode
    [entry] = history(host)
    assert (entry.id, entry.status, entry.changeset) == (result.journal_id, "applied", cs)
    assert [(f.path, f.existed) for f in entry.files] == [
        (f.path, f.before is not None) for f in cs.files
    ]
    backups = root / "var/lib/proxgpu/backups" / entry.id
    assert (backups / "0").read_text() == cs.files[0].before
    journal = root / "var/lib/proxgpu/journal" / f"{entry.id}.json"
    assert stat.S_IMODE(backups.stat().st_mode) == 0o700, "backups hold guest configs"
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600
    assert '"existed": false' in (backups / "meta.json").read_text()
    assert not list(root.rglob("*.proxgpu-*.tmp")), "no temp file is left behind"
    assert not (root / "run/lock/proxgpu").exists(), "the lock is released"


def test_a_second_apply_of_the_same_changeset_changes_nothing(root: Path) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root)
    apply_changes(host, cs)
    again = apply_changes(host, cs)
    assert (again.changed, again.journal_id, again.messages) == (
        False,
        None,
        ["no changes: the host already matches the plan"],
    )
    assert len(history(host)) == 1
    fresh = ChangeSet(host="ct200", files=[FileChange(path=MODULES, before="a", after="a")])
    before = host.commands_run
    assert not apply_changes(host, fresh).changed
    assert host.commands_run == before, "an empty change set needs no command at all"
    live = apply_changes(host, cs, plan=ct200_plan(root), live=True)
    assert "nothing was rebound" in live.messages[-1]


def test_rollback_restores_byte_for_byte_and_removes_created_files(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    cs = changeset(root)
    applied = apply_changes(host, cs)
    assert snapshot(root) != original
    result = rollback(host)
    assert result.journal_id == applied.journal_id
    assert sorted(result.files) == sorted(f.path for f in cs.files)
    assert snapshot(root) == original, "contents, modes and the new directory are all undone"
    assert [e.status for e in history(host)] == ["rolled-back"]
    with pytest.raises(RollbackError, match="nothing to roll back"):
        rollback(host)
    with pytest.raises(RollbackError, match="already rolled back"):
        rollback(host, to=applied.journal_id)
    with pytest.raises(UsageError, match="no journal entry 20000101T000000Z-0000"):
        rollback(host, to="20000101T000000Z-0000")


def test_history_lists_entries_oldest_first_and_rollback_goes_back_one_at_a_time(
    root: Path,
) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    first = apply_changes(host, changeset(root))
    middle = snapshot(root)
    modules = text(root, MODULES)
    assert modules is not None
    second = apply_changes(
        host, ChangeSet(host="ct200", files=[FileChange(path=MODULES, before=modules, after="x\n")])
    )
    assert [e.id for e in history(host)] == [first.journal_id, second.journal_id]
    with pytest.raises(FileChangedError, match="changed since apply") as err:
        rollback(host, to=first.journal_id)
    assert err.value.path == MODULES
    assert rollback(host).journal_id == second.journal_id
    assert snapshot(root) == middle
    assert rollback(host).journal_id == first.journal_id
    assert snapshot(root) == original


def test_rollback_refuses_a_file_changed_since_the_apply_unless_forced(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    apply_changes(host, changeset(root))
    (root / LXC.lstrip("/")).write_text("edited by hand\n")
    with pytest.raises(FileChangedError, match="changed since apply") as err:
        rollback(host)
    assert err.value.path == LXC
    rollback(host, force=True)
    assert snapshot(root) == original


def test_journal_ids_sort_by_time() -> None:
    from datetime import UTC, datetime  # noqa: PLC0415 - only this test builds dates

    ids = [new_journal_id(datetime(2026, 11, 30, h, tzinfo=UTC)) for h in (9, 10, 23)]
    assert ids == sorted(ids) and ids[0].startswith("20261130T090000.000000Z-")


def test_dry_run_writes_nothing(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    cs = changeset(root, actions=[["update-initramfs", "-u"]])
    result = apply_changes(host, cs, dry_run=True)
    assert (result.changed, result.dry_run, result.journal_id) == (True, True, None)
    assert result.files == [f.path for f in cs.files]
    assert [a.argv for a in result.actions] == [["update-initramfs", "-u"]]
    assert snapshot(root) == original
    assert not (root / "var/lib/proxgpu").exists()
    assert host.commands_run == 1


# --- preflight refusals --------------------------------------------------------------------------


def test_a_file_changed_after_inspection_is_refused(root: Path) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root)
    (root / MODULES.lstrip("/")).write_text("changed by someone else\n")
    edited = snapshot(root)
    with pytest.raises(FileChangedError, match="compare-and-swap failed") as err:
        apply_changes(host, cs)
    assert err.value.path == MODULES and f"{host.name}: {MODULES}:" in str(err.value)
    assert snapshot(root) == edited
    assert history(host) == [] and not (root / "run/lock/proxgpu").exists()


@pytest.mark.parametrize(
    ("step", "path"),
    [("backup", MODULES), ("write", MODULES)],
    ids=["while-staging", "while-renaming"],
)
def test_a_file_changed_during_the_apply_is_refused_and_the_rest_restored(
    root: Path, step: str, path: str
) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root)

    def meddle(current: str, message: str) -> None:
        if current == step:
            (root / path.lstrip("/")).write_text("changed by someone else\n")

    original = snapshot(root)
    with pytest.raises(FileChangedError, match="changed while being applied"):
        apply_changes(host, cs, progress=meddle)
    (root / path.lstrip("/")).write_text(next(f.before for f in cs.files if f.path == path) or "")
    assert snapshot(root) == original, "the files renamed before the conflict are back"
    assert [e.status for e in history(host)] == ["failed"]


def test_a_guest_config_carrying_lock_is_refused(root: Path) -> None:
    vm = root / VM.lstrip("/")
    vm.write_text("lock: backup\n" + vm.read_text())
    with pytest.raises(PreflightError, match=r"300\.conf: the guest is locked \(backup\)"):
        apply_changes(DirectoryHost(str(root)), changeset(root))
    # Only the current section counts: a snapshot section's keys are history.
    vm.write_text(vm.read_text().removeprefix("lock: backup\n") + "\n[snap1]\nlock: snapshot\n")
    assert apply_changes(DirectoryHost(str(root)), changeset(root)).changed


@pytest.mark.parametrize(
    ("vmid", "refusal"),
    [("300", "VM 300 is running.*`qm shutdown 300`"), ("200", "container 200 is running.*pct")],
)
def test_a_running_guest_is_refused(
    root: Path, bin_dir: Path, live_host: LocalHost, vmid: str, refusal: str
) -> None:
    original = snapshot(root)
    (bin_dir / f"status-{vmid}").write_text("running")
    with pytest.raises(PreflightError, match=refusal):
        apply_changes(live_host, changeset(root))
    assert snapshot(root) == original and history(live_host) == []
    (bin_dir / f"status-{vmid}").write_text("stopped")
    assert apply_changes(live_host, changeset(root)).changed


def test_proxmox_own_config_lock_is_waited_for(root: Path, live_host: LocalHost) -> None:
    # The lock `pct set 200` takes (PVE::AbstractConfig), held here for a second. (A VM config
    # on a host with pvesh goes through the API, where Proxmox takes its own lock.)
    lock = root / "run/lock/lxc/pve-config-200.lock"
    lock.parent.mkdir(parents=True)
    holder = lock.open("a")
    fcntl.flock(holder, fcntl.LOCK_EX)
    threading.Timer(1.0, holder.close).start()
    started = time.monotonic()
    assert apply_changes(live_host, changeset(root)).changed
    assert time.monotonic() - started >= 1.0, "the rename waited for Proxmox's lock"


def test_rollback_waits_for_proxmox_own_config_lock_too(root: Path, live_host: LocalHost) -> None:
    original = snapshot(root)
    apply_changes(live_host, changeset(root))
    lock = root / "run/lock/lxc/pve-config-200.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = lock.open("a")
    fcntl.flock(holder, fcntl.LOCK_EX)
    threading.Timer(1.0, holder.close).start()
    started = time.monotonic()
    assert LXC in rollback(live_host).files
    assert time.monotonic() - started >= 1.0, "the restore waited for Proxmox's lock"
    assert snapshot(root) == original


def test_without_pvesh_guests_cannot_be_checked_so_apply_refuses_unless_told(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shutil.which("pvesh") is None
    host = LocalHost(str(root))
    with pytest.raises(PreflightError, match="pvesh is not on this host"):
        apply_changes(host, changeset(root))
    without = Inventory(source="test", hostname="ct200", commands=["fuser"])
    with pytest.raises(PreflightError, match="pvesh is not on this host"):
        apply_changes(host, changeset(root), inventory=without)
    assert history(host) == []
    assert apply_changes(host, changeset(root), skip_guest_check=True).changed


def test_a_live_host_needs_root(root: Path, bin_dir: Path, live_host: LocalHost) -> None:
    fake_tool(bin_dir, "id", "echo 1000\n")  # the tests run as root: pretend not to be
    with pytest.raises(NotRootError, match="must run as root"):
        apply_changes(live_host, changeset(root))
    assert apply_changes(DirectoryHost(str(root)), changeset(root)).changed, "a tree needs none"


# --- failures after writing ----------------------------------------------------------------------


def test_a_failing_post_action_restores_every_file(
    root: Path, tmp_path: Path, live_host: LocalHost
) -> None:
    log = tmp_path / "actions.log"
    record = ["sh", "-c", 'echo ran >> "$1"', "sh", str(log)]
    cs = changeset(root, actions=[record, ["false"]])
    original = snapshot(root)
    with pytest.raises(ApplyError, match="every file was restored from the backup") as err:
        apply_changes(live_host, cs)
    assert err.value.restored and "false exited with 1" in str(err.value)
    assert snapshot(root) == original
    assert log.read_text() == "ran\nran\n", "the action that ran is re-run on the old files"
    [entry] = history(live_host)
    assert entry.status == "failed" and "false exited with 1" in entry.message
    with pytest.raises(RollbackError, match="failed and was restored"):
        rollback(live_host, to=entry.id)


def test_post_actions_run_on_a_live_host_and_again_on_rollback(
    root: Path, tmp_path: Path, live_host: LocalHost
) -> None:
    log = tmp_path / "actions.log"
    cs = changeset(root, actions=[["sh", "-c", 'echo ran >> "$1"', "sh", str(log)]])
    original = snapshot(root)
    result = apply_changes(live_host, cs)
    assert result.actions_run == [cs.actions[0].argv] and log.read_text() == "ran\n"
    assert rollback(live_host).actions_run == [cs.actions[0].argv]
    assert log.read_text() == "ran\nran\n" and snapshot(root) == original
    apply_changes(live_host, cs)
    assert rollback(live_host, run_actions=False).actions_run == []


# --- interruption, recovery and concurrency ------------------------------------------------------


@pytest.mark.parametrize("commands", [1, 2, 3])
def test_an_interrupted_apply_blocks_the_next_and_rollback_recovers(
    root: Path, monkeypatch: pytest.MonkeyPatch, commands: int
) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root)
    original = snapshot(root)
    drop_after(monkeypatch, host, commands)
    with pytest.raises((ApplyError, HostUnreachableError)):
        apply_changes(host, cs)
    for now, before, after in contents(root, cs):
        assert now in (before, after)
    fresh = DirectoryHost(str(root))
    with pytest.raises(PreflightError, match="rollback"):
        apply_changes(fresh, cs)
    result = rollback(fresh)
    assert snapshot(root) == original
    if commands == 1:
        assert "which had written nothing" in result.messages[0]
    else:
        assert [e.status for e in history(fresh)] == ["rolled-back"]
    assert apply_changes(fresh, cs).changed, "the host is usable again"


def test_a_lock_held_by_another_client_is_reported_and_only_broken_on_request(root: Path) -> None:
    lock = root / "run/lock/proxgpu"
    lock.mkdir(parents=True)
    (lock / "owner").write_text(
        f"id={OTHER_ID}\nop=apply\nclient=elsewhere\npid=4242\nuser=ops\nsince=now\n"
    )
    host = DirectoryHost(str(root))
    with pytest.raises(ConcurrentApplyError, match=rf"held by apply {OTHER_ID} \(ops@"):
        apply_changes(host, changeset(root))
    with pytest.raises(ConcurrentApplyError, match="elsewhere pid 4242"):
        rollback(host)
    assert "written nothing" in rollback(host, break_lock=True).messages[0]
    assert not lock.exists()


def test_a_lock_left_by_a_dead_local_process_is_taken_over_by_rollback(root: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid now belongs to no process
    lock = root / "run/lock/proxgpu"
    lock.mkdir(parents=True)
    (lock / "owner").write_text(
        f"id={OTHER_ID}\nop=apply\nclient={socket.gethostname()}\npid={gone.pid}\n"
    )
    host = DirectoryHost(str(root))
    with pytest.raises(ConcurrentApplyError):
        apply_changes(host, changeset(root))
    assert "written nothing" in rollback(host).messages[0]
    assert apply_changes(host, changeset(root)).changed


def test_two_concurrent_applies_never_interleave(root: Path) -> None:
    cs = changeset(root)
    locked, finished = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def hold_the_lock(step: str, message: str) -> None:
        if step == "backup":  # the first apply holds the lock from here on
            locked.set()
            finished.wait(10)

    def first() -> None:
        outcome["first"] = apply_changes(DirectoryHost(str(root)), cs, progress=hold_the_lock)

    def second() -> None:
        locked.wait(10)
        try:
            apply_changes(DirectoryHost(str(root)), cs)
        except ProxgpuError as exc:
            outcome["second"] = exc
        finally:
            finished.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert isinstance(outcome["second"], ConcurrentApplyError)
    assert "held by apply" in str(outcome["second"])
    assert getattr(outcome["first"], "changed", False)
    assert [now for now, _, _ in contents(root, cs)] == [f.after for f in cs.files]


# --- VM options through the Proxmox API ----------------------------------------------------------


def node() -> str:
    """This machine's Proxmox node name, which a LocalHost's pvesh calls use."""
    return os.uname().nodename.split(".")[0]


def set_calls(bin_dir: Path) -> list[tuple[str, dict[str, str]]]:
    """The ``pvesh set`` calls made: (API path, options)."""
    return [
        (call[1], dict(zip(call[2::2], call[3::2], strict=True)))
        for call in pvesh_calls(bin_dir)
        if call[0] == "set"
    ]


def test_a_vm_config_goes_through_the_api_and_a_container_config_as_a_file(
    root: Path, bin_dir: Path, live_host: LocalHost
) -> None:
    original = snapshot(root)
    cs = changeset(root)
    vm = cs.files[1]
    assert vm.path == VM and vm.before is not None and vm.after is not None
    result = apply_changes(live_host, cs)
    assert set_calls(bin_dir) == [
        (
            f"/nodes/{node()}/qemu/300/config",
            {
                "-hostpci0": "0000:81:00,pcie=1",
                "-digest": config_digest(vm.before),
                "--output-format": "json",
            },
        )
    ], "one PUT with the changed key and the digest of the file it was planned from"
    assert f"through the Proxmox API (PUT .../config): {VM}" in result.messages
    # The stand-in, like Proxmox, wrote the keys in its own order.
    now = text(root, VM)
    assert now is not None and now != vm.after and same_config(now, vm.after)
    assert now.index("hostpci0:") < now.index("machine:")
    assert text(root, LXC) == cs.files[0].after, "raw lxc.* keys: written as a file"
    assert live_host.commands_run == 7, "lock+read, 2 guest statuses, stage, PUT, commit, finish"
    [entry] = history(live_host)
    files = {f.path: f for f in entry.files}
    assert (files[VM].via, files[LXC].via) == ("api", "file")
    assert files[VM].sha256_after == sha256(root, VM), "the hash of what Proxmox wrote"
    assert not verify(live_host, entry).drifted
    again = apply_changes(live_host, cs)
    assert not again.changed, "the reordered file is recognised as already applied"
    assert len(set_calls(bin_dir)) == 1
    assert rollback(live_host).files
    assert snapshot(root) == original, "the VM config is restored byte for byte"


def test_what_pvesh_warns_about_is_shown_once(
    root: Path, bin_dir: Path, live_host: LocalHost
) -> None:
    # pvesh prints a line on stderr while it waits for a guest's lock, and succeeds.
    (bin_dir / "pvesh").rename(bin_dir / "pvesh-stand-in")
    fake_tool(
        bin_dir,
        "pvesh",
        'echo "trying to acquire lock..." >&2\nexec "${0%/*}/pvesh-stand-in" "$@"\n',
    )
    result = apply_changes(live_host, changeset(root))
    assert len(pvesh_calls(bin_dir)) == 3, "two guest statuses and one PUT, each warned"
    assert [m for m in result.messages if m.startswith("pvesh")] == [
        "pvesh warned: trying to acquire lock..."
    ]
    rollback(live_host)
    dry = apply_changes(live_host, changeset(root), dry_run=True)
    assert dry.messages[-1] == "pvesh warned: trying to acquire lock..."


def test_a_directory_tree_writes_vm_configs_as_files(root: Path, bin_dir: Path) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root)
    apply_changes(host, cs)
    assert pvesh_calls(bin_dir) == [] and text(root, VM) == cs.files[1].after
    assert {f.via for f in history(host)[0].files} == {"file"}


def test_without_pvesh_a_vm_config_is_written_as_a_file(root: Path) -> None:
    assert shutil.which("pvesh") is None
    host = LocalHost(str(root))
    cs = changeset(root)
    apply_changes(host, cs, skip_guest_check=True)
    assert text(root, VM) == cs.files[1].after


def test_a_stale_digest_is_refused_by_proxmox_and_everything_is_restored(
    root: Path, bin_dir: Path, live_host: LocalHost
) -> None:
    second = "/etc/pve/qemu-server/301.conf"
    vm = text(root, VM)
    assert vm is not None
    (root / second.lstrip("/")).write_text(vm.replace("name: train", "name: eval"))
    cs = changeset(root)
    before = text(root, second)
    assert before is not None
    cs = cs.model_copy(
        update={
            "files": [
                *cs.files,
                FileChange(path=second, before=before, after=before + "numa: 1\n"),
            ]
        }
    )
    edit = before + "description: edited in the GUI meanwhile\n"

    def meddle(step: str, message: str) -> None:
        if step == "api" and "VM 301" in message:
            (root / second.lstrip("/")).write_text(edit)

    original = snapshot(root, ignore=(second.lstrip("/"),))
    with pytest.raises(ApplyError, match="every file was restored from the backup") as err:
        apply_changes(live_host, cs, progress=meddle)
    assert (
        f"PUT /nodes/{node()}/qemu/301/config: 400 Parameter verification failed: digest: "
        "detected modified configuration - file changed by other user? Try again."
    ) in str(err.value)
    assert err.value.restored
    assert [path for path, _ in set_calls(bin_dir)] == [
        f"/nodes/{node()}/qemu/300/config",
        f"/nodes/{node()}/qemu/301/config",
    ], "VM 300 was written through the API before 301 was refused"
    assert snapshot(root, ignore=(second.lstrip("/"),)) == original, "VM 300 is back too"
    assert text(root, second) == edit, "the concurrent edit Proxmox refused to overwrite stays"
    assert not list(root.rglob("*.proxgpu-*.tmp"))
    [entry] = history(live_host)
    assert entry.status == "failed" and "digest" in entry.message


def test_a_connection_lost_after_an_api_write_is_recovered_by_rollback(
    root: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = LocalHost(str(root))
    cs = changeset(root)
    original = snapshot(root)
    # lock+read, two guest statuses, stage, PUT: the connection is gone before the read-back.
    drop_after(monkeypatch, host, 5)
    with pytest.raises((ApplyError, HostUnreachableError), match="connection lost"):
        apply_changes(host, cs)
    assert len(set_calls(bin_dir)) == 1
    now = text(root, VM)
    assert now is not None and now != cs.files[1].after, "Proxmox's rewrite, never read back"
    fresh = LocalHost(str(root))
    assert [e.status for e in history(fresh)] == ["in-progress"]
    rollback(fresh)
    assert snapshot(root) == original


def test_a_second_plan_after_an_api_write_changes_nothing(
    root: Path, bin_dir: Path, live_host: LocalHost
) -> None:
    for tool in ("update-initramfs", "proxmox-boot-tool", "update-grub"):
        fake_tool(bin_dir, tool, "exit 0\n")  # the post-actions must not touch this machine
    policy = SplitPolicy(lxc=200, vms=[(300, None)])
    inventory = inspect(DirectoryHost(str(root)))
    plan = plan_split(inventory, policy)
    changes = render(inventory, plan)
    [vm] = [f for f in changes.files if f.path == VM]
    assert vm.changed and vm.after is not None
    apply_changes(live_host, changes, plan=plan)
    assert set_calls(bin_dir), "the VM's options went through the API"
    reordered = text(root, VM)
    assert reordered is not None and reordered != vm.after, "Proxmox wrote its own order"
    again = inspect(DirectoryHost(str(root)))
    second = render(again, plan_split(again, policy))
    assert not second.changed, [f.path for f in second.changed_files()]
    assert next(f for f in second.files if f.path == VM).after == reordered
    assert not apply_changes(live_host, second, plan=plan).changed


# --- verify --------------------------------------------------------------------------------------


def ct200_plan(root: Path) -> Plan:
    return plan_split(inspect(DirectoryHost(str(root))), SplitPolicy(lxc=200, vms=[(300, None)]))


def test_verify_reports_file_drift_and_drivers_still_waiting_for_a_reboot(root: Path) -> None:
    host = DirectoryHost(str(root))
    plan = ct200_plan(root)
    applied = apply_changes(host, changeset(root), plan=plan)
    [entry] = history(host)
    report = verify(host, entry)
    # A tree has no kernel: its GPUs stay on nvidia, as a host would until it reboots.
    assert report.drifted and len(report.drift) == 8
    assert report.drift[0] == (
        f"0000:81:00.0: bound to nvidia, the plan says vfio-pci "
        f"(apply {applied.journal_id} takes effect after a reboot)"
    )
    (root / MODULES.lstrip("/")).write_text("edited\n")
    (root / DRIVERCTL.lstrip("/")).unlink()
    files = [line for line in verify(host, entry).drift if line.startswith("/")]
    assert files == [
        f"{MODULES}: differs from what apply {entry.id} left there",
        f"{DRIVERCTL}: missing, but apply {entry.id} left it in place",
    ]


def test_verify_against_a_plan_checks_each_functions_driver(root: Path) -> None:
    host = DirectoryHost(str(root))
    plan = ct200_plan(root)
    report = verify(host, plan)
    assert "0000:81:00.1: bound to snd_hda_intel, the plan says vfio-pci" in report.drift
    assert not any(line.startswith("0000:01:") for line in report.drift), "host group is fine"
    assert not verify(host, plan.model_copy(update={"groups": plan.groups[:1]})).drifted


def test_verify_after_rollback_expects_the_old_files(root: Path) -> None:
    host = DirectoryHost(str(root))
    apply_changes(host, changeset(root), plan=ct200_plan(root))
    rollback(host)
    [entry] = history(host)
    assert isinstance(entry, JournalEntry) and not verify(host, entry).drifted


# --- over SSH ------------------------------------------------------------------------------------

sshd_only = pytest.mark.sshd


@sshd_only
def test_apply_verify_rollback_over_ssh(
    root: Path, tmp_path: Path, ssh_host: Callable[[], SSHHost]
) -> None:
    host = ssh_host()
    log = root / "actions.log"
    cs = changeset(root, actions=[["sh", "-c", 'echo ran >> "$1"', "sh", str(log)]])
    original = snapshot(root)
    result = apply_changes(host, cs, skip_guest_check=True)
    assert host.commands_run == 5, "lock+read, stage, commit, one post-action, finish"
    assert [now for now, _, _ in contents(root, cs)] == [f.after for f in cs.files]
    assert log.read_text() == "ran\n"
    assert not apply_changes(host, cs, skip_guest_check=True).changed
    [entry] = history(host)
    assert entry.id == result.journal_id and not verify(host, entry).drifted
    assert len(rollback(host).files) == len(cs.files)
    log.unlink()
    assert snapshot(root) == original


@sshd_only
@pytest.mark.parametrize("commands", [1, 2, 3, 4])
def test_a_dropped_ssh_connection_leaves_whole_files_and_rollback_recovers(
    root: Path, monkeypatch: pytest.MonkeyPatch, ssh_host: Callable[[], SSHHost], commands: int
) -> None:
    log = root.parent / "actions.log"
    cs = changeset(root, actions=[["sh", "-c", 'echo ran >> "$1"', "sh", str(log)]])
    original = snapshot(root)
    host = ssh_host()
    drop_after(monkeypatch, host, commands)
    with pytest.raises((ApplyError, HostUnreachableError), match="connection lost") as err:
        apply_changes(host, cs, skip_guest_check=True)
    if isinstance(err.value, ApplyError):
        assert "run `proxgpu rollback`" in str(err.value)
    for now, before, after in contents(root, cs):
        assert now in (before, after), "each file is old or new, never partial"
    fresh = ssh_host()
    with pytest.raises(PreflightError, match="rollback"):
        apply_changes(fresh, cs, skip_guest_check=True)
    rollback(fresh)
    assert snapshot(root) == original
    assert apply_changes(fresh, cs, skip_guest_check=True).changed


@sshd_only
def test_a_connection_dropped_during_a_post_action_is_recovered(
    root: Path, ssh_host: Callable[[], SSHHost]
) -> None:
    cs = changeset(root, actions=[["sleep", "3"]])
    original = snapshot(root)
    host = ssh_host()

    def drop_soon(step: str, message: str) -> None:
        if step == "action":
            transport = host._clients[-1].get_transport()  # the live paramiko connection
            assert transport is not None
            threading.Timer(0.5, transport.close).start()

    with pytest.raises(ApplyError, match="connection lost"):
        apply_changes(host, cs, skip_guest_check=True, progress=drop_soon)
    assert [now for now, _, _ in contents(root, cs)] == [f.after for f in cs.files]
    fresh = ssh_host()
    assert [e.status for e in history(fresh)] == ["in-progress"]
    rollback(fresh, run_actions=False)
    assert snapshot(root) == original


@sshd_only
def test_concurrent_applies_over_ssh_never_both_write(
    root: Path, ssh_host: Callable[[], SSHHost]
) -> None:
    cs = changeset(root)
    hosts = [ssh_host(), ssh_host()]
    outcomes: list[object] = []
    start = threading.Barrier(2)

    def apply(host: SSHHost) -> None:
        start.wait(10)
        try:
            outcomes.append(apply_changes(host, cs, skip_guest_check=True))
        except ProxgpuError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=apply, args=(h,)) for h in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    wrote = [o for o in outcomes if getattr(o, "changed", False)]
    others = [o for o in outcomes if o not in wrote]
    assert len(wrote) == 1 and len(others) == 1
    # The loser either found the lock taken or, arriving later, nothing left to do.
    assert isinstance(others[0], ConcurrentApplyError) or not getattr(others[0], "changed", True)
    assert len(history(hosts[0])) == 1
    assert [now for now, _, _ in contents(root, cs)] == [f.after for f in cs.files]
