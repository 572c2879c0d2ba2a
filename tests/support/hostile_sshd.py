"""Real OpenSSH servers that offer only what a hostile or outdated host would (3des-cbc,
hmac-md5, SHA-1 key exchange, ssh-rsa and ssh-dss host keys), and a ProxyCommand relay that
writes down the arguments ssh_config expanded for it.

Each server is the ``sshd`` binary on a free loopback port with its own keys under the given
folder (see :mod:`tests.support.sshd`); ``extra`` lines go at the top of its config, where sshd
takes the first value it reads.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.sshd import Sshd, _config, free_port, keygen, serving

#: A ProxyCommand: ``python3 RELAY LOG HOST PORT`` records ``HOST PORT`` in LOG, then relays
#: stdin and stdout to that TCP port, as ``nc %h %p`` does.
RELAY = """\
import socket, sys, threading
log, host, port = sys.argv[1:]
open(log, "a").write(f"{host} {port}\\n")
sock = socket.create_connection((host, int(port)))
def up():
    while data := sys.stdin.buffer.raw.read(65536):
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := sock.recv(65536):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"""


def relay_command(folder: Path) -> tuple[str, Path]:
    """A ProxyCommand line for ssh_config (with ``%h %p``) and the log it writes."""
    script, log = folder / "relay.py", folder / "relay.log"
    script.write_text(RELAY)
    return f"ProxyCommand {sys.executable} {script} {log} %h %p", log


@contextmanager
def offering(work: Path, extra: str, host_key: str = "ed25519") -> Iterator[Sshd]:
    """An sshd under ``work`` whose config starts with ``extra`` (``Ciphers 3des-cbc``), with a
    host key of type ``host_key``; stopped on exit."""
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", host_key, "-N", "", "-f", str(work / "host_key")], check=True
    )
    keygen(work / "user_key")
    (work / "authorized_keys").write_text((work / "user_key.pub").read_text())
    port = free_port()
    (work / "sshd_config").write_text(extra + "\n" + _config(work, port, ["127.0.0.1"]))
    with serving(work, port) as server:
        yield server


#: The ForceCommand of a lying host: every command it is sent runs, except the step named in
#: ``lie_to`` (each script's first line names its step: ``proxgpu_step=NAME``), which is answered
#: with exit 0 and the bytes of ``answer`` instead.
LIAR = """#!/bin/sh
step=$(cat {folder}/lie_to 2>/dev/null)
case $step:$SSH_ORIGINAL_COMMAND in
    ?*:*"proxgpu_step=$step "*) cat {folder}/answer; exit 0 ;;
esac
exec sh -c "$SSH_ORIGINAL_COMMAND"
"""


@dataclass(frozen=True)
class Liar:
    """A real sshd that runs what it is sent, but answers one step without running it."""

    sshd: Sshd
    folder: Path

    def lie_about(self, step: str | None, answer: str = "") -> None:
        """From now on answer ``step`` (a script's name) with exit 0 and ``answer``, running
        nothing; ``None``: be honest again."""
        (self.folder / "lie_to").write_text(step or "")
        (self.folder / "answer").write_text(answer)


@contextmanager
def lying(work: Path) -> Iterator[Liar]:
    """A lying host under ``work`` (see :data:`LIAR`), honest until told otherwise."""
    work.mkdir(parents=True, exist_ok=True)
    wrapper = work / "liar.sh"
    wrapper.write_text(LIAR.format(folder=work))
    wrapper.chmod(0o755)
    (work / "lie_to").write_text("")
    with offering(work, f"ForceCommand {wrapper}") as server:
        yield Liar(sshd=server, folder=work)
