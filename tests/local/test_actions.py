"""Post-actions (proxgpu.apply.actions): run on a live host after the files, again on rollback,
and a failing one restores every file. The live host is this machine rooted at a tree copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.apply.journal import history
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.errors import ApplyError, RollbackError
from proxgpu.host.local import LocalHost
from tests.support.trees import changeset, snapshot


def test_a_failing_post_action_restores_every_file(
    root: Path, tmp_path: Path, live_host: LocalHost
) -> None:
    log = tmp_path / "actions.log"
    record = ["sh", "-c", 'echo ran >> "$1"', "sh", str(log)]
    cs = changeset(root, actions=[record, ["false"]])
    original = snapshot(root)
    with pytest.raises(ApplyError, match="every file was restored from the backup") as err:
        apply_changes(live_host, cs)
    assert err.value.restored and "false exited with 1" in str(err.value)
    assert snapshot(root) == original
    assert log.read_text() == "ran\nran\n", "the action that ran is re-run on the old files"
    [entry] = history(live_host)
    assert entry.status == "failed" and "false exited with 1" in entry.message
    with pytest.raises(RollbackError, match="failed and was restored"):
        rollback(live_host, to=entry.id)


def test_post_actions_run_on_a_live_host_and_again_on_rollback(
    root: Path, tmp_path: Path, live_host: LocalHost
) -> None:
    log = tmp_path / "actions.log"
    cs = changeset(root, actions=[["sh", "-c", 'echo ran >> "$1"', "sh", str(log)]])
    original = snapshot(root)
    result = apply_changes(live_host, cs)
    assert result.actions_run == [cs.actions[0].argv] and log.read_text() == "ran\n"
    assert rollback(live_host).actions_run == [cs.actions[0].argv]
    assert log.read_text() == "ran\nran\n" and snapshot(root) == original
    apply_changes(live_host, cs)
    assert rollback(live_host, options=ApplyOptions(run_actions=False)).actions_run == []
