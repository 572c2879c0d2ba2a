"""What apply checks before it writes anything (proxgpu.apply.preflight), on tree copies.

A live host here is this machine with the copy as its root; pvesh is not installable, so the
``bin_dir`` fixture puts the stand-in of ``tests/support/standins.py`` first on PATH, answering
the guests' status queries.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.apply.journal import history
from proxgpu.apply.transaction import apply_changes
from proxgpu.errors import FileChangedError, NotRootError, PreflightError
from proxgpu.host.local import DirectoryHost, LocalHost
from proxgpu.inspection.inventory import Inventory
from tests.support.standins import fake_tool
from tests.support.trees import MODULES, VM, changeset, snapshot


def test_a_file_changed_after_inspection_is_refused(root: Path) -> None:
    host = DirectoryHost(str(root))
    cs = changeset(root)
    (root / MODULES.lstrip("/")).write_text("changed by someone else\n")
    edited = snapshot(root)
    with pytest.raises(FileChangedError, match="compare-and-swap failed") as err:
        apply_changes(host, cs)
    assert err.value.path == MODULES and f"{host.name}: {MODULES}:" in str(err.value)
    assert snapshot(root) == edited
    assert history(host) == [] and not (root / "run/lock/proxgpu").exists()


def test_a_guest_config_carrying_lock_is_refused(root: Path) -> None:
    vm = root / VM.lstrip("/")
    vm.write_text("lock: backup\n" + vm.read_text())
    with pytest.raises(PreflightError, match=r"300\.conf: the guest is locked \(backup\)"):
        apply_changes(DirectoryHost(str(root)), changeset(root))
    # Only the current section counts: a snapshot section's keys are history.
    vm.write_text(vm.read_text().removeprefix("lock: backup\n") + "\n[snap1]\nlock: snapshot\n")
    assert apply_changes(DirectoryHost(str(root)), changeset(root)).changed


@pytest.mark.parametrize(
    ("vmid", "refusal"),
    [("300", "VM 300 is running.*`qm shutdown 300`"), ("200", "container 200 is running.*pct")],
)
def test_a_running_guest_is_refused(
    root: Path, bin_dir: Path, live_host: LocalHost, vmid: str, refusal: str
) -> None:
    original = snapshot(root)
    (bin_dir / f"status-{vmid}").write_text("running")
    with pytest.raises(PreflightError, match=refusal):
        apply_changes(live_host, changeset(root))
    assert snapshot(root) == original and history(live_host) == []
    (bin_dir / f"status-{vmid}").write_text("stopped")
    assert apply_changes(live_host, changeset(root)).changed


def test_without_pvesh_guests_cannot_be_checked_so_apply_refuses_unless_told(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shutil.which("pvesh") is None
    host = LocalHost(str(root))
    with pytest.raises(PreflightError, match="pvesh is not on this host"):
        apply_changes(host, changeset(root))
    without = Inventory(source="test", hostname="ct200", commands=["fuser"])
    with pytest.raises(PreflightError, match="pvesh is not on this host"):
        apply_changes(host, changeset(root), inventory=without)
    assert history(host) == []
    assert apply_changes(host, changeset(root), options=ApplyOptions(skip_guest_check=True)).changed


def test_a_live_host_needs_root(root: Path, bin_dir: Path, live_host: LocalHost) -> None:
    fake_tool(bin_dir, "id", "echo 1000\n")  # the tests run as root: pretend not to be
    with pytest.raises(NotRootError, match="must run as root"):
        apply_changes(live_host, changeset(root))
    assert apply_changes(DirectoryHost(str(root)), changeset(root)).changed, "a tree needs none"
