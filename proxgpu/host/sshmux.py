"""OpenSSH's connection sharing spoken directly: commands on the master, without another ``ssh``.

A master started with ``ControlMaster`` listens on its control socket for the protocol of
``PROTOCOL.mux`` in OpenSSH's sources (every number an SSH ``uint32``, big-endian; a string its
length, then its bytes; each message after its own length). After both sides' hello:

* ``MUX_C_NEW_SESSION`` runs a command as a session on the master's connection, the client's
  stdin, stdout and stderr passed to the master as descriptors (``SCM_RIGHTS``); the master
  answers ``MUX_S_SESSION_OPENED``, and ``MUX_S_EXIT_MESSAGE`` with the command's status once it
  ended. An ``ssh`` started per command to do just that is some 5 ms of the CPU each (its
  libraries, OpenSSL's setup, ssh_config read again), dozens of times in an apply.
* ``MUX_C_ALIVE_CHECK`` is answered by ``MUX_S_ALIVE`` with the master's pid: a master started
  with ``-f`` forks itself away once authenticated, so its pid is not the one proxgpu started.
  A pidfd then names that process, and only it, until it is closed: its end is waited for by
  it.
* ``MUX_C_TERMINATE`` ends the master (``ssh -O exit`` would be one more process to start).

>>> struct.unpack(">III", _message(_ALIVE_CHECK, 7))
(8, 268435460, 7)
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import time
from dataclasses import dataclass, field

_HELLO = 0x00000001
_NEW_SESSION = 0x10000002
_ALIVE_CHECK = 0x10000004
_TERMINATE = 0x10000005
_PERMISSION_DENIED = 0x80000002
_FAILURE = 0x80000003
_EXIT_MESSAGE = 0x80000004
_ALIVE = 0x80000005
_SESSION_OPENED = 0x80000006
_TTY_ALLOC_FAIL = 0x80000008
#: The protocol's version since OpenSSH 5.6 (2010).
_VERSION = 4
#: No escape character: the session has no terminal whose input could carry one.
_NO_ESCAPE = 0xFFFFFFFF


#: The longest message the master sends (a refusal with its reason): OpenSSH's own client
#: takes up to 256 KiB.
_MAX_MESSAGE = 256 << 10


class MuxError(OSError):
    """The master refused a request, or did not answer as the protocol says."""


@dataclass
class Session:
    """A command running on the master's connection: write its input to ``stdin``, read its
    output from ``stdout`` and ``stderr`` (this side's ends of three pipes), then take its
    :meth:`status`. Closing it before the command ended closes the control connection, and the
    master then closes the command's channel, as when the ``ssh`` that asked for it is killed."""

    control: socket.socket
    session_id: int
    stdin: int
    stdout: int
    stderr: int
    _open: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self._open = {self.stdin, self.stdout, self.stderr}

    def status(self, deadline: float) -> int | None:
        """The command's exit status, once the master says it (after the output ended);
        ``None`` when the master closed the control connection without one (the connection
        to the host ended, or the command was killed by a signal).

        :raises TimeoutError: past ``deadline`` (a ``time.monotonic`` value).
        """
        status = None
        while True:
            self.control.settimeout(_remaining(deadline))
            try:
                fields = _receive(self.control).fields
            except MuxError:
                return status  # the master ends the exchange by closing the socket
            if fields[:2] == (_EXIT_MESSAGE, self.session_id) and len(fields) > 2:
                status = fields[2]
            elif fields[0] != _TTY_ALLOC_FAIL:
                return status

    def close_stdin(self) -> None:
        """Close the command's input: it reads the end of its input there."""
        self._close(self.stdin)

    def close(self) -> None:
        """Close the control connection and this side's pipe ends."""
        self.control.close()
        for fd in sorted(self._open):
            self._close(fd)

    def _close(self, fd: int) -> None:
        # Each once: a number closed twice could by then name another file.
        if fd in self._open:
            self._open.discard(fd)
            os.close(fd)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_session(control: str, command: str, deadline: float) -> Session:
    """Run ``command`` (a shell command line, as ``ssh HOST COMMAND`` sends it) on the master
    listening on ``control``; no environment is passed, as over paramiko.

    :raises MuxError: when the master refuses it (its reason in the message).
    :raises TimeoutError: when the master does not answer before ``deadline``.
    :raises OSError: when the control socket cannot be reached.
    """
    sock = _connect(control, deadline)
    opened: list[int] = []
    try:
        for _ in range(3):
            opened.extend(os.pipe())
        stdin, feed, output, out, errors, err = opened
        request = (
            _u32(_NEW_SESSION, 1)
            + _string(b"")  # reserved
            + _u32(0, 0, 0, 0, _NO_ESCAPE)  # no tty, X11, agent or subsystem
            + _string(b"")  # no terminal type
            + _string(command.encode("utf-8", "surrogateescape"))
        )
        sock.sendall(struct.pack(">I", len(request)) + request)
        # The master gets stdin's reading end and the writing ends of stdout and stderr.
        for fd in (stdin, out, err):
            socket.send_fds(sock, [b"\0"], [fd])
        reply = _receive(sock)
        if reply.fields[:2] != (_SESSION_OPENED, 1) or len(reply.fields) < 3:
            raise MuxError(f"the master refused the session: {reply.reason()}")
    except BaseException:
        sock.close()
        for fd in opened:
            os.close(fd)
        raise
    for fd in (stdin, out, err):
        os.close(fd)
    return Session(sock, reply.fields[2], feed, output, errors)


@dataclass(frozen=True)
class Master:
    """The master's process: its pid, and a pidfd of it where one can be had."""

    pid: int
    pidfd: int | None


def find_master(control: str, timeout: float = 5.0) -> Master | None:
    """The master listening on ``control`` (its alive check says its pid); ``None`` when it
    does not answer as the protocol says. No pidfd before Linux 5.3, or off Linux."""
    try:
        pid = _alive_pid(control, timeout)
    except (OSError, IndexError):
        return None
    try:
        return Master(pid, os.pidfd_open(pid))
    except (OSError, AttributeError):
        return Master(pid, None)


def master_alive(control: str, timeout: float = 5.0) -> bool:
    """Whether the master still serves its connection: its alive check answered within
    ``timeout`` seconds. A master whose connection ended stops answering at once, though its
    process may be a few milliseconds from its end (so its pidfd would not say yet)."""
    try:
        _alive_pid(control, timeout)
    except (OSError, IndexError):
        return False
    return True


def end_master(control: str, master: Master | None, timeout: float = 5.0) -> None:
    """End the master and wait up to ``timeout`` seconds for it to be gone (its pidfd is then
    closed). It is asked with ``MUX_C_TERMINATE``, which it answers in its own loop: a signal
    can land between its look at the flag its handler sets and its next wait, and then waits
    with it (seen with OpenSSH 9.2, for the 600 s of ``ControlPersist``). Only a master that
    cannot be asked gets SIGTERM, sent again while it runs."""
    deadline = time.monotonic() + timeout
    try:
        try:
            with _connect(control, deadline) as sock:
                sock.sendall(_message(_TERMINATE, 1))
                # Its answer may never come (it exits first); the end of the connection does.
                while sock.recv(4096):
                    pass
        except OSError:
            _signal(master, deadline)
        if master is not None:
            _gone(master, deadline)
    finally:
        if master is not None and master.pidfd is not None:
            os.close(master.pidfd)


def _alive_pid(control: str, timeout: float) -> int:
    """The pid the master's alive check answers with."""
    with _connect(control, time.monotonic() + timeout) as sock:
        return _request(sock, _ALIVE_CHECK, _ALIVE)[2]


def _signal(master: Master | None, deadline: float) -> None:
    while master is not None and time.monotonic() < deadline:
        try:
            if master.pidfd is not None:
                signal.pidfd_send_signal(master.pidfd, signal.SIGTERM)
            else:
                os.kill(master.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if _gone(master, min(deadline, time.monotonic() + 0.1)):
            return


def _gone(master: Master, deadline: float) -> bool:
    """Whether the master ended by ``deadline``: its pidfd readable, else its pid gone (reaped:
    it is no child of ours, so whoever reaps orphans does it at once)."""
    if master.pidfd is not None:
        left = max(deadline - time.monotonic(), 0)
        return bool(select.select([master.pidfd], [], [], left)[0])
    while True:
        try:
            os.kill(master.pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _connect(control: str, deadline: float) -> socket.socket:
    """The control socket, after both sides' hello."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(_remaining(deadline))
        sock.connect(control)
        sock.sendall(_message(_HELLO, _VERSION))
        if _receive(sock).fields[:2] != (_HELLO, _VERSION):
            raise MuxError(f"{control}: not a master of the protocol's version {_VERSION}")
    except BaseException:
        sock.close()
        raise
    return sock


def _request(sock: socket.socket, kind: int, answer: int) -> tuple[int, ...]:
    """Send the request ``kind`` (request id 1); its reply's numbers, which must be ``answer``'s."""
    sock.sendall(_message(kind, 1))
    reply = _receive(sock)
    if reply.fields[:2] != (answer, 1) or len(reply.fields) < 3:
        raise MuxError(f"the master did not grant request {kind:#x}: {reply.reason()}")
    return reply.fields


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    return remaining


def _u32(*values: int) -> bytes:
    return struct.pack(f">{len(values)}I", *values)


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _message(kind: int, value: int) -> bytes:
    return _u32(8, kind, value)


@dataclass(frozen=True)
class _Reply:
    """One message from the master: its leading numbers (its type first) and its whole body."""

    fields: tuple[int, ...]
    body: bytes

    def reason(self) -> str:
        """Why a request was refused: MUX_S_FAILURE and MUX_S_PERMISSION_DENIED carry a string
        after their type and request id."""
        if self.fields[0] not in (_PERMISSION_DENIED, _FAILURE) or len(self.body) < 12:
            return f"unexpected answer {self.fields[0]:#x}"
        (size,) = struct.unpack(">I", self.body[8:12])
        return self.body[12 : 12 + size].decode("utf-8", "replace")


def _receive(sock: socket.socket) -> _Reply:
    """The master's next message; one that cannot be the protocol's (a length past any it
    sends, or too short for a type) is a :class:`MuxError`, never read on."""
    (length,) = struct.unpack(">I", _exactly(sock, 4))
    if not 4 <= length <= _MAX_MESSAGE:
        raise MuxError(f"the master answered a message of {length} bytes: not the mux protocol")
    body = _exactly(sock, length)
    return _Reply(struct.unpack(f">{len(body) // 4}I", body[: len(body) // 4 * 4]), body)


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise MuxError("the master closed the control connection")
        data += chunk
    return data
