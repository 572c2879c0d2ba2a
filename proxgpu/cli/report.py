"""``report``, and the pictures ``inspect`` prints: ``--format svg`` and ``--tree``.

``report`` writes its HTML file even when the plan is refused (the picture of the host as it is
and every refusal in plain words), then exits 9 as ``plan`` would, so a script still notices. With
several ``--host``, it reads them concurrently (``--forks``) into one file, a section per host.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from datetime import UTC, datetime

from proxgpu.cli.commandline import CommandLine, next_command
from proxgpu.cli.console import STDOUT, write_output
from proxgpu.cli.hosts import connector
from proxgpu.errors import PlanRefusedError, ProxgpuError, UsageError
from proxgpu.fleet import ClusterNodes, Outcome, Target, each_host
from proxgpu.fleet.cluster import check_guests, node_policy, pool_mapping
from proxgpu.inspection import Inventory, inspect
from proxgpu.picture import UnreadHost, inventory_svg, inventory_tree, render_report
from proxgpu.picture.report import ClusterHeader, HostReport, plan_report
from proxgpu.pipeline import Proposal
from proxgpu.rendering.changes import FileChange


def picture_of(inventory: Inventory, *, tree: bool) -> str:
    """The inventory as a text tree or as an SVG file's text."""
    return inventory_tree(inventory) if tree else inventory_svg(inventory)


def cmd_report(line: CommandLine) -> int:
    """Write the plan of each host as one self-contained HTML report, a section per host; exit 9
    when a plan was refused (the report says why), the code ``plan`` exits with when one could
    not be made (a guest that is not there: 16), or a host's error code when one could not be
    read (the others are still reported)."""
    targets = [Target(h, line.root) for h in line.hosts or (None,)]
    return write_report(line, {str(t): t for t in targets})


def write_report(
    line: CommandLine, targets: dict[str, Target], cluster: ClusterNodes | None = None
) -> int:
    """The report of ``targets`` (a cluster's nodes each planned with the guests it holds)."""
    output = line.output or STDOUT
    if line.json and output == STDOUT:
        raise UsageError("report -o - writes the HTML to stdout: leave out --json, or give -o FILE")
    read = each_host(
        targets,
        lambda host, say: inspect(host, line.gpus),
        connect=connector(line),
        forks=line.forks,
    )
    policy, render = line.split()
    if cluster is not None:
        # Each node plans only the guests it holds: one on none is refused as plan refuses it.
        check_guests(policy, cluster, {n: o.or_error() for n, o in read.items()})
    results = [
        _host_report(line.at(targets[name], name), outcome, cluster)
        for name, outcome in read.items()
    ]
    sections = [section for _, section, _ in results]
    header = None
    if cluster is not None:
        sections, mapping = _pooled(dict(zip(read, sections, strict=True)), render.mapping, cluster)
        header = ClusterHeader(cluster.summary(), mapping, render.mapping)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    write_output(render_report(sections, generated=generated, cluster=header), output)
    codes = [code for _, _, code in results]
    # With -o - the HTML is stdout: what was written is said on stderr.
    said = sys.stderr if output == STDOUT else sys.stdout
    if line.json:
        print(json.dumps({"output": output, "hosts": [r[0] for r in results]}, indent=2))
    else:
        done = sum(isinstance(section, HostReport) for section in sections)
        where = "stdout" if output == STDOUT else output
        print(f"wrote {where}: {done} of {len(targets)} hosts read", file=said)
    return max(codes)


def _pooled(
    sections: dict[str, HostReport | UnreadHost], name: str | None, cluster: ClusterNodes
) -> tuple[list[HostReport | UnreadHost], FileChange | None]:
    """A cluster's sections without their own mapping change, and the one pooled change (as
    ``plan --cluster`` pools it: :func:`proxgpu.fleet.cluster.pool_mapping`)."""
    planned = {
        node: Proposal(s.inventory, s.plan, s.changes)
        for node, s in sections.items()
        if isinstance(s, HostReport) and s.plan is not None and s.changes is not None
    }
    pooled, mapping = pool_mapping(planned, name, cluster.first)
    shown = [
        replace(s, changes=pooled[node].changes) if node in pooled else s  # type: ignore[arg-type]
        for node, s in sections.items()
    ]
    return shown, mapping


def _host_report(
    line: CommandLine,
    read: Outcome[Inventory],
    cluster: ClusterNodes | None,
) -> tuple[dict[str, object], HostReport | UnreadHost, int]:
    """One host's section (why it could not be read, for one that could not), with a line about
    it for the summary and its exit code; ``line`` is that host's command line."""
    name = str(Target(line.host, line.root))
    if read.error is not None or read.result is None:
        exc = read.error or ProxgpuError("not read")
        print(f"proxgpu: {exc}", file=sys.stderr)
        return {"host": name, "error": str(exc)}, UnreadHost(name, str(exc)), exc.exit_code
    inventory = read.result
    policy, render = line.split()
    if cluster is not None:
        policy = node_policy(policy, inventory)  # a cluster's node: only the guests it holds
    section = replace(plan_report(inventory, policy, render), commands=_commands(line))
    refused = bool(section.refusals)
    host = inventory.hostname
    summary: dict[str, object] = {
        "host": host,
        "refused": refused,
        "problems": [r.what for r in section.refusals],
    }
    if section.failure is not None:
        # No plan to refuse (a guest that is not there...): said as plan says it, with its code.
        print(f"proxgpu: {section.failure}", file=sys.stderr)
        summary["error"] = section.failure.document()
        return summary, section, section.failure.exit_code
    if refused:
        print(f"{host}: plan refused; the report says why", file=sys.stderr)
    return summary, section, PlanRefusedError.exit_code if refused else 0


def _commands(line: CommandLine) -> tuple[tuple[str, str], ...]:
    """The commands a change ticket names for the plan of ``line``'s host: apply it, verify
    it, roll it back, each with the options that reach that host."""
    return (
        ("apply", next_command(line, "apply", *line.request)),
        ("verify (after the reboot)", next_command(line, "verify")),
        ("roll back", next_command(line, "rollback")),
    )
