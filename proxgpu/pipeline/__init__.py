"""The whole job in one call, for scripts: :func:`split_host` inspects, plans, renders and
applies (or only checks); Ansible-style scripts and the Ansible module use it. The command line
runs the same steps through :func:`propose` so that it can show the plan before asking.

Beside it, one module a job: :mod:`~proxgpu.pipeline.documents` (the JSON documents every
front end prints), :mod:`~proxgpu.pipeline.saved` (the saved-plan file of ``plan --out``) and
:mod:`~proxgpu.pipeline.undoing` (undoing the last apply); a cluster's own steps are
:mod:`proxgpu.fleet`'s.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.planning import SplitPolicy
>>> result = split_host(DirectoryHost("examples/hosts/ct200"),
...                     SplitPolicy(lxc=200, vms=[(300, None)]))
>>> result.changed, len(result.diff)
(True, 10)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxgpu.apply import (
    CHECK_ONLY,
    ApplyOptions,
    ApplyResult,
    Progress,
    apply_changes,
    read_journal,
    verify,
)
from proxgpu.host import Host
from proxgpu.inspection import GpuFilter, Inventory, inspect
from proxgpu.inspection.containerlibs import read_container_libs
from proxgpu.pipeline.documents import apply_document, plan_document, shown
from proxgpu.planning import Plan, SplitPolicy, plan_split
from proxgpu.planning.userspace import holding
from proxgpu.rendering import RenderOptions, render
from proxgpu.rendering.changes import ChangeSet
from proxgpu.rendering.context import require_guests


@dataclass(frozen=True)
class Proposal:
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
    plan, changes = plan_inventory(inventory, policy, options)
    return Proposal(inventory, read_holdings(host, inventory, plan), changes)


def read_holdings(host: Host, inventory: Inventory, plan: Plan) -> Plan:
    """``plan`` with what each container that needs NVIDIA's user space holds now, read from
    ``host`` in one more script run, made only when some container needs it.

    >>> from proxgpu.host import DirectoryHost
    >>> tree = DirectoryHost("examples/hosts/ct200")
    >>> inventory = inspect(tree)
    >>> plan, _ = plan_inventory(inventory, SplitPolicy(lxc=200))
    >>> [need.holds.state for need in read_holdings(tree, inventory, plan).userspace]
    ['stopped']
    """
    if not plan.userspace:
        return plan
    found = read_container_libs(host, inventory, [need.vmid for need in plan.userspace])
    return plan.model_copy(update={"userspace": holding(plan.userspace, found)})


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
    how: ApplyOptions = CHECK_ONLY,
    gpu_filter: GpuFilter | None = None,
    progress: Progress | None = None,
) -> SplitResult:
    """Inspect ``host``, plan the split, render it and apply it as ``how`` says (the one type
    the command line and Ansible pass too). By default only a dry run: it says what would
    change and writes nothing; ``how=ApplyOptions()`` applies.

    >>> from proxgpu.host import DirectoryHost
    >>> tree = DirectoryHost("examples/hosts/ct200")
    >>> checked = split_host(tree, SplitPolicy(lxc=200))
    >>> checked.changed, checked.applied.dry_run
    (True, True)

    :raises ProxgpuError: when the host cannot be read, the plan is refused, or applying fails
        (everything written is then restored).
    """
    proposal = propose(host, policy, options, gpu_filter)
    applied = apply_changes(
        host,
        proposal.changes,
        how,
        plan=proposal.plan,
        inventory=proposal.inventory,
        progress=progress,
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
    >>> reboot_awaited(tree, split_host(tree, SplitPolicy(lxc=200), ))
    True
    """
    if result.changed:
        return result.changes.reboot_required
    entries = read_journal(host, latest=()).entries  # the newest entry alone
    if not entries or entries[-1].status != "applied":
        return False
    return bool(verify(host, entries[-1], inventory=result.inventory, guests=False).pending_reboot)
