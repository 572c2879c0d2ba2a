"""Whether a journal entry may be acted on: signed with the admin's key, in its place in the
host's chain of entries, and made for this root.

Each entry records, in ``previous``, the entry before it when it was written: that entry's id
and the :func:`seal` of what it did (its id, host, root, client, start and change set, which
never change once written), or :data:`START` for the first entry of a journal. The signature
covers that link, so an entry deleted from the middle of the journal, an entry put back in
from elsewhere or the order changed leaves the next entry pointing at the wrong place.

>>> from proxgpu.rendering.changes import ChangeSet
>>> first = JournalEntry(id="1", status="applied", host="pve1", client="me", started="now",
...                      changeset=ChangeSet(host="pve1"), files=[], previous=START)
>>> second = first.model_copy(update={"id": "2", "previous": link(first)})
>>> chain_problems(Journal([second], {}))
{'2': 'the entry before it, 1, is gone from the journal: deleted since'}
>>> chain_problems(Journal([first, second], {}))
{}
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from proxgpu.apply import signing
from proxgpu.apply.journal import Journal, JournalEntry, signed_form
from proxgpu.apply.layout import Layout
from proxgpu.errors import JournalError
from proxgpu.host.base import Host
from proxgpu.host.local import LocalHost

#: The ``previous`` of the first entry of a journal.
START = "start"
_SEALED = ("id", "host", "root", "client", "started", "changeset")


def seal(entry: JournalEntry, document: Mapping[str, Any] | None = None) -> str:
    """The SHA-256 of what ``entry`` was made as (the fields no later write changes), taken from
    ``document``, the entry as read, when given: the bytes written then, not today's model of
    them, which a later release may have given a new field.

    >>> from proxgpu.rendering.changes import ChangeSet
    >>> entry = JournalEntry(id="1", status="applied", host="h", client="c", started="s",
    ...                      changeset=ChangeSet(host="h"), files=[])
    >>> len(seal(entry)), seal(entry) == seal(entry, signed_form(entry))
    (64, True)
    """
    made = signed_form(entry) if document is None else document
    sealed = {k: made[k] for k in _SEALED if k in made}
    return hashlib.sha256(signing.canonical(sealed)).hexdigest()


def link(
    previous: JournalEntry | None,
    previous_id: str | None = None,
    document: Mapping[str, Any] | None = None,
) -> str:
    """The ``previous`` field of the entry written after ``previous`` (``None``: after nothing,
    or, with ``previous_id``, after an entry that could not be read: its id alone), sealed from
    ``document``, ``previous`` as read, when given.

    >>> link(None), link(None, "20261130T011500.000000Z-ab12")
    ('start', '20261130T011500.000000Z-ab12:')
    """
    if previous is not None:
        return f"{previous.id}:{seal(previous, document)}"
    return START if previous_id is None else f"{previous_id}:"


def link_after(last: tuple[str, bytes] | None) -> str:
    """The ``previous`` field of an entry written after ``last``, the newest entry's id and
    bytes as the probe read them (``None``: the journal is empty).

    >>> link_after(None), link_after(("20261130T011500.000000Z-ab12", b"{damaged"))
    ('start', '20261130T011500.000000Z-ab12:')
    """
    if last is None:
        return START
    journal_id, data = last
    try:
        entry = JournalEntry.model_validate_json(data)
        document = json.loads(data)
    except (ValidationError, ValueError):
        return link(None, journal_id)
    return link(entry, document=document) if entry.id == journal_id else link(None, journal_id)


def chain_problems(journal: Journal) -> dict[str, str]:
    """Why each entry of ``journal`` is out of its place in the chain, by entry id (see the
    module docstring); entries in place are left out. A file that cannot be read counts only
    where an entry was chained to it: one planted beside the entries hides none of them. An
    entry is judged by the readable entry just before it, which :func:`read_journal` reads with
    it; the journal's listing (``listed``) names the files that were not read."""
    readable = {e.id: e for e in journal.entries}
    damaged = {_id_of(path) for path in journal.unreadable}
    unread = {e.id for e in journal.listed} - set(readable) - damaged
    ids = set(readable) | unread | damaged
    chained_ids = [e.id for e in journal.entries if e.previous is not None]
    chained_ids += [e.id for e in journal.listed if e.chained and e.id in unread]
    known = _Read(journal, readable, ids, unread)
    problems = {}
    for index, entry in enumerate(journal.entries):
        before = journal.entries[index - 1].id if index else None
        if entry.previous is None:
            # Written before proxgpu chained its journal: in place only before every chained
            # entry (an upgrade keeps its journal usable); after one, it was put there since.
            earlier = [i for i in chained_ids if i < entry.id]
            problem = _unchained_after(min(earlier)) if earlier else None
        else:
            problem = _out_of_place(entry.previous, before, known)
        if problem is not None:
            problems[entry.id] = problem
    return problems


def _unchained_after(chained: str) -> str:
    return (
        f"it is not chained, yet lies after {chained}, which is: an entry of an earlier "
        "release put in since"
    )


def _id_of(path: str) -> str:
    return path.rsplit("/", 1)[-1].removesuffix(".json")


@dataclass(frozen=True)
class _Read:
    """What the chain check knows of a journal: the entries read, by id, every entry file's id
    (read or not) and those not read."""

    journal: Journal
    readable: dict[str, JournalEntry]
    ids: set[str]
    unread: set[str]


def _out_of_place(previous: str, before: str | None, known: _Read) -> str | None:
    """Why a chained entry written after ``previous`` (its ``previous`` field), whose nearest
    readable predecessor is ``before``, is out of its place."""
    if previous == START:
        if before is None:
            return None
        return f"it began the journal, yet {before} lies before it: put there since"
    previous_id, _, digest = previous.partition(":")
    if previous_id not in known.ids:
        if previous_id in known.journal.pruned and (before is None or before < previous_id):
            return None  # the one before it went by the journal's retention
        return f"the entry before it, {previous_id}, is gone from the journal: deleted since"
    if previous_id in known.unread:
        # Not read: read_journal reads the nearest readable entry before the one it checks.
        return _reordered(previous_id, before)
    journal, readable = known.journal, known.readable
    was = readable.get(previous_id)
    if was is not None:
        if before != previous_id:
            return _reordered(previous_id, before)
        if digest and seal(was, journal.document(was)) != digest:
            return f"the entry before it, {previous_id}, is not the one it was written after"
        return None
    if digest:
        return f"the entry before it, {previous_id}, can no longer be read: damaged since"
    if before is not None and before > previous_id:
        return _reordered(previous_id, before)
    return None


def _reordered(previous_id: str, before: str | None) -> str:
    return (
        f"it was written after {previous_id}, yet {before or 'no entry'} lies just before it: "
        "the journal was reordered or an entry put in since"
    )


def problems(host: Host, journal: Journal, key: bytes) -> dict[str, str]:
    """Why each entry of ``host``'s ``journal`` is not to be trusted, by entry id (entries
    signed by ``key``, in their place in the chain and made for ``host``'s root are left out).

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.rendering.changes import ChangeSet
    >>> host = DirectoryHost("examples/hosts/ct200")
    >>> entry = JournalEntry(id="1", status="applied", host="pve9", client="me", started="now",
    ...                      changeset=ChangeSet(host="pve9"), files=[], previous=START,
    ...                      root="/srv/pve9")
    >>> key = b"k" * 32
    >>> signed = JournalEntry.model_validate(signing.sign(signed_form(entry), key))
    >>> problems(host, Journal([signed], {}), key)["1"][:28]
    'made for root /srv/pve9, not'
    """
    chain = chain_problems(journal)
    found = {}
    for entry in journal.entries:
        problem = (
            signing.check(journal.document(entry), key)
            or chain.get(entry.id)
            or other_host(host, entry)
        )
        if problem is not None:
            found[entry.id] = problem
    return found


def check_trusted(
    host: Host, journal: Journal, entry: JournalEntry, *, trust_unsigned: bool
) -> None:
    """Refuse ``entry`` unless made for ``host`` and, unless ``trust_unsigned``, signed with the
    admin's key and in its place in the chain.

    :raises JournalError: naming the entry's file, why and the way out.
    """
    where = Layout.of(host).journal(entry.id)
    if not trust_unsigned:
        problem = signing.check(journal.document(entry), signing.load_key())
        problem = problem or chain_problems(journal).get(entry.id)
        problem = problem or other_machine(journal, entry)
        if problem is not None:
            raise JournalError(
                host.name,
                where,
                f"{problem}; refused: act on it from the machine whose key "
                f"({signing.key_path()}) wrote it, or pass --trust-unsigned if you have checked "
                "the entry by hand",
            )
    problem = other_host(host, entry)
    if problem is not None:
        raise JournalError(host.name, where, f"{problem}; refused")


def other_machine(journal: Journal, entry: JournalEntry) -> str | None:
    """Why ``entry`` is not of the machine whose ``journal`` it is in (``None``: it is, or
    either is unknown): a journal copied whole onto another host, a clone of one golden image
    (its hostname differs even where its machine-id does not), is signed by the same admin and
    chained in itself, but its backups are another machine's files.

    >>> from proxgpu.rendering.changes import ChangeSet
    >>> entry = JournalEntry(id="1", status="applied", host="h", client="c", started="s",
    ...                      changeset=ChangeSet(host="h"), files=[], machine="pve1 (machine-id 1)")
    >>> other_machine(Journal([entry], {}, machine="pve2 (machine-id 1)"), entry)[:40]
    'made on pve1 (machine-id 1), not on pve2'
    """
    if entry.machine is None or journal.machine is None or entry.machine == journal.machine:
        return None
    return (
        f"made on {entry.machine}, not on {journal.machine}: a journal copied from another host "
        "(or this host renamed)"
    )


def host_root(host: Host) -> str:
    """The root a journal entry records, and is compared with, spelled one way: a tree on this
    machine as the kernel finds it (``.``, a trailing ``/`` and every link resolved), a root on
    another host without repeated or trailing slashes and ``.`` parts.

    >>> from proxgpu.host import DirectoryHost
    >>> tree = os.path.realpath("examples/hosts/ct200")
    >>> host_root(DirectoryHost("examples/hosts/ct200/")) == tree
    True
    """
    if isinstance(host, LocalHost):
        return os.path.realpath(host.root)
    return posixpath.normpath(re.sub("/+", "/", host.root))


def other_host(host: Host, entry: JournalEntry) -> str | None:
    """Why ``entry`` is not one of ``host``'s: made for another root (``None``: it is
    ``host``'s, or was written before proxgpu recorded the root).

    The host's name is not compared: it is how the admin reached the host (an ssh_config alias,
    an address, a port forwarded for this boot), which may differ between the apply and the
    rollback. An entry copied in from another host's journal is out of its place in this one's
    chain; a tree's root is where its files are (:func:`host_root`), so a tree copied elsewhere
    is told apart however either is spelled. An entry of a release that recorded the root as
    given is still taken where it is given the same way.

    >>> from proxgpu.host import DirectoryHost
    >>> from proxgpu.rendering.changes import ChangeSet
    >>> entry = JournalEntry(id="1", status="applied", host="pve9", client="me", started="now",
    ...                      changeset=ChangeSet(host="pve9"), files=[], root="/srv/pve9")
    >>> other_host(DirectoryHost("examples/hosts/ct200"), entry) # doctest: +ELLIPSIS
    'made for root /srv/pve9, not .../examples/hosts/ct200: copied from another tree, or use \
--root /srv/pve9'
    """
    root = host_root(host)
    if entry.root is not None and entry.root not in (root, host.root):
        return (
            f"made for root {entry.root}, not {root}: copied from another tree, or use "
            f"--root {entry.root}"
        )
    return None
