"""How a change runs, as one type for the command line, the library and both Ansible front
ends: the options of an apply and of its rollback (:class:`ApplyOptions`).

>>> from proxgpu.host import DirectoryHost
>>> ApplyOptions(dry_run=True).rollback(DirectoryHost("examples/hosts/ct200")).journal_id is None
True
"""

from __future__ import annotations

from dataclasses import dataclass

from proxgpu.apply.actions import ACTION_TIMEOUT
from proxgpu.apply.remote import Progress
from proxgpu.apply.result import ApplyResult
from proxgpu.apply.rollback import RollbackResult, rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.host.base import Host
from proxgpu.inspection import Inventory
from proxgpu.planning import Plan
from proxgpu.rendering.changes import ChangeSet


@dataclass(frozen=True)
class ApplyOptions:
    """How an apply, or the rollback of one, runs.

    Both: ``dry_run`` (check, write nothing), ``live`` (move, or return, the GPUs at runtime
    too), ``break_lock`` (take over a lock left behind), ``action_timeout`` (seconds a follow-up
    action may run) and ``action_output`` (how many of a running action's last output lines
    are said as ``output`` steps; 0: none). An apply's: ``skip_guest_check`` (guests known to be
    stopped). A rollback's: ``force`` (every backup back, even over entries changed since),
    ``trust_unsigned`` (a journal entry without this machine's signature) and ``run_actions``
    (run the entry's follow-up actions again; off: the files alone go back).

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.pipeline import propose
    >>> from proxgpu.planning import SplitPolicy
    >>> host = DirectoryHost("examples/hosts/ct200")
    >>> proposal = propose(host, SplitPolicy(lxc=200, vms=[(300, None)]))
    >>> ApplyOptions(dry_run=True).apply(host, proposal.changes, plan=proposal.plan).changed
    True
    """

    dry_run: bool = False
    live: bool = False
    skip_guest_check: bool = False
    break_lock: bool = False
    force: bool = False
    trust_unsigned: bool = False
    action_timeout: float = ACTION_TIMEOUT
    action_output: int = 0
    run_actions: bool = True

    def apply(
        self,
        host: Host,
        changes: ChangeSet,
        *,
        plan: Plan,
        inventory: Inventory | None = None,
        progress: Progress | None = None,
    ) -> ApplyResult:
        """Apply ``changes`` (see :func:`proxgpu.apply.apply_changes`) with these options."""
        return apply_changes(
            host,
            changes,
            plan=plan,
            inventory=inventory,
            progress=progress,
            dry_run=self.dry_run,
            live=self.live,
            skip_guest_check=self.skip_guest_check,
            break_lock=self.break_lock,
            action_timeout=self.action_timeout,
            action_output=self.action_output,
        )

    def rollback(
        self, host: Host, to: str | None = None, *, progress: Progress | None = None
    ) -> RollbackResult:
        """Roll back journal entry ``to`` (see :func:`proxgpu.apply.rollback`) with these
        options; as a dry run, the result's ``preview`` says what it would do."""
        return rollback(
            host,
            to,
            run_actions=self.run_actions,
            force=self.force,
            live=self.live,
            break_lock=self.break_lock,
            progress=progress,
            action_timeout=self.action_timeout,
            trust_unsigned=self.trust_unsigned,
            dry_run=self.dry_run,
            action_output=self.action_output,
        )
