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

import time
from collections.abc import Callable
from importlib import resources

from proxgpu.host.base import CommandResult, Host, command_line

#: Runs a shell command line with these stdin bytes: (exit status, stdout, stderr).
Execute = Callable[[str, bytes], tuple[int, bytes, bytes]]

#: ``scripts/bounded.sh``: runs each command under one deadline and a cap on what it answers.
BOUNDED = resources.files("proxgpu").joinpath("scripts", "bounded.sh").read_text(encoding="utf-8")
#: The exit statuses of ``timeout`` when the deadline came (TERM, then KILL).
_TIMED_OUT = (124, 137)


def bounded_line(argv: tuple[str, ...], max_output: int, limit: float) -> str:
    """The command line that runs ``argv`` on the host under ``limit`` seconds in all, keeping at
    most one byte more than ``max_output`` of each of stdout and stderr (what goes past that is
    refused, not cut: see :class:`CommandHost`).

    >>> bounded_line(("echo", "a b"), 10, 2.5).endswith("bounded 11 2.5 echo 'a b'")
    True
    """
    return command_line(["sh", "-c", BOUNDED, "bounded", str(max_output + 1), f"{limit:g}", *argv])


class CommandHost(Host):
    """A host whose commands go through ``execute`` (see the module docstring).

    With a ``root`` other than ``/`` the host is a directory tree on that machine (an image):
    files are written there, actions and live steps are listed, not run, as on an SSH host.

    Every command is bounded as a whole, as on the other hosts, and on the host itself, so that
    the connection never carries more (``scripts/bounded.sh``, which needs ``timeout`` and
    ``head`` there): one deadline for the whole command (``DEFAULT_TIMEOUT`` when none is given),
    after which the command and its process group are killed, and at most ``max_output`` bytes
    of answer. A connection that hangs on its own is the caller's to time out (Ansible's task
    ``timeout``).
    """

    def __init__(self, name: str, execute: Execute, root: str = "/") -> None:
        super().__init__()
        self.name = name
        self.root = root
        self.is_live = root == "/"
        self.execute = execute

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float) -> CommandResult:
        started = time.monotonic()
        line = bounded_line(argv, self.max_output, timeout)
        returncode, stdout, stderr = self.execute(line, stdin or b"")
        if len(stdout) + len(stderr) > self.max_output:
            raise OverflowError
        if returncode in _TIMED_OUT and time.monotonic() - started >= timeout:
            raise TimeoutError
        return CommandResult(argv, returncode, stdout, stderr)


__all__ = ["CommandHost", "Execute"]
