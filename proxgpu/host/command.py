"""A host reached through a function that runs one shell command line: for front ends that bring
their own connection to the host, such as Ansible's action plugins (the ``proxgpu.pve``
collection), which reach it through the play's connection, become and jump hosts.

The function takes the command line (quoted by :func:`~proxgpu.host.base.command_line`) and the
bytes for its stdin, and returns the exit status, stdout and stderr, all bytes exactly as the
command wrote them. It raises :class:`~proxgpu.errors.HostUnreachableError` when the transport
fails; a command that fails is data, as on every host.

>>> import subprocess
>>> def sh(command: str, stdin: bytes) -> tuple[int, bytes, bytes]:
...     done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True)
...     return done.returncode, done.stdout, done.stderr
>>> host = CommandHost("pve1", sh)
>>> host.run(["sh", "-c", 'printf "%s\\\\0" "$1"; cat', "sh", "a b"], stdin=b"in").stdout
b'a b\\x00in'
>>> host.is_live, CommandHost("pve1", sh, root="/srv/image").is_live
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable

from proxgpu.host.base import CommandResult, Host, command_line

#: Runs a shell command line with these stdin bytes: (exit status, stdout, stderr).
Execute = Callable[[str, bytes], tuple[int, bytes, bytes]]


class CommandHost(Host):
    """A host whose commands go through ``execute`` (see the module docstring).

    With a ``root`` other than ``/`` the host is a directory tree on that machine (an image):
    files are written there, actions and live steps are listed, not run, as on an SSH host.
    Timeouts are the caller's connection's to keep (Ansible's task ``timeout``).
    """

    def __init__(self, name: str, execute: Execute, root: str = "/") -> None:
        super().__init__()
        self.name = name
        self.root = root
        self.is_live = root == "/"
        self.execute = execute

    def _run(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None
    ) -> CommandResult:
        returncode, stdout, stderr = self.execute(command_line(argv), stdin or b"")
        return CommandResult(argv, returncode, stdout, stderr)


__all__ = ["CommandHost", "Execute"]
