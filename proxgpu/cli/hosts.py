"""The host a command names (``--host`` over SSH, ``--root`` as a directory), opened early.

Connecting over SSH is mostly waiting for the host, and importing a command's modules (pydantic,
Jinja2, the planner) takes about as long, so :func:`open_early` starts the connection on its own
thread before the CLI imports the command, and the command's :func:`open_host` takes that host.

>>> from proxgpu.cli.parser import build_parser
>>> args = build_parser().parse_args(["inspect", "--root", "examples/hosts/ct200"])
>>> args.host = None
>>> open_early(args)
>>> open_host(args).name
'dir:examples/hosts/ct200'
"""

from __future__ import annotations

import argparse
import threading
from typing import TYPE_CHECKING

from proxgpu.host import connect
from proxgpu.host.base import Host
from proxgpu.host.sshcommon import SSHOptions

if TYPE_CHECKING:
    from proxgpu.fleet.engine import Connect, Target

_EARLY = "_early_host"


class _Early:
    """A host opened ahead of the command, handed out once (namespace copies share it)."""

    def __init__(self, key: tuple[str, str | None], host: Host) -> None:
        self.key = key
        self._host: Host | None = host
        self._lock = threading.Lock()

    def take(self, key: tuple[str | None, str | None]) -> Host | None:
        with self._lock:
            host, self._host = (self._host, None) if key == self.key else (None, self._host)
        return host


def open_early(args: argparse.Namespace) -> None:
    """Start connecting to the command's SSH host, if it names one, for :func:`open_host`."""
    if getattr(args, "host", None):
        host = _connect(args)
        host.open_in_background()
        setattr(args, _EARLY, _Early((args.host, args.root), host))


def open_host(args: argparse.Namespace) -> Host:
    """The host ``args`` name: the one :func:`open_early` started, else a new one."""
    early: _Early | None = getattr(args, _EARLY, None)
    host = early.take((args.host, args.root)) if early else None
    return host or _connect(args)


def close_unused(args: argparse.Namespace) -> None:
    """Close the early host if the command never took it (it stopped before reading the host)."""
    early: _Early | None = getattr(args, _EARLY, None)
    host = early.take(early.key) if early else None
    if host is not None:
        host.close()


def connector(args: argparse.Namespace) -> Connect:
    """Opens each host of a fleet with the SSH options ``args`` give (``--user``, ``-i``, ...)."""

    def open_target(target: Target) -> Host:
        options = _ssh_options(args) if target.host else None
        return connect(target.host, target.root, options)

    return open_target


def _connect(args: argparse.Namespace) -> Host:
    return connect(args.host, args.root, _ssh_options(args) if args.host else None)


def _ssh_options(args: argparse.Namespace) -> SSHOptions:
    # From sshcommon, not the paramiko transport's module: the OpenSSH transport needs no
    # paramiko, and importing it costs more than its handshake.
    return SSHOptions(
        user=args.user,
        port=args.port,
        identity_file=args.identity,
        known_hosts=args.known_hosts,
        accept_new_host_key=args.accept_new_host_key,
        connect_timeout=args.connect_timeout,
        ssh_config=args.ssh_config,
        client=args.ssh_client,
    )
