"""Undo an apply that failed after writing: return the drivers it rebound, put back every file
it wrote (through the Proxmox API those it wrote there), then rebuild what its post-actions
built from the files (the initramfs) from the old ones.
:class:`~proxgpu.apply.transaction` calls it at the first step that fails.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxgpu.apply.actions import run_followed
from proxgpu.apply.journal import JournalEntry
from proxgpu.apply.layout import Layout
from proxgpu.apply.mapapi import undo_mapping
from proxgpu.apply.rebind import Binding, restore_drivers
from proxgpu.apply.remote import describe, quiet, recognise
from proxgpu.apply.restore import restore
from proxgpu.apply.vmapi import VmApiWriter
from proxgpu.errors import ProxgpuError
from proxgpu.host.base import Host
from proxgpu.paths import PCI_MAPPING


def undo_writes(
    host: Host,
    layout: Layout,
    entry: JournalEntry,
    *,
    bindings: Sequence[Binding],
    vm_api: VmApiWriter,
    not_written: frozenset[str],
) -> tuple[JournalEntry, list[str]]:
    """Put back what apply ``entry`` changed: the drivers of ``bindings``, the PCI mapping
    through the API where it was written there, every other file but ``not_written`` from the
    backup. The entry comes back with the files the API wrote recognised by their content;
    each thing that could not be put back is a line.
    """
    problems = []
    if bindings:
        try:
            restore_drivers(host, list(bindings))
        except ProxgpuError as exc:
            problems.append(f"returning the drivers failed: {describe(exc)}")
    try:
        if vm_api.unconfirmed:
            # Written through the API, but the file Proxmox wrote was never read back:
            # recognise it by its content, so that it is restored and another's edit is not.
            entry = recognise(host, entry, vm_api.unconfirmed)
        keep = not_written
        if vm_api.covers(PCI_MAPPING) and PCI_MAPPING not in keep:
            keep |= {PCI_MAPPING}  # written through the API: put back through it
            problems += undo_mapping(host, entry)
        problems += restore(host, layout, entry, force=False, keep=keep)[1]
    except ProxgpuError as exc:
        return entry, [*problems, f"restoring the files failed: {describe(exc)}"]
    return entry, problems


def rerun_actions(host: Host, actions: Sequence[list[str]], timeout: float) -> str:
    """Re-run the post-actions that ran (they rebuild things from the files, the initramfs:
    rebuild from the old ones); what the apply's failure message adds about them.

    >>> from proxgpu.host import DirectoryHost
    >>> rerun_actions(DirectoryHost("/"), [], 60)
    ''
    """
    for argv in actions:
        try:
            run_followed(host, argv, quiet, lines=0, timeout=timeout)
        except ProxgpuError as exc:
            return f"; re-running {argv[0]} failed ({describe(exc)}): run it by hand"
    return f"; re-ran {len(actions)} post-actions" if actions else ""
