"""Fixtures of the sshd tier: SSH connections to the ``sshd`` fixture's server on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxgpu.host.ssh import SSHHost
from tests.support.sshd import Sshd, client_options


@pytest.fixture
def ssh_host(sshd: Sshd, tmp_path: Path, root: Path) -> Iterator[Callable[[], SSHHost]]:
    """Opens SSH connections to 127.0.0.1 whose root is the tree; closes them afterwards.

    A remote tree is not a live host; ``live=True`` makes it one so that these tests drive the
    live path (locks, post-actions) into the scratch tree instead of this machine's /.
    """
    opened: list[SSHHost] = []

    def connect() -> SSHHost:
        options = client_options(sshd, tmp_path)
        opened.append(SSHHost(sshd.target, options, root=str(root), live=True))
        return opened[-1]

    yield connect
    for host in opened:
        host.close()
