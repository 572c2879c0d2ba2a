"""Both SSH transports (paramiko and the system's OpenSSH ``ssh``) against the same real sshd on
loopback: the same commands, the same host-key verdicts, the same exit codes and bounds."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

from proxgpu.cli import main
from proxgpu.errors import (
    AuthenticationError,
    CommandOutputTooLargeError,
    CommandTimeoutError,
    HostKeyChangedError,
    HostKeyRevokedError,
    HostKeyUnknownError,
    HostUnreachableError,
    KnownHostsDamagedError,
    UsageError,
)
from proxgpu.host import connect
from proxgpu.host.base import Host
from proxgpu.host.local import process_running
from proxgpu.host.openssh import OpenSSHHost
from proxgpu.host.scripts import run_script
from proxgpu.host.ssh import SSHHost, SSHOptions
from proxgpu.host.sshcommon import parse_target
from proxgpu.inspection import inspect
from tests.support.sshd import (
    Sshd,
    client_options,
    free_port,
    keygen,
    known_hosts_with_another_key,
    running_sshd,
    sign,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.sshd

Open = Callable[[str, SSHOptions], Host]
TRANSPORTS = {"paramiko": SSHHost, "openssh": OpenSSHHost}


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request: pytest.FixtureRequest) -> Iterator[Open]:
    """Opens hosts over one transport (each test runs over both); closes them afterwards."""
    opened: list[Host] = []

    def open_host(target: str, options: SSHOptions) -> Host:
        opened.append(TRANSPORTS[request.param](target, options))
        return opened[-1]

    yield open_host
    for host in opened:
        host.close()


@pytest.fixture(scope="module")
def cert_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """An sshd whose host key a CA has certified, and which accepts that CA's user certificates."""
    with running_sshd(tmp_path_factory.mktemp("cert-sshd"), certificates=True) as server:
        yield server


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts TCP connections (the kernel's backlog) and never says a
    word: a hung sshd, or something else on port 22."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield int(listener.getsockname()[1])


def test_commands_keep_their_arguments_input_and_status(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    host = transport(sshd.target, client_options(sshd, tmp_path))
    tricky = ["printf", "%s|", "a b", "it's", "$HOME", "; rm -rf /", ""]
    assert host.run(tricky).stdout == b"a b|it's|$HOME|; rm -rf /||"
    assert host.run(["cat"], stdin=b"x" * 300_000).stdout == b"x" * 300_000
    failed = host.run(["sh", "-c", "echo oops >&2; exit 255"])
    assert (failed.returncode, failed.stderr) == (255, b"oops\n")


def test_a_bulk_script_answers_whole_with_its_status(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    host = transport(sshd.target, client_options(sshd, tmp_path))
    answer = run_script(host, "gather", str(tmp_path / "missing"), check=False, bulk=True)
    assert (answer.returncode, answer.records[-2].kind, answer.records[-1].kind) == (
        3,
        "error",
        "end",
    )
    inventory = inspect(transport(sshd.target, client_options(sshd, tmp_path)))
    assert inventory.hostname == socket.gethostname()


def test_the_openssh_transport_never_loads_paramiko(sshd: Sshd, tmp_path: Path) -> None:
    # A fresh interpreter running the whole command: paramiko takes longer to import than the
    # OpenSSH transport's handshake, which needs none of it.
    config = tmp_path / "ssh_config"
    config.touch()
    argv = ["inspect", "--host", sshd.target, "-i", str(sshd.identity_file), "--ssh-client"]
    argv += ["openssh", "--known-hosts", str(sshd.known_hosts), "--ssh-config", str(config)]
    script = (
        "import sys\n"
        "from proxgpu.cli import main\n"
        f"code = main({[*argv, '--json']!r})\n"
        "print(code, 'paramiko' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stderr.split()[-2:] == ["0", "False"]


def test_unknown_host_key_is_refused_with_its_fingerprint(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.touch()
    host = transport(sshd.target, client_options(sshd, tmp_path, known_hosts=str(empty)))
    with pytest.raises(HostKeyUnknownError) as err:
        host.run(["true"])
    assert err.value.fingerprint == _fingerprint(sshd.workdir / "host_key.pub")
    assert err.value.fingerprint in str(err.value) and "--accept-new-host-key" in str(err.value)
    assert empty.read_text() == "", "an unknown key must not be recorded without consent"


def test_a_new_key_accepted_is_recorded_and_then_verified(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    options = client_options(sshd, tmp_path, known_hosts=str(known), accept_new_host_key=True)
    transport(sshd.target, options).check(["true"])
    assert sshd.host_public_key in known.read_text()
    again = transport(sshd.target, replace(options, accept_new_host_key=False))
    assert again.check(["echo", "ok"]).stdout == b"ok\n"


def test_a_changed_key_is_refused_even_when_accepting_new_keys(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    known, _ = known_hosts_with_another_key(sshd, tmp_path)
    options = client_options(sshd, tmp_path, known_hosts=str(known), accept_new_host_key=True)
    with pytest.raises(HostKeyChangedError, match=f"ssh-keygen -f {known} -R"):
        transport(sshd.target, options).run(["true"])


def test_a_revoked_key_is_refused_though_known_hosts_also_holds_it(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    name = f"[127.0.0.1]:{sshd.port}"
    known.write_text(f"{name} {sshd.host_public_key}\n@revoked {name} {sshd.host_public_key}\n")
    with pytest.raises(HostKeyRevokedError, match="revoked"):
        transport(sshd.target, client_options(sshd, tmp_path, known_hosts=str(known))).run(["true"])


@pytest.mark.parametrize(
    "damage",
    ["[127.0.0.1]:1 ssh-ed25519", "x ssh-ed25519 not-base64!", "@trusted x ssh-ed25519 AAAA"],
)
def test_a_damaged_known_hosts_line_is_named_by_file_and_line(
    transport: Open, sshd: Sshd, tmp_path: Path, damage: str
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"# ours\n{damage}\n{sshd.known_hosts.read_text()}")
    with pytest.raises(KnownHostsDamagedError) as err:
        transport(sshd.target, client_options(sshd, tmp_path, known_hosts=str(known))).run(["true"])
    assert err.value.exit_code == 5
    assert str(err.value).startswith(f"{known}:2: damaged known_hosts line")


def test_a_hashed_name_is_found(transport: Open, sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts.read_text())
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    assert known.read_text().startswith("|1|")
    host = transport(sshd.target, client_options(sshd, tmp_path, known_hosts=str(known)))
    assert host.check(["echo", "hashed"]).stdout == b"hashed\n"


def test_the_global_and_every_user_known_hosts_file_are_read(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    (tmp_path / "empty").touch()
    global_known = tmp_path / "global"
    global_known.write_text(sshd.known_hosts.read_text())
    options = client_options(sshd, tmp_path, global_known_hosts=str(global_known))
    in_global = transport(sshd.target, replace(options, known_hosts=str(tmp_path / "empty")))
    assert in_global.check(["echo", "global"]).stdout == b"global\n"
    config = tmp_path / "config"
    config.write_text(f"UserKnownHostsFile {tmp_path}/empty {sshd.known_hosts}\n")
    second = replace(options, known_hosts=None, global_known_hosts=None, ssh_config=str(config))
    assert transport(sshd.target, second).check(["echo", "second"]).stdout == b"second\n"


def test_proxy_jump_tunnels_through_the_jump_host(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    common = (
        f"  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.identity_file}\n  UserKnownHostsFile {sshd.known_hosts}\n"
        f"  GlobalKnownHostsFile {tmp_path}/none\n"
    )
    config.write_text(f"Host jump\n{common}\nHost target\n{common}  ProxyJump jump\n")
    host = transport("target", SSHOptions(ssh_config=str(config)))
    # Through the jump host, the target sees the connection come from 127.0.0.1 (the jump host
    # itself), as a second hop.
    assert host.check(["sh", "-c", "echo ${SSH_CONNECTION%% *}"]).stdout == b"127.0.0.1\n"


def test_keys_from_ssh_agent(
    transport: Open, sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(sshd.identity_file)], env=env, check=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        options = _without_default_keys(sshd, tmp_path, monkeypatch)
        assert transport(sshd.target, options).check(["echo", "agent"]).stdout == b"agent\n"
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_a_refused_key_is_an_authentication_failure(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    keygen(tmp_path / "stranger")
    options = client_options(sshd, tmp_path, identity_file=str(tmp_path / "stranger"))
    with pytest.raises(AuthenticationError, match="authentication"):
        transport(sshd.target, options).run(["true"])


def test_a_closed_port_is_refused(transport: Open, sshd: Sshd, tmp_path: Path) -> None:
    host = transport(f"127.0.0.1:{free_port()}", client_options(sshd, tmp_path))
    with pytest.raises(HostUnreachableError, match="connection refused"):
        host.run(["true"])


def test_a_port_that_never_sends_a_banner_says_so_within_the_timeout(
    transport: Open, sshd: Sshd, tmp_path: Path, silent_port: int
) -> None:
    host = transport(f"127.0.0.1:{silent_port}", client_options(sshd, tmp_path, connect_timeout=2))
    started = time.monotonic()
    with pytest.raises(HostUnreachableError, match="banner"):
        host.run(["true"])
    assert time.monotonic() - started < 6


def test_ssh_configs_connect_timeout_applies(
    transport: Open, sshd: Sshd, tmp_path: Path, silent_port: int
) -> None:
    config = tmp_path / "config"
    config.write_text("ConnectTimeout 1\n")
    options = client_options(sshd, tmp_path, connect_timeout=None, ssh_config=str(config))
    started = time.monotonic()
    with pytest.raises(HostUnreachableError):
        transport(f"127.0.0.1:{silent_port}", options).run(["true"])
    assert time.monotonic() - started < 4, "ConnectTimeout 1, not the default 10"


def test_a_command_is_bounded_in_time_and_output(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    host = transport(sshd.target, client_options(sshd, tmp_path))
    host.max_output = 1 << 20
    with pytest.raises(CommandOutputTooLargeError):
        host.run(["head", "-c", "3000000", "/dev/zero"])
    started = time.monotonic()
    with pytest.raises(CommandTimeoutError):
        host.run(["sh", "-c", "while :; do echo .; sleep 0.2; done"], timeout=1)
    assert time.monotonic() - started < 3
    assert host.check(["echo", "still"]).stdout == b"still\n", "the connection outlives both"


def test_the_connection_outlives_hundreds_of_commands_stopped_at_the_limit(
    sshd: Sshd, tmp_path: Path
) -> None:
    # Each stop closes a channel while the server is still streaming into it. paramiko's own
    # pipe behind select() raced that close and took the connection down in about 1 of 100
    # stops (3 of 300 measured), so 300 stops would almost surely catch it coming back.
    host = SSHHost(sshd.target, client_options(sshd, tmp_path))
    host.max_output = 1 << 20
    try:
        for stop in range(300):
            with pytest.raises(CommandOutputTooLargeError):
                host.run(["head", "-c", "30000000", "/dev/zero"])
            assert host.run(["echo", "ok"]).stdout == b"ok\n", f"lost after stop {stop + 1}"
    finally:
        host.close()


def test_a_connection_lost_during_a_command_is_said_so(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    """The server's process for this connection is killed while a command runs: the command
    fails as a lost connection, not as a command that exited 255."""
    host = transport(sshd.target, client_options(sshd, tmp_path))
    server = int(host.check(["sh", "-c", "echo $PPID"]).stdout)
    threading.Timer(0.5, os.kill, (server, signal.SIGKILL)).start()
    with pytest.raises(HostUnreachableError, match="connection lost while running sleep"):
        host.run(["sleep", "5"])


def test_a_command_killed_by_a_signal_fails_on_a_connection_that_stays(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    host = transport(sshd.target, client_options(sshd, tmp_path))
    killed = host.run(["sh", "-c", "kill -9 $$"])
    assert not killed.ok
    assert host.check(["echo", "still"]).stdout == b"still\n"


def test_a_command_that_exits_255_is_its_status_not_a_lost_connection(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    """ssh exits 255 for its own failures too: a command's own 255 is still the command's."""
    host = transport(sshd.target, client_options(sshd, tmp_path))
    done = host.run(["sh", "-c", "echo out; echo err >&2; exit 255"])
    assert (done.returncode, done.stdout, done.stderr) == (255, b"out\n", b"err\n")
    assert host.check(["echo", "still"]).stdout == b"still\n"


def test_a_session_the_server_refuses_is_said_with_its_words(tmp_path: Path) -> None:
    """sshd takes one command at a time on a connection (MaxSessions 1): a second one, while
    the first runs, is refused by the server, and the OpenSSH master passes its words on."""
    (tmp_path / "server").mkdir()
    with running_sshd(tmp_path / "server", max_sessions=1) as server:
        host = OpenSSHHost(server.target, client_options(server, tmp_path))
        try:
            said: list[bytes] = []
            assert wait_for(lambda: _ran_in_a_free_session(host, ["true"], said))
            before = sorted(os.listdir("/proc/self/fd"))
            # The first command holds its session until the test lets it go (a line into the
            # FIFO): the second is asked for once the first is known to run, however loaded
            # the machine is.
            started, release = tmp_path / "started", tmp_path / "release"
            os.mkfifo(release)
            holds = ["sh", "-c", f"touch {started} && read line < {release}"]
            first = threading.Thread(
                target=wait_for, args=(lambda: _ran_in_a_free_session(host, holds, said),)
            )
            first.start()
            assert wait_for(started.exists), "the first command started"
            with pytest.raises(HostUnreachableError, match=r"cannot run echo: .*refused"):
                host.run(["echo", "second"])
            release.write_text("go\n")
            first.join()
            assert sorted(os.listdir("/proc/self/fd")) == before, "no descriptor left open"
            assert wait_for(lambda: _ran_in_a_free_session(host, ["echo", "after"], said))
            assert said[-1] == b"after\n"
        finally:
            host.close()


def _ran_in_a_free_session(host: OpenSSHHost, argv: list[str], said: list[bytes]) -> bool:
    """Run ``argv`` and keep its output in ``said``; False if the server refused its session.

    sshd frees a session a moment after the client has the command's exit status, so under
    MaxSessions 1 the next session, asked for in that moment, may be refused: the caller asks
    again until it runs.
    """
    try:
        said.append(host.check(argv).stdout)
    except HostUnreachableError as error:
        if "refused" not in str(error):
            raise
        return False
    return True


def test_openssh_shares_one_private_connection_and_closes_it(sshd: Sshd, tmp_path: Path) -> None:
    host = OpenSSHHost(sshd.target, client_options(sshd, tmp_path))
    ports = {host.check(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[1] for _ in range(3)}
    assert len(ports) == 1, "three commands, one TCP connection (one handshake)"
    folder = Path(str(host._folder))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    host.close()
    assert not folder.exists()
    check = subprocess.run(["pgrep", "-f", str(folder)], capture_output=True, check=False)
    assert check.returncode == 1, "no master ssh left running"


def test_openssh_says_a_master_gone_between_two_commands_is_a_lost_connection(
    sshd: Sshd, tmp_path: Path
) -> None:
    """The master ends between two commands: the next one fails as a connection lost before
    it ran, not as a command that exited 255."""
    host = OpenSSHHost(sshd.target, client_options(sshd, tmp_path))
    try:
        assert host.check(["true"]).ok
        assert host._master is not None
        master = host._master.pid
        os.kill(master, signal.SIGKILL)
        assert wait_for(lambda: not process_running(master))
        with pytest.raises(HostUnreachableError, match="connection lost before sh"):
            host.check(["sh", "-c", "echo ran"])
    finally:
        host.close()


def test_openssh_ends_a_master_it_has_no_pidfd_of(
    sshd: Sshd, tmp_path: Path, mocker: MockerFixture
) -> None:
    """Where no pidfd can be had (a kernel before 5.3: a test double stands in for its refusal),
    close waits for the master's pid to be gone: no master is left running either way."""
    mocker.patch("proxgpu.host.sshmaster.os.pidfd_open", side_effect=OSError(errno.ENOSYS, "no"))
    host = OpenSSHHost(sshd.target, client_options(sshd, tmp_path))
    assert host.check(["true"]).ok
    folder = str(host._folder)
    host.close()
    check = subprocess.run(["pgrep", "-f", folder], capture_output=True, check=False)
    assert check.returncode == 1, "no master ssh left running"


def test_host_certificates_reach_the_host_through_openssh(
    cert_sshd: Sshd, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    known = tmp_path / "known_hosts"
    ca = (cert_sshd.workdir / "ca.pub").read_text().split()
    known.write_text(f"@cert-authority [127.0.0.1]:{cert_sshd.port} {ca[0]} {ca[1]}\n")
    options = client_options(cert_sshd, tmp_path, known_hosts=str(known))
    caplog.set_level(logging.INFO, "proxgpu")
    with connect(cert_sshd.target, ssh_options=options) as host:
        assert isinstance(host, OpenSSHHost)
        assert host.check(["echo", "certified"]).stdout == b"certified\n"
    assert "SSH through openssh (paramiko cannot use host certificates" in caplog.text
    with pytest.raises(HostKeyUnknownError, match="--ssh-client openssh"):
        SSHHost(cert_sshd.target, options).run(["true"])


def test_a_user_certificate_authenticates_through_openssh(cert_sshd: Sshd, tmp_path: Path) -> None:
    keygen(tmp_path / "certified")  # not in authorized_keys: only its certificate lets it in
    sign(cert_sshd.workdir / "ca", tmp_path / "certified.pub", "me", cert_sshd.user, host=False)
    options = client_options(cert_sshd, tmp_path, identity_file=str(tmp_path / "certified"))
    with connect(cert_sshd.target, ssh_options=options) as host:
        assert isinstance(host, OpenSSHHost)
        assert host.check(["echo", "user-cert"]).stdout == b"user-cert\n"


def test_plain_hosts_stay_on_paramiko_unless_asked(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = client_options(sshd, tmp_path)
    assert isinstance(connect(sshd.target, ssh_options=options), SSHHost)
    monkeypatch.setenv("PROXGPU_SSH_CLIENT", "openssh")
    assert isinstance(connect(sshd.target, ssh_options=options), OpenSSHHost)
    monkeypatch.setenv("PROXGPU_SSH_CLIENT", "putty")
    with pytest.raises(UsageError, match="PROXGPU_SSH_CLIENT: 'putty' is not one of"):
        connect(sshd.target, ssh_options=options)


@pytest.mark.parametrize("name", ["-oProxyCommand=touch x", "a b", "pve1;id", "$(id)", "-p22"])
def test_a_host_name_that_could_be_an_option_or_a_shell_word_is_refused(name: str) -> None:
    with pytest.raises(UsageError, match="is not a host"):
        parse_target(name)


@pytest.mark.parametrize("client", ["openssh", "paramiko"])
def test_cli_exit_codes_and_one_line_errors_over_each_client(
    client: str, sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ssh_config").touch()
    (tmp_path / "unknown").touch()
    keygen(tmp_path / "wrong")
    base = ["inspect", "--ssh-config", str(tmp_path / "ssh_config"), "--ssh-client", client]
    known = ["--known-hosts", str(sshd.known_hosts)]
    cases = [
        ([*base, "-i", str(tmp_path / "wrong"), *known, "--host", sshd.target], 4),
        (
            [
                *base,
                "-i",
                str(sshd.identity_file),
                "--known-hosts",
                str(tmp_path / "unknown"),
                "--host",
                sshd.target,
            ],
            5,
        ),
        ([*base, "-i", str(sshd.identity_file), *known, "--host", f"127.0.0.1:{free_port()}"], 3),
    ]
    for argv, code in cases:
        assert main(argv) == code
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err


def _without_default_keys(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> SSHOptions:
    """Options with no key file at all, whatever this machine's ~/.ssh holds: ssh skips its
    default key files once ssh_config names one (here a missing one); paramiko looks in $HOME."""
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "no_keys_config"
    config.write_text(f"IdentityFile {tmp_path}/absent\n")
    return client_options(sshd, tmp_path, identity_file=None, ssh_config=str(config))


def _fingerprint(public_key: Path) -> str:
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(public_key)], capture_output=True, text=True, check=True
    )
    return listed.stdout.split()[1]


def test_no_key_at_all_says_how_to_give_one(
    transport: Open, sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    options = _without_default_keys(sshd, tmp_path, monkeypatch)
    with pytest.raises(AuthenticationError, match="no key to offer") as err:
        transport(sshd.target, options).run(["true"])
    assert err.value.exit_code == 4 and "-i/--identity" in str(err.value)


def test_hostname_tokens_and_connection_attempts_from_ssh_config(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    config.write_text(
        f"Host 1\n  HostName 127.0.0.%h\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.identity_file}\n  UserKnownHostsFile {sshd.known_hosts}\n"
        f"  GlobalKnownHostsFile {tmp_path}/none\n  ServerAliveInterval 5\n  IdentitiesOnly yes\n"
        f"Host closed\n  HostName 127.0.0.1\n  Port {free_port()}\n  ConnectionAttempts 2\n"
    )
    host = transport("1", SSHOptions(ssh_config=str(config)))
    assert (
        host.check(["sh", "-c", "echo ${SSH_CONNECTION##* }"]).stdout == f"{sshd.port}\n".encode()
    )
    started = time.monotonic()
    with pytest.raises(HostUnreachableError, match="connection refused"):
        transport("closed", SSHOptions(ssh_config=str(config))).run(["true"])
    assert time.monotonic() - started >= 1, "two attempts, a second apart"


def test_a_known_hosts_file_whose_name_has_a_blank_is_read_whole(
    sshd: Sshd, tmp_path: Path
) -> None:
    known = tmp_path / "a b" / "known_hosts"
    known.parent.mkdir()
    known.write_text(f"x ssh-ed25519 not-base64!\n{sshd.known_hosts.read_text()}")
    host = OpenSSHHost(sshd.target, client_options(sshd, tmp_path, known_hosts=str(known)))
    with pytest.raises(KnownHostsDamagedError, match=f"^{known}:1: "):
        host.run(["true"])


def test_input_the_remote_never_reads_does_not_hold_the_command_past_its_timeout(
    transport: Open, sshd: Sshd, tmp_path: Path
) -> None:
    host = transport(sshd.target, client_options(sshd, tmp_path))
    host.check(["true"])
    started = time.monotonic()
    with pytest.raises(CommandTimeoutError):
        host.run(["sleep", "8"], stdin=b"x" * 20_000_000, timeout=1)
    assert time.monotonic() - started < 4


def test_a_master_that_times_out_leaves_no_proxy_command_running(
    sshd: Sshd, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    # A proxy that speaks the banner and then nothing: ssh waits for the key exchange for ever.
    proxy = f"sh -c 'echo SSH-2.0-OpenSSH_9.2; sleep 60; : {tmp_path}'"
    config.write_text(f"Host stuck\n  ProxyCommand {proxy}\n  ConnectTimeout 1\n")
    host = OpenSSHHost(
        "stuck", client_options(sshd, tmp_path, connect_timeout=None, ssh_config=str(config))
    )
    with pytest.raises(HostUnreachableError, match="no answer"):
        host.run(["true"])

    def proxy_gone() -> bool:
        left = subprocess.run(["pgrep", "-f", f": {tmp_path}"], capture_output=True, check=False)
        return left.returncode == 1

    assert wait_for(proxy_gone), "the proxy command ended with ssh"


def test_a_jump_hosts_unknown_key_is_a_host_key_failure(sshd: Sshd, tmp_path: Path) -> None:
    config = tmp_path / "config"
    (tmp_path / "empty").touch()
    common = (
        f"  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.identity_file}\n  GlobalKnownHostsFile {tmp_path}/none\n"
        "  BatchMode yes\n  StrictHostKeyChecking yes\n"
    )
    config.write_text(
        f"Host jump\n{common}  UserKnownHostsFile {tmp_path}/empty\n\n"
        f"Host target\n{common}  UserKnownHostsFile {sshd.known_hosts}\n  ProxyJump jump\n"
    )
    with pytest.raises(HostKeyUnknownError) as err:
        OpenSSHHost("target", SSHOptions(ssh_config=str(config))).run(["true"])
    assert err.value.exit_code == 5


def test_two_threads_opening_one_host_start_one_master(
    sshd: Sshd, tmp_path: Path, mocker: MockerFixture
) -> None:
    host = OpenSSHHost(sshd.target, client_options(sshd, tmp_path))
    masters = mocker.spy(host, "_spawn_master")
    gate = threading.Barrier(2)

    def first_command() -> None:
        gate.wait()
        host.check(["true"])

    threads = [threading.Thread(target=first_command) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    host.close()
    assert masters.call_count == 1


def test_auto_runs_no_match_exec_command_on_the_way_to_ssh(sshd: Sshd, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    config = tmp_path / "config"
    config.write_text(f'Match exec "echo x >> {ran}"\n  User {sshd.user}\n')
    options = client_options(sshd, tmp_path, ssh_config=str(config), client="auto")
    assert isinstance(connect(sshd.target, ssh_options=options), OpenSSHHost)
    assert not ran.exists(), "ssh runs Match exec itself when it connects; auto must not"


def test_revoked_by_a_revoked_host_keys_file_and_not_by_a_name(sshd: Sshd, tmp_path: Path) -> None:
    krl = tmp_path / "revoked.krl"
    subprocess.run(
        ["ssh-keygen", "-q", "-k", "-f", str(krl), str(sshd.workdir / "host_key.pub")], check=True
    )
    config = tmp_path / "config"
    # A proxy that fails saying the host's name, as ssh says an alias that does not resolve.
    config.write_text(
        f"RevokedHostKeys {krl}\n"
        "Host revoked-gw\n  ProxyCommand sh -c 'echo revoked-gw: no route >&2; exit 1'\n"
    )
    options = client_options(sshd, tmp_path, ssh_config=str(config))
    with pytest.raises(HostKeyRevokedError):
        OpenSSHHost(sshd.target, options).run(["true"])
    with pytest.raises(HostUnreachableError):
        OpenSSHHost("revoked-gw", options).run(["true"])


@pytest.fixture
def short_home() -> Iterator[Path]:
    """A home folder whose path leaves room for a control socket's (pytest's are too long)."""
    home = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))
    yield home
    shutil.rmtree(home)


def test_the_control_folder_is_never_in_a_shared_tmpdir(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short_home: Path
) -> None:
    """In a world-writable TMPDIR without the sticky bit another user could swap the folder
    for one of theirs: the folder goes into a directory only this user can change."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("TMPDIR", str(shared))
    home = short_home
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    tempfile.tempdir = None  # tempfile reads TMPDIR once; let it read this one
    try:
        host = OpenSSHHost(sshd.target, client_options(sshd, tmp_path))
        assert host.check(["true"]).ok
        folder = Path(str(host._folder))
        parent = home / ".cache/proxgpu/ssh"
        assert folder.parent == parent and not list(shared.iterdir())
        assert stat.S_IMODE(parent.stat().st_mode) == 0o700
        host.close()
        parent.chmod(0o777)
        with pytest.raises(UsageError, match=r"ssh: not a directory only you can change"):
            OpenSSHHost(sshd.target, client_options(sshd, tmp_path)).check(["true"])
    finally:
        tempfile.tempdir = None


def test_a_proxgpu_killed_with_its_master_up_leaves_it_only_until_the_next_run(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short_home: Path
) -> None:
    """kill -9 runs no close: the next run ends the master it left (which ControlPersist
    would keep for 600 s) and removes its folder."""
    monkeypatch.setenv("HOME", str(short_home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    options = client_options(sshd, tmp_path)
    script = (
        "import sys\n"
        "from proxgpu.host.openssh import OpenSSHHost\n"
        "from proxgpu.host.ssh import SSHOptions\n"
        f"host = OpenSSHHost({sshd.target!r}, SSHOptions(**{asdict(options)!r}))\n"
        "host.check(['true'])\n"
        "print(host._folder, flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    folder = child.stdout.readline().strip()
    assert folder and os.path.isdir(folder)
    child.kill()
    child.wait()
    left = subprocess.run(["pgrep", "-f", folder], capture_output=True, check=False)
    assert left.returncode == 0, "the master outlived proxgpu"
    host = OpenSSHHost(sshd.target, options)
    try:
        assert host.check(["true"]).ok
        assert not os.path.exists(folder)
        assert wait_for(
            lambda: subprocess.run(["pgrep", "-f", folder], check=False).returncode == 1
        ), "the master it left is ended"
    finally:
        host.close()
