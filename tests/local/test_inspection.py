"""Inspection (proxgpu.inspection) of the example hosts, of changed copies of them and of this
machine: the gather script runs with ``sh`` against each tree."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from proxgpu.errors import SysfsError
from proxgpu.host.local import DirectoryHost, LocalHost
from proxgpu.inspection import inspect
from proxgpu.inspection.capture import gather
from proxgpu.inspection.recognition import GpuFilter
from tests.support.trees import copy_example, inspect_example

CT200_NODE0 = ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"]
CT200_NODE1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]


def test_ct200_has_four_gpus_per_numa_node() -> None:
    inv = inspect_example("ct200")
    assert inv.hostname == "ct200"
    assert [g.address for g in inv.gpus if g.numa_node == 0] == CT200_NODE0
    assert [g.address for g in inv.gpus if g.numa_node == 1] == CT200_NODE1
    assert [(n.id, n.cpus) for n in inv.numa_nodes] == [(0, "0-31"), (1, "32-63")]


def test_ct200_gpu_facts_come_from_sysfs_and_nvidia_procfs() -> None:
    gpu = inspect_example("ct200").gpu("0000:81:00.0")
    assert gpu.functions == ["0000:81:00.0", "0000:81:00.1"]
    assert [f.driver for f in gpu.function_info] == ["nvidia", "snd_hda_intel"]
    assert (gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id) == ("10de", "2bb1", "204b")
    assert gpu.model == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    assert gpu.nvidia_minor == 4
    assert gpu.nvidia_uuid is not None and gpu.nvidia_uuid.startswith("GPU-")
    assert gpu.iommu_group == 60
    assert gpu.iommu_group_peers == []
    assert gpu.local_cpus == "32-63"
    assert gpu.driver_override is None


def test_ct200_host_facts() -> None:
    inv = inspect_example("ct200")
    assert inv.pve_version == "8.4.1"
    assert inv.kernel == "6.8.12-11-pve"
    assert inv.boot_loader == "systemd-boot"
    assert inv.iommu_enabled
    assert inv.char_majors["nvidia-uvm"] == 511
    assert inv.char_majors["nvidia-caps"] == 508
    assert inv.nvidia_driver_version == "575.57.08"
    assert inv.cpu_vendor == "AuthenticAMD"
    assert inv.driver_modules["snd_hda_intel"] == "snd_hda_intel"
    assert "pcieport" not in inv.driver_modules, "a built-in driver has no module"
    assert "update-initramfs" in inv.commands and "driverctl" not in inv.commands
    assert "c 195:* rwm" in inv.guest_configs["/etc/pve/lxc/200.conf"]
    assert "machine: q35" in inv.guest_configs["/etc/pve/qemu-server/300.conf"]
    assert set(inv.host_files) >= {"/etc/kernel/cmdline", "/etc/modules"}
    assert inv.warnings == []


def test_numa_minus_one_is_unknown_not_zero() -> None:
    inv = inspect_example("single-socket")
    assert [g.numa_node for g in inv.gpus] == [None, None]
    assert inv.gpus[0].boot_vga
    assert inv.boot_loader == "grub"
    assert any("NUMA node unknown" in w and "0000:01:00.0" in w for w in inv.warnings)


def test_iommu_off_host_has_no_groups_and_says_so() -> None:
    inv = inspect_example("uneven-5-3")
    assert not inv.iommu_enabled
    assert [g.iommu_group for g in inv.gpus] == [None] * 8
    assert sum(g.numa_node == 0 for g in inv.gpus) == 5
    assert any("IOMMU is off" in w for w in inv.warnings)
    assert inv.gpus[0].class_code == "0x030200"  # a 3D controller counts as a GPU
    assert inv.gpus[0].functions == [inv.gpus[0].address]


def test_shared_iommu_group_lists_peers_and_marks_bridges() -> None:
    gpu = inspect_example("shared-iommu-group").gpu("0000:83:00.0")
    bridges = [p.address for p in gpu.iommu_group_peers if p.is_bridge]
    others = [p.address for p in gpu.iommu_group_peers if not p.is_bridge]
    assert bridges == ["0000:80:01.1", "0000:81:00.0", "0000:82:08.0", "0000:82:10.0"]
    assert others == ["0000:84:00.0", "0000:84:00.1"]


def test_real_h200_capture_reads_minor_uuid_and_majors() -> None:
    """examples/hosts/h200-vm was captured by `proxgpu snapshot` on a real NVIDIA H200 machine."""
    inv = inspect_example("h200-vm")
    assert [g.address for g in inv.gpus] == ["0000:00:06.0"]
    gpu = inv.gpus[0]
    assert (gpu.model, gpu.nvidia_minor, gpu.numa_node) == ("NVIDIA H200", 0, None)
    assert gpu.nvidia_uuid == "GPU-61752b83-b4c7-8eb9-0ba7-067ac6032d21"
    assert (inv.char_majors["nvidia-uvm"], inv.char_majors["nvidia-caps"]) == (238, 241)
    assert inv.nvidia_driver_version == "580.159.04"


def test_gpu_filter_by_vendor_and_class() -> None:
    assert inspect_example("ct200", GpuFilter(vendors=("1002",))).gpus == []
    audio = inspect_example("ct200", GpuFilter(classes=("0403",)))
    assert [g.address for g in audio.gpus][:2] == ["0000:01:00.1", "0000:11:00.1"]
    # The audio function is then the slot's "GPU", listed first, with the display function after.
    assert audio.gpus[0].functions == ["0000:01:00.1", "0000:01:00.0"]


def test_json_contract_names_and_types(example_host: Path) -> None:
    data = json.loads(json.dumps(asdict(inspect(DirectoryHost(str(example_host))))))
    assert isinstance(data["hostname"], str)
    assert isinstance(data["warnings"], list)
    for node in data["numa_nodes"]:
        assert isinstance(node["id"], int) and isinstance(node["cpus"], str)
    for gpu in data["gpus"]:
        assert len(gpu["address"]) == 12 and gpu["address"][4] == ":"
        assert gpu["functions"][0] == gpu["address"]
        for key in ("vendor_id", "device_id", "model"):
            assert isinstance(gpu[key], str)
        for key in ("numa_node", "iommu_group", "nvidia_minor"):
            assert gpu[key] is None or isinstance(gpu[key], int)
        assert gpu["driver"] is None or isinstance(gpu["driver"], str)


def test_unparsable_numa_node_of_a_gpu_fails_naming_host_and_path(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    (root / "sys/bus/pci/devices/0000:81:00.0/numa_node").write_text("one\n")
    with pytest.raises(SysfsError) as err:
        inspect(DirectoryHost(str(root)))
    assert err.value.path == "/sys/bus/pci/devices/0000:81:00.0/numa_node"
    assert str(err.value).startswith(f"dir:{root}: /sys/bus/pci/devices/0000:81:00.0/numa_node")
    # One line that says what to do: the kernel wrote it, or the snapshot tree is damaged.
    assert err.value.fix is not None and "take a new `proxgpu snapshot`" in err.value.fix
    assert "dmesg" in err.value.fix and "\n" not in str(err.value)
    assert str(err.value).endswith(f"not a number: 'one'; {err.value.fix}")


def test_device_with_missing_class_is_skipped_with_a_warning(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    (root / "sys/bus/pci/devices/0000:f1:00.0/class").unlink()
    inv = inspect(DirectoryHost(str(root)))
    assert "0000:f1:00.0" not in [g.address for g in inv.gpus]
    assert len(inv.gpus) == 7
    assert any("0000:f1:00.0/class" in w and "skipped" in w for w in inv.warnings)


def test_missing_nvidia_procfs_leaves_minor_unknown_with_a_warning(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    shutil.rmtree(root / "proc/driver/nvidia/gpus/0000:91:00.0")
    inv = inspect(DirectoryHost(str(root)))
    assert inv.gpu("0000:91:00.0").nvidia_minor is None
    assert any("0000:91:00.0/information" in w for w in inv.warnings)


def test_a_tree_without_pci_devices_is_refused(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    with pytest.raises(SysfsError, match="no PCI devices found"):
        inspect(DirectoryHost(str(tmp_path)))


def test_local_machine_inspection_reads_the_real_kernel() -> None:
    inv = inspect(LocalHost())
    assert inv.kernel == Path("/proc/sys/kernel/osrelease").read_text().strip()
    assert inv.numa_nodes, "every Linux kernel exposes at least node0"


def test_the_live_host_s_whole_files_are_read_through_their_links() -> None:
    """On this machine (root /, which no link leads out of) a config that is a link is read as
    what it leads to, as the kernel reads it: Debian's /etc/modules-load.d/modules.conf is a
    link to ../modules (systemd's package)."""
    capture = gather(LocalHost())
    linked = [path for path in capture.raw if Path(path).is_symlink()]
    assert linked, "a config that is a link was read (this Debian machine has one)"
    assert {path: Path(path).read_bytes() for path in capture.raw} == capture.raw


def test_inspection_is_one_command(example_host: Path) -> None:
    """One round trip, and a second only where /proc shows MIG compute instances (the mig
    example): their UUIDs are nvidia-smi's."""
    host = DirectoryHost(str(example_host))
    gather(host)
    assert host.commands_run == (2 if example_host.name == "mig" else 1)


def test_inspection_keeps_storage_cfg_for_reading_container_volumes(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    cfg = "zfspool: local-zfs\n\tpool rpool/data\n\tcontent rootdir\n"
    (root / "etc/pve/storage.cfg").write_text(cfg)
    assert inspect(DirectoryHost(str(root))).host_files["/etc/pve/storage.cfg"] == cfg
