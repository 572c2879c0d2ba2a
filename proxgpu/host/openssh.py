"""A remote host through the system's OpenSSH client (``ssh``), one shared connection per host.

The first command opens a master connection (``ControlMaster``) whose socket lives in a private
0700 directory; every command is then a session on that connection, which ``ssh -S`` asks of the
master over that socket (:mod:`~proxgpu.host.sshmaster`), so a host's several commands cost one
handshake. :meth:`OpenSSHHost.close` ends the master and removes the
directory.
ssh reads ssh_config itself, so everything it supports works here (host certificates,
``@cert-authority``, FIDO and PKCS#11 keys, GSSAPI, ``Match exec``); proxgpu only adds what its
own options say, and ``BatchMode`` so that nothing ever waits for a password.

Names reach ssh as argument-list entries after ``--``, never through a shell, and only the names
:func:`~proxgpu.host.sshcommon.parse_target` accepts.

>>> from proxgpu.host.sshcommon import SSHOptions
>>> host = OpenSSHHost("root@pve1:2222", SSHOptions(identity_file="/k"))
>>> host.ssh_argv()[-4:]
['-p', '2222', '--', 'pve1']
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import select
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from proxgpu.errors import (
    AuthenticationError,
    HostUnreachableError,
    UsageError,
)
from proxgpu.host.base import CommandResult, command_line
from proxgpu.host.knownhosts import read_known_hosts
from proxgpu.host.local import process_running
from proxgpu.host.sshcommon import (
    SIGNALLED,
    Opening,
    SSHTarget,
    key_changed,
    key_revoked,
    key_unknown,
    known_hosts_files,
    known_hosts_name,
    no_banner,
    no_key,
    parse_target,
)
from proxgpu.host.sshmaster import (
    Master,
    Session,
    end_master,
    find_master,
    master_alive,
    run_session,
    ssh_binary,
)

#: Seconds the shared connection outlives its last command when nobody closes it.
IDLE_MASTER = 600


def resolved_config(argv: list[str], display: str) -> dict[str, list[str]]:
    """What ssh would use for the host ``argv`` names (``ssh -G``): each option's values.

    :raises UsageError: when ssh refuses the config or the options.
    """
    try:
        done = subprocess.run(
            [argv[0], "-G", *argv[1:]], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"{display}: ssh -G failed: {exc}") from exc
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise UsageError(f"{display}: ssh cannot read its config: {why[-1] if why else '?'}")
    values: dict[str, list[str]] = {}
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        values.setdefault(key, []).append(value)
    return values


@dataclass(frozen=True)
class _Starting:
    """A master ssh started, not yet through authentication, and what tells its failure."""

    proc: subprocess.Popen[bytes]
    log: Path
    display: str
    #: The known_hosts file an error about the host's key names.
    known: str
    timeout: float
    attempts: int
    user: str


class OpenSSHHost(SSHTarget):
    """A remote host reached with the system's ``ssh``; see the module docstring.

    ``root`` and ``live``: see :class:`~proxgpu.host.sshcommon.SSHTarget`.
    """

    def _unconnected(self) -> None:
        super()._unconnected()
        self._user, self._alias, self._port = parse_target(self.target)
        self._folder: str | None = None
        self._open = False
        #: The master's process, once it runs: close waits for its end.
        self._master: Master | None = None
        #: Numbers the commands' log files (ssh's own messages, one file each).
        self._commands = itertools.count()
        # The action-output reader thread and the main thread may both ask for the connection.
        self._lock = threading.Lock()

    def ssh_argv(self, *extra: str) -> list[str]:
        """The ssh command line that reaches the host, ``extra`` options before ``--``."""
        opts = self.options
        argv = [ssh_binary() or "ssh", "-T", "-o", "BatchMode=yes", *extra]
        if opts.ssh_config:
            argv += ["-F", opts.ssh_config]
        if opts.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={_quoted(opts.known_hosts)}"]
        if opts.global_known_hosts:
            argv += ["-o", f"GlobalKnownHostsFile={_quoted(opts.global_known_hosts)}"]
        if opts.connect_timeout:
            argv += ["-o", f"ConnectTimeout={math.ceil(opts.connect_timeout)}"]
        if opts.identity_file:
            argv += ["-i", opts.identity_file]
        if self._user or opts.user:
            argv += ["-l", str(self._user or opts.user)]
        if self._port or opts.port:
            argv += ["-p", str(self._port or opts.port)]
        return [*argv, "--", self._alias]

    def open_in_background(self) -> None:
        """Start the master connection: ssh is started here, what it needs read first (in the
        calling thread, which would otherwise hand a thread of its own the interpreter lock
        only every few milliseconds while it imports the command), and its authentication is
        waited for on a thread of its own; the first command waits for that."""
        with self._lock:
            if self._open or self._opening is not None:
                return
            try:
                starting = self._start()
            except Exception:  # the first command opens it again, and says why it cannot
                return
            self._opening = Opening(partial(self._finish, starting))

    def _ensure_open(self) -> None:
        with self._lock:
            self._await_opening()
            if not self._open:
                self._finish(self._start())

    def _start(self) -> _Starting:
        if self.options.identity_file and not os.path.isfile(
            os.path.expanduser(self.options.identity_file)
        ):
            raise UsageError(f"{self.options.identity_file}: no such key file (-i/--identity)")
        if ssh_binary() is None:
            raise UsageError(f"{self.name}: no ssh client on PATH: install openssh-client")
        config = resolved_config(self.ssh_argv(), self.name)
        display = known_hosts_name(_first(config, "hostname"), int(_first(config, "port", "22")))
        # ssh -G prints a file name with a blank unquoted: the files given here are taken whole.
        for key, given in (
            ("userknownhostsfile", self.options.known_hosts),
            ("globalknownhostsfile", self.options.global_known_hosts),
        ):
            if given:
                config[key] = [shlex.quote(given)]
        files = known_hosts_files(config)
        # A damaged line is an error here as with paramiko (ssh would skip it silently).
        read_known_hosts(files)
        parent = control_parent()
        _end_stale_masters(parent)
        # Named by the pid that made it (see _end_stale_masters), and short: with its socket's
        # name and the suffix ssh adds while it binds, it must fit a socket path's 108 bytes.
        self._folder = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=parent)
        try:
            return self._spawn_master(config, display, self.options.known_hosts or files[0])
        except BaseException:
            self._remove_folder()
            raise

    def _spawn_master(self, config: dict[str, list[str]], display: str, known: str) -> _Starting:
        strict = _first(config, "stricthostkeychecking", "true").lower()
        accept = self.options.accept_new_host_key or strict in ("accept-new", "false", "no")
        log = Path(str(self._folder)) / "master.log"
        timeout = float(_first(config, "connecttimeout", "none").replace("none", "10"))
        argv = self.ssh_argv(
            # A changed key is refused whatever ssh_config says (StrictHostKeyChecking=no would
            # let ssh go on with it).
            *("-o", f"StrictHostKeyChecking={'accept-new' if accept else 'yes'}"),
            *("-o", "ControlMaster=yes", "-o", f"ControlPath={self._control_path()}"),
            # Without a ConnectTimeout ssh would wait as long as the kernel's TCP connect does.
            *("-o", f"ConnectTimeout={math.ceil(timeout)}"),
            # Should proxgpu be killed before close(), the master ends by itself once idle.
            *("-o", f"ControlPersist={IDLE_MASTER}"),
            *("-E", str(log), "-v", "-N", "-f"),
        )
        attempts = int(_first(config, "connectionattempts", "1"))
        # A ProxyJump or ProxyCommand child writes its own errors (a jump host's key, its
        # authentication) to stderr: into the log with ssh's, so that they are told apart too.
        # Its own session, so that a timeout ends the proxy children with ssh.
        with log.open("ab") as errors:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,
            )
        return _Starting(proc, log, display, known, timeout, attempts, _first(config, "user"))

    def _finish(self, starting: _Starting) -> None:
        """Wait for the master ``starting`` to be authenticated (it then forks itself away)."""
        try:
            self._await_master(starting)
        except BaseException:
            self._remove_folder()
            raise
        self._open = True

    def _await_master(self, starting: _Starting) -> None:
        # ssh bounds connecting and the banner by ConnectTimeout; authentication is bounded here.
        timeout = starting.timeout
        limit = (timeout + 1) * starting.attempts + timeout
        try:
            status = _wait_exit(starting.proc, limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(starting.proc.pid, signal.SIGKILL)
            starting.proc.wait()
            raise HostUnreachableError(
                starting.display,
                f"no answer within {limit:.0f} s (connecting and authenticating)",
            ) from None
        if status != 0:
            log = starting.log
            text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
            raise _failure(starting.display, text, starting.known, timeout, starting.user)
        self._master = find_master(self._control_path())

    def _control_path(self) -> str:
        return os.path.join(str(self._folder), "control")

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float) -> CommandResult:
        self._ensure_open()
        log = os.path.join(str(self._folder), f"command-{next(self._commands)}.log")
        try:
            session = run_session(
                self._control_path(),
                command_line(argv),
                stdin=stdin,
                deadline=time.monotonic() + timeout,
                max_output=self.max_output,
                log=log,
            )
        except TimeoutError:
            raise  # the command's deadline, which Host.run names (not a lost connection)
        except OSError as exc:
            raise HostUnreachableError(self.name, f"cannot run {argv[0]}: {exc}") from None
        return CommandResult(argv, self._status(session, argv[0]), session.stdout, session.stderr)

    def _status(self, session: Session, program: str) -> int:
        """The command's exit status, or the error for a session that never ran or lost its
        connection."""
        if session.refused:
            raise HostUnreachableError(self.name, f"cannot run {program}: {session.refused}")
        if session.status is not None:
            return session.status
        if master_alive(self._control_path()):
            if not session.opened:
                raise HostUnreachableError(self.name, f"cannot run {program}: no session opened")
            return SIGNALLED  # killed by a signal
        if not session.opened:
            raise HostUnreachableError(self.name, f"connection lost before {program}")
        raise HostUnreachableError(self.name, f"connection lost while running {program}")

    def close(self) -> None:
        """End the shared connection (once one being opened has opened or failed)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        with contextlib.suppress(Exception):
            self._await_opening()
        if self._open:
            self._open = False
            end_master(self._control_path(), self._master)
            self._master = None
        self._remove_folder()

    def _remove_folder(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def _wait_exit(proc: subprocess.Popen[bytes], limit: float) -> int:
    """``proc``'s exit status, waiting at most ``limit`` seconds, woken by the exit itself (a
    pidfd): ``Popen.wait`` with a timeout polls, sleeping up to 50 ms between looks, which
    would add that much to every connection.

    >>> _wait_exit(subprocess.Popen(["sh", "-c", "exit 3"]), 10)
    3

    :raises subprocess.TimeoutExpired: when it is still running after ``limit`` seconds.
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except (OSError, AttributeError):  # before Linux 5.3, or off Linux
        return proc.wait(limit)
    try:
        if not select.select([fd], [], [], limit)[0]:
            raise subprocess.TimeoutExpired(proc.args, limit)
    finally:
        os.close(fd)
    return proc.wait()


#: OpenSSH's words for a revoked host key (sshconnect.c): a known_hosts ``@revoked`` line, or a
#: ``RevokedHostKeys`` file; only these, not "revoked" in a host's name.
_REVOKED = re.compile(
    r"REVOKED HOST KEY DETECTED|host key for \S+ is marked as revoked|Host key .* revoked by file"
)


def _failure(display: str, log: str, known: str, timeout: float, user: str) -> Exception:
    """The error for the ssh master that did not start, from what ssh logged."""
    said = [line for line in log.splitlines() if not line.startswith("debug")]
    offered = re.search(r"Server host key: (\S+) (SHA256:\S+)", log)
    kind, fingerprint = offered.groups() if offered else ("", "")
    text = "\n".join(said)
    if _REVOKED.search(text):
        return key_revoked(display, (kind, fingerprint), known, "in known_hosts")
    if "IDENTIFICATION HAS CHANGED" in text or ("Host key for" in text and "changed" in text):
        return key_changed(display, (kind, fingerprint), known)
    if "host key is known" in text or "Host key verification failed" in text:
        return key_unknown(display, (kind, fingerprint), known)
    if "Permission denied" in text or "Too many authentication failures" in text:
        if "Offering public key" not in log and "Server accepts key" not in log:
            return AuthenticationError(display, no_key(user))
        return AuthenticationError(display, f"authentication as {user} failed: {_last(said)}")
    if "banner exchange" in text:
        return HostUnreachableError(display, no_banner(timeout))
    return HostUnreachableError(display, f"cannot connect: {_unreachable(text, said)}")


def _unreachable(text: str, said: list[str]) -> str:
    if "Connection refused" in text:
        return "connection refused"
    if "Could not resolve" in text:
        return "name does not resolve"
    if "timed out" in text:
        return "timed out"
    return _last(said)


def _last(lines: list[str]) -> str:
    meaningful = [line.strip() for line in lines if line.strip()]
    return meaningful[-1] if meaningful else "ssh failed without saying why"


def _first(config: dict[str, list[str]], key: str, default: str = "") -> str:
    values = config.get(key)
    return values[0] if values else default


def _quoted(path: str) -> str:
    # ssh splits an -o value at blanks and expands %-tokens in file names: keep a path one word.
    return '"' + path.replace("%", "%%") + '"'


__all__ = ["OpenSSHHost", "resolved_config", "ssh_binary"]


def control_parent() -> str:
    """Where the control folders go: a directory only this user can change, ``$XDG_RUNTIME_DIR``
    (the login's own) when it is one, else ``~/.cache/proxgpu/ssh``, made mode 0700 if missing.
    Never ``$TMPDIR``: in a shared one without the sticky bit, another user could rename the
    folder away and put one of theirs in its place, and the master's socket (the commands, the
    configs they carry) would then be theirs.

    :raises UsageError: when the directory is not private (a link, another owner, writable by
        others), naming it and the fix.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and _private(runtime) and _made_private(runtime):
        parent = os.path.join(runtime, "proxgpu")
    else:
        parent = os.path.join(os.path.expanduser("~"), ".cache", "proxgpu", "ssh")
        os.makedirs(parent, mode=0o700, exist_ok=True)
        if not _private(parent):
            raise UsageError(
                f"{parent}: not a directory only you can change (proxgpu keeps its SSH control "
                f"sockets there): make it yours with mode 700 (chown $USER, chmod 700 {parent})"
            )
    if len(parent.encode()) > _LONGEST_PARENT:
        raise UsageError(
            f"{parent}: too long a path for an SSH control socket ({len(parent.encode())} bytes, "
            f"at most {_LONGEST_PARENT}): set XDG_RUNTIME_DIR to a private directory with a "
            "shorter path, or use --ssh-client paramiko"
        )
    return parent


#: A socket's path has 107 bytes; the folder ("/PID-XXXXXXXX"), the socket ("/control") and
#: the suffix ssh adds while it binds (".XXXXXXXXXXXXXXXX") take 42 of them.
_LONGEST_PARENT = 107 - 42


def _made_private(runtime: str) -> bool:
    """Make ``RUNTIME/proxgpu`` (mode 0700); whether it is private now."""
    folder = os.path.join(runtime, "proxgpu")
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    return _private(folder)


def _private(path: str) -> bool:
    """Whether ``path`` is a directory (not a link) of this user that no one else can write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    mine = info.st_uid == os.getuid()
    return stat.S_ISDIR(info.st_mode) and mine and not info.st_mode & 0o022


def _end_stale_masters(parent: str) -> None:
    """End the masters and remove the folders of proxgpu runs that are gone (killed before they
    could close their connections: their masters would idle on for ControlPersist's 600 s)."""
    for name in os.listdir(parent):
        pid = name.partition("-")[0]
        if not pid.isdigit() or process_running(int(pid)):
            continue
        folder = os.path.join(parent, name)
        control = os.path.join(folder, "control")
        if os.path.exists(control):
            end_master(control, find_master(control, timeout=2.0), timeout=2.0)
        shutil.rmtree(folder, ignore_errors=True)
