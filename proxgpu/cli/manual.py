"""What ``--help`` ends with and the man page adds to the options: exit codes, environment,
files and examples. Plain data, imported by the parser: nothing here may slow ``--help`` down.

>>> EXIT_CODES[2].code, EXIT_CODES[2].short
(2, 'usage')
>>> "man proxgpu" in help_epilog()
True
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ExitCode:
    """One exit status: ``short`` for ``--help``'s table, ``meaning`` for the man page."""

    code: int
    short: str
    meaning: str


#: Every exit status proxgpu gives (the table of docs/exit-codes.md, with the error classes
#: behind each).
EXIT_CODES = (
    ExitCode(0, "success", "success (plan --detailed-exitcode: nothing would change)"),
    ExitCode(1, "other error", "another error; every error with --detailed-exitcode"),
    ExitCode(
        2,
        "usage",
        "options that cannot work together, an unknown journal entry or GPU index; "
        "plan --detailed-exitcode: changes pending",
    ),
    ExitCode(3, "unreachable", "the host cannot be reached, or did not finish a step"),
    ExitCode(4, "authentication", "SSH authentication failed"),
    ExitCode(5, "host key", "the SSH host key is unknown or changed"),
    ExitCode(6, "not root", "the command needs root on the host"),
    ExitCode(7, "host command", "a command on the host failed or timed out; a Proxmox API call"),
    ExitCode(8, "sysfs", "a sysfs or procfs file is missing or unparsable"),
    ExitCode(9, "plan refused", "the plan was refused (each problem with its fix)"),
    ExitCode(10, "preflight", "apply or rollback refused before writing anything"),
    ExitCode(11, "locked", "another apply or rollback holds the lock (--break-lock)"),
    ExitCode(12, "apply failed", "the apply failed; everything was restored"),
    ExitCode(13, "rollback failed", "the rollback failed"),
    ExitCode(14, "live rebind", "the live rebind failed"),
    ExitCode(15, "journal", "the journal is unreadable"),
    ExitCode(16, "render", "the plan cannot be rendered (a guest config missing)"),
    ExitCode(17, "drift", "verify found drift since the last apply"),
    ExitCode(18, "straddles", "check-gpus: the GPUs straddle NUMA nodes"),
    ExitCode(19, "node unknown", "check-gpus: a GPU's NUMA node is unknown"),
    ExitCode(126, "cannot run", "run: COMMAND was found but cannot be run"),
    ExitCode(127, "not found", "run: COMMAND was not found"),
    ExitCode(130, "interrupted", "interrupted (Ctrl-C)"),
    ExitCode(141, "pipe closed", "the reader of the output went away (proxgpu ... | head)"),
)

#: The environment variables proxgpu reads, and what each does.
ENVIRONMENT = (
    ("NO_COLOR", "no colour with --color auto (an explicit --color always still colours)"),
    ("TERM", "dumb: no colour with --color auto"),
    ("PROXGPU_DEBUG", "set: an internal error prints its traceback instead of one line"),
    ("XDG_CONFIG_HOME", "where this machine's signing key is kept (default ~/.config)"),
    ("SSH_AUTH_SOCK", "the ssh-agent whose keys SSH offers"),
)

#: The files proxgpu reads or writes, and why.
FILES = (
    ("~/.ssh/config", "SSH settings for --host (or --ssh-config FILE)"),
    ("~/.ssh/known_hosts", "the host keys SSH verifies against (or --known-hosts FILE)"),
    ("~/.config/proxgpu/key", "this machine's key, signing saved plans and journal entries"),
    ("/var/lib/proxgpu/journal/", "on the host: one entry per apply and rollback"),
    ("/var/lib/proxgpu/backups/", "on the host: the files as they were before each apply"),
    ("/run/lock/proxgpu", "on the host: held while an apply or rollback runs"),
    ("/etc/pve/lxc/VMID.conf", "the container's config: its GPUs, cpuset and cores"),
    ("/etc/pve/qemu-server/VMID.conf", "the VM's config: its hostpci entries and pinning"),
    ("/etc/modprobe.d/00-proxgpu-vfio.conf", "the boot-time binding to vfio-pci"),
)

#: Commands a new user starts from, with what each does.
EXAMPLES = (
    ("proxgpu inspect --host root@pve1", "the GPUs, NUMA nodes and IOMMU groups of pve1"),
    (
        "proxgpu plan --host root@pve1 --lxc 200 --vm 300",
        "the split and every file change it needs, changing nothing",
    ),
    ("proxgpu apply --host root@pve1 --lxc 200 --vm 300", "the same, applied after asking"),
    ("proxgpu verify --host root@pve1", "exit 17 when the host drifted from the last apply"),
    ("proxgpu rollback --host root@pve1", "undo the last apply"),
    ("proxgpu run --tp 4 -- vllm serve MODEL", "run on 4 GPUs of one NUMA node, bound to it"),
    (
        "proxgpu completion fish > ~/.config/fish/completions/proxgpu.fish",
        "tab completion for fish (bash and zsh too)",
    ),
)


#: How the commands go together, at the end of ``--help`` and in the man page.
TYPICAL = (
    "Typical use: proxgpu plan --host root@pve1 --lxc 200 --vm 300, review the diff,\n"
    "then the same with apply."
)


def help_epilog() -> str:
    """The end of ``proxgpu --help``: a typical use and the exit codes' short table."""
    width = max(len(e.short) for e in EXIT_CODES) + 5
    cells = [f"{e.code:>3}  {e.short}".ljust(width) for e in EXIT_CODES]
    half = (len(cells) + 1) // 2
    right = [*cells[half:], ""][:half]
    rows = ["  " + (a + b).rstrip() for a, b in zip(cells[:half], right, strict=True)]
    return (
        f"{TYPICAL}\n\nexit status:\n" + "\n".join(rows) + "\n\n"
        "With --detailed-exitcode: 0 no changes, 2 changes pending, 1 any error.\n"
        "Each code, the environment, files and examples: man proxgpu"
    )


def roff_sections() -> dict[str, str]:
    """The man page's EXIT STATUS, ENVIRONMENT, FILES and EXAMPLES, as roff."""
    return {
        "exit status": _tagged((str(e.code), e.meaning) for e in EXIT_CODES),
        "environment": _tagged(ENVIRONMENT),
        "files": _tagged(FILES),
        "examples": _tagged(EXAMPLES),
    }


def _tagged(items: Iterable[tuple[str, str]]) -> str:
    return "\n".join(f".TP\n.B {_roff(tag)}\n{_roff(text)}" for tag, text in items)


def _roff(text: str) -> str:
    # A backslash and a leading dot or quote are roff's; hyphens in options are minus signs.
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text
