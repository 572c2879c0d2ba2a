"""The Python API for scripts (proxgpu.pipeline.split_host) on a copy of an example tree."""

from __future__ import annotations

from pathlib import Path

import proxgpu
from proxgpu.pipeline import split_host
from proxgpu.planning.model import SplitPolicy
from tests.support.trees import copy_example, tree_bytes

POLICY = SplitPolicy(lxc=200, vms=[(300, None)])


def test_check_reports_changes_and_writes_nothing(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    before = tree_bytes(root)
    with proxgpu.connect(root=str(root)) as host:
        result = split_host(host, POLICY, check=True)
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
        first = split_host(host, POLICY, check=False)
        second = split_host(host, POLICY, check=False)
    assert first.changed and first.applied.journal_id
    assert "dev0: /dev/nvidia0" in (root / "etc/pve/lxc/200.conf").read_text()
    assert not second.changed and second.diff == []


def test_the_whole_job_from_the_one_import_surface(tmp_path: Path) -> None:
    """What a script author guesses: every step by its ``proxgpu.`` name, no subpackage."""
    root = copy_example(tmp_path)
    with proxgpu.connect(root=str(root)) as host:
        applied = proxgpu.split_host(host, proxgpu.SplitPolicy(lxc=200, vms=[300]), check=False)
        assert not proxgpu.verify(host).drifted, "verify compares with the last apply"
        assert [e.id for e in proxgpu.history(host)] == [applied.applied.journal_id]
        assert proxgpu.undo(host).changed and not proxgpu.undo(host).changed
    # Everything as it was, but the journal and its backups, which keep the history.
    after = {p: b for p, b in tree_bytes(root).items() if not p.startswith("var/lib/proxgpu/")}
    assert after == tree_bytes(copy_example(tmp_path / "fresh"))
