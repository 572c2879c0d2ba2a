"""Transactional apply (proxgpu.apply.transaction) into a copy of an example host tree.

A :class:`DirectoryHost` writes into the copy (files only, nothing run); every file is written
atomically and journalled, a second apply of the same change set changes nothing, and an apply
interrupted or raced at any step leaves each file whole, old or new, for rollback to recover.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.apply.journal import history
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.errors import ApplyError, FileChangedError, HostUnreachableError, PreflightError
from proxgpu.host.local import DirectoryHost
from proxgpu.rendering.changes import ChangeSet, FileChange
from tests.support.faults import drop_after
from tests.support.trees import LXC, MODULES, VFIO_CONF, changeset, contents, ct200_plan, snapshot


def test_apply_writes_every_file_atomically_and_journals_it(root: Path) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root, actions=[["update-initramfs", "-u", "-k", "all"]])
    lxc_mode = stat.S_IMODE((root / LXC.lstrip("/")).stat().st_mode)
    result = apply_changes(host, cs)
    assert result.changed and result.journal_id
    assert [now for now, _, _ in contents(root, cs)] == [f.after for f in cs.files]
    assert result.files == [f.path for f in cs.files]
    assert host.commands_run == 4, "lock+read, stage, commit, finish: whatever the file count"
    assert result.actions_run == [] and "listed, not run" in result.messages[1]
    assert stat.S_IMODE((root / VFIO_CONF.lstrip("/")).stat().st_mode) == 0o600
    assert stat.S_IMODE((root / LXC.lstrip("/")).stat().st_mode) == lxc_mode
    [entry] = history(host)
    assert (entry.id, entry.status, entry.changeset) == (result.journal_id, "applied", cs)
    assert [(f.path, f.existed) for f in entry.files] == [
        (f.path, f.before is not None) for f in cs.files
    ]
    backups = root / "var/lib/proxgpu/backups" / entry.id
    assert (backups / "0").read_text() == cs.files[0].before
    journal = root / "var/lib/proxgpu/journal" / f"{entry.id}.json"
    assert stat.S_IMODE(backups.stat().st_mode) == 0o700, "backups hold guest configs"
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600
    assert '"existed": false' in (backups / "meta.json").read_text()
    assert not list(root.rglob("*.proxgpu-*.tmp")), "no temp file is left behind"
    assert not (root / "run/lock/proxgpu").exists(), "the lock is released"


def test_a_second_apply_of_the_same_changeset_changes_nothing(root: Path) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root)
    apply_changes(host, cs)
    again = apply_changes(host, cs)
    assert (again.changed, again.journal_id, again.messages) == (
        False,
        None,
        ["nothing to do: the host already matches the plan"],
    )
    assert len(history(host)) == 1
    fresh = ChangeSet(host="ct200", files=[FileChange(path=MODULES, before="a", after="a")])
    before = host.commands_run
    assert not apply_changes(host, fresh).changed
    assert host.commands_run == before, "an empty change set needs no command at all"
    live = apply_changes(host, cs, options=ApplyOptions(live=True), plan=ct200_plan(root))
    assert "nothing was rebound" in live.messages[-1]


def test_dry_run_writes_nothing(root: Path) -> None:
    host = DirectoryHost(str(root))
    original = snapshot(root)
    cs = changeset(root, actions=[["update-initramfs", "-u"]])
    result = apply_changes(host, cs, options=ApplyOptions(dry_run=True))
    assert (result.changed, result.dry_run, result.journal_id) == (True, True, None)
    assert result.files == [f.path for f in cs.files]
    assert [a.argv for a in result.actions] == [["update-initramfs", "-u"]]
    assert snapshot(root) == original
    assert not (root / "var/lib/proxgpu").exists()
    assert host.commands_run == 1


@pytest.mark.parametrize(
    ("step", "path"),
    [("backup", MODULES), ("write", MODULES)],
    ids=["while-staging", "while-renaming"],
)
def test_a_file_changed_during_the_apply_is_refused_and_the_rest_restored(
    root: Path, step: str, path: str
) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root)

    def meddle(current: str, message: str) -> None:
        if current == step:
            (root / path.lstrip("/")).write_text("changed by someone else\n")

    original = snapshot(root)
    with pytest.raises(FileChangedError, match="changed while being applied"):
        apply_changes(host, cs, progress=meddle)
    (root / path.lstrip("/")).write_text(next(f.before for f in cs.files if f.path == path) or "")
    assert snapshot(root) == original, "the files renamed before the conflict are back"
    assert [e.status for e in history(host)] == ["failed"]


@pytest.mark.parametrize("commands", [1, 2, 3])
def test_an_interrupted_apply_blocks_the_next_and_rollback_recovers(
    root: Path, monkeypatch: pytest.MonkeyPatch, commands: int
) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root)
    original = snapshot(root)
    drop_after(monkeypatch, host, commands)
    with pytest.raises((ApplyError, HostUnreachableError)):
        apply_changes(host, cs)
    for now, before, after in contents(root, cs):
        assert now in (before, after)
    fresh = DirectoryHost(str(root))
    if commands == 1:
        # Cut off right after taking the lock: nothing written, no journal entry. The lock's
        # owner (this process's apply) is gone, so the next apply takes it over and says so.
        again = apply_changes(fresh, cs)
        assert again.changed and any("took over" in m for m in again.messages)
        return
    with pytest.raises(PreflightError, match="rollback"):
        apply_changes(fresh, cs)
    rollback(fresh)
    assert snapshot(root) == original
    assert [e.status for e in history(fresh)] == ["rolled-back"]
    assert apply_changes(fresh, cs).changed, "the host is usable again"
