"""The argument parser: every subcommand and its options.

What each command runs is :mod:`~proxgpu.cli.registry`'s, imported only once a command runs
(and with it pydantic, paramiko, jinja2), so that ``--help`` and a usage error cost little more
than starting Python.

>>> build_parser().parse_args(["inspect", "--json"]).command
'inspect'
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeAlias

from proxgpu.cli.manual import help_epilog
from proxgpu.cli.options import (
    Once,
    VersionAction,
    common_options,
    forwarded,
    gpu_options,
    host_options,
    plan_options,
)
from proxgpu.errors import UsageError

Commands: TypeAlias = "argparse._SubParsersAction[Parser]"


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose option errors are :class:`UsageError`: the command line reports
    them as it reports every other error (with ``--json``, as a JSON document too). As git's and
    ssh's options do, a long option is only ever its whole name (``--lx`` is not ``--lxc``), and
    an option that takes one value takes it once (:class:`Once`).

    >>> build_parser().parse_args(["plan", "--bogus"])
    Traceback (most recent call last):
    ...
    proxgpu.errors.UsageError: unrecognized arguments: --bogus (see proxgpu --help)
    >>> build_parser().parse_args(["plan", "--lx", "200"])
    Traceback (most recent call last):
    ...
    proxgpu.errors.UsageError: unrecognized arguments: --lx 200 (see proxgpu --help)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.register("action", None, Once)
        self.register("action", "store", Once)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser for every subcommand; with ``command``, for that one alone.

    A command line that starts with a command's name is parsed by that command's options
    only: building every command's (some 250 options) is half of what parsing costs, paid by
    every run before anything starts.

    >>> build_parser("plan").parse_args(["plan", "--split", "numa"]).split
    'numa'
    """
    parser = Parser(
        prog="proxgpu",
        description="Partition a Proxmox VE host's GPUs along NUMA lines.",
        epilog=help_epilog(),
        # The epilog's exit-code table keeps its lines.
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, add in _COMMANDS.items():
        if command in (None, name):
            add(sub)
    return parser


def parser_for(arguments: list[str]) -> argparse.ArgumentParser:
    """The parser for ``arguments``: the command's alone where they start with its name (see
    :func:`build_parser`), else the whole one (``--help``, ``--version``, a mistyped name).

    >>> parser_for(["inspect", "--json"]).parse_args(["inspect", "--json"]).json
    True
    """
    named = arguments[0] if arguments and arguments[0] in _COMMANDS else None
    return build_parser(named)


def _completion(sub: Commands) -> None:
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or fish)",
        description="Print a shell completion script, e.g. "
        "`proxgpu completion bash > /etc/bash_completion.d/proxgpu` or "
        "`proxgpu completion fish > ~/.config/fish/completions/proxgpu.fish`.",
    )
    completion.add_argument("shell", choices=["bash", "zsh", "fish"])


def _command(
    sub: Commands,
    name: str,
    summary: str,
    json_help: str,
    *,
    rolling: bool = False,
    gpus: bool = True,
) -> argparse.ArgumentParser:
    command = sub.add_parser(name, help=summary, description=summary)
    # The host options, for the commands a command says to run next on the same host.
    command.set_defaults(host_options=forwarded(host_options(command, rolling=rolling, gpus=gpus)))
    common_options(command, json_help=json_help)
    return command


def _inspect(sub: Commands) -> None:
    inspect = _command(
        sub,
        "inspect",
        "show GPUs, NUMA nodes, IOMMU groups and drivers",
        "the inventory",
    )
    inspect.add_argument(
        "--format",
        choices=["text", "svg"],
        default="text",
        help="text (default) or svg: a diagram of the NUMA nodes, PCIe tree, GPUs and IOMMU groups",
    )
    inspect.add_argument(
        "--tree",
        action="store_true",
        help="print the NUMA nodes and PCIe tree down to each GPU as text (like lstopo)",
    )
    inspect.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE (default, or -: stdout); with several hosts one FILE holds them all, "
        "DIR/ or a {host} in the name makes a file per host",
    )


def _report(sub: Commands) -> None:
    report = _command(
        sub,
        "report",
        "write the split as one self-contained HTML file: picture, warnings, diff, actions",
        "what was written",
    )
    # One file with a section per host, each naming the commands that apply its plan.
    report.set_defaults(split_options=forwarded(plan_options(report)))
    report.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the HTML file (-: stdout)"
    )


def _snapshot(sub: Commands) -> None:
    snapshot = _command(
        sub, "snapshot", "capture what inspection reads into a directory", "what was written"
    )
    snapshot.add_argument("-o", "--output", required=True, metavar="DIR", type=_directory)


def _directory(value: str) -> str:
    """A snapshot is a tree of files: ``-`` (stdout, for every other ``-o``) cannot hold one."""
    if value == "-":
        raise argparse.ArgumentTypeError("a snapshot is a directory tree, not a stream: -o DIR")
    return value


def _detailed_exitcode(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 0 when nothing would change, 2 when changes (or a reboot) are pending, "
        "1 on error",
    )


def _plan(sub: Commands) -> None:
    plan = _command(
        sub, "plan", "show the split and the file changes it needs (dry run)", "the plan"
    )
    plan.set_defaults(split_options=forwarded(plan_options(plan)))
    _detailed_exitcode(plan)
    plan.add_argument(
        "--out",
        metavar="FILE",
        help="save the plan (with the hashes of every file it read) for `apply --plan FILE`",
    )


def _apply(sub: Commands) -> None:
    apply = _command(
        sub,
        "apply",
        "apply the split: preflight, backup, atomic writes, actions",
        "the result",
        rolling=True,
    )
    # A saved plan is the whole request: a split option beside --plan is refused, not ignored.
    apply.set_defaults(split_options=forwarded(plan_options(apply)))
    apply.add_argument(
        "--plan",
        metavar="FILE",
        help="apply exactly this saved plan (`plan --out`), refusing if a file it read changed",
    )
    apply.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    apply.add_argument("--dry-run", action="store_true", help="check everything, change nothing")
    _detailed_exitcode(apply)
    apply.add_argument(
        "--live", action="store_true", help="also rebind the vfio group now, without a reboot"
    )
    apply.add_argument(
        "--skip-guest-check",
        action="store_true",
        help="do not ask Proxmox whether the target guests are stopped",
    )
    apply.add_argument(
        "--break-lock",
        action="store_true",
        help="take over a lock left by an interrupted apply or rollback (see proxgpu history)",
    )
    _trust_unsigned(apply, "a --plan file")


def _verify(sub: Commands) -> None:
    verify = _command(
        sub,
        "verify",
        "compare the host with the last apply (exit 17: drift)",
        "the report",
        gpus=False,
    )
    verify.add_argument("--to", metavar="ID", help="journal entry (default: the last applied)")
    verify.add_argument(
        "--no-guests",
        dest="guests",
        action="store_false",
        help="the host alone: do not look at the guests (the user space each container holds, "
        "what each running guest holds of its GPUs)",
    )
    _trust_unsigned(verify, "a journal entry")


def _rollback(sub: Commands) -> None:
    back = _command(
        sub,
        "rollback",
        "undo a journal entry: what the apply changed, nothing else",
        "the result",
        rolling=True,
        gpus=False,
    )
    back.add_argument("--to", metavar="ID", help="journal entry (default: the last apply)")
    back.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    back.add_argument(
        "--dry-run",
        action="store_true",
        help="show what the rollback would restore and run again, change nothing",
    )
    back.add_argument(
        "--force",
        action="store_true",
        help="even if an entry the apply wrote changed since: put the whole backup back",
    )
    back.add_argument(
        "--live", action="store_true", help="also return rebound functions to their drivers now"
    )
    back.add_argument(
        "--break-lock",
        action="store_true",
        help="take over a lock left by an interrupted apply or rollback",
    )
    _trust_unsigned(back, "a journal entry")


def _trust_unsigned(command: argparse.ArgumentParser, what: str) -> None:
    command.add_argument(
        "--trust-unsigned",
        action="store_true",
        help=f"accept {what} not signed with this machine's key (~/.config/proxgpu/key)",
    )


def _history(sub: Commands) -> None:
    _command(sub, "history", "list the journal of applies and rollbacks", "the entries", gpus=False)


def _check_gpus(sub: Commands) -> None:
    check = _command(
        sub,
        "check-gpus",
        "is a GPU set NUMA-local? (exit 0 yes, 18 it straddles nodes, 19 cannot tell)",
        "the check",
    )
    check.add_argument(
        "gpus",
        help="CUDA indexes (nvidia-smi's; CUDA numbers so with CUDA_DEVICE_ORDER=PCI_BUS_ID) "
        "or addresses, comma-separated",
    )


def _run(sub: Commands) -> None:
    summary = "run COMMAND here on N GPUs of one NUMA node, its CPUs and memory bound to that node"
    run = sub.add_parser(
        "run",
        help=summary,
        description=f"{summary}: sets CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER=PCI_BUS_ID "
        "(HIP_VISIBLE_DEVICES for AMD, ZE_AFFINITY_MASK for Intel), binds with numactl when "
        "installed, says what it chose on stderr, then execs COMMAND. On a host or inside the "
        "container.",
        epilog="Example: proxgpu run --tp 4 -- vllm serve MODEL --tensor-parallel-size 4",
    )
    run.add_argument("--tp", type=int, required=True, metavar="N", help="how many GPUs")
    run.add_argument(
        "--node",
        type=int,
        metavar="K",
        help="this NUMA node (default: the lowest-numbered one with N GPUs)",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the environment (KEY=value lines) and the command instead of running it",
    )
    run.add_argument(
        "--root",
        metavar="DIR",
        help="read the GPUs and NUMA nodes from a directory laid out like this machine",
    )
    gpu_options(run)
    common_options(run, json_help="the choice and the environment (with --dry-run)")
    run.add_argument(
        "job",  # not "command", the subcommand's own name
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND...",
        help="the command and its arguments, after --",
    )
    # It runs here: never on another host, one at a time.
    run.set_defaults(host=None, cluster=False)


#: Each command's name and what adds it, in the order --help lists them.
_COMMANDS: dict[str, Callable[[Commands], None]] = {
    "inspect": _inspect,
    "snapshot": _snapshot,
    "plan": _plan,
    "apply": _apply,
    "verify": _verify,
    "rollback": _rollback,
    "history": _history,
    "check-gpus": _check_gpus,
    "run": _run,
    "report": _report,
    "completion": _completion,
}
