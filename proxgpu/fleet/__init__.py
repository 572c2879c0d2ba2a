"""Many hosts and clusters, for the command line, Python scripts and Ansible alike.

:mod:`~proxgpu.fleet.engine` runs work over many hosts (concurrent reads, rolling changes that
stop at the first failure, a typed outcome per host, events as they happen);
:mod:`~proxgpu.fleet.cluster` holds the rules of a Proxmox VE cluster (its members, every node
planned before any write, one pooled mapping written first).

>>> from proxgpu.fleet import plan_cluster, snapshot_nodes
>>> from proxgpu.planning import SplitPolicy
>>> planned = plan_cluster(snapshot_nodes("examples/hosts/cluster-3"), SplitPolicy(vms=[300]))
>>> list(planned.proposals), planned.failed
(['pve1', 'pve2', 'pve3'], {})
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from proxgpu.fleet.engine import (
    FORKS,
    Event,
    Outcome,
    Rollout,
    Say,
    Target,
    each_host,
    expand_hosts,
    roll_out,
)

if TYPE_CHECKING:
    from proxgpu.fleet.cluster import (
        ClusterNodes,
        ClusterPlan,
        apply_cluster,
        find_nodes,
        plan_cluster,
        snapshot_cluster,
        snapshot_nodes,
    )

# The cluster rules bring the whole apply stack (journal, rendering, Jinja2); a one-host command
# that needs only the engine's Say must not pay for them at start-up, so they load on first use.
_CLUSTER = frozenset(
    (
        "ClusterNodes",
        "ClusterPlan",
        "apply_cluster",
        "find_nodes",
        "plan_cluster",
        "snapshot_cluster",
        "snapshot_nodes",
    )
)


def __getattr__(name: str) -> object:
    if name in _CLUSTER:
        return getattr(import_module("proxgpu.fleet.cluster"), name)
    raise AttributeError(f"module 'proxgpu.fleet' has no attribute {name!r}")


__all__ = [
    "FORKS",
    "ClusterNodes",
    "ClusterPlan",
    "Event",
    "Outcome",
    "Rollout",
    "Say",
    "Target",
    "apply_cluster",
    "each_host",
    "expand_hosts",
    "find_nodes",
    "plan_cluster",
    "roll_out",
    "snapshot_cluster",
    "snapshot_nodes",
]
