"""In-memory inventories for the planner: the one factory of the unit tests and the benchmarks.

Nothing here runs a command or reads a tree: a :class:`Gpu` is built field by field, as inspection
would have built it from sysfs.

>>> gpu = make_gpu("81", 1, audio=True, minor=4)
>>> (gpu.address, gpu.functions, gpu.iommu_group, gpu.local_cpus)
('0000:81:00.0', ['0000:81:00.0', '0000:81:00.1'], 129, '32-63,96-127')
>>> [(f.class_code, f.driver) for f in gpu.function_info]
[('0x030200', 'nvidia'), ('0x040300', 'snd_hda_intel')]
>>> [g.numa_node for g in ct200().gpus]
[0, 0, 0, 0, 1, 1, 1, 1]
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxgpu.inspection.inventory import Gpu, Inventory, NumaNode, PciFunction

#: The CPUs of each NUMA node of a two-socket host with SMT (ct200's nodes, and most tests').
TWO_SOCKETS = {0: "0-31,64-95", 1: "32-63,96-127"}
#: The PCI buses of the ct200 example's GPUs, by NUMA node.
CT200_NODES = {0: ["01", "11", "61", "71"], 1: ["81", "91", "e1", "f1"]}

AUDIO_CLASS = "0x040300"  # an HDMI audio function beside a GPU
BRIDGE_CLASS = "0x060400"  # a PCI bridge


def make_fn(
    address: str, group: int | None, *, node: int | None = None, **fields: Any
) -> PciFunction:
    """A PCI function; by default an NVIDIA 3D controller bound to nvidia."""
    values: dict[str, Any] = {
        "class_code": "0x030200",
        "vendor_id": "10de",
        "device_id": "2330",
        "driver": "nvidia",
    }
    values.update(fields)
    return PciFunction(address=address, numa_node=node, iommu_group=group, **values)


def bridge(address: str, group: int | None, *, node: int | None = None) -> PciFunction:
    """A PCI bridge (a root or switch port) in an IOMMU group."""
    return make_fn(
        address, group, node=node, class_code=BRIDGE_CLASS, driver="pcieport", is_bridge=True
    )


def make_gpu(
    bus: str,
    node: int | None,
    *,
    group: int | None = -1,
    audio: bool = False,
    peers: tuple[PciFunction, ...] = (),
    minor: int | None = None,
    boot_vga: bool = False,
    driver: str | None = "nvidia",
    function: int = 0,
    slot_functions: tuple[int, ...] = (),
    model: str = "NVIDIA H100",
    local_cpus: str | None = None,
) -> Gpu:
    """A GPU at ``0000:<bus>:00.<function>``; ``group=-1`` means its own IOMMU group (the bus).

    ``audio`` adds an HDMI audio function at ``.1`` (on snd_hda_intel while the GPU is on
    nvidia, else on the GPU's driver); ``slot_functions`` are more GPU functions in the same slot.
    Every function of the slot is in the GPU's IOMMU group, as are ``peers``. ``local_cpus``
    defaults to the node's CPUs on a :data:`TWO_SOCKETS` host (none for another node), or every
    CPU for an unknown node.
    """
    address = f"0000:{bus}:00.{function}"
    iommu = int(bus, 16) if group == -1 else group
    audio_numbers = {1} - {function, *slot_functions} if audio else set()
    numbers = sorted({function, *slot_functions, *audio_numbers})
    functions = [address] + [f"0000:{bus}:00.{n}" for n in numbers if n != function]
    audio_driver = "snd_hda_intel" if driver == "nvidia" else driver
    info = [
        make_fn(f"0000:{bus}:00.{n}", iommu, node=node, class_code=AUDIO_CLASS, driver=audio_driver)
        if n in audio_numbers
        else make_fn(f"0000:{bus}:00.{n}", iommu, node=node, driver=driver)
        for n in [function, *(n for n in numbers if n != function)]
    ]
    own_peers = [fn for fn in info if fn.address != address]
    if local_cpus is None:
        # An unknown node's local_cpulist: every online CPU.
        local_cpus = "0-127" if node is None else TWO_SOCKETS.get(node)
    return Gpu(
        address=address,
        vendor_id="10de",
        device_id="2330",
        class_code="0x030200",
        model=model,
        numa_node=node,
        local_cpus=local_cpus,
        iommu_group=iommu,
        driver=driver,
        boot_vga=boot_vga,
        functions=functions,
        function_info=info,
        iommu_group_peers=[*own_peers, *peers],
        nvidia_minor=minor,
    )


def make_inventory(
    gpus: list[Gpu],
    nodes: dict[int, str] | None = None,
    *,
    iommu: bool = True,
    configs: dict[str, str] | None = None,
    hostname: str = "pve1",
) -> Inventory:
    """A host with these GPUs, NUMA nodes (id -> CPU list; default :data:`TWO_SOCKETS`) and
    guest configs (path -> text)."""
    return Inventory(
        source=hostname,  # reached by the name it has, as `--host pve1` reaches pve1
        hostname=hostname,
        iommu_enabled=iommu,
        numa_nodes=[
            NumaNode(id=i, cpus=c) for i, c in (TWO_SOCKETS if nodes is None else nodes).items()
        ],
        gpus=gpus,
        guest_configs=configs or {},
    )


def ct200(configs: dict[str, str] | None = None, *, iommu: bool = True) -> Inventory:
    """The ct200 example: 8 GPUs, 4 per socket, each with an HDMI audio function in its group."""
    gpus = [
        make_gpu(bus, node, audio=True, minor=minor)
        for minor, (node, bus) in enumerate(
            (node, bus) for node, buses in CT200_NODES.items() for bus in buses
        )
    ]
    return make_inventory(gpus, configs=configs, iommu=iommu)


def eight_by_eight() -> Inventory:
    """A DGX-class host in NPS4 on two sockets: 8 NUMA nodes with 8 GPUs each, every pair of GPUs
    behind one PCIe switch below its root port (the parent chains inspection reads from sysfs),
    each GPU with its HDMI audio function."""
    gpus = []
    for node in range(8):
        for slot in range(8):
            bus = node * 0x20 + slot + 1
            gpu = make_gpu(f"{bus:02x}", node, audio=True, minor=node * 8 + slot)
            port = f"0000:{node * 0x20:02x}:0{slot // 2 + 1}.1"
            switch = f"0000:{node * 0x20 + 0x10 + slot // 2:02x}:00.0"
            path = [port, switch, f"0000:{node * 0x20 + 0x18 + slot // 2:02x}:0{slot % 2}.0"]
            gpus.append(replace(gpu, pci_path=path))
    nodes = {node: f"{node * 16}-{node * 16 + 15}" for node in range(8)}
    return make_inventory(gpus, nodes)


def bmc_display(bus: str = "02", node: int | None = 0) -> Gpu:
    """An ASPEED AST2600 on ast, as inspection reads a server's BMC display."""
    gpu = make_gpu(bus, node, driver="ast", model="ASPEED Graphics Family")
    ids: dict[str, Any] = {"vendor_id": "1a03", "device_id": "2000"}
    functions = [replace(f, **ids) for f in gpu.function_info]
    return replace(
        gpu,
        **{
            **ids,
            "class_code": "0x030000",
            "bmc_display": True,
            "function_info": functions,
        },
    )


def with_gpus(inventory: Inventory, *gpus: Gpu, vfio: tuple[str, ...] = ()) -> Inventory:
    """The inventory with more GPUs, and those at ``vfio`` bound to vfio-pci (no Device Minor)."""
    moved = [
        replace(gpu, driver="vfio-pci", nvidia_minor=None) if gpu.address in vfio else gpu
        for gpu in inventory.gpus
    ]
    return replace(inventory, gpus=[*moved, *gpus])


def container(inventory: Inventory, minors: list[int]) -> Inventory:
    """The inventory as read inside an LXC container given these /dev/nvidiaN."""
    nodes = ["/dev/nvidiactl", *(f"/dev/nvidia{minor}" for minor in minors)]
    return replace(inventory, container="/dev/.lxc-boot-id", device_nodes=nodes)
