"""What the OpenSSH transport reads from ssh_config, and a master check that fails to run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

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
