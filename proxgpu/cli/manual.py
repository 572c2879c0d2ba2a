"""What ``--help`` ends with: a typical use and the exit codes (the man page, made by
``tools/manpage.py``, gives each code's meaning in full). Plain data, imported by the parser:
nothing here may slow ``--help`` down.

>>> EXIT_CODES[2][:2]
(2, 'usage')
>>> "man proxgpu" in help_epilog()
True
"""

from __future__ import annotations

#: One exit status: the code, its short name for ``--help``'s table, its meaning for the man
#: page. A plain tuple, as the parser's forwarded options are: ``--help`` imports this module,
#: and a dataclass would make it import ``dataclasses`` (and ``inspect``), some 6 ms.
ExitCode = tuple[int, str, str]

#: Every exit status proxgpu gives (the table of docs/exit-codes.md, with the error classes
#: behind each).
EXIT_CODES: tuple[ExitCode, ...] = (
    (0, "success", "success (plan --detailed-exitcode: nothing would change)"),
    (1, "other error", "another error; every error with --detailed-exitcode"),
    (
        2,
        "usage",
        "options that cannot work together, an unknown journal entry or GPU index; "
        "plan --detailed-exitcode: changes pending",
    ),
    (3, "unreachable", "the host cannot be reached, or did not finish a step"),
    (4, "authentication", "SSH authentication failed"),
    (5, "host key", "the SSH host key is unknown or changed"),
    (6, "not root", "the command needs root on the host"),
    (7, "host command", "a command on the host failed or timed out; a Proxmox API call"),
    (8, "sysfs", "a sysfs or procfs file is missing or unparsable"),
    (9, "plan refused", "the plan was refused (each problem with its fix)"),
    (10, "preflight", "apply or rollback refused before writing anything"),
    (11, "locked", "another apply or rollback holds the lock (--break-lock)"),
    (12, "apply failed", "the apply failed; everything was restored"),
    (13, "rollback failed", "the rollback failed"),
    (14, "live rebind", "the live rebind failed"),
    (15, "journal", "the journal is unreadable"),
    (16, "render", "the plan cannot be rendered (a guest config missing)"),
    (17, "drift", "verify found drift since the last apply"),
    (18, "straddles", "check-gpus: the GPUs straddle NUMA nodes"),
    (19, "node unknown", "check-gpus: a GPU's NUMA node is unknown"),
    (126, "cannot run", "run: COMMAND was found but cannot be run"),
    (127, "not found", "run: COMMAND was not found"),
    (130, "interrupted", "interrupted (Ctrl-C)"),
    (141, "pipe closed", "the reader of the output went away (proxgpu ... | head)"),
)


#: How the commands go together, at the end of ``--help`` and in the man page.
TYPICAL = (
    "Typical use: proxgpu plan --host root@pve1 --lxc 200 --vm 300, review the diff,\n"
    "then the same with apply."
)


def help_epilog() -> str:
    """The end of ``proxgpu --help``: a typical use and the exit codes' short table."""
    width = max(len(short) for _, short, _ in EXIT_CODES) + 5
    cells = [f"{code:>3}  {short}".ljust(width) for code, short, _ in EXIT_CODES]
    half = (len(cells) + 1) // 2
    right = [*cells[half:], ""][:half]
    rows = ["  " + (a + b).rstrip() for a, b in zip(cells[:half], right, strict=True)]
    return (
        f"{TYPICAL}\n\nexit status:\n" + "\n".join(rows) + "\n\n"
        "With --detailed-exitcode: 0 no changes, 2 changes pending, 1 any error.\n"
        "Each code, the environment, files and examples: man proxgpu"
    )
