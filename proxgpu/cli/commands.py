"""One function per subcommand: call the library, print text or a JSON document, return the code."""

from __future__ import annotations

import argparse
import json
import sys

from proxgpu.apply.journal import JournalEntry, read_journal, select_entry
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.apply.verify import verify
from proxgpu.cli.options import gpu_filter, open_host, proposal, read_inventory
from proxgpu.cli.text import render_changes, render_inventory, render_plan, table
from proxgpu.errors import DriftError, UsageError
from proxgpu.host.base import Host
from proxgpu.inspection.build import build_inventory
from proxgpu.inspection.capture import gather, write_tree
from proxgpu.pipeline import apply_document, inventory_document, plan_document, shown
from proxgpu.planning.advice import check_gpu_set


def cmd_plan(args: argparse.Namespace) -> int:
    """Show the split and the exact file changes it needs, without changing anything."""
    with open_host(args) as host:
        inventory, plan, changes = proposal(args, host)
    if args.json:
        print(json.dumps(plan_document(plan, changes), indent=2))
    else:
        print(render_plan(plan, inventory))
        print()
        print(render_changes(shown(changes), color=sys.stdout.isatty()), end="")
    if args.detailed_exitcode:
        return 2 if changes.changed else 0
    return 0


def _progress(step: str, message: str) -> None:
    # Progress goes to stderr so that --json output stays one document on stdout.
    print(f"[{step}] {message}", file=sys.stderr, flush=True)


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise UsageError("not on a terminal: pass --yes to apply without asking")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def cmd_apply(args: argparse.Namespace) -> int:
    """Show the plan and diff, ask, then apply as one transaction (or only check with --dry-run)."""
    if args.json and not (args.yes or args.dry_run):
        raise UsageError("--json prints one document and cannot ask: add --yes or --dry-run")
    with open_host(args) as host:
        inventory, plan, changes = proposal(args, host)
        if not args.json:
            print(render_plan(plan, inventory), end="\n\n")
            print(render_changes(shown(changes), color=sys.stdout.isatty()), end="")
        proceed = args.dry_run or args.yes or not changes.changed
        if not proceed and not _confirm(f"Apply these changes to {host.name}?"):
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
            progress=None if args.json else _progress,
        )
    if args.json:
        print(json.dumps(apply_document(plan, result, changes), indent=2))
    elif result.changed:
        # Without changes the summary printed above already said so.
        print("\n".join(result.messages))
    return 0


def _journal_entry(host: Host, to: str | None) -> JournalEntry:
    entry = select_entry(host, read_journal(host), to, latest=("applied",))
    if entry is None:
        raise UsageError(f"{host.name}: no applied entry in the journal (see proxgpu history)")
    return entry


def cmd_verify(args: argparse.Namespace) -> int:
    """Compare the host with the last (or the named) apply; exit 17 on drift."""
    with open_host(args) as host:
        report = verify(host, _journal_entry(host, args.to))
    if args.json:
        print(report.model_dump_json(indent=2))
    elif report.drifted:
        print("\n".join(f"drift: {line}" for line in report.drift))
    else:
        print(f"{host.name}: no drift, the host matches the applied plan")
    return DriftError.exit_code if report.drifted else 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """Restore the files of a journal entry byte for byte and re-run the post-actions."""
    with open_host(args) as host:
        if not args.yes and not _confirm(
            f"Roll {host.name} back to before {args.to or 'the last apply'}?"
        ):
            print("Nothing changed.", file=sys.stderr)
            return 1
        result = rollback(
            host,
            args.to,
            force=args.force,
            live=args.live,
            break_lock=args.break_lock,
            progress=_progress,
        )
    print("\n".join(result.messages or [f"restored {len(result.files)} files"]))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """List the journal, oldest first."""
    with open_host(args) as host:
        journal = read_journal(host)
    for path, why in journal.unreadable.items():
        print(f"proxgpu: {host.name}: {path}: {why}; the other entries are listed", file=sys.stderr)
    entries = journal.entries
    if args.json:
        print(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return 0
    rows = [["ID", "STATUS", "STARTED", "BY", "FILES"]]
    rows += [[e.id, e.status, e.started, e.client, str(len(e.files))] for e in entries]
    print(table(rows) if entries else f"{host.name}: the journal is empty")
    return 0


def cmd_check_gpus(args: argparse.Namespace) -> int:
    """Exit 0 when a GPU set is NUMA-local, 1 with an explanation when it straddles nodes."""
    inventory = read_inventory(args)
    check = check_gpu_set(inventory, [s.strip() for s in args.gpus.split(",") if s.strip()])
    print(check.explanation, file=sys.stdout if check.numa_local else sys.stderr)
    return 0 if check.numa_local else 1


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print the host's inventory."""
    inventory = read_inventory(args)
    if args.json:
        print(json.dumps(inventory_document(inventory), indent=2))
    else:
        print(render_inventory(inventory))
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Capture what inspection reads into a directory that ``--root`` reads back."""
    with open_host(args) as host:
        capture = gather(host)
        entries = write_tree(capture, args.output)
        inventory = build_inventory(capture, host.name, gpu_filter(args))
    print(
        f"{host.name}: wrote {entries} entries to {args.output} "
        f"({len(inventory.gpus)} GPUs); read it back with: proxgpu inspect --root {args.output}"
    )
    return 0
