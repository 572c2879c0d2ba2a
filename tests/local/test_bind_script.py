"""The bind script proxgpu writes, run as modprobe runs it at boot, over a tree that stands in for
sysfs: mounted over ``/sys`` in a private mount namespace (``unshare -m``), since the script
writes the host's own absolute paths and the kernel's PCI core cannot be driven here.

What the kernel then makes of the overrides (``pci_match_device``: a device whose
``driver_override`` names a driver matches that driver only, ``new_id`` included) is the e2e
tier's to show in a real kernel.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.paths import BIND_SCRIPT, MODPROBE_CONF
from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy
from proxgpu.rendering import render
from proxgpu.rendering.changes import ChangeSet
from proxgpu.rendering.context import RenderOptions
from tests.support.tools import require_tool
from tests.support.trees import copy_example

MOVED = ("0000:81:00.0", "0000:81:00.1", "0000:f1:00.0", "0000:f1:00.1")
KEPT = {"0000:01:00.0": "nvidia", "0000:01:00.1": "snd_hda_intel", "0000:71:00.0": "nvidia"}


def _changes(root: Path) -> ChangeSet:
    inventory = inspect(DirectoryHost(str(root)))
    return render(inventory, plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)])))


def _sysfs(tmp_path: Path, addresses: list[str]) -> Path:
    """A stand-in /sys with an empty ``driver_override`` for each function, as the kernel has
    them at boot."""
    sysfs = tmp_path / "sys"
    for address in addresses:
        device = sysfs / "bus/pci/devices" / address
        device.mkdir(parents=True)
        (device / "driver_override").write_text("")
    return sysfs


def _run_at_boot(script: Path, sysfs: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with ``sysfs`` mounted over /sys, in a mount namespace of its own."""
    unshare = require_tool("unshare", "util-linux")
    if os.geteuid() != 0:
        pytest.skip("a private mount namespace needs root")
    return subprocess.run(
        [unshare, "-m", "sh", "-c", 'mount --bind "$1" /sys && sh "$2"', "sh", sysfs, script],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def _overrides(sysfs: Path) -> dict[str, str]:
    return {
        path.parent.name: path.read_text().strip()
        for path in (sysfs / "bus/pci/devices").glob("*/driver_override")
    }


def test_a_boot_marks_moved_functions_for_vfio_and_kept_ones_for_their_driver(
    tmp_path: Path,
) -> None:
    root = copy_example(tmp_path)
    changes = _changes(root)
    script = tmp_path / "bind"
    script.write_text(next(f.after or "" for f in changes.files if f.path == BIND_SCRIPT))
    # One kept function missing from sysfs (a GPU fallen off the bus) is passed over.
    sysfs = _sysfs(tmp_path, [*MOVED, *KEPT])
    done = _run_at_boot(script, sysfs)
    assert done.returncode == 0, done.stderr
    overrides = _overrides(sysfs)
    assert {a: overrides[a] for a in MOVED} == dict.fromkeys(MOVED, "vfio-pci")
    assert {a: overrides[a] for a in KEPT} == KEPT


def test_after_rollback_no_boot_marks_the_kept_functions(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    host = DirectoryHost(str(root))
    apply_changes(host, _changes(root))
    sysfs = _sysfs(tmp_path, list(KEPT))
    assert _run_at_boot(root / BIND_SCRIPT.lstrip("/"), sysfs).returncode == 0
    assert _overrides(sysfs) == KEPT
    rollback(host)
    # Nothing is left for modprobe to run when vfio-pci loads at the next boot.
    assert not (root / BIND_SCRIPT.lstrip("/")).exists()
    assert not (root / MODPROBE_CONF.lstrip("/")).exists()


def test_driverctl_binding_writes_no_kept_override(tmp_path: Path) -> None:
    # driverctl applies an override by unbinding and probing: at boot, for a kept GPU, that would
    # load nvidia before the vfio functions' own overrides are written.
    root = copy_example(tmp_path)
    inventory = inspect(DirectoryHost(str(root)))
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    changes = render(inventory, plan, RenderOptions(bind_method="driverctl"))
    written = {f.path: f.after for f in changes.files if f.after is not None}
    assert BIND_SCRIPT not in written
    assert [p for p in written if p.startswith("/etc/driverctl.d/pci-0000:01:00")] == []
    # So nothing keeps new_id away from the kept twins of the moved GPUs, and the plan says so.
    (said,) = [w for w in changes.warnings if "driverctl marks only the moved ones" in w]
    assert said.startswith("0000:01:00.0, 0000:01:00.1, 0000:11:00.0"), said
    assert "--bind-method modprobe" in said
    modprobe = render(inventory, plan, RenderOptions(bind_method="modprobe"))
    assert not [w for w in modprobe.warnings if "driverctl marks" in w]


def test_the_plan_says_what_the_kept_gpus_mark_means_for_a_later_passthrough(
    tmp_path: Path,
) -> None:
    """The mark keeps vfio-pci off a kept GPU whose driver failed to load, and also makes
    Proxmox's own passthrough of it fail after unbinding it (qemu-server's
    pci_dev_bind_to_vfio); the plan says so plainly, naming the kept GPUs (not their audio
    functions) and the command that undoes the mark."""
    changes = _changes(copy_example(tmp_path))
    [said] = [n for n in changes.notes if "driver_override=nvidia" in n]
    kept_gpus = [a for a, driver in KEPT.items() if driver == "nvidia"]
    assert all(address in said for address in kept_gpus)
    assert "0000:01:00.1" not in said, "an audio function is no GPU to pass through"
    assert "plan it with proxgpu (--vfio-gpus ADDRESS)" in said
    assert "echo > /sys/bus/pci/devices/0000:01:00.0/driver_override" in said
    inventory = inspect(DirectoryHost(str(copy_example(tmp_path, dest="driverctl"))))
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    plain = render(inventory, plan, RenderOptions(bind_method="driverctl"))
    assert not [n for n in plain.notes if "driver_override=" in n], "driverctl marks none"
