"""``--cluster``: every online node of a Proxmox VE cluster, as a fleet keyed by node name.

The rules (members, every node planned before any write, the pooled mapping written first by
the lead node) are :mod:`proxgpu.fleet.cluster`'s; this module shows their outcomes: the
cluster's line first, the mapping once, then a section per node (``--json``: ``"cluster"``
beside ``"hosts"``).
"""

from __future__ import annotations

import sys
from typing import Any

from proxgpu.cli.change import applied_shown, apply_options, plan_shown
from proxgpu.cli.commandline import CommandLine
from proxgpu.cli.fleet import (
    EventPrinter,
    Header,
    exit_code,
    print_all,
    require_yes,
    run_fleet,
)
from proxgpu.cli.hosts import connector
from proxgpu.cli.registry import Command
from proxgpu.cli.shown import Shown
from proxgpu.errors import ProxgpuError, UsageError
from proxgpu.fleet import ClusterNodes, ClusterPlan, Outcome, Target, find_nodes, snapshot_nodes
from proxgpu.fleet.cluster import apply_cluster, plan_cluster
from proxgpu.pipeline import Proposal
from proxgpu.rendering.changes import FileChange, unified_diff


def run_cluster(line: CommandLine, command: Command) -> int:
    """Run the command on every online node of the cluster; the worst node's exit code."""
    if len(line.hosts) > 1:
        raise UsageError("--cluster takes one --host of the cluster (or --root of a snapshot)")
    nodes = cluster_nodes(line)
    if command.name == "snapshot":
        from proxgpu.cli.snapshot import show_snapshot  # noqa: PLC0415 - this command only

        return show_snapshot(line, nodes)
    if command.name == "report":  # one file, a section per node
        from proxgpu.cli.report import write_report  # noqa: PLC0415 - this command only

        for name, why in nodes.skipped.items():
            print(f"{name}: {why}", file=sys.stderr)
        return write_report(line, nodes.targets, plan_nodes(line, nodes))
    header = Header(nodes.summary() + "\n\n", nodes.document(), nodes.skipped)
    if command.plans_first:
        return _planned(line, command, nodes, header)
    return run_fleet(line, command, nodes.targets, header)


def cluster_nodes(line: CommandLine) -> ClusterNodes:
    """The members of the cluster the given host (or snapshot) belongs to, and how to reach
    each online node."""
    if line.host is None and line.root is not None:
        return snapshot_nodes(line.root)
    return find_nodes(Target(line.host, line.root), connect=connector(line))


def _planned(line: CommandLine, command: Command, nodes: ClusterNodes, header: Header) -> int:
    """Plan every node first; show the mapping once; apply only when every node was planned."""
    if line.out or line.plan:
        raise UsageError("--cluster plans every node afresh: leave out --out and --plan")
    applying = command.fleet == "rolling"
    if applying:
        require_yes(line)
    planned = plan_nodes(line, nodes)
    text, document = header.text, {**header.document}
    code = 2 if planned.mapping and planned.mapping.changed and line.detailed else 0
    if planned.mapping is not None:
        text += _mapping_text(line, planned, planned.mapping, applying and not planned.failed)
        document["mapping"] = _mapping_document(planned.mapping_name, planned.mapping)
    names = list(planned.proposals)
    listen = EventPrinter(verbose=True)
    if applying and not planned.failed:
        outcomes = _applied(line, planned, listen)
    else:
        if applying:
            text += f"Nothing was applied: {', '.join(planned.failed)} could not be planned.\n\n"
            code = max(code, 1)
        outcomes = {n: _shown_plan(line, nodes, n, p) for n, p in planned.proposals.items()}
    shown_header = Header(text, document, header.skipped, code)
    print_all(line, command, names, outcomes, shown_header, ended=listen.ended)
    return max([*(exit_code(o, line.detailed) for o in outcomes.values()), code])


def plan_nodes(line: CommandLine, nodes: ClusterNodes) -> ClusterPlan:
    """Every online node planned with the guests it holds, the mapping pooled, as the command
    line asks (:func:`proxgpu.fleet.plan_cluster`)."""
    policy, render = line.split()
    return plan_cluster(
        nodes,
        policy,
        render,
        line.gpus,
        mapping=render.mapping,
        connect=connector(line),
        forks=line.forks,
    )


def _shown_plan(
    line: CommandLine, nodes: ClusterNodes, name: str, found: Proposal | ProxgpuError
) -> Outcome[Shown]:
    if isinstance(found, ProxgpuError):
        return Outcome(name, error=found)
    return Outcome(name, result=plan_shown(line.at(nodes.targets[name], name), name, found))


def _applied(
    line: CommandLine, planned: ClusterPlan, listen: EventPrinter
) -> dict[str, Outcome[Shown]]:
    """The library's rollout, each node shown as ``apply`` shows one host."""
    proposals = planned.to_apply()
    rollout = apply_cluster(
        planned,
        connect=connector(line),
        parallel=line.parallel,
        options=apply_options(line),
        on_event=listen,
    )
    outcomes: dict[str, Outcome[Shown]] = {}
    for name, outcome in rollout.outcomes.items():
        if outcome.result is None:
            outcomes[name] = Outcome(name, error=outcome.error, seconds=outcome.seconds)
        else:
            shown = applied_shown(line, proposals[name], outcome.result)
            outcomes[name] = Outcome(name, result=shown, seconds=outcome.seconds)
    return outcomes


def _mapping_text(
    line: CommandLine, planned: ClusterPlan, mapping: FileChange, applying: bool
) -> str:
    first = planned.nodes.first
    how = f"with {first}'s apply" + (", through the Proxmox API" if planned.nodes.live else "")
    head = f"PCI mapping {planned.mapping_name} ({mapping.path}), one for the whole cluster"
    if not mapping.changed:
        return f"{head}: no change.\n\n"
    verb = "is written" if applying else "would be written"
    diff = unified_diff(mapping, color=line.color)
    return f"{head}, {verb} once, {how}:\n{diff}\n"


def _mapping_document(name: str | None, mapping: FileChange) -> dict[str, Any]:
    return {
        "name": name,
        "path": mapping.path,
        "changed": mapping.changed,
        "before": mapping.before,
        "after": mapping.after,
    }
