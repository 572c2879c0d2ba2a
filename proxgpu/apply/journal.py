"""The journal: one entry per apply, kept on the host with a backup of every file it touched.

What it keeps, under the host's root:

- ``/var/lib/proxgpu/journal/<id>.json``: one :class:`JournalEntry` per apply;
- ``/var/lib/proxgpu/backups/<id>/``: the files as they were, by position, and ``meta.json``.

:func:`history` reads every entry; a rollback or a verify reads only what it needs (see
:func:`read_journal`), and :func:`select_entry` picks the entry it acts on.

Retention: each apply and rollback, once it has recorded its entry, prunes every entry but the
newest :data:`KEEP_ENTRIES` that was rolled back or failed, with its backups; an applied or
unfinished entry, which a rollback may still need, is kept whatever its age. Each id pruned is
added to the journal's ``pruned`` file, so that the entry after it is known to follow an entry
the retention removed rather than one deleted by hand (see :mod:`proxgpu.apply.trust`).

>>> new_journal_id(datetime(2026, 11, 30, 1, 15, tzinfo=UTC))[:24]
'20261130T011500.000000Z-'
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError

from proxgpu.apply import signing
from proxgpu.apply.layout import Layout
from proxgpu.apply.rebind import Binding
from proxgpu.errors import JournalError, UsageError
from proxgpu.host.base import Host
from proxgpu.host.scripts import ScriptRecord, run_script
from proxgpu.model import FrozenModel
from proxgpu.paths import check_host_path
from proxgpu.planning import Plan
from proxgpu.rendering.changes import ChangeSet

Status = Literal["in-progress", "applied", "rolled-back", "failed"]

#: How many entries the journal keeps at least (see the module's text on retention).
KEEP_ENTRIES = 20


def _plain_name(name: str | None) -> str | None:
    """A backup's name in its entry's directory: one plain component, or :class:`ValueError`.

    >>> _plain_name("../../etc/shadow")
    Traceback (most recent call last):
    ...
    ValueError: not a plain file name: '../../etc/shadow'
    """
    if name is None:
        return None
    if name in ("", ".", "..") or "/" in name or any(ord(c) < 32 or c == "\x7f" for c in name):
        raise ValueError(f"not a plain file name: {name!r}")
    return name


class JournalFile(FrozenModel):
    """One file an apply touched: how it was (``existed``, mode as octal text, owner), the hashes
    before and after, and its copy's name in the backup directory (``None`` when it was absent).
    ``via`` says how it was written: as a file, or through the Proxmox API (``sha256_after`` is
    then the hash read back from the file Proxmox wrote, once known).

    >>> JournalFile(path="/etc/modules", existed=False, sha256_before=None,
    ...             sha256_after="ab" * 32).backup is None
    True
    """

    path: Annotated[str, AfterValidator(check_host_path)]
    existed: bool
    mode: str | None = None
    uid: int | None = None
    gid: int | None = None
    sha256_before: str | None
    sha256_after: str | None
    backup: Annotated[str | None, AfterValidator(_plain_name)] = None
    via: Literal["file", "api"] = "file"


class JournalEntry(FrozenModel):
    """One apply as the journal records it; ``status`` moves from ``in-progress`` to ``applied``,
    ``failed`` (everything was restored) or, later, ``rolled-back``.

    ``created_dirs`` lists every directory the apply created, deepest first (rollback removes
    them when empty; older entries name only the directory of each new file),
    ``live`` the drivers changed at runtime, ``actions_run`` the post-actions that ran.
    """

    id: str
    status: Status
    host: str
    client: str
    started: str
    finished: str | None = None
    changeset: ChangeSet
    plan: Plan | None = None
    files: list[JournalFile]
    created_dirs: list[Annotated[str, AfterValidator(check_host_path)]] = Field(
        default_factory=list
    )
    live: list[Binding] = Field(default_factory=list)
    actions_run: list[list[str]] = Field(default_factory=list)
    message: str = ""
    #: The host's boot when the apply ran, so that verify can tell a pending reboot from drift.
    boot_id: str | None = None
    #: The root of the host the apply ran on (``None``: written before proxgpu recorded it).
    root: str | None = None
    #: The entry before this one when it was written (see :mod:`proxgpu.apply.trust`).
    previous: str | None = None
    #: The id of the lock the apply held, when it is not ``id``: the apply's clock was behind
    #: the journal's newest entry, so its id moved past that one after the lock was taken.
    lock: str | None = None
    #: The machine the apply ran on: its hostname and /etc/machine-id (``None``: a tree of
    #: files, or written before proxgpu recorded it); see :mod:`proxgpu.apply.trust`.
    machine: str | None = None
    #: The HMAC of the admin's key over the rest (see :mod:`proxgpu.apply.signing`).
    signature: str | None = None


def entry_json(entry: JournalEntry, key: bytes | None = None) -> bytes:
    """``entry`` as the journal keeps it: signed with the admin's key (``key``: that one).

    >>> entry = JournalEntry(id="1", status="applied", host="pve1", client="me", started="now",
    ...                      changeset=ChangeSet(host="pve1"), files=[])
    >>> JournalEntry.model_validate_json(entry_json(entry, b"k" * 32)).signature[:12]
    'hmac-sha256:'
    """
    signed = signing.sign(signed_form(entry), key if key is not None else signing.load_key())
    return json.dumps(signed, indent=2).encode()


#: Fields added since proxgpu first signed its journal: left out of what is signed while unset,
#: so that an entry the earlier release signed still checks.
_LATER = ("root", "previous", "lock", "machine")


def signed_form(entry: JournalEntry) -> dict[str, object]:
    """What the signature of ``entry`` covers (with the signature itself, which
    :func:`~proxgpu.apply.signing.check` sets aside).

    >>> entry = JournalEntry(id="1", status="applied", host="pve1", client="me", started="now",
    ...                      changeset=ChangeSet(host="pve1"), files=[])
    >>> "previous" in signed_form(entry), "previous" in signed_form(
    ...     entry.model_copy(update={"previous": "start"}))
    (False, True)
    """
    document = entry.model_dump(mode="json")
    return {k: v for k, v in document.items() if not (k in _LATER and v is None)}


def new_journal_id(now: datetime | None = None, after: str | None = None) -> str:
    """A journal id that sorts by time: UTC time to the microsecond, four random hex digits.

    Applies are serialised by the lock, so ids of one host never share a microsecond. ``after``
    is the journal's newest id: an id made on a machine whose clock is behind the one that made
    ``after`` would sort before it, and the journal's order (the rollback's "latest", the
    chain's) is the ids' order, so the new id then takes the microsecond after it instead.

    >>> behind = datetime(2026, 11, 30, 1, 15, tzinfo=UTC)
    >>> new_journal_id(behind, after="20261130T020000.500000Z-ab12")  # doctest: +ELLIPSIS
    '20261130T020000.500001Z-...'
    """
    stamp = now or datetime.now(UTC)
    newest = _stamp_of(after) if after else None
    if newest is not None and newest >= stamp:
        stamp = newest + timedelta(microseconds=1)
    return f"{stamp.strftime(_STAMP)}-{secrets.token_hex(2)}"


_STAMP = "%Y%m%dT%H%M%S.%fZ"


def _stamp_of(journal_id: str) -> datetime | None:
    """The time in ``journal_id``; ``None`` for an id no release made (it is left to the chain
    check), or one at the end of time."""
    try:
        stamp = datetime.strptime(journal_id.partition("-")[0], _STAMP).replace(tzinfo=UTC)
        return stamp if stamp < datetime.max.replace(tzinfo=UTC) - timedelta(seconds=1) else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Listed:
    """One entry file as the journal's listing gives it, before (or without) reading it: its
    size, and the status and chaining its file says (hints for choosing what to read)."""

    id: str
    size: int
    status: str
    chained: bool


@dataclass(frozen=True)
class Journal:
    """A host's journal: the entries read, oldest first, and the files read that are not
    entries (damaged, cut short, edited by hand), each with why; those never hide the others.
    ``listed`` names every entry file there, read or not (a rollback reads only what it needs).
    """

    entries: list[JournalEntry]
    unreadable: dict[str, str]
    #: Each entry's document exactly as read, by id: what its signature and seal are checked
    #: against, so that a field a later release adds to the model (with its default) leaves an
    #: entry an earlier release wrote checkable.
    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    listed: tuple[Listed, ...] = ()
    #: The entries the journal's retention pruned, by id.
    pruned: frozenset[str] = frozenset()
    #: The machine the journal was read on (see :func:`machine_of`).
    machine: str | None = None

    def document(self, entry: JournalEntry) -> dict[str, Any]:
        """``entry`` as it was read (as it would be written, for one not read from the host).

        >>> entry = JournalEntry(id="1", status="applied", host="pve1", client="me",
        ...                      started="now", changeset=ChangeSet(host="pve1"), files=[])
        >>> Journal([entry], {}, {"1": {"id": "1", "as": "read"}}).document(entry)["as"]
        'read'
        """
        return self.documents.get(entry.id) or signed_form(entry)


#: The most bytes of entries one command answers (base64 makes 4 of every 3): a journal larger
#: than that is read in several, each under the 64 MiB a host's answer may be.
READ_BUDGET = 36 << 20


def read_journal(
    host: Host, *, to: str | None = None, latest: Sequence[Status] | None = None
) -> Journal:
    """The journal of ``host``: every entry, or with ``latest`` (or ``to``) only what a
    rollback or verify needs: the newest entry, the one named ``to`` (else the newest whose
    status is in ``latest``) and the readable entry before it (its link in the chain). One
    command lists the entries, and one reads each batch of at most :data:`READ_BUDGET` bytes.

    >>> from proxgpu.host import DirectoryHost
    >>> read_journal(DirectoryHost("examples/hosts/ct200"))
    Journal(entries=[], unreadable={}, documents={}, listed=(), pruned=frozenset(), machine=None)
    """
    layout = Layout.of(host)
    listing = run_script(host, "journal", layout.journal_dir)
    listed = _listing(listing.of("id"))
    reading = _Reading(host, layout)
    if latest is None and to is None:
        reading.read(listed)
    else:
        target = _target(listed, to, latest or ())
        picked = {len(listed) - 1} | ({target, target - 1} if target is not None else set())
        reading.read([listed[i] for i in sorted(picked) if i >= 0])
        # The chain is judged by the nearest readable entry before the target: past any that
        # cannot be read (planted, or damaged), one by one.
        before = (target or 0) - 1
        while before > 0 and layout.journal(listed[before].id) in reading.unreadable:
            before -= 1
            reading.read([listed[before]])
    pruned = frozenset(r[0] for r in listing.of("pruned") if len(r.fields) == 1)
    return reading.journal(listed, pruned, machine_of(listing.first("machine")))


class _Reading:
    """The entries read so far from one host's journal, batch by batch."""

    def __init__(self, host: Host, layout: Layout) -> None:
        self.host = host
        self.layout = layout
        self.entries: dict[str, JournalEntry] = {}
        self.unreadable: dict[str, str] = {}
        self.documents: dict[str, dict[str, Any]] = {}

    def read(self, wanted: Sequence[Listed]) -> None:
        """Read ``wanted``, one command per batch of at most :data:`READ_BUDGET` bytes."""
        for batch in _batches(wanted):
            ids = [e.id for e in batch]
            for record in run_script(self.host, "journal", self.layout.journal_dir, *ids).of(
                "entry"
            ):
                if len(record.fields) == 2:
                    self._take(*record.fields)

    def _take(self, journal_id: str, b64: str) -> None:
        path = self.layout.journal(journal_id)
        try:
            data = base64.b64decode(b64)
            entry = JournalEntry.model_validate_json(data)
            document = json.loads(data)
        except (ValidationError, ValueError) as exc:
            self.unreadable[path] = _first_line(exc)
            return
        if entry.id != journal_id:
            self.unreadable[path] = f"holds entry {entry.id}, not {journal_id}"
            return
        self.entries[entry.id] = entry
        self.documents[entry.id] = document

    def journal(
        self, listed: Sequence[Listed], pruned: frozenset[str], machine: str | None
    ) -> Journal:
        entries = sorted(self.entries.values(), key=lambda e: e.id)
        return Journal(entries, self.unreadable, self.documents, tuple(listed), pruned, machine)


def machine_of(record: ScriptRecord | None) -> str | None:
    """The host's identity from a ``machine`` record (the prelude's ``rec_machine``): its
    hostname and /etc/machine-id, ``None`` without a machine-id (a tree of files).

    >>> machine_of(ScriptRecord("machine", ("4c4c4544", "pve1")))
    'pve1 (machine-id 4c4c4544)'
    >>> machine_of(ScriptRecord("machine", ("-", "tree"))) is None
    True
    """
    if record is None or len(record.fields) != 2 or record[0] == "-":
        return None
    return f"{record[1]} (machine-id {record[0]})"


def _listing(records: Sequence[ScriptRecord]) -> list[Listed]:
    """The listing's entries; a record that is not one (a hostile host's) is left out."""
    listed = []
    for record in records:
        if len(record.fields) == 4 and record[1].isdigit():
            listed.append(Listed(record[0], int(record[1]), record[2], record[3] == "1"))
    return sorted(listed, key=lambda e: e.id)


def _target(listed: Sequence[Listed], to: str | None, latest: Sequence[Status]) -> int | None:
    """The index in ``listed`` of the entry named ``to``, else of the newest whose listed
    status is in ``latest`` (``None``: there is none).

    >>> listed = [Listed(i, 10, s, True) for i, s in (("1", "applied"), ("2", "applied"),
    ...           ("3", "rolled-back"))]
    >>> _target(listed, None, ("applied",)), _target(listed, "1", ()), _target(listed, "9", ())
    (1, 0, None)
    """
    ids = [e.id for e in listed]
    if to is not None:
        return ids.index(to) if to in ids else None
    eligible = [i for i, e in enumerate(listed) if e.status in latest]
    return eligible[-1] if eligible else None


def _batches(entries: Sequence[Listed]) -> list[list[Listed]]:
    """``entries`` in batches of at most :data:`READ_BUDGET` bytes (one larger entry alone).

    >>> [[e.id for e in b] for b in _batches([Listed("1", READ_BUDGET - 1, "-", False),
    ...                                        Listed("2", 2, "-", False)])]
    [['1'], ['2']]
    """
    batches: list[list[Listed]] = []
    size = 0
    for entry in entries:
        if not batches or size + entry.size > READ_BUDGET:
            batches.append([])
            size = 0
        batches[-1].append(entry)
        size += entry.size
    return batches


def history(host: Host) -> list[JournalEntry]:
    """Every readable journal entry on ``host``, oldest first (see :func:`read_journal`).

    >>> from proxgpu.host import DirectoryHost
    >>> history(DirectoryHost("examples/hosts/ct200"))
    []
    """
    return read_journal(host).entries


def _first_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError) and exc.errors():
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        return f"unreadable: {where}: {error['msg']}"
    text = str(exc).strip().splitlines()
    return f"unreadable: {text[0] if text else type(exc).__name__}"


def select_entry(
    host: Host, journal: Journal, to: str | None, latest: Sequence[Status]
) -> JournalEntry | None:
    """The entry named ``to``, or else the latest whose status is in ``latest`` (``None``: none).

    :raises JournalError: when the entry named ``to`` is there but cannot be read, or, with no
        ``to``, when the journal's newest entry cannot be read (it may be the one to act on).
    :raises UsageError: when no entry is named ``to``.
    """
    if to is None:
        _refuse_unreadable_newest(host, journal)
        candidates = [e for e in journal.entries if e.status in latest]
        return candidates[-1] if candidates else None
    entry = next((e for e in journal.entries if e.id == to), None)
    if entry is not None:
        return entry
    path = Layout.of(host).journal(to)
    if path in journal.unreadable:
        raise JournalError(host.name, path, journal.unreadable[path])
    raise UsageError(f"{host.name}: no journal entry {to} (see `proxgpu history`)")


def _refuse_unreadable_newest(host: Host, journal: Journal) -> None:
    """An entry file newer than every readable entry may be the latest apply: acting on an
    older entry, or on none ("nothing to roll back"), would pass it over unseen."""
    newest = max(journal.unreadable, default=None)
    if newest is None or any(Layout.of(host).journal(e.id) > newest for e in journal.entries):
        return
    raise JournalError(
        host.name,
        newest,
        f"{journal.unreadable[newest]}: it is the journal's newest entry, so the latest apply "
        "is not known; restore the file from a backup, or name the entry to act on with --to",
    )
