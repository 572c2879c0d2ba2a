"""The local and directory hosts: argument lists, exit statuses and timeouts."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from proxgpu.errors import CommandError, CommandTimeoutError, HostUnreachableError, UsageError
from proxgpu.host import connect
from proxgpu.host.command import CommandHost
from proxgpu.host.local import DirectoryHost, LocalHost
from proxgpu.inspection.capture import gather


def test_arguments_reach_the_command_unchanged() -> None:
    result = LocalHost().run(["printf", "%s|", "a b", "$HOME", "'", ""])
    assert result.stdout == b"a b|$HOME|'||"


def test_a_failing_command_is_data_until_checked() -> None:
    host = LocalHost()
    result = host.run(["sh", "-c", "echo bad >&2; exit 4"])
    assert (result.returncode, result.stderr) == (4, b"bad\n")
    with pytest.raises(CommandError, match="sh exited with 4: bad") as err:
        host.check(["sh", "-c", "echo bad >&2; exit 4"])
    assert err.value.exit_code == 7
    assert host.commands_run == 2


def test_a_missing_command_exits_127() -> None:
    assert LocalHost().run(["proxgpu-no-such-tool"]).returncode == 127


def test_a_slow_command_times_out_as_a_command_not_as_the_host() -> None:
    with pytest.raises(CommandTimeoutError, match=r"sleep did not finish within 0\.2 s") as err:
        LocalHost().run(["sleep", "5"], timeout=0.2)
    assert not isinstance(err.value, HostUnreachableError)


@pytest.mark.parametrize("timeout", [0, -1.5])
def test_a_timeout_that_is_no_time_is_refused_by_every_host(timeout: float) -> None:
    """0 would mean "no limit" to GNU timeout (a connection's hosts) and "already past" here:
    it is refused before any command runs, whichever the host."""
    ran: list[str] = []

    def execute(command: str, stdin: bytes) -> tuple[int, bytes, bytes]:
        ran.append(command)
        return 0, b"", b""

    for host in (LocalHost(), CommandHost("pve1", execute)):
        with pytest.raises(UsageError, match=f"true: timeout {timeout} s: give more than 0"):
            host.run(["true"], timeout=timeout)
        assert host.commands_run == 0
    assert ran == []
    assert CommandHost("pve1", execute).run(["true"], timeout=0.5).ok, "a positive one runs"


def test_connect_chooses_the_kind_of_host(tmp_path: Path) -> None:
    assert isinstance(connect(), LocalHost) and connect().name == "localhost"
    tree = connect(root=str(tmp_path))
    assert isinstance(tree, DirectoryHost) and not tree.is_live
    with pytest.raises(UsageError, match="missing: no such directory"):
        connect(root=str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.write_text("x"), "not a directory"),
        (lambda p: None, "no such directory"),
    ],
    ids=["file", "missing"],
)
def test_a_root_that_is_no_directory_says_which_here_and_on_another_host(
    tmp_path: Path, make: Callable[[Path], object], why: str
) -> None:
    """A --root naming a file is "not a directory", not "no such directory": on this machine,
    and on another host, where the gather script says it (a real sh stands for that host)."""
    root = tmp_path / "tree"
    make(root)
    with pytest.raises(UsageError) as here:
        connect(root=str(root))
    assert str(here.value) == f"{root}: {why} (--root names a host's tree)"

    def sh(command: str, stdin: bytes) -> tuple[int, bytes, bytes]:
        done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, check=False)
        return done.returncode, done.stdout, done.stderr

    with pytest.raises(UsageError) as there:
        gather(CommandHost("pve1", sh, root=str(root)))
    assert str(there.value) == f"pve1: {root}: {why} (--root names a host's tree)"
