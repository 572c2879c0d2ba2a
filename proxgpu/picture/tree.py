"""The picture as text, for a shell over SSH: ``proxgpu inspect --tree``, like
``lstopo --of console``. The same topology as the SVG, drawn with box-drawing characters.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> lines = inventory_tree(inspect(DirectoryHost("examples/hosts/ct200"))).splitlines()
>>> lines[1], lines[3]
('NUMA node 0: CPUs 0-31, 504 GiB, 4 GPUs', '│  └─ 0000:00:01.1 root port')
"""

from __future__ import annotations

from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.picture.topology import Assignment, TreeNode, build_topology, shared_groups


def inventory_tree(inventory: Inventory, roles: dict[str, Assignment] | None = None) -> str:
    """The host as a text tree: each NUMA node, its PCIe tree, each GPU with its facts."""
    lines = [inventory.summary]
    for column in build_topology(inventory):
        gpus = len(column.gpus())
        memory = f"{column.memory_kib / 1048576:.0f} GiB" if column.memory_kib else "memory ?"
        lines.append(f"{column.title}: CPUs {column.cpus}, {memory}, {gpus} GPU{'s' * (gpus != 1)}")
        shared = set(shared_groups(column))
        for i, root in enumerate(column.roots):
            lines += _branch(root, "", i == len(column.roots) - 1, shared, roles)
        if not column.roots:
            lines.append("   (no PCIe devices shown)")
    return "\n".join(lines) + "\n"


def _branch(
    node: TreeNode,
    prefix: str,
    last: bool,
    shared: set[int],
    roles: dict[str, Assignment] | None,
) -> list[str]:
    below = prefix + ("   " if last else "│  ")
    lines = [f"{prefix}{'└─' if last else '├─'} {_label(node)}"]
    lines += [f"{below}   {detail}" for detail in _details(node, shared, roles)]
    for i, child in enumerate(node.children):
        lines += _branch(child, below, i == len(node.children) - 1, shared, roles)
    return lines


def _label(node: TreeNode) -> str:
    if node.gpu is not None:
        return f"{node.address} {node.gpu.label}"
    if node.function is not None:
        kind = "NIC" if node.kind == "nic" else "in a GPU's IOMMU group"
        return f"{node.address} {kind}: {node.function.name or node.function.class_code}"
    return node.label


def _details(node: TreeNode, shared: set[int], roles: dict[str, Assignment] | None) -> list[str]:
    group = node.iommu_group
    group_text = "no IOMMU group" if group is None else f"IOMMU group {group}"
    if group is not None and group in shared:
        group_text += " (shared: moves as one)"
    if node.function is not None and node.gpu is None:
        return [f"driver {node.function.driver or '-'}, {group_text}"]
    if node.gpu is None:
        return []
    return (
        [_gpu_facts(node.gpu, node.muted, group_text, roles)]
        + [
            f".{f.address.rsplit('.', 1)[1]} {_kind(f.class_code)}, driver {f.driver or '-'}"
            for f in node.gpu.function_info[1:]
        ]
        + [said for said in (node.gpu.virtual_functions_said,) if said]
    )


def _gpu_facts(gpu: Gpu, muted: bool, group_text: str, roles: dict[str, Assignment] | None) -> str:
    facts = [] if gpu.nvidia_minor is None else [f"/dev/nvidia{gpu.nvidia_minor}"]
    role = roles.get(gpu.address) if roles is not None else None
    if role is None:
        facts.append(f"driver {gpu.driver or '-'}")
    else:
        target = f"for {role.guest}" if role.guest else "for no guest"
        facts.append(f"driver {gpu.driver or '-'} -> {role.driver} {target}")
    facts.append(group_text)
    if muted or (roles is not None and role is None):
        facts.append("left as it is (not split)")
    return ", ".join(facts)


def _kind(class_code: str) -> str:
    return "audio" if class_code.startswith("0x0403") else f"class {class_code}"
