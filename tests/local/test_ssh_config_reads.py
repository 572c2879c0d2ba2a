"""How an ssh_config is read for many hosts (issue 22, point 6): parsed once per text, looked up
from each host's own thread with that host's port, and without asking the user name at every
Host block (paramiko does, which costs a passwd lookup per block without ``$USER``)."""

from __future__ import annotations

import getpass
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pytest_mock import MockerFixture

from proxgpu.host.paramikoconf import resolved_options
from proxgpu.host.ssh import SSHOptions

HOSTS = 32


def fleet_config(path: Path) -> Path:
    """``HOSTS`` Host blocks, each naming its port in a ProxyCommand through ``%p``, and one Match
    block that needs the local user name."""
    blocks = [
        f"Host gpu{n}\n  HostName 10.0.0.{n}\n  ProxyCommand nc %h %p\n" for n in range(HOSTS)
    ]
    blocks.append(f"Match localuser {getpass.getuser()}\n  ServerAliveInterval 7\n")
    path.write_text("".join(blocks))
    return path


def test_host_blocks_ask_no_user_name_and_match_still_does(
    tmp_path: Path, mocker: MockerFixture
) -> None:
    options = SSHOptions(ssh_config=str(fleet_config(tmp_path / "config")))
    spy = mocker.spy(getpass, "getuser")
    values = resolved_options("gpu3", options)
    assert values["hostname"] == ["10.0.0.3"]
    # The Match block and the %-token expansion ask, a few times a lookup; not each Host block
    # of each lookup pass (paramiko's own way: at least one per block).
    assert 0 < spy.call_count < HOSTS
    assert values["serveraliveinterval"] == ["7"], "the Match block still matches"


def test_each_hosts_port_reaches_its_own_lookup_from_many_threads(tmp_path: Path) -> None:
    config = str(fleet_config(tmp_path / "config"))

    def proxy(n: int) -> str:
        values = resolved_options(f"gpu{n}", SSHOptions(ssh_config=config, port=2000 + n))
        return " ".join(values["proxycommand"])

    with ThreadPoolExecutor(max_workers=8) as pool:
        found = list(pool.map(proxy, [n % HOSTS for n in range(200)]))
    assert found == [f"nc 10.0.0.{n % HOSTS} {2000 + n % HOSTS}" for n in range(200)]


def test_an_edited_config_is_read_again(tmp_path: Path) -> None:
    path = fleet_config(tmp_path / "config")
    options = SSHOptions(ssh_config=str(path))
    assert resolved_options("gpu1", options)["hostname"] == ["10.0.0.1"]
    path.write_text(path.read_text().replace("10.0.0.1\n", "10.9.9.1\n"))
    assert resolved_options("gpu1", options)["hostname"] == ["10.9.9.1"]
