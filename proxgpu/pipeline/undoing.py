"""Undoing the last apply, once (:func:`undo`): what the collection's rollback and scripts
use, so that a second run changes nothing."""

from __future__ import annotations

from dataclasses import dataclass, replace

from proxgpu.apply import (
    ApplyOptions,
    JournalEntry,
    Progress,
    RollbackResult,
    read_journal,
    rollback,
)
from proxgpu.apply.journal import select_entry
from proxgpu.host import Host
from proxgpu.host.scripts import as_text, read_files
from proxgpu.pipeline.documents import shown
from proxgpu.rendering.changes import ChangeSet


@dataclass(frozen=True)
class Undone:
    """An undo of the last apply (:func:`undo`): the journal entry it rolled back (or, as a dry
    run, would roll back; ``None``: nothing to), each file as it was and as the rollback left
    it (would leave it), and the rollback's own result (``None`` for a dry run or nothing)."""

    journal_id: str | None
    changes: ChangeSet
    rolled_back: RollbackResult | None = None

    @property
    def changed(self) -> bool:
        """Whether an entry was (or, as a dry run, would be) rolled back."""
        return self.journal_id is not None

    @property
    def diff(self) -> list[dict[str, str]]:
        """The file changes in Ansible's before/after format, secrets redacted."""
        return shown(self.changes).ansible_diff()


def undo(
    host: Host,
    to: str | None = None,
    *,
    options: ApplyOptions | None = None,
    progress: Progress | None = None,
) -> Undone:
    """Roll back journal entry ``to``, or the last apply while it is still in effect, so that a
    second undo changes nothing (unlike ``proxgpu rollback``, which then goes on to the apply
    before it); a failed apply restored everything itself and is passed over. ``options``
    says how, as for the rollback (:meth:`ApplyOptions.rollback`): ``dry_run`` only says what
    would be restored, ``force`` writes every backup back, ``live`` also returns the functions
    the apply rebound, ``break_lock`` takes over a lock left behind.

    >>> from proxgpu.host import DirectoryHost
    >>> undo(DirectoryHost("examples/hosts/ct200"), options=ApplyOptions(dry_run=True)).changed
    False

    :raises FileChangedError: when an entry of the apply changed since (unless ``force``),
        also as a dry run; otherwise as :func:`proxgpu.apply.rollback` does.
    """
    options = options or ApplyOptions()
    entry = undo_target(host, to)
    if entry is None:
        return Undone(None, ChangeSet(host=host.name))
    planned = rollback(host, entry.id, replace(options, dry_run=True))
    assert planned.preview is not None  # an entry was named
    preview = planned.preview
    if options.dry_run:
        return Undone(entry.id, preview)
    done = rollback(host, entry.id, options, progress=progress)
    after = read_files(host, [f.path for f in preview.files])
    files = [
        f.model_copy(update={"after": as_text(data)})
        for f, data in zip(preview.files, after, strict=True)
    ]
    return Undone(entry.id, preview.model_copy(update={"files": files}), done)


def undo_target(host: Host, to: str | None = None) -> JournalEntry | None:
    """The entry :func:`undo` rolls back: ``to``, or the newest apply that did not fail, while
    it is applied (or left unfinished); ``None`` when it was rolled back already.

    :raises UsageError: when there is no entry ``to``.
    """
    journal = read_journal(host, to=to, latest=("applied", "in-progress", "rolled-back"))
    if to is not None:
        entry = select_entry(host, journal, to, latest=())
        candidates = [] if entry is None else [entry]
    else:
        candidates = [e for e in journal.entries if e.status != "failed"][-1:]
    return next((e for e in candidates if e.status in ("applied", "in-progress")), None)
