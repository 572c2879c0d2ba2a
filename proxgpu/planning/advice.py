"""Warnings and advice: uneven or non-local groups, NUMA-local tensor-parallel sets, check-gpus."""

from __future__ import annotations

from collections import defaultdict

from proxgpu.errors import UsageError
from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.pci import NVIDIA_DRIVER, normalize_pci_address
from proxgpu.planning import wording
from proxgpu.planning.context import Context, GpuIndex
from proxgpu.planning.model import TP_SIZES, PlanGroup, Role, TensorParallelAdvice
from proxgpu.planning.placement import GpuPlacement, GpuSetCheck
from proxgpu.planning.runtimes import (
    CUDA,
    RUNTIMES,
    known_mig_uuids,
    none_seen,
    not_whole,
    numbered,
    numbering_note,
    pci_order,
    unseen_reason,
)
from proxgpu.planning.userspace import UserSpace


def check_gpu_set(inventory: Inventory, selectors: list[str]) -> GpuSetCheck:
    """Check that the selected GPUs share one NUMA node.

    A selector is CUDA's index of a GPU (what ``nvidia-smi`` shows, and CUDA numbers with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: the GPUs on nvidia in PCI bus order, in a container those
    it has the ``/dev/nvidiaN`` of; see :mod:`~proxgpu.planning.runtimes`) or an address in any
    form :func:`normalize_pci_address` takes. The BMC's display at 02:00.0 gets no index:

    >>> from proxgpu.inspection import Gpu, Inventory, PciFunction
    >>> gpus = [Gpu(address=a, vendor_id=v, device_id="2330", class_code="0x030200",
    ...             numa_node=n, driver=d, functions=[a], function_info=[])
    ...         for a, v, d, n in [("0000:01:00.0", "10de", "nvidia", 0),
    ...                            ("0000:02:00.0", "1a03", "ast", 0),
    ...                            ("0000:11:00.0", "10de", "nvidia", 0),
    ...                            ("0000:81:00.0", "10de", "nvidia", 1)]]
    >>> check = check_gpu_set(Inventory(source="pve1", hostname="pve1", gpus=gpus), ["1", "2"])
    >>> check.numa_local
    False
    >>> print(check.explanation)
    GPUs 1,2 straddle NUMA nodes 0 and 1: node 0 holds 1 (0000:11:00.0); node 1 holds 2 \
(0000:81:00.0). NUMA-local sets of 2: 0,1. (CUDA's indexes, with CUDA_DEVICE_ORDER=PCI_BUS_ID; \
CUDA's default, FASTEST_FIRST, may differ)

    :raises UsageError: when a selector names no GPU or one CUDA does not see (saying why),
        none is given, or CUDA sees no GPU on the host.
    """
    if not inventory.gpus:
        raise UsageError(f"{inventory.source} has no GPUs to check")
    if not selectors:
        raise UsageError("name at least one GPU, by CUDA index (0, 1, ...) or by address")
    cuda = numbered(inventory, CUDA)
    if not cuda:
        raise UsageError(none_seen(inventory, CUDA))
    index = GpuIndex(cuda)
    chosen: dict[str, Gpu] = {}
    for selector in selectors:
        for gpu in _select_for_check(inventory, index, selector):
            chosen[gpu.address] = gpu
    # On a host of one NUMA node every GPU is on it, whatever the firmware says (as for run).
    only = inventory.numa_nodes[0].id if len(inventory.numa_nodes) == 1 else None
    placements = [
        GpuPlacement(
            index=index.position[gpu.address],
            address=gpu.address,
            model=gpu.model,
            numa_node=gpu.numa_node if only is None else only,
            not_whole=not_whole(gpu),
            mig_devices=known_mig_uuids(gpu),
        )
        for gpu in sorted(chosen.values(), key=pci_order)
    ]
    nodes = {placement.numa_node for placement in placements}
    local = len(nodes) == 1 and None not in nodes
    explanation = f"{_explain_set(index, placements, local)} ({numbering_note(inventory, CUDA)})"
    explanation += "".join(
        f" GPU {p.index}: {p.not_whole}." for p in placements if p.not_whole is not None
    )
    return GpuSetCheck(
        gpus=placements,
        numa_local=local,
        numa_node=placements[0].numa_node if local else None,
        explanation=explanation,
    )


def warn_about_shape(ctx: Context, groups: list[PlanGroup]) -> None:
    host = sum(len(group.gpus) for group in groups if not group.role.moves_to_vfio)
    vfio = sum(len(group.gpus) for group in groups if group.role.moves_to_vfio)
    if not vfio:
        ctx.warnings.append(
            f"nothing goes to vfio-pci: {wording.count(host, 'GPU')} on the host driver"
        )
    elif not host:
        ctx.notes.append(
            f"nothing stays on the host driver: {wording.count(vfio, 'GPU')} on vfio-pci"
        )
    elif host != vfio:
        ctx.notes.append(
            f"uneven split: {wording.count(host, 'GPU')} on the host driver, "
            f"{wording.count(vfio, 'GPU')} "
            "on vfio-pci"
        )
    gpu_nodes = {gpu.numa_node for gpu in ctx.index.gpus}
    for node in ctx.inventory.numa_nodes:
        # A GPU of unknown node may sit on any node, so then no node is known to be empty.
        if None not in gpu_nodes and node.id not in gpu_nodes:
            ctx.warnings.append(
                f"NUMA node {node.id} (CPUs {node.cpus}) holds no GPUs; no group uses it"
            )
    for group in groups:
        _warn_about_locality(ctx, group)
        boot_vga = [a for a in group.gpus if group.role.moves_to_vfio and ctx.index.get(a).boot_vga]
        for address in boot_vga:
            ctx.warnings.append(
                f"{address} is the boot VGA device: on vfio-pci the host loses its console "
                "there, so keep another way in (serial console, IPMI, SSH)"
            )


def _warn_about_locality(ctx: Context, group: PlanGroup) -> None:
    nodes = {ctx.index.get(address).numa_node for address in group.gpus}
    known = sorted(node for node in nodes if node is not None)
    if len(known) > 1:
        ctx.warnings.append(
            f"{wording.group_name(group)} spans NUMA nodes "
            f"{wording.join(known)}: its pinning covers them all, "
            "and work spread over them crosses the socket interconnect"
        )
    if None in nodes and len(ctx.inventory.numa_nodes) > 1:
        ctx.warnings.append(
            f"{wording.group_name(group)} holds GPUs of unknown NUMA node: "
            "its pinning covers every node"
        )


def tensor_parallel(ctx: Context, groups: list[PlanGroup]) -> list[TensorParallelAdvice]:
    """NUMA-local device sets of each host group, in plan order (see :func:`group_sets`)."""
    return [
        advice for group in groups if group.role is Role.HOST for advice in group_sets(ctx, group)
    ]


def group_sets(ctx: Context, group: PlanGroup) -> list[TensorParallelAdvice]:
    """NUMA-local device sets of one host group, numbered as its runtime will number them after
    the split in its containers (each gets exactly the group's device nodes): the group's GPUs
    on the runtime's driver (those nvidia will drive, for CUDA), in PCI order. The runtime is the
    one most of the group's GPUs belong to."""
    gpus = [ctx.index.get(address) for address in group.gpus]
    counted = {
        runtime: sorted((gpu for gpu in gpus if runtime.counts(gpu.host_driver)), key=pci_order)
        for runtime in RUNTIMES
    }
    # max keeps the first of equals: CUDA before ROCm before Level Zero.
    runtime = max(RUNTIMES, key=lambda r: len(counted[r]))
    numbered_gpus = counted[runtime]
    advice = []
    for size in TP_SIZES:
        chunks = _local_sets(numbered_gpus, size)
        if chunks:
            advice.append(
                TensorParallelAdvice(
                    size=size,
                    device_sets=[",".join(map(str, chunk)) for chunk in chunks],
                    variable=runtime.variable,
                    ordering=runtime.ordering_environment,
                    gpu_sets=[[numbered_gpus[i].address for i in chunk] for chunk in chunks],
                    guests=group.guests,
                )
            )
    return advice


def _local_sets(gpus: list[Gpu], size: int) -> list[list[int]]:
    """Disjoint NUMA-local sets of ``size`` positions in ``gpus``, in PCI order per node. A GPU
    that is no whole GPU for a job (:func:`~proxgpu.planning.runtimes.not_whole`) keeps its
    position but joins no set."""
    by_node: dict[int, list[int]] = defaultdict(list)
    for position, gpu in enumerate(gpus):
        # An unknown node promises no locality, so those GPUs join no set.
        if gpu.numa_node is not None and not_whole(gpu) is None:
            by_node[gpu.numa_node].append(position)
    return [
        positions[start : start + size]
        for _, positions in sorted(by_node.items())
        for start in range(0, len(positions) - size + 1, size)
    ]


def _select_for_check(inventory: Inventory, index: GpuIndex, selector: str) -> list[Gpu]:
    text = selector.strip()
    if text.isdigit():
        if int(text) >= len(index.gpus):
            raise UsageError(
                f"GPU {text}: CUDA has no such index on {inventory.source}: it numbers "
                f"{_index_range(len(index.gpus))} ({wording.count(len(index.gpus), 'GPU')} on "
                f"nvidia; {numbering_note(inventory, CUDA)})"
            )
        return [index.gpus[int(text)]]
    try:
        address = normalize_pci_address(text)
    except ValueError:
        raise UsageError(
            f"GPU {text!r}: neither a CUDA index nor a PCI address on {inventory.source} (CUDA "
            f"numbers {_index_range(len(index.gpus))} there)"
        ) from None
    found = index.at(address)
    if found:
        return found
    unseen = GpuIndex(inventory.gpus).at(address)
    if unseen:
        reasons = [unseen_reason(inventory, CUDA, gpu) for gpu in unseen]
        raise UsageError(
            f"{text}: CUDA does not see it on {inventory.source}: "
            f"{'; '.join(r for r in reasons if r)}"
        )
    raise UsageError(f"{text}: no GPU at that address on {inventory.source}")


def _index_range(count: int) -> str:
    return "only 0" if count == 1 else f"0-{count - 1}"


def _explain_set(index: GpuIndex, placements: list[GpuPlacement], local: bool) -> str:
    ids = ",".join(str(placement.index) for placement in placements)
    if local and len(placements) == 1:
        return f"GPU {ids} is on NUMA node {placements[0].numa_node}."
    if local:
        return f"GPUs {ids} are all on NUMA node {placements[0].numa_node}: the set is NUMA-local."
    unknown = [placement for placement in placements if placement.numa_node is None]
    if unknown:
        return (
            f"cannot tell whether GPUs {ids} are NUMA-local: the NUMA node of "
            f"{wording.join(f'{p.index} ({p.address})' for p in unknown)} is unknown "
            "(sysfs numa_node -1 or missing)."
        )
    by_node: dict[int, list[str]] = defaultdict(list)
    for placement in placements:
        if placement.numa_node is not None:
            by_node[placement.numa_node].append(f"{placement.index} ({placement.address})")
    holds = "; ".join(
        f"node {node} holds {', '.join(gpus)}" for node, gpus in sorted(by_node.items())
    )
    sets = [",".join(map(str, chunk)) for chunk in _local_sets(index.gpus, len(placements))]
    alternatives = (
        f"NUMA-local sets of {len(placements)}: {'; '.join(sets)}."
        if sets
        else f"no NUMA node holds {len(placements)} GPUs."
    )
    return (
        f"GPUs {ids} straddle NUMA nodes {wording.join(sorted(by_node))}: {holds}. {alternatives}"
    )


def userspace_needs(inventory: Inventory, groups: list[PlanGroup]) -> list[UserSpace]:
    """Each container the groups give a GPU kept on NVIDIA's module (whole, or a MIG
    instance of it), once, in the groups' order."""
    version = inventory.nvidia_driver_version
    installer = None if version is None else f"NVIDIA-Linux-{_machine(inventory)}-{version}.run"
    containers: dict[int, None] = {}
    # By address, not inventory.gpu(): verify asks this of a host whose GPU may be gone since.
    drivers = {gpu.address: gpu.host_driver for gpu in inventory.gpus}
    for group in groups:
        if group.role.moves_to_vfio or group.role.serves != "lxc":
            continue
        if any(drivers.get(address) == NVIDIA_DRIVER for address in group.gpus):
            containers.update((guest.vmid, None) for guest in group.guests)
    return [UserSpace(vmid=vmid, version=version, installer=installer) for vmid in containers]


def _machine(inventory: Inventory) -> str:
    """The machine name in NVIDIA's installer names: x86_64 for Intel's and AMD's CPUs (the
    machines Proxmox VE is built for), else left for the admin to fill in."""
    return "x86_64" if inventory.cpu_vendor in ("GenuineIntel", "AuthenticAMD") else "ARCH"
