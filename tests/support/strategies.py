"""Hypothesis strategies for whole hosts, shared by the planner's property tests and the
Proxmox checks of what gets rendered for them.

>>> from hypothesis import find
>>> len(find(random_hosts(), lambda inventory: len(inventory.numa_nodes) == 2).numa_nodes)
2
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import strategies as st

from proxgpu.inspection.inventory import Inventory, PciFunction
from tests.support.factories import make_fn, make_gpu, make_inventory


def bridge_peer() -> PciFunction:
    """The root port above a GPU, in its IOMMU group (vfio-pci never takes a bridge)."""
    return make_fn(
        "0000:80:01.0",
        60,
        node=1,
        class_code="0x060400",
        vendor_id="8086",
        device_id="1572",
        name="PCI bridge",
        driver="pcieport",
        is_bridge=True,
    )


@st.composite
def random_hosts(draw: st.DrawFn) -> Inventory:
    """Hosts with 1-4 nodes and up to 12 GPUs; IOMMU groups never cross a node, no foreign peers."""
    node_count = draw(st.integers(1, 4))
    gpu_nodes = draw(st.lists(st.integers(0, node_count - 1), min_size=1, max_size=12))
    specs: list[tuple[str, int, int]] = []
    for i, node in enumerate(gpu_nodes):
        shares = bool(specs) and specs[-1][1] == node and draw(st.booleans())
        specs.append((f"{0x10 + i:02x}", node, specs[-1][2] if shares else 100 + i))
    members: dict[int, list[str]] = defaultdict(list)
    for bus, _, group in specs:
        members[group].append(bus)
    gpus = [
        make_gpu(
            bus,
            node,
            group=group,
            audio=draw(st.booleans()),
            minor=i,
            peers=tuple(
                make_fn(f"0000:{other}:00.0", group, node=node)
                for other in members[group]
                if other != bus
            )
            + ((bridge_peer(),) if draw(st.booleans()) else ()),
        )
        for i, (bus, node, group) in enumerate(specs)
    ]
    nodes = {n: f"{n * 8}-{n * 8 + 7}" for n in range(node_count)}
    return make_inventory(gpus, nodes)
