"""The host a command names (``--host`` over SSH, ``--root`` as a directory), opened early.

Connecting over SSH is mostly waiting for the host, and importing a command's modules (pydantic,
Jinja2, the planner) takes about as long, so :func:`open_early` starts the connection on its own
thread before the CLI imports the command, and the command's :func:`open_host` takes that host.

>>> from proxgpu.cli.commandline import CommandLine
>>> line = CommandLine(command="inspect", root="examples/hosts/ct200")
>>> open_early(line)
>>> open_host(line).name
'dir:examples/hosts/ct200'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxgpu.cli.commandline import CommandLine
from proxgpu.host import connect
from proxgpu.host.base import Host

if TYPE_CHECKING:
    from proxgpu.fleet.engine import Connect, Target


def open_early(line: CommandLine) -> None:
    """Start connecting to the command's SSH host, if it names one, for :func:`open_host`."""
    if line.host:
        host = _connect(line)
        host.open_in_background()
        line.early.keep((line.host, line.root), host)


def open_host(line: CommandLine) -> Host:
    """The host ``line`` names: the one :func:`open_early` started, else a new one."""
    return line.early.take((line.host, line.root)) or _connect(line)


def close_unused(line: CommandLine) -> None:
    """Close the early host if the command never took it (it stopped before reading the host)."""
    host = line.early.take()
    if host is not None:
        host.close()


def connector(line: CommandLine) -> Connect:
    """Opens each host of a fleet with the SSH options ``line`` gives (``--user``, ``-i``, ...)."""

    def open_target(target: Target) -> Host:
        return connect(target.host, target.root, line.ssh if target.host else None)

    return open_target


def _connect(line: CommandLine) -> Host:
    return connect(line.host, line.root, line.ssh if line.host else None)
