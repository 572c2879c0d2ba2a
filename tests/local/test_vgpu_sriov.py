"""NVIDIA vGPU on SR-IOV virtual functions (issue #19 point 6): the ``vgpu-sriov`` example host
(the vgpu host's four L40S with every GPU's VFs enabled, vGPU 17's ``nvidia/`` files on each VF;
VM 310 running a vGPU on VF 0000:81:01.2, stopped VM 311 configured on VF 0000:81:00.4, VM 400
without a GPU), inspected from its tree. Every VM config written is checked by Proxmox's own
code (pve-check), its lspci answering from the tree's sysfs as pve-common's reads it, so
qemu-server takes the path it takes on such a host (``nvidia`` and the VF passed as itself)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.errors import PlanRefusedError
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.capture import gather, write_tree
from proxgpu.inspection.inventory import Inventory, MdevType, VgpuType
from proxgpu.picture import assignments, inventory_tree, render_report
from proxgpu.picture.report import plan_report
from proxgpu.planning import Plan, Role, SplitPolicy, VgpuUse, plan_split
from proxgpu.rendering import render
from tests.support.pvevalidate import assert_all_ok, validate_tree
from tests.support.pvevalidate import write_tree as write_configs
from tests.support.trees import EXAMPLES, copy_example

ROOT = EXAMPLES / "vgpu-sriov"
GPU = "0000:81:00.0"
VM_310, VM_311, VM_400 = (f"/etc/pve/qemu-server/{vmid}.conf" for vmid in (310, 311, 400))
EIGHT_Q, WHOLE = VgpuType(id=1155, name="NVIDIA L40S-8Q"), VgpuType(id=1158, name="NVIDIA L40S-48Q")
USES = [
    VgpuUse(vmid=310, mdev_type="nvidia-1155", function="0000:81:01.2"),
    VgpuUse(vmid=311, mdev_type="nvidia-1155", function="0000:81:00.4"),
]


@cache
def host() -> Inventory:
    return inspect(DirectoryHost(str(ROOT)))


def vgpu_groups(plan: Plan) -> list[tuple[str, list[VgpuUse]]]:
    return [(g.gpus[0], g.vgpus) for g in plan.groups if g.role is Role.VGPU]


def vm_text(inventory: Inventory, plan: Plan, path: str) -> str:
    text = next(f.after for f in render(inventory, plan).files if f.path == path)
    assert text is not None
    return text


# --- inspection ------------------------------------------------------------------------------


def test_a_virtual_function_is_a_part_of_its_gpu_never_a_gpu_of_its_own() -> None:
    inventory = host()
    assert [g.address for g in inventory.gpus] == [
        "0000:01:00.0",
        "0000:11:00.0",
        GPU,
        "0000:91:00.0",
    ]
    gpu = inventory.gpu(GPU)
    assert gpu.functions == [GPU], "the VFs in its slot do not move with it"
    assert [vf.address for vf in gpu.virtual_functions] == [
        *(f"0000:81:00.{n}" for n in range(4, 8)),
        *(f"0000:81:01.{n}" for n in range(4)),
    ]
    assert gpu.iommu_group_peers == []
    running = next(vf for vf in gpu.virtual_functions if vf.address == "0000:81:01.2")
    assert (running.current_vgpu_type, running.creatable_vgpu_types) == (1155, [])
    assert running.live_vgpus == ["nvidia-1155"] and running.driver == "nvidia"
    free = gpu.virtual_functions[1]
    assert (free.current_vgpu_type, free.creatable_vgpu_types) == (0, [EIGHT_Q])
    assert inventory.gpu("0000:91:00.0").virtual_functions[0].creatable_vgpu_types == [
        EIGHT_Q,
        WHOLE,
    ]
    assert not any("Device Minor unknown" in w for w in inventory.warnings)


def test_a_snapshot_keeps_each_vfs_parent_and_vgpu_files(tmp_path: Path) -> None:
    snapshot = tmp_path / "snapshot"
    write_tree(gather(DirectoryHost(str(ROOT))), str(snapshot))
    again = inspect(DirectoryHost(str(snapshot)))
    assert again.gpus == host().gpus


def test_inspect_says_how_many_vfs_a_gpu_has_and_which_carry_a_vgpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["inspect", "--root", str(ROOT)]) == 0
    details = {
        line.split()[0]: line for line in capsys.readouterr().out.splitlines() if "SR-IOV" in line
    }
    assert details[GPU].endswith("8 SR-IOV virtual functions, a vGPU on 0000:81:01.2 (nvidia-1155)")
    assert details["0000:91:00.0"].endswith(", 8 SR-IOV virtual functions, no vGPU on them")


# --- the VMs' vGPUs keep their GPU --------------------------------------------------------------


def test_the_vgpus_on_a_gpus_vfs_keep_it_on_nvidia_and_the_rest_of_its_node_moves() -> None:
    plan = plan_split(host(), SplitPolicy(lxc=200))
    assert vgpu_groups(plan) == [(GPU, USES)]
    assert [a for g in plan.groups if g.role.moves_to_vfio for a in g.gpus] == ["0000:91:00.0"]
    binding = next(f.after for f in render(host(), plan).files if f.path.endswith("-vfio.conf"))
    assert binding is not None and "0000:91:00.0" in binding
    assert "0000:81:" not in binding, "neither the GPU nor any of its VFs is bound to vfio-pci"


def test_sending_the_gpu_to_vfio_is_refused_naming_the_vms_on_its_vfs() -> None:
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(host(), SplitPolicy(lxc=200, vfio_gpus=["81:00.0", "91:00.0"]))
    whats = [p.what for p in caught.value.problems]
    assert [w.split(":", 3)[:1] for w in whats] == [["0000"], ["0000"]]
    assert whats[0].startswith(f"{GPU} would go to vfio-pci, but VM 310 uses a vGPU of it")
    assert "'hostpci0: 0000:81:01.2,mdev=nvidia-1155,pcie=1'" in whats[0]
    assert "VM 311 uses a vGPU of it ('hostpci0: 0000:81:00.4," in whats[1]


def test_a_vf_passed_through_whole_keeps_its_gpu_too() -> None:
    """A VF exists only while its GPU's driver keeps SR-IOV on: a VM given one without mdev=
    (qemu-server binds that VF to vfio-pci) needs the GPU kept, not passed through."""
    configs = {**host().guest_configs, VM_400: "hostpci0: 0000:91:00.6,pcie=1\n"}
    inventory = replace(host(), guest_configs=configs)
    plan = plan_split(inventory, SplitPolicy(lxc=200))
    assert ("0000:91:00.0", [VgpuUse(vmid=400, mdev_type=None, function="0000:91:00.6")]) in (
        vgpu_groups(plan)
    )
    assert not any(g.role.moves_to_vfio for g in plan.groups)
    html = render_report([plan_report(inventory, SplitPolicy(lxc=200))])
    assert "VM 400 (VF 0000:91:00.6, passed through whole)" in html


# --- --vm VMID:vgpu=TYPE picks a free VF ----------------------------------------------------------


def test_a_requested_vgpu_names_the_first_free_vf_that_can_make_it(tmp_path: Path) -> None:
    plan = plan_split(host(), SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1155")]))
    added = VgpuUse(vmid=400, mdev_type="nvidia-1155", added=True, function="0000:81:00.5")
    assert vgpu_groups(plan) == [(GPU, [*USES, added])]
    text = vm_text(host(), plan, VM_400)
    assert "\nhostpci0: 0000:81:00.5,mdev=nvidia-1155,pcie=1\n" in text
    assert "\naffinity: 32-63\n" in text and "hostnodes=1," in text
    (warning,) = [w for w in plan.warnings if "VF 0000:81:00.5" in w]
    assert warning.startswith(
        f"{GPU}: the new vGPU goes on its VF 0000:81:00.5, which can make one now, but VM 311 "
        "(stopped) makes its own on this GPU at start"
    )
    configs: dict[str, str | None] = {VM_400: text, VM_310: host().guest_configs[VM_310]}
    configs[VM_311] = host().guest_configs[VM_311]
    tree = write_configs(tmp_path / "host", configs)
    assert_all_ok(validate_tree(tree, "vgpu-sriov", pci_root=ROOT))


def test_two_new_vgpus_get_a_vf_each() -> None:
    vgpus = [(400, "nvidia-1155"), (401, "nvidia-1155")]
    ((_, uses),) = vgpu_groups(plan_split(host(), SplitPolicy(lxc=200, vgpus=vgpus)))
    assert [u.function for u in uses if u.added] == ["0000:81:00.5", "0000:81:00.6"]


def test_a_type_the_busy_gpu_cannot_make_goes_on_a_vf_of_a_gpu_bound_for_vfio() -> None:
    """Once an 8Q vGPU exists, NVIDIA's default mode lets the GPU's other VFs make only 8Q."""
    plan = plan_split(host(), SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1158")]))
    added = VgpuUse(vmid=400, mdev_type="nvidia-1158", added=True, function="0000:91:00.4")
    assert vgpu_groups(plan) == [(GPU, USES), ("0000:91:00.0", [added])]
    assert next(g for g in plan.groups if g.role is Role.HOST).gpus == [
        "0000:01:00.0",
        "0000:11:00.0",
    ]


def test_planning_again_after_the_vgpu_is_written_adds_nothing() -> None:
    policy = SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1155")])
    text = vm_text(host(), plan_split(host(), policy), VM_400)
    again = replace(host(), guest_configs={**host().guest_configs, VM_400: text})
    ((_, uses),) = vgpu_groups(plan_split(again, policy))
    assert not any(u.added for u in uses) and uses[-1].function == "0000:81:00.5"


def test_no_free_vf_left_is_refused_with_each_gpus_count() -> None:
    """The 8Q the GPU at 81:00 runs is known to it; 48Q, which its VFs no longer list, is not."""
    only_node_1 = replace(host(), gpus=[g for g in host().gpus if g.numa_node == 1])
    policy = SplitPolicy(vfio_gpus=["91:00.0"], vgpus=[(400, "nvidia-1158")])
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(only_node_1, policy)
    (problem,) = caught.value.problems
    assert problem.what == (
        "VM 400 asks for a vGPU of type nvidia-1158, but no instance is left (available_instances "
        "after the plan: 0000:91:00.0 8 but named in --vfio-gpus)"
    )
    vgpus = [(400 + n, "nvidia-1155") for n in range(7)]
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(only_node_1, SplitPolicy(vfio_gpus=["91:00.0"], vgpus=vgpus))
    (problem,) = caught.value.problems
    assert problem.what == (
        "VM 406 asks for a vGPU of type nvidia-1155, but no instance is left (available_instances "
        f"after the plan: {GPU} 0 (of its 8 VFs, no free one lists it) and 0000:91:00.0 8 but "
        "named in --vfio-gpus)"
    )


def test_the_cli_json_text_and_tree_show_the_vfs() -> None:
    argv = ["plan", "--root", str(ROOT), "--lxc", "200", "--vm", "400:vgpu=nvidia-1155"]
    run = [sys.executable, "-m", "proxgpu", *argv]
    document = json.loads(subprocess.run([*run, "--json"], check=True, capture_output=True).stdout)
    (group,) = [g for g in document["groups"] if g["role"] == "vgpu"]
    assert [u["function"] for u in group["vgpus"]] == [
        "0000:81:01.2",
        "0000:81:00.4",
        "0000:81:00.5",
    ]
    text = subprocess.run(run, check=True, capture_output=True, text=True).stdout
    assert (
        "for vGPUs of VM 310 (nvidia-1155 on VF 0000:81:01.2), VM 311 (nvidia-1155 on VF "
        "0000:81:00.4), VM 400 (nvidia-1155 on VF 0000:81:00.5, added)"
    ) in text
    plan = plan_split(host(), SplitPolicy(lxc=200))
    tree = inventory_tree(host(), assignments(plan))
    assert "8 SR-IOV virtual functions, a vGPU on 0000:81:01.2 (nvidia-1155)" in tree
    assert "for vGPU: VM 310, VM 311" in tree


# --- NVIDIA's earlier interface: mediated devices on the VFs -----------------------------------


def mdev_on_vfs(tmp_path: Path) -> Path:
    """The example as NVIDIA's vGPU before 17 shows it: each VF offers its types as
    ``mdev_supported_types/`` (one instance each), VM 310's vGPU a mediated device on VF
    0000:81:01.2 that qemu-server named after it, and no ``nvidia/`` files."""
    root = copy_example(tmp_path, "vgpu-sriov")
    devices = root / "sys/bus/pci/devices"
    for vf in (d for gpu in host().gpus for d in gpu.virtual_functions):
        shutil.rmtree(devices / vf.address / "nvidia")
        kinds = [EIGHT_Q] if vf.live_vgpus else vf.creatable_vgpu_types or []
        for kind in kinds:
            base = devices / vf.address / "mdev_supported_types" / kind.mdev_type
            (base / "devices").mkdir(parents=True)
            (base / "name").write_text(f"{kind.name}\n")
            (base / "available_instances").write_text("0\n" if vf.live_vgpus else "1\n")
            (base / "device_api").write_text("vfio-pci\n")
    running = "00000000-0000-0000-0000-000000000310"
    link = devices / "0000:81:01.2/mdev_supported_types/nvidia-1155/devices" / running
    link.symlink_to(f"../../../{running}")
    return root


def test_mediated_devices_on_vfs_keep_their_gpu_and_a_new_one_names_a_free_vf(
    tmp_path: Path,
) -> None:
    root = mdev_on_vfs(tmp_path)
    inventory = inspect(DirectoryHost(str(root)))
    vf = inventory.gpu(GPU).virtual_functions[-2]
    assert vf.mdev_types == [
        MdevType(
            id="nvidia-1155",
            name="NVIDIA L40S-8Q",
            available=0,
            device_api="vfio-pci",
            instances=["00000000-0000-0000-0000-000000000310"],
        )
    ]
    plan = plan_split(inventory, SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1155")]))
    ((_, uses),) = vgpu_groups(plan)
    assert [(u.vmid, u.function) for u in uses] == [
        (310, "0000:81:01.2"),
        (311, "0000:81:00.4"),
        (400, "0000:81:00.5"),
    ]
    assert not any("no VM's config names" in w for w in plan.warnings)
    text = vm_text(inventory, plan, VM_400)
    tree = write_configs(tmp_path / "host", {VM_400: text})
    assert_all_ok(validate_tree(tree, "vgpu-sriov", pci_root=root))


def test_the_cli_refuses_a_vfio_gpu_whose_vf_holds_a_vgpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--root", str(ROOT), "--lxc", "200", "--vfio-gpus", "81:00.0,91:00.0"]
    assert main(argv) == 9
    assert "VM 310 uses a vGPU of it ('hostpci0: 0000:81:01.2," in capsys.readouterr().err


def test_a_vgpu_alone_changes_only_its_vm_and_no_gpu_changes_driver() -> None:
    """A request that needs no rebinding (a vGPU, no split asked for) leaves every GPU on the
    driver it has: no binding file, no reboot, only the VM's config; asking for a split too
    still moves the other node's GPUs."""
    inventory = host()
    alone = plan_split(inventory, SplitPolicy(vgpus=[(400, "nvidia-1155")]))
    roles = {address: group.role for group in alone.groups for address in group.gpus}
    assert sorted(roles) == sorted(gpu.address for gpu in inventory.gpus)
    assert set(roles.values()) == {Role.HOST, Role.VGPU}, "every GPU stays on nvidia"
    changes = render(inventory, alone)
    assert [f.path for f in changes.changed_files()] == ["/etc/pve/qemu-server/400.conf"]
    assert not changes.reboot_required and not changes.actions
    split = plan_split(inventory, SplitPolicy(vgpus=[(400, "nvidia-1155")], vfio_nodes=[1]))
    assert Role.VFIO in {group.role for group in split.groups}
