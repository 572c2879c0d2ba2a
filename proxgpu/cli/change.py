"""``plan`` and ``apply``: show the split and its file changes, save a plan, apply one.

``plan --detailed-exitcode`` and ``apply --dry-run --detailed-exitcode`` follow Terraform: 0
nothing to change, 2 changes (or a reboot) pending, 1 any error.
"""

from __future__ import annotations

import sys

from proxgpu.apply import ApplyOptions, ApplyResult, apply_changes
from proxgpu.apply.result import NO_CHANGES
from proxgpu.cli.commandline import CommandLine, next_command
from proxgpu.cli.hosts import open_host
from proxgpu.cli.plan_text import render_changes, render_plan
from proxgpu.cli.shown import Shown, StepPrinter, emit
from proxgpu.errors import UsageError
from proxgpu.fleet import Say
from proxgpu.host.base import Host
from proxgpu.pipeline import Proposal, propose
from proxgpu.pipeline.documents import apply_document, plan_document, shown
from proxgpu.pipeline.saved import SavedPlan, load_plan, save_plan
from proxgpu.rendering.changes import ChangeSet

#: Exit code of ``--detailed-exitcode`` when something is pending.
PENDING = 2


def host_plan(line: CommandLine, host: Host, say: Say) -> Shown:
    """One host's plan, saved to ``--out`` when given (``{host}`` in it: the host's name)."""
    return plan_shown(line, host.name, propose(host, *line.split(), line.gpus))


def plan_shown(line: CommandLine, host: str, proposed: Proposal) -> Shown:
    """A proposal as ``plan`` shows it (a cluster's node comes planned already)."""
    inventory, plan, changes = proposed.inventory, proposed.plan, proposed.changes
    document = plan_document(plan, changes, inventory)
    pending: list[str] = document["reboot_pending"]
    out = line.out.replace("{host}", line.one_of or host) if line.out else None
    if out:
        save_plan(out, host, plan, changes)
    text = render_plan(plan, inventory) + "\n\n" + render_changes(shown(changes), color=line.color)
    text += _pending(pending)
    if out:
        text += f"Saved to {out}: apply exactly this with `{apply_command(line, out)}`.\n"
    elif changes.changed:
        text += f"Apply it with `{apply_command(line)}`.\n"
    code = PENDING if line.detailed and (changes.changed or pending) else 0
    return Shown(text, document, code)


def apply_command(line: CommandLine, saved: str | None = None) -> str:
    """The command that applies this plan on the same host: ``saved``, the file it was saved
    to, else the same split options."""
    return next_command(line, "apply", *(["--plan", saved] if saved else line.request))


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


def _what_to_apply(line: CommandLine, host: Host) -> Proposed:
    """A fresh proposal, or the saved plan ``--plan FILE`` names (``{host}`` in it: the host's
    name; checked to be for this host; its inventory is not saved: the compare-and-swap on
    every file stands in for it)."""
    if not line.plan:
        return propose(host, *line.split(), line.gpus)
    beside = list(dict.fromkeys(word for word in line.request if word.startswith("--")))
    if beside:
        raise UsageError(
            f"--plan {line.plan} is the whole request, so {', '.join(beside)} "
            f"would be ignored: drop {'it' if len(beside) == 1 else 'them'}, or plan again with "
            f"{'it' if len(beside) == 1 else 'them'} (plan --out FILE) and apply that plan"
        )
    path = line.plan.replace("{host}", line.one_of or host.name)
    saved = load_plan(path, trust_unsigned=line.trust_unsigned)
    if saved.host != host.name:
        raise UsageError(f"{path}: made for {saved.host}, not {host.name}")
    return saved


def cmd_apply(line: CommandLine) -> int:
    """Show the plan and diff, ask, then apply as one transaction (or only check with --dry-run)."""
    if line.json and not (line.yes or line.dry_run):
        raise UsageError("--json prints one document and cannot ask: add --yes or --dry-run")
    # -q: only what went wrong, unless there is a question to ask about the diff.
    quiet = line.json or line.quiet
    with open_host(line) as host:
        proposed = _what_to_apply(line, host)
        proceed = line.dry_run or line.yes or not proposed.changes.changed
        if not (line.json or (line.quiet and proceed)):
            print(_shown_plan(line, proposed), end="")
        if not proceed and not confirm(f"Apply these changes to {host.name}?"):
            print("Nothing changed.", file=sys.stderr)
            return 1
        result = _apply(line, host, proposed, StepPrinter(host.name, quiet=quiet))
    if line.json:
        emit(line, Shown(document=apply_document(proposed.plan, result, proposed.changes)))
    elif not line.quiet:
        print(_result_text(result, proposed.changes), end="")
    return PENDING if line.detailed and result.changed else 0


def host_apply(line: CommandLine, host: Host, say: Say) -> Shown:
    """One host's apply among several: ``--yes`` was given, nothing is asked."""
    return apply_shown(line, host, _what_to_apply(line, host), say)


#: What an apply applies: a fresh proposal (with its inventory) or a saved plan (without).
Proposed = Proposal | SavedPlan


def apply_shown(line: CommandLine, host: Host, proposed: Proposed, say: Say) -> Shown:
    """Apply a proposal without asking (a cluster's node comes planned already); the plan, its
    diff and what was done."""
    return applied_shown(line, proposed, _apply(line, host, proposed, say))


def applied_shown(line: CommandLine, proposed: Proposed, result: ApplyResult) -> Shown:
    """An apply's result as ``apply`` shows it: the plan, its diff, what was done."""
    text = _shown_plan(line, proposed) + _result_text(result, proposed.changes)
    code = PENDING if line.detailed and result.changed else 0
    return Shown(text, apply_document(proposed.plan, result, proposed.changes), code)


def apply_options(line: CommandLine) -> ApplyOptions:
    """How the apply or rollback ``line`` asks for runs (the defaults, for another command)."""
    return line.apply or ApplyOptions()


def _apply(line: CommandLine, host: Host, proposed: Proposed, say: Say) -> ApplyResult:
    changes, plan = proposed.changes, proposed.plan
    inventory = proposed.inventory if isinstance(proposed, Proposal) else None
    options = apply_options(line)
    return apply_changes(host, changes, options, plan=plan, inventory=inventory, progress=say)


def _result_text(result: ApplyResult, changes: ChangeSet) -> str:
    """What the apply did. With nothing to write it says so, as ``--json`` does; a saved plan
    whose diff was shown may find every file already as planned, and must say so after it. A
    fresh plan without changes said it in its summary already: once is enough."""
    said = not result.changed and not changes.changed
    return "".join(f"{line}\n" for line in result.messages if not (said and line == NO_CHANGES))


def _shown_plan(line: CommandLine, proposed: Proposed) -> str:
    # A saved plan keeps no inventory to describe the plan with: its diff says it all.
    text = ""
    if isinstance(proposed, Proposal):
        text = render_plan(proposed.plan, proposed.inventory) + "\n\n"
    return text + render_changes(shown(proposed.changes), color=line.color)
