"""``snapshot --cluster -o DIR``: one tree per online node under ``DIR/NODE/``, each with the
cluster's shared ``/etc/pve`` as that node sees it (every node's guest configs under
``etc/pve/nodes/``, ``.members``, ``mapping/``; ``etc/pve/lxc`` and ``qemu-server`` links to its
own folder), so that ``--root DIR --cluster`` plans the cluster offline.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from proxgpu.cli.commandline import CommandLine
from proxgpu.cli.hosts import connector
from proxgpu.errors import ProxgpuError, UsageError
from proxgpu.fleet import ClusterNodes, Say, each_host
from proxgpu.fleet.cluster import members_file
from proxgpu.host.base import Host
from proxgpu.inspection.capture import Capture, as_cluster_node, gather, guest_files, write_tree


def snapshot_cluster(line: CommandLine, nodes: ClusterNodes) -> int:
    """Capture every online node, then write each one's tree; exit with the worst node's code
    (a node that could not be read has no tree, and says why)."""
    out = Path(line.output or ".")
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out}: exists and is not empty; choose a new directory")
    outcomes = each_host(nodes.targets, _read, connect=connector(line), forks=line.forks)
    read = {n: o.or_error() for n, o in outcomes.items()}
    captured = {n: r for n, r in read.items() if not isinstance(r, ProxgpuError)}
    guests = {n: guest_files(capture) for n, (capture, _) in captured.items()}
    written: dict[str, Any] = {}
    for name, (capture, members) in captured.items():
        node = as_cluster_node(capture, name, guests, members)
        written[name] = {"output": str(out / name), "entries": write_tree(node, str(out / name))}
    failed = {n: r for n, r in read.items() if isinstance(r, ProxgpuError)}
    for name, exc in failed.items():
        print(f"proxgpu: {name}: {exc}", file=sys.stderr)
        written[name] = {"error": {"code": exc.exit_code, "message": str(exc)}}
    for name, why in nodes.skipped.items():
        print(f"{name}: {why}", file=sys.stderr)
    if line.json:
        print(json.dumps({"cluster": nodes.members.name, "hosts": written}, indent=2))
    else:
        print(
            f"cluster {nodes.members.name}: wrote {len(captured)} node trees to {out} "
            f"({', '.join(captured) or 'none'}); read it back with: "
            f"proxgpu plan --root {out} --cluster"
        )
    return max((exc.exit_code for exc in failed.values()), default=0)


def _read(host: Host, say: Say) -> tuple[Capture, bytes]:
    """One node's capture and its own ``.members`` (it names the node).

    :raises SysfsError: when the node has no ``.members``.
    """
    return gather(host, modes=True), members_file(host)
