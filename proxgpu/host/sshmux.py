"""The OpenSSH master's process, found and ended without starting another ``ssh``.

A master started with ``-f`` forks itself away once authenticated, so its pid is not the one
proxgpu started. Its control socket tells it: the alive check of OpenSSH's connection-sharing
protocol (``PROTOCOL.mux`` in OpenSSH's sources: after both sides' hello, ``MUX_C_ALIVE_CHECK``
is answered by ``MUX_S_ALIVE`` with the master's pid; every number an SSH ``uint32``, big-endian,
each message after its length). A pidfd then names that process, and only it, until it is closed:
ending the master is one signal, where ``ssh -O exit`` is one more process to start.

>>> struct.unpack(">III", _message(_ALIVE_CHECK, 7))
(8, 268435460, 7)
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import subprocess

_HELLO = 0x00000001
_ALIVE_CHECK = 0x10000004
_ALIVE = 0x80000005
#: The protocol's version since OpenSSH 5.6 (2010).
_VERSION = 4


def master_pidfd(control: str, timeout: float = 5.0) -> int | None:
    """A pidfd of the master listening on ``control``; ``None`` when it cannot be had (no
    pidfd before Linux 5.3, a master that does not answer as the protocol says)."""
    try:
        return os.pidfd_open(_master_pid(control, timeout))
    except (OSError, ValueError):
        return None


def _master_pid(control: str, timeout: float) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(control)
        sock.sendall(_message(_HELLO, _VERSION))
        if _receive(sock)[:2] != (_HELLO, _VERSION):
            raise ValueError(f"{control}: not a master of the protocol's version {_VERSION}")
        sock.sendall(_message(_ALIVE_CHECK, 1))
        kind, request, pid = _receive(sock)[:3]
        if (kind, request) != (_ALIVE, 1):
            raise ValueError(f"{control}: no answer to the alive check")
        return pid


def _message(kind: int, value: int) -> bytes:
    return struct.pack(">III", 8, kind, value)


def _receive(sock: socket.socket) -> tuple[int, ...]:
    """One message's leading numbers (its type first); what follows them is left unread."""
    (length,) = struct.unpack(">I", _exactly(sock, 4))
    body = _exactly(sock, length)
    return struct.unpack(f">{len(body) // 4}I", body[: len(body) // 4 * 4])


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ValueError("the master closed the control connection")
        data += chunk
    return data


def end_master(pidfd: int, timeout: float = 5.0) -> None:
    """End the master (SIGTERM: it closes its connection and exits) and wait up to ``timeout``
    seconds for it to be gone; the pidfd is closed."""
    try:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)


def wait_exit(proc: subprocess.Popen[bytes], limit: float) -> int:
    """``proc``'s exit status, waiting at most ``limit`` seconds, woken by the exit itself (a
    pidfd): ``Popen.wait`` with a timeout polls, sleeping up to 50 ms between looks, which
    would add that much to every connection.

    >>> wait_exit(subprocess.Popen(["sh", "-c", "exit 3"]), 10)
    3

    :raises subprocess.TimeoutExpired: when it is still running after ``limit`` seconds.
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # before Linux 5.3
        return proc.wait(limit)
    try:
        if not select.select([fd], [], [], limit)[0]:
            raise subprocess.TimeoutExpired(proc.args, limit)
    finally:
        os.close(fd)
    return proc.wait()
