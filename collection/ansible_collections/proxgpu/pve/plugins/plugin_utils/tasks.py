"""What the collection's modules do with a host, whichever way it is reached (:data:`MODULES`):
``gpu_facts`` reads the inventory (:func:`facts_task`), ``gpu_split`` plans and applies the split
(:func:`split_task`). gpu_split's options are those of the module proxgpu ships for running on
the host (``proxgpu/ansible/proxgpu_split.py``), with the same meaning.

>>> from proxgpu.host import DirectoryHost
>>> done, warnings = facts_task(DirectoryHost("examples/hosts/ct200"), {}, Mode())
>>> facts = done["ansible_facts"]["proxgpu"]
>>> done["changed"], facts["hostname"], len(facts["gpus"])
(False, 'ct200', 8)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from proxgpu.ansible.proxgpu_split import ARGUMENTS
from proxgpu.ansible.request import gpu_filter, split_request
from proxgpu.host import Host
from proxgpu.inspection import inspect
from proxgpu.inspection.document import inventory_document
from proxgpu.pipeline import SplitResult, reboot_awaited, split_host

#: ``root`` is a directory on the managed host: not a controller path to expand.
SPLIT_ARGUMENTS: dict[str, Any] = {**ARGUMENTS, "root": {"type": "str"}}
FACTS_ARGUMENTS: dict[str, Any] = {
    "root": {"type": "str"},
    "gpu_vendor": {"type": "list", "elements": "str"},
    "gpu_class": {"type": "list", "elements": "str"},
}


class Mode(NamedTuple):
    """How the task runs: ``--check`` (nothing is written) and ``--diff`` (file changes shown)."""

    check: bool = False
    diff: bool = False


#: A module's work on a host: its result and the warnings to show.
Task = Callable[[Host, dict[str, Any], Mode], tuple[dict[str, Any], list[str]]]


def facts_task(host: Host, params: dict[str, Any], mode: Mode) -> tuple[dict[str, Any], list[str]]:
    """gpu_facts: the fact ``proxgpu``, the inventory as ``proxgpu inspect --json`` prints it
    (guest secrets redacted); nothing changes, in any mode."""
    inventory = inspect(host, gpu_filter(params))
    return {"changed": False, "ansible_facts": {"proxgpu": inventory_document(inventory)}}, []


def split_task(host: Host, params: dict[str, Any], mode: Mode) -> tuple[dict[str, Any], list[str]]:
    """gpu_split: plan the split, apply it unless in check mode; the result and its warnings."""
    result = split(host, params, check=mode.check)
    return split_document(host, result, diff=mode.diff), [
        *result.plan.warnings,
        *result.changes.warnings,
    ]


def split(host: Host, params: dict[str, Any], *, check: bool) -> SplitResult:
    """Plan the split the options ask for and, unless ``check``, apply it.

    :raises ProxgpuError: as :func:`proxgpu.pipeline.split_host` does.
    """
    policy, options, gpus = split_request(params)
    return split_host(host, policy, options, check=check, live=params["live"], gpu_filter=gpus)


def reboot_required(host: Host, result: SplitResult) -> bool:
    """Whether the host must reboot for the split to take effect
    (:func:`proxgpu.pipeline.reboot_awaited`); never for a directory tree (``root``), which is not
    the machine that would reboot."""
    return host.is_live and reboot_awaited(host, result)


def split_document(host: Host, result: SplitResult, *, diff: bool) -> dict[str, Any]:
    """The task result: ``changed``, ``diff`` (in diff mode), ``plan``, ``actions``,
    ``reboot_required`` and ``journal_id``."""
    return {
        "changed": result.changed,
        "diff": result.diff if diff else [],
        "plan": result.plan.model_dump(mode="json"),
        "actions": result.actions,
        "reboot_required": reboot_required(host, result),
        "journal_id": result.applied.journal_id,
    }


#: Each module's options (validated as the module's DOCUMENTATION states them) and work.
MODULES: dict[str, tuple[dict[str, Any], Task]] = {
    "gpu_facts": (FACTS_ARGUMENTS, facts_task),
    "gpu_split": (SPLIT_ARGUMENTS, split_task),
}
