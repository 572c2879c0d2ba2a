"""What passing GPUs through to VMs needs beyond the binding: one side of an NVLink fabric, room
in the guest's address space for large BARs (:mod:`proxgpu.planning.bars`), the host's side of
the move (:mod:`proxgpu.planning.vfiohost`), and care with GPUs reported not to reset.
"""

from __future__ import annotations

from proxgpu.inspection.inventory import Gpu
from proxgpu.pci import NVIDIA
from proxgpu.planning import vfiohost, wording
from proxgpu.planning.bars import advise_bars, check_hostpci_room
from proxgpu.planning.context import Context
from proxgpu.planning.model import PlanGroup, Role

#: NVIDIA's Blackwell GB20x chips (RTX PRO 6000 Blackwell, RTX 50 series): device IDs
#: 0x2b80-0x2fff (GB202 2b8x/2bbx, GB203 2c0x, GB205 2f0x, GB206/GB207 2d0x-2d9x).
_BLACKWELL_IDS = range(0x2B80, 0x3000)


def check_fabric(ctx: Context, roles: dict[str, Role]) -> None:
    """NVSwitches join a board's GPUs into one NVLink fabric that NVIDIA's Fabric Manager
    programs as a whole: it cannot manage GPUs that the host keeps while others sit in guests."""
    switches = ctx.inventory.nvswitches
    fabric = [gpu for gpu in ctx.index.gpus if gpu.vendor_id == NVIDIA]
    sides = {roles[gpu.address].moves_to_vfio for gpu in fabric}
    if not switches or sides == {False}:
        return
    named = f"{len(switches)} NVSwitch{'es' if len(switches) > 1 else ''} " + (
        f"({wording.join(f.address for f in switches)})"
    )
    if sides == {True}:
        ctx.warnings.append(
            f"the host's {named} stay on the host: the VMs' GPUs get no NVLink between them "
            "(NVIDIA's full passthrough model gives one VM every GPU with the NVSwitches)"
        )
        return
    ctx.problem(
        "fabric-split",
        f"the host's {named} join its NVIDIA GPUs in one NVLink fabric, which the split would "
        f"divide: {wording.with_roles(fabric, roles)}",
        "keep every GPU of the fabric on one side; Fabric Manager cannot manage a fabric split "
        "between host and guests (that takes NVIDIA's shared NVSwitch virtualization model)",
    )


def check_hostpci(ctx: Context, groups: list[PlanGroup]) -> None:
    """Refuse a plan that gives a VM more ``hostpciN`` entries than Proxmox takes."""
    for group in groups:
        guest = group.guest
        if group.role.moves_to_vfio and guest is not None and guest.type == "vm":
            check_hostpci_room(ctx, guest.vmid, [ctx.index.get(a) for a in group.gpus])


def advise_passthrough(ctx: Context, groups: list[PlanGroup]) -> None:
    """Warnings for the GPUs that go to vfio-pci: resets, firmware, address bits, and what the
    move does to the host."""
    for group in groups:
        if not group.role.moves_to_vfio:
            continue
        gpus = [ctx.index.get(address) for address in group.gpus]
        _advise_reset(ctx, gpus)
        if group.guest is not None and group.guest.type == "vm":
            advise_bars(ctx, group.guest.vmid, gpus)
    vfiohost.advise_host(ctx, groups)


def is_blackwell(gpu: Gpu) -> bool:
    """An NVIDIA Blackwell GB20x GPU, by its device ID or its pci.ids name."""
    if gpu.vendor_id != NVIDIA:
        return False
    return int(gpu.device_id, 16) in _BLACKWELL_IDS or "GB20" in (gpu.model or "")


def _advise_reset(ctx: Context, gpus: list[Gpu]) -> None:
    # What is known, from NVIDIA/open-gpu-kernel-modules#853 (one report, since closed): an RTX
    # 5070 Ti on vfio-pci (host kernel 6.14.5, NVIDIA open driver 570.144) did not reset when its
    # libvirt VM shut down, and the host froze; a later try by the reporter reset fine. No host
    # setting is confirmed to avoid it, so none is advised.
    blackwell = [gpu for gpu in gpus if is_blackwell(gpu)]
    if blackwell:
        ctx.warnings.append(
            f"{wording.join(wording.addresses(blackwell))}: a Blackwell GPU (an RTX 5070 Ti, host "
            "kernel 6.14, the reporter's NVIDIA driver 570.144) has been reported once to fail "
            "its reset on vfio-pci when its VM stopped (the GPU hung and the host froze; a later "
            "try reset fine), and "
            "no host setting is known to prevent it: stop and start each VM once on this host "
            "before you rely on it, and keep a way to reboot the host remotely (IPMI)"
        )
