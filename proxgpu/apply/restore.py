"""Putting an entry's files back: from their backups, or with only the apply's entries undone.

``scripts/restore.sh`` does it in one command under Proxmox's per-guest config lock, each file
through a temp file of its own, synced before it is renamed into place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

from proxgpu.apply.journal import JournalEntry
from proxgpu.apply.layout import Layout, mode_and_umask, where
from proxgpu.apply.remote import deepest_first
from proxgpu.host.base import Host
from proxgpu.host.scripts import ScriptArgs, run_script


@dataclass(frozen=True)
class RestoreItem(ScriptArgs):
    """One file for ``scripts/restore.sh``, its fields in the script's order."""

    path: str
    staged: str
    tmp: str
    source: str | None
    source_sha: str | None
    mode: str
    umask: str
    owner: str | None
    only_if: str
    guest_lock: str
    size: int = 0


_RESTORE_OUTCOMES = {
    10: "already as before",
    11: "changed by someone else since the apply; left alone",
    12: "its backup is damaged; left alone",
    13: "could not be written back",
    14: "its directory now leads out of the host's root through a symlink; left alone",
    75: "Proxmox held the guest's config lock for 10 s; left alone",
}


def _restore_item(
    host: Host, layout: Layout, entry: JournalEntry, index: int, only_if: str
) -> RestoreItem:
    f = entry.files[index]
    at = where(layout, f.path, entry.id, host.is_live)
    mode, umask = mode_and_umask(None, f.mode, at)
    return RestoreItem(
        path=at.path,
        staged=at.tmp,
        tmp=at.restore_tmp,
        source=f"{layout.backups(entry.id)}/{f.backup}" if f.backup else None,
        source_sha=f.sha256_before,
        mode=mode,
        umask=umask,
        owner=f"{f.uid}:{f.gid}" if f.existed and not at.in_pve else None,
        only_if=only_if,
        guest_lock=at.guest_lock,
    )


@dataclass(frozen=True)
class Merged:
    """A file that changed since the apply, with only the apply's entries undone in it."""

    #: The hash it has now, which it must still have when it is written.
    sha256_now: str
    #: Its new content; ``None``: nothing is left of it and it did not exist before, so it goes.
    content: bytes | None


def restore(
    host: Host,
    layout: Layout,
    entry: JournalEntry,
    *,
    force: bool,
    keep: frozenset[str] = frozenset(),
    merged: Mapping[str, Merged] | None = None,
) -> tuple[list[str], list[str]]:
    """Put back ``entry``'s files in one command; return (paths restored, problems).

    A file is put back from its backup only if it is still what the apply left (any state with
    ``force``); files in ``keep`` were never written: only their temp files are removed; files
    in ``merged`` get the content given there, if they still have the hash given there.
    """
    items, payload = [], []
    for index, f in enumerate(entry.files):
        only_if = "any" if force else (f.sha256_after or "-")
        item = _restore_item(host, layout, entry, index, "keep" if f.path in keep else only_if)
        if merged and f.path in merged:
            item = _merged_item(item, merged[f.path])
            payload.append(merged[f.path].content or b"")
        items.append(item)
    dirs = [layout.on_host(d) for d in deepest_first(entry.created_dirs)]
    args = [arg for item in items for arg in item.argv()]
    output = run_script(host, "restore", str(len(items)), *args, *dirs, payload=b"".join(payload))
    restored, problems = [], []
    for record in output.of("rc"):
        path, code = entry.files[int(record[0])].path, int(record[1])
        if code == 0:
            restored.append(path)
        elif code != 10:
            problems.append(f"{path}: {_RESTORE_OUTCOMES.get(code, f'failed ({code})')}")
    return restored, problems


def _merged_item(item: RestoreItem, merged: Merged) -> RestoreItem:
    content = merged.content
    return replace(
        item,
        source=None if content is None else "=",
        source_sha=None if content is None else hashlib.sha256(content).hexdigest(),
        only_if=merged.sha256_now,
        size=0 if content is None else len(content),
    )
