"""What every kind of host offers: one primitive, :meth:`Host.run`, which takes an argument list.

Argument lists are turned into a command line in exactly one place, :func:`command_line`, and only
where a transport needs a string (SSH); locally they go to the kernel as they are.

Each host has a ``root`` prefix: the directory under which the host's absolute paths live. A live
host's root is ``/``; a captured host is a directory such as ``examples/hosts/ct200``.

>>> command_line(["sh", "-c", "echo $1", "sh", "a b"])
"sh -c 'echo $1' sh 'a b'"
"""

from __future__ import annotations

import logging
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from proxgpu.errors import (
    CommandError,
    CommandOutputTooLargeError,
    CommandTimeoutError,
    UsageError,
)

log = logging.getLogger(__name__)

#: The most a command may answer, stdout and stderr together: a gather of a host with thousands
#: of functions answers a few MiB, so anything near this is a host answering garbage.
MAX_OUTPUT = 64 << 20
#: Seconds a command may run, in all, when its caller gives no limit.
DEFAULT_TIMEOUT = 300.0


def command_line(argv: Sequence[str]) -> str:
    """Quote an argument list for a POSIX shell: the single place proxgpu quotes anything.

    >>> command_line(["sh", "-s", "--", "/srv/a b"])
    "sh -s -- '/srv/a b'"
    """
    return shlex.join(argv)


def described(argv: Sequence[str]) -> str:
    """``argv`` as a log line shows it: a script's text (``sh -c TEXT``) by its size only.

    >>> described(["sh", "-c", "set -e\\necho hi\\n", "sh", "/etc/pve"])
    'sh -c <script: 15 bytes> sh /etc/pve'
    """
    return " ".join(
        f"<script: {len(a.encode())} bytes>" if "\n" in a else shlex.quote(a) for a in argv
    )


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


class Host(ABC):
    """A place proxgpu reads from and, later, writes to.

    ``commands_run`` counts the commands sent, which is the number of round trips on a remote host.
    Every command is bounded as a whole: ``max_output`` bytes and its timeout (``DEFAULT_TIMEOUT``
    when none is given), however slowly the host answers.
    """

    name: str
    root: str
    #: Whether commands act on the host itself (live steps, post-actions) rather than on a tree.
    is_live: bool = True
    #: The most one command may answer (stdout and stderr together) before it is stopped.
    max_output: int = MAX_OUTPUT

    def __init__(self) -> None:
        self.commands_run = 0

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run ``argv`` on the host and return its result, whatever its exit status.

        :raises HostUnreachableError: when the transport fails (not when the command does).
        :raises CommandTimeoutError: when it runs past ``timeout`` seconds in all.
        :raises CommandOutputTooLargeError: when it answers more than ``max_output`` bytes.
        :raises UsageError: for a ``timeout`` that is not more than 0 (``None``: the default).
        """
        limit = DEFAULT_TIMEOUT if timeout is None else timeout
        if limit <= 0:  # GNU timeout reads 0 as "no limit", a deadline as "already past"
            raise UsageError(f"{self.name}: {argv[0]}: timeout {limit} s: give more than 0")
        self.commands_run += 1
        start = time.monotonic()
        try:
            result = self._run(tuple(argv), stdin, limit)
        # A transport says which bound stopped the command in Python's words; the error names
        # the host, the command and the bound, whichever transport ran it.
        except TimeoutError:
            raise CommandTimeoutError(self.name, list(argv), limit) from None
        except OverflowError:
            raise CommandOutputTooLargeError(self.name, list(argv), self.max_output) from None
        if log.isEnabledFor(logging.DEBUG):  # -vv: each exchange with the host
            log.debug(
                "%s: ran %s: %d bytes in, %d out, %d err, exit %d, %.3f s",
                self.name,
                described(argv),
                len(stdin or b""),
                len(result.stdout),
                len(result.stderr),
                result.returncode,
                time.monotonic() - start,
            )
        return result

    def check(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Like :meth:`run`, but a non-zero exit raises :class:`CommandError`."""
        result = self.run(argv, stdin=stdin, timeout=timeout)
        if not result.ok:
            raise CommandError(self.name, list(argv), result.returncode, result.stderr_text)
        return result

    @abstractmethod
    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float) -> CommandResult:
        """Run ``argv`` within ``timeout`` seconds and ``max_output`` bytes, raising
        ``TimeoutError`` or ``OverflowError`` past them (:meth:`run` names the bound)."""

    def open_in_background(self) -> None:  # noqa: B027 - most hosts have nothing to open
        """Start opening the host on a thread of its own, so that the caller's own work overlaps
        it; the first command waits for it. Hosts that open instantly ignore this."""

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
