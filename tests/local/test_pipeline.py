"""The Python API for scripts (proxgpu.pipeline.split_host) on a copy of an example tree."""

from __future__ import annotations

from pathlib import Path

import pytest

import proxgpu
from proxgpu.apply import ApplyOptions
from proxgpu.pipeline import split_host
from proxgpu.planning.model import SplitPolicy
from proxgpu.version import version
from tests.support.trees import copy_example, tree_bytes

POLICY = SplitPolicy(lxc=200, vms=[(300, None)])


def test_check_reports_changes_and_writes_nothing(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    before = tree_bytes(root)
    with proxgpu.connect(root=str(root)) as host:
        result = split_host(host, POLICY)
    assert result.changed and result.applied.dry_run
    assert {d["after_header"] for d in result.diff} >= {
        "/etc/pve/lxc/200.conf",
        "/etc/modprobe.d/00-proxgpu-vfio.conf",
    }
    assert ["update-initramfs", "-u", "-k", "all"] in result.actions
    assert tree_bytes(root) == before


def test_apply_then_again_changes_nothing(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    with proxgpu.connect(root=str(root)) as host:
        first = split_host(host, POLICY, how=ApplyOptions())
        second = split_host(host, POLICY, how=ApplyOptions())
    assert first.changed and first.applied.journal_id
    assert "dev0: /dev/nvidia0" in (root / "etc/pve/lxc/200.conf").read_text()
    assert not second.changed and second.diff == []


def test_the_whole_job_from_the_one_import_surface(tmp_path: Path) -> None:
    """What a script author guesses: every step by its ``proxgpu.`` name, no subpackage."""
    root = copy_example(tmp_path)
    with proxgpu.connect(root=str(root)) as host:
        applied = proxgpu.split_host(
            host, proxgpu.SplitPolicy(lxc=200, vms=[300]), how=proxgpu.ApplyOptions()
        )
        assert not proxgpu.verify(host).drifted, "verify compares with the last apply"
        assert [e.id for e in proxgpu.history(host)] == [applied.applied.journal_id]
        assert proxgpu.undo(host).changed and not proxgpu.undo(host).changed
    # Everything as it was, but the journal and its backups, which keep the history.
    after = {p: b for p, b in tree_bytes(root).items() if not p.startswith("var/lib/proxgpu/")}
    assert after == tree_bytes(copy_example(tmp_path / "fresh"))


def test_a_progress_of_the_wrong_shape_is_refused_at_the_call_before_anything_runs(
    tmp_path: Path,
) -> None:
    """A script's ``progress`` that cannot take ``(step, message)`` is a TypeError naming that
    shape, raised before the host is touched, not deep inside a step halfway through."""
    root = copy_example(tmp_path)
    before = tree_bytes(root)
    host = proxgpu.connect(root=str(root))
    with pytest.raises(TypeError, match=r"progress must be callable as progress\(step, message\)"):
        split_host(host, SplitPolicy(lxc=200), how=ApplyOptions(), progress=lambda message: None)  # type: ignore[arg-type,misc]
    assert tree_bytes(root) == before
    said: list[tuple[str, str]] = []
    split_host(
        host, SplitPolicy(lxc=200), how=ApplyOptions(), progress=lambda *step: said.append(step)
    )
    assert said and tree_bytes(root) != before


def test_each_host_takes_targets_or_names_and_says_what_it_wants(tmp_path: Path) -> None:
    """Targets as a list (named as they print), a work of the wrong shape refused at the call,
    and anything else a TypeError that says what hosts may be."""
    trees = [proxgpu.Target(root=f"examples/hosts/cluster-3/{n}") for n in ("pve1", "pve2")]
    outcomes = proxgpu.each_host(trees, lambda host, say: proxgpu.inspect(host).node_name)
    assert {name: o.result for name, o in outcomes.items()} == {
        "examples/hosts/cluster-3/pve1": "pve1",
        "examples/hosts/cluster-3/pve2": "pve2",
    }
    with pytest.raises(TypeError, match=r"work must be callable as work\(host, say\)"):
        proxgpu.each_host(trees, lambda host: None)  # type: ignore[arg-type,misc]
    with pytest.raises(TypeError, match="hosts must be host names or Targets"):
        proxgpu.each_host([42], lambda host, say: None)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="a list of host names or Targets"):
        proxgpu.each_host("pve1", lambda host, say: None)


def test_the_version_and_a_split_s_diff_are_on_the_import_surface(tmp_path: Path) -> None:
    result = split_host(proxgpu.connect(root=str(copy_example(tmp_path))), SplitPolicy(lxc=200))
    diff = result.changes.unified_diff()
    assert diff.startswith("--- ") and "+++ /etc/pve/lxc/200.conf" in diff
    assert proxgpu.__version__ == version()
