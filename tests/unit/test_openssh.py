"""What the OpenSSH transport reads from ssh_config, and a master check that fails to run."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

from proxgpu.host import openssh
from proxgpu.host.openssh import OpenSSHHost
from proxgpu.host.sshcommon import known_hosts_files


def test_quoted_known_hosts_names_stay_whole() -> None:
    config = {"userknownhostsfile": ["'/k h/known' ~/k2"], "globalknownhostsfile": ["none"]}
    assert known_hosts_files(config) == ["/k h/known", str(Path("~/k2").expanduser())]


def test_a_master_check_that_hangs_or_cannot_start_is_no_master(mocker: MockerFixture) -> None:
    # A test double: ssh -O check hanging for 30 s, or ssh vanishing from PATH meanwhile, cannot
    # be arranged with a real ssh in a unit test's time.
    host = OpenSSHHost("pve1")
    run = mocker.patch("proxgpu.host.openssh.subprocess.run")
    for failure in (subprocess.TimeoutExpired(["ssh"], 30), FileNotFoundError("ssh")):
        run.side_effect = failure
        assert host._master_alive() is False


@pytest.mark.parametrize("value", ["none", "NONE"])
def test_none_names_no_known_hosts_file(value: str) -> None:
    assert known_hosts_files({"globalknownhostsfile": [value], "userknownhostsfile": []}) == []


def test_input_a_command_stops_reading_midway_does_not_hold_it_past_the_deadline() -> None:
    # A real local reader standing in for ssh: it takes a few KiB, then reads no more, so the
    # pipe is left with less room than one write (what ssh does when the remote stops reading).
    with subprocess.Popen(
        ["sh", "-c", "head -c 5000 >/dev/null; exec sleep 8"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            openssh._collect(proc, b"x" * 5_000_000, started + 1, 1 << 20)
        assert time.monotonic() - started < 3
        proc.kill()
