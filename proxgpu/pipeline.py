"""The whole job in one call, for scripts: inspect, plan, render and apply (or only check).

Ansible-style scripts and the Ansible module in ``examples/ansible`` use this; the command line
runs the same steps one by one so that it can show the plan before asking.

>>> from proxgpu.hosts import DirectoryHost
>>> from proxgpu.planning import SplitPolicy
>>> result = split_host(DirectoryHost("examples/hosts/ct200"),  # doctest: +SKIP
...                     SplitPolicy(lxc=200, vms=[(300, None)]), check=True)
>>> result.changed, len(result.diff)  # doctest: +SKIP
(True, 6)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from proxgpu.changes import ChangeSet
from proxgpu.hosts import Host
from proxgpu.inspection import GpuFilter, inspect
from proxgpu.inventory import Inventory
from proxgpu.planning import Plan, SplitPolicy, plan_split
from proxgpu.rendering import RenderOptions, render
from proxgpu.transaction import ApplyResult, Progress, apply_changes


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
    plan = plan_split(inventory, policy)
    return Proposal(inventory, plan, render(inventory, plan, options))


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
        """The file changes in Ansible's before/after format."""
        return self.changes.ansible_diff()

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
) -> SplitResult:
    """Inspect ``host``, plan the split, render it and apply it, or with ``check`` only say what
    would change (the default: nothing is written unless asked).

    :raises ProxgpuError: when the host cannot be read, the plan is refused, or applying fails
        (everything written is then restored).
    """
    proposal = propose(host, policy, options, gpu_filter)
    applied = apply_changes(
        host,
        proposal.changes,
        plan=proposal.plan,
        dry_run=check,
        live=live,
        progress=progress,
        inventory=proposal.inventory,
        skip_guest_check=skip_guest_check,
    )
    return SplitResult(proposal.inventory, proposal.plan, proposal.changes, applied)
