"""The change-request report: one self-contained HTML file per split, one section per host.

Everything is inline (the SVG, the CSS); there is no script, no font, no link to anywhere, so the
file can be attached to a ticket, opened offline and printed. A refused plan still gets its
section: the picture of the host as it is, and each refusal with what to do about it.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> html = render_report([HostReport(inspect(DirectoryHost("examples/hosts/ct200")))])
>>> html.startswith("<!DOCTYPE html>"), "http" in html
(True, False)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from proxgpu.errors import PlanRefusedError, ProxgpuError, RenderError
from proxgpu.host.base import Host
from proxgpu.inspection.inventory import Inventory
from proxgpu.paths import guest_label, guest_of
from proxgpu.picture.layout import lay_out_parts
from proxgpu.picture.svg import render_svg
from proxgpu.picture.topology import assignments
from proxgpu.pipeline import Proposal, plan_inventory, read_holdings
from proxgpu.pipeline.documents import shown
from proxgpu.planning.model import Plan, PlanGroup
from proxgpu.planning.policy import SplitPolicy
from proxgpu.planning.userspace import next_steps
from proxgpu.planning.wording import join, mig_list, vgpu_list
from proxgpu.redact import redact_secrets
from proxgpu.rendering import RenderOptions
from proxgpu.rendering.changes import ChangeSet, FileChange, unified_diff
from proxgpu.rendering.templating import render_markup
from proxgpu.version import version


@dataclass(frozen=True)
class ReportedRefusal:
    """One reason a plan was refused, in plain words, with what to do about it.

    >>> ReportedRefusal(what="IOMMU is off", fix="turn it on").fix
    'turn it on'
    """

    what: str
    fix: str


@dataclass(frozen=True)
class HostReport:
    """What the report says about one host: its inventory, and the plan with its changes, or why
    there is none (``refusals``, or ``error`` for a plan that could not be rendered)."""

    inventory: Inventory
    plan: Plan | None = None
    changes: ChangeSet | None = None
    refusals: list[ReportedRefusal] = field(default_factory=list)
    error: str | None = None
    #: The error ``error`` says, as ``plan`` reports it (its exit code, path and fix).
    failure: ProxgpuError | None = None
    #: The commands a change ticket names, as ``(what, command)``: how to apply this plan,
    #: verify it and roll it back on this host (the command line's; none from the library).
    commands: tuple[tuple[str, str], ...] = ()


def plan_report(
    inventory: Inventory,
    policy: SplitPolicy | None = None,
    options: RenderOptions | None = None,
    *,
    host: Host | None = None,
) -> HostReport:
    """Plan and render the split of ``inventory`` for the report; a refused plan (or one that
    cannot be rendered) gives a report of the host as it is, with the reasons. With the
    ``host`` it was read from, the plan says what each container holds of NVIDIA's user space,
    as ``plan`` does.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> inventory = inspect(DirectoryHost("examples/hosts/ct200"))
    >>> plan_report(inventory, SplitPolicy(lxc=200, vms=[(300, None)])).plan is not None
    True
    >>> plan_report(inventory, SplitPolicy(lxc=5)).refusals[0].what
    'guest 5 cannot exist: Proxmox VMIDs run from 100 to 999999999'
    """
    try:
        plan, changes = plan_inventory(inventory, policy, options)
    except (PlanRefusedError, RenderError) as exc:
        return host_report(inventory, exc)
    if host is not None:
        plan = read_holdings(host, inventory, plan)
    return host_report(inventory, Proposal(inventory, plan, changes))


def host_report(inventory: Inventory, found: Proposal | ProxgpuError) -> HostReport:
    """The report of a host read, from what planning it found: its plan, the refusals, or the
    error that left no plan (a cluster's node comes so from :func:`~proxgpu.fleet.plan_cluster`).

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> missing = RenderError("pve1", "/etc/pve/lxc/201.conf", "no such container config")
    >>> host_report(inspect(DirectoryHost("examples/hosts/ct200")), missing).failure.exit_code
    16
    """
    if isinstance(found, PlanRefusedError):
        return HostReport(
            inventory, refusals=[ReportedRefusal(p.what, p.fix) for p in found.problems]
        )
    if isinstance(found, ProxgpuError):
        return HostReport(inventory, error=str(found), failure=found)
    return HostReport(inventory, found.plan, found.changes)


@dataclass(frozen=True)
class ClusterHeader:
    """What a cluster's report says once, before its nodes: the cluster's line (name, quorum,
    nodes online and skipped) and the cluster-wide mapping's one change, as ``plan --cluster``
    shows them."""

    summary: str
    mapping: FileChange | None = None
    mapping_name: str | None = None


@dataclass(frozen=True)
class UnreadHost:
    """A host the report could not read (unreachable, refused its key...): its section says
    why, so a report of a fleet never hides the hosts missing from it."""

    name: str
    error: str


def render_report(
    hosts: Sequence[HostReport | UnreadHost],
    *,
    title: str = "GPU split",
    generated: str | None = None,
    cluster: ClusterHeader | None = None,
) -> str:
    """The HTML report of ``hosts``; secrets in guest configs are redacted in every diff.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> report = HostReport(inspect(DirectoryHost("examples/hosts/ct200")),
    ...                     refusals=[ReportedRefusal(what="<no IOMMU>", fix="turn it on")])
    >>> "&lt;no IOMMU&gt;" in render_report([report])
    True
    """
    sections = [
        {"host": h.name, "unread": h.error} if isinstance(h, UnreadHost) else _section(h)
        for h in hosts
    ]
    head = None
    if cluster is not None:
        mapping = cluster.mapping
        diffs = _diffs(ChangeSet(host="cluster", files=[mapping])) if mapping is not None else []
        head = {"summary": cluster.summary, "mapping": cluster.mapping_name, "diffs": diffs}
    return render_markup(
        "report.html.j2",
        title=title,
        generated=generated,
        sections=sections,
        cluster=head,
        version=version(),
    )


def _section(host: HostReport) -> dict[str, Any]:
    inventory = host.inventory
    roles = assignments(host.plan) if host.plan is not None else None
    changes = shown(host.changes) if host.changes is not None else None
    warnings = [*inventory.warnings]
    notes: list[str] = []
    if host.plan is not None:
        warnings += host.plan.warnings
        notes += host.plan.notes
    if changes is not None:
        warnings += changes.warnings
        notes += changes.notes
    head, columns = lay_out_parts(inventory, roles)
    return {
        "host": inventory.hostname,
        "unread": None,
        "legend": Markup(render_svg(head, standalone=False)),
        "columns": [Markup(render_svg(column, standalone=False)) for column in columns],
        "planned": host.plan is not None,
        "summary": [_group_sentence(g) for g in host.plan.groups] if host.plan else [],
        "refusals": [
            ReportedRefusal(redact_secrets(r.what), redact_secrets(r.fix)) for r in host.refusals
        ],
        "error": None if host.error is None else redact_secrets(host.error),
        "warnings": list(dict.fromkeys(redact_secrets(w) for w in warnings)),
        "notes": list(dict.fromkeys(redact_secrets(n) for n in notes)),
        "next_steps": next_steps(host.plan.userspace) if host.plan else [],
        "tensor_parallel": host.plan.advice_by_guests() if host.plan else [],
        "enable_iommu": bool(host.plan and host.plan.enable_iommu),
        "diffs": _diffs(changes) if changes is not None else [],
        "actions": changes.actions if changes is not None else [],
        "reboot": bool(changes and changes.reboot_required),
        "changed": bool(changes and changes.changed),
        "source": _source(inventory.source),
        "to_stop": _guests_changed(changes) if changes is not None else [],
        "commands": host.commands,
    }


def _source(source: str) -> str:
    """Where the host data came from, in words.

    >>> _source("dir:/srv/snap/pve1"), _source("root@pve1")
    ('the directory /srv/snap/pve1 (a snapshot: the host as it was captured)', 'root@pve1')
    """
    if source.startswith("dir:"):
        return f"the directory {source[4:]} (a snapshot: the host as it was captured)"
    return source


def _guests_changed(changes: ChangeSet) -> list[str]:
    """The guests whose configs the change rewrites (``CT 200``, ``VM 300``): to stop before
    applying, as apply checks, and to start again after.

    >>> _guests_changed(ChangeSet(host="h", files=[
    ...     FileChange(path="/etc/pve/qemu-server/300.conf", before="a", after="b", why=""),
    ...     FileChange(path="/etc/pve/lxc/200.conf", before="a", after="b", why="")]))
    ['CT 200', 'VM 300']
    """
    paths = [f.path for f in changes.changed_files()]
    guests = sorted(
        (guest, label) for p in paths if (guest := guest_of(p)) and (label := guest_label(p))
    )
    return [label for _, label in guests]


def _group_sentence(group: PlanGroup) -> str:
    """One plan group in plain words.

    >>> _group_sentence(PlanGroup(role="vfio", numa_node=1, gpus=["a", "b"], functions=[],
    ...                           cpus="32-63", memory_nodes=[1], driver="vfio-pci",
    ...                           guest={"type": "vm", "vmid": 300}))
    'NUMA node 1: 2 GPUs go to vfio-pci for VM 300, pinned to CPUs 32-63 and memory node 1.'
    """
    node = group.node_label
    count = f"{len(group.gpus)} GPU{'s' * (len(group.gpus) != 1)}"
    one = len(group.gpus) == 1
    if group.role.moves_to_vfio:
        action = f"{'goes' if one else 'go'} to vfio-pci"
    else:
        action = f"{'stays' if one else 'stay'} on {group.driver}"
    if group.vgpus:
        target = f"for vGPUs of {vgpu_list(group.vgpus)}"
    elif group.mig:
        target = f"for MIG instances of it: {mig_list(group.mig)}"
    elif group.guest is None:
        target = "for no guest yet"
    else:
        target = f"for {join(guest.label for guest in group.guests)}"
    memory = ",".join(str(n) for n in group.memory_nodes) or "?"
    nodes = "node" if len(group.memory_nodes) == 1 else "nodes"
    pinning = f"pinned to CPUs {group.cpus} and memory {nodes} {memory}"
    return f"{node}: {count} {action} {target}, {pinning}."


def _diffs(changes: ChangeSet) -> list[dict[str, Any]]:
    return [
        {
            "path": change.path,
            "why": change.why,
            "state": "new file"
            if change.before is None
            else "removed"
            if change.after is None
            else "changed",
            "hunks": _hunks(unified_diff(change).splitlines()),
        }
        for change in changes.changed_files()
    ]


def _hunks(lines: list[str]) -> list[list[tuple[str, str]]]:
    """A diff's lines with their style, cut into hunks (a page breaks between them, never
    through one); the file header goes with the first.

    >>> diff = ["--- a", "+++ b", "@@ -1 +1 @@", "-x", "+y", "@@ -9 +9 @@", " z"]
    >>> [len(hunk) for hunk in _hunks(diff)]
    [5, 2]
    """
    hunks: list[list[tuple[str, str]]] = []
    for line in lines:
        css = _line_css(line)
        if not hunks or (css == "hunk" and any(c != "head" for c, _ in hunks[-1])):
            hunks.append([])
        hunks[-1].append((css, line))
    return hunks


def _line_css(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "head"
    return {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "ctx")
