"""``plan`` and ``apply``: show the split and its file changes, save a plan, apply one.

``plan --detailed-exitcode`` and ``apply --dry-run --detailed-exitcode`` follow Terraform: 0
nothing to change, 2 changes (or a reboot) pending, 1 any error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from proxgpu.apply import ApplyResult, apply_changes
from proxgpu.apply.verify import driver_drift
from proxgpu.cli.hosts import open_host
from proxgpu.cli.plan_text import render_changes, render_plan
from proxgpu.cli.proposing import proposal
from proxgpu.errors import UsageError
from proxgpu.host.base import Host
from proxgpu.inspection import Inventory
from proxgpu.pipeline import apply_document, load_plan, plan_document, save_plan, shown
from proxgpu.planning import Plan
from proxgpu.rendering.changes import ChangeSet

#: Exit code of ``--detailed-exitcode`` when something is pending.
PENDING = 2


def cmd_plan(args: argparse.Namespace) -> int:
    """Show the split and the exact file changes it needs, without changing anything."""
    with open_host(args) as host:
        inventory, plan, changes = proposal(args, host)
    pending = [] if changes.changed else driver_drift(inventory, plan, explain=False)
    if args.out:
        save_plan(args.out, host.name, plan, changes)
    if args.json:
        document = plan_document(plan, changes)
        document["reboot_pending"] = pending
        print(json.dumps(document, indent=2))
    else:
        print(render_plan(plan, inventory))
        print()
        print(render_changes(shown(changes), color=args.use_color), end="")
        _say_pending(pending)
        if args.out:
            print(
                f"Saved to {args.out}: apply exactly this with `proxgpu apply --plan {args.out}`."
            )
    if args.detailed_exitcode:
        return PENDING if changes.changed or pending else 0
    return 0


def _say_pending(pending: list[str]) -> None:
    if pending:
        print(
            f"Reboot pending: the files are in place, but {len(pending)} functions are not on "
            "their planned driver yet; reboot (or apply --live) to finish:"
        )
        print("\n".join(f"  {line}" for line in pending))


class Progress:
    """Progress on stderr (so that --json stays one document on stdout), with elapsed time:
    rebuilding the initramfs for every kernel takes minutes."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, step: str, message: str) -> None:
        elapsed = time.monotonic() - self.start
        print(f"[{elapsed:6.1f}s] {step}: {message}", file=sys.stderr, flush=True)


def confirm(question: str, action: str = "apply") -> bool:
    """Ask on the terminal; refuse to guess anywhere else."""
    if not sys.stdin.isatty():
        raise UsageError(f"not on a terminal: pass --yes to {action} without asking")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _what_to_apply(
    args: argparse.Namespace, host: Host
) -> tuple[Inventory | None, Plan, ChangeSet]:
    """A fresh proposal, or the saved plan ``--plan FILE`` names (checked to be for this host;
    its inventory is not saved: the compare-and-swap on every file stands in for it)."""
    if not args.plan:
        return proposal(args, host)
    saved = load_plan(args.plan, trust_unsigned=args.trust_unsigned)
    if saved.host != host.name:
        raise UsageError(f"{args.plan}: made for {saved.host}, not {host.name}")
    return None, saved.plan, saved.changes


def cmd_apply(args: argparse.Namespace) -> int:
    """Show the plan and diff, ask, then apply as one transaction (or only check with --dry-run)."""
    if args.json and not (args.yes or args.dry_run):
        raise UsageError("--json prints one document and cannot ask: add --yes or --dry-run")
    with open_host(args) as host:
        inventory, plan, changes = _what_to_apply(args, host)
        if not args.json:
            if inventory is not None:
                print(render_plan(plan, inventory), end="\n\n")
            print(render_changes(shown(changes), color=args.use_color), end="")
        proceed = args.dry_run or args.yes or not changes.changed
        if not proceed and not confirm(f"Apply these changes to {host.name}?"):
            print("Nothing changed.", file=sys.stderr)
            return 1
        result = apply_changes(
            host,
            changes,
            plan=plan,
            dry_run=args.dry_run,
            live=args.live,
            inventory=inventory,
            skip_guest_check=args.skip_guest_check,
            break_lock=args.break_lock,
            progress=None if args.json else Progress(),
        )
    _report(args, plan, changes, result)
    if args.detailed_exitcode:
        return PENDING if result.changed else 0
    return 0


def _report(args: argparse.Namespace, plan: Plan, changes: ChangeSet, result: ApplyResult) -> None:
    if args.json:
        print(json.dumps(apply_document(plan, result, changes), indent=2))
    elif result.changed:
        # Without changes the summary printed above already said so.
        print("\n".join(result.messages))
