"""Shell completion, generated from the argument parser.

``proxgpu completion bash|zsh|fish`` prints a completion script made by shtab from
:func:`~proxgpu.cli.parser.build_parser`, so it can never lag behind the options. Every option
whose value is a file (``FILE``, ``KEY``) or a directory (``DIR``) completes paths; ``--host``
completes the hosts named in ssh_config (``Host`` lines without patterns) and known_hosts (plain,
not hashed, entries); ``--lxc`` and ``--vm`` the VMIDs of this machine's guests, where it is a
Proxmox VE node (reading ``/etc/pve`` is cheap; asking a remote host is not). The manual
page is generated from the same parser by ``tools/manpage.py``.
"""

from __future__ import annotations

import argparse
import sys

from proxgpu.cli.commandline import CommandLine
from proxgpu.errors import ProxgpuError

#: The shells ``proxgpu completion`` writes scripts for.
SHELLS = ("bash", "zsh", "fish")

#: What an option's value is, by its metavar: the paths completed for it.
_PATHS = {"FILE": "file", "KEY": "file", "DIR": "directory"}

#: The host names in ssh_config files (``Host`` aliases, no patterns) and known_hosts files
#: (every name of a plain line; ``[host]:port`` as host; hashed ``|1|`` and marker lines have
#: none to offer), one a line. Files named ``*known_hosts*`` are read as known_hosts.
_HOST_NAMES = r"""awk 'FNR == 1 { known = FILENAME ~ /known_hosts/ }
!known && tolower($1) == "host" { for (i = 2; i <= NF; i++) if ($i !~ /[*?!]/) print $i }
known && NF >= 2 && $1 !~ /^[#|@]/ {
  n = split($1, names, ",")
  for (i = 1; i <= n; i++) {
    name = names[i]; sub(/^\[/, "", name); sub(/\]:[0-9]+$/, "", name)
    if (name !~ /[*?]/) print name
  }
}'"""

#: The files the host names come from, as ssh reads them by default.
_HOST_FILES = "~/.ssh/config ~/.ssh/known_hosts /etc/ssh/ssh_config /etc/ssh/ssh_known_hosts"

#: What completes each kind of value, as shtab takes it: each shell's call, and the functions
#: they call (``templates/completion.SHELL.j2``), put before the script.
_CALLS = {
    "host": {"bash": "_proxgpu_hosts", "zsh": "_proxgpu_hosts", "fish": "(__proxgpu_hosts)"},
    "lxc": {"bash": "_proxgpu_lxc", "zsh": "_proxgpu_vmids lxc", "fish": "(__proxgpu_vmids lxc)"},
    "vm": {
        "bash": "_proxgpu_qemu",
        "zsh": "_proxgpu_vmids qemu-server",
        "fish": "(__proxgpu_vmids qemu-server)",
    },
}


def _kinds() -> dict[str, dict[str, object]]:
    """Each kind of value's completion, with the shells' functions rendered once for all."""
    # Imported here: Jinja2 is for this subcommand only.
    from proxgpu.rendering.templating import render_template  # noqa: PLC0415

    preamble = {
        shell: render_template(
            f"completion.{shell}.j2", host_files=_HOST_FILES, host_names=_HOST_NAMES
        )
        for shell in SHELLS
    }
    return {kind: {**calls, "preamble": preamble} for kind, calls in _CALLS.items()}


def _parser() -> argparse.ArgumentParser:
    # Imported here: the parser module imports this one for the subcommand's handler.
    from proxgpu.cli.parser import build_parser  # noqa: PLC0415

    return build_parser()


def completion_script(shell: str, parser: argparse.ArgumentParser | None = None) -> str:
    """The completion script for ``shell`` (bash or zsh), from ``parser`` (default: proxgpu's).

    >>> "proxgpu" in completion_script("bash")
    True

    :raises ProxgpuError: for another shell, or when shtab is not installed.
    """
    if shell not in SHELLS:
        raise ProxgpuError(f"no completion for {shell!r}: choose one of {', '.join(SHELLS)}")
    try:
        # Imported on first use: only this subcommand needs it, and every command pays for
        # what the CLI imports at startup.
        import shtab  # noqa: PLC0415
    except ImportError as exc:
        raise ProxgpuError(f"shell completion needs shtab (pip install shtab): {exc}") from exc
    parser = parser or _parser()
    _mark(parser, {"file": shtab.FILE, "directory": shtab.DIRECTORY, **_kinds()})
    script: str = shtab.complete(parser, shell=shell)
    return script if script.endswith("\n") else script + "\n"


def value_kind(action: argparse.Action) -> str | None:
    """What ``action``'s value is, for completion: ``file``, ``directory``, ``host``, ``lxc`` or
    ``vm`` (``None``: nothing to complete from).

    >>> value_kind(argparse.Action(["--root"], "root", metavar="DIR"))
    'directory'
    """
    if action.dest in ("host", "lxc", "vm"):
        return action.dest
    return _PATHS.get(action.metavar) if isinstance(action.metavar, str) else None


def _mark(parser: argparse.ArgumentParser, kinds: dict[str, object]) -> None:
    """Give every option of ``parser`` and its subcommands the completion of its value."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in dict.fromkeys(action.choices.values()):
                _mark(command, kinds)
        elif (kind := value_kind(action)) is not None:
            # shtab reads what completes an option's value from this attribute.
            action.complete = kinds[kind]  # type: ignore[attr-defined]


def cmd_completion(line: CommandLine) -> int:
    r"""``proxgpu completion SHELL``: print the completion script.

    >>> import contextlib, io
    >>> out = io.StringIO()
    >>> with contextlib.redirect_stdout(out):
    ...     status = cmd_completion(CommandLine(command="completion", shell="zsh"))
    >>> status, out.getvalue()[:16]
    (0, '#compdef proxgpu')
    >>> out.getvalue().endswith("\n")
    True
    """
    sys.stdout.write(completion_script(line.shell))
    return 0
