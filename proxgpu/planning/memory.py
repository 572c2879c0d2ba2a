"""Whether each guest's memory fits the NUMA node its memory is bound to."""

from __future__ import annotations

import re

from proxgpu.paths import guest_config
from proxgpu.planning.context import Context
from proxgpu.planning.model import PlanGroup
from proxgpu.pve.claims import GuestRef
from proxgpu.pve.config import GuestConfig, parse_property_string
from proxgpu.pve.resources import hotplugs_memory, memory_mib

#: Above this share of a node's memory a bound guest leaves the host too little there.
TIGHT = 0.9


def check_memory_fit(ctx: Context, groups: list[PlanGroup]) -> None:
    """A VM bound to a node (``numa0 ... policy=bind``) must fit it, else it is refused; a
    container pinned to one (``cpuset.mems``), or a VM close to the node's size, gets a warning.
    Every container sharing a group is pinned to its node, so each is weighed.
    """
    for group in groups:
        node = _node_mib(ctx, group)
        if node is not None:
            for guest in group.guests:
                _check_guest(ctx, group, guest, node)


def _check_guest(ctx: Context, group: PlanGroup, guest: GuestRef, node: int) -> None:
    text = ctx.inventory.guest_configs.get(guest_config(guest.type, guest.vmid))
    config = GuestConfig.parse(text) if text is not None else None
    if config is None or not _bound_to(config, group, guest):
        return
    memory = memory_mib(config)
    if memory is None or memory <= node * TIGHT:
        return
    where = f"NUMA node {group.numa_node}, which has {node} MiB"
    if guest.type == "vm" and memory > node:
        ctx.problem(
            "memory",
            f"{guest.label} has {memory} MiB of memory, bound to {where}: it could not get it "
            "there",
            f"lower its memory: to under {int(node * TIGHT)} MiB, or give it GPUs on a node "
            "with more memory",
        )
    else:
        ctx.warnings.append(
            f"{guest.label} has {memory} MiB of memory and its memory is kept on {where}"
            + (": more than the node has" if memory > node else ": little is left there")
        )


def _bound_to(config: GuestConfig, group: PlanGroup, guest: GuestRef) -> bool:
    """Whether the guest's memory will be kept on the group's node: always for a container
    (``cpuset.mems``); for a VM unless it hotplugs memory (no ``numa0`` then) or its own ``numaN``
    entries bind it elsewhere."""
    if guest.type == "lxc":
        return True
    if hotplugs_memory(config):
        return False
    for key, value in config.entries():
        if re.fullmatch(r"numa\d+", key):
            try:
                hostnodes = parse_property_string(value).get("hostnodes")
            except ValueError:
                return False
            if hostnodes != str(group.numa_node):
                return False
    return True


def _node_mib(ctx: Context, group: PlanGroup) -> int | None:
    if group.numa_node is None:
        return None
    node = next((n for n in ctx.inventory.numa_nodes if n.id == group.numa_node), None)
    if node is None or not node.memory_kib:
        return None
    return node.memory_kib // 1024
