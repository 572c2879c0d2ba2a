"""How a change runs, as one type for the command line, the library and both Ansible front
ends: the options of an apply and of its rollback (:class:`ApplyOptions`), the one parameter
:func:`~proxgpu.apply.apply_changes`, :func:`~proxgpu.apply.rollback` and
:func:`proxgpu.split_host` take for it.

>>> ApplyOptions(dry_run=True, live=True).action_timeout
900.0
"""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds a post-action may run (an initramfs rebuild for every kernel takes minutes).
ACTION_TIMEOUT = 900.0


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

    >>> from proxgpu.apply import apply_changes
    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.pipeline import propose
    >>> from proxgpu.planning import SplitPolicy
    >>> host = DirectoryHost("examples/hosts/ct200")
    >>> proposal = propose(host, SplitPolicy(lxc=200, vms=[(300, None)]))
    >>> checked = ApplyOptions(dry_run=True)
    >>> apply_changes(host, proposal.changes, checked, plan=proposal.plan).changed
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


#: Only a dry run: what :func:`proxgpu.split_host` does unless told otherwise.
CHECK_ONLY = ApplyOptions(dry_run=True)
