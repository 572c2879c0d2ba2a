"""What counts as a GPU on a real host tree, read by the gather script as on a host: a copy of
the ct200 example with an older server's onboard ATI ES1000 and a Xilinx FPGA (class 0x1200)
added. Neither is split; with no GPU left, ``proxgpu plan`` names both and says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.planning import SplitPolicy, plan_split
from tests.support.trees import copy_example

ES1000 = "0000:02:00.0"
FPGA = "0000:d1:00.0"


def add_function(
    root: Path, address: str, ids: dict[str, str], driver: str | None, node: int
) -> None:
    """A PCI function on a root bus of its own, in an IOMMU group of its own, as sysfs lays
    it out: its directory under /sys/devices, /sys/bus/pci/devices/ADDRESS a link to it."""
    directory = root / f"sys/devices/pci{address.rsplit(':', 1)[0]}/{address}"
    directory.mkdir(parents=True)
    for name, value in {**ids, "numa_node": str(node)}.items():
        (directory / name).write_text(f"{value}\n")
    group = int(address.split(":")[1], 16)
    (directory / "iommu_group").symlink_to(f"../../../kernel/iommu_groups/{group}")
    if driver:
        (directory / "driver").symlink_to(f"../../../bus/pci/drivers/{driver}")
    (root / "sys/bus/pci/devices" / address).symlink_to(
        f"../../../devices/{directory.parent.name}/{address}"
    )


def with_es1000_and_fpga(tmp_path: Path) -> Path:
    root = copy_example(tmp_path)
    es1000 = {"class": "0x030000", "vendor": "0x1002", "device": "0x515e"}
    add_function(root, ES1000, es1000, "radeon", 0)
    fpga = {"class": "0x120000", "vendor": "0x10ee", "device": "0x903f"}
    add_function(root, FPGA, fpga, None, 1)
    return root


def test_neither_the_es1000_nor_the_fpga_is_split(tmp_path: Path) -> None:
    inventory = inspect(DirectoryHost(str(with_es1000_and_fpga(tmp_path))))
    assert [gpu.address for gpu in inventory.gpus if gpu.bmc_display] == [ES1000]
    assert [(p.function.address, p.reason) for p in inventory.passed_over] == [
        (FPGA, "accelerator")
    ]
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    split = [address for group in plan.groups for address in group.gpus]
    assert len(split) == 8 and ES1000 not in split and FPGA not in split


def test_with_no_gpu_left_the_plan_names_what_inspection_saw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = with_es1000_and_fpga(tmp_path)
    for link in (root / "sys/bus/pci/devices").iterdir():
        if link.name not in (ES1000, FPGA) and (link / "class").read_text().startswith("0x03"):
            link.unlink()
    assert main(["plan", "--root", str(root), "--lxc", "200"]) == 9
    err = capsys.readouterr().err
    assert "holds no GPUs; inspection saw 2 devices it did not take" in err
    assert f"{ES1000} (1002:515e, class 0x030000, on radeon): the BMC's display" in err
    assert f"{FPGA} (10ee:903f, class 0x120000, no driver): a processing accelerator" in err
    assert "--gpu-vendor 10ee" in err and "lspci -nn | grep" not in err
