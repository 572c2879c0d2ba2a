"""A VM's config: ``hostpciN`` entries (or a cluster PCI mapping), vNUMA and CPU affinity."""

from __future__ import annotations

import re

from proxgpu.errors import RenderError
from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.paths import PCI_MAPPING
from proxgpu.pci import normalize_pci_address
from proxgpu.planning.model import PlanGroup, VgpuUse
from proxgpu.pve.claims import hostpci_mdev
from proxgpu.pve.config import (
    GuestConfig,
    format_property_string,
    hostpci_devices,
)
from proxgpu.pve.mapping import PciMappingConfig, with_node_maps
from proxgpu.pve.resources import hotplugs_memory, memory_mib
from proxgpu.pve.versions import VM_AFFINITY, version_at_least
from proxgpu.rendering.context import RenderContext, guest_config_of


def _gpu_slots(inventory: Inventory) -> dict[str, Gpu]:
    return {gpu.slot: gpu for gpu in inventory.gpus}


def _hostpci_slots(value: str) -> list[str]:
    slots = []
    for address in hostpci_devices(value)[0]:
        try:
            slots.append(normalize_pci_address(address).split(".")[0])
        except ValueError:
            continue  # not a PCI address: not one of our GPUs
    return slots


def render_vm(ctx: RenderContext, group: PlanGroup, path: str, vmid: int) -> None:
    config = guest_config_of(ctx, path, "VM")
    q35 = "q35" in (config.get("machine") or "")
    if not q35:
        ctx.warnings.append(
            f"VM {vmid} is not a q35 machine: its GPUs get no pcie=1; set machine: q35 for PCIe"
        )
    gpus = [ctx.inventory.gpu(a) for a in group.gpus]
    _sync_hostpci(ctx, config, gpus, q35)
    _pin(ctx, config, group, vmid)
    ctx.file(path, config.render(), f"VM {vmid}: its GPUs and NUMA pinning", mode=None)


def render_vgpu(ctx: RenderContext, group: PlanGroup, use: VgpuUse, path: str) -> None:
    """A vGPU the plan adds: ``hostpciN: ADDR,mdev=TYPE`` naming the GPU's own function (a slot
    would be a multifunction device, which qemu-server refuses with ``mdev``), or the SR-IOV
    virtual function the plan picked for it (qemu-server uses the VF an entry names), and the
    VM pinned to the GPU's NUMA node as a passthrough VM is."""
    config = guest_config_of(ctx, path, "VM")
    extra = ",pcie=1" if "q35" in (config.get("machine") or "") else ""
    (index,) = config.free_indices("hostpci", 1)
    where = use.function or group.gpus[0]
    config.set(f"hostpci{index}", f"{where},mdev={use.mdev_type}{extra}")
    _pin(ctx, config, group, use.vmid)
    ctx.file(path, config.render(), f"VM {use.vmid}: its vGPU and NUMA pinning", mode=None)


def _pin(ctx: RenderContext, config: GuestConfig, group: PlanGroup, vmid: int) -> None:
    """vNUMA on, vCPUs on the group's CPUs, memory on its node."""
    config.set("numa", "1")
    if version_at_least(ctx.inventory.pve_version, VM_AFFINITY):
        config.set("affinity", group.cpus)
    else:
        ctx.warnings.append(
            f"VM {vmid}: Proxmox VE {ctx.inventory.pve_version or '(version unknown)'} has no "
            f"affinity option (7.3 and later): its vCPUs are not pinned to CPUs {group.cpus}"
        )
    _vnuma(ctx, config, group, vmid)


def _sync_hostpci(ctx: RenderContext, config: GuestConfig, gpus: list[Gpu], q35: bool) -> None:
    mapping = ctx.options.mapping
    gpu_slots = _gpu_slots(ctx.inventory)
    wanted_slots = [g.slot for g in gpus]
    kept_slots: set[str] = set()
    kept_mapped = 0
    for key, value in config.entries():
        # A vGPU entry uses its GPU on the host driver: it stays as the user wrote it.
        if not re.fullmatch(r"hostpci\d+", key) or hostpci_mdev(value):
            continue
        used = hostpci_devices(value)[1]
        if used is not None:
            if used == mapping and kept_mapped < len(gpus):
                kept_mapped += 1
            elif used == mapping:
                config.delete(key)
            continue
        slots = [s for s in _hostpci_slots(value) if s in gpu_slots]
        if slots and (mapping or not set(slots) <= set(wanted_slots)):
            config.delete(key)
        else:
            kept_slots.update(slots)
    extra = ",pcie=1" if q35 else ""
    if mapping:
        values = [f"mapping={mapping}{extra}"] * (len(gpus) - kept_mapped)
    else:
        values = [f"{slot}{extra}" for slot in wanted_slots if slot not in kept_slots]
    for index, value in zip(config.free_indices("hostpci", len(values)), values, strict=True):
        config.set(f"hostpci{index}", value)


def render_mapping(ctx: RenderContext, groups: list[PlanGroup]) -> None:
    """The cluster PCI mapping ``options.mapping``: one pool of every VM's GPUs on this node.

    One file change for all VMs, so that no VM's map lines are lost to another's.

    :raises RenderError: when a GPU has no IOMMU group (the IOMMU off): Proxmox needs it there.
    """
    name = ctx.options.mapping
    if name is None:
        return
    gpus = [
        ctx.inventory.gpu(a) for g in groups if g.role.moves_to_vfio and g.guest for a in g.gpus
    ]
    if not gpus:
        return
    lacking = [gpu.address for gpu in gpus if gpu.iommu_group is None]
    if lacking:
        raise RenderError(
            ctx.inventory.source,
            PCI_MAPPING,
            f"mapping {name} needs the IOMMU group of {', '.join(lacking)}, which is unknown",
            "turn the IOMMU on and reboot first",
        )
    _sync_mapping(ctx, name, gpus)


def _sync_mapping(ctx: RenderContext, name: str, gpus: list[Gpu]) -> None:
    before = ctx.inventory.guest_configs.get(PCI_MAPPING, "")
    mapping = PciMappingConfig.parse(before)
    unreadable = mapping.unreadable()
    if unreadable:
        # Proxmox drops these lines when it reads the file; an edit would pass the damage on.
        number, text = unreadable[0]
        raise RenderError(
            ctx.inventory.source,
            PCI_MAPPING,
            f"line {number} ({text!r}) is no mapping Proxmox can read",
            "fix or remove it, then plan again",
        )
    node = ctx.inventory.node_name
    entries = map_entries(gpus, node)
    existing = mapping.entries(name) if name in mapping.ids() else []
    merged = with_node_maps(existing, entries, node)
    if merged != existing:
        mapping.set_entries(name, merged)
    ctx.file(PCI_MAPPING, mapping.render(), f"PCI mapping {name}", mode=None)


def map_entries(gpus: list[Gpu], node: str) -> list[tuple[str, str]]:
    """The ``map`` lines of a PCI mapping for ``gpus`` on Proxmox node ``node``: each GPU's
    slot, IDs, IOMMU group and subsystem IDs, as Proxmox checks them before a VM starts.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> gpu = inspect(DirectoryHost("examples/hosts/ct200")).gpus[0]
    >>> map_entries([gpu], "pve1")
    [('map', 'id=10de:2bb1,iommugroup=12,node=pve1,path=0000:01:00,subsystem-id=10de:204b')]
    """
    entries = []
    for gpu in gpus:
        props = {
            "id": f"{gpu.vendor_id}:{gpu.device_id}",
            "iommugroup": str(gpu.iommu_group),
            "node": node,
            "path": gpu.slot,
        }
        if gpu.subsystem_vendor_id and gpu.subsystem_device_id:
            props["subsystem-id"] = f"{gpu.subsystem_vendor_id}:{gpu.subsystem_device_id}"
        entries.append(("map", format_property_string(props)))
    return entries


def _vnuma(ctx: RenderContext, config: GuestConfig, group: PlanGroup, vmid: int) -> None:
    if group.numa_node is None:
        return
    vcpus = int(config.get("sockets") or 1) * int(config.get("cores") or 1)
    memory = memory_mib(config) or config.get("memory")
    wanted = f"cpus=0-{vcpus - 1},hostnodes={group.numa_node},memory={memory},policy=bind"
    existing = [(k, v) for k, v in config.entries() if re.fullmatch(r"numa\d+", k)]
    if hotplugs_memory(config):
        # qemu-server refuses to start such a VM with any numaN ("cannot enable memory
        # hotplugging with custom NUMA topology"); the admin chose hotplug, so pin by affinity.
        if existing == [("numa0", wanted)]:
            config.delete("numa0")  # ours, from before memory hotplug was turned on
        ctx.warnings.append(
            f"VM {vmid} hotplugs memory, which Proxmox allows only without numaN entries: it is "
            f"pinned to NUMA node {group.numa_node}'s CPUs by affinity alone, its memory is not "
            "bound there (take memory out of its hotplug: option to bind it)"
        )
    elif not existing:
        config.set("numa0", wanted)
    elif existing != [("numa0", wanted)]:
        # The guest's own vNUMA layout is the admin's; only point out where it may disagree.
        ctx.warnings.append(f"VM {vmid} has its own numaN entries: check their hostnodes")
