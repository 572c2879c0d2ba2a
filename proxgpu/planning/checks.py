"""The checks that refuse a plan: split slots, IOMMU groups, GPUs other guests hold, IOMMU off,
a PCI mapping that cannot be written."""

from __future__ import annotations

from collections import defaultdict

from proxgpu.inspection.inventory import Gpu, PciFunction
from proxgpu.pci import normalize_pci_address
from proxgpu.planning import wording
from proxgpu.planning.context import Context, GpuIndex
from proxgpu.planning.minors import boot_minors
from proxgpu.planning.model import PlanGroup, Role
from proxgpu.pve.claims import DeviceClaim, GuestRef
from proxgpu.pve.mapping import is_mapping_id


def check_slots(ctx: Context, roles: dict[str, Role]) -> None:
    """All functions of a slot move together, so its GPUs need one role."""
    by_slot: dict[str, list[Gpu]] = defaultdict(list)
    for gpu in ctx.index.gpus:
        by_slot[gpu.slot].append(gpu)
    for slot, gpus in by_slot.items():
        if len({roles[gpu.address] for gpu in gpus}) > 1:
            ctx.problem(
                "slot-split",
                f"slot {slot} holds GPUs of both roles: {wording.with_roles(gpus, roles)}",
                "all functions of a slot move together: give its GPUs the same role",
            )


def check_iommu_groups(ctx: Context, roles: dict[str, Role]) -> None:
    """An IOMMU group moves to vfio-pci whole: no host GPU and no foreign device may be in it."""
    owner = {function: gpu for gpu in ctx.index.gpus for function in gpu.functions}
    gpus_in, members = _iommu_membership(ctx, owner)
    foreign = _foreign_peers(ctx, owner)
    for group, gpus in sorted(gpus_in.items()):
        moves = {roles[gpu.address].moves_to_vfio for gpu in gpus}
        listing = "; ".join(
            f"{address} ({label})" for address, label in sorted(members[group].items())
        )
        addresses = wording.addresses(gpus)
        if len(moves) > 1:
            ctx.problem(
                "iommu-mixed",
                f"IOMMU group {group} holds GPUs of both roles: {wording.with_roles(gpus, roles)}; "
                f"members: {listing}",
                "a group goes to vfio-pci as a whole: give these GPUs the same role, move one card "
                "to a slot with its own IOMMU group, or turn on ACS in the firmware",
            )
        elif moves == {True} and group in foreign:
            ctx.problem(
                "iommu-peer",
                f"IOMMU group {group} of {wording.join(addresses)} also holds "
                f"{wording.join(foreign[group])}, "
                "which is no GPU function: vfio-pci would take it from the host; "
                f"members: {listing}",
                "move the GPU to another slot or turn on ACS so that it gets an IOMMU group of its "
                f"own, or keep it on the host driver (--host-gpus {','.join(addresses)})",
            )


def _iommu_membership(
    ctx: Context, owner: dict[str, Gpu]
) -> tuple[dict[int, list[Gpu]], dict[int, dict[str, str]]]:
    """IOMMU group -> the GPUs with a function in it, and -> every member with a label."""
    gpus_in: dict[int, dict[str, Gpu]] = defaultdict(dict)
    members: dict[int, dict[str, str]] = defaultdict(dict)
    for gpu in ctx.index.gpus:
        if gpu.iommu_group is not None:
            gpus_in[gpu.iommu_group][gpu.address] = gpu
            members[gpu.iommu_group][gpu.address] = gpu.model or "GPU"
        for function in [*gpu.function_info, *gpu.iommu_group_peers]:
            if function.iommu_group is None:
                continue
            members[function.iommu_group].setdefault(function.address, _label(function, owner))
            if function.address in owner:
                gpu_there = owner[function.address]
                gpus_in[function.iommu_group][gpu_there.address] = gpu_there
    by_address = {
        group: sorted(gpus.values(), key=wording.address) for group, gpus in gpus_in.items()
    }
    return by_address, members


def _foreign_peers(ctx: Context, owner: dict[str, Gpu]) -> dict[int, list[str]]:
    """IOMMU group -> its devices that are neither a GPU function nor a bridge."""
    foreign: dict[int, set[str]] = defaultdict(set)
    for gpu in ctx.index.gpus:
        for peer in gpu.iommu_group_peers:
            # Bridges stay with the host: vfio-pci never binds them (PVE skips them too).
            if peer.address not in owner and not peer.is_bridge and peer.iommu_group is not None:
                foreign[peer.iommu_group].add(peer.address)
    return {group: sorted(addresses) for group, addresses in foreign.items()}


def _label(function: PciFunction, owner: dict[str, Gpu]) -> str:
    if function.address in owner:
        return f"function of {owner[function.address].address}"
    kind = "bridge" if function.is_bridge else function.name or f"class {function.class_code}"
    return kind if function.driver is None else f"{kind}, driver {function.driver}"


def check_claims(ctx: Context, groups: list[PlanGroup]) -> None:
    """A GPU held by a guest other than the targets conflicts where the plan takes it away."""
    group_of = {address: group for group in groups for address in group.gpus}
    targets = ctx.targets()
    held: dict[tuple[GuestRef, str], list[DeviceClaim]] = defaultdict(list)
    vgpus: dict[GuestRef, dict[str, list[DeviceClaim]]] = defaultdict(lambda: defaultdict(list))
    unbound: dict[tuple[GuestRef, str], list[DeviceClaim]] = defaultdict(list)  # driver=keep
    for claim in ctx.claims:
        # A vGPU entry stays as it is, a target's too: it needs its GPU on the host driver (so
        # does an SR-IOV virtual function, which exists only while that driver keeps it).
        if claim.keeps_host_driver or ctx.index.virtual_function(claim.pci_address):
            for gpu in _claimed_gpus(ctx.index, claim):
                vgpus[claim.guest][gpu.address].append(claim)
            continue
        # The plan rewrites the targets' own device entries, so those never conflict.
        if claim.guest in targets:
            if claim.keep_driver:
                unbound[claim.guest, claim.pci_address or ""].append(claim)
            continue
        for gpu in _claimed_gpus(ctx.index, claim):
            held[claim.guest, gpu.address].append(claim)
    for guest, by_gpu in vgpus.items():
        _judge_vgpu_claims(ctx, groups, guest, by_gpu, guest in targets)
    for claims in unbound.values():
        for gpu in _claimed_gpus(ctx.index, claims[0]):
            _tell_kept_binding(ctx, group_of.get(gpu.address), gpu, claims)
    taken: dict[GuestRef, list[str]] = defaultdict(list)  # container -> GPUs going to vfio-pci
    renumbered: dict[GuestRef, list[str]] = defaultdict(list)  # -> kept GPUs it names stale
    minors = boot_minors(ctx.inventory, _kept(groups), ctx.policy.bind_method)
    for (guest, address), claims in held.items():
        group = group_of[address]
        if guest.type != "lxc":
            _judge_vm_claim(ctx, group, address, claims)
        elif group.role.moves_to_vfio:
            taken[guest].append(address)
        else:
            if _stale(claims, minors.get(address)):
                renumbered[guest].append(address)
            _tell_shared(ctx, group, address, claims)
    for guest, addresses in taken.items():
        lines = [c for a in addresses for c in held[guest, a]]
        _refuse_container_claim(ctx, guest.vmid, addresses, list(dict.fromkeys(lines)))
    for guest, addresses in renumbered.items():
        stale = {a: [c for c in held[guest, a] if _stale([c], minors[a])] for a in addresses}
        _refuse_renumbered(ctx, guest.vmid, stale, minors)


def _kept(groups: list[PlanGroup]) -> list[str]:
    """The GPUs the plan keeps on their host driver."""
    return [address for group in groups if not group.role.moves_to_vfio for address in group.gpus]


def _stale(claims: list[DeviceClaim], minor: int | None) -> bool:
    """Whether a claim names its GPU by a minor other than the one it has after the reboot."""
    return minor is not None and any(
        isinstance(c.nvidia_minor, int) and c.nvidia_minor != minor for c in claims
    )


def _tell_shared(ctx: Context, group: PlanGroup, address: str, claims: list[DeviceClaim]) -> None:
    """A container the plan does not name uses a GPU the plan gives the group's containers."""
    if group.guests:
        ctx.warnings.append(
            f"{address} is also used by CT {claims[0].guest.vmid} ("
            f"{wording.claim_lines(claims)}); "
            f"{wording.join(guest.label for guest in group.guests)} will share it"
        )


def _refuse_renumbered(
    ctx: Context, vmid: int, stale: dict[str, list[DeviceClaim]], minors: dict[str, int]
) -> None:
    """One problem for a container the plan does not name whose entries name GPUs kept on nvidia
    by the minors they have today, when the next boot numbers those GPUs anew: the entries
    would then name a node that does not exist, or another GPU's."""
    after = {minor: address for address, minor in minors.items()}
    clauses, outcomes = [], []
    for address, claims in stale.items():
        old = next(c.nvidia_minor for c in claims if isinstance(c.nvidia_minor, int))
        then = f"will be {after[old]}, another GPU" if old in after else "will not exist"
        # Proxmox refuses to start a container whose devN node is missing; a raw mount entry
        # (optional, as a rule) or cgroup rule only loses the GPU there.
        missing = "not start" if any(c.line.startswith("dev") for c in claims) else "lose the GPU"
        outcomes.append("get the wrong GPU" if old in after else missing)
        clauses.append(
            f"{address} becomes /dev/nvidia{minors[address]}, and /dev/nvidia{old} {then}"
        )
    lines = [claim for claims in stale.values() for claim in claims]
    new = wording.join(f"/dev/nvidia{minors[address]}" for address in stale)
    ctx.problem(
        "claimed",
        f"CT {vmid} names GPUs kept on nvidia by the numbers they have today "
        f"({wording.claim_lines(lines)}), but the split numbers them anew at the next boot: "
        f"{'; '.join(clauses)}; CT {vmid} would "
        f"{' or '.join(sorted(set(outcomes), reverse=True))} after the reboot",
        f"name CT {vmid} too (--lxc {vmid}: proxgpu rewrites its GPU entries with the new "
        f"numbers), or remove those entries and give it {new} after the reboot",
    )


def kept_group_container(ctx: Context, roles: dict[str, Role]) -> int | None:
    """The one container holding GPUs that stay on the host driver, when exactly one does and
    no target container was named: the split is for it."""
    if ctx.policy.containers or ctx.policy.keeps_drivers:
        return None
    holders = {
        claim.guest.vmid
        for claim in ctx.claims
        if claim.guest.type == "lxc"
        and any(roles.get(gpu.address) is Role.HOST for gpu in _claimed_gpus(ctx.index, claim))
    }
    return holders.pop() if len(holders) == 1 else None


def _claimed_gpus(index: GpuIndex, claim: DeviceClaim) -> list[Gpu]:
    if claim.nvidia_minor == "*":
        return list(index.by_minor.values())
    if claim.nvidia_minor is not None:
        gpu = index.by_minor.get(claim.nvidia_minor)
        return [] if gpu is None else [gpu]
    try:
        return index.at(normalize_pci_address(claim.pci_address or ""))
    except ValueError:
        # PVE would refuse such a hostpci value; it claims nothing here.
        return []


def _refuse_container_claim(
    ctx: Context, vmid: int, addresses: list[str], claims: list[DeviceClaim]
) -> None:
    """One problem for every GPU a container uses that the plan moves to vfio-pci."""
    gpus = wording.join(addresses)
    them = "it" if len(addresses) == 1 else "them"
    ctx.problem(
        "claimed",
        f"{gpus} go{'es' if len(addresses) == 1 else ''} to vfio-pci but CT {vmid} uses {them}: "
        f"{wording.claim_lines(claims)}",
        f"give CT {vmid} the host group (--lxc {vmid}: proxgpu rewrites its GPU entries), "
        f"or remove those entries yourself, or keep {them} on the host driver "
        f"(--host-gpus {','.join(addresses)})",
    )


def _tell_kept_binding(
    ctx: Context, group: PlanGroup | None, gpu: Gpu, claims: list[DeviceClaim]
) -> None:
    """A ``driver=keep`` entry leaves the binding to the host: qemu-server does not move the GPU
    to vfio-pci at the VM's start, so the VM starts only once proxgpu's binding holds."""
    claims = [c for c in claims if c.keep_driver]
    if not claims or group is None or not group.role.moves_to_vfio or gpu.driver == "vfio-pci":
        return
    vmid = claims[0].guest.vmid
    ctx.warnings.append(
        f"VM {vmid} passes {gpu.address} through with driver=keep ({wording.claim_lines(claims)}),"
        f" so qemu-server will not bind it to vfio-pci itself: VM {vmid} starts only once it is "
        f"there (after the reboot, or now with apply --live); it is on "
        f"{gpu.driver or 'no driver'} today"
    )


def _judge_vm_claim(
    ctx: Context, group: PlanGroup, address: str, claims: list[DeviceClaim]
) -> None:
    vmid = claims[0].guest.vmid
    if not group.role.moves_to_vfio:
        # With driver=keep qemu-server leaves the GPU where it is, and QEMU cannot open it there.
        outcome = (
            f"VM {vmid} could not start while it stays there (driver=keep: qemu-server does not "
            "move it to vfio-pci)"
            if any(c.keep_driver for c in claims)
            else f"starting VM {vmid} would take it from the host"
        )
        ctx.problem(
            "claimed",
            f"{address} stays on the host driver but VM {vmid} passes it through: "
            f"{wording.claim_lines(claims)}; {outcome}",
            f"remove that hostpci entry (or the GPU's map line in the PCI mapping), or move the "
            f"GPU to vfio-pci for that VM (--vm {vmid} with --vfio-gpus {address})",
        )
    elif group.guest is not None:
        ctx.problem(
            "claimed",
            f"{address} goes to VM {group.guest.vmid} but VM {vmid} already passes it through: "
            f"{wording.claim_lines(claims)}",
            f"remove that hostpci entry from VM {vmid}, or give it the GPU (--vm {vmid}:N)",
        )
    else:
        ctx.warnings.append(
            f"{address} is already passed through to VM {vmid} ("
            f"{wording.claim_lines(claims)}); binding it to "
            "vfio-pci keeps that working"
        )
        _tell_kept_binding(ctx, group, ctx.index.at(address)[0], claims)


def _judge_vgpu_claims(
    ctx: Context,
    groups: list[PlanGroup],
    guest: GuestRef,
    by_gpu: dict[str, list[DeviceClaim]],
    target: bool,
) -> None:
    """A vGPU is made by the GPU's host driver: on vfio-pci the VM could not start. Such a GPU
    keeps the vGPU role unless ``--vfio-gpus`` names it (see :mod:`~proxgpu.planning.vgpu`)."""
    moved = sorted(a for g in groups if g.role.moves_to_vfio for a in g.gpus if a in by_gpu)
    lines = wording.claim_lines([c for a in sorted(by_gpu) for c in by_gpu[a]])
    if not moved:
        if not target:
            ctx.notes.append(
                f"{wording.join(sorted(by_gpu))} {'stays' if len(by_gpu) == 1 else 'stay'} on the "
                f"host driver, where VM {guest.vmid} "
                f"uses a vGPU of {'it' if len(by_gpu) == 1 else 'them'} ({lines}): that keeps "
                "working, and no container is given it"
            )
        return
    them = "it" if len(moved) == 1 else "them"
    ctx.problem(
        "claimed",
        f"{wording.join(moved)} would go to vfio-pci, but VM {guest.vmid} uses a vGPU of {them} "
        f"({lines}): qemu-server creates that mediated device through the GPU's host driver, "
        f"which vfio-pci cannot do, so VM {guest.vmid} could not start",
        f"leave {wording.join(moved)} out of --vfio-gpus (a GPU with vGPUs stays on the host "
        "driver for them)",
    )


def check_iommu_on(ctx: Context, groups: list[PlanGroup]) -> bool:
    """Whether the plan must turn the IOMMU on; a problem when it may not."""
    vfio = [address for group in groups if group.role.moves_to_vfio for address in group.gpus]
    if ctx.inventory.iommu_enabled or not vfio:
        return False
    if ctx.policy.enable_iommu:
        ctx.warnings.append(
            "the IOMMU is off: the plan turns it on on the kernel command line, which takes a "
            "reboot; IOMMU groups can only be checked after it, so plan again then"
        )
        return True
    ctx.problem(
        "iommu-off",
        f"the IOMMU is off, but {wording.count(len(vfio), 'GPU')} would go to vfio-pci",
        "let proxgpu plan the kernel command line change (--enable-iommu) and reboot, or keep "
        "every GPU on the host driver",
    )
    return False


def check_vfio_iommu_groups(ctx: Context, groups: list[PlanGroup]) -> None:
    """With the IOMMU on, a GPU outside every IOMMU group cannot go to vfio-pci."""
    if not ctx.inventory.iommu_enabled:
        return  # check_iommu_on speaks for every vfio GPU then
    lacking = [
        address
        for group in groups
        if group.role.moves_to_vfio
        for address in group.gpus
        if ctx.index.get(address).iommu_group is None
    ]
    if lacking:
        ctx.problem(
            "no-iommu-group",
            f"{wording.join(lacking)} would go to vfio-pci but "
            f"{'has' if len(lacking) == 1 else 'have'} no IOMMU group although the IOMMU is on: "
            "vfio-pci refuses a device the IOMMU does not cover, and a VM given it cannot start",
            "look for DMAR or AMD-Vi errors about the slot in the kernel log (dmesg) and check "
            "that the firmware covers it (VT-d or AMD-Vi), or keep the GPU on the host driver "
            f"(--host-gpus {','.join(lacking)})",
        )


def check_mapping(ctx: Context, groups: list[PlanGroup]) -> None:
    """``--mapping``: each map line needs the GPU's IOMMU group, and one mapping is one pool."""
    name = ctx.policy.mapping
    if name is None:
        return
    if not is_mapping_id(name):
        ctx.problem(
            "mapping",
            f"--mapping {name!r} is no name Proxmox takes for a mapping",
            "start it with a letter, followed by at least one letter, digit, - or _ (gpu-node1)",
        )
    if not ctx.inventory.iommu_enabled:
        first = "plan without --mapping now (--enable-iommu), " if ctx.policy.enable_iommu else ""
        ctx.problem(
            "mapping",
            f"--mapping {name} writes each GPU's IOMMU group into /etc/pve/mapping/pci.cfg, but "
            "the IOMMU is off, so the groups are unknown until it is on",
            f"{first}turn the IOMMU on (--enable-iommu) and reboot, then plan the mapping",
        )
        return
    mapped = [g for g in groups if g.role.moves_to_vfio and g.guest is not None]
    nodes = {group.numa_node for group in mapped}
    if len(mapped) > 1 and (len(nodes) > 1 or None in nodes):
        vms = wording.join(group.guest.vmid for group in mapped if group.guest is not None)
        ctx.problem(
            "mapping",
            f"--mapping {name} would pool the GPUs of VMs {vms}, which sit on different NUMA "
            "nodes: Proxmox hands any free GPU of a mapping to any VM using it, so a VM could get "
            "GPUs of a node it is not pinned to",
            "give the VMs raw hostpciN entries (leave out --mapping), or give the VMs the GPUs of "
            "one NUMA node (--vfio-node N)",
        )
