"""SSH as strict as OpenSSH: proxgpu's SSH client (paramiko) agrees only on what OpenSSH 9's
defaults allow, expands ``%p`` to the port it uses, reports a jump host's refusal as exit 4 and
prints one line, never a library traceback.

Each case starts a real sshd on loopback (``tests/support/hostile_sshd.py``) that offers only what
an outdated or hostile host would, and checks the exact refusal and that nothing outside the
scratch folder changed.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.errors import AuthenticationError, HostUnreachableError
from proxgpu.host.paramikoconf import OPENSSH_DEFAULTS
from proxgpu.host.ssh import SSHHost
from tests.support.hostile_scratch import Scratch, make_scratch
from tests.support.hostile_sshd import offering, relay_command
from tests.support.sshd import SSHD, client_options, keygen
from tests.support.tools import require_tool
from tests.support.trees import REPO

pytestmark = pytest.mark.sshd


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Scratch]:
    """The case's scratch folder (with sshd present); afterwards, proof that nothing outside
    it changed."""
    require_tool(SSHD, "openssh-server")
    made = make_scratch(tmp_path)
    yield made
    made.assert_untouched()


# (what the server offers alone, its host key type, the refusal paramiko reports)
WEAK = [
    ("Ciphers 3des-cbc", "ed25519", "Incompatible ssh server (no acceptable ciphers)"),
    ("Ciphers aes128-cbc", "ed25519", "Incompatible ssh server (no acceptable ciphers)"),
    ("MACs hmac-md5", "ed25519", "Incompatible ssh server (no acceptable macs)"),
    ("MACs hmac-sha1-96", "ed25519", "Incompatible ssh server (no acceptable macs)"),
    (
        "KexAlgorithms diffie-hellman-group1-sha1",
        "ed25519",
        "Incompatible ssh peer (no acceptable kex algorithm)",
    ),
    (
        "KexAlgorithms diffie-hellman-group14-sha1",
        "ed25519",
        "Incompatible ssh peer (no acceptable kex algorithm)",
    ),
    ("HostKeyAlgorithms ssh-rsa", "rsa", "Incompatible ssh peer (no acceptable host key)"),
    ("HostKeyAlgorithms ssh-dss", "dsa", "Incompatible ssh peer (no acceptable host key)"),
]


@pytest.mark.parametrize(("offer", "key", "refusal"), WEAK, ids=[w[0] for w in WEAK])
def test_a_server_offering_only_what_openssh_dropped_is_refused(
    scratch: Scratch, offer: str, key: str, refusal: str
) -> None:
    with offering(scratch.root / "sshd", offer, key) as server:
        host = SSHHost(server.target, client_options(server, scratch.root))
        with pytest.raises(HostUnreachableError) as caught:
            host.run(["touch", str(scratch.canary)])
        host.close()
    assert str(caught.value) == f"[127.0.0.1]:{server.port}: cannot connect: {refusal}"
    assert caught.value.exit_code == 3


def test_a_default_server_agrees_on_algorithms_openssh_allows(scratch: Scratch) -> None:
    """The control: OpenSSH's own defaults connect, on algorithms of its default lists."""
    with offering(scratch.root / "sshd", "") as server:
        host = SSHHost(server.target, client_options(server, scratch.root))
        assert host.run(["echo", "ok"]).stdout == b"ok\n"
        transport = host._client().get_transport()
        assert transport is not None
        agreed = (transport.local_cipher, transport.local_mac, transport.host_key_type)
        host.close()
    cipher, mac, key = agreed
    assert cipher in OPENSSH_DEFAULTS["ciphers"]
    assert mac in OPENSSH_DEFAULTS["macs"]
    assert key in OPENSSH_DEFAULTS["keys"]


def test_a_refused_handshake_prints_one_line_and_no_traceback(scratch: Scratch) -> None:
    """paramiko logs a failed negotiation with its traceback from its own thread; the terminal
    gets proxgpu's one line and exit 3."""
    with offering(scratch.root / "sshd", "Ciphers 3des-cbc") as server:
        options = client_options(server, scratch.root)
        ran = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxgpu",
                "inspect",
                "--host",
                server.target,
                "-i",
                str(options.identity_file),
                "--known-hosts",
                str(options.known_hosts),
                "--ssh-config",
                str(options.ssh_config),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
            check=False,
        )
    assert ran.returncode == 3
    assert "Traceback" not in ran.stderr and "paramiko" not in ran.stderr, ran.stderr
    assert ran.stderr.splitlines() == [
        f"proxgpu: [127.0.0.1]:{server.port}: cannot connect: "
        "Incompatible ssh server (no acceptable ciphers)"
    ]


def test_percent_p_in_proxycommand_is_the_port_used(scratch: Scratch) -> None:
    """ssh_config names port 1 (closed) and ``--port`` the server's: OpenSSH's ``%p`` is the
    port it connects to, so the relay must be given the server's port, or nothing answers."""
    with offering(scratch.root / "sshd", "") as server:
        proxy, log = relay_command(scratch.root)
        config = scratch.root / "ssh_config"
        config.write_text(f"Host pve1\n  HostName 127.0.0.1\n  Port 1\n  {proxy}\n")
        options = client_options(server, scratch.root, port=server.port, ssh_config=str(config))
        host = SSHHost(f"{server.user}@pve1", options)
        assert host.run(["echo", "ok"]).stdout == b"ok\n"
        host.close()
        # The same port given as HOST:PORT instead of --port.
        via_target = SSHHost(f"{server.user}@pve1:{server.port}", replace(options, port=None))
        assert via_target.run(["echo", "ok"]).stdout == b"ok\n"
        via_target.close()
    assert log.read_text() == f"127.0.0.1 {server.port}\n" * 2


def test_a_jump_host_that_refuses_the_key_is_exit_4_naming_the_jump(
    scratch: Scratch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The jump host takes only its own authorized key; the ssh_config gives the jump another
    key: the refusal is the jump's authentication (exit 4), not an unreachable host."""
    with offering(scratch.root / "jump", "") as jump, offering(scratch.root / "dest", "") as dest:
        keygen(scratch.root / "other_key")
        known = scratch.root / "known_hosts"
        known.write_text(jump.known_hosts.read_text() + dest.known_hosts.read_text())
        config = scratch.root / "ssh_config"
        config.write_text(
            f"Host jump\n  HostName 127.0.0.1\n  Port {jump.port}\n  User {jump.user}\n"
            f"  IdentityFile {scratch.root / 'other_key'}\n  IdentitiesOnly yes\n"
            f"Host dest\n  HostName 127.0.0.1\n  Port {dest.port}\n  ProxyJump jump\n"
        )
        code = main(
            [
                "inspect",
                "--host",
                f"{dest.user}@dest",
                "-i",
                str(dest.identity_file),
                "--known-hosts",
                str(known),
                "--ssh-config",
                str(config),
            ]
        )
    err = capsys.readouterr().err
    assert code == AuthenticationError.exit_code == 4, err
    assert f"proxgpu: [127.0.0.1]:{jump.port}: authentication as {jump.user} failed" in err
    assert "Traceback" not in err
