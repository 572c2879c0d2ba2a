"""What the OpenSSH transport reads from ssh_config, and a master check that fails to run."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

from proxgpu.host import openssh
from proxgpu.host.openssh import OpenSSHHost
from proxgpu.host.sshclient import why_openssh
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


@pytest.mark.skipif(openssh.ssh_binary() is None, reason="needs OpenSSH's ssh for ssh -G")
def test_an_identity_file_with_a_blank_set_only_in_ssh_config_stays_whole(tmp_path: Path) -> None:
    # ssh -G prints IdentityFile one file a line, unquoted (readconf.c's dump_cfg_strarray):
    # the line is the name. Its -cert.pub beside it is found only under the whole name.
    keys = tmp_path / "my keys"
    keys.mkdir()
    (keys / "id").write_text("")
    (keys / "id-cert.pub").write_text("")
    config = tmp_path / "ssh_config"
    text = f'Host pve1\n  IdentityFile "{keys}/id"\n  IdentityFile /elsewhere/id2\n'
    config.write_text(text)
    resolved = openssh.resolved_config(["ssh", "-F", str(config), "pve1"], "pve1")
    assert resolved["identityfile"][:2] == [f"{keys}/id", "/elsewhere/id2"]
    reason = why_openssh(resolved, "pve1", text)
    assert reason == "a user certificate (IdentityFile's -cert.pub)"
