"""The commands that read a host or its journal, and rollback: call the library, print text or
one JSON document, return the exit code. ``plan`` and ``apply`` are in :mod:`~proxgpu.cli.change`.
"""

from __future__ import annotations

import argparse
import json
import sys

from proxgpu.apply.journal import JournalEntry, read_journal, select_entry
from proxgpu.apply.rollback import rollback
from proxgpu.apply.verify import verify
from proxgpu.cli.change import Progress, confirm
from proxgpu.cli.hosts import open_host
from proxgpu.cli.setup import gpu_filter, read_inventory
from proxgpu.cli.text import table
from proxgpu.errors import DriftError, UsageError
from proxgpu.host.base import Host
from proxgpu.inspection.build import build_inventory
from proxgpu.inspection.capture import gather, write_tree
from proxgpu.planning.advice import check_gpu_set
from proxgpu.redact import redact_document

#: check-gpus: the GPUs straddle NUMA nodes; a GPU's NUMA node is unknown (sysfs says -1).
STRADDLES = 18
UNKNOWN_NODE = 19


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
        print("\n".join(f"{host.name}: drift: {line}" for line in report.drift))
    elif report.pending_reboot:
        print(f"{host.name}: no drift; a reboot is pending, after which:")
        print("\n".join(f"  {line}" for line in report.pending_reboot))
    else:
        print(f"{host.name}: no drift, the host matches the applied plan")
        for address, driver in report.moved.items():
            print(f"  {address}: on {driver or 'no driver'}")
    return DriftError.exit_code if report.drifted else 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """Restore the files of a journal entry byte for byte and re-run the post-actions."""
    with open_host(args) as host:
        question = f"Roll {host.name} back to before {args.to or 'the last apply'}?"
        if not args.yes and not confirm(question, "roll back"):
            print("Nothing changed.", file=sys.stderr)
            return 1
        result = rollback(
            host,
            args.to,
            force=args.force,
            live=args.live,
            break_lock=args.break_lock,
            progress=None if args.json else Progress(),
            trust_unsigned=args.trust_unsigned,
        )
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
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
        print(json.dumps(redact_document([e.model_dump(mode="json") for e in entries]), indent=2))
        return 0
    rows = [["ID", "STATUS", "STARTED", "BY", "FILES"]]
    rows += [[e.id, e.status, e.started, e.client, str(len(e.files))] for e in entries]
    print(table(rows) if entries else f"{host.name}: the journal is empty")
    return 0


def cmd_check_gpus(args: argparse.Namespace) -> int:
    """Exit 0 when a GPU set is NUMA-local, 18 when it straddles nodes, 19 when a GPU's node is
    unknown; the explanation says which GPU is where."""
    inventory = read_inventory(args)
    check = check_gpu_set(inventory, [s.strip() for s in args.gpus.split(",") if s.strip()])
    if args.json:
        print(check.model_dump_json(indent=2))
    else:
        print(check.explanation, file=sys.stdout if check.numa_local else sys.stderr)
    if check.numa_local:
        return 0
    return UNKNOWN_NODE if any(p.numa_node is None for p in check.gpus) else STRADDLES


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Capture what inspection reads into a directory that ``--root`` reads back."""
    with open_host(args) as host:
        capture = gather(host, modes=True)
        entries = write_tree(capture, args.output)
        inventory = build_inventory(capture, host.name, gpu_filter(args))
    if args.json:
        document = {"host": host.name, "output": args.output, "entries": entries}
        print(json.dumps({**document, "gpus": [g.address for g in inventory.gpus]}, indent=2))
        return 0
    print(
        f"{host.name}: wrote {entries} entries to {args.output} "
        f"({len(inventory.gpus)} GPUs); read it back with: proxgpu inspect --root {args.output}"
    )
    return 0
