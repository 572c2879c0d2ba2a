"""Fixtures every tier shares: the example hosts and a real OpenSSH server on loopback.

The tiers are folders; each runs everything the one before it does, and more:

* ``unit``: pure Python on in-memory models and texts, no command run (``pytest tests/unit``
  takes seconds);
* ``local``: runs commands on this machine (``sh``, the host scripts, stand-in tools on PATH)
  against copies of the example hosts in tmp directories, and the CLI in process;
* ``sshd``: a real OpenSSH server on 127.0.0.1 (marker ``sshd``);
* ``integration``: real ansible-playbook, a built and installed wheel, ``python -m proxgpu``;
* ``e2e``: a QEMU test host booting a real kernel (marker ``e2e``, minutes).

Their helpers live in ``tests/support``, shared with ``bench/``. Tests in every tier run
Proxmox VE's own code and test configs, from the sources ``tests/proxmox/sources.toml`` pins.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.proxmox.sources import SourcesUnavailableError, locate
from tests.support.sshd import SSHD, Sshd, running_sshd
from tests.support.tools import require_tool
from tests.support.trees import EXAMPLE_HOSTS, EXAMPLES, copy_example


@pytest.fixture(autouse=True, scope="session")
def _signing_key_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The signing key (``$XDG_CONFIG_HOME/proxgpu/key``) in a folder of the session's own, so
    that no test reads or writes the real one; subprocesses inherit it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
        yield


def pytest_configure(config: pytest.Config) -> None:
    """The whole suite (README's command) stops at once without Proxmox's sources, in one line
    saying how to get them, rather than failing each test that runs their code. A run of named
    files or tests still starts: those of them that need the sources fail with that line."""
    if config.args_source is not pytest.Config.ArgsSource.TESTPATHS:
        return
    try:
        locate()
    except SourcesUnavailableError as error:
        raise pytest.UsageError(str(error)) from None


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A private copy of the ct200 example host."""
    return copy_example(tmp_path, dest="host")


@pytest.fixture(params=EXAMPLE_HOSTS)
def example_host(request: pytest.FixtureRequest) -> Path:
    """Each example host tree in turn."""
    return EXAMPLES / str(request.param)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real OpenSSH server on a free loopback port, with its own host and user keys."""
    require_tool(SSHD, "openssh-server")
    require_tool("ssh-keygen", "openssh-client")
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server
