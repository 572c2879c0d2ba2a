"""The JSON documents every front end prints: ``plan --json`` (:func:`plan_document`) and
``apply --json`` (:func:`apply_document`), the contracts of ``--json`` and of the Ansible
module (:func:`~proxgpu.inspection.document.inventory_document` lives with inspection, so that
``inspect`` loads no planner). Secrets in guest configs are redacted in every one of them
(:func:`shown`).
"""

from __future__ import annotations

from typing import Any

from proxgpu.apply import ApplyResult
from proxgpu.apply.verify import driver_drift
from proxgpu.inspection import Inventory
from proxgpu.model import plain
from proxgpu.planning import Plan
from proxgpu.redact import redact_secrets
from proxgpu.rendering.changes import ChangeSet


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
    """The plan and its changes as ``plan --json`` prints it (see docs/planning.md); with
    the ``inventory`` the plan was made from, ``reboot_pending`` too (:func:`reboot_pending`).

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.pipeline import split_host
    >>> from proxgpu.planning import SplitPolicy
    >>> tree = DirectoryHost("examples/hosts/ct200")
    >>> result = split_host(tree, SplitPolicy(lxc=200))
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
        "result": plain(result),
        "diff": shown(changes).ansible_diff(),
    }
