"""What OpenSSH users keep in ~/.ssh/config works here too: Include, StrictHostKeyChecking, and
the exact command to forget a changed key from a known_hosts file of their own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxgpu.errors import HostKeyChangedError, HostKeyUnknownError
from proxgpu.host.ssh import SSHHost, SSHOptions
from tests.support.sshd import Sshd, known_hosts_with_another_key

pytestmark = pytest.mark.sshd


def alias(sshd: Sshd, known: Path, extra: str = "") -> str:
    return (
        f"Host gpu-box\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.identity_file}\n  UserKnownHostsFile {known}\n{extra}"
    )


def test_an_included_file_supplies_the_host(sshd: Sshd, tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "gpu.conf").write_text(alias(sshd, sshd.known_hosts))
    config = tmp_path / "config"
    config.write_text(f"Include {tmp_path}/conf.d/*.conf\n")
    with SSHHost("gpu-box", SSHOptions(ssh_config=str(config))) as host:
        assert host.check(["echo", "included"]).stdout == b"included\n"


@pytest.mark.parametrize(("setting", "accepted"), [("accept-new", True), ("yes", False)])
def test_strict_host_key_checking_decides_about_a_new_key(
    sshd: Sshd, tmp_path: Path, setting: str, accepted: bool
) -> None:
    known = tmp_path / "known_hosts"
    known.touch()
    config = tmp_path / "config"
    config.write_text(alias(sshd, known, f"  StrictHostKeyChecking {setting}\n"))
    host = SSHHost("gpu-box", SSHOptions(ssh_config=str(config)))
    if accepted:
        with host:
            host.check(["true"])
        assert sshd.host_public_key in known.read_text()
    else:
        with pytest.raises(HostKeyUnknownError):
            host.check(["true"])
        assert known.read_text() == ""


def test_a_changed_key_is_refused_whatever_the_config_says_with_the_exact_fix(
    sshd: Sshd, tmp_path: Path
) -> None:
    known, other = known_hosts_with_another_key(sshd, tmp_path)
    config = tmp_path / "config"
    config.write_text(alias(sshd, known, "  StrictHostKeyChecking no\n"))
    with pytest.raises(HostKeyChangedError) as refused:
        SSHHost("gpu-box", SSHOptions(ssh_config=str(config))).check(["true"])
    fix = f"ssh-keygen -f {known} -R '[127.0.0.1]:{sshd.port}'"
    assert fix in str(refused.value)
    subprocess.run(fix, shell=True, check=True, capture_output=True)  # the fix works as given
    assert other not in known.read_text()


def test_match_exec_runs_its_command(sshd: Sshd, tmp_path: Path) -> None:
    # A fresh interpreter, as a user's run is: a `Match exec` line runs its command (paramiko
    # does it through invoke) and the block it guards applies.
    config = tmp_path / "config"
    config.write_text(
        f'Match exec "test -e {tmp_path}"\n' + alias(sshd, sshd.known_hosts).split("\n", 1)[1]
    )
    script = (
        "from proxgpu.host.ssh import SSHHost, SSHOptions\n"
        f"with SSHHost('any-name', SSHOptions(ssh_config={str(config)!r})) as host:\n"
        "    out = host.check(['echo', 'matched']).stdout.decode().strip()\n"
        "print(out)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout == "matched\n"
