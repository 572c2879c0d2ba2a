"""Rollback (proxgpu.apply.rollback): byte for byte, one apply at a time, files changed since
refused unless forced, and the directories an apply created removed again."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.apply.journal import history
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.errors import ApplyError, FileChangedError, RollbackError, UsageError
from proxgpu.host.local import DirectoryHost, LocalHost
from proxgpu.rendering.changes import Action, ChangeSet, FileChange
from tests.support.trees import LXC, MODULES, changeset, snapshot, text

INITRAMFS_HOOK = "/etc/initramfs-tools/hooks/proxgpu"  # neither directory is in ct200
BIND_SCRIPT = "/usr/local/sbin/proxgpu-vfio-bind"  # ct200 has /usr, not /usr/local


def test_rollback_restores_byte_for_byte_and_removes_created_files(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    cs = changeset(root)
    applied = apply_changes(host, cs)
    assert snapshot(root) != original
    result = rollback(host)
    assert result.journal_id == applied.journal_id
    assert sorted(result.files) == sorted(f.path for f in cs.files)
    assert snapshot(root) == original, "contents, modes and the new directory are all undone"
    assert [e.status for e in history(host)] == ["rolled-back"]
    nothing = rollback(host)
    assert nothing.journal_id is None and nothing.files == []
    assert nothing.messages == ["nothing to roll back: no applied or unfinished journal entry"]
    with pytest.raises(RollbackError, match="already rolled back"):
        rollback(host, to=applied.journal_id)
    with pytest.raises(UsageError, match="no journal entry 20000101T000000Z-0000"):
        rollback(host, to="20000101T000000Z-0000")


def test_history_lists_entries_oldest_first_and_rollback_goes_back_one_at_a_time(
    root: Path,
) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    first = apply_changes(host, changeset(root))
    middle = snapshot(root)
    modules = text(root, MODULES)
    assert modules is not None
    second = apply_changes(
        host, ChangeSet(host="ct200", files=[FileChange(path=MODULES, before=modules, after="x\n")])
    )
    assert [e.id for e in history(host)] == [first.journal_id, second.journal_id]
    with pytest.raises(FileChangedError, match="changed since apply") as err:
        rollback(host, to=first.journal_id)
    assert err.value.path == MODULES
    assert rollback(host).journal_id == second.journal_id
    assert snapshot(root) == middle
    assert rollback(host).journal_id == first.journal_id
    assert snapshot(root) == original


def test_rollback_refuses_a_file_changed_since_the_apply_unless_forced(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    apply_changes(host, changeset(root))
    (root / LXC.lstrip("/")).write_text("edited by hand\n")
    with pytest.raises(FileChangedError, match="changed since apply") as err:
        rollback(host)
    assert err.value.path == LXC
    rollback(host, options=ApplyOptions(force=True))
    assert snapshot(root) == original


def test_a_dry_run_predicts_the_rollback_file_by_file_and_writes_nothing(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    cs = changeset(root).model_copy(update={"actions": [Action(argv=["update-grub"], why="")]})
    texts = {f.path: text(root, f.path) for f in cs.files}
    applied = apply_changes(host, cs)
    after_apply = snapshot(root)
    planned = rollback(host, options=ApplyOptions(dry_run=True))
    assert snapshot(root) == after_apply, "a dry run writes nothing, its journal neither"
    assert [e.status for e in history(host)] == ["applied"]
    assert planned.journal_id == applied.journal_id and planned.preview is not None
    for f in planned.preview.files:
        assert f.before == text(root, f.path), "before: the file as it is now"
        assert f.after == texts[f.path], "after: as the rollback leaves it"
    assert [a.argv for a in planned.preview.actions] == [["update-grub"]]
    assert "would run again: update-grub" in planned.messages
    done = rollback(host)
    assert sorted(planned.files) == sorted(done.files)
    assert snapshot(root) == original


def test_a_dry_run_refuses_what_the_rollback_refuses(root: Path) -> None:
    host = DirectoryHost(str(root))
    apply_changes(host, changeset(root))
    (root / LXC.lstrip("/")).write_text("edited by hand\n")
    with pytest.raises(FileChangedError, match="changed since apply") as err:
        rollback(host, options=ApplyOptions(dry_run=True))
    assert err.value.path == LXC
    forced = rollback(host, options=ApplyOptions(dry_run=True, force=True))
    assert forced.preview is not None
    (lxc,) = [f for f in forced.preview.files if f.path == LXC]
    assert lxc.before == "edited by hand\n" and lxc.after != lxc.before


def new_directories(root: Path) -> ChangeSet:
    """Creates two files whose directories ct200 lacks, two levels deep each."""
    return ChangeSet(
        host="ct200",
        files=[
            FileChange(path=INITRAMFS_HOOK, before=None, after="#!/bin/sh\n", mode=0o755),
            FileChange(path=BIND_SCRIPT, before=None, after="#!/bin/sh\n", mode=0o755),
        ],
    )


def test_rollback_removes_every_directory_the_apply_created(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    apply_changes(host, new_directories(root))
    [entry] = history(host)
    assert entry.created_dirs == [
        "/etc/initramfs-tools/hooks",
        "/usr/local/sbin",
        "/etc/initramfs-tools",
        "/usr/local",
    ]
    rollback(host)
    assert snapshot(root) == original
    assert not (root / "etc/initramfs-tools").exists() and not (root / "usr/local").exists()


def test_rollback_keeps_a_created_directory_someone_has_since_used(root: Path) -> None:
    host = DirectoryHost(str(root))
    apply_changes(host, new_directories(root))
    (root / "usr/local/bin").mkdir()
    (root / "usr/local/bin/tool").write_text("mine\n")
    rollback(host)
    assert not (root / "usr/local/sbin").exists() and not (root / "etc/initramfs-tools").exists()
    assert (root / "usr/local/bin/tool").read_text() == "mine\n"


def test_a_failed_apply_removes_every_directory_it_created(root: Path) -> None:
    host = LocalHost(str(root))  # live: the post-action runs, and fails
    original = snapshot(root)
    cs = new_directories(root).model_copy(update={"actions": [Action(argv=["false"])]})
    with pytest.raises(ApplyError, match="every file was restored"):
        apply_changes(host, cs)
    assert snapshot(root) == original
