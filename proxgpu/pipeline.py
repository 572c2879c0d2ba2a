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

from proxgpu.changes import ChangeSet
from proxgpu.hosts import Host
from proxgpu.inspection import GpuFilter, inspect
from proxgpu.inventory import Inventory
from proxgpu.planning import Plan, SplitPolicy, plan_split
from proxgpu.rendering import RenderOptions, render
from proxgpu.transaction import ApplyResult, Progress, apply_changes


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
    inventory = inspect(host, gpu_filter)
    plan = plan_split(inventory, policy)
    changes = render(inventory, plan, options)
    applied = apply_changes(
        host,
        changes,
        plan=plan,
        dry_run=check,
        live=live,
        progress=progress,
        inventory=inventory,
        skip_guest_check=skip_guest_check,
    )
    return SplitResult(inventory=inventory, plan=plan, changes=changes, applied=applied)
