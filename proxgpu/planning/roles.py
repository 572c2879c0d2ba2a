"""Which role each GPU gets: host driver or vfio-pci, by NUMA node or by address (the vGPU role
is :mod:`~proxgpu.planning.vgpu`'s)."""

from __future__ import annotations

from collections import defaultdict

from proxgpu.inspection.inventory import Gpu
from proxgpu.pci import normalize_pci_address
from proxgpu.planning import wording
from proxgpu.planning.context import Context
from proxgpu.planning.model import VMID_MAX, VMID_MIN, Role


def assign_roles(ctx: Context) -> dict[str, Role]:
    """GPU address -> role: by address first, then by node (or the other list's complement)."""
    policy = ctx.policy
    _check_targets(ctx)
    if policy.keeps_drivers:
        # vGPUs and MIG instances need their GPUs where they are: nothing else moves.
        return {
            g.address: Role.VFIO if g.driver == "vfio-pci" else Role.HOST for g in ctx.index.gpus
        }
    named = _named_roles(ctx)
    use_nodes = bool(policy.host_nodes or policy.vfio_nodes) or not named
    node_roles = _node_roles(ctx) if use_nodes else {}
    roles: dict[str, Role] = {}
    unknown: list[Gpu] = []
    unnamed: list[Gpu] = []
    unlisted_nodes: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in ctx.index.gpus:
        if gpu.address in named:
            roles[gpu.address] = named[gpu.address]
        elif not use_nodes:
            unnamed.append(gpu)
        elif gpu.numa_node is None:
            unknown.append(gpu)
        elif gpu.numa_node in node_roles:
            roles[gpu.address] = node_roles[gpu.numa_node]
        else:
            unlisted_nodes[gpu.numa_node].append(gpu)
    if unnamed:
        _complement_roles(ctx, unnamed, roles)
    _report_unplaced(ctx, unknown, unlisted_nodes)
    return roles


def _check_targets(ctx: Context) -> None:
    vmids = [vmid for vmid, _ in ctx.policy.vms] + [vmid for vmid, _ in ctx.policy.vgpus]
    vmids += ctx.policy.containers
    for vmid in sorted({vmid for vmid in vmids if vmids.count(vmid) > 1}):
        ctx.problem(
            "policy",
            f"guest {vmid} is named more than once among the targets",
            "name each container or VM once (a VMID is unique across containers and VMs)",
        )
    for vmid in sorted({vmid for vmid in vmids if not VMID_MIN <= vmid <= VMID_MAX}):
        ctx.problem(
            "policy",
            f"guest {vmid} cannot exist: Proxmox VMIDs run from {VMID_MIN} to {VMID_MAX}",
            "name the container or VM by its VMID, as pct list or qm list shows it",
        )
    for vmid, count in ctx.policy.vms:
        if count is not None and count < 1:
            ctx.problem("policy", f"--vm {vmid}:{count} asks for no GPU", "ask for 1 GPU or more")
    rest = [vmid for vmid, count in ctx.policy.vms if count is None]
    if len(rest) > 1:
        ctx.problem(
            "policy",
            f"VMs {wording.join(rest)} all ask for the remaining vfio GPUs",
            "give every VM but one a GPU count, as --vm VMID:N",
        )


def _named_roles(ctx: Context) -> dict[str, Role]:
    """The roles given by ``--host-gpus``/``--vfio-gpus``."""
    named: dict[str, Role] = {}
    lists: list[tuple[Role, str, list[str]]] = [
        (Role.HOST, "--host-gpus", ctx.policy.host_gpus),
        (Role.VFIO, "--vfio-gpus", ctx.policy.vfio_gpus),
    ]
    for role, option, texts in lists:
        for gpu in _select_by_address(ctx, option, texts):
            if named.get(gpu.address, role) != role:
                ctx.problem(
                    "policy",
                    f"{gpu.address} is in both --host-gpus and --vfio-gpus",
                    "name each GPU in one list only",
                )
            named[gpu.address] = role
    return named


def _select_by_address(ctx: Context, option: str, texts: list[str]) -> list[Gpu]:
    selected: list[Gpu] = []
    for text in texts:
        try:
            found = ctx.index.at(normalize_pci_address(text))
        except ValueError:
            ctx.problem(
                "policy",
                f"{option} {text}: not a PCI address",
                "write addresses as 0000:81:00.0, 81:00.0 or 81:00",
            )
            continue
        if not found:
            ctx.problem(
                "policy",
                f"{option} {text}: no GPU at that address",
                f"the GPUs of {ctx.inventory.source} are "
                f"{wording.join(wording.addresses(ctx.index.gpus))}",
            )
        selected.extend(found)
    return selected


def _node_roles(ctx: Context) -> dict[int, Role]:
    """NUMA node -> role for every node holding GPUs that the node rules place."""
    policy = ctx.policy
    gpu_nodes = sorted({gpu.numa_node for gpu in ctx.index.gpus if gpu.numa_node is not None})
    for option, nodes in (("--host-node", policy.host_nodes), ("--vfio-node", policy.vfio_nodes)):
        for node in sorted(set(nodes) - set(gpu_nodes)):
            ctx.problem(
                "policy",
                f"{option} {node}: NUMA node {node} holds no GPUs",
                f"the nodes holding GPUs are {wording.join(gpu_nodes) or 'none known'}",
            )
    for node in sorted(set(policy.host_nodes) & set(policy.vfio_nodes)):
        ctx.problem(
            "policy",
            f"NUMA node {node} is in both --host-node and --vfio-node",
            "name each node once",
        )
    if not policy.host_nodes and not policy.vfio_nodes:
        return {node: Role.HOST if node == gpu_nodes[0] else Role.VFIO for node in gpu_nodes}
    roles: dict[int, Role] = {}
    for node in gpu_nodes:
        if node in policy.host_nodes or (node not in policy.vfio_nodes and not policy.host_nodes):
            roles[node] = Role.HOST
        elif node in policy.vfio_nodes or not policy.vfio_nodes:
            roles[node] = Role.VFIO
    return roles


def _complement_roles(ctx: Context, unnamed: list[Gpu], roles: dict[str, Role]) -> None:
    """GPUs left out of the one address list given take the other role."""
    if ctx.policy.host_gpus and ctx.policy.vfio_gpus:
        ctx.problem(
            "policy",
            f"{wording.join(wording.addresses(unnamed))} in neither --host-gpus nor --vfio-gpus",
            "name every GPU in one of the lists, or give only one list "
            "(the GPUs it does not name then take the other role)",
        )
        return
    other = Role.VFIO if ctx.policy.host_gpus else Role.HOST
    roles.update((gpu.address, other) for gpu in unnamed)


def _report_unplaced(
    ctx: Context, unknown: list[Gpu], unlisted_nodes: dict[int, list[Gpu]]
) -> None:
    if unknown:
        addresses = wording.addresses(unknown)
        ctx.problem(
            "unknown-numa",
            f"the NUMA node of "
            f"{wording.join(addresses)} is unknown (sysfs numa_node is -1 or missing: the "
            "firmware gave no locality), so the split by NUMA node cannot place "
            f"{'it' if len(unknown) == 1 else 'them'}",
            "assign GPUs by address instead, e.g. "
            f"--vfio-gpus {','.join(addresses[len(addresses) // 2 :])} (the GPUs not named stay "
            "on the host driver), or name both sides with --host-gpus and --vfio-gpus",
        )
    for node, gpus in sorted(unlisted_nodes.items()):
        ctx.problem(
            "policy",
            f"NUMA node {node} holds "
            f"{wording.join(wording.addresses(gpus))} but is in neither --host-node nor "
            "--vfio-node",
            f"add --host-node {node} or --vfio-node {node}",
        )
