"""What both SSH transports share, without importing either: the target's syntax, the options,
and a connection opened on a thread of its own.

>>> parse_target("root@pve1:2222")
('root', 'pve1', 2222)
>>> parse_target("[::1]:22")
(None, '::1', 22)
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from proxgpu.errors import (
    HostKeyChangedError,
    HostKeyRevokedError,
    HostKeyUnknownError,
    UsageError,
)
from proxgpu.host.base import Host, command_line

#: The transports ``--ssh-client`` names: ``auto`` picks one per host.
CLIENTS = ("auto", "openssh", "paramiko")
#: The environment variable that picks the transport when ``--ssh-client`` is not given.
CLIENT_VARIABLE = "PROXGPU_SSH_CLIENT"
#: The status of a command that ended without one (killed by a signal), over either transport:
#: OpenSSH's ssh exits with it then.
SIGNALLED = 255
#: A host name or address as OpenSSH takes one: never an option (``-oProxyCommand=...``), never a
#: shell word of its own.
_HOST_NAME = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]*")
_USER_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.$-]*")


def parse_target(target: str) -> tuple[str | None, str, int | None]:
    """Split ``[user@]host[:port]`` (IPv6 in brackets) into its parts.

    :raises UsageError: when the target is empty, the port is not a number, or the name could
        be read as an option or as more than one word (``-oProxyCommand=...``, ``a b``).
    """
    user, _, rest = target.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = tail[1:] or None if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    if not host:
        raise UsageError(f"{target!r} is not a host: expected [user@]host[:port]")
    if port is not None and not port.isdigit():
        raise UsageError(f"{target!r}: port {port!r} is not a number")
    if not _HOST_NAME.fullmatch(host) or (user and not _USER_NAME.fullmatch(user)):
        raise UsageError(
            f"{target!r} is not a host: a name, an address or an ssh_config alias "
            "(letters, digits, '.', '_', '-', ':'), not starting with '-'"
        )
    return user or None, host, int(port) if port else None


def no_banner(timeout: float) -> str:
    """What both transports say of a port that accepts a connection and never speaks SSH."""
    return (
        f"cannot connect: no SSH banner within {timeout:g} s (the port is open, not an SSH server)"
    )


def no_key(user: str) -> str:
    """What both transports say when there was no key at all to offer."""
    return (
        f"authentication as {user} failed: no key to offer "
        "(give one with -i/--identity, IdentityFile or ssh-agent)"
    )


def known_hosts_name(hostname: str, port: int) -> str:
    """The name known_hosts files this host under (``[host]:port`` off port 22)."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def known_hosts_files(config: dict[str, list[str]]) -> list[str]:
    """The known_hosts files ``config`` (``ssh -G``'s answer) names, quoted names kept whole and
    ``none`` (no file) left out.

    >>> known_hosts_files(
    ...     {"userknownhostsfile": ['"/k h/known" /k2'], "globalknownhostsfile": ["none"]}
    ... )
    ['/k h/known', '/k2']
    """
    return [
        os.path.expanduser(path)
        for key in ("userknownhostsfile", "globalknownhostsfile")
        for value in config.get(key, [])
        for path in _words(value)
        if path.lower() != "none"
    ]


def _words(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError:  # an unbalanced quote: ssh itself would have refused it, read it plainly
        return value.split()


@dataclass
class SSHOptions:
    """How to reach a host; ``None`` means "ask ~/.ssh/config, then use the default"."""

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    #: Seconds to connect; ``None``: ssh_config's ``ConnectTimeout``, else 10.
    connect_timeout: float | None = None
    ssh_config: str | None = None
    #: The system-wide known_hosts; ``None``: ssh_config's ``GlobalKnownHostsFile``, else
    #: ``/etc/ssh/ssh_known_hosts`` (the tests point it at a file of their own).
    global_known_hosts: str | None = None
    #: ``openssh``, ``paramiko`` or ``auto``; ``None``: ``$PROXGPU_SSH_CLIENT``, else ``auto``.
    client: str | None = None


class Opening:
    """A connection being opened on a daemon thread (so a hung host cannot keep the process
    alive past its connect timeout)."""

    def __init__(self, open_chain: Callable[[], None]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(open_chain,), name="ssh-connect", daemon=True
        )
        self._thread.start()

    def _run(self, open_chain: Callable[[], None]) -> None:
        try:
            open_chain()
        except BaseException as exc:  # handed to the thread that waits, which raises it
            self._error = exc

    def wait(self) -> None:
        """Wait until the connection is open; raise what opening it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error


_INCLUDE = re.compile(r"^\s*include\s+(.+?)\s*$", re.IGNORECASE)


def config_text(path: str | None) -> str:
    """The text of the SSH config ``path`` (else ``~/.ssh/config``; none there: ``""``) with
    every ``Include`` replaced by the files it names, as OpenSSH reads them (paramiko does not):
    globs, in lexical order, relative paths from ``~/.ssh``.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "extra.conf").write_text("Host pve1\\n  Port 2222\\n")
    >>> _ = (folder / "config").write_text(f"Include {folder}/*.conf\\n")
    >>> config_text(str(folder / "config")).split()
    ['Host', 'pve1', 'Port', '2222']

    :raises UsageError: for a config named that is not a file, or Includes nested too deep.
    """
    config = Path(path or "~/.ssh/config").expanduser()
    if config.is_file():
        return _with_includes(config, 0)
    if path:
        raise UsageError(f"{config}: no such SSH config file")
    return ""


def _with_includes(path: Path, depth: int) -> str:
    if depth > 16:  # OpenSSH's own limit on nested includes
        raise UsageError(f"{path}: Include nested too deep")
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _INCLUDE.match(line)
        if match is None:
            lines.append(line)
            continue
        for pattern in shlex.split(match[1]):
            full = Path(pattern).expanduser()
            if not full.is_absolute():
                full = Path("~/.ssh").expanduser() / full
            for included in sorted(glob.glob(str(full))):
                lines.append(_with_includes(Path(included), depth + 1))
    return "\n".join(lines) + "\n"


def key_unknown(
    display: str, offered: tuple[str, str], known_hosts: str, hint: str = ""
) -> HostKeyUnknownError:
    """The refusal of a host key seen for the first time (``offered``: its type and
    fingerprint), by either transport; ``hint`` adds what else could check it.

    >>> print(key_unknown("pve1", ("ssh-ed25519", "SHA256:abc"), "/root/.ssh/known_hosts"))
    pve1: host key ssh-ed25519 SHA256:abc is not in /root/.ssh/known_hosts; check it with the \
host's console, then rerun with --accept-new-host-key
    """
    kind, fingerprint = offered
    return HostKeyUnknownError(
        display,
        f"host key {kind} {fingerprint} is not in {known_hosts}; check it with the host's "
        f"console, then rerun with --accept-new-host-key{hint}",
        fingerprint,
        known_hosts,
    )


def key_changed(
    display: str, offered: tuple[str, str], known_hosts: str, expected: str | None = None
) -> HostKeyChangedError:
    """The refusal of a host key other than the one ``known_hosts`` holds (``expected``, its
    fingerprint, where the transport says it), with the command that forgets the old one.

    >>> print(key_changed("[pve1]:2222", ("ssh-ed25519", "SHA256:new"), "/etc/pg/known_hosts"))
    [pve1]:2222: host key changed: offered ssh-ed25519 SHA256:new, which /etc/pg/known_hosts \
does not hold; if the host was reinstalled, remove the old key with: ssh-keygen -f \
/etc/pg/known_hosts -R '[pve1]:2222'
    """
    kind, fingerprint = offered
    held = f"{known_hosts} expects {expected}" if expected else f"which {known_hosts} does not hold"
    return HostKeyChangedError(
        display,
        f"host key changed: offered {kind} {fingerprint}, {held}; if the host was reinstalled, "
        f"remove the old key with: {command_line(forget_key(known_hosts, display))}",
        fingerprint,
        known_hosts,
    )


def key_revoked(
    display: str, offered: tuple[str, str], known_hosts: str, where: str
) -> HostKeyRevokedError:
    """The refusal of a revoked host key; ``where`` says where it is revoked (the file and
    line, where the transport knows them)."""
    kind, fingerprint = offered
    return HostKeyRevokedError(
        display,
        f"host key {kind} {fingerprint} is revoked {where}; find out why before trusting this "
        "host again",
        fingerprint,
        known_hosts,
    )


def forget_key(known_hosts: str, display: str) -> list[str]:
    """The ``ssh-keygen -R`` command that removes ``display``'s key from ``known_hosts``.

    >>> forget_key(os.path.expanduser("~/.ssh/known_hosts"), "pve1")
    ['ssh-keygen', '-R', 'pve1']
    >>> forget_key("/etc/proxgpu/known_hosts", "[pve1]:2222")
    ['ssh-keygen', '-f', '/etc/proxgpu/known_hosts', '-R', '[pve1]:2222']
    """
    if os.path.abspath(known_hosts) == os.path.expanduser("~/.ssh/known_hosts"):
        return ["ssh-keygen", "-R", display]
    return ["ssh-keygen", "-f", known_hosts, "-R", display]


def client_choice(option: str | None) -> str:
    """The transport asked for: ``--ssh-client``, else ``$PROXGPU_SSH_CLIENT``, else ``auto``.

    >>> client_choice("openssh"), client_choice(None) in CLIENTS
    ('openssh', True)
    """
    chosen = option or os.environ.get(CLIENT_VARIABLE) or "auto"
    if chosen not in CLIENTS:
        source = "--ssh-client" if option else CLIENT_VARIABLE
        raise UsageError(f"{source}: {chosen!r} is not one of {', '.join(CLIENTS)}")
    return chosen


class SSHTarget(Host):
    """A host reached over SSH, by either transport: its target (``[USER@]HOST[:PORT]``), the
    SSH options, and where on it proxgpu works.

    With a ``root`` other than ``/`` the host is a directory tree on the remote machine (an
    image): files are written there, but actions and live steps are listed, not run, since they
    would act on the machine itself; ``live=True`` overrides that (the tests use it to drive a
    live apply into a scratch tree).
    """

    def __init__(
        self,
        target: str,
        options: SSHOptions | None = None,
        root: str = "/",
        live: bool | None = None,
    ) -> None:
        super().__init__()
        self.target = target
        self.options = options or SSHOptions()
        self.root = root
        self.is_live = root == "/" if live is None else live
        self.name = target
        self._unconnected()

    def _unconnected(self) -> None:
        """The transport's own state before its first command (no connection yet); a
        transport's own adds to it."""
        #: The connection opened in the background (``open_in_background``), until waited for.
        self._opening: Opening | None = None

    def _await_opening(self) -> None:
        """Wait for a connection opened in the background, once; raise what opening raised."""
        opening, self._opening = self._opening, None
        if opening is not None:
            opening.wait()
