"""``plan`` and ``apply``: show the split and its file changes, save a plan, apply one.

``plan --detailed-exitcode`` and ``apply --dry-run --detailed-exitcode`` follow Terraform: 0
nothing to change, 2 changes (or a reboot) pending, 1 any error.
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

from proxgpu.apply import ApplyOptions, ApplyResult, apply_changes
from proxgpu.apply.transaction import NO_CHANGES
from proxgpu.cli.hosts import open_host
from proxgpu.cli.options import given, next_command
from proxgpu.cli.plan_text import render_changes, render_plan
from proxgpu.cli.proposing import proposal
from proxgpu.cli.shown import Shown, StepPrinter, emit, run_one
from proxgpu.errors import UsageError
from proxgpu.fleet import Say
from proxgpu.host.base import Host
from proxgpu.inspection import Inventory
from proxgpu.pipeline import Proposal
from proxgpu.pipeline.documents import apply_document, plan_document, shown
from proxgpu.pipeline.saved import load_plan, save_plan
from proxgpu.planning import Plan
from proxgpu.rendering.changes import ChangeSet

#: Exit code of ``--detailed-exitcode`` when something is pending.
PENDING = 2


def cmd_plan(args: argparse.Namespace) -> int:
    """Show the split and the exact file changes it needs, without changing anything."""
    return run_one(args, host_plan)


def host_plan(args: argparse.Namespace, host: Host, say: Say) -> Shown:
    """One host's plan, saved to ``--out`` when given (``{host}`` in it: the host's name)."""
    return plan_shown(args, host.name, proposal(args, host), say.name)


def plan_shown(args: argparse.Namespace, host: str, proposed: Proposal, name: str = "") -> Shown:
    """A proposal as ``plan`` shows it (a cluster's node comes planned already)."""
    inventory, plan, changes = proposed
    document = plan_document(plan, changes, inventory)
    pending: list[str] = document["reboot_pending"]
    saved = getattr(args, "out", None)  # apply shows a cluster's plans too, and saves none
    out = saved.replace("{host}", name or host) if saved else None
    if out:
        save_plan(out, host, plan, changes)
    text = (
        render_plan(plan, inventory) + "\n\n" + render_changes(shown(changes), color=args.use_color)
    )
    text += _pending(pending)
    if out:
        text += f"Saved to {out}: apply exactly this with `{apply_command(args, out)}`.\n"
    elif changes.changed:
        text += f"Apply it with `{apply_command(args)}`.\n"
    code = PENDING if args.detailed_exitcode and (changes.changed or pending) else 0
    return Shown(text, document, code)


def apply_command(args: argparse.Namespace, saved: str | None = None) -> str:
    """The command that applies this plan on the same host: ``saved``, the file it was saved
    to, else the same split options."""
    request = ["--plan", saved] if saved else given(args, args.split_options)
    return next_command(args, "apply", *request)


def _pending(pending: list[str]) -> str:
    if not pending:
        return ""
    head = (
        f"Reboot pending: the files are in place, but {len(pending)} functions are not on "
        "their planned driver yet; reboot (or apply --live) to finish:\n"
    )
    return head + "".join(f"  {line}\n" for line in pending)


def confirm(question: str, action: str = "apply") -> bool:
    """Ask on the terminal; refuse to guess anywhere else."""
    if not sys.stdin.isatty():
        raise UsageError(f"not on a terminal: pass --yes to {action} without asking")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _what_to_apply(
    args: argparse.Namespace, host: Host, name: str = ""
) -> tuple[Inventory | None, Plan, ChangeSet]:
    """A fresh proposal, or the saved plan ``--plan FILE`` names (``{host}`` in it: the host's
    name; checked to be for this host; its inventory is not saved: the compare-and-swap on
    every file stands in for it)."""
    if not args.plan:
        return proposal(args, host)
    words = given(args, args.split_options)
    beside = list(dict.fromkeys(word for word in words if word.startswith("--")))
    if beside:
        raise UsageError(
            f"--plan {args.plan} is the whole request, so {', '.join(beside)} "
            f"would be ignored: drop {'it' if len(beside) == 1 else 'them'}, or plan again with "
            f"{'it' if len(beside) == 1 else 'them'} (plan --out FILE) and apply that plan"
        )
    path = args.plan.replace("{host}", name or host.name)
    saved = load_plan(path, trust_unsigned=args.trust_unsigned)
    if saved.host != host.name:
        raise UsageError(f"{path}: made for {saved.host}, not {host.name}")
    return None, saved.plan, saved.changes


def cmd_apply(args: argparse.Namespace) -> int:
    """Show the plan and diff, ask, then apply as one transaction (or only check with --dry-run)."""
    if args.json and not (args.yes or args.dry_run):
        raise UsageError("--json prints one document and cannot ask: add --yes or --dry-run")
    # -q: only what went wrong, unless there is a question to ask about the diff.
    quiet = args.json or args.quiet
    with open_host(args) as host:
        inventory, plan, changes = _what_to_apply(args, host)
        proceed = args.dry_run or args.yes or not changes.changed
        if not (args.json or (args.quiet and proceed)):
            print(_shown_plan(args, inventory, plan, changes), end="")
        if not proceed and not confirm(f"Apply these changes to {host.name}?"):
            print("Nothing changed.", file=sys.stderr)
            return 1
        result = _apply(
            args, host, Proposed(inventory, plan, changes), StepPrinter(host.name, quiet=quiet)
        )
    if args.json:
        emit(args, Shown(document=apply_document(plan, result, changes)))
    elif not args.quiet:
        print(_result_text(result, changes), end="")
    return PENDING if args.detailed_exitcode and result.changed else 0


def host_apply(args: argparse.Namespace, host: Host, say: Say) -> Shown:
    """One host's apply among several: ``--yes`` was given, nothing is asked."""
    return apply_shown(args, host, Proposed(*_what_to_apply(args, host, say.name)), say)


class Proposed(NamedTuple):
    """What an apply applies: a fresh proposal (with its inventory) or a saved plan."""

    inventory: Inventory | None
    plan: Plan
    changes: ChangeSet


def apply_shown(args: argparse.Namespace, host: Host, proposed: Proposed, say: Say) -> Shown:
    """Apply a proposal without asking (a cluster's node comes planned already); the plan, its
    diff and what was done."""
    return applied_shown(args, proposed, _apply(args, host, proposed, say))


def applied_shown(args: argparse.Namespace, proposed: Proposed, result: ApplyResult) -> Shown:
    """An apply's result as ``apply`` shows it: the plan, its diff, what was done."""
    text = _shown_plan(args, *proposed) + _result_text(result, proposed.changes)
    code = PENDING if args.detailed_exitcode and result.changed else 0
    return Shown(text, apply_document(proposed.plan, result, proposed.changes), code)


#: With ``-v``, how many of a running follow-up action's last output lines each read shows.
ACTION_OUTPUT = 5


def apply_options(args: argparse.Namespace) -> ApplyOptions:
    """How ``apply`` or ``rollback`` runs, as its options say: ``--dry-run``, ``--live``,
    ``--skip-guest-check``, ``--break-lock``, ``--force``, ``--trust-unsigned`` (each off where
    the command has none), and with ``-v`` a running action's last output lines."""
    return ApplyOptions(
        dry_run=getattr(args, "dry_run", False),
        live=args.live,
        skip_guest_check=getattr(args, "skip_guest_check", False),
        break_lock=args.break_lock,
        force=getattr(args, "force", False),
        trust_unsigned=getattr(args, "trust_unsigned", False),
        action_output=ACTION_OUTPUT if getattr(args, "verbose", 0) else 0,
    )


def _apply(args: argparse.Namespace, host: Host, proposed: Proposed, say: Say) -> ApplyResult:
    changes, plan, inventory = proposed.changes, proposed.plan, proposed.inventory
    options = apply_options(args)
    return apply_changes(host, changes, options, plan=plan, inventory=inventory, progress=say)


def _result_text(result: ApplyResult, changes: ChangeSet) -> str:
    """What the apply did. With nothing to write it says so, as ``--json`` does; a saved plan
    whose diff was shown may find every file already as planned, and must say so after it. A
    fresh plan without changes said it in its summary already: once is enough."""
    said = not result.changed and not changes.changed
    return "".join(f"{line}\n" for line in result.messages if not (said and line == NO_CHANGES))


def _shown_plan(
    args: argparse.Namespace, inventory: Inventory | None, plan: Plan, changes: ChangeSet
) -> str:
    text = render_plan(plan, inventory) + "\n\n" if inventory is not None else ""
    return text + render_changes(shown(changes), color=args.use_color)
