"""SSH access against a real OpenSSH server on 127.0.0.1 (started by the ``sshd`` fixture)."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from proxgpu.apply.transaction import apply_changes
from proxgpu.cli import main
from proxgpu.errors import (
    AuthenticationError,
    HostKeyChangedError,
    HostKeyUnknownError,
    HostUnreachableError,
)
from proxgpu.host.local import DirectoryHost, LocalHost
from proxgpu.host.ssh import SSHHost, SSHOptions
from proxgpu.inspection import inspect
from proxgpu.rendering.changes import Action, ChangeSet, FileChange
from tests.support.sshd import Sshd, client_options, free_port, known_hosts_with_another_key
from tests.support.trees import EXAMPLES

pytestmark = pytest.mark.sshd


def same_inventory(a: dict[str, object], b: dict[str, object]) -> bool:
    return {k: v for k, v in a.items() if k != "source"} == {
        k: v for k, v in b.items() if k != "source"
    }


def test_inspecting_a_tree_over_ssh_equals_inspecting_it_locally(
    sshd: Sshd, tmp_path: Path
) -> None:
    root = str(EXAMPLES / "ct200")
    with SSHHost(sshd.target, client_options(sshd, tmp_path), root=root) as host:
        remote = inspect(host)
        # The gather also checks, in the same run, that no file it read came through a link
        # out of the tree.
        assert host.commands_run == 1, "inspecting a tree is one round trip"
    assert remote.source == sshd.target
    assert same_inventory(asdict(remote), asdict(inspect(DirectoryHost(root))))


def test_inspecting_this_machine_over_ssh_equals_inspecting_it_locally(
    sshd: Sshd, tmp_path: Path
) -> None:
    with SSHHost(sshd.target, client_options(sshd, tmp_path)) as host:
        remote = inspect(host)
    assert same_inventory(asdict(remote), asdict(inspect(LocalHost())))


def test_commands_keep_their_arguments_intact(sshd: Sshd, tmp_path: Path) -> None:
    tricky = ["printf", "%s|", "a b", "it's", "$HOME", "; rm -rf /", ""]
    with SSHHost(sshd.target, client_options(sshd, tmp_path)) as host:
        result = host.run(tricky)
        failed = host.run(["sh", "-c", "echo oops >&2; exit 3"])
    assert result.stdout == b"a b|it's|$HOME|; rm -rf /||"
    assert (failed.returncode, failed.stderr) == (3, b"oops\n")


def test_unknown_host_key_is_refused_with_its_fingerprint(sshd: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.touch()
    with pytest.raises(HostKeyUnknownError) as err:
        inspect(SSHHost(sshd.target, client_options(sshd, tmp_path, known_hosts=str(empty))))
    fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(sshd.workdir / "host_key.pub")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    assert err.value.fingerprint == fingerprint
    assert fingerprint in str(err.value) and "--accept-new-host-key" in str(err.value)
    assert empty.read_text() == "", "an unknown key must not be recorded without consent"


def test_accepting_a_new_host_key_records_it_and_is_then_verified(
    sshd: Sshd, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    with SSHHost(
        sshd.target,
        client_options(sshd, tmp_path, known_hosts=str(known), accept_new_host_key=True),
    ) as host:
        host.check(["true"])
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_public_key}\n"
    with SSHHost(sshd.target, client_options(sshd, tmp_path, known_hosts=str(known))) as host:
        assert host.check(["echo", "ok"]).stdout == b"ok\n"


def test_changed_host_key_is_refused_even_when_accepting_new_keys(
    sshd: Sshd, tmp_path: Path
) -> None:
    known, _ = known_hosts_with_another_key(sshd, tmp_path)
    with pytest.raises(HostKeyChangedError, match=f"ssh-keygen -f {known} -R"):
        inspect(
            SSHHost(
                sshd.target,
                client_options(sshd, tmp_path, known_hosts=str(known), accept_new_host_key=True),
            )
        )


def test_wrong_user_key_fails_authentication_cleanly(sshd: Sshd, tmp_path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")],
        check=True,
    )
    with pytest.raises(AuthenticationError, match=f"authentication as {sshd.user} failed"):
        inspect(
            SSHHost(
                sshd.target,
                client_options(sshd, tmp_path, identity_file=str(tmp_path / "stranger")),
            )
        )


def test_closed_port_is_unreachable(sshd: Sshd, tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(HostUnreachableError, match="connection refused"):
        inspect(SSHHost(f"127.0.0.1:{port}", client_options(sshd, tmp_path)))


def test_ssh_config_alias_supplies_hostname_port_user_and_key(sshd: Sshd, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(
        f"Host gpu-box\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.identity_file}\n  UserKnownHostsFile {sshd.known_hosts}\n"
    )
    with SSHHost("gpu-box", SSHOptions(ssh_config=str(config))) as host:
        assert host.check(["echo", "via-config"]).stdout == b"via-config\n"


def test_proxy_jump_tunnels_through_the_jump_host(sshd: Sshd, tmp_path: Path) -> None:
    config = tmp_path / "config"
    common = (
        f"  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.identity_file}\n"
    )
    config.write_text(f"Host jump\n{common}\nHost target\n{common}  ProxyJump jump\n")
    with SSHHost(
        "target", SSHOptions(ssh_config=str(config), known_hosts=str(sshd.known_hosts))
    ) as host:
        assert host.check(["echo", "tunnelled"]).stdout == b"tunnelled\n"
        assert len(host._clients) == 2, "one connection to the jump host, one through it"


def test_cli_exit_codes_and_one_line_errors(
    sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty_config = tmp_path / "ssh_config"
    empty_config.touch()
    # Each option is given once (a repeat is a usage error), so the key is added per case.
    plain = ["inspect", "--ssh-config", str(empty_config), "--connect-timeout", "5"]
    base = [*plain, "-i", str(sshd.identity_file)]
    unknown = tmp_path / "unknown_hosts"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "wrong")], check=True
    )
    cases = [
        (
            [
                *plain,
                "-i",
                str(tmp_path / "wrong"),
                "--host",
                sshd.target,
                "--known-hosts",
                str(sshd.known_hosts),
            ],
            4,
            "authentication as",
        ),
        ([*base, "--host", sshd.target, "--known-hosts", str(unknown)], 5, "not in"),
        (
            [*base, "--host", f"127.0.0.1:{free_port()}", "--known-hosts", str(sshd.known_hosts)],
            3,
            "connection refused",
        ),
        (
            [
                *base,
                "--host",
                sshd.target,
                "--known-hosts",
                str(sshd.known_hosts),
                "--root",
                "/nonexistent",
            ],
            2,
            "/nonexistent: no such directory",
        ),
    ]
    for argv, code, text in cases:
        assert main(argv) == code
        err = capsys.readouterr().err
        assert text in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_failed_jump_never_leaves_the_jump_host_as_the_target(sshd: Sshd, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(
        f"Host jump\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.identity_file}\n\n"
        f"Host target\n  HostName 127.0.0.1\n  Port {free_port()}\n  ProxyJump jump\n"
    )
    host = SSHHost("target", SSHOptions(ssh_config=str(config), known_hosts=str(sshd.known_hosts)))
    for _ in range(2):
        with pytest.raises(HostUnreachableError, match="jump host cannot reach"):
            host.run(["hostname"])
    assert host._clients == []


def test_a_remote_tree_is_not_the_live_host(sshd: Sshd, tmp_path: Path) -> None:
    """`--host H --root DIR` writes files into DIR and runs no action on H itself."""
    root = tmp_path / "image"
    (root / "etc").mkdir(parents=True)
    changes = ChangeSet(
        host="h",
        files=[FileChange(path="/etc/x.conf", before=None, after="x\n", mode=0o644)],
        actions=[Action(argv=["touch", str(tmp_path / "ran")], why="must not run")],
    )
    with SSHHost(sshd.target, client_options(sshd, tmp_path), root=str(root)) as host:
        assert not host.is_live
        result = apply_changes(host, changes)
    assert (root / "etc/x.conf").read_text() == "x\n"
    assert result.actions_run == [] and not (tmp_path / "ran").exists()


def test_the_servers_cpu_counts_each_connection_it_served(sshd: Sshd, tmp_path: Path) -> None:
    # What the benchmarks read as the server's part: a connection's sshd and its command.
    before = sshd.served_cpu_seconds()
    with SSHHost(sshd.target, client_options(sshd, tmp_path)) as host:
        busy = host.run(["sh", "-c", "i=0; while [ $i -lt 100000 ]; do i=$((i + 1)); done"])
    assert busy.ok
    assert sshd.served_cpu_seconds() - before >= 0.02


def test_paramiko_s_connection_sends_each_packet_at_once(sshd: Sshd, tmp_path: Path) -> None:
    """TCP_NODELAY on the connection: paramiko writes a command's requests as small packets,
    which Nagle's algorithm would hold back for the host's delayed acknowledgement (some 40 ms
    a command)."""
    with SSHHost(sshd.target, client_options(sshd, tmp_path)) as host:
        assert host.check(["true"]).ok
        transport = host._clients[-1].get_transport()
        assert transport is not None and isinstance(transport.sock, socket.socket)
        assert transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
