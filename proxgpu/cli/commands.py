"""The commands that read a host or its journal, and rollback: call the library, print text or
one JSON document, return the exit code. ``plan`` and ``apply`` are in :mod:`~proxgpu.cli.change`.
"""

from __future__ import annotations

import os
import sys

from proxgpu.apply.journal import read_journal
from proxgpu.apply.layout import Layout
from proxgpu.apply.rollback import rollback
from proxgpu.apply.signing import load_key
from proxgpu.apply.trust import problems as trust_problems
from proxgpu.apply.verify import applied_entry, verify
from proxgpu.cli.change import apply_options, confirm
from proxgpu.cli.commandline import CommandLine
from proxgpu.cli.hosts import open_host
from proxgpu.cli.plan_text import render_changes
from proxgpu.cli.shown import Shown, StepPrinter, emit
from proxgpu.cli.text import table
from proxgpu.errors import DriftError, UsageError
from proxgpu.fleet import Say
from proxgpu.host.base import Host
from proxgpu.inspection import inspect
from proxgpu.inspection.build import build_inventory
from proxgpu.inspection.capture import gather, write_tree
from proxgpu.model import plain
from proxgpu.pipeline.documents import shown
from proxgpu.planning.advice import check_gpu_set
from proxgpu.redact import redact_document

#: check-gpus: the GPUs straddle NUMA nodes; a GPU's NUMA node is unknown (sysfs says -1).
STRADDLES = 18
UNKNOWN_NODE = 19


def host_verify(line: CommandLine, host: Host, say: Say) -> Shown:
    """One host's verify: compare it with the last (or the named) apply, exit 17 on drift; a
    guest that could not be looked at is a note on stderr, never part of a pass."""
    entry = applied_entry(host, line.to, trust_unsigned=line.trust_unsigned)
    report = verify(host, entry, guests=line.guests)
    looked = [f"  {check.line}" for check in report.guests if check.verdict == "ok"]
    if report.drifted:
        lines = [f"{host.name}: drift: {line}" for line in report.drift]
    elif report.pending_reboot:
        lines = [f"{host.name}: no drift; a reboot is pending, after which:"]
        lines += [f"  {line}" for line in report.pending_reboot]
    else:
        lines = [f"{host.name}: no drift, the host matches the applied plan"]
        lines += [
            f"  {address}: on {driver or 'no driver'}" for address, driver in report.moved.items()
        ]
    notes = tuple(
        f"{host.name}: {check.line}" for check in report.guests if check.verdict == "unchecked"
    )
    code = DriftError.exit_code if report.drifted else 0
    return Shown(_lines(lines + looked), plain(report), code, notes)


def cmd_rollback(line: CommandLine) -> int:
    """Restore the files of a journal entry byte for byte and re-run the post-actions."""
    with open_host(line) as host:
        question = f"Roll {host.name} back to before {line.to or 'the last apply'}?"
        if not (line.yes or line.dry_run) and not confirm(question, "roll back"):
            print("Nothing changed.", file=sys.stderr)
            return 1
        shown = host_rollback(line, host, StepPrinter(host.name, quiet=line.json or line.quiet))
    # -q: only what went wrong (the notes), not what was restored.
    emit(line, shown if line.json or not line.quiet else Shown(notes=shown.notes))
    return shown.code


def host_rollback(line: CommandLine, host: Host, say: Say) -> Shown:
    """One host's rollback, without asking (see :func:`cmd_rollback`)."""
    result = rollback(host, line.to, apply_options(line), progress=say)
    text = _lines(result.messages or [f"restored {len(result.files)} files"])
    if result.preview is not None:
        # A dry run shows each file as the diff from now to what the rollback would leave.
        text = render_changes(shown(result.preview), color=line.color) + text
    return Shown(text, redact_document(plain(result)))


def host_history(line: CommandLine, host: Host, say: Say) -> Shown:
    """One host's journal, oldest entry first."""
    journal = read_journal(host)
    notes = [
        f"{host.name}: {path}: {why}; the other entries are listed"
        for path, why in journal.unreadable.items()
    ]
    entries = journal.entries
    untrusted = trust_problems(host, journal, load_key()) if entries else {}
    layout = Layout.of(host)
    notes += [
        f"{host.name}: {layout.journal(entry_id)}: UNTRUSTED: {why}"
        for entry_id, why in untrusted.items()
    ]
    rows = [["ID", "STATUS", "STARTED", "BY", "FILES", "TRUSTED"]]
    rows += [
        [e.id, e.status, e.started, e.client, str(len(e.files)), _trusted(untrusted, e.id)]
        for e in entries
    ]
    text = table(rows) if entries else f"{host.name}: the journal is empty"
    document = redact_document(
        [{**e.model_dump(mode="json"), "untrusted": untrusted.get(e.id)} for e in entries]
    )
    return Shown(text + "\n", document, notes=tuple(notes))


def _trusted(untrusted: dict[str, str], entry_id: str) -> str:
    """The TRUSTED cell: ``yes``, or ``NO`` (the note below the table says why)."""
    return "NO" if entry_id in untrusted else "yes"


def cmd_check_gpus(line: CommandLine) -> int:
    """Exit 0 when a GPU set is NUMA-local, 18 when it straddles nodes, 19 when a GPU's node is
    unknown; the explanation says which GPU is where."""
    with open_host(line) as host:
        shown = host_check_gpus(line, host, StepPrinter(host.name, quiet=True))
    if not line.json and shown.code:
        print(shown.text, end="", file=sys.stderr)
    else:
        emit(line, shown)
    return shown.code


def host_check_gpus(line: CommandLine, host: Host, say: Say) -> Shown:
    """One host's check (see :func:`cmd_check_gpus`)."""
    check = check_gpu_set(inspect(host, line.gpus), list(line.gpu_set))
    code = 0
    if not check.numa_local:
        code = UNKNOWN_NODE if any(p.numa_node is None for p in check.gpus) else STRADDLES
    return Shown(check.explanation + "\n", plain(check), code)


def host_snapshot(line: CommandLine, host: Host, say: Say) -> Shown:
    """One host's snapshot, in ``-o DIR`` (``DIR/HOST`` among several hosts)."""
    if line.output is None:
        raise UsageError("snapshot writes a directory: give -o DIR")
    output = os.path.join(line.output, line.one_of) if line.one_of else line.output
    capture = gather(host, modes=True)
    entries = write_tree(capture, output)
    inventory = build_inventory(capture, host.name, line.gpus)
    document = {"host": host.name, "output": output, "entries": entries}
    document["gpus"] = [g.address for g in inventory.gpus]
    text = (
        f"{host.name}: wrote {entries} entries to {output} "
        f"({len(inventory.gpus)} GPUs); read it back with: proxgpu inspect --root {output}\n"
    )
    return Shown(text, document)


def _lines(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)
