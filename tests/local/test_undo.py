"""Undoing the last apply (:func:`proxgpu.pipeline.undoing.undo`, behind the collection's
gpu_rollback) on real directory trees: what a dry run says it would restore is what the rollback
then restores, a second undo changes nothing, and a change to the apply's own entries refuses
both until forced. And the one plan document every front end returns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.cli import main
from proxgpu.errors import FileChangedError, PlanRefusedError, UsageError
from proxgpu.host import DirectoryHost
from proxgpu.pipeline import split_host
from proxgpu.pipeline.undoing import undo, undo_target
from proxgpu.planning import SplitPolicy
from tests.support.trees import EXAMPLES, copy_example, snapshot

POLICY = SplitPolicy(lxc=200, vms=[(300, None)])
VM = "etc/pve/qemu-server/300.conf"
DRY = ApplyOptions(dry_run=True)


def applied(tmp_path: Path) -> tuple[Path, DirectoryHost, str]:
    """A copy of ct200 with the split applied: its root, the host, the journal id."""
    root = copy_example(tmp_path)
    host = DirectoryHost(str(root))
    journal_id = split_host(host, POLICY, how=ApplyOptions()).applied.journal_id
    assert journal_id is not None
    return root, host, journal_id


def test_a_dry_run_says_exactly_what_the_undo_then_restores(tmp_path: Path) -> None:
    original = snapshot(copy_example(tmp_path / "original"))
    root, host, journal_id = applied(tmp_path)
    # Something of the admin's own, after the apply: kept by the undo.
    (root / VM).write_text((root / VM).read_text() + "tags: mine\n")
    before = snapshot(root)
    planned = undo(host, options=DRY)
    assert snapshot(root) == before, "a dry run writes nothing"
    assert planned.changed and planned.journal_id == journal_id and planned.rolled_back is None
    done = undo(host)
    assert done.journal_id == journal_id and done.rolled_back is not None
    assert done.changes.files == planned.changes.files and done.diff == planned.diff
    # Everything is as before the apply but the admin's line.
    assert (root / VM).read_text().endswith("tags: mine\n")
    (root / VM).write_text((root / VM).read_text().removesuffix("tags: mine\n"))
    assert snapshot(root) == original
    # Undone already: nothing more to undo, in a dry run or not.
    assert not undo(host, options=DRY).changed and not undo(host).changed
    assert not undo(host, journal_id).changed


def test_a_second_undo_leaves_the_apply_before_alone(tmp_path: Path) -> None:
    root, host, first = applied(tmp_path)
    second = split_host(host, SplitPolicy(lxc=200, vms=[(300, 2)]), how=ApplyOptions())
    assert second.applied.journal_id is not None
    assert undo(host).journal_id == second.applied.journal_id
    kept = snapshot(root)
    assert undo(host).journal_id is None
    assert snapshot(root) == kept
    # Named, the first apply is undone too.
    assert undo_target(host, first) is not None and undo(host, first).journal_id == first


def test_a_changed_entry_of_the_apply_refuses_until_forced(tmp_path: Path) -> None:
    root, host, _ = applied(tmp_path)
    edited = (root / VM).read_text().replace("hostpci0: 0000:81:00", "hostpci0: 0000:82:00")
    (root / VM).write_text(edited)
    before = snapshot(root)
    for options in (DRY, ApplyOptions()):
        with pytest.raises(FileChangedError) as refused:
            undo(host, options=options)
        assert refused.value.path == "/etc/pve/qemu-server/300.conf"
        assert "hostpci0" in str(refused.value)
    assert snapshot(root) == before
    forced = undo(host, options=ApplyOptions(dry_run=True, force=True))
    (vm,) = [f for f in forced.changes.files if f.path.endswith("300.conf")]
    assert vm.before == edited and "hostpci0" not in (vm.after or "")
    assert undo(host, options=ApplyOptions(force=True)).changes.files == forced.changes.files
    assert "hostpci0" not in (root / VM).read_text()


def test_an_unknown_entry_is_a_usage_error(tmp_path: Path) -> None:
    _, host, _ = applied(tmp_path)
    with pytest.raises(UsageError, match="no journal entry 20990101"):
        undo(host, "20990101T000000.000000Z-0000", options=DRY)


def plan_json(capsys: pytest.CaptureFixture[str], root: Path) -> dict[str, object]:
    code = main(["plan", "--root", str(root), "--lxc", "200", "--vm", "300", "--json"])
    assert code == 0
    document: dict[str, object] = json.loads(capsys.readouterr().out)
    return document


def without_host(document: dict[str, object]) -> dict[str, object]:
    """The document with the change set's host name out: the CLI names a tree by its path."""
    changes = document["changes"]
    assert isinstance(changes, dict)
    return {**document, "changes": {k: v for k, v in changes.items() if k != "host"}}


def test_the_split_result_holds_the_plan_document_plan_json_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    host = DirectoryHost(str(root))
    checked = split_host(host, POLICY).plan_document()
    assert without_host(checked) == without_host(plan_json(capsys, root))
    assert checked["reboot_pending"] == [] and checked["changes"]["changed"] is True
    split_host(host, POLICY, how=ApplyOptions())
    # Applied, the tree's drivers are still the old ones: a reboot is pending, said the same.
    again = split_host(host, POLICY).plan_document()
    assert again["reboot_pending"] and again["changes"]["changed"] is False
    assert without_host(again) == without_host(plan_json(capsys, root))


def test_a_failure_is_the_error_document_plan_json_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """single-socket's firmware gives its GPUs no NUMA node: the plan is refused, and the
    library's error says so as the command line's --json does."""
    root = EXAMPLES / "single-socket"
    code = main(["plan", "--root", str(root), "--lxc", "101", "--json"])
    printed = json.loads(capsys.readouterr().out)["error"]
    with pytest.raises(PlanRefusedError) as refused:
        split_host(DirectoryHost(str(root)), SplitPolicy(lxc=101))
    document = refused.value.document()
    assert code == document["code"] == 9 and document["kind"] == "PlanRefusedError"
    assert printed == document
    assert document["fix"] and document["host"] == f"dir:{root}", "the host as given"
