"""Shared fixtures: the example hosts and a real OpenSSH server on loopback."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sshd import SSHD, Sshd, running_sshd
from tests.support.tools import find_tool

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "hosts"
EXAMPLE_HOSTS = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir())


def require_tool(path: str, package: str) -> str:
    """The full path of a tool (see :func:`find_tool`); else skip, or fail under CI."""
    found = find_tool(path)
    if found:
        return found
    message = f"{path} not found: install Debian's {package}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def copy_example(tmp_path: Path, name: str = "ct200", dest: str | None = None) -> Path:
    """A private copy of an example host, symlinks kept, that a test may change."""
    root = tmp_path / (dest or name)
    shutil.copytree(EXAMPLES / name, root, symlinks=True)
    return root


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
