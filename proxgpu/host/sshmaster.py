"""An OpenSSH master connection, asked through ``ssh`` itself: a command as a session on it, its
pid, its end. OpenSSH speaks its own connection-sharing protocol (``ssh -S SOCKET``, as
Ansible's ssh plugin does), so proxgpu reads only what ``ssh`` says of it.

Every client here is ``ssh -F none -S SOCKET``: it reads no ssh_config (the master already
holds everything the host's configuration says, and a ``Match exec`` line would run again for
each command), and should the master be gone it never makes a connection of its own: its
``ProxyCommand`` is ``false``, so its fallback to connecting directly fails at once. Its own
messages go to a log file of their own (``-E``), never among the command's output; at ``-vv``
that log says whether the master opened the session and whether an exit status came back, so a
command that exits 255 is told apart from a lost connection.

>>> client_argv("/run/c", "-O", "check")[1:5]
['-F', 'none', '-S', '/run/c']
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import time
from dataclasses import dataclass

from proxgpu.host.local import run_bounded


def ssh_binary() -> str | None:
    """The ``ssh`` on PATH, if there is one."""
    return shutil.which("ssh")


def client_argv(control: str, *extra: str) -> list[str]:
    """``ssh`` as a client of the master listening on ``control`` (see the module docstring),
    ``extra`` options before its host; the host's name is a placeholder the master ignores."""
    return [
        ssh_binary() or "ssh",
        *("-F", "none", "-S", control),
        *("-o", "ControlMaster=no", "-o", "ProxyCommand=false", "-o", "BatchMode=yes"),
        *("-T", "-e", "none", *extra, "--", "proxgpu-master"),
    ]


@dataclass(frozen=True)
class Session:
    """What became of a command asked of the master.

    ``status`` is ``None`` when no exit status came back (the command was killed by a signal,
    or the connection ended); ``opened`` whether the master opened the session at all;
    ``refused`` the master's reason when it refused it.
    """

    status: int | None
    stdout: bytes
    stderr: bytes
    opened: bool
    refused: str


_OPENED = re.compile(rb"master session id: \d+")
_EXITED = re.compile(rb"Received exit status from master (\d+)")
_REFUSED = re.compile(rb"session request failed: (.*)")


def run_session(
    control: str,
    command: str,
    *,
    stdin: bytes | None,
    deadline: float,
    max_output: int,
    log: str,
) -> Session:
    """Run ``command`` (a shell command line, as ``ssh HOST COMMAND`` sends it) on the master
    listening on ``control``, ``log`` taking ssh's own messages (removed afterwards); no
    environment is passed, as over paramiko.

    :raises TimeoutError: past ``deadline`` (a ``time.monotonic`` value).
    :raises OverflowError: past ``max_output`` bytes of output.
    :raises OSError: when ssh cannot be started.
    """
    argv = client_argv(control, "-vv", "-E", log)
    try:
        code, out, err = run_bounded((*argv, command), stdin, deadline, max_output)
        said = _read(log)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(log)
    exited = _EXITED.search(said)
    refused = _REFUSED.search(said)
    return Session(
        status=code if exited else None,
        stdout=out,
        stderr=err,
        opened=bool(_OPENED.search(said)),
        refused=refused.group(1).decode("utf-8", "replace").strip() if refused else "",
    )


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as log:
            return log.read(1 << 20)
    except OSError:
        return b""


@dataclass(frozen=True)
class Master:
    """The master's process: its pid, and a pidfd of it where one can be had (a master started
    with ``-f`` forks itself away once authenticated, so its pid is not the one proxgpu started;
    a pidfd names that process, and only it, until it is closed)."""

    pid: int
    pidfd: int | None


def find_master(control: str, timeout: float = 5.0) -> Master | None:
    """The master listening on ``control``, as ``ssh -O check`` names it (the process that
    answers, not the one that made the socket: that one forked it away); ``None`` when none
    answers. No pidfd before Linux 5.3, or off Linux."""
    said = _control(control, "check", timeout)
    found = re.search(rb"Master running \(pid=(\d+)\)", said or b"")
    if found is None:
        return None
    pid = int(found.group(1))
    try:
        return Master(pid, os.pidfd_open(pid))
    except (OSError, AttributeError):
        return Master(pid, None)


def master_alive(control: str, timeout: float = 5.0) -> bool:
    """Whether the master still serves its connection: ``ssh -O check`` answered yes within
    ``timeout`` seconds. A master whose connection ended stops answering at once, though its
    process may be a few milliseconds from its end (so its pidfd would not say yet)."""
    return _control(control, "check", timeout) is not None


def end_master(control: str, master: Master | None, timeout: float = 5.0) -> None:
    """End the master and wait up to ``timeout`` seconds for it to be gone (its pidfd is then
    closed). It gets SIGTERM, sent again every 50 ms while it runs: its handler only sets a flag
    its loop looks at, and a signal that lands between that look and the loop's next wait
    waits with it (seen with OpenSSH 9.2, for the 600 s of ``ControlPersist``); the next one
    wakes it. A master whose pid is unknown is asked with ``ssh -O exit``."""
    deadline = time.monotonic() + timeout
    try:
        if master is None:
            _control(control, "exit", timeout)
        else:
            _signal(master, deadline)
    finally:
        if master is not None and master.pidfd is not None:
            os.close(master.pidfd)


def _control(control: str, request: str, timeout: float) -> bytes | None:
    """What ``ssh -O REQUEST`` said, where it succeeded within ``timeout`` seconds (a socket
    that takes the connection and never answers does not); ``None`` otherwise."""
    try:
        code, _, said = run_bounded(
            (*client_argv(control, "-O", request),), None, time.monotonic() + timeout, 1 << 16
        )
    except (OSError, TimeoutError, OverflowError):
        return None
    return said if code == 0 else None


def _signal(master: Master, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if master.pidfd is not None:
                signal.pidfd_send_signal(master.pidfd, signal.SIGTERM)
            else:
                os.kill(master.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if _gone(master, min(deadline, time.monotonic() + 0.05)):
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
