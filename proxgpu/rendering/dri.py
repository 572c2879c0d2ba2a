"""The device nodes of GPUs that are not on nvidia (amdgpu, i915/xe, ...): their real
``/dev/dri/cardN`` and ``renderDN`` nodes, found by PCI address, and amdgpu's ``/dev/kfd``.

Applications enumerate ``/dev/dri/renderD*`` (ROCm, oneAPI, VA-API), so the container gets the
nodes under their own names; a ``devN`` entry on a ``/dev/dri/by-path`` link would create the node
under that link's path instead, where nothing looks.

>>> [(n.path, n.major, n.minor) for n in drm_device_nodes(["card1", "renderD129"], {})]
[('/dev/dri/card1', 226, 1), ('/dev/dri/renderD129', 226, 129)]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.rendering.context import RenderContext, containers_named

#: The DRM character major (fixed in the kernel, ``DRM_MAJOR``).
DRM_MAJOR = 226
KFD = "/dev/kfd"
#: A DRM node's name: its kind and number (the minor): ``card1``, ``renderD129``.
_DRM_NODE = re.compile(r"(card|renderD)(\d+)")


@dataclass(frozen=True)
class DeviceNode:
    """A device node a container is given: its path and, when known, its major and minor."""

    path: str
    major: int | None
    minor: int | None


def drm_device_nodes(names: list[str], majors: dict[str, int]) -> list[DeviceNode]:
    """``/dev/dri`` nodes by name (``card1``, ``renderD129``): the number is the minor."""
    major = majors.get("drm", DRM_MAJOR)
    return [
        DeviceNode(f"/dev/dri/{name}", major, int(m[2]))
        for name in names
        if (m := _DRM_NODE.fullmatch(name))
    ]


def dri_nodes(ctx: RenderContext, gpus: list[Gpu]) -> list[DeviceNode]:
    """The nodes of the group's GPUs that are not on nvidia, plus ``/dev/kfd`` for amdgpu."""
    nodes: list[DeviceNode] = []
    for gpu in gpus:
        if gpu.drm_nodes:
            nodes += drm_device_nodes(gpu.drm_nodes, ctx.inventory.char_majors)
        else:
            ctx.warnings.append(
                f"{gpu.address}: its /dev/dri node names were not captured (an older snapshot, "
                "or no DRM driver bound): given by /dev/dri/by-path, where applications that list "
                "/dev/dri/renderD* do not look; inspect the host again"
            )
            nodes += [
                DeviceNode(f"/dev/dri/by-path/pci-{gpu.address}-{kind}", None, None)
                for kind in ("card", "render")
            ]
    if any(gpu.host_driver == "amdgpu" for gpu in gpus):
        nodes += _kfd(ctx)
    _warn_about_renumbering(ctx, gpus)
    return nodes


def _kfd(ctx: RenderContext) -> list[DeviceNode]:
    present = ctx.inventory.device_nodes
    if present and KFD not in present:
        ctx.warnings.append(
            f"{KFD} is missing on the host (amdgpu makes it when the kernel has HSA support), "
            f"so ROCm in {containers_named(ctx)} will find no GPU"
        )
        return []
    return [DeviceNode(KFD, ctx.inventory.char_majors.get("kfd"), 0)]


def _warn_about_renumbering(ctx: RenderContext, kept: list[Gpu]) -> None:
    """DRM numbers its nodes in probe order, cards and render nodes each from their own base: GPUs
    that leave for vfio-pci free their numbers at the next boot, and the nodes of kept GPUs
    numbered after them may move down."""
    leaving = {
        address for group in ctx.plan.groups if group.role.moves_to_vfio for address in group.gpus
    }
    freed = [node for gpu in ctx.inventory.gpus if gpu.address in leaving for node in _nodes(gpu)]
    shifted = [
        gpu.address
        for gpu in kept
        if any(kind == k and minor > m for kind, minor in _nodes(gpu) for k, m in freed)
    ]
    if shifted:
        ctx.warnings.append(
            f"{', '.join(shifted)}: their /dev/dri numbers may change at the next boot, now that "
            "GPUs before them leave for vfio-pci; run proxgpu plan after the reboot and apply "
            "again if it shows a change"
        )


def _nodes(gpu: Gpu) -> list[tuple[str, int]]:
    """The GPU's DRM nodes as (kind, number): ``("renderD", 129)``."""
    return [(m[1], int(m[2])) for n in gpu.drm_nodes if (m := _DRM_NODE.fullmatch(n))]


def managed_dri_paths(inventory: Inventory) -> frozenset[str]:
    """The ``/dev/dri`` nodes of the inventory's GPUs and ``/dev/kfd``: the DRM entries proxgpu
    owns in a container's config (another card's, an iGPU's renderD128, stay the admin's)."""
    return frozenset({KFD} | {f"/dev/dri/{n}" for gpu in inventory.gpus for n in gpu.drm_nodes})
