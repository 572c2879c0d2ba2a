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
from proxgpu.fleet import ClusterPlan, Say, Target, each_host
from proxgpu.host.base import Host
from proxgpu.inspection import Inventory, inspect
from proxgpu.picture import UnreadHost, inventory_svg, inventory_tree, render_report
from proxgpu.picture.report import ClusterHeader, HostReport, host_report, plan_report
from proxgpu.pipeline import Proposal


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
    line: CommandLine, targets: dict[str, Target], planned: ClusterPlan | None = None
) -> int:
    """The report of ``targets``, or of the cluster ``planned`` (each node planned with the
    guests it holds, the mapping pooled, as ``plan --cluster`` plans them)."""
    output = line.output or STDOUT
    if line.json and output == STDOUT:
        raise UsageError("report -o - writes the HTML to stdout: leave out --json, or give -o FILE")
    header = None
    if planned is None:
        policy, render = line.split()

        def one(host: Host, say: Say) -> HostReport:
            return plan_report(inspect(host, line.gpus), policy, render, host=host)

        read = each_host(targets, one, connect=connector(line), forks=line.forks)
        sections = {n: o.or_error() for n, o in read.items()}
        # A host the command line names wrongly (a cluster snapshot as --root) is no unread
        # host to report: the command is refused, and no file is written.
        usage = next((s for s in sections.values() if isinstance(s, UsageError)), None)
        if usage is not None:
            raise usage
    else:
        sections = {n: _node_section(planned, n) for n in planned.proposals}
        header = ClusterHeader(planned.nodes.summary(), planned.mapping, planned.mapping_name)
    results = [_host_report(line.at(targets[n], n), section) for n, section in sections.items()]
    shown = [section for _, section, _ in results]
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    write_output(render_report(shown, generated=generated, cluster=header), output)
    codes = [code for _, _, code in results]
    # With -o - the HTML is stdout: what was written is said on stderr.
    said = sys.stderr if output == STDOUT else sys.stdout
    if line.json:
        print(json.dumps({"output": output, "hosts": [r[0] for r in results]}, indent=2))
    else:
        done = sum(isinstance(section, HostReport) for section in shown)
        where = "stdout" if output == STDOUT else output
        print(f"wrote {where}: {done} of {len(targets)} hosts read", file=said)
    return max(codes)


def _node_section(planned: ClusterPlan, name: str) -> HostReport | ProxgpuError:
    """A cluster node's section, or the error that left it unread."""
    found = planned.proposals[name]
    if isinstance(found, Proposal):
        return host_report(found.inventory, found)
    if name in planned.inventories:  # read, and refused (or not rendered)
        return host_report(planned.inventories[name], found)
    return found


def _host_report(
    line: CommandLine, found: HostReport | ProxgpuError
) -> tuple[dict[str, object], HostReport | UnreadHost, int]:
    """One host's section (why it could not be read, for one that could not), with a line about
    it for the summary and its exit code; ``line`` is that host's command line."""
    if isinstance(found, ProxgpuError):
        name = str(Target(line.host, line.root))
        print(f"proxgpu: {found}", file=sys.stderr)
        unread: dict[str, object] = {"host": name, "error": found.document()}
        return unread, UnreadHost(name, str(found)), found.exit_code
    section = replace(found, commands=_commands(line))
    refused = bool(section.refusals)
    host = section.inventory.hostname
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
