"""A host that answers a step "exit 0" without running it is never believed.

The lying host is a real sshd on loopback whose ``ForceCommand`` (``tests/support/hostile_sshd.py``)
runs every command it is sent, except the step it is told to lie about: that one is answered
with exit 0 and a canned stdout (nothing, or an end record that is not the run's), as a
wrapper, an ``authorized_keys`` ``command=`` or a broken transport would. Whatever step lies,
apply, rollback and a fleet never report a success, and once the host answers honestly again a
rollback puts back every byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.apply.journal import history
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.cli import main
from proxgpu.errors import ApplyError, HostUnreachableError, StepNotFinishedError
from proxgpu.host.ssh import SSHHost
from tests.support.hostile_sshd import Liar, lying
from tests.support.sshd import SSHD, client_options
from tests.support.tools import require_tool
from tests.support.trees import changeset, copy_example, snapshot

pytestmark = pytest.mark.sshd

#: What the lying host answers in place of running the step: nothing at all, or an end record
#: that no run of this apply wrote (a replayed or hand-made answer).
ANSWERS = ["", "#end\t0123456789abcdef\t0\n"]


@pytest.fixture
def liar(tmp_path: Path) -> Iterator[Liar]:
    """The lying host, honest until a test names the step it lies about."""
    require_tool(SSHD, "openssh-server")
    with lying(tmp_path / "liar") as server:
        yield server


@pytest.fixture
def connect(liar: Liar, tmp_path: Path, root: Path) -> Iterator[Callable[[], SSHHost]]:
    """Opens SSH connections to the lying host, its root the tree, driven as a live host."""
    opened: list[SSHHost] = []

    def open_one() -> SSHHost:
        options = client_options(liar.sshd, tmp_path)
        opened.append(SSHHost(liar.sshd.target, options, root=str(root), live=True))
        return opened[-1]

    yield open_one
    for host in opened:
        host.close()


@pytest.mark.parametrize("answer", ANSWERS, ids=["silent", "foreign-end"])
@pytest.mark.parametrize("step", ["probe", "stage", "commit", "follow", "finish"])
def test_an_apply_whose_step_the_host_did_not_run_never_succeeds(
    liar: Liar, connect: Callable[[], SSHHost], root: Path, step: str, answer: str
) -> None:
    log = root.parent / "actions.log"
    changes = changeset(root, actions=[["sh", "-c", 'echo ran >> "$1"', "sh", str(log)]])
    original = snapshot(root)
    liar.lie_about(step, answer)
    with pytest.raises((ApplyError, HostUnreachableError)) as failed:
        apply_changes(connect(), changes, options=ApplyOptions(skip_guest_check=True))
    assert f"the host did not finish the {step} step" in str(failed.value)
    liar.lie_about(None)
    host = connect()
    if history(host):
        rollback(host, options=ApplyOptions(run_actions=False))
    log.unlink(missing_ok=True)
    assert snapshot(root) == original, "every byte back"
    assert apply_changes(host, changes, options=ApplyOptions(skip_guest_check=True)).changed


@pytest.mark.parametrize("step", ["journal", "restore"])
def test_a_rollback_the_host_did_not_run_is_not_reported_done(
    liar: Liar, connect: Callable[[], SSHHost], root: Path, step: str
) -> None:
    changes = changeset(root)
    original = snapshot(root)
    applied = apply_changes(connect(), changes, options=ApplyOptions(skip_guest_check=True))
    after = snapshot(root)
    liar.lie_about(step, "")
    with pytest.raises(StepNotFinishedError, match=f"did not finish the {step} step"):
        rollback(connect())
    assert snapshot(root) == after, "nothing was rolled back, and nothing says it was"
    liar.lie_about(None)
    host = connect()
    assert [e.id for e in history(host)][-1] == applied.journal_id
    rollback(host)
    assert snapshot(root) == original


@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_a_fleet_whose_host_lies_about_the_commit_reports_no_host_ok(
    liar: Liar, tmp_path: Path, capsys: pytest.CaptureFixture[str], transport: str
) -> None:
    root = copy_example(tmp_path)
    config = tmp_path / "ssh_config"
    server = liar.sshd
    config.write_text(
        "".join(
            f"Host {name}\n  HostName 127.0.0.1\n  Port {server.port}\n  User {server.user}\n"
            f"  IdentityFile {server.identity_file}\n  UserKnownHostsFile {server.known_hosts}\n"
            for name in ("gpu1", "gpu2", "gpu3")
        )
    )
    original = snapshot(root)
    liar.lie_about("commit", "")
    argv = ["apply", "--ssh-config", str(config), "--ssh-client", transport, "--root", str(root)]
    argv += ["--lxc", "200", "--vm", "300", "--yes", "--skip-guest-check"]
    code = main([*argv, "--host", "gpu1,gpu2,gpu3"])
    err = capsys.readouterr().err
    assert code == ApplyError.exit_code, err
    assert "did not finish the commit step" in err
    assert ": ok" not in err
    assert "gpu2: not touched (an earlier host failed)" in err
    assert snapshot(root) == original, "nothing written, and every file as it was"
