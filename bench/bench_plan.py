"""Wall time of ``plan_split`` on a synthetic 8-node, 64-GPU host, against a floor from one run.

The host has 8 NUMA nodes with 8 GPUs each; every GPU has an HDMI audio function and a bridge in
its IOMMU group, and the guest configs hold a few containers and VMs with GPU entries, so that
every check does real work. It is built with the test suite's own factory
(``tests/support/factories.py``). Scenarios:

* numa: the default split with a container target (8 GPUs host, 56 vfio in 7 groups);
* vms: the same plus seven VMs of 8 GPUs each, placed one per node.

The floor is rebuilding the inventory from its own dump
(``TypeAdapter(Inventory).validate_python``): the cheapest thing any consumer of an inventory
does. Run: python bench/bench_plan.py [iterations]
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pydantic import TypeAdapter  # noqa: E402

from bench.timing import median_seconds  # noqa: E402
from proxgpu.inspection.inventory import Gpu, Inventory  # noqa: E402
from proxgpu.planning import plan_split  # noqa: E402
from proxgpu.planning.model import SplitPolicy  # noqa: E402
from tests.support.factories import bridge, make_gpu, make_inventory  # noqa: E402

NODES = 8
GPUS_PER_NODE = 8
CPUS_PER_NODE = 16


def node_cpus(node: int) -> str:
    return f"{node * CPUS_PER_NODE}-{(node + 1) * CPUS_PER_NODE - 1}"


def gpu(node: int, slot: int) -> Gpu:
    """An H100 with its HDMI audio function and its root port, all in one IOMMU group."""
    index = node * GPUS_PER_NODE + slot
    port = bridge(f"0000:{node * 0x20:02x}:{slot + 1:02x}.0", index, node=node)
    return make_gpu(
        f"{node * 0x20 + slot + 1:02x}",
        node,
        group=index,
        audio=True,
        peers=(port,),
        minor=index,
        model="NVIDIA H100 80GB HBM3",
        local_cpus=node_cpus(node),
    )


def synthetic_host() -> Inventory:
    configs = {
        "/etc/pve/lxc/200.conf": "cores: 16\nlxc.cgroup2.devices.allow: c 195:* rwm\n",
        "/etc/pve/lxc/201.conf": "dev0: /dev/nvidia1,gid=44\ndev1: /dev/nvidia2,gid=44\n",
        "/etc/pve/qemu-server/300.conf": "hostpci0: 21:00,pcie=1\nhostpci1: mapping=gpus\n",
        "/etc/pve/mapping/pci.cfg": "gpus\n\tmap id=10de:2330,node=bench,path=0000:22:00.0\n",
    }
    return make_inventory(
        [gpu(node, slot) for node in range(NODES) for slot in range(GPUS_PER_NODE)],
        {n: node_cpus(n) for n in range(NODES)},
        configs=configs,
        hostname="bench",
    )


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    inventory = synthetic_host()
    dumped = asdict(inventory)
    adapter = TypeAdapter(Inventory)
    scenarios = {
        "numa": SplitPolicy(lxc=200),
        "vms": SplitPolicy(lxc=200, vms=[(300 + n, GPUS_PER_NODE) for n in range(NODES - 1)]),
    }
    floor = median_seconds(lambda: adapter.validate_python(dumped), runs)
    print(f"{NODES} NUMA nodes, {len(inventory.gpus)} GPUs, {runs} runs each (median)")
    print(f"  floor (validating the inventory's dump): {floor * 1e3:8.3f} ms")
    for name, policy in scenarios.items():
        plan = plan_split(inventory, policy)
        took = median_seconds(partial(plan_split, inventory, policy), runs)
        print(
            f"  plan_split {name:<5} ({len(plan.groups)} groups): {took * 1e3:8.3f} ms"
            f"  = {took / floor:5.1f} x floor"
        )


if __name__ == "__main__":
    main()
