"""Apply a change set to a host as one transaction, and undo or check it later.

:func:`apply_changes` (:mod:`~proxgpu.apply.transaction`) writes a change set after its
preflight (:mod:`~proxgpu.apply.preflight`), under the host-wide lock (:mod:`~proxgpu.apply.lock`),
leaving a journal entry (:mod:`~proxgpu.apply.journal`) that :func:`rollback`
(:mod:`~proxgpu.apply.rollback`) undoes and :func:`verify` (:mod:`~proxgpu.apply.verify`) checks.
:mod:`~proxgpu.apply.rebind` moves GPUs between drivers at runtime, once
:mod:`~proxgpu.apply.busy` says nothing holds them. :mod:`~proxgpu.apply.remote` is the host side
they share: one command per step, whatever the number of files. :class:`ApplyOptions`
(:mod:`~proxgpu.apply.options`) says how an apply or a rollback runs, for every front end.
"""

from __future__ import annotations

from proxgpu.apply.journal import Journal, JournalEntry, JournalFile, history, read_journal
from proxgpu.apply.options import ACTION_TIMEOUT, CHECK_ONLY, ApplyOptions
from proxgpu.apply.remote import Progress
from proxgpu.apply.result import ApplyResult
from proxgpu.apply.rollback import RollbackResult, rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.apply.verify import VerifyReport, verify

__all__ = [
    "ACTION_TIMEOUT",
    "CHECK_ONLY",
    "ApplyOptions",
    "ApplyResult",
    "Journal",
    "JournalEntry",
    "JournalFile",
    "Progress",
    "RollbackResult",
    "VerifyReport",
    "apply_changes",
    "history",
    "read_journal",
    "rollback",
    "verify",
]
