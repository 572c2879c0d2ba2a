"""Faults the tests inject into a host: its connection lost after some number of commands."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from proxgpu.errors import HostUnreachableError
from proxgpu.host.base import Host
from proxgpu.host.ssh import SSHHost


def drop_after(monkeypatch: pytest.MonkeyPatch, host: Host, commands: int) -> None:
    """Make ``host`` lose its connection once it has run ``commands`` commands."""
    real = host.run

    def run(
        argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> object:
        if host.commands_run >= commands:
            if isinstance(host, SSHHost):
                # Kill the real transport: paramiko then fails the command as a network would.
                transport = host._clients[-1].get_transport()
                assert transport is not None
                transport.close()
            else:
                raise HostUnreachableError(host.name, "connection lost")
        return real(argv, stdin=stdin, timeout=timeout)

    monkeypatch.setattr(host, "run", run)
