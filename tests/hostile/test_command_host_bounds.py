"""The command host (the Ansible collection's way to a host) bounds every command as the local and
SSH hosts do: one deadline for the whole command and 64 MiB of answer (issue 21, point 4), on
the host itself, so that the connection never carries a 3 GB answer nor waits on a trickle.

The connection here is a real ``sh -c`` on this machine, as Ansible's ``local`` connection runs
it, which counts the bytes it carried back; the commands are real shells writing real bytes.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from proxgpu.errors import CommandOutputTooLargeError, CommandTimeoutError
from proxgpu.host.base import MAX_OUTPUT
from proxgpu.host.command import CommandHost
from tests.support.hostile_scratch import Scratch, gone


class Connection:
    """Runs a command line with ``sh -c``, as Ansible's local connection does, and keeps the
    size of the largest answer it carried."""

    def __init__(self) -> None:
        self.carried = 0

    def __call__(self, command: str, stdin: bytes) -> tuple[int, bytes, bytes]:
        argv = ["sh", "-c", command]
        # A failed command is data here, as for Ansible's connection.
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=120, check=False)
        self.carried = max(self.carried, len(done.stdout) + len(done.stderr))
        return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("stream", ["", ">&2"])
def test_an_answer_of_3_gb_is_refused_and_never_carried_whole(
    scratch: Scratch, stream: str
) -> None:
    connection = Connection()
    host = CommandHost("pve1", connection)
    start = time.monotonic()
    with pytest.raises(CommandOutputTooLargeError) as caught:
        host.run(["sh", "-c", f"head -c 3G /dev/zero {stream}"])
    assert time.monotonic() - start < 60
    assert str(caught.value).startswith("pve1: sh answered more than 64 MiB, stopped reading")
    assert MAX_OUTPUT < connection.carried <= 2 * (MAX_OUTPUT + 1)


def test_a_trickle_ends_at_one_deadline_for_the_whole_command_with_its_children_killed(
    scratch: Scratch,
) -> None:
    """A byte a second never lets a per-read timeout fire; the deadline is the whole command's,
    and the shell and the child it left in the background both die on the host."""
    pids = scratch.root / "pids"
    script = f"sleep 300 & echo $$ $! > {pids}; while :; do printf x; sleep 1; done"
    start = time.monotonic()
    with pytest.raises(CommandTimeoutError) as caught:
        CommandHost("pve1", Connection()).run(["sh", "-c", script], timeout=3)
    assert 3 <= time.monotonic() - start < 10
    assert str(caught.value) == "pve1: sh did not finish within 3 s"
    shell, child = (int(p) for p in pids.read_text().split())
    assert gone(shell) and gone(child), "a process of the command was left behind"


def test_stdin_stdout_stderr_and_the_exit_status_pass_byte_for_byte(scratch: Scratch) -> None:
    host = CommandHost("pve1", Connection())
    data = bytes(range(256)) * 64
    result = host.run(["sh", "-c", "cat; printf 'e\\0\\377' >&2; exit 3"], stdin=data)
    assert (result.returncode, result.stdout, result.stderr) == (3, data, b"e\0\377")


def test_a_command_that_exits_124_at_once_is_data_not_a_timeout(scratch: Scratch) -> None:
    result = CommandHost("pve1", Connection()).run(["sh", "-c", "exit 124"], timeout=30)
    assert result.returncode == 124
