"""The whole job in one call, for scripts, and the JSON documents every front end prints.

:func:`split_host` inspects, plans, renders and applies (or only checks); Ansible-style scripts
and the Ansible module use it. The command line runs the same steps through :func:`propose` so
that it can show the plan before asking. The documents (:func:`inventory_document`,
:func:`plan_document`, :func:`apply_document`) are the JSON contracts of ``--json`` and of the
Ansible module; secrets in guest configs are redacted in every one of them (:func:`shown`).

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.planning import SplitPolicy
>>> result = split_host(DirectoryHost("examples/hosts/ct200"),
...                     SplitPolicy(lxc=200, vms=[(300, None)]), check=True)
>>> result.changed, len(result.diff)
(True, 8)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

from proxgpu.apply import ApplyResult, Progress, apply_changes
from proxgpu.apply.remote import sha
from proxgpu.errors import UsageError
from proxgpu.host import Host
from proxgpu.inspection import GpuFilter, Inventory, inspect
from proxgpu.planning import Plan, SplitPolicy, plan_split
from proxgpu.pve.config import redact_secrets
from proxgpu.rendering import RenderOptions, render
from proxgpu.rendering.changes import ChangeSet


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

    :raises PlanRefusedError: when the planner refuses; RenderError when it cannot be rendered.
    """
    policy = policy or SplitPolicy()
    if options is not None and options.mapping and policy.mapping is None:
        # The planner checks that the mapping can be written (the IOMMU groups it needs).
        policy = policy.model_copy(update={"mapping": options.mapping})
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
        return shown(self.changes).ansible_diff()

    def document(self) -> dict[str, Any]:
        """The run as ``apply --json`` prints it (``plan``, ``result``, ``diff``)."""
        return apply_document(self.plan, self.applied, self.changes)

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


def inventory_document(inventory: Inventory) -> dict[str, Any]:
    """The inventory as ``inspect --json`` prints it, guest configs redacted."""
    configs = {p: redact_secrets(t) for p, t in inventory.guest_configs.items()}
    return inventory.model_copy(update={"guest_configs": configs}).model_dump(mode="json")


def plan_document(plan: Plan, changes: ChangeSet) -> dict[str, Any]:
    """The plan and its changes as ``plan --json`` prints it (see the README's contract)."""
    visible = shown(changes)
    document = plan.model_dump(mode="json")
    document["changes"] = {
        **visible.model_dump(mode="json"),
        "changed": changes.changed,
        "summary": changes.summary(),
        "diff": visible.ansible_diff(),
    }
    return document


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


def save_plan(path: str, host: str, plan: Plan, changes: ChangeSet) -> None:
    """Write a plan file for :func:`load_plan` (``terraform plan -out``): the plan, every file's
    text as read and as planned, and the SHA-256 of each as read, so that applying it refuses a
    file changed since. It holds guest configs, secrets included: it is made readable by the
    owner only.
    """
    document = {
        "kind": PLAN_FILE_KIND,
        "schema_version": PLAN_FILE_VERSION,
        "host": host,
        "sha256_before": {f.path: sha(f.before) for f in changes.files},
        "plan": plan.model_dump(mode="json"),
        "changes": changes.model_dump(mode="json"),
    }
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=2)
        out.write("\n")


def load_plan(path: str) -> SavedPlan:
    """Read a plan file written by :func:`save_plan`.

    :raises UsageError: when it is not one, or its texts no longer match their hashes.
    """
    try:
        with open(path, encoding="utf-8") as source:
            document = json.load(source)
        if document.get("kind") != PLAN_FILE_KIND:
            raise ValueError("not a proxgpu plan file")
        if document.get("schema_version") != PLAN_FILE_VERSION:
            raise ValueError(f"plan file version {document.get('schema_version')} is not 1")
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
