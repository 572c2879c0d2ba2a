"""The argument parser: every subcommand and its options."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from proxgpu.cli.commands import (
    cmd_apply,
    cmd_check_gpus,
    cmd_history,
    cmd_inspect,
    cmd_plan,
    cmd_rollback,
    cmd_snapshot,
    cmd_verify,
)
from proxgpu.cli.options import host_options, plan_options

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="proxgpu",
        description="Partition a Proxmox VE host's GPUs along NUMA lines.",
        epilog="Typical use: proxgpu plan --host root@pve1 --lxc 200 --vm 300, review the diff, "
        "then the same with apply. Exit codes are listed in README.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = sub.add_parser("inspect", help="show GPUs, NUMA nodes, IOMMU groups and drivers")
    host_options(inspect)
    inspect.add_argument("--json", action="store_true", help="print the inventory as JSON")
    inspect.set_defaults(handler=cmd_inspect)
    snapshot = sub.add_parser("snapshot", help="capture what inspection reads into a directory")
    host_options(snapshot)
    snapshot.add_argument("-o", "--output", required=True, metavar="DIR")
    snapshot.set_defaults(handler=cmd_snapshot)
    plan = sub.add_parser("plan", help="show the split and the file changes it needs (dry run)")
    host_options(plan)
    plan_options(plan)
    plan.add_argument("--json", action="store_true", help="print the plan and changes as JSON")
    plan.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 0 when nothing would change, 2 when changes are pending, 1 on error",
    )
    plan.set_defaults(handler=cmd_plan)
    apply = sub.add_parser(
        "apply", help="apply the split: preflight, backup, atomic writes, actions"
    )
    host_options(apply)
    plan_options(apply)
    apply.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    apply.add_argument("--dry-run", action="store_true", help="check everything, change nothing")
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
    apply.add_argument("--json", action="store_true", help="print the result as one JSON document")
    apply.set_defaults(handler=cmd_apply)
    verify_cmd = sub.add_parser(
        "verify", help="compare the host with the last apply (exit 17: drift)"
    )
    host_options(verify_cmd)
    verify_cmd.add_argument("--to", metavar="ID", help="journal entry (default: the last applied)")
    verify_cmd.add_argument("--json", action="store_true")
    verify_cmd.set_defaults(handler=cmd_verify)
    back = sub.add_parser("rollback", help="restore the files of a journal entry byte for byte")
    host_options(back)
    back.add_argument("--to", metavar="ID", help="journal entry (default: the last apply)")
    back.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    back.add_argument("--force", action="store_true", help="even if files changed since the apply")
    back.add_argument(
        "--live", action="store_true", help="also return rebound functions to their drivers now"
    )
    back.add_argument(
        "--break-lock", action="store_true", help="take over a lock left by an interrupted apply"
    )
    back.set_defaults(handler=cmd_rollback)
    hist = sub.add_parser("history", help="list the journal of applies and rollbacks")
    host_options(hist)
    hist.add_argument("--json", action="store_true")
    hist.set_defaults(handler=cmd_history)
    check = sub.add_parser("check-gpus", help="is a GPU set NUMA-local? (exit 0 yes, 1 no)")
    check.add_argument("gpus", help="indexes in PCI bus order or addresses, comma-separated")
    host_options(check)
    check.set_defaults(handler=cmd_check_gpus)
    return parser
