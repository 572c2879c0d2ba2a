"""Putting a PCI mapping written through the Proxmox API back, through the API.

An apply on a live host with pvesh writes ``/etc/pve/mapping/pci.cfg`` (cluster-wide: pmxcfs
shares it with every node) through ``/cluster/mapping/pci/<id>``
(:mod:`~proxgpu.apply.vmapi`); the journal records it with ``via: "api"``. A failed apply's
restore and a rollback put the mapping's lines back the same way: ``set`` with the digest of the
file as it is read now, so that Proxmox refuses if anyone writes it in between, under pmxcfs'
lock on the file, for the one id the apply changed; every other id is left as it is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection

from proxgpu.apply.journal import JournalEntry
from proxgpu.apply.remote import describe
from proxgpu.errors import FileChangedError, MappingChangedError, ProxgpuError
from proxgpu.host.base import Host
from proxgpu.host.scripts import read_files
from proxgpu.paths import PCI_MAPPING
from proxgpu.pve.cluster import write_mapping
from proxgpu.pve.mapping import changed_ids, mapping_lines


def through_api(entry: JournalEntry) -> bool:
    """Whether ``entry`` wrote the PCI mapping through the Proxmox API.

    >>> from proxgpu.rendering.changes import ChangeSet
    >>> through_api(JournalEntry(id="1", status="applied", host="h", client="c", started="s",
    ...                          changeset=ChangeSet(host="h"), files=[]))
    False
    """
    return any(f.path == PCI_MAPPING and f.via == "api" for f in entry.files)


def put_back(host: Host, entry: JournalEntry, target: str, expect: Collection[str] | None) -> bool:
    """Give the mapping id ``entry`` changed the lines it has in ``target`` (a whole ``pci.cfg``
    text), through the Proxmox API of ``host``; say whether anything had to be written.

    ``expect``: the SHA-256s the file may have now (what the apply left, or what a merge was made
    from); ``None`` takes it as it is (a forced rollback).

    :raises FileChangedError: naming the file, when it is not ``expect`` or Proxmox found it
        changed before its own write (the digest).
    :raises PveApiError: when Proxmox refused the write otherwise.
    """
    change = next(c for c in entry.changeset.files if c.path == PCI_MAPPING)
    (data,) = read_files(host, [PCI_MAPPING])
    if data is None or (expect is not None and hashlib.sha256(data).hexdigest() not in expect):
        raise _changed(host, entry, "it is not as the apply left it")
    now = data.decode("utf-8", "replace")
    wanted, written = False, mapping_lines(target)
    # One id: an apply writes through the API only a change of one (VmApiWriter.choose).
    for name in changed_ids(change.before or "", change.after or ""):
        if mapping_lines(now).get(name) == written.get(name):
            continue
        try:
            write_mapping(host, name, now, target)
        except MappingChangedError as exc:
            raise _changed(host, entry, f"Proxmox refused mapping {name} ({exc.detail})") from exc
        wanted = True
    return wanted


def undo_mapping(host: Host, entry: JournalEntry) -> list[str]:
    """Put the mapping a failed apply wrote through the API back as it was before, if the file is
    still what the apply left (or what it found, when the write did not land); the problems.
    """
    f = next(f for f in entry.files if f.path == PCI_MAPPING)
    before = next(c.before for c in entry.changeset.files if c.path == PCI_MAPPING)
    try:
        put_back(host, entry, before or "", [f.sha256_after or "", f.sha256_before or ""])
    except ProxgpuError as exc:
        return [f"putting {PCI_MAPPING} back through the Proxmox API failed: {describe(exc)}"]
    return []


def _changed(host: Host, entry: JournalEntry, what: str) -> FileChangedError:
    return FileChangedError(
        host.name,
        PCI_MAPPING,
        f"changed since apply {entry.id} wrote it: {what}; look at it, then roll back with "
        "--force (force=True in Python) to give the mapping its lines from before",
    )
