"""``snapshot --cluster -o DIR``: one tree per online node under ``DIR/NODE/``, written by
:func:`proxgpu.fleet.cluster.snapshot_cluster`, so that ``--root DIR --cluster`` plans the
cluster offline; this module says what was written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from proxgpu.cli.commandline import CommandLine
from proxgpu.cli.console import error_document
from proxgpu.cli.hosts import connector
from proxgpu.errors import ProxgpuError
from proxgpu.fleet import ClusterNodes
from proxgpu.fleet.cluster import snapshot_cluster


def show_snapshot(line: CommandLine, nodes: ClusterNodes) -> int:
    """Snapshot every online node and say where each tree went; exit with the worst node's
    code (a node that could not be read has no tree, and says why)."""
    out = line.output or "."
    written = snapshot_cluster(nodes, out, connect=connector(line), forks=line.forks)
    document: dict[str, Any] = {}
    for name, entries in written.items():
        if isinstance(entries, ProxgpuError):
            print(f"proxgpu: {name}: {entries}", file=sys.stderr)
            document[name] = error_document(entries)
        else:
            document[name] = {"output": str(Path(out) / name), "entries": entries}
    for name, why in nodes.skipped.items():
        print(f"{name}: {why}", file=sys.stderr)
    trees = [name for name, entries in written.items() if not isinstance(entries, ProxgpuError)]
    if line.json:
        print(json.dumps({"cluster": nodes.members.name, "hosts": document}, indent=2))
    else:
        print(
            f"cluster {nodes.members.name}: wrote {len(trees)} node trees to {out} "
            f"({', '.join(trees) or 'none'}); read it back with: "
            f"proxgpu plan --root {out} --cluster"
        )
    failed = [e.exit_code for e in written.values() if isinstance(e, ProxgpuError)]
    return max(failed, default=0)
