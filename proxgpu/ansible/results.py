"""What both Ansible front ends return, one contract with the command line: gpu_split's result
holds the ``plan`` document ``plan --json`` prints, and a failure holds the ``error`` document
``--json`` prints (``code``, ``kind``, ``message``, ``host``, ``path``, ``fix``).

>>> from proxgpu.errors import SysfsError
>>> failure(SysfsError("pve1", "/sys/x", "missing"))["error"]["code"]
8
"""

from __future__ import annotations

from typing import Any

from proxgpu.errors import ProxgpuError
from proxgpu.pipeline import SplitResult
from proxgpu.planning.userspace import next_steps


def split_result(result: SplitResult, *, diff: bool, reboot: bool) -> dict[str, Any]:
    """gpu_split's result: ``changed``, ``diff`` (in diff mode), ``plan`` (as ``plan --json``
    prints it, with ``changes`` and ``reboot_pending``), ``actions``, ``reboot_required``,
    ``journal_id``, ``notes`` (what the split does or assumes, asking nothing; the warnings go
    to Ansible's own) and ``next_steps`` (what each container given NVIDIA GPUs must hold: the
    NVIDIA user space of the host's driver version).

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.pipeline import split_host
    >>> from proxgpu.planning import SplitPolicy
    >>> done = split_host(DirectoryHost("examples/hosts/ct200"), SplitPolicy(lxc=200))
    >>> shown = split_result(done, diff=False, reboot=False)
    >>> {"changes", "reboot_pending"} <= set(shown["plan"]), shown["next_steps"][0][:36]
    (True, "CT 200 needs NVIDIA's user space (li")
    """
    return {
        "changed": result.changed,
        "diff": result.diff if diff else [],
        # What the split does or assumes, asking nothing: not Ansible warnings.
        "notes": [*result.plan.notes, *result.changes.notes],
        "next_steps": next_steps(result.plan.userspace),
        "plan": result.plan_document(),
        "actions": result.actions,
        "reboot_required": reboot,
        "journal_id": result.applied.journal_id,
    }


def failure(exc: ProxgpuError) -> dict[str, Any]:
    """A failed task's ``msg`` (the one-line message) and ``error`` (the error document)."""
    return {"msg": str(exc), "error": exc.document()}
