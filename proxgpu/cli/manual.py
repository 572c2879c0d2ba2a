"""What ``--help`` ends with: a typical use and the exit codes (the man page, made by
``tools/manpage.py``, gives each code's meaning in full). Plain data, imported by the parser:
nothing here may slow ``--help`` down.

>>> EXIT_CODES[2].code, EXIT_CODES[2].short
(2, 'usage')
>>> "man proxgpu" in help_epilog()
True
"""

from __future__ import annotations

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
