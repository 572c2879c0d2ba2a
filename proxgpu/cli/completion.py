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
from types import ModuleType

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

#: Each shell's functions for hosts (the awk program over the files that exist) and VMIDs.
_HOSTS_PREAMBLE = {
    "bash": f"""
_proxgpu_host_names() {{
  local f files=()
  for f in {_HOST_FILES}; do [[ -r $f ]] && files+=("$f"); done
  ((${{#files[@]}})) && {_HOST_NAMES} "${{files[@]}}" | sort -u
}}
# [USER@]HOST: the user part is kept, the host part completed.
_proxgpu_hosts() {{
  local user=""
  [[ $1 == *@* ]] && user="${{1%%@*}}@"
  compgen -P "$user" -W "$(_proxgpu_host_names)" -- "${{1#*@}}"
}}
_proxgpu_vmids() {{
  local f ids=()
  for f in /etc/pve/"$2"/*.conf; do [[ -e $f ]] && ids+=("$(basename "$f" .conf)"); done
  compgen -W "${{ids[*]}}" -- "$1"
}}
_proxgpu_lxc() {{ _proxgpu_vmids "$1" lxc; }}
_proxgpu_qemu() {{ _proxgpu_vmids "$1" qemu-server; }}
""",
    "zsh": f"""
_proxgpu_hosts() {{
  local f; local -a files names
  for f in {_HOST_FILES}; do [[ -r $f ]] && files+=("$f"); done
  (( $#files )) && names=(${{(f)"$({_HOST_NAMES} "${{files[@]}}" | sort -u)"}})
  compset -P '*@'
  compadd -a names
}}
_proxgpu_vmids() {{
  local -a ids
  ids=(/etc/pve/$1/*.conf(N:t:r))
  compadd -a ids
}}
""",
    "fish": f"""
function __proxgpu_hosts
  # An empty list, not "", would leave no names at all in $user$name.
  set -l user (string match -r '^[^@]*@' -- (commandline -ct); or echo)
  set -l files
  for f in {_HOST_FILES}
    test -r $f; and set -a files $f
  end
  test (count $files) -gt 0; or return
  for name in ({_HOST_NAMES} $files | sort -u)
    echo $user$name
  end
end
function __proxgpu_vmids
  for f in /etc/pve/$argv[1]/*.conf
    basename $f .conf
  end
end
""",
}

#: The completion of each kind of value, as shtab takes it (shell -> what completes it).
_KINDS: dict[str, dict[str, object]] = {
    "host": {
        "bash": "_proxgpu_hosts",
        "zsh": "_proxgpu_hosts",
        "fish": "(__proxgpu_hosts)",
        "preamble": _HOSTS_PREAMBLE,
    },
    "lxc": {
        "bash": "_proxgpu_lxc",
        "zsh": "_proxgpu_vmids lxc",
        "fish": "(__proxgpu_vmids lxc)",
        "preamble": _HOSTS_PREAMBLE,
    },
    "vm": {
        "bash": "_proxgpu_qemu",
        "zsh": "_proxgpu_vmids qemu-server",
        "fish": "(__proxgpu_vmids qemu-server)",
        "preamble": _HOSTS_PREAMBLE,
    },
}


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
    _mark(parser, shtab)
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


def _mark(parser: argparse.ArgumentParser, shtab: ModuleType) -> None:
    """Give every option of ``parser`` and its subcommands the completion of its value."""
    kinds = {"file": shtab.FILE, "directory": shtab.DIRECTORY, **_KINDS}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in dict.fromkeys(action.choices.values()):
                _mark(command, shtab)
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
