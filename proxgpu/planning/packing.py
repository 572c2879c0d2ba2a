"""Groups: the host group for the container, one group per GPU kept for vGPU VMs, vfio GPUs
packed onto VMs by NUMA node."""

from __future__ import annotations

from collections import defaultdict

from proxgpu.cpulist import format_cpulist, parse_cpulist
from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.pci import VFIO_DRIVER
from proxgpu.planning import wording
from proxgpu.planning.context import Context
from proxgpu.planning.model import MigUse, PlanGroup, Role, VgpuUse
from proxgpu.planning.policy import SplitPolicy
from proxgpu.pve.claims import GuestRef


def build_groups(
    ctx: Context,
    roles: dict[str, Role],
    vgpus: dict[str, list[VgpuUse]],
    mig: dict[str, list[MigUse]],
) -> list[PlanGroup]:
    by_role: dict[Role, list[Gpu]] = defaultdict(list)
    for gpu in ctx.index.gpus:
        by_role[roles[gpu.address]].append(gpu)
    groups: list[PlanGroup] = []
    waiting = _host_containers(ctx.policy)
    if by_role[Role.HOST]:
        groups.extend(_host_groups(ctx, by_role[Role.HOST]))
    elif waiting:
        containers = [GuestRef(type=Role.HOST.serves, vmid=v) for v in waiting]
        ctx.problem(
            "no-fit",
            f"{wording.join(c.label for c in containers)} should receive the host group, but no "
            "GPU stays on the host driver for it",
            "keep a NUMA node on the host (--host-node N) or name GPUs with --host-gpus",
        )
    groups.extend(
        _make_group(ctx, Role.VGPU, [gpu], None).model_copy(
            update={"vgpus": vgpus.get(gpu.address, [])}
        )
        for gpu in by_role[Role.VGPU]
    )
    groups.extend(_mig_group(ctx, gpu, mig[gpu.address]) for gpu in by_role[Role.MIG])
    vfio = by_role[Role.VFIO]
    groups.extend(_make_group(ctx, Role.VFIO, gpus, vm) for vm, gpus in _vfio_units(ctx, vfio))
    return groups


def _host_containers(policy: SplitPolicy) -> list[int]:
    """The containers that get whole GPUs of the host group (not a MIG instance)."""
    return [vmid for vmid in policy.containers if vmid not in {m.vmid for m in policy.lxc_mig}]


def _mig_group(ctx: Context, gpu: Gpu, uses: list[MigUse]) -> PlanGroup:
    """One MIG GPU's group: its containers, each with its own instance, are its guests."""
    guests = [GuestRef(type=Role.MIG.serves, vmid=use.vmid) for use in uses]
    group = _make_group(ctx, Role.MIG, [gpu], guests[0])
    return group.model_copy(update={"shared_with": guests[1:], "mig": uses})


def _host_groups(ctx: Context, kept: list[Gpu]) -> list[PlanGroup]:
    """A group of its own for each container with a count (``--lxc 200:2``), from one NUMA node;
    what is left for the containers that share it (``--lxc 200``), else for none."""
    policy = ctx.policy
    free = _bundles_by_node(kept)
    groups = _node_groups(ctx, free)
    # Largest first, as for VMs: big containers still find a whole node.
    for vmid, count in sorted(policy.lxc_subsets, key=lambda ct: -ct[1]):
        gpus = _take_from_one_node(free, count)
        if gpus is None:
            _report_no_local_fit(ctx, vmid, count, free)
            continue
        guest = GuestRef(type=Role.HOST.serves, vmid=vmid)
        groups.append(_make_group(ctx, Role.HOST, sorted(gpus, key=wording.address), guest))
    left = [gpu for bundles in free.values() for bundle in bundles for gpu in bundle]
    sharing = [] if policy.lxc is None else [policy.lxc, *policy.shared_lxc]
    shared = [GuestRef(type=Role.HOST.serves, vmid=vmid) for vmid in sharing]
    if left and shared:
        group = _make_group(ctx, Role.HOST, sorted(left, key=wording.address), shared[0])
        groups.append(group.model_copy(update={"shared_with": shared[1:]}))
    elif shared and (policy.lxc_subsets or policy.lxc_nodes):
        ctx.problem(
            "no-fit",
            f"{wording.join(c.label for c in shared)} should share the host GPUs the other "
            "containers leave, but they leave none",
            "give it GPUs of its own (--lxc VMID:N or VMID@NODE), or keep more GPUs on the "
            "host driver",
        )
    elif left and (policy.lxc_subsets or policy.lxc_nodes):
        ctx.warnings.append(
            f"{wording.count(len(left), 'GPU')} on the host driver go to no container the plan "
            f"names: {wording.join(wording.addresses(sorted(left, key=wording.address)))}"
            + _used_by_others(ctx, left)
        )
    if left and not shared:
        groups.append(_make_group(ctx, Role.HOST, sorted(left, key=wording.address), None))
    return sorted(groups, key=lambda group: group.gpus)


def _used_by_others(ctx: Context, gpus: list[Gpu]) -> str:
    """`` (CT 201 uses 0000:71:00.0)``: the containers the plan does not name whose configs
    give them a node of ``gpus`` (by its nvidia minor), else nothing."""
    named = set(ctx.policy.containers)
    by_minor = {gpu.nvidia_minor: gpu.address for gpu in gpus if gpu.nvidia_minor is not None}
    users: dict[str, list[str]] = defaultdict(list)
    for claim in ctx.claims:
        address = by_minor.get(claim.nvidia_minor) if isinstance(claim.nvidia_minor, int) else None
        if address and claim.guest.vmid not in named and address not in users[claim.guest.label]:
            users[claim.guest.label].append(address)
    said = [f"{guest} uses {wording.join(sorted(used))}" for guest, used in users.items() if used]
    return f" ({'; '.join(said)})" if said else ""


def _node_groups(ctx: Context, free: dict[int | None, list[list[Gpu]]]) -> list[PlanGroup]:
    """The groups of the containers bound to a node (``--lxc 200@0``, ``--lxc 201:2@1``),
    taken out of ``free``: counted ones first, largest first; then each node's containers
    without a count share what is left of it."""
    kept = _counts(free)
    groups = []
    counted = [(v, node, n) for v, node, n in ctx.policy.lxc_nodes if n is not None]
    for vmid, node, count in sorted(counted, key=lambda ct: -ct[2]):
        on_node: dict[int | None, list[list[Gpu]]] = {node: free.get(node, [])}
        gpus = _take_from_one_node(on_node, count) if kept.get(node) else None
        if gpus is None:
            _report_node_short(ctx, (vmid, node, count), kept, _counts(free).get(node, 0))
            continue
        free[node] = on_node[node]
        guest = GuestRef(type=Role.HOST.serves, vmid=vmid)
        groups.append(_make_group(ctx, Role.HOST, sorted(gpus, key=wording.address), guest))
    whole: dict[int, list[GuestRef]] = defaultdict(list)
    for vmid, node, n in ctx.policy.lxc_nodes:
        if n is None:
            whole[node].append(GuestRef(type=Role.HOST.serves, vmid=vmid))
    for node, guests in whole.items():
        gpus = [gpu for bundle in free.get(node, []) for gpu in bundle]
        if not gpus:
            _report_node_short(ctx, (guests[0].vmid, node, None), kept, 0)
            continue
        free[node] = []
        group = _make_group(ctx, Role.HOST, sorted(gpus, key=wording.address), guests[0])
        groups.append(group.model_copy(update={"shared_with": guests[1:]}))
    return groups


def _counts(free: dict[int | None, list[list[Gpu]]]) -> dict[int | None, int]:
    return {node: sum(map(len, bundles)) for node, bundles in free.items()}


def _report_node_short(
    ctx: Context, spec: tuple[int, int, int | None], kept: dict[int | None, int], left: int
) -> None:
    """The container of ``spec`` (``lxc_nodes``' ``(vmid, node, count)``) asked for GPUs of its
    node that it cannot have: the node keeps none, or ``left`` are left of its ``kept`` GPUs."""
    vmid, node, count = spec
    asked = f"node {node}'s host GPUs"
    if count is not None:
        asked = f"{wording.count(count, 'host GPU')} of node {node}"
    shown = ", ".join(f"node {'?' if n is None else n}: {k}" for n, k in kept.items())
    if not kept.get(node):
        why = f"node {node} keeps none on the host driver (kept: {shown})"
        fix = f"name a node that keeps GPUs, or keep node {node} on the host (--host-node {node})"
    else:
        share = f"only {left}" if left else "none"
        why = f"{share} of node {node}'s {kept[node]} host GPUs are left for it"
        fix = "lower the container GPU counts on that node (--lxc VMID:N@NODE)"
    ctx.problem("no-fit", f"CT {vmid} asks for {asked}, but {why}", fix)


def _report_no_local_fit(
    ctx: Context, vmid: int, count: int, free: dict[int | None, list[list[Gpu]]]
) -> None:
    counts = ", ".join(
        f"node {'?' if node is None else node}: {sum(map(len, bundles))}"
        for node, bundles in free.items()
    )
    ctx.problem(
        "no-fit",
        f"CT {vmid} asks for {wording.count(count, 'GPU')} on one NUMA node, but no node has "
        f"that many host GPUs left ({counts or 'none left'})",
        "lower the container GPU counts (--lxc VMID:N), or keep more GPUs on the host driver",
    )


def _make_group(ctx: Context, role: Role, gpus: list[Gpu], guest: GuestRef | None) -> PlanGroup:
    nodes = {gpu.numa_node for gpu in gpus}
    if role.moves_to_vfio:
        driver = VFIO_DRIVER
    else:
        driver = ",".join(sorted({gpu.host_driver or "unknown" for gpu in gpus}))
    return PlanGroup(
        role=role,
        numa_node=next(iter(nodes)) if len(nodes) == 1 else None,
        gpus=wording.addresses(gpus),
        functions=sorted({function for gpu in gpus for function in gpu.functions}),
        cpus=_group_cpus(ctx.inventory, gpus),
        memory_nodes=_memory_nodes(ctx.inventory, nodes),
        driver=driver,
        guest=guest,
    )


def _group_cpus(inventory: Inventory, gpus: list[Gpu]) -> str:
    node_cpus = {node.id: node.cpus for node in inventory.numa_nodes}
    cpus: set[int] = set()
    for gpu in gpus:
        if gpu.numa_node in node_cpus:
            cpus.update(parse_cpulist(node_cpus[gpu.numa_node]))
        elif gpu.local_cpus:
            # For an unknown node the kernel lists every online CPU here.
            cpus.update(parse_cpulist(gpu.local_cpus))
        else:
            cpus.update(cpu for node in inventory.numa_nodes for cpu in node.cpu_ids())
    return format_cpulist(cpus)


def _memory_nodes(inventory: Inventory, nodes: set[int | None]) -> list[int]:
    if None in nodes:
        # Locality unknown: allow every node rather than guess one.
        return sorted(node.id for node in inventory.numa_nodes)
    return sorted(node for node in nodes if node is not None)


def _vfio_units(ctx: Context, vfio: list[Gpu]) -> list[tuple[GuestRef | None, list[Gpu]]]:
    """The vfio GPUs shared out: one unit per VM, then the rest per NUMA node for no VM."""
    free = _bundles_by_node(vfio)
    taken: dict[int, list[Gpu]] = {}
    counted = [(vmid, count) for vmid, count in ctx.policy.vms if count is not None]
    # Largest first, so that big VMs still find a whole node before small ones fragment it.
    for vmid, count in sorted(counted, key=lambda vm: -vm[1]):
        gpus = _take_for_vm(free, count)
        if gpus is None:
            _report_no_fit(ctx, vmid, count, vfio, free)
        else:
            taken[vmid] = gpus
    left = sorted(
        (gpu for bundles in free.values() for bundle in bundles for gpu in bundle),
        key=wording.address,
    )
    rest = [vmid for vmid, count in ctx.policy.vms if count is None]
    if rest and left:
        taken[rest[0]] = left
        left = []
    elif rest:
        _report_no_fit(ctx, rest[0], None, vfio, free)
    if left and ctx.policy.vms:
        ctx.warnings.append(
            f"{wording.count(len(left), 'GPU')} on vfio-pci go to no VM: "
            f"{wording.join(wording.addresses(left))}"
        )
    units: list[tuple[GuestRef | None, list[Gpu]]] = [
        (GuestRef(type=Role.VFIO.serves, vmid=vmid), sorted(taken[vmid], key=wording.address))
        for vmid, _ in ctx.policy.vms
        if vmid in taken
    ]
    units.extend((None, gpus) for gpus in _split_by_node(left))
    return units


def _bundles_by_node(gpus: list[Gpu]) -> dict[int | None, list[list[Gpu]]]:
    """GPUs that must go to the same VM (one IOMMU group, or one slot), by NUMA node."""
    bundles: dict[tuple[str, int | str], list[Gpu]] = {}
    for gpu in gpus:
        key = ("group", gpu.iommu_group) if gpu.iommu_group is not None else ("slot", gpu.slot)
        bundles.setdefault(key, []).append(gpu)
    by_node: dict[int | None, list[list[Gpu]]] = defaultdict(list)
    for bundle in bundles.values():
        by_node[bundle[0].numa_node].append(bundle)
    return {node: by_node[node] for node in sorted(by_node, key=wording.node_order)}


def _take_for_vm(free: dict[int | None, list[list[Gpu]]], count: int) -> list[Gpu] | None:
    """Take ``count`` GPUs out of ``free``: from one node if any fits (the tightest), else across
    nodes starting with the fullest. ``None`` when the bundles cannot make ``count``."""
    local = _take_from_one_node(free, count)
    if local is not None:
        return local
    order = sorted(free, key=lambda node: (-sum(map(len, free[node])), wording.node_order(node)))
    spanning = _pick_exact([bundle for node in order for bundle in free[node]], count)
    if spanning is None:
        return None
    for node in order:
        free[node] = [bundle for bundle in free[node] if bundle not in spanning]
    return [gpu for bundle in spanning for gpu in bundle]


def _take_from_one_node(free: dict[int | None, list[list[Gpu]]], count: int) -> list[Gpu] | None:
    """Take ``count`` GPUs out of the tightest node of ``free`` that holds them; ``None`` when
    no node does."""
    fits = [
        (sum(map(len, bundles)), wording.node_order(node), node, picked)
        for node, bundles in free.items()
        if (picked := _pick_exact(bundles, count)) is not None
    ]
    if fits:
        _, _, node, picked = min(fits, key=lambda fit: fit[:2])
        free[node] = [bundle for bundle in free[node] if bundle not in picked]
        return [gpu for bundle in picked for gpu in bundle]
    return None


def _pick_exact(bundles: list[list[Gpu]], count: int) -> list[list[Gpu]] | None:
    """The earliest bundles (in list order) holding exactly ``count`` GPUs, or ``None``."""
    # reachable[i]: the GPU counts some choice of bundles[i:] adds up to; lets the walk below
    # take a bundle only when the rest can still be made up, without backtracking.
    reachable = [{0}]
    for bundle in reversed(bundles):
        after = reachable[-1]
        reachable.append(after | {n + len(bundle) for n in after if n + len(bundle) <= count})
    reachable.reverse()
    if count not in reachable[0]:
        return None
    picked: list[list[Gpu]] = []
    left = count
    for i, bundle in enumerate(bundles):
        if len(bundle) <= left and left - len(bundle) in reachable[i + 1]:
            picked.append(bundle)
            left -= len(bundle)
    return picked


def _report_no_fit(
    ctx: Context,
    vmid: int,
    count: int | None,
    vfio: list[Gpu],
    free: dict[int | None, list[list[Gpu]]],
) -> None:
    left = sum(len(bundle) for bundles in free.values() for bundle in bundles)
    asked = "the remaining vfio GPUs" if count is None else wording.count(count, "GPU")
    if count is not None and left >= count:
        why = f"the {left} vfio GPUs left cannot make that: GPUs sharing an IOMMU group go together"
    else:
        why = f"at most {left} of the {len(vfio)} vfio GPUs are left for it"
    ctx.problem(
        "no-fit",
        f"VM {vmid} asks for {asked}, but {why}",
        "change the VM GPU counts (--vm VMID:N), or send more GPUs to vfio-pci",
    )


def _split_by_node(gpus: list[Gpu]) -> list[list[Gpu]]:
    by_node: dict[int | None, list[Gpu]] = defaultdict(list)
    for gpu in gpus:
        by_node[gpu.numa_node].append(gpu)
    return [by_node[node] for node in sorted(by_node, key=wording.node_order)]
