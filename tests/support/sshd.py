"""A real OpenSSH server on 127.0.0.1 with throwaway host and user keys.

Used by the test suite (``sshd`` fixture) and by ``bench/bench_inspect.py``. It listens on loopback
only, on a port free at start-up, and accepts exactly one user key; :func:`client_options` are the
SSH options that reach it.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from proxgpu.host.ssh import SSHOptions

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Sshd:
    """A running sshd and the keys that reach it."""

    port: int
    user: str
    identity_file: Path
    known_hosts: Path
    host_public_key: str
    workdir: Path
    #: The listening sshd's process id.
    pid: int

    @property
    def target(self) -> str:
        """``user@127.0.0.1:port``, as ``--host`` takes it."""
        return f"{self.user}@127.0.0.1:{self.port}"

    def served_cpu_seconds(self, settle: float = 5.0) -> float:
        """CPU seconds (user and system) of every connection this sshd has served: each one's
        sshd and the commands it ran, which the kernel adds to the listener's ``cutime`` and
        ``cstime`` (``/proc/PID/stat``) as it reaps them. Waits up to ``settle`` seconds for
        the connections still open to end, so that a benchmark's last ones are counted."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        deadline = time.monotonic() + settle
        while children.exists() and children.read_text().strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        # The command name in parentheses may hold blanks: the numbers come after it.
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        # Fields 16 and 17 of proc(5), cutime and cstime: fields[13:15] after the name.
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def keygen(path: Path) -> None:
    """Write a passphrase-less ed25519 key pair at ``path`` and ``path.pub``."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("sshd did not start listening")


def _config(work: Path, port: int, addresses: Sequence[str], max_sessions: int = 200) -> str:
    listen = "".join(f"ListenAddress {address}\n" for address in addresses)
    return (
        f"Port {port}\n{listen}HostKey {work}/host_key\nPidFile {work}/sshd.pid\n"
        f"AuthorizedKeysFile {work}/authorized_keys\nStrictModes no\nUsePAM no\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nAllowTcpForwarding yes\nLogLevel ERROR\n"
        # One server stands for a whole fleet in the fleet tests and benchmark: let it take
        # as many connections at once as a fleet of hosts would.
        f"MaxStartups 200\nMaxSessions {max_sessions}\n"
        # A Proxmox host's root has Debian's stock ~/.bashrc, which bash reads for a command
        # from sshd only at shell level 1. This machine's root may start tool managers (pyenv)
        # there: about a hundred processes per command, charged to proxgpu and `ssh true` alike.
        "SetEnv SHLVL=1\n"
    )


def sign(ca: Path, public_key: Path, identity: str, principals: str, *, host: bool) -> Path:
    """Certify ``public_key`` with the CA key ``ca`` (``ssh-keygen -s``); returns the
    certificate (``NAME-cert.pub`` beside the key, where OpenSSH looks for it)."""
    kind = ["-h"] if host else []
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-s",
            str(ca),
            "-I",
            identity,
            *kind,
            "-n",
            principals,
            str(public_key),
        ],
        check=True,
    )
    return public_key.with_name(public_key.name.removesuffix(".pub") + "-cert.pub")


def _certificates(work: Path, addresses: Sequence[str]) -> str:
    # A CA (work/ca) certifies the host key for the addresses and trusts user certificates.
    keygen(work / "ca")
    cert = sign(work / "ca", work / "host_key.pub", "host", ",".join(addresses), host=True)
    return f"HostCertificate {cert}\nTrustedUserCAKeys {work}/ca.pub\n"


@contextmanager
def running_sshd(
    work: Path,
    addresses: Sequence[str] = ("127.0.0.1",),
    *,
    certificates: bool = False,
    max_sessions: int = 200,
) -> Iterator[Sshd]:
    """Start sshd with keys and config under ``work``; stop it on exit. It listens on each of
    ``addresses`` (loopback ones only: all of 127/8 is loopback, so several stand for the nodes
    of a cluster), with the same port and host key on each. With ``certificates`` a CA
    (``work/ca``) has certified the host key, and user certificates it signs are accepted. It
    takes ``max_sessions`` commands at once on one connection."""
    assert all(a.startswith("127.") for a in addresses), "loopback only"
    keygen(work / "host_key")
    keygen(work / "user_key")
    (work / "authorized_keys").write_text((work / "user_key.pub").read_text())
    port = free_port()
    extra = _certificates(work, addresses) if certificates else ""
    (work / "sshd_config").write_text(_config(work, port, addresses, max_sessions) + extra)
    with serving(work, port, addresses) as server:
        yield server


@contextmanager
def serving(work: Path, port: int, addresses: Sequence[str] = ("127.0.0.1",)) -> Iterator[Sshd]:
    """Run sshd with ``work``'s config, keys and authorized_keys, listening on ``port``; write
    its host key into ``work``/known_hosts for each of ``addresses``; stop it on exit."""
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(work / "sshd_config")], stderr=subprocess.PIPE
    )
    try:
        _wait_listening(port, proc)
        kind, key = (work / "host_key.pub").read_text().split()[:2]
        known = "".join(f"[{address}]:{port} {kind} {key}\n" for address in addresses)
        (work / "known_hosts").write_text(known)
        yield Sshd(
            port,
            getpass.getuser(),
            work / "user_key",
            work / "known_hosts",
            f"{kind} {key}",
            work,
            proc.pid,
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def client_options(server: Sshd, workdir: Path, **overrides: Any) -> SSHOptions:
    """Options that reach ``server`` with its user key and pinned host key, and an empty
    ssh_config (written into ``workdir``) so that the user's own config plays no part."""
    empty_config = workdir / "ssh_config"
    empty_config.touch()
    options = SSHOptions(
        identity_file=str(server.identity_file),
        known_hosts=str(server.known_hosts),
        ssh_config=str(empty_config),
        connect_timeout=5.0,
        global_known_hosts=str(workdir / "global_known_hosts"),
    )
    return replace(options, **overrides)


def known_hosts_with_another_key(server: Sshd, workdir: Path) -> tuple[Path, str]:
    """A known_hosts file in ``workdir`` that pins another key for ``server``, as after the host
    was reinstalled; returns the file and that other key's base64."""
    keygen(workdir / "other")
    kind, key = (workdir / "other.pub").read_text().split()[:2]
    known = workdir / "known_hosts"
    known.write_text(f"[127.0.0.1]:{server.port} {kind} {key}\n")
    return known, key
