"""Locks (proxgpu.apply.lock): proxgpu's host-wide lock against other clients and dead
processes, two applies racing, and the config locks Proxmox's own editors take."""

from __future__ import annotations

import fcntl
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.errors import ConcurrentApplyError, ProxgpuError
from proxgpu.host.local import DirectoryHost, LocalHost
from tests.support.trees import LXC, changeset, contents, snapshot

OTHER_ID = "20261130T011500.000000Z-beef"


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
    messages = rollback(host, options=ApplyOptions(break_lock=True)).messages
    assert "took over" in messages[0] and "ops@elsewhere" in messages[0]
    assert "written nothing" in messages[1]
    assert not lock.exists()


def hold_lock(root: Path, owner: str) -> Path:
    """The lock as another machine's apply or rollback left it (``owner``: its id= and op=)."""
    lock = root / "run/lock/proxgpu"
    lock.mkdir(parents=True)
    (lock / "owner").write_text(f"{owner}\nclient=elsewhere\npid=4242\nuser=ops\nsince=now\n")
    return lock


def test_breaking_a_lock_never_rolls_back_a_finished_apply(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    done = apply_changes(host, changeset(root))
    applied = snapshot(root)
    # The lock was released before this rollback came (the other apply finished meanwhile) ...
    free = rollback(host, options=ApplyOptions(break_lock=True))
    assert free.journal_id is None and "was free" in free.messages[0]
    assert f"apply {done.journal_id} had finished" in free.messages[0]
    # ... or that apply finished but could not release it.
    lock = hold_lock(root, f"id={done.journal_id}\nop=apply")
    left = rollback(host, options=ApplyOptions(break_lock=True))
    assert left.journal_id is None and "took over" in left.messages[0]
    assert "had finished, so nothing was rolled back" in left.messages[1]
    assert snapshot(root) == applied and not lock.exists()
    assert rollback(host).journal_id == done.journal_id, "a plain rollback still rolls it back"
    assert snapshot(root) == original


def test_breaking_the_lock_of_an_interrupted_rollback_completes_it(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    done = apply_changes(host, changeset(root))
    hold_lock(root, f"id={OTHER_ID}\nop=rollback")
    finished = rollback(host, options=ApplyOptions(break_lock=True))
    assert finished.journal_id == done.journal_id and "took over" in finished.messages[-1]
    assert snapshot(root) == original


def test_an_empty_directory_at_the_lock_path_is_no_lock(root: Path) -> None:
    # proxgpu's lock is never without its owner file (it is renamed into place whole), and a
    # rename replaces an empty directory: whatever made this one, nobody holds it.
    (root / "run/lock/proxgpu").mkdir(parents=True)
    assert apply_changes(DirectoryHost(str(root)), changeset(root)).changed


def test_a_lock_left_by_a_dead_local_process_is_taken_over(root: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid now belongs to no process
    lock = root / "run/lock/proxgpu"
    lock.mkdir(parents=True)
    (lock / "owner").write_text(
        f"id={OTHER_ID}\nop=apply\nclient={socket.gethostname()}\npid={gone.pid}\n"
    )
    host = DirectoryHost(str(root))
    assert "written nothing" in rollback(host).messages[1]
    assert not lock.exists()
    lock.mkdir(parents=True)
    (lock / "owner").write_text(
        f"id={OTHER_ID}\nop=apply\nclient={socket.gethostname()}\npid={gone.pid}\n"
    )
    applied = apply_changes(host, changeset(root))  # an apply takes it over too, and says so
    assert applied.changed and any(f"from apply {OTHER_ID}" in m for m in applied.messages)


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
