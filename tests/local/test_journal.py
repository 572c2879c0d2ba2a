"""The journal (proxgpu.apply.journal) as later versions read it: entries written by earlier
versions still read, and still roll back; and its order when admins' clocks disagree."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pytest_mock import MockerFixture

from proxgpu.apply import ApplyOptions, signing
from proxgpu.apply.journal import history, new_journal_id, read_journal
from proxgpu.apply.layout import Layout
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.apply.trust import chain_problems
from proxgpu.host.local import DirectoryHost
from proxgpu.host.scripts import run_script
from proxgpu.rendering.changes import Action
from tests.support.trees import changeset, snapshot


def test_a_journal_written_when_actions_had_a_kind_still_reads(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    apply_changes(host, changeset(root, actions=[["update-initramfs", "-u", "-k", "all"]]))
    [entry] = history(host)
    path = root / "var/lib/proxgpu/journal" / f"{entry.id}.json"
    data = json.loads(path.read_text())
    data["changeset"]["actions"] = [{**a, "kind": "post"} for a in data["changeset"]["actions"]]
    # Signed as the release that wrote the field signed it: over the document with the field.
    path.write_text(json.dumps(signing.sign(data, signing.load_key()), indent=2))
    [old] = history(host)
    assert old.changeset.actions == [Action(argv=["update-initramfs", "-u", "-k", "all"])]
    rollback(host)
    assert snapshot(root) == original


def test_an_apply_from_a_clock_behind_the_journal_s_newest_entry_comes_after_it(
    root: Path, mocker: MockerFixture
) -> None:
    """Two admins' machines whose clocks disagree: the second's entry must still be the newest,
    or a rollback would take the first for the latest apply and the chain would look reordered
    (the journal's order is its ids')."""
    host = DirectoryHost(str(root))
    original = snapshot(root)
    ahead = datetime.now(UTC) + timedelta(hours=1)
    clock_ahead = mocker.patch(
        "proxgpu.apply.transaction.new_journal_id",
        side_effect=lambda after=None: new_journal_id(ahead, after),
    )
    first = apply_changes(host, changeset(root)).journal_id
    assert first is not None and first.startswith(ahead.strftime("%Y%m%dT%H"))
    rollback(host)
    mocker.stop(clock_ahead)

    second = apply_changes(host, changeset(root))
    assert second.journal_id is not None and second.journal_id > first
    assert any(f"this machine's clock is behind {first}" in m for m in second.messages), (
        second.messages
    )
    entries = history(host)
    assert [e.id for e in entries] == [first, second.journal_id]
    assert entries[1].lock is not None and entries[1].lock < first, "the lock kept the clock's id"
    assert chain_problems(read_journal(host)) == {}
    # Its lock left behind (the apply finished but could not release it): breaking it knows
    # the lock for that apply's, not for one cut off before it wrote anything.
    lock = root / "run/lock/proxgpu"
    lock.mkdir(parents=True)
    (lock / "owner").write_text(f"id={entries[1].lock}\nop=apply\nclient=elsewhere\npid=1\n")
    broken = rollback(host, options=ApplyOptions(break_lock=True))
    assert "had finished, so nothing was rolled back" in broken.messages[-1], broken.messages
    assert rollback(host).journal_id == second.journal_id
    assert snapshot(root) == original


def test_an_apply_whose_clock_is_right_keeps_its_own_id(root: Path) -> None:
    host = DirectoryHost(str(root))
    applied = apply_changes(host, changeset(root))
    assert not any("clock is behind" in m for m in applied.messages)
    (entry,) = history(host)
    assert entry.id == applied.journal_id and entry.lock is None


def test_reading_named_entries_lists_nothing_else(root: Path) -> None:
    """The listing (every entry file's head, the machine, what retention removed) comes from
    the call without ids alone: a read of named entries, which rollback and verify make after
    listing, does not read every entry file on the host again."""
    host = DirectoryHost(str(root))
    apply_changes(host, changeset(root))
    journal = Layout.of(host).journal_dir
    listing = run_script(host, "journal", journal)
    ids = [record[0] for record in listing.of("id")]
    assert len(ids) == 1
    assert listing.first("machine") is not None
    read = run_script(host, "journal", journal, ids[0])
    assert [record[0] for record in read.of("entry")] == [ids[0]]
    assert not read.of("id")
    assert read.first("machine") is None
