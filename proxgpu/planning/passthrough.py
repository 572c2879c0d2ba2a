"""What passing GPUs through to VMs needs beyond the binding: one side of an NVLink fabric, room
in the guest's address space for large BARs, and care with GPUs that do not reset reliably.

>>> guest_phys_bits(GuestConfig.parse("cpu: host\\n")) is None
True
>>> guest_phys_bits(GuestConfig.parse("cpu: x86-64-v2-AES\\n"))
40
>>> guest_phys_bits(GuestConfig.parse("cpu: kvm64,phys-bits=46\\n"))
46
"""

from __future__ import annotations

from proxgpu.inspection.inventory import Gpu
from proxgpu.paths import guest_config
from proxgpu.planning import wording
from proxgpu.planning.context import Context
from proxgpu.planning.model import PlanGroup, Role
from proxgpu.pve.config import GuestConfig, format_property_string, parse_property_string
from proxgpu.pve.resources import memory_mib

#: The physical address bits QEMU reports for a named CPU model when ``phys-bits`` is not set.
QEMU_DEFAULT_PHYS_BITS = 40
#: CPU types for which QEMU takes the host's physical address bits (``host-phys-bits``).
_HOST_BITS_TYPES = {"host", "max"}
#: A BAR at least this large is a VRAM aperture (resizable BAR) that SeaBIOS cannot place.
LARGE_BAR = 16 << 30
#: Below 4 GiB the guest keeps a hole for 32-bit devices; its RAM above it starts at 4 GiB.
_LOW = 4 << 30
#: NVIDIA's Blackwell GB20x chips (RTX PRO 6000 Blackwell, RTX 50 series): device IDs
#: 0x2b80-0x2fff (GB202 2b8x/2bbx, GB203 2c0x, GB205 2f0x, GB206/GB207 2d0x-2d9x).
_BLACKWELL_IDS = range(0x2B80, 0x3000)


def check_fabric(ctx: Context, roles: dict[str, Role]) -> None:
    """NVSwitches join a board's GPUs into one NVLink fabric that NVIDIA's Fabric Manager
    programs as a whole: it cannot manage GPUs that the host keeps while others sit in guests."""
    switches = ctx.inventory.nvswitches
    fabric = [gpu for gpu in ctx.index.gpus if gpu.vendor_id == "10de"]
    sides = {roles[gpu.address] for gpu in fabric}
    if not switches or sides == {"host"}:
        return
    named = f"{len(switches)} NVSwitch{'es' if len(switches) > 1 else ''} " + (
        f"({wording.join(f.address for f in switches)})"
    )
    if sides == {"vfio"}:
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


def advise_passthrough(ctx: Context, groups: list[PlanGroup]) -> None:
    """Warnings for the GPUs that go to vfio-pci: resets, firmware, address bits."""
    for group in groups:
        if group.role != "vfio":
            continue
        gpus = [ctx.index.get(address) for address in group.gpus]
        _advise_reset(ctx, gpus)
        if group.guest is not None and group.guest.type == "vm":
            _advise_large_bars(ctx, group.guest.vmid, gpus)


def is_blackwell(gpu: Gpu) -> bool:
    """An NVIDIA Blackwell GB20x GPU, by its device ID or its pci.ids name."""
    if gpu.vendor_id != "10de":
        return False
    return int(gpu.device_id, 16) in _BLACKWELL_IDS or "GB20" in (gpu.model or "")


def _advise_reset(ctx: Context, gpus: list[Gpu]) -> None:
    blackwell = [gpu for gpu in gpus if is_blackwell(gpu)]
    if blackwell:
        ctx.warnings.append(
            f"{wording.join(wording.addresses(blackwell))}: Blackwell GPUs (RTX PRO 6000, RTX 50 "
            "series) are known to fail their reset under vfio-pci (the guest's next start finds "
            "the GPU stuck until the host reboots): keep them out of D3 with `options vfio-pci "
            "disable_idle_d3=1` in /etc/modprobe.d, and shut the VM down rather than reboot it"
        )


def guest_phys_bits(config: GuestConfig) -> int | None:
    """The physical address bits the VM's CPU reports; ``None`` when they are the host's."""
    try:
        cpu = parse_property_string(config.get("cpu") or "", "cputype")
    except ValueError:
        return QEMU_DEFAULT_PHYS_BITS
    bits = cpu.get("phys-bits")
    if bits == "host" or (bits is None and cpu.get("cputype") in _HOST_BITS_TYPES):
        return None
    return int(bits) if bits is not None and bits.isdigit() else QEMU_DEFAULT_PHYS_BITS


def _advise_large_bars(ctx: Context, vmid: int, gpus: list[Gpu]) -> None:
    bars = [size for gpu in gpus for size in gpu.bar_bytes]
    if not bars or max(bars) < LARGE_BAR:
        return
    text = ctx.inventory.guest_configs.get(guest_config("vm", vmid))
    if text is None:
        return
    config = GuestConfig.parse(text)
    largest = f"{max(bars) >> 30} GiB BAR{'s' if len(gpus) > 1 else ''}"
    if config.get("bios") != "ovmf":
        ctx.warnings.append(
            f"VM {vmid}: its GPUs have {largest}, which SeaBIOS cannot map: switch it to UEFI "
            f"before starting it (`qm set {vmid} --bios ovmf --efidisk0 STORAGE:1,efitype=4m`, "
            "with machine q35)"
        )
    bits = guest_phys_bits(config)
    # The 64-bit PCI window sits above the guest's RAM; each BAR is aligned to its size.
    needed = (_LOW + (memory_mib(config) or 0) * 2**20 + 2 * sum(bars) - 1).bit_length()
    if bits is not None and bits < needed:
        ctx.warnings.append(
            f"VM {vmid}: its CPU reports {bits} physical address bits, too few for "
            f"{sum(bars) >> 30} GiB of 64-bit BARs next to its memory (at least {needed} needed):"
            f" `qm set {vmid} --cpu {_with_host_bits(config.get('cpu'))}` (or phys-bits={needed})"
        )


def _with_host_bits(cpu: str | None) -> str:
    """The ``cpu:`` value with ``phys-bits=host``, its other options kept (a VM without one runs
    Proxmox VE 8's default type). qemu-server warns that OVMF may hold kvm64 and qemu64 to 40
    bits unless they have the ``pdpe1gb`` flag, so those get it too."""
    try:
        props = parse_property_string(cpu or "x86-64-v2-AES", "cputype")
    except ValueError:
        props = {"cputype": "x86-64-v2-AES"}
    props["phys-bits"] = "host"
    flags = [flag for flag in props.get("flags", "").split(";") if flag]
    if props.get("cputype") in ("kvm64", "qemu64") and "+pdpe1gb" not in flags:
        props["flags"] = ";".join([*(f for f in flags if f != "-pdpe1gb"), "+pdpe1gb"])
    return format_property_string(props, "cputype")
