"""A remote host over SSH (paramiko), verified against known_hosts.

Connection settings come from ``~/.ssh/config`` (HostName, User, Port, IdentityFile,
UserKnownHostsFile, ProxyJump, ProxyCommand) with explicit arguments taking precedence; keys come
from IdentityFile, the default key files and ssh-agent. A host key that is not in known_hosts is
refused unless the caller explicitly accepts new keys (then it is appended, as OpenSSH's
``StrictHostKeyChecking=accept-new`` does); a changed key is always refused.

>>> parse_target("root@pve1:2222")
('root', 'pve1', 2222)
>>> parse_target("[::1]:22")
(None, '::1', 22)
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import paramiko

from proxgpu.errors import (
    AuthenticationError,
    HostUnreachableError,
)
from proxgpu.host.base import CommandResult, command_line
from proxgpu.host.knownhosts import KnownHosts, read_known_hosts
from proxgpu.host.paramikoconf import (
    Config,
    KnownHostsPolicy,
    ResolvedHost,
    disabled_algorithms,
    fingerprint,
    host_keys,
    key_identity,
    read_config,
    refuse_revoked,
    resolve,
)
from proxgpu.host.sshcommon import (
    SIGNALLED,
    Opening,
    SSHOptions,
    SSHTarget,
    key_changed,
    known_hosts_name,
    no_banner,
    no_key,
    parse_target,
)

# paramiko logs a failed handshake with its traceback (as ERROR, from its transport thread);
# with no handler of its own, Python's last-resort handler would print that on the terminal.
# proxgpu raises the failure as one line instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class SSHHost(SSHTarget):
    """A remote host reached over SSH through paramiko, in this process.

    The connection opens on first use and is reused for every command. ``root`` and ``live``:
    see :class:`~proxgpu.host.sshcommon.SSHTarget`.

    >>> host = SSHHost("root@pve1", SSHOptions(port=2222), root="/srv/image")
    >>> host.name, host.is_live
    ('root@pve1', False)
    """

    def _unconnected(self) -> None:
        super()._unconnected()
        self._clients: list[paramiko.SSHClient] = []
        self._timeout = self.options.connect_timeout or 10.0

    def open_in_background(self) -> None:
        """Start connecting on a thread of its own: the handshake is mostly spent waiting for the
        host, time the caller can use (the CLI imports the command's modules meanwhile). The
        first command waits for it and raises what connecting raised."""
        if not self._clients and self._opening is None:
            self._opening = Opening(self._open_chain)

    def _client(self) -> paramiko.SSHClient:
        self._await_opening()
        if not self._clients:
            self._open_chain()
        return self._clients[-1]

    def _open_chain(self) -> None:
        config = read_config(self.options.ssh_config)
        try:
            self._connect(resolve(self.target, self.options, config), config)
        except BaseException:
            # A half-built chain must not stay: the next command would run on a jump host.
            self._close_clients()
            raise

    def _connect(self, dest: ResolvedHost, config: Config) -> None:
        sock: Any = None
        if dest.proxy_jump and dest.proxy_jump.lower() != "none":
            for hop in dest.proxy_jump.split(","):
                jump = resolve(hop, SSHOptions(connect_timeout=dest.timeout), config)
                jump.known_hosts = dest.known_hosts
                jump.known_hosts_files = dest.known_hosts_files
                self._open(jump, self._tunnel(jump) if self._clients else None)
            sock = self._tunnel(dest)
        elif dest.proxy_command:
            sock = paramiko.ProxyCommand(dest.proxy_command)
        self._open(dest, sock)

    def _tunnel(self, dest: ResolvedHost) -> paramiko.Channel:
        transport = self._clients[-1].get_transport()
        assert transport is not None  # _open only keeps connected clients
        try:
            return transport.open_channel(
                "direct-tcpip",
                (dest.hostname, dest.port),
                ("127.0.0.1", 0),
                timeout=dest.timeout,
            )
        except (paramiko.SSHException, OSError) as exc:
            raise HostUnreachableError(
                self.name, f"jump host cannot reach {dest.hostname}: {exc}"
            ) from exc

    def _open(self, dest: ResolvedHost, sock: Any) -> None:
        display = known_hosts_name(dest.hostname, dest.port)
        known = read_known_hosts(dest.known_hosts_files)
        client = paramiko.SSHClient()
        client.get_host_keys().update(host_keys(display, known))
        client.set_missing_host_key_policy(KnownHostsPolicy(display, dest, known))
        try:
            for attempt in range(dest.attempts):
                try:
                    self._handshake(client, dest, sock, display, known)
                    break
                except HostUnreachableError:
                    # ConnectionAttempts: a refused or silent host is tried again, once a second.
                    if attempt + 1 == dest.attempts or sock is not None:
                        raise
                    time.sleep(1)
            transport = client.get_transport()
            if transport is not None and dest.keepalive:
                transport.set_keepalive(dest.keepalive)
            self._timeout = dest.timeout
        except BaseException:
            # A failed handshake leaves paramiko's transport thread (and a ProxyCommand's
            # process) running until closed.
            client.close()
            raise
        self._clients.append(client)

    def _handshake(
        self,
        client: paramiko.SSHClient,
        dest: ResolvedHost,
        sock: Any,
        display: str,
        known: KnownHosts,
    ) -> None:
        timeout = dest.timeout
        only = dest.identities_only and bool(dest.identity_files)
        try:
            # A direct connection is opened here, not by paramiko, so that it is prompt.
            sock = sock if sock is not None else _tcp(dest.hostname, dest.port, timeout)
            client.connect(
                dest.hostname,
                dest.port,
                username=dest.user,
                # paramiko takes a list of key files; its type stubs only admit one.
                key_filename=dest.identity_files or None,  # type: ignore[arg-type]
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                sock=sock,
                disabled_algorithms=disabled_algorithms(),
                allow_agent=dest.agent and not only,
                look_for_keys=not only,
            )
        except paramiko.BadHostKeyException as exc:
            refuse_revoked(display, known, exc.key)
            expected = fingerprint(exc.expected_key)
            raise key_changed(display, key_identity(exc.key), dest.known_hosts, expected) from exc
        except paramiko.AuthenticationException as exc:
            raise AuthenticationError(
                display, f"authentication as {dest.user} failed: {exc}"
            ) from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if _no_credentials(exc):
                # No key to offer is the user's to fix, as a refused one is (OpenSSH: exit 255,
                # "Permission denied"), not a host that cannot be reached.
                raise AuthenticationError(
                    display,
                    no_key(dest.user),
                ) from exc
            transport = client.get_transport()
            if transport is not None and not transport.remote_version:
                # Connected, but the port never said it is an SSH server (paramiko itself then
                # reports "No existing session" or a raw banner error).
                raise HostUnreachableError(display, no_banner(timeout)) from exc
            raise HostUnreachableError(display, f"cannot connect: {_describe(exc)}") from exc

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float) -> CommandResult:
        deadline = time.monotonic() + timeout
        transport = self._client().get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachableError(self.name, "connection lost")
        channel = None
        try:
            channel = transport.open_session(timeout=self._timeout)
            channel.exec_command(command_line(argv))
            result = _collect(channel, argv, stdin, deadline, self.max_output)
        except TimeoutError:
            raise  # the command's deadline, which Host.run names (not a lost connection)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostUnreachableError(self.name, f"connection lost: {_describe(exc)}") from exc
        finally:
            # Closing the channel closes the command's pipes: one still writing gets SIGPIPE.
            if channel is not None:
                channel.close()
        if result.returncode == -1:
            # The channel closed without an exit status: a command killed by a signal, or the
            # connection dropped (the command may or may not have finished). paramiko closes
            # the channels of a dropped connection before it marks it inactive, so a channel
            # the server must answer (within the connect timeout) tells them apart.
            try:
                transport.open_session(timeout=self._timeout).close()
            except (paramiko.SSHException, OSError, EOFError):
                raise HostUnreachableError(
                    self.name, f"connection lost while running {argv[0]}"
                ) from None
            # As OpenSSH's ssh exits then.
            return CommandResult(argv, SIGNALLED, result.stdout, result.stderr)
        return result

    def close(self) -> None:
        """Close the connection and any jump-host connections behind it (once a connection being
        opened in the background has opened or failed: its failure no longer matters)."""
        with contextlib.suppress(Exception):
            self._await_opening()
        self._close_clients()

    def _close_clients(self) -> None:
        while self._clients:
            self._clients.pop().close()


class _Prompt(socket.socket):
    """A TCP connection that sends each packet at once and acknowledges each one it receives
    at once (Linux's ``TCP_NODELAY`` and ``TCP_QUICKACK``; the kernel leaves quick-ack mode
    by itself, so it is asked again at each read).

    paramiko writes a command's requests as several small packets, and so does sshd its
    answers (a session's confirmation right after the host keys it announces once
    authenticated). Nagle's algorithm holds a small packet back until the one before it is
    acknowledged, and a delayed acknowledgement comes some 40 ms late: every command, the
    first on a connection too, would wait that long.
    """

    __slots__ = ()

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if _QUICKACK is not None:
            self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return data


_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def _tcp(host: str, port: int, timeout: float) -> _Prompt:
    """A prompt TCP connection to ``host`` (each address it resolves to tried in turn).

    :raises OSError: when none answers (``socket.gaierror`` for a name that does not resolve).
    """
    try:
        connected = socket.create_connection((host, port), timeout)
    except UnicodeError as exc:
        # A name with an empty label (``..``, ``a..b``) fails in the IDNA codec before any
        # lookup: it resolves to nothing, as OpenSSH says of it.
        raise socket.gaierror(socket.EAI_NONAME, f"{host}: {exc}") from exc
    sock = _Prompt(fileno=connected.detach())
    sock.settimeout(timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _collect(
    channel: paramiko.Channel,
    argv: tuple[str, ...],
    stdin: bytes | None,
    deadline: float,
    max_output: int,
) -> CommandResult:
    """What the command answers until it closes its output and exits, bounded as a whole: a
    host that trickles a byte every few seconds still ends at ``deadline``.

    :raises TimeoutError: past ``deadline``. :raises OverflowError: past ``max_output`` bytes.
    """
    channel.settimeout(max(deadline - time.monotonic(), 0.001))
    # Not select() on the channel: its fileno() is an OS pipe that paramiko's transport thread
    # may still write to while close() closes it, and the EBADF or EPIPE then kills the whole
    # connection (3 of 300 commands stopped at max_output lost it). An Event is
    # set by the same feeds and closes and has nothing to close.
    arrived = threading.Event()
    channel.in_buffer.set_event(arrived)
    channel.in_stderr_buffer.set_event(arrived)
    if stdin is not None:
        channel.sendall(stdin)
    channel.shutdown_write()
    stdout: list[bytes] = []
    stderr: list[bytes] = []
    total = 0
    while True:
        # Read before draining: data the host sent before its EOF is then in the buffers.
        ended = channel.eof_received or channel.closed
        while channel.recv_ready() or channel.recv_stderr_ready():
            if channel.recv_ready():
                stdout.append(channel.recv(1 << 16))
                total += len(stdout[-1])
            if channel.recv_stderr_ready():
                stderr.append(channel.recv_stderr(1 << 16))
                total += len(stderr[-1])
            if total > max_output:
                raise OverflowError
        if ended:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        # Set when data, EOF or a close arrives; only this loop's reads clear it, and it drains
        # both streams before it waits, so nothing that arrives is missed.
        arrived.wait(remaining)
    if not channel.status_event.wait(max(deadline - time.monotonic(), 0)):
        raise TimeoutError
    status = channel.recv_exit_status()
    return CommandResult(argv, status, b"".join(stdout), b"".join(stderr))


def _no_credentials(exc: BaseException) -> bool:
    # paramiko's SSHClient raises a plain SSHException when it has no key or agent to try.
    return isinstance(exc, paramiko.SSHException) and "No authentication methods" in str(exc)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return "name does not resolve"
    if isinstance(exc, ConnectionRefusedError | paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


__all__: Sequence[str] = ["SSHHost", "SSHOptions", "fingerprint", "parse_target"]
