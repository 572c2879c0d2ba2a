"""A Proxmox VE cluster as one: its online nodes, a plan of every node before any write, one
pooled PCI mapping written first by the lead node, and the rollout.

The members come from ``/etc/pve/.members`` of one node (over SSH, this machine, or a cluster
snapshot's tree); each online node is reached at its member address with the first target's
user and port (in a snapshot: its own tree ``DIR/NODE``); an offline node is skipped and never
connected to. VMIDs are unique in a cluster: each node is planned with the guests it holds.

>>> from proxgpu.planning import SplitPolicy
>>> nodes = snapshot_nodes("examples/hosts/cluster-3")
>>> planned = plan_cluster(nodes, SplitPolicy(vms=[(300, None), (310, None), (320, None)]),
...                        mapping="gpu-vfio")
>>> list(planned.proposals), planned.mapping.changed, planned.lead
(['pve1', 'pve2', 'pve3'], True, 'pve1')
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from proxgpu.apply import ApplyOptions, ApplyResult, apply_changes
from proxgpu.errors import ClusterNotPlannedError, ProxgpuError, SysfsError, UsageError
from proxgpu.fleet.engine import (
    FORKS,
    Connect,
    Listener,
    Rollout,
    Say,
    Target,
    each_host,
    open_target,
    roll_out,
)
from proxgpu.host import Host, connect
from proxgpu.host.local import snapshot_node_trees
from proxgpu.host.scripts import read_files
from proxgpu.host.sshcommon import parse_target
from proxgpu.inspection import GpuFilter, Inventory, inspect
from proxgpu.inspection.capture import Capture, as_cluster_node, gather, guest_files, write_tree
from proxgpu.paths import MEMBERS, PCI_MAPPING, guest_config
from proxgpu.pipeline import Proposal, plan_inventory, read_holdings
from proxgpu.planning import SplitPolicy
from proxgpu.pve.cluster import ClusterMembers, parse_members
from proxgpu.pve.mapping import PciMappingConfig, with_node_maps
from proxgpu.rendering import RenderOptions
from proxgpu.rendering.changes import ChangeSet, FileChange
from proxgpu.rendering.context import missing_guest, no_such_guest
from proxgpu.rendering.vm import map_entries

#: Why a member is not run.
OFFLINE = "offline: skipped (not planned, not changed)"


@dataclass
class ClusterNodes:
    """A cluster's members, the node they were read from (``first``), how each online node is
    reached, the members skipped with why, and whether the nodes are live hosts."""

    members: ClusterMembers
    first: str
    targets: dict[str, Target] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    live: bool = True

    def summary(self) -> str:
        """One line about the cluster, as ``plan --cluster`` prints it first.

        >>> snapshot_nodes("examples/hosts/cluster-3").summary()
        'Cluster gpu-lab, quorate: 3 of 4 nodes (pve1, pve2, pve3); pve4 offline: skipped ...'
        """
        online = ", ".join(self.targets) or "none"
        quorum = "quorate" if self.members.quorate else "NOT QUORATE (/etc/pve is read-only)"
        text = f"Cluster {self.members.name or '?'}, {quorum}: {len(self.targets)} of "
        text += f"{len(self.members.members)} nodes ({online})"
        return text + "".join(f"; {name} {why}" for name, why in self.skipped.items())

    def document(self) -> dict[str, object]:
        """The cluster as ``--json`` shows it beside the nodes' documents."""
        return {
            "name": self.members.name,
            "quorate": self.members.quorate,
            "members": [m.model_dump(mode="json") for m in self.members.members],
            "skipped": self.skipped,
        }


def find_nodes(first: Target, *, connect: Connect | None = None) -> ClusterNodes:
    """The cluster ``first`` belongs to (an SSH target, this machine, or a tree on a remote
    host), and how each online node is reached. A snapshot on this machine: :func:`snapshot_nodes`.

    :raises SysfsError: when ``/etc/pve/.members`` is missing or unreadable.
    :raises UsageError: when it names a member in a way that is not an address or node name.
    """
    with (connect or open_target)(first) as host:
        members = read_members(host)
        live = host.is_live
    nodes = ClusterNodes(members, members.nodename, live=live)
    for member in members.members:
        if not member.online:
            nodes.skipped[member.name] = OFFLINE
        elif member.name == members.nodename:
            nodes.targets[member.name] = first
        elif member.ip is None:
            nodes.skipped[member.name] = "no address in .members: skipped"
        else:
            root = None if first.root is None else _sibling(first.root, member.name)
            nodes.targets[member.name] = Target(_address(first.host, member.ip), root)
    return _first_first(nodes)


def snapshot_nodes(root: str | Path) -> ClusterNodes:
    """A cluster snapshot (``DIR/NODE/`` trees, as ``snapshot --cluster`` writes) or one node's
    tree in one.

    :raises UsageError: when ``root`` holds no node's tree.
    """
    root = Path(root)
    member_file = MEMBERS.lstrip("/")
    if (root / member_file).is_file():
        top, first = root.parent, root.name
    else:
        top = root
        trees = snapshot_node_trees(str(root))
        if not trees:
            raise UsageError(f"{root}: no NODE/{member_file} below: not a cluster snapshot")
        first = trees[0]
    with connect(root=str(top / first)) as host:
        members = read_members(host)
    nodes = ClusterNodes(members, first, live=False)
    for member in members.members:
        if not member.online:
            nodes.skipped[member.name] = OFFLINE
        elif not (top / member.name / member_file).is_file():
            nodes.skipped[member.name] = f"no tree {top / member.name} in the snapshot: skipped"
        else:
            nodes.targets[member.name] = Target(root=str(top / member.name))
    return _first_first(nodes)


@dataclass
class ClusterPlan:
    """Every online node planned (its proposal, or the error that stopped it) and the cluster's
    one mapping change, shown once and written once with the lead node's apply."""

    nodes: ClusterNodes
    proposals: dict[str, Proposal | ProxgpuError]
    mapping: FileChange | None = None
    mapping_name: str | None = None
    #: Each node read, planned or not (a refused node's picture is of the node as it is).
    inventories: dict[str, Inventory] = field(default_factory=dict)

    @property
    def failed(self) -> dict[str, ProxgpuError]:
        """The nodes that could not be planned, with why."""
        return {n: p for n, p in self.proposals.items() if isinstance(p, ProxgpuError)}

    @property
    def lead(self) -> str | None:
        """The node applied alone before any other: the one whose apply writes the mapping."""
        return self.nodes.first if self.mapping is not None and self.mapping.changed else None

    def to_apply(self) -> dict[str, Proposal]:
        """Each node's proposal, the lead's with the mapping first in its change set, so one
        transaction holds it (journal entry, backup, restore on failure, rollback); on a live
        cluster that apply writes it through the Proxmox API before the VM configs naming it.

        :raises ClusterNotPlannedError: when a node could not be planned: nothing is applied.
        """
        if self.failed:
            raise ClusterNotPlannedError(list(self.failed))
        planned = {n: p for n, p in self.proposals.items() if isinstance(p, Proposal)}
        lead = self.lead
        if lead is not None and self.mapping is not None:
            if lead not in planned:
                raise UsageError(f"{lead}, which holds the mapping, is not among the nodes run")
            proposal = planned[lead]
            planned[lead] = replace(proposal, changes=with_change(proposal.changes, self.mapping))
        return planned


def plan_cluster(
    nodes: ClusterNodes,
    policy: SplitPolicy,
    options: RenderOptions | None = None,
    gpu_filter: GpuFilter | None = None,
    *,
    mapping: str | None = None,
    connect: Connect | None = None,
    forks: int = FORKS,
) -> ClusterPlan:
    """Plan every online node (``forks`` at a time) with the guests it holds, and pool the
    vfio GPUs of every node into one mapping (``mapping``, named in ``options`` too). Nothing
    is written. A node that cannot be planned keeps its error in the plan.

    :raises RenderError: when a named guest is on no node read, as a single host refuses it.
    """
    options = replace(options or RenderOptions(), mapping=mapping)

    def one(host: Host, say: Say) -> Inventory:
        inventory = inspect(host, gpu_filter)
        _same_name(host, inventory.node_name, say.name)
        return inventory

    read = {
        n: o.or_error()
        for n, o in each_host(nodes.targets, one, connect=connect, forks=forks).items()
    }
    refuse_unknown_guests(policy, nodes, read)
    proposals = {
        n: found if isinstance(found, ProxgpuError) else _plan_node(found, policy, options)
        for n, found in read.items()
    }
    planned = {n: p for n, p in proposals.items() if isinstance(p, Proposal)}
    planned = _holding(nodes, planned, connect, forks)
    pooled, change = pool_mapping(planned, mapping, nodes.first)
    inventories = {n: found for n, found in read.items() if isinstance(found, Inventory)}
    return ClusterPlan(nodes, {**proposals, **pooled}, change, mapping, inventories)


def _plan_node(
    inventory: Inventory, policy: SplitPolicy, options: RenderOptions
) -> Proposal | ProxgpuError:
    """One node's proposal for the guests it holds, or the error that refused it."""
    try:
        return Proposal(
            inventory, *plan_inventory(inventory, node_policy(policy, inventory), options)
        )
    except ProxgpuError as exc:
        return exc


def _holding(
    nodes: ClusterNodes, planned: dict[str, Proposal], connect: Connect | None, forks: int
) -> dict[str, Proposal]:
    """Each proposal with what the containers it gives NVIDIA GPUs hold now, read in a second
    pass over those nodes alone: a node is planned only once every node is read (which guest is
    where). A node whose containers could not be read keeps its plan as made, whose next steps
    then say what each container needs without what it holds."""
    needing = {n: p for n, p in planned.items() if p.plan.userspace}
    if not needing:
        return planned

    def one(host: Host, say: Say) -> Proposal:
        proposal = needing[say.name]
        return replace(proposal, plan=read_holdings(host, proposal.inventory, proposal.plan))

    targets = {n: nodes.targets[n] for n in needing}
    read = each_host(targets, one, connect=connect, forks=forks)
    return planned | {n: o.result for n, o in read.items() if o.result is not None}


def apply_cluster(
    planned: ClusterPlan,
    *,
    connect: Connect | None = None,
    parallel: int = 1,
    options: ApplyOptions | None = None,
    on_event: Listener | None = None,
) -> Rollout[ApplyResult]:
    """Apply a cluster plan node by node (the lead first and alone), as ``options`` say (a dry
    run only checks), stopping at the first node that fails: the nodes before it stay
    applied (``rollback`` undoes them), the rest untouched. Each node's file texts are compared
    with what its plan read, so a node changed since the plan is refused.

    :raises ClusterNotPlannedError: when a node could not be planned (nothing is applied).
    """
    proposals = planned.to_apply()

    def one(host: Host, say: Say) -> ApplyResult:
        proposal = proposals[say.name]
        return apply_changes(host, proposal.changes, options, plan=proposal.plan, progress=say)

    targets = {n: planned.nodes.targets[n] for n in proposals}
    return roll_out(
        targets, one, connect=connect, parallel=parallel, lead=planned.lead, on_event=on_event
    )


def _same_name(host: Host, hostname: str, name: str) -> None:
    """A member address that reaches another machine would plan it with this node's guests."""
    if hostname != name:
        raise UsageError(
            f"{host.name}: its hostname is {hostname}, but {MEMBERS} calls it {name}: "
            "the mapping and guests would be another node's; check the member addresses"
        )


def refuse_unknown_guests(
    policy: SplitPolicy, nodes: ClusterNodes, found: Mapping[str, Inventory | ProxgpuError]
) -> None:
    """Refuse the first guest ``policy`` names that no node read holds, as a single host
    refuses a guest it does not have (the same error and exit code), naming the cluster.

    :raises RenderError: naming the guest's config and the guests of its kind the nodes hold.
    """
    # A node that could not be read may hold it: its own error says why, node by node.
    if not all(isinstance(i, Inventory) for i in found.values()):
        return
    held = {path for i in found.values() if isinstance(i, Inventory) for path in i.guest_configs}
    path = missing_guest(policy.guests, held)
    if path is not None:
        also = f" (not read: {', '.join(nodes.skipped)})" if nodes.skipped else ""
        name = nodes.members.name
        raise no_such_guest(
            f"cluster {name}" if name else nodes.first,
            path,
            held,
            f" on any node read{also}",
            "on the nodes read",
        )


def _address(first: str | None, ip: str) -> str:
    """``ip`` with the user and port of the first host's target, as SSH takes it."""
    user, _, port = (None, "", None) if first is None else parse_target(first)
    address = f"[{ip}]" if ":" in ip else ip
    return f"{user + '@' if user else ''}{address}{f':{port}' if port else ''}"


def _sibling(root: str, name: str) -> str:
    """A node's tree beside the first node's in a cluster snapshot on the remote host."""
    return posixpath.join(posixpath.dirname(root.rstrip("/")) or "/", name)


def _first_first(nodes: ClusterNodes) -> ClusterNodes:
    """The first node first: it is read first, and a snapshot's mapping goes with its apply."""
    if nodes.first in nodes.targets:
        nodes.targets = {nodes.first: nodes.targets[nodes.first], **nodes.targets}
    return nodes


def read_members(host: Host) -> ClusterMembers:
    """The cluster ``host`` belongs to, from its ``/etc/pve/.members`` (one command).

    >>> from proxgpu.host import DirectoryHost
    >>> members = read_members(DirectoryHost("examples/hosts/cluster-3/pve1"))
    >>> members.name, [m.name for m in members.online()]
    ('gpu-lab', ['pve1', 'pve2', 'pve3'])

    :raises SysfsError: when the file is missing or is not pmxcfs' member list.
    """
    return parse_members(members_file(host).decode("utf-8", "replace"), host.name)


def snapshot_cluster(
    nodes: ClusterNodes,
    out: str | Path,
    *,
    connect: Connect | None = None,
    forks: int = FORKS,
) -> dict[str, int | ProxgpuError]:
    """Capture every online node of ``nodes``, then write each one's tree to ``out/NODE/``
    with the cluster's shared ``/etc/pve`` as that node sees it (every node's guest configs
    under ``etc/pve/nodes/``, ``.members``, ``mapping/``), so that :func:`snapshot_nodes`
    reads the cluster back offline. Each node's entries written, or why it could not be read
    (it then has no tree).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as out:
    ...     written = snapshot_cluster(snapshot_nodes("examples/hosts/cluster-3"), out)
    ...     again = snapshot_nodes(out)
    >>> sorted(written), sorted(again.targets)
    (['pve1', 'pve2', 'pve3'], ['pve1', 'pve2', 'pve3'])

    :raises UsageError: when ``out`` exists and is not empty.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out}: exists and is not empty; choose a new directory")

    def read(host: Host, say: Say) -> tuple[Capture, bytes]:
        return gather(host, modes=True), members_file(host)

    outcomes = each_host(nodes.targets, read, connect=connect, forks=forks)
    found = {name: outcome.or_error() for name, outcome in outcomes.items()}
    captured = {n: r for n, r in found.items() if not isinstance(r, ProxgpuError)}
    guests = {n: guest_files(capture) for n, (capture, _) in captured.items()}
    written: dict[str, int | ProxgpuError] = {}
    for name, result in found.items():
        if isinstance(result, ProxgpuError):
            written[name] = result
            continue
        capture, members = result
        written[name] = write_tree(as_cluster_node(capture, name, guests, members), str(out / name))
    return written


def members_file(host: Host) -> bytes:
    """``host``'s ``/etc/pve/.members`` as it is (one command): what :func:`read_members`
    parses and a cluster snapshot keeps.

    :raises SysfsError: when it is missing.
    """
    (data,) = read_files(host, [MEMBERS])
    if data is None:
        raise SysfsError(
            host.name,
            MEMBERS,
            "missing",
            "pmxcfs writes it on every cluster member: read a node on its own without "
            "--cluster; on a member, check the cluster (`pvecm status`) and pmxcfs "
            "(`systemctl status pve-cluster`)",
        )
    return data


def node_policy(policy: SplitPolicy, inventory: Inventory) -> SplitPolicy:
    """``policy`` for one node of a cluster: only the guests whose configs the node holds (its
    containers with GPUs, a count, a node or a MIG instance; its VMs with GPUs or a vGPU).

    VMIDs are unique in a cluster, and each guest's config lives on its node
    (``/etc/pve/nodes/NODE/...``, which the node's ``/etc/pve/lxc`` and ``qemu-server`` link to).

    >>> from proxgpu.host import DirectoryHost
    >>> pve2 = inspect(DirectoryHost("examples/hosts/cluster-3/pve2"))
    >>> node_policy(SplitPolicy(lxc=200, vms=[(300, None), (310, 1)]), pve2).vms
    [(310, 1)]
    """
    held = inventory.guest_configs
    return policy.only(lambda guest: guest_config(guest.type, guest.vmid) in held)


def pool_mapping(
    proposals: dict[str, Proposal], name: str | None, first: str
) -> tuple[dict[str, Proposal], FileChange | None]:
    """One cluster mapping for every node's vfio GPUs: each proposal without its own
    ``pci.cfg`` change, and the one change of the shared file (as ``first``, the node the member
    list was read from, reads it) that holds a ``map`` line for every node's vfio GPUs. Lines
    of the nodes not planned (offline) and the mapping's other keys stay as they are.

    :raises RenderError: when the shared file holds lines Proxmox cannot read.
    """
    if name is None or first not in proposals:
        return proposals, None
    before = proposals[first].inventory.guest_configs.get(PCI_MAPPING)
    mapping = PciMappingConfig.parse(before or "")
    existing = mapping.entries(name) if name in mapping.ids() else []
    merged = list(existing)
    for node, proposal in proposals.items():
        moved = (a for g in proposal.plan.groups if g.role.moves_to_vfio for a in g.gpus)
        gpus = [proposal.inventory.gpu(a) for a in moved]
        if gpus:
            merged = with_node_maps(merged, map_entries(gpus, node), node)
    if merged != existing:
        mapping.set_entries(name, merged)
    own = {
        node: Proposal(p.inventory, p.plan, _without(p.changes, PCI_MAPPING))
        for node, p in proposals.items()
    }
    why = f"PCI mapping {name}: every node's vfio GPUs"
    return own, FileChange(path=PCI_MAPPING, before=before, after=mapping.render(), why=why)


def _without(changes: ChangeSet, path: str) -> ChangeSet:
    return changes.model_copy(update={"files": [f for f in changes.files if f.path != path]})


def with_change(changes: ChangeSet, change: FileChange) -> ChangeSet:
    """``changes`` with ``change`` first (a mapping before the VM configs that name it)."""
    return changes.model_copy(update={"files": [change, *_without(changes, change.path).files]})
