"""A ``--root`` that holds a cluster snapshot (``DIR/NODE/`` trees) rather than one host's tree.

Read as one host it would fail deep in inspection ("no PCI devices found"); the user meant
``--cluster``, or one node's tree. Checked with a few ``stat`` calls before anything is imported.

>>> check_not_a_cluster_snapshot("examples/hosts/ct200")
>>> check_not_a_cluster_snapshot("examples/hosts/cluster-3")
Traceback (most recent call last):
...
proxgpu.errors.UsageError: examples/hosts/cluster-3: a cluster snapshot (nodes pve1, pve2, pve3): \
add --cluster, or name one node's tree (--root examples/hosts/cluster-3/pve1)
"""

from __future__ import annotations

from pathlib import Path

from proxgpu.errors import UsageError
from proxgpu.paths import MEMBERS, PCI_DEVICES


def check_not_a_cluster_snapshot(root: str) -> None:
    """Refuse ``root`` when it is no host's tree but holds node trees of a cluster snapshot.

    :raises UsageError: naming the nodes and both ways on.
    """
    top = Path(root)
    if (top / PCI_DEVICES.strip("/")).is_dir() or not top.is_dir():
        return  # a host's tree, or missing: the host layer says what is wrong with it
    nodes = sorted(p.name for p in top.iterdir() if (p / MEMBERS.lstrip("/")).is_file())
    if nodes:
        raise UsageError(
            f"{root}: a cluster snapshot (nodes {', '.join(nodes)}): add --cluster, "
            f"or name one node's tree (--root {top / nodes[0]})"
        )
