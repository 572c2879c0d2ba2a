"""vGPU VMs on the host driver: the ``vgpu`` example host (4 L40S, VM 310 with an NVIDIA vGPU of
0000:81:00.0 on node 1, VM 400 without a GPU), inspected from its tree; every VM config written is
checked by Proxmox's own parser (pve-check)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.errors import PlanRefusedError, UsageError
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory, MdevType
from proxgpu.picture import assignments, inventory_svg
from proxgpu.picture.layout import svg_id
from proxgpu.planning import Plan, Role, SplitPolicy, VgpuUse, parse_vm_specs, plan_split
from proxgpu.rendering import render
from tests.support.pvevalidate import assert_all_ok, validate_tree, write_tree

ROOT = Path(__file__).resolve().parents[2] / "examples" / "hosts" / "vgpu"
VM_310 = "/etc/pve/qemu-server/310.conf"
VM_400 = "/etc/pve/qemu-server/400.conf"
#: VM 310's running vGPU, as qemu-server names it (hostpci index 0, VMID 310).
RUNNING_310 = "00000000-0000-0000-0000-000000000310"


@cache
def vgpu_host() -> Inventory:
    return inspect(DirectoryHost(str(ROOT)))


def vgpu_group(plan: Plan) -> list[tuple[str, int | None, list[VgpuUse]]]:
    return [(g.gpus[0], g.numa_node, g.vgpus) for g in plan.groups if g.role is Role.VGPU]


def test_inspection_reads_the_mdev_types_each_gpu_offers() -> None:
    gpu = vgpu_host().gpu("0000:81:00.0")
    assert gpu.mdev_types == [
        MdevType(
            id="nvidia-1155",
            name="NVIDIA L40S-8Q",
            available=5,
            device_api="vfio-pci",
            instances=[RUNNING_310],
        ),
        MdevType(id="nvidia-1158", name="NVIDIA L40S-48Q", available=0, device_api="vfio-pci"),
    ]
    assert [t.available for t in vgpu_host().gpu("0000:91:00.0").mdev_types] == [6, 1]


def test_the_vgpu_in_use_keeps_its_gpu_on_nvidia_and_the_rest_of_its_node_moves() -> None:
    plan = plan_split(vgpu_host(), SplitPolicy(lxc=200))
    assert vgpu_group(plan) == [("0000:81:00.0", 1, [VgpuUse(vmid=310, mdev_type="nvidia-1155")])]
    moved = [a for g in plan.groups if g.role.moves_to_vfio for a in g.gpus]
    assert moved == ["0000:91:00.0"]
    changes = render(vgpu_host(), plan)
    assert VM_310 not in [f.path for f in changes.changed_files()], "the vGPU entry stays"
    binding = next(f.after for f in changes.files if f.path.endswith("proxgpu-vfio.conf"))
    assert binding is not None and "0000:91:00.0" in binding and "0000:81:00.0" not in binding


def test_a_requested_vgpu_goes_on_the_gpu_serving_vgpus_and_pins_the_vm_there(
    tmp_path: Path,
) -> None:
    policy = SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1155")])
    plan = plan_split(vgpu_host(), policy)
    ((address, node, uses),) = vgpu_group(plan)
    assert (address, node) == ("0000:81:00.0", 1)
    assert uses[-1] == VgpuUse(vmid=400, mdev_type="nvidia-1155", added=True)
    text = next(f.after for f in render(vgpu_host(), plan).files if f.path == VM_400)
    assert text is not None
    assert "\nhostpci0: 0000:81:00.0,mdev=nvidia-1155,pcie=1\n" in text
    assert "\naffinity: 32-63\n" in text and "hostnodes=1," in text
    files: dict[str, str | None] = {VM_400: text, VM_310: vgpu_host().guest_configs[VM_310]}
    assert_all_ok(validate_tree(write_tree(tmp_path / "host", files), "vgpu"))


def test_a_type_another_gpu_offers_takes_a_vfio_gpu_before_the_containers() -> None:
    plan = plan_split(vgpu_host(), SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1158")]))
    assert [(a, n) for a, n, _ in vgpu_group(plan)] == [("0000:81:00.0", 1), ("0000:91:00.0", 1)]
    host = next(g for g in plan.groups if g.role is Role.HOST)
    assert host.gpus == ["0000:01:00.0", "0000:11:00.0"]


def test_a_vgpu_with_no_instance_left_is_refused_with_the_counts() -> None:
    policy = SplitPolicy(vfio_gpus=["91:00.0"], vgpus=[(400, "nvidia-1158")])
    inventory = vgpu_host()
    gpus = [g for g in inventory.gpus if g.numa_node == 1]
    only_node_1 = replace(inventory, gpus=gpus)
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(only_node_1, policy)
    (problem,) = caught.value.problems
    assert problem.code == "no-fit"
    assert problem.what == (
        "VM 400 asks for a vGPU of type nvidia-1158, but no instance is left (available_instances "
        "after the plan: 0000:81:00.0 0 and 0000:91:00.0 1 but named in --vfio-gpus)"
    )


def test_the_instances_the_plan_adds_count_against_what_is_left() -> None:
    vms = [(400 + i, "nvidia-1158") for i in range(3)]
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(vgpu_host(), SplitPolicy(lxc=200, vgpus=[*vms, (403, "nvidia-1158")]))
    (problem,) = caught.value.problems
    assert problem.what.startswith("VM 403 asks for a vGPU of type nvidia-1158, but no instance")
    assert "0000:01:00.0 0, 0000:11:00.0 0, 0000:81:00.0 0 and 0000:91:00.0 0" in problem.what


def test_a_type_no_gpu_offers_is_refused_naming_the_ones_offered() -> None:
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(vgpu_host(), SplitPolicy(vgpus=[(400, "nvidia-9")]))
    (problem,) = caught.value.problems
    assert "which no GPU of vgpu offers" in problem.what
    assert problem.fix == "ask for a type the GPUs offer: nvidia-1155 and nvidia-1158"


def test_a_vm_asking_for_passthrough_and_a_vgpu_is_named_twice() -> None:
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(vgpu_host(), SplitPolicy(vms=[(400, 1)], vgpus=[(400, "nvidia-1155")]))
    assert [p.what for p in caught.value.problems] == [
        "guest 400 is named more than once among the targets"
    ]


def test_planning_again_after_the_vgpu_is_written_adds_nothing() -> None:
    policy = SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1155")])
    text = next(
        f.after
        for f in render(vgpu_host(), plan_split(vgpu_host(), policy)).files
        if f.path == VM_400
    )
    assert text is not None
    again = replace(vgpu_host(), guest_configs={**vgpu_host().guest_configs, VM_400: text})
    ((_, _, uses),) = vgpu_group(plan_split(again, policy))
    assert [u.added for u in uses] == [False, False]
    assert VM_400 not in [f.path for f in render(again, plan_split(again, policy)).changed_files()]


@pytest.mark.parametrize(
    "spec", ["400:vgpu=", "400:vgpu=a/b", "x:vgpu=nvidia-1", "400:vgpu=a,romfile=x", "400:vgpu=a b"]
)
def test_a_vgpu_spec_qemu_server_would_refuse_is_a_usage_error(spec: str) -> None:
    with pytest.raises(UsageError, match="expected VMID:vgpu=TYPE"):
        parse_vm_specs([spec])


def test_the_cli_json_and_text_show_which_vms_use_the_gpu() -> None:
    argv = ["plan", "--root", str(ROOT), "--lxc", "200", "--vm", "400:vgpu=nvidia-1155"]
    run = [sys.executable, "-m", "proxgpu", *argv]
    document = json.loads(subprocess.run([*run, "--json"], check=True, capture_output=True).stdout)
    (group,) = [g for g in document["groups"] if g["role"] == "vgpu"]
    assert group["gpus"] == ["0000:81:00.0"] and group["driver"] == "nvidia"
    assert group["vgpus"] == [
        {"vmid": 310, "mdev_type": "nvidia-1155", "added": False, "function": None},
        {"vmid": 400, "mdev_type": "nvidia-1155", "added": True, "function": None},
    ]
    text = subprocess.run(run, check=True, capture_output=True, text=True).stdout
    assert (
        "NUMA node 1 -> nvidia (stays on the host driver for vGPU VMs), for vGPUs of "
        "VM 310 (nvidia-1155), VM 400 (nvidia-1155, added)"
    ) in text


def test_the_picture_colours_the_vgpu_gpu_and_badges_its_vms() -> None:
    plan = plan_split(vgpu_host(), SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1155")]))
    root = ET.fromstring(inventory_svg(vgpu_host(), assignments(plan)))
    boxes = {e.attrib.get("id"): e.attrib.get("class") for e in root.iter() if "id" in e.attrib}
    assert boxes[svg_id("gpu", "0000:81:00.0")] == "pg-gpu-vgpu"
    assert boxes[svg_id("gpu", "0000:01:00.0")] == "pg-gpu-host"
    texts = ["".join(e.itertext()) for e in root.iter() if e.tag.endswith("text")]
    assert "vGPU: VM 310, VM 400" in texts
    assert any(t.startswith("stays on the host driver for vGPU VMs") for t in texts)


# --- vGPUs configured in stopped VMs count against what is left --------------------------------

INSTANCE_LINK = (
    "sys/bus/pci/devices/0000:81:00.0/mdev_supported_types/nvidia-1155/devices/" + RUNNING_310
)


def one_gpu_tree(tmp_path: Path, free: int, *, stopped: list[int], running: bool) -> Path:
    """The vgpu tree with only 0000:81:00.0 offering nvidia-1155 (``free`` of it left now), VM
    310 running its vGPU there or not, and VMs ``stopped`` configured with one there too."""
    root = tmp_path / "vgpu"
    shutil.copytree(ROOT, root, symlinks=True)
    types = root / "sys/bus/pci/devices"
    for gpu in ("0000:01:00.0", "0000:11:00.0", "0000:91:00.0"):
        shutil.rmtree(types / gpu / "mdev_supported_types/nvidia-1155")
    (types / "0000:81:00.0/mdev_supported_types/nvidia-1155/available_instances").write_text(
        f"{free}\n"
    )
    if not running:
        (root / INSTANCE_LINK).unlink()
    vm_310 = (root / VM_310.lstrip("/")).read_text()
    for vmid in stopped:
        text = vm_310.replace("name: cad", f"name: vm{vmid}")
        (root / f"etc/pve/qemu-server/{vmid}.conf").write_text(text)
    return root


def refusal_of(root: Path, policy: SplitPolicy) -> str:
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(inspect(DirectoryHost(str(root))), policy)
    (problem,) = caught.value.problems
    return problem.what


WANT_400 = SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1155")])


def test_a_stopped_vms_vgpu_takes_an_instance_the_new_one_cannot_have(tmp_path: Path) -> None:
    root = one_gpu_tree(tmp_path, 2, stopped=[311, 312], running=True)
    assert refusal_of(root, WANT_400) == (
        "VM 400 asks for a vGPU of type nvidia-1155, but no instance is left (available_instances "
        "after the plan: 0000:81:00.0 0 (2 free now, promised to stopped VM 311 and VM 312))"
    )
    fewer = one_gpu_tree(tmp_path / "fewer", 2, stopped=[311], running=True)
    plan = plan_split(inspect(DirectoryHost(str(fewer))), WANT_400)
    [(_, _, uses)] = vgpu_group(plan)
    assert [(u.vmid, u.added) for u in uses] == [(310, False), (311, False), (400, True)]


def test_a_running_vms_vgpu_is_counted_once_and_a_stopped_ones_at_its_start(
    tmp_path: Path,
) -> None:
    running = one_gpu_tree(tmp_path, 1, stopped=[], running=True)
    assert vgpu_group(plan_split(inspect(DirectoryHost(str(running))), WANT_400))
    stopped = one_gpu_tree(tmp_path / "stopped", 1, stopped=[], running=False)
    assert refusal_of(stopped, WANT_400).endswith(
        "(available_instances after the plan: 0000:81:00.0 0 (1 free now, promised to stopped "
        "VM 310))"
    )


def test_configs_that_already_ask_for_more_than_is_left_are_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = one_gpu_tree(tmp_path, 1, stopped=[311, 312], running=True)
    assert main(["plan", "--root", str(root), "--lxc", "200"]) == 0
    assert (
        "warning: 0000:81:00.0: VM 311 and VM 312 (stopped) each need a nvidia-1155 vGPU at "
        "start, but only 1 can be made now (available_instances): a VM started without one "
        "fails to start; move one to another GPU or type"
    ) in capsys.readouterr().out


def test_the_cli_refuses_the_vgpu_a_stopped_vm_is_promised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = one_gpu_tree(tmp_path, 1, stopped=[311], running=True)
    argv = ["plan", "--root", str(root), "--lxc", "200", "--vm", "400:vgpu=nvidia-1155"]
    assert main(argv) != 0
    assert "promised to stopped VM 311" in capsys.readouterr().err


# --- vGPUs that exist but that no VM's config names (issue #24 point 2) --------------------------

#: A mediated device made by hand (not by qemu-server, whose UUIDs name a VMID).
BY_HAND = "0b8a5c3e-9d41-4f6e-8a27-3c5d9e1f7a20"


def with_live_mdev(tmp_path: Path, gpu: str, uuid: str) -> Path:
    """The vgpu tree with mediated device ``uuid`` of type nvidia-1155 on ``gpu``."""
    root = tmp_path / "vgpu"
    shutil.copytree(ROOT, root, symlinks=True)
    devices = root / f"sys/bus/pci/devices/{gpu}/mdev_supported_types/nvidia-1155/devices"
    devices.mkdir(exist_ok=True)
    (devices / uuid).symlink_to(f"../../../{uuid}")
    return root


def test_a_live_mdev_no_vm_names_keeps_its_gpu_on_the_host_driver_and_says_so(
    tmp_path: Path,
) -> None:
    inventory = inspect(DirectoryHost(str(with_live_mdev(tmp_path, "0000:91:00.0", BY_HAND))))
    plan = plan_split(inventory, SplitPolicy(lxc=200))
    assert [(a, n) for a, n, _ in vgpu_group(plan)] == [("0000:81:00.0", 1), ("0000:91:00.0", 1)]
    assert not any(g.role.moves_to_vfio for g in plan.groups)
    assert (
        f"0000:91:00.0 stays on the host driver for mediated device {BY_HAND} (nvidia-1155), "
        "which exists on it but no VM's config names (made by hand, or left behind by a VM): no "
        "container or VM is given the GPU; if nothing uses it, remove it (echo 1 > "
        f"/sys/bus/mdev/devices/{BY_HAND}/remove) and plan again"
    ) in plan.warnings


def test_naming_that_gpu_for_vfio_is_refused_with_how_to_remove_the_mdev(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # qemu-server's name for VM 310's hostpci1, which its config does not have.
    stale = "00000001-0000-0000-0000-000000000310"
    root = with_live_mdev(tmp_path, "0000:81:00.0", stale)
    argv = ["plan", "--root", str(root), "--lxc", "200", "--vfio-gpus", "81:00.0,91:00.0"]
    assert main(argv) == 9
    err = capsys.readouterr().err
    assert (
        f"0000:81:00.0 is named in --vfio-gpus, but mediated device {stale} (nvidia-1155) "
        "exists on it and no VM's config names it: moving the GPU to vfio-pci ends it"
    ) in err
    assert f"remove it (echo 1 > /sys/bus/mdev/devices/{stale}/remove) and plan again" in err


def test_a_vfs_vgpu_no_vm_names_keeps_its_gpu(tmp_path: Path) -> None:
    root = tmp_path / "vgpu-sriov"
    shutil.copytree(ROOT.parent / "vgpu-sriov", root, symlinks=True)
    (root / "sys/bus/pci/devices/0000:91:00.6/nvidia/current_vgpu_type").write_text("1158\n")
    plan = plan_split(inspect(DirectoryHost(str(root))), SplitPolicy(lxc=200))
    assert not any(g.role.moves_to_vfio for g in plan.groups)
    (warning,) = [w for w in plan.warnings if "no VM's config names" in w]
    assert warning.startswith(
        "0000:91:00.0 stays on the host driver for vGPU nvidia-1158 on VF 0000:91:00.6, which "
        "exists on it"
    )
    assert "(echo 0 > /sys/bus/pci/devices/0000:91:00.6/nvidia/current_vgpu_type)" in warning
