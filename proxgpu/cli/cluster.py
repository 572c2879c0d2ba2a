"""``--cluster``: every online node of a Proxmox VE cluster, as a fleet keyed by node name.

The members come from ``/etc/pve/.members`` on the one host given (``--host``, this machine, or
a cluster snapshot's tree with ``--root``); each online node is reached over SSH at its member
address with the first host's user, port and SSH options (or, in a snapshot, read from its own
tree ``DIR/NODE``); an offline node is reported and skipped. Each node is planned with the
guests it holds (VMIDs are unique in a cluster).

``plan`` and ``apply`` plan every node before anything is written: a node that cannot be
planned stops an apply before any node changes. With ``--mapping NAME``, one cluster PCI
mapping holds every node's vfio GPUs; it is shown once, and written once, with the first node's
apply (its journal entry keeps it, its rollback puts it back): through the Proxmox API
(``/cluster/mapping/pci/NAME`` with the file's digest) on a live cluster, as the file in the
first node's tree in a snapshot.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxgpu.cli.fleet import Cluster, run_fleet
from proxgpu.cli.hosts import open_host
from proxgpu.cli.proposing import render_options, split_policy
from proxgpu.cli.setup import gpu_filter
from proxgpu.errors import ProxgpuError, UsageError
from proxgpu.host import Host
from proxgpu.host.ssh import parse_target
from proxgpu.inspection import inspect
from proxgpu.paths import MEMBERS
from proxgpu.pipeline import (
    Proposal,
    node_policy,
    plan_inventory,
    pool_mapping,
    read_members,
    with_change,
)
from proxgpu.pve.cluster import ClusterMembers
from proxgpu.rendering.changes import FileChange, unified_diff

#: The commands that plan every node first, so that the mapping is pooled and nothing changes
#: unless every node can be planned.
PLANNED = ("change:cmd_plan", "change:cmd_apply")


@dataclass
class Nodes:
    """A cluster's members and how each online node is reached: its own options (``host``,
    ``root``), the node the members were read from first."""

    members: ClusterMembers
    first: str
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    live: bool = True


def cmd_cluster(args: argparse.Namespace) -> int:
    """Run the command on every online node of the cluster; exit with the worst node's code."""
    if len(args.hosts) > 1:
        raise UsageError("--cluster takes one --host of the cluster (or --root of a snapshot)")
    nodes = cluster_nodes(args)
    own = argparse.Namespace(**{**vars(args), "handler": args.node_handler, "cluster": False})
    if args.node_handler == "commands:cmd_snapshot":
        from proxgpu.cli.snapshot import snapshot_cluster  # noqa: PLC0415 - this command only

        return snapshot_cluster(own, nodes)
    if own.fleet == "self":  # report: one file, a section per node
        for name, why in nodes.skipped.items():
            print(f"{name}: {why}", file=sys.stderr)
        own.targets = nodes.options
        return int(args.run_node(own))
    view = _view(nodes)
    if args.node_handler in PLANNED:
        view = _planned(own, nodes, view)
        if view.code and not view.options:
            return view.code
    return run_fleet(own, list(view.options), args.run_node, view)


def cluster_nodes(args: argparse.Namespace) -> Nodes:
    """The members of the cluster the given host (or snapshot) belongs to, and how to reach
    each online node.

    :raises SysfsError: when ``/etc/pve/.members`` is missing or unreadable.
    """
    if args.host is None and args.root is not None:
        return _snapshot_nodes(Path(args.root))
    with open_host(args) as host:
        members = read_members(host)
        live = host.is_live
    nodes = Nodes(members, members.nodename, live=live)
    for member in members.members:
        if not member.online:
            nodes.skipped[member.name] = "offline: skipped (not planned, not changed)"
        elif member.name == members.nodename:
            nodes.options[member.name] = {"host": args.host, "root": args.root}
        elif member.ip is None:
            nodes.skipped[member.name] = "no address in .members: skipped"
        else:
            root = None if args.root is None else _sibling(args.root, member.name)
            nodes.options[member.name] = {"host": _target(args.host, member.ip), "root": root}
    return _first_first(nodes)


def _target(first: str | None, ip: str) -> str:
    """``ip`` with the user and port of the first host's target, as SSH takes it."""
    user, _, port = (None, "", None) if first is None else parse_target(first)
    address = f"[{ip}]" if ":" in ip else ip
    return f"{user + '@' if user else ''}{address}{f':{port}' if port else ''}"


def _sibling(root: str, name: str) -> str:
    """A node's tree beside the first node's in a cluster snapshot on the remote host."""
    return posixpath.join(posixpath.dirname(root.rstrip("/")) or "/", name)


def _snapshot_nodes(root: Path) -> Nodes:
    """A cluster snapshot (``DIR/NODE/`` trees) or one node's tree in one."""
    member_file = MEMBERS.lstrip("/")
    if (root / member_file).is_file():
        top, first = root.parent, root.name
    else:
        top = root
        trees = sorted(p.name for p in root.iterdir() if (p / member_file).is_file())
        if not trees:
            raise UsageError(f"{root}: no NODE/{member_file} below: not a cluster snapshot")
        first = trees[0]
    with open_host(argparse.Namespace(host=None, root=str(top / first))) as host:
        members = read_members(host)
    nodes = Nodes(members, first, live=False)
    for member in members.members:
        if not member.online:
            nodes.skipped[member.name] = "offline: skipped (not planned, not changed)"
        elif not (top / member.name / member_file).is_file():
            nodes.skipped[member.name] = f"no tree {top / member.name} in the snapshot: skipped"
        else:
            nodes.options[member.name] = {"host": None, "root": str(top / member.name)}
    return _first_first(nodes)


def _first_first(nodes: Nodes) -> Nodes:
    """The first node first: it is read first, and a snapshot's mapping goes with its apply."""
    if nodes.first in nodes.options:
        nodes.options = {nodes.first: nodes.options[nodes.first], **nodes.options}
    return nodes


def _view(nodes: Nodes) -> Cluster:
    members = nodes.members
    online = [n for n in nodes.options]
    text = f"Cluster {members.name or '?'}: {len(online)} of {len(members.members)} nodes"
    text += f" ({', '.join(online) or 'none'})"
    text += "".join(f"; {name} {why}" for name, why in nodes.skipped.items())
    if not members.quorate:
        text += "; NOT QUORATE: /etc/pve is read-only until it is"
    document = {
        "name": members.name,
        "quorate": members.quorate,
        "members": [m.model_dump(mode="json") for m in members.members],
        "skipped": nodes.skipped,
    }
    return Cluster(nodes.options, text=text + "\n\n", document=document, skipped=nodes.skipped)


def _planned(args: argparse.Namespace, nodes: Nodes, view: Cluster) -> Cluster:
    """Plan every node first; pool the mapping; refuse to apply unless all could be planned."""
    if getattr(args, "out", None) or getattr(args, "plan", None):
        raise UsageError("--cluster plans every node afresh: leave out --out and --plan")
    with ThreadPoolExecutor(max_workers=max(1, args.forks)) as pool:
        names = list(view.options)
        found = dict(zip(names, pool.map(lambda n: _propose(args, n, view), names), strict=True))
    _check_guests(args, nodes, found)
    planned = {n: p for n, p in found.items() if isinstance(p, Proposal)}
    proposals, mapping = pool_mapping(planned, args.mapping, nodes.first)
    failed = [n for n, p in found.items() if not isinstance(p, Proposal)]
    applying = args.node_handler == "change:cmd_apply"
    options = {n: {**o, "proposal": proposals.get(n, found[n])} for n, o in view.options.items()}
    text, document = view.text, {**view.document}
    code = 2 if mapping and mapping.changed and args.detailed_exitcode else 0
    if mapping is not None:
        text += _mapping_text(args, nodes, mapping, applying and not failed)
        document["mapping"] = _mapping_document(args.mapping, mapping)
    if failed and applying:
        text += f"Nothing was applied: {', '.join(failed)} could not be planned.\n\n"
        shown = {"handler": "change:cmd_plan", "detailed_exitcode": False, "out": None}
        options = {n: {**o, **shown} for n, o in options.items()}
        code = max(code, 1)
    elif applying and mapping is not None and mapping.changed:
        _with_mapping(nodes, mapping, options)
        return Cluster(options, text, document, view.skipped, code, lead=nodes.first)
    return Cluster(options, text, document, view.skipped, code)


def _propose(args: argparse.Namespace, name: str, view: Cluster) -> Proposal | ProxgpuError:
    one = argparse.Namespace(**{**vars(args), **view.options[name]})
    try:
        with open_host(one) as host:
            inventory = inspect(host, gpu_filter(one))
            _same_name(host, inventory.node_name, name)
            policy = node_policy(split_policy(one), inventory)
            return Proposal(inventory, *plan_inventory(inventory, policy, render_options(one)))
    except ProxgpuError as exc:
        return exc


def _same_name(host: Host, hostname: str, name: str) -> None:
    if hostname != name:
        raise UsageError(
            f"{host.name}: its hostname is {hostname}, but {MEMBERS} calls it {name}: "
            "the mapping and guests would be another node's; check the member addresses"
        )


def _check_guests(args: argparse.Namespace, nodes: Nodes, found: Mapping[str, object]) -> None:
    held = {
        path
        for p in found.values()
        if isinstance(p, Proposal)
        for path in p.inventory.guest_configs
    }
    wanted = [("lxc", args.lxc)] if args.lxc else []
    wanted += [("qemu-server", spec.partition(":")[0]) for spec in args.vm]
    missing = [f"{vmid}" for kind, vmid in wanted if f"/etc/pve/{kind}/{vmid}.conf" not in held]
    # A node that could not be read may hold it: its own error says why, node by node.
    if missing and all(isinstance(p, Proposal) for p in found.values()):
        also = f" (not read: {', '.join(nodes.skipped)})" if nodes.skipped else ""
        raise UsageError(
            f"guest {', '.join(missing)} is on no node read{also}: check the VMID with "
            "`pvesh get /cluster/resources --type vm`"
        )


def _mapping_text(
    args: argparse.Namespace, nodes: Nodes, mapping: FileChange, applying: bool
) -> str:
    how = f"with {nodes.first}'s apply" + (", through the Proxmox API" if nodes.live else "")
    head = f"PCI mapping {args.mapping} ({mapping.path}), one for the whole cluster"
    if not mapping.changed:
        return f"{head}: no change.\n\n"
    verb = "is written" if applying else "would be written"
    diff = unified_diff(mapping, color=getattr(args, "use_color", False))
    return f"{head}, {verb} once, {how}:\n{diff}\n"


def _mapping_document(name: str, mapping: FileChange) -> dict[str, Any]:
    return {
        "name": name,
        "path": mapping.path,
        "changed": mapping.changed,
        "before": mapping.before,
        "after": mapping.after,
    }


def _with_mapping(nodes: Nodes, mapping: FileChange, options: dict[str, Any]) -> None:
    """The mapping goes first in the first node's change set, so that one transaction holds it:
    its journal entry and backup, its restore if that apply fails, its rollback. On a live
    cluster that apply writes it through the Proxmox API (``/cluster/mapping/pci/NAME`` with
    the file's digest), before the VM configs that name it; the first node is applied alone,
    before any other (:attr:`Cluster.lead`), so none names a mapping not written yet."""
    first = options.get(nodes.first)
    if first is None:
        raise UsageError(f"{nodes.first}, which holds the mapping, is not among the nodes run")
    proposal = first["proposal"]
    first["proposal"] = proposal._replace(changes=with_change(proposal.changes, mapping))
