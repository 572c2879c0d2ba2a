"""Room for a VM's GPU BARs: SeaBIOS cannot place large ones, OVMF places them in a 64-bit
window whose size its CPU decides (:mod:`proxgpu.planning.ovmf`); when they do not fit, the
``cpu:`` value to set, one qemu-server starts without its "OVMF firmware might limit CPU
'phys-bits' to 40" warning (``check_phys_bits_above_40_compat`` in PVE/QemuServer/CPUConfig.pm:
a ``qemu64`` or ``kvm64`` based CPU with more than 40 bits on OVMF needs ``+pdpe1gb``).

>>> size_text(3 * TIB), size_text(384 * GIB + (32 << 20))
('3 TiB', '385 GiB')
"""

from __future__ import annotations

import itertools
import re

from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.paths import guest_config
from proxgpu.pci import normalize_pci_address
from proxgpu.planning.context import Context
from proxgpu.planning.guestcpu import (
    HOST_MODELS,
    GuestCpu,
    HostCpu,
    cpu_options,
    flag_set,
    guest_cpu,
)
from proxgpu.planning.ovmf import GIB, MAX_WIDTH, TIB, Fit, advisable_bits, fit
from proxgpu.pve.config import GuestConfig, format_property_string, hostpci_devices

#: A BAR at least this large is a VRAM aperture (resizable BAR) that SeaBIOS cannot place.
LARGE_BAR = 16 << 30
#: qemu-server's ``$MAX_HOSTPCI_DEVICES``.
_MAX_HOSTPCI = 16


def check_hostpci_room(ctx: Context, vmid: int, gpus: list[Gpu]) -> None:
    """Refuse the plan unless VM ``vmid`` has a ``hostpciN`` entry for each of ``gpus`` beside
    the entries it keeps (Proxmox takes ``hostpci0`` to ``hostpci15``)."""
    text = ctx.inventory.guest_configs.get(guest_config("vm", vmid), "")
    ports = planned_ports(GuestConfig.parse(text), gpus, ctx.inventory)
    if max(ports, default=-1) < _MAX_HOSTPCI:
        return
    kept = len(ports) - len(gpus)
    room = max(_MAX_HOSTPCI - kept, 0)
    ctx.problem(
        "no-fit",
        f"VM {vmid} would need {len(ports)} hostpci entries ({len(gpus)} GPUs and the {kept} "
        f"it has for other devices), but Proxmox takes hostpci0 to hostpci{_MAX_HOSTPCI - 1}",
        f"give VM {vmid} at most {room} GPUs (--vm {vmid}:{room}), or remove hostpci entries it "
        "no longer needs",
    )


def advise_bars(ctx: Context, vmid: int, gpus: list[Gpu]) -> None:
    """Warnings, with the fix, when VM ``vmid``'s firmware cannot place its GPUs' BARs."""
    text = ctx.inventory.guest_configs.get(guest_config("vm", vmid))
    if text is None:
        return
    config = GuestConfig.parse(text)
    bars = [size for gpu in gpus for size in gpu.bar_bytes]
    if config.get("bios") != "ovmf" and bars and max(bars) >= LARGE_BAR:
        ctx.warnings.append(
            f"VM {vmid}: its GPUs have {max(bars) >> 30} GiB BARs, which SeaBIOS cannot map: "
            f"switch it to UEFI before starting it (`qm set {vmid} --bios ovmf --efidisk0 "
            "STORAGE:1,efitype=4m`, with machine q35)"
        )
    # The root port model is q35's; the renderer already warns about a VM that is not q35.
    if "q35" not in (config.get("machine") or ""):
        return
    host = HostCpu.of(ctx.inventory)
    cpu = guest_cpu(config, host)
    if cpu is None:
        return
    ports = planned_ports(config, gpus, ctx.inventory)
    now = fit(config, cpu, host, ports)
    if not now.fits:
        ctx.warnings.append(_warning(vmid, config, cpu=cpu, host=host, ports=ports, now=now))


def planned_ports(
    config: GuestConfig, gpus: list[Gpu], inventory: Inventory
) -> dict[int, list[int]]:
    """``hostpciN`` index -> the 64-bit prefetchable BARs behind root port N+1 once the plan
    gives the VM ``gpus``, as the renderer writes them: entries of other devices stay where
    they are (their BARs unknown: ``[]``), the VM's GPUs keep their entries or take the lowest
    free indices."""
    gpu_slots = {gpu.slot for gpu in inventory.gpus}
    wanted = {gpu.slot: gpu for gpu in gpus}
    ports: dict[int, list[int]] = {}
    placed: set[str] = set()
    for key, value in config.entries():
        if not re.fullmatch(r"hostpci\d+", key):
            continue
        slots = _slots(value) & gpu_slots
        if not slots:
            ports[int(key[7:])] = []
        elif slots <= set(wanted):
            ports[int(key[7:])] = [size for slot in sorted(slots) for size in _bars(wanted[slot])]
            placed |= slots
    # Past qemu-server's last index too: check_hostpci_room refuses such a plan by its count.
    free = (index for index in itertools.count() if index not in ports)
    for slot, gpu in wanted.items():
        if slot not in placed:
            ports[next(free)] = _bars(gpu)
    return ports


def _slots(value: str) -> set[str]:
    try:
        addresses = hostpci_devices(value)[0]
    except ValueError:
        return set()
    slots = set()
    for address in addresses:
        try:
            slots.add(normalize_pci_address(address).split(".")[0])
        except ValueError:
            continue
    return slots


def _bars(gpu: Gpu) -> list[int]:
    """The GPU's 64-bit prefetchable BARs; every memory BAR when an older inventory lacks that
    split (which only overstates the need)."""
    return gpu.bar64_bytes or gpu.bar_bytes


def advised_cpu(
    config: GuestConfig, host: HostCpu, ports: dict[int, list[int]]
) -> tuple[str, Fit] | None:
    """The smallest number of address bits whose window holds the GPUs, as a ``cpu:`` value
    keeping the VM's model and options, never fewer bits than the VM has; ``None`` when no value
    does on this host (OVMF uses at most 46 bits, and no more than the host has)."""
    props = cpu_options(config)
    now = guest_cpu(config, host)
    if props is None or now is None:
        return None
    for bits in advisable_bits(now, host):
        value = with_bits(props, bits, host)
        if value is None:
            return None
        candidate = GuestConfig.parse(config.render())
        candidate.set("cpu", value)
        cpu = guest_cpu(candidate, host)
        result = fit(candidate, cpu, host, ports) if cpu else None
        if result is not None and result.fits:
            return value, result
    return None


def with_bits(props: dict[str, str], bits: int, host: HostCpu) -> str | None:
    """``props`` with ``phys-bits=bits`` and the 1 GiB pages OVMF needs above 40 bits: a
    ``+pdpe1gb`` flag for the models that lack it (kvm64, qemu64 and qemu-server's x86-64
    levels: qemu-server warns without it), none of ``-pdpe1gb`` for host and max, which pass
    the host's flags; ``None`` when the host has no 1 GiB pages to give (KVM passes a guest no
    CPU flag the host lacks, whatever the model asks for)."""
    if host.pdpe1gb is False:
        return None
    props = dict(props)
    flags = flag_set(props)
    if props["cputype"] in HOST_MODELS:
        flags.pop("pdpe1gb", None)
    else:
        flags["pdpe1gb"] = "+"
    props["flags"] = ";".join(f"{sign}{name}" for name, sign in flags.items())
    if not props["flags"]:
        del props["flags"]
    props["phys-bits"] = str(bits)
    if props.get("guest-phys-bits", "").isdigit() and int(props["guest-phys-bits"]) < bits:
        props["guest-phys-bits"] = str(bits)
    return format_property_string(props, "cputype")


def _warning(
    vmid: int,
    config: GuestConfig,
    *,
    cpu: GuestCpu,
    host: HostCpu,
    ports: dict[int, list[int]],
    now: Fit,
) -> str:
    what = (
        f"VM {vmid}: its GPUs need {size_text(now.needed)} of 64-bit PCI space as OVMF lays "
        "them out (root ports aligned to their largest BAR, hotplug reservations included), "
        f"but OVMF gives it {size_text(now.window)} "
        f"({_why(cpu, now, config.get('cpu') is None)})"
    )
    advice = advised_cpu(config, host, ports)
    if advice is None and host.pdpe1gb is False:
        return (
            f"{what}, and no CPU setting gives it more on this host: its CPU has no 1 GiB pages "
            f"(pdpe1gb), without which OVMF uses at most 40 address bits; give the VM fewer GPUs "
            f"(--vm {vmid}:N) or move it to a host whose CPU has them"
        )
    if advice is None:
        top = f"the host has {host.phys_bits}" if host.phys_bits else "the host's are unknown"
        return (
            f"{what}, and no CPU setting gives it enough on this host (OVMF uses at most "
            f"{MAX_WIDTH} address bits, {top}): give the VM fewer GPUs (--vm {vmid}:N)"
        )
    value, better = advice
    return (
        f"{what}: `qm set {vmid} --cpu {value}` gives it {size_text(better.window)} "
        f"({better.width} address bits)"
    )


def _why(cpu: GuestCpu, now: Fit, default: bool) -> str:
    model = cpu.cputype if cpu.cputype == cpu.reported else f"{cpu.cputype}, QEMU's {cpu.reported}"
    if default:
        model += ", qemu-server's default without cpu:"
    if now.width is None:
        vendor = {"GenuineIntel": "an Intel", "AuthenticAMD": "an AMD"}.get(cpu.vendor or "", "a")
        return (
            f"its CPU ({model}) reports {cpu.phys_bits} physical address bits, which OVMF does "
            f"not trust on {vendor} CPU, so it keeps its 32 GiB default"
        )
    if now.width < min(cpu.phys_bits, MAX_WIDTH):
        return (
            f"its CPU ({model}) reports {cpu.phys_bits} address bits, of which OVMF uses "
            f"{now.width} without 1 GiB pages (pdpe1gb)"
        )
    return f"its CPU ({model}) gives OVMF {now.width} address bits"


def size_text(size: int) -> str:
    """``3 TiB`` for whole TiB, else GiB rounded up."""
    return f"{size // TIB} TiB" if size >= TIB and size % TIB == 0 else f"{-(-size // GIB)} GiB"
