"""Host access: the local machine, a directory laid out like a host, or a remote host over SSH.

Every kind offers one primitive, :meth:`Host.run`, which takes an argument list. Argument lists are
turned into a command line in exactly one place, :func:`command_line`, and only where a transport
needs a string (SSH); locally they go to the kernel as they are.

Each host has a ``root`` prefix: the directory under which the host's absolute paths live. A live
host's root is ``/``; a captured host is a directory such as ``examples/hosts/ct200``.

>>> host = LocalHost()
>>> host.run(["echo", "hello"]).stdout
b'hello\\n'
"""

from __future__ import annotations

import os
import shlex
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from proxgpu.errors import CommandError, CommandTimeoutError, HostUnreachableError


def command_line(argv: Sequence[str]) -> str:
    """Quote an argument list for a POSIX shell: the single place proxgpu quotes anything.

    >>> command_line(["sh", "-s", "--", "/srv/a b"])
    "sh -s -- '/srv/a b'"
    """
    return shlex.join(argv)


@dataclass(frozen=True)
class CommandResult:
    """What a command printed and how it exited. A non-zero exit is data, not an exception."""

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        """Whether the command exited with status 0."""
        return self.returncode == 0

    @property
    def stderr_text(self) -> str:
        """stderr decoded leniently, for messages."""
        return self.stderr.decode("utf-8", "replace")


@dataclass
class SSHOptions:
    """How to reach a host; ``None`` means "ask ~/.ssh/config, then use the default"."""

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    connect_timeout: float = 10.0
    command_timeout: float = 300.0
    ssh_config: str | None = None


class Host(ABC):
    """A place proxgpu reads from and, later, writes to.

    ``commands_run`` counts the commands sent, which is the number of round trips on a remote host.
    """

    name: str
    root: str
    #: Whether commands act on the host itself (live steps, post-actions) rather than on a tree.
    is_live: bool = True

    def __init__(self) -> None:
        self.commands_run = 0

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run ``argv`` on the host and return its result, whatever its exit status.

        :raises HostUnreachableError: when the transport fails (not when the command does).
        """
        self.commands_run += 1
        return self._run(tuple(argv), stdin, timeout)

    def check(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Like :meth:`run`, but a non-zero exit raises :class:`CommandError`."""
        result = self.run(argv, stdin=stdin, timeout=timeout)
        if not result.ok:
            raise CommandError(self.name, list(argv), result.returncode, result.stderr_text)
        return result

    @abstractmethod
    def _run(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None
    ) -> CommandResult: ...

    def close(self) -> None:  # noqa: B027 - most hosts hold nothing to release
        """Release the connection, if any."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LocalHost(Host):
    """The machine proxgpu runs on."""

    def __init__(self, root: str = "/") -> None:
        super().__init__()
        self.root = root
        self.name = "localhost" if root == "/" else f"localhost:{root}"

    def _run(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout: float | None
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                argv, input=stdin, capture_output=True, timeout=timeout, check=False
            )
        except FileNotFoundError:
            return CommandResult(argv, 127, b"", f"{argv[0]}: command not found".encode())
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeoutError(self.name, list(argv), timeout or 0) from exc
        return CommandResult(argv, proc.returncode, proc.stdout, proc.stderr)


class DirectoryHost(LocalHost):
    """A directory laid out like a host's absolute paths (a snapshot, an offline image).

    Reading commands run locally against the tree; nothing runs *on* the captured host, so live
    steps and post-actions are listed rather than run.
    """

    is_live = False

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.name = f"dir:{root}"
        if not os.path.isdir(root):
            raise HostUnreachableError(self.name, "no such directory")


def connect(
    host: str | None = None, root: str | None = None, ssh_options: SSHOptions | None = None
) -> Host:
    """Open the host a command names: ``host`` over SSH, ``root`` as a directory, else this machine.

    With both, ``root`` is the prefix on the remote host (a mounted image, a test tree).

    >>> connect(root="/").name
    'localhost'
    """
    if host is None:
        if root is None or root == "/":
            return LocalHost()
        return DirectoryHost(root)
    # Imported here so that local and directory hosts work without paramiko installed.
    from proxgpu.ssh import SSHHost  # noqa: PLC0415

    return SSHHost(host, ssh_options, root=root or "/")
