"""How the planner words GPUs, counts and lists in its messages.

>>> count(1, "GPU"), count(2, "GPU"), join(["a", "b", "c"])
('1 GPU', '2 GPUs', 'a, b and c')
"""

from __future__ import annotations

from collections.abc import Iterable

from proxgpu.inspection.inventory import Gpu
from proxgpu.planning.model import MigUse, PlanGroup, Role, VgpuUse
from proxgpu.pve.claims import DeviceClaim


def addresses(gpus: Iterable[Gpu]) -> list[str]:
    return [gpu.address for gpu in gpus]


def address(gpu: Gpu) -> str:
    return gpu.address


def join(items: Iterable[object]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    texts = [str(item) for item in items]
    return " and ".join(texts) if len(texts) < 3 else f"{', '.join(texts[:-1])} and {texts[-1]}"


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def with_roles(gpus: list[Gpu], roles: dict[str, Role]) -> str:
    return ", ".join(f"{gpu.address} ({roles[gpu.address]})" for gpu in sorted(gpus, key=address))


def claim_lines(claims: list[DeviceClaim]) -> str:
    via = {f" via PCI mapping {c.mapping}" for c in claims if c.mapping}
    return f"{'; '.join(repr(c.line) for c in claims)} in {claims[0].path}{''.join(sorted(via))}"


def group_name(group: PlanGroup) -> str:
    if group.guest is None:
        return f"the {group.role} group"
    return f"the {group.role} group of {join(guest.label for guest in group.guests)}"


def node_order(node: int | None) -> tuple[bool, int]:
    """Sort key placing unknown nodes last."""
    return (node is None, node or 0)


def vgpu_list(uses: list[VgpuUse]) -> str:
    """``VM 310 (nvidia-1155), VM 400 (nvidia-1155, added)``: which VMs use vGPUs of a GPU, with
    the SR-IOV virtual function each is on (``VM 311 (nvidia-1155 on VF 0000:81:00.4)``)."""
    return ", ".join(f"VM {u.vmid} ({_vgpu(u)}{', added' if u.added else ''})" for u in uses)


def _vgpu(use: VgpuUse) -> str:
    if use.function is None:
        return str(use.mdev_type)
    if use.mdev_type is None:
        return f"VF {use.function}, passed through whole"
    return f"{use.mdev_type} on VF {use.function}"


def mig_list(uses: list[MigUse]) -> str:
    """``CT 200 (GI 2 CI 0, MIG-...), CT 201 (GI 9 CI 0)``: which containers get which MIG
    instance, with the ``CUDA_VISIBLE_DEVICES`` value that selects it where it is known.

    >>> from proxgpu.planning.model import MigUse
    >>> mig_list([MigUse(vmid=200, gpu_minor=0, gi=2, ci=0, gi_minor=21, ci_minor=22,
    ...                  uuid="MIG-4ba8a3ab-2fd8-5f0b-9b5c-02000000c7a2"),
    ...           MigUse(vmid=201, gpu_minor=0, gi=9, ci=0, gi_minor=84, ci_minor=85)])
    'CT 200 (GI 2 CI 0, MIG-4ba8a3ab-2fd8-5f0b-9b5c-02000000c7a2), CT 201 (GI 9 CI 0)'
    """
    return ", ".join(
        f"CT {u.vmid} (GI {u.gi} CI {u.ci}{f', {u.uuid}' if u.uuid else ''})" for u in uses
    )
