"""The whole job in one call, for scripts, and the JSON documents every front end prints.

:func:`split_host` inspects, plans, renders and applies (or only checks); Ansible-style scripts
and the Ansible module use it. The command line runs the same steps through :func:`propose` so
that it can show the plan before asking. The documents (:func:`plan_document`,
:func:`apply_document`, and :func:`~proxgpu.inspection.document.inventory_document`, which lives
with inspection so that ``inspect`` loads no planner) are the JSON contracts of ``--json`` and of
the Ansible module; secrets in guest configs are redacted in every one of them (:func:`shown`).

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.planning import SplitPolicy
>>> result = split_host(DirectoryHost("examples/hosts/ct200"),
...                     SplitPolicy(lxc=200, vms=[(300, None)]), check=True)
>>> result.changed, len(result.diff)
(True, 10)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from proxgpu.apply import (
    ApplyOptions,
    ApplyResult,
    JournalEntry,
    Progress,
    RollbackResult,
    read_journal,
    signing,
    verify,
)
from proxgpu.apply.journal import select_entry
from proxgpu.apply.layout import Layout
from proxgpu.apply.remote import read_files, sha
from proxgpu.apply.verify import driver_drift
from proxgpu.errors import SysfsError, UsageError
from proxgpu.host import Host
from proxgpu.inspection import GpuFilter, Inventory, inspect
from proxgpu.paths import MEMBERS, PCI_MAPPING, guest_config
from proxgpu.planning import Plan, SplitPolicy, plan_split
from proxgpu.pve.cluster import ClusterMembers, parse_members
from proxgpu.pve.mapping import PciMappingConfig, with_node_maps
from proxgpu.redact import redact_secrets
from proxgpu.rendering import RenderOptions, render
from proxgpu.rendering.changes import ChangeSet, FileChange
from proxgpu.rendering.context import require_guests
from proxgpu.rendering.vm import map_entries


class Proposal(NamedTuple):
    """What a host needs for a split: its inventory, the plan and the rendered change set."""

    inventory: Inventory
    plan: Plan
    changes: ChangeSet


def propose(
    host: Host,
    policy: SplitPolicy | None = None,
    options: RenderOptions | None = None,
    gpu_filter: GpuFilter | None = None,
) -> Proposal:
    """Inspect ``host``, plan the split and render it; nothing is written.

    :raises ProxgpuError: when the host cannot be read or the plan is refused.
    """
    inventory = inspect(host, gpu_filter)
    return Proposal(inventory, *plan_inventory(inventory, policy, options))


def plan_inventory(
    inventory: Inventory, policy: SplitPolicy | None = None, options: RenderOptions | None = None
) -> tuple[Plan, ChangeSet]:
    """Plan the split of an inventory already read, and render it; nothing is written.

    >>> from proxgpu.host import DirectoryHost
    >>> plan, changes = plan_inventory(inspect(DirectoryHost("examples/hosts/ct200")),
    ...                                SplitPolicy(lxc=200, vms=[(300, None)]))
    >>> [group.role for group in plan.groups], changes.changed
    (['host', 'vfio'], True)

    :raises RenderError: when a guest the policy names has no config (before any refusal), or
        the plan cannot be rendered; PlanRefusedError when the planner refuses.
    """
    policy = policy or SplitPolicy()
    if options is not None:
        # The planner checks the other containers' entries against the minors this binding
        # gives the kept GPUs at the next boot.
        policy = policy.model_copy(update={"bind_method": options.bind_method})
    if options is not None and options.mapping and policy.mapping is None:
        # The planner checks that the mapping can be written (the IOMMU groups it needs).
        policy = policy.model_copy(update={"mapping": options.mapping})
    # A mistyped VMID is said first: the plan's refusals would otherwise hide it.
    require_guests(inventory, policy.guests)
    plan = plan_split(inventory, policy)
    return plan, render(inventory, plan, options)


def read_members(host: Host) -> ClusterMembers:
    """The cluster ``host`` belongs to, from its ``/etc/pve/.members`` (one command).

    >>> from proxgpu.host import DirectoryHost
    >>> members = read_members(DirectoryHost("examples/hosts/cluster-3/pve1"))
    >>> members.name, [m.name for m in members.online()]
    ('gpu-lab', ['pve1', 'pve2', 'pve3'])

    :raises SysfsError: when the file is missing or is not pmxcfs' member list.
    """
    (data,) = read_files(host, [Layout.of(host).on_host(MEMBERS)])
    if data is None:
        raise SysfsError(
            host.name,
            MEMBERS,
            "missing",
            "pmxcfs writes it on every cluster member: plan a node on its own without "
            "--cluster; on a member, check the cluster (`pvecm status`) and pmxcfs "
            "(`systemctl status pve-cluster`)",
        )
    return parse_members(data.decode("utf-8", "replace"), host.name)


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

    def ct(vmid: int) -> bool:
        return guest_config("lxc", vmid) in held

    def vm(vmid: int) -> bool:
        return guest_config("vm", vmid) in held

    subsets = [(vmid, n) for vmid, n in policy.lxc_subsets if ct(vmid)]
    on_nodes = [spec for spec in policy.lxc_nodes if ct(spec[0])]
    mig = [spec for spec in policy.lxc_mig if ct(spec.vmid)]
    own = {vmid for vmid, _ in subsets} | {spec[0] for spec in on_nodes} | {m.vmid for m in mig}
    shared = [vmid for vmid in policy.containers if ct(vmid) and vmid not in own]
    update = {
        "lxc": shared[0] if shared else None,
        "shared_lxc": shared[1:],
        "lxc_subsets": subsets,
        "lxc_nodes": on_nodes,
        "lxc_mig": mig,
        "vms": [(vmid, n) for vmid, n in policy.vms if vm(vmid)],
        "vgpus": [(vmid, kind) for vmid, kind in policy.vgpus if vm(vmid)],
    }
    return policy.model_copy(update=update)


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
    for node, (inventory, plan, _) in proposals.items():
        gpus = [inventory.gpu(a) for g in plan.groups if g.role.moves_to_vfio for a in g.gpus]
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


@dataclass(frozen=True)
class SplitResult:
    """Everything one run found, decided and did."""

    inventory: Inventory
    plan: Plan
    changes: ChangeSet
    applied: ApplyResult

    @property
    def changed(self) -> bool:
        """Whether the host needed (with ``check``) or got changes."""
        return self.applied.changed

    @property
    def diff(self) -> list[dict[str, str]]:
        """The file changes in Ansible's before/after format, secrets redacted."""
        return self.shown.ansible_diff()

    @property
    def shown(self) -> ChangeSet:
        """The changes for display: secrets in guest configs redacted (never write these)."""
        return shown(self.changes)

    def document(self) -> dict[str, Any]:
        """The run as ``apply --json`` prints it (``plan``, ``result``, ``diff``)."""
        return apply_document(self.plan, self.applied, self.changes)

    def plan_document(self) -> dict[str, Any]:
        """The plan as ``plan --json`` prints it for the host as this run found it, with
        ``changes`` and ``reboot_pending`` (see :func:`plan_document`)."""
        return plan_document(self.plan, self.changes, self.inventory)

    @property
    def actions(self) -> list[list[str]]:
        """The follow-up commands, run or (with ``check`` or on a directory tree) listed."""
        return [action.argv for action in self.changes.actions]


def split_host(
    host: Host,
    policy: SplitPolicy | None = None,
    options: RenderOptions | None = None,
    *,
    check: bool = True,
    live: bool = False,
    gpu_filter: GpuFilter | None = None,
    skip_guest_check: bool = False,
    progress: Progress | None = None,
    how: ApplyOptions | None = None,
) -> SplitResult:
    """Inspect ``host``, plan the split, render it and apply it, or with ``check`` only say what
    would change (the default: nothing is written unless asked). ``how`` says how the apply runs
    (the one type the command line and Ansible pass too); given, it replaces ``check``,
    ``live`` and ``skip_guest_check``, which are its shorthand.

    >>> from proxgpu.host import DirectoryHost
    >>> tree = DirectoryHost("examples/hosts/ct200")
    >>> split_host(tree, SplitPolicy(lxc=200), how=ApplyOptions(dry_run=True)).changed
    True

    :raises ProxgpuError: when the host cannot be read, the plan is refused, or applying fails
        (everything written is then restored).
    """
    proposal = propose(host, policy, options, gpu_filter)
    how = how or ApplyOptions(dry_run=check, live=live, skip_guest_check=skip_guest_check)
    applied = how.apply(
        host, proposal.changes, plan=proposal.plan, inventory=proposal.inventory, progress=progress
    )
    return SplitResult(proposal.inventory, proposal.plan, proposal.changes, applied)


def reboot_awaited(host: Host, result: SplitResult) -> bool:
    """Whether ``host`` must still reboot for the split to take effect: this run's change needs
    it, or the last apply did and the host has not booted since (its boot id is the one the
    apply recorded) while a function is not on its planned driver yet. So a play that stopped
    before its reboot is finished by the next run, and a rebooted host is not asked again; a
    rolled-back apply awaits nothing.

    >>> from proxgpu.host import DirectoryHost
    >>> tree = DirectoryHost("examples/hosts/ct200")
    >>> reboot_awaited(tree, split_host(tree, SplitPolicy(lxc=200), check=True))
    True
    """
    if result.changed:
        return result.changes.reboot_required
    entries = read_journal(host, latest=()).entries  # the newest entry alone
    if not entries or entries[-1].status != "applied":
        return False
    return bool(verify(host, entries[-1], inventory=result.inventory).pending_reboot)


@dataclass(frozen=True)
class Undone:
    """An undo of the last apply (:func:`undo`): the journal entry it rolled back (or, as a dry
    run, would roll back; ``None``: nothing to), each file as it was and as the rollback left
    it (would leave it), and the rollback's own result (``None`` for a dry run or nothing)."""

    journal_id: str | None
    changes: ChangeSet
    rolled_back: RollbackResult | None = None

    @property
    def changed(self) -> bool:
        """Whether an entry was (or, as a dry run, would be) rolled back."""
        return self.journal_id is not None

    @property
    def diff(self) -> list[dict[str, str]]:
        """The file changes in Ansible's before/after format, secrets redacted."""
        return shown(self.changes).ansible_diff()


def undo(
    host: Host,
    to: str | None = None,
    *,
    options: ApplyOptions | None = None,
    progress: Progress | None = None,
) -> Undone:
    """Roll back journal entry ``to``, or the last apply while it is still in effect, so that a
    second undo changes nothing (unlike ``proxgpu rollback``, which then goes on to the apply
    before it); a failed apply restored everything itself and is passed over. ``options``
    says how, as for the rollback (:meth:`ApplyOptions.rollback`): ``dry_run`` only says what
    would be restored, ``force`` writes every backup back, ``live`` also returns the functions
    the apply rebound, ``break_lock`` takes over a lock left behind.

    >>> from proxgpu.host import DirectoryHost
    >>> undo(DirectoryHost("examples/hosts/ct200"), options=ApplyOptions(dry_run=True)).changed
    False

    :raises FileChangedError: when an entry of the apply changed since (unless ``force``),
        also as a dry run; otherwise as :func:`proxgpu.apply.rollback` does.
    """
    options = options or ApplyOptions()
    entry = undo_target(host, to)
    if entry is None:
        return Undone(None, ChangeSet(host=host.name))
    planned = replace(options, dry_run=True).rollback(host, entry.id)
    assert planned.preview is not None  # an entry was named
    preview = planned.preview
    if options.dry_run:
        return Undone(entry.id, preview)
    done = options.rollback(host, entry.id, progress=progress)
    after = _read(host, [f.path for f in preview.files])
    files = [
        f.model_copy(update={"after": _text(data)})
        for f, data in zip(preview.files, after, strict=True)
    ]
    return Undone(entry.id, preview.model_copy(update={"files": files}), done)


def undo_target(host: Host, to: str | None = None) -> JournalEntry | None:
    """The entry :func:`undo` rolls back: ``to``, or the newest apply that did not fail, while
    it is applied (or left unfinished); ``None`` when it was rolled back already.

    :raises UsageError: when there is no entry ``to``.
    """
    journal = read_journal(host, to=to, latest=("applied", "in-progress", "rolled-back"))
    if to is not None:
        entry = select_entry(host, journal, to, latest=())
        candidates = [] if entry is None else [entry]
    else:
        candidates = [e for e in journal.entries if e.status != "failed"][-1:]
    return next((e for e in candidates if e.status in ("applied", "in-progress")), None)


def _read(host: Host, paths: list[str]) -> list[bytes | None]:
    """The files' bytes on ``host`` (``None``: absent), in one command."""
    layout = Layout.of(host)
    return read_files(host, [layout.on_host(path) for path in paths]) if paths else []


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")


def shown(changes: ChangeSet) -> ChangeSet:
    """``changes`` with secrets in guest configs redacted: for showing, never for writing.

    >>> from proxgpu.rendering.changes import FileChange
    >>> change = FileChange(path="/etc/pve/qemu-server/300.conf", before="cipassword: x\\n",
    ...                     after="cipassword: x\\nnuma: 1\\n")
    >>> shown(ChangeSet(host="h", files=[change])).files[0].after
    'cipassword: <redacted by proxgpu>\\nnuma: 1\\n'
    """
    files = [
        f.model_copy(
            update={
                "before": None if f.before is None else redact_secrets(f.before),
                "after": None if f.after is None else redact_secrets(f.after),
            }
        )
        for f in changes.files
    ]
    return changes.model_copy(update={"files": files})


def plan_document(
    plan: Plan, changes: ChangeSet, inventory: Inventory | None = None
) -> dict[str, Any]:
    """The plan and its changes as ``plan --json`` prints it (see the README's contract); with
    the ``inventory`` the plan was made from, ``reboot_pending`` too (:func:`reboot_pending`).

    >>> from proxgpu.host import DirectoryHost
    >>> tree = DirectoryHost("examples/hosts/ct200")
    >>> result = split_host(tree, SplitPolicy(lxc=200), check=True)
    >>> document = plan_document(result.plan, result.changes, result.inventory)
    >>> document["changes"]["changed"], document["reboot_pending"]
    (True, [])
    """
    visible = shown(changes)
    document = plan.model_dump(mode="json")
    document["changes"] = {
        **visible.model_dump(mode="json"),
        "changed": changes.changed,
        "summary": changes.summary(),
        "diff": visible.ansible_diff(),
    }
    if inventory is not None:
        document["reboot_pending"] = reboot_pending(inventory, plan, changes)
    return document


def reboot_pending(inventory: Inventory, plan: Plan, changes: ChangeSet) -> list[str]:
    """The functions not on their planned driver yet while every file already matches the plan
    (applied, not yet rebooted): ``plan --json``'s ``reboot_pending``. While files still change,
    the drivers are the apply's business, not pending: ``[]``."""
    return [] if changes.changed else driver_drift(inventory, plan, explain=False)


def apply_document(plan: Plan, result: ApplyResult, changes: ChangeSet) -> dict[str, Any]:
    """An apply as ``apply --json`` prints it: the plan, what was done, the diff."""
    return {
        "plan": plan.model_dump(mode="json"),
        "result": result.model_dump(mode="json"),
        "diff": shown(changes).ansible_diff(),
    }


#: What a saved plan file says it is, so that no other JSON is taken for one.
PLAN_FILE_KIND = "proxgpu-plan"
PLAN_FILE_VERSION = 1


class SavedPlan(NamedTuple):
    """A plan saved by ``plan --out``: the host it was made for, the plan, its change set."""

    host: str
    plan: Plan
    changes: ChangeSet


def save_plan(
    path: str, host: str, plan: Plan, changes: ChangeSet, *, key: bytes | None = None
) -> None:
    """Write a plan file for :func:`load_plan` (``terraform plan -out``): the plan, every file's
    text as read and as planned, and the SHA-256 of each as read, so that applying it refuses a
    file changed since. It holds guest configs, secrets included: it is made readable by the
    owner only. It is signed with the admin's key (``key``: that one; see
    :mod:`proxgpu.apply.signing`), over the host's name and the hashes of the files read too.
    """
    unsigned = {
        "kind": PLAN_FILE_KIND,
        "schema_version": PLAN_FILE_VERSION,
        "host": host,
        "sha256_before": {f.path: sha(f.before) for f in changes.files},
        "plan": plan.model_dump(mode="json"),
        "changes": changes.model_dump(mode="json"),
    }
    document = signing.sign(unsigned, key if key is not None else signing.load_key())
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=2)
        out.write("\n")


def load_plan(path: str, *, trust_unsigned: bool = False, key: bytes | None = None) -> SavedPlan:
    """Read a plan file written by :func:`save_plan`, signed with the admin's key (``key``:
    that one) unless ``trust_unsigned``.

    :raises UsageError: when it is not one, its signature is missing or wrong, or its texts no
        longer match their hashes.
    """
    try:
        with open(path, encoding="utf-8") as source:
            document = json.load(source)
        if document.get("kind") != PLAN_FILE_KIND:
            raise ValueError("not a proxgpu plan file")
        if document.get("schema_version") != PLAN_FILE_VERSION:
            raise ValueError(f"plan file version {document.get('schema_version')} is not 1")
        problem = None if trust_unsigned else signing.check(document, key or signing.load_key())
        if problem is not None:
            raise ValueError(
                f"{problem}; refused: save it again with `proxgpu plan --out` on this machine, "
                "or pass --trust-unsigned if you have checked it by hand"
            )
        saved = SavedPlan(
            host=str(document["host"]),
            plan=Plan.model_validate(document["plan"]),
            changes=ChangeSet.model_validate(document["changes"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: {exc}") from None
    hashes = document.get("sha256_before", {})
    for change in saved.changes.files:
        if hashes.get(change.path) != sha(change.before):
            raise UsageError(f"{path}: the saved text of {change.path} does not match its hash")
    return saved
