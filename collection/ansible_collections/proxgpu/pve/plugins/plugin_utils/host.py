"""proxgpu's host over the play's own connection: the Proxmox host needs only a POSIX shell.

An action plugin runs on the controller; every command proxgpu sends (its POSIX ``sh`` scripts,
one per step) goes through ``ActionBase._low_level_execute_command``, so Ansible's connection
settings, ``become`` and jump hosts apply as they do for ``raw``.

Two things about that call shape the command line:

* stdin must never be empty: the ssh connection gives a command without input data a terminal
  (``ssh -tt``), which turns ``\\n`` into ``\\r\\n`` and mixes stderr into stdout. So a header
  line always goes first, and the command reads it off before it starts (``read`` takes one
  byte at a time from a pipe, so the rest of stdin is the command's, byte for byte);
* Ansible hands stdout back as text: decoded with ``surrogateescape`` and encoded back, it is
  the command's bytes again (the gather script writes NUL bytes and base64).

>>> framed("sh -c 'cat'")
"IFS= read -r proxgpu_header && sh -c 'cat'"
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleConnectionFailure

from proxgpu.errors import HostUnreachableError, UsageError
from proxgpu.host.command import CommandHost

#: The line every command's stdin starts with (see the module docstring).
HEADER = b"proxgpu\n"


def framed(command: str) -> str:
    """``command`` behind the ``read`` that takes the :data:`HEADER` line off its stdin."""
    return f"IFS= read -r proxgpu_header && {command}"


def as_bytes(text: str) -> bytes:
    """What Ansible decoded with ``surrogateescape``, as the bytes the command wrote.

    >>> as_bytes(b"a\\x00\\xff".decode("utf-8", "surrogateescape"))
    b'a\\x00\\xff'
    """
    return text.encode("utf-8", "surrogateescape")


def action_host(action: Any, name: str, root: str | None) -> CommandHost:
    """The host ``action`` (an ``ActionBase``) runs on, as a proxgpu host named ``name``;
    ``root`` is a directory on it laid out like a host (an image), ``None`` the host itself.

    :raises UsageError: when the connection cannot pass stdin to a command (paramiko).
    """
    connection = action._connection
    if not connection.has_pipelining:
        raise UsageError(
            f"{name}: the {connection.transport} connection cannot give a command its stdin; "
            "use ansible.builtin.ssh (the default) or ansible.builtin.local"
        )

    def execute(command: str, stdin: bytes) -> tuple[int, bytes, bytes]:
        try:
            done = action._low_level_execute_command(
                framed(command),
                in_data=HEADER + stdin,
                sudoable=True,
                encoding_errors="surrogate_or_strict",
            )
        except AnsibleConnectionFailure as exc:
            raise HostUnreachableError(name, str(exc)) from exc
        return int(done["rc"]), as_bytes(done["stdout"]), as_bytes(done["stderr"])

    return CommandHost(name, execute, root=root or "/")
