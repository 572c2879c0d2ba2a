"""``report``, and the pictures ``inspect`` prints: ``--format svg`` and ``--tree``.

``report`` writes its HTML file even when the plan is refused (the picture of the host as it is
and every refusal in plain words), then exits 9 as ``plan`` would, so a script still notices. With
several ``--host``, it reads them concurrently (``--forks``) into one file, a section per host.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from proxgpu.cli.console import STDOUT, write_output
from proxgpu.cli.hosts import open_host
from proxgpu.cli.proposing import render_options, split_policy
from proxgpu.cli.setup import gpu_filter
from proxgpu.errors import PlanRefusedError, ProxgpuError, UsageError
from proxgpu.inspection import Inventory, inspect
from proxgpu.picture import UnreadHost, inventory_svg, inventory_tree, render_report
from proxgpu.picture.report import HostReport, plan_report
from proxgpu.pipeline import node_policy


def picture_of(inventory: Inventory, *, tree: bool) -> str:
    """The inventory as a text tree or as an SVG file's text."""
    return inventory_tree(inventory) if tree else inventory_svg(inventory)


def cmd_report(args: argparse.Namespace) -> int:
    """Write the plan of each host as one self-contained HTML report, a section per host; exit 9
    when a plan was refused (the report says why), or a host's error code when one could not be
    read (the others are still reported)."""
    if args.json and args.output == STDOUT:
        raise UsageError("report -o - writes the HTML to stdout: leave out --json, or give -o FILE")
    # A cluster's nodes come with their own options (--cluster); hosts with their targets.
    targets = getattr(args, "targets", None) or {
        target: {"host": target} for target in getattr(args, "hosts", None) or [args.host]
    }
    with ThreadPoolExecutor(max_workers=max(1, getattr(args, "forks", 1))) as pool:
        results = list(pool.map(lambda own: _host_report(args, own), targets.values()))
    sections = [section for _, section, _ in results]
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    write_output(render_report(sections, generated=generated), args.output)
    codes = [code for _, _, code in results]
    # With -o - the HTML is stdout: what was written is said on stderr.
    said = sys.stderr if args.output == STDOUT else sys.stdout
    if args.json:
        print(json.dumps({"output": args.output, "hosts": [r[0] for r in results]}, indent=2))
    else:
        read = sum(isinstance(section, HostReport) for section in sections)
        where = "stdout" if args.output == STDOUT else args.output
        print(f"wrote {where}: {read} of {len(targets)} hosts read", file=said)
    return max(codes)


def _host_report(
    args: argparse.Namespace, own: dict[str, object]
) -> tuple[dict[str, object], HostReport | UnreadHost, int]:
    """One host's section (why it could not be read, for one that could not), with a line about
    it for the summary and its exit code."""
    one = argparse.Namespace(**{**vars(args), **own})
    try:
        with open_host(one) as host:
            inventory = inspect(host, gpu_filter(one))
    except ProxgpuError as exc:
        print(f"proxgpu: {exc}", file=sys.stderr)
        name = str(one.host or one.root or "this machine")
        return {"host": name, "error": str(exc)}, UnreadHost(name, str(exc)), exc.exit_code
    options = render_options(args)
    policy = split_policy(args)
    if getattr(args, "targets", None):
        policy = node_policy(policy, inventory)  # a cluster's node: only the guests it holds
    section = plan_report(inventory, policy, options)
    refused = bool(section.refusals or section.error)
    if refused:
        print(f"{host.name}: plan refused; the report says why", file=sys.stderr)
    summary = {
        "host": host.name,
        "refused": refused,
        "problems": [r.what for r in section.refusals],
    }
    return summary, section, PlanRefusedError.exit_code if refused else 0
