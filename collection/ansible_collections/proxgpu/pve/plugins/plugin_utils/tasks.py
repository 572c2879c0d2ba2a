"""What the collection's modules do with a host, whichever way it is reached (:data:`MODULES`):
``gpu_facts`` reads the inventory (:func:`facts_task`), ``gpu_split`` plans and applies the split
(:func:`split_task`), ``gpu_rollback`` undoes the last apply (:func:`rollback_task`) and
``gpu_verify`` compares the host with it (:func:`verify_task`). gpu_split's options and results
are those of the module proxgpu ships for running on the host
(``proxgpu/ansible/proxgpu_split.py``), with the same meaning.

>>> from proxgpu.host import DirectoryHost
>>> done, warnings = facts_task(DirectoryHost("examples/hosts/ct200"), {}, Mode())
>>> facts = done["ansible_facts"]["proxgpu"]
>>> done["changed"], facts["hostname"], len(facts["gpus"])
(False, 'ct200', 8)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxgpu.ansible.proxgpu_split import ARGUMENTS
from proxgpu.ansible.request import change_options, gpu_filter, split_request
from proxgpu.ansible.results import failure, split_result
from proxgpu.apply import verify
from proxgpu.apply.verify import applied_entry
from proxgpu.errors import DriftError
from proxgpu.host import Host
from proxgpu.inspection import inspect
from proxgpu.inspection.document import inventory_document
from proxgpu.model import plain
from proxgpu.pipeline import SplitResult, reboot_awaited, split_host
from proxgpu.pipeline.undoing import undo

#: The option every module takes (documented once, in ``doc_fragments/common.py``): a directory
#: on the managed host, not a controller path to expand.
ROOT: dict[str, Any] = {"root": {"type": "str"}}
SPLIT_ARGUMENTS: dict[str, Any] = {**ARGUMENTS, **ROOT}
FACTS_ARGUMENTS: dict[str, Any] = {
    **ROOT,
    "gpu_vendor": {"type": "list", "elements": "str"},
    "gpu_class": {"type": "list", "elements": "str"},
}
#: Acting on a journal entry another controller's key signed, as ``--trust-unsigned`` does.
TRUST: dict[str, Any] = {"trust_unsigned": {"type": "bool", "default": False}}
ROLLBACK_ARGUMENTS: dict[str, Any] = {
    **ROOT,
    **TRUST,
    "to": {"type": "str"},
    "force": {"type": "bool", "default": False},
    "live": {"type": "bool", "default": False},
    "break_lock": {"type": "bool", "default": False},
}
VERIFY_ARGUMENTS: dict[str, Any] = {
    **ROOT,
    **TRUST,
    "to": {"type": "str"},
    "guests": {"type": "bool", "default": True},
}


@dataclass(frozen=True)
class Mode:
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
    request = split_request(params)
    how = change_options(params, check=check)
    return split_host(host, request.policy, request.options, gpu_filter=request.gpu_filter, how=how)


def reboot_required(host: Host, result: SplitResult) -> bool:
    """Whether the host must reboot for the split to take effect
    (:func:`proxgpu.pipeline.reboot_awaited`); never for a directory tree (``root``), which is not
    the machine that would reboot."""
    return host.is_live and reboot_awaited(host, result)


def split_document(host: Host, result: SplitResult, *, diff: bool) -> dict[str, Any]:
    """The task result (:func:`proxgpu.ansible.results.split_result`): ``changed``, ``diff``
    (in diff mode), ``plan``, ``actions``, ``reboot_required`` and ``journal_id``."""
    return split_result(result, diff=diff, reboot=reboot_required(host, result))


def rollback_task(
    host: Host, params: dict[str, Any], mode: Mode
) -> tuple[dict[str, Any], list[str]]:
    """gpu_rollback: roll back journal entry ``to``, or the last apply while it is in effect
    (:func:`proxgpu.pipeline.undoing.undo`), so that a second run changes nothing; in check
    mode only say what would be restored.

    >>> from proxgpu.host import DirectoryHost
    >>> params = {"to": None, "force": False, "live": False, "break_lock": False,
    ...           "trust_unsigned": False}
    >>> done, _ = rollback_task(DirectoryHost("examples/hosts/ct200"), params, Mode(check=True))
    >>> done["changed"], done["journal_id"], done["restored"]
    (False, None, [])
    """
    done = undo(host, params["to"], options=change_options(params, check=mode.check))
    result = {
        "changed": done.changed,
        "journal_id": done.journal_id,
        "restored": [f.path for f in done.changes.changed_files()],
        # Run again on the host; listed in check mode and on a directory tree.
        "actions": [action.argv for action in done.changes.actions] if done.changed else [],
        "messages": [] if done.rolled_back is None else done.rolled_back.messages,
        "diff": done.diff if mode.diff else [],
    }
    return result, trusted_unsigned(params)


def verify_task(host: Host, params: dict[str, Any], mode: Mode) -> tuple[dict[str, Any], list[str]]:
    """gpu_verify: compare the host with the last apply (or journal entry ``to``), as
    ``proxgpu verify`` does; drift fails the task, whose result holds the report either way. A
    guest that could not be looked at is a warning, never part of a pass."""
    trust = bool(params.get("trust_unsigned"))
    entry = applied_entry(host, params["to"], trust_unsigned=trust)
    report = verify(host, entry, guests=params.get("guests", True))
    result: dict[str, Any] = {"changed": False, "verify": plain(report)}
    if report.drifted:
        result |= {"failed": True, **failure(DriftError(host.name, report.drift))}
    unchecked = [check.line for check in report.guests if check.verdict == "unchecked"]
    return result, trusted_unsigned(params) + unchecked


def trusted_unsigned(params: dict[str, Any]) -> list[str]:
    """The warning a task gives when it was told to act on an entry this controller's key did
    not sign (none otherwise).

    >>> trusted_unsigned({"trust_unsigned": False})
    []
    """
    if not params.get("trust_unsigned"):
        return []
    return [
        "trust_unsigned: the journal entry's signature and its place in the journal's chain "
        "were not checked; act on it only if you have checked the entry by hand"
    ]


#: Each module's options (validated as the module's DOCUMENTATION states them) and work.
MODULES: dict[str, tuple[dict[str, Any], Task]] = {
    "gpu_facts": (FACTS_ARGUMENTS, facts_task),
    "gpu_split": (SPLIT_ARGUMENTS, split_task),
    "gpu_rollback": (ROLLBACK_ARGUMENTS, rollback_task),
    "gpu_verify": (VERIFY_ARGUMENTS, verify_task),
}
