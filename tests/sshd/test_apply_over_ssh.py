"""Apply, verify and rollback over a real OpenSSH server on 127.0.0.1 (the ``sshd`` fixture),
into a copy of ``examples/hosts/ct200`` as the remote root: dropped connections at every step,
and two clients racing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.apply.journal import history
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.apply.verify import verify
from proxgpu.errors import (
    ApplyError,
    ConcurrentApplyError,
    HostUnreachableError,
    PreflightError,
    ProxgpuError,
)
from proxgpu.fleet import Event, Say, Target, each_host
from proxgpu.host import Host
from proxgpu.host.ssh import SSHHost
from proxgpu.planning import Plan
from tests.support.faults import drop_after
from tests.support.trees import changeset, contents, snapshot

pytestmark = pytest.mark.sshd

#: A plan with nothing to move at runtime: these applies are not live.
NO_PLAN = Plan(groups=[], warnings=[], tensor_parallel=[])


def test_apply_verify_rollback_over_ssh(
    root: Path, tmp_path: Path, ssh_host: Callable[[], SSHHost]
) -> None:
    host = ssh_host()
    log = root / "actions.log"
    cs = changeset(root, actions=[["sh", "-c", 'echo ran >> "$1"', "sh", str(log)]])
    original = snapshot(root)
    result = apply_changes(host, cs, options=ApplyOptions(skip_guest_check=True))
    assert host.commands_run == 5, "lock+read, stage, commit, one post-action, finish"
    assert [now for now, _, _ in contents(root, cs)] == [f.after for f in cs.files]
    assert log.read_text() == "ran\n"
    assert not apply_changes(host, cs, options=ApplyOptions(skip_guest_check=True)).changed
    [entry] = history(host)
    assert entry.id == result.journal_id and not verify(host, entry).drifted
    assert len(rollback(host).files) == len(cs.files)
    log.unlink()
    assert snapshot(root) == original


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
        apply_changes(host, cs, options=ApplyOptions(skip_guest_check=True))
    if isinstance(err.value, ApplyError):
        assert "run `proxgpu rollback`" in str(err.value)
    for now, before, after in contents(root, cs):
        assert now in (before, after), "each file is old or new, never partial"
    fresh = ssh_host()
    if commands > 1:  # a journal entry in progress blocks every apply until a rollback
        with pytest.raises(PreflightError, match="rollback"):
            apply_changes(fresh, cs, options=ApplyOptions(skip_guest_check=True))
    rollback(fresh)
    assert snapshot(root) == original
    assert apply_changes(fresh, cs, options=ApplyOptions(skip_guest_check=True)).changed


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
        apply_changes(host, cs, options=ApplyOptions(skip_guest_check=True), progress=drop_soon)
    assert [now for now, _, _ in contents(root, cs)] == [f.after for f in cs.files]
    fresh = ssh_host()
    assert [e.status for e in history(fresh)] == ["in-progress"]
    rollback(fresh, options=ApplyOptions(run_actions=False))
    assert snapshot(root) == original


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
            outcomes.append(apply_changes(host, cs, options=ApplyOptions(skip_guest_check=True)))
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


def test_a_slow_post_actions_lines_come_over_ssh_as_the_hosts_events(
    root: Path, ssh_host: Callable[[], SSHHost]
) -> None:
    """The action and the reads of its tail share one connection (a channel each)."""
    slow = ["sh", "-c", 'for i in 1 2 3 4; do echo "update-initramfs: kernel $i"; sleep 0.5; done']
    cs = changeset(root, actions=[slow])
    how = ApplyOptions(action_output=5, skip_guest_check=True)
    events: list[Event] = []

    def work(host: Host, say: Say) -> list[list[str]]:
        return apply_changes(host, cs, how, plan=NO_PLAN, progress=say).actions_run

    outcomes = each_host(
        {"pve2": Target("ssh")}, work, connect=lambda _: ssh_host(), on_event=events.append
    )
    assert outcomes["pve2"].unwrap() == [slow]
    output = [e for e in events if e.step == "output"]
    assert [str(e) for e in output] == [
        f"pve2:   | update-initramfs: kernel {i}" for i in range(1, 5)
    ]
    end = next(e for e in events if e.step == "end")
    assert output[0].elapsed < end.elapsed - 1.0, "the first line came while the action ran"
