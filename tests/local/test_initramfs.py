"""Inspection reads the running kernel's initramfs with Debian's real ``lsinitramfs``: a driver
loaded there (early KMS) beats a binding the initramfs does not carry, so the plan says so, and
a snapshot keeps the list.

The initramfs is a real one to ``lsinitramfs``: a gzip-compressed ``newc`` cpio archive made by
the real ``cpio``, holding the files an initramfs-tools image has for these modules.
"""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.capture import gather, write_tree
from proxgpu.inspection.recognition import GpuFilter
from proxgpu.paths import BIND_SCRIPT, MODPROBE_CONF
from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy
from proxgpu.rendering import render
from tests.support.tools import require_tool
from tests.support.trees import copy_example

KERNEL = "6.8.12-11-pve"
MODULES = f"usr/lib/modules/{KERNEL}/"
EARLY = (
    f"{MODULES}updates/dkms/nvidia.ko",
    f"{MODULES}kernel/drivers/vfio/pci/vfio-pci.ko.zst",
    "etc/modprobe.d/pve-blacklist.conf",
    "usr/bin/busybox",
)


def _initramfs(root: Path, files: tuple[str, ...]) -> None:
    """Write ``boot/initrd.img-KERNEL`` under ``root`` holding ``files`` (empty ones)."""
    cpio = require_tool("cpio", "cpio")
    staging = root.parent / "initramfs"
    for name in files:
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).touch()
    listing = "".join(f"{name}\n" for name in files).encode()
    archive = subprocess.run(
        [cpio, "--quiet", "-o", "-H", "newc"],
        cwd=staging,
        input=listing,
        check=True,
        capture_output=True,
    ).stdout
    (root / "boot").mkdir(exist_ok=True)
    (root / f"boot/initrd.img-{KERNEL}").write_bytes(gzip.compress(archive))


def _warnings(root: Path) -> list[str]:
    inventory = inspect(DirectoryHost(str(root)), GpuFilter())
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    return render(inventory, plan).warnings


def test_a_driver_in_the_initramfs_without_the_binding_is_told(tmp_path: Path) -> None:
    require_tool("lsinitramfs", "initramfs-tools-core")
    root = copy_example(tmp_path)
    _initramfs(root, EARLY)
    inventory = inspect(DirectoryHost(str(root)), GpuFilter())
    assert inventory.initramfs_files == sorted(["nvidia.ko", "vfio-pci.ko.zst"])
    told = [w for w in _warnings(root) if "initramfs" in w]
    assert told and told[0].startswith(f"nvidia loads from the initramfs of {KERNEL}"), told


def test_an_initramfs_that_carries_the_binding_is_fine(tmp_path: Path) -> None:
    require_tool("lsinitramfs", "initramfs-tools-core")
    root = copy_example(tmp_path)
    ours = (MODPROBE_CONF.lstrip("/"), BIND_SCRIPT.lstrip("/"))
    _initramfs(root, EARLY + ours)
    assert not [w for w in _warnings(root) if "initramfs" in w]


def test_a_snapshot_keeps_the_initramfs_list(tmp_path: Path) -> None:
    require_tool("lsinitramfs", "initramfs-tools-core")
    root = copy_example(tmp_path)
    _initramfs(root, EARLY)
    write_tree(gather(DirectoryHost(str(root))), str(tmp_path / "snap"))
    again = inspect(DirectoryHost(str(tmp_path / "snap")), GpuFilter())
    assert again.initramfs_files == ["nvidia.ko", "vfio-pci.ko.zst"]


def test_no_initramfs_reads_as_unknown(tmp_path: Path) -> None:
    inventory = inspect(DirectoryHost(str(copy_example(tmp_path))), GpuFilter())
    assert inventory.initramfs_files is None


def test_inspect_says_what_decides_the_boot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_tool("lsinitramfs", "initramfs-tools-core")
    root = copy_example(tmp_path)
    _initramfs(root, EARLY)
    assert main(["inspect", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"softdep kmod uses for nvidia: /lib/modules/{KERNEL}/modules.softdep:3" in out
    assert f"initramfs of {KERNEL}: GPU drivers nvidia; proxgpu's binding not in it" in out


def test_inspect_and_the_plan_agree_on_an_initramfs_with_half_the_binding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An initramfs with proxgpu's modprobe.d file but not its bind script (whose install hook
    the file names) lacks the binding for the plan; inspect says which half it has."""
    require_tool("lsinitramfs", "initramfs-tools-core")
    root = copy_example(tmp_path)
    _initramfs(root, (*EARLY, MODPROBE_CONF.lstrip("/")))
    assert main(["inspect", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    half = f"proxgpu's binding partly in it ({MODPROBE_CONF.rsplit('/', 1)[1]}, not "
    assert f"initramfs of {KERNEL}: GPU drivers nvidia; {half}" in out, out
    assert [w for w in _warnings(root) if w.startswith("nvidia loads from the initramfs")]


def test_inspect_names_every_module_that_could_claim_a_gpu_with_its_install_and_blacklist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nouveau would claim the NVIDIA GPUs and snd_hda_intel drives their audio: what kmod does
    for each decides the boot as much as nvidia's own line."""
    root = copy_example(tmp_path)
    local = root / "etc/modprobe.d/local.conf"
    local.write_text("blacklist nouveau\ninstall snd_hda_intel /bin/true\n")
    assert main(["inspect", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "softdep kmod uses for nouveau: none" in out
    assert "blacklisted nouveau: /etc/modprobe.d/local.conf:1" in out
    assert (
        "install command for snd_hda_intel: /etc/modprobe.d/local.conf:2: "
        "install snd_hda_intel /bin/true"
    ) in out
    assert "blacklisted nvidia" not in out and "install command for nvidia" not in out
