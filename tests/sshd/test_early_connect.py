"""Connecting in the background while the caller works: SSHHost.open_in_background and the CLI's
early host (proxgpu.cli.hosts), against the real sshd on loopback."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import proxgpu.cli.hosts
from proxgpu.cli import main
from proxgpu.cli.commandline import CommandLine, read
from proxgpu.cli.hosts import close_unused, open_early, open_host
from proxgpu.cli.parser import build_parser
from proxgpu.errors import HostUnreachableError
from proxgpu.host import Host, connect
from proxgpu.host.ssh import SSHHost, SSHOptions
from tests.support.sshd import Sshd, client_options, free_port

pytestmark = pytest.mark.sshd


def test_the_first_command_uses_the_connection_opened_in_the_background(
    sshd: Sshd, tmp_path: Path
) -> None:
    with SSHHost(sshd.target, client_options(sshd, tmp_path)) as host:
        host.open_in_background()
        assert host.check(["echo", "early"]).stdout == b"early\n"
        assert host.check(["echo", "again"]).stdout == b"again\n"
        assert len(host._clients) == 1, "the first command must wait for that connection"
    assert host._clients == []


def test_a_background_failure_is_raised_by_the_first_command_and_then_retried(
    sshd: Sshd, tmp_path: Path
) -> None:
    host = SSHHost(f"127.0.0.1:{free_port()}", client_options(sshd, tmp_path))
    host.open_in_background()  # never raises: there is nobody to tell yet
    for _ in range(2):
        with pytest.raises(HostUnreachableError, match="connection refused"):
            host.run(["true"])
    assert host._clients == []


def test_closing_while_connecting_waits_and_leaves_nothing_open(sshd: Sshd, tmp_path: Path) -> None:
    host = SSHHost(sshd.target, client_options(sshd, tmp_path))
    host.open_in_background()
    host.close()
    assert host._clients == []
    unreachable = SSHHost(f"127.0.0.1:{free_port()}", client_options(sshd, tmp_path))
    unreachable.open_in_background()
    unreachable.close()  # the failure no longer matters once the host is closed


def cli_args(sshd: Sshd, tmp_path: Path, *extra: str) -> list[str]:
    options = client_options(sshd, tmp_path)
    assert options.ssh_config and options.identity_file and options.known_hosts
    return [
        *("--host", sshd.target, "--ssh-config", options.ssh_config),
        *("-i", options.identity_file, "--known-hosts", options.known_hosts),
        *extra,
    ]


def parsed(sshd: Sshd, tmp_path: Path) -> CommandLine:
    """``inspect`` options for the server, read as ``main`` reads them."""
    return read(build_parser().parse_args(["inspect", *cli_args(sshd, tmp_path)]))


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Host]:
    """Every host the CLI opens, through the real ``connect`` (a spy, not a stand-in)."""
    hosts: list[Host] = []

    def spy(host: str | None, root: str | None, options: SSHOptions | None) -> Host:
        hosts.append(connect(host, root, options))
        return hosts[-1]

    monkeypatch.setattr(proxgpu.cli.hosts, "connect", spy)
    return hosts


def test_a_command_takes_the_host_opened_early_and_closes_it(
    sshd: Sshd, tmp_path: Path, opened: list[Host], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", *cli_args(sshd, tmp_path), "--json"]) == 0
    assert '"hostname"' in capsys.readouterr().out
    assert len(opened) == 1, "inspect must read the host over the connection opened early"
    assert isinstance(opened[0], SSHHost) and opened[0]._clients == []


def test_an_early_host_is_handed_out_once_and_closed_when_unused(
    sshd: Sshd, tmp_path: Path, opened: list[Host]
) -> None:
    args = parsed(sshd, tmp_path)
    open_early(args)
    copy = replace(args)
    with open_host(args) as first, open_host(copy) as second:
        assert first is opened[0] and second is opened[1], "a copy must not share the host"
        assert first.check(["echo", "ok"]).ok and second.check(["echo", "ok"]).ok
    unused = parsed(sshd, tmp_path)
    open_early(unused)
    close_unused(unused)
    assert isinstance(opened[2], SSHHost) and opened[2]._clients == []
    assert open_host(unused) is opened[3], "a closed early host is not handed out"
