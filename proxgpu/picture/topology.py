"""The host as a tree: NUMA nodes, each with its PCIe tree from root buses through root ports and
switches down to GPUs, NICs and the other devices that share a GPU's IOMMU group.

Both the SVG picture and the terminal tree are drawn from this one model, so they always show the
same structure. Pure: a function of an :class:`~proxgpu.inspection.Inventory` and, for a report,
of a :class:`~proxgpu.planning.Plan`.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> columns = build_topology(inspect(DirectoryHost("examples/hosts/ct200")))
>>> [(c.title, len(c.gpus())) for c in columns]
[('NUMA node 0', 4), ('NUMA node 1', 4)]
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from proxgpu.inspection.inventory import Gpu, Inventory, PciFunction
from proxgpu.pci import is_bmc_display
from proxgpu.planning.model import Plan, Role

Kind = Literal["root", "bridge", "gpu", "nic", "device"]

#: The root under which devices whose sysfs path the capture lacks are drawn (a snapshot taken
#: before proxgpu recorded it, such as examples/hosts/h200-vm).
UNKNOWN_ROOT = "PCIe path not captured"


@dataclass(frozen=True)
class Assignment:
    """What a plan does with one GPU: its role, the driver it will have and its guest.

    >>> Assignment(role="vfio", driver="vfio-pci", guest="VM 300").guest
    'VM 300'
    """

    role: Role
    driver: str
    guest: str | None


@dataclass
class TreeNode:
    """One row of the PCIe tree: a root bus, a bridge, or a device with what it is."""

    kind: Kind
    address: str
    label: str
    iommu_group: int | None = None
    gpu: Gpu | None = None
    function: PciFunction | None = None
    muted: bool = False
    children: list[TreeNode] = field(default_factory=list)

    def walk(self) -> list[TreeNode]:
        """This node and every node below it, depth first, in drawing order."""
        return [self, *(node for child in self.children for node in child.walk())]


@dataclass
class Column:
    """One NUMA node (or the GPUs whose node the firmware does not give) and its PCIe tree."""

    node_id: int | None
    title: str
    cpus: str
    memory_kib: int | None
    roots: list[TreeNode]

    def nodes(self) -> list[TreeNode]:
        """Every tree node of the column, in drawing order."""
        return [node for root in self.roots for node in root.walk()]

    def gpus(self) -> list[Gpu]:
        """The column's GPUs, in drawing order."""
        return [node.gpu for node in self.nodes() if node.gpu is not None]


def assignments(plan: Plan) -> dict[str, Assignment]:
    """Each planned GPU's role, driver and guest, by address.

    >>> from proxgpu.planning.model import PlanGroup
    >>> group = PlanGroup(role="host", numa_node=0, gpus=["0000:01:00.0"], functions=[],
    ...                   cpus="0-31", memory_nodes=[0], driver="nvidia",
    ...                   guest={"type": "lxc", "vmid": 200})
    >>> assignments(Plan(groups=[group], warnings=[], tensor_parallel=[]))["0000:01:00.0"]
    Assignment(role='host', driver='nvidia', guest='CT 200')
    """
    found = {}
    for group in plan.groups:
        guest = ", ".join(g.label for g in group.guests) or None
        if group.vgpus:
            guest = "vGPU: " + ", ".join(f"VM {use.vmid}" for use in group.vgpus)
        if group.mig:
            guest = "MIG: " + ", ".join(f"CT {use.vmid}" for use in group.mig)
        for address in group.gpus:
            found[address] = Assignment(role=group.role, driver=group.driver, guest=guest)
    return found


def build_topology(inventory: Inventory) -> list[Column]:
    """One column per NUMA node (and one for GPUs on an unknown node), each with its PCIe tree.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> column = build_topology(inspect(DirectoryHost("examples/hosts/ct200")))[0]
    >>> [n.label for n in column.nodes()][:3]
    ['pci0000:00', '0000:00:01.1 root port', '0000:01:00.0']
    """
    items = _items(inventory)
    bridges = _bridge_groups(inventory)
    columns = [
        Column(node.id, f"NUMA node {node.id}", node.cpus, node.memory_kib, [])
        for node in inventory.numa_nodes
    ]
    known = {node.id for node in inventory.numa_nodes}
    if any(item.node not in known for item in items):
        columns.append(Column(None, "NUMA node unknown", "?", None, []))
    for column in columns:
        mine = [item for item in items if _column_of(item, known) == column.node_id]
        column.roots = _tree(mine, bridges)
    return columns


@dataclass(frozen=True)
class _Item:
    """A device to draw, with the NUMA node whose column holds it."""

    node: int | None
    path: list[str] | None
    leaf: TreeNode


def _column_of(item: _Item, known: set[int]) -> int | None:
    return item.node if item.node in known else None


def _items(inventory: Inventory) -> list[_Item]:
    items = [_gpu_item(gpu) for gpu in inventory.gpus]
    drawn = {address for gpu in inventory.gpus for address in gpu.functions}
    for nic in inventory.nics:
        drawn.add(nic.address)
        leaf = TreeNode("nic", nic.address, nic.address, nic.iommu_group, function=nic)
        items.append(_Item(_nic_node(nic, inventory), nic.pci_path, leaf))
    for gpu in inventory.gpus:
        for peer in gpu.iommu_group_peers:
            if peer.is_bridge or peer.address in drawn:
                continue
            drawn.add(peer.address)
            # Not a GPU, yet it moves with one: shown muted, inside the group's frame.
            leaf = TreeNode(
                "device", peer.address, peer.address, peer.iommu_group, function=peer, muted=True
            )
            items.append(_Item(gpu.numa_node, peer.pci_path, leaf))
    return items


def _gpu_item(gpu: Gpu) -> _Item:
    # A BMC's display is the board's console, not a GPU to split: drawn, but muted.
    muted = is_bmc_display(gpu.vendor_id, gpu.device_id)
    leaf = TreeNode("gpu", gpu.address, gpu.address, gpu.iommu_group, gpu=gpu, muted=muted)
    return _Item(gpu.numa_node, gpu.pci_path, leaf)


def _nic_node(nic: PciFunction, inventory: Inventory) -> int | None:
    if nic.numa_node is not None:
        return nic.numa_node
    # Firmware without proximity data: the NIC sits with the GPU behind the same root port.
    port = nic.pci_path[0] if nic.pci_path else None
    return next((g.numa_node for g in inventory.gpus if g.pci_path and g.pci_path[0] == port), None)


def _bridge_groups(inventory: Inventory) -> dict[str, int | None]:
    """The IOMMU group of each bridge that shares one with a GPU (the others' are not read)."""
    return {
        peer.address: peer.iommu_group
        for gpu in inventory.gpus
        for peer in gpu.iommu_group_peers
        if peer.is_bridge
    }


def _root_name(item: _Item) -> str:
    if item.path is None:
        return UNKNOWN_ROOT
    top = item.path[0] if item.path else item.leaf.address
    return "pci" + top.rsplit(":", 1)[0]


def _tree(items: list[_Item], bridges: dict[str, int | None]) -> list[TreeNode]:
    roots: dict[str, TreeNode] = {}
    by_address: dict[str, TreeNode] = {}
    for item in sorted(items, key=lambda i: i.leaf.address):
        name = _root_name(item)
        parent = roots.setdefault(name, TreeNode("root", name, name))
        for address in item.path or []:
            node = by_address.get(address)
            if node is None:
                node = TreeNode("bridge", address, address, bridges.get(address))
                by_address[address] = node
                parent.children.append(node)
            parent = node
        parent.children.append(item.leaf)
    for root in roots.values():
        _sort(root)
        _name_bridges(root)
    # Known root buses in address order; devices without a path last.
    return sorted(roots.values(), key=lambda r: (r.address == UNKNOWN_ROOT, r.address))


def _sort(node: TreeNode) -> None:
    node.children.sort(key=lambda child: child.address)
    for child in node.children:
        _sort(child)


def _name_bridges(root: TreeNode) -> None:
    """Root port for the first bridge below a root bus; below it, a bridge with bridges under it
    is a switch (its upstream port), any other a switch's downstream port."""
    for port in root.children:
        if port.kind == "bridge":
            port.label = f"{port.address} root port"
            _name_switch_ports(port)


def _name_switch_ports(parent: TreeNode) -> None:
    for child in parent.children:
        if child.kind == "bridge":
            below = any(grand.kind == "bridge" for grand in child.children)
            child.label = f"{child.address} {'switch' if below else 'switch port'}"
            _name_switch_ports(child)


def shared_groups(column: Column) -> dict[int, list[TreeNode]]:
    """The IOMMU groups to frame in a column: those holding more than one drawn GPU or device,
    or a GPU and a bridge (a switch without ACS), with their nodes in drawing order.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> column = build_topology(inspect(DirectoryHost("examples/hosts/shared-iommu-group")))[1]
    >>> [(group, len(nodes)) for group, nodes in shared_groups(column).items()]
    [(40, 6)]
    """
    members: dict[int, list[TreeNode]] = defaultdict(list)
    for node in column.nodes():
        if node.iommu_group is not None and node.kind != "root":
            members[node.iommu_group].append(node)
    return {
        group: nodes
        for group, nodes in members.items()
        if len(nodes) > 1 and any(n.kind == "gpu" for n in nodes)
    }
