"""What each container given NVIDIA GPUs must hold (proxgpu.planning.userspace): the NVIDIA
user space of the host's kernel module version, named as a next step in the plan (text and
JSON), the report and the Ansible result, and never for a guest that needs none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxgpu.ansible.results import split_result
from proxgpu.cli import main
from proxgpu.host import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.pipeline import split_host
from proxgpu.planning import MigSpec, SplitPolicy, plan_split
from tests.support.factories import ct200, make_gpu, with_gpus
from tests.support.trees import EXAMPLES, copy_example

#: The example hosts' nvidia module (their /proc/driver/nvidia/version).
HOST_DRIVER = "575.57.08"


def test_each_container_given_nvidia_gpus_needs_the_hosts_driver_version() -> None:
    inventory = inspect(DirectoryHost(str(EXAMPLES / "ct200")))
    plan = plan_split(inventory, SplitPolicy(lxc=["200", "201"], vms=[300]))
    needs = [(need.vmid, need.version, need.installer) for need in plan.userspace]
    run = f"NVIDIA-Linux-x86_64-{HOST_DRIVER}.run"
    assert needs == [(200, HOST_DRIVER, run), (201, HOST_DRIVER, run)], "no VM: vfio needs none"


def test_a_vgpu_vm_asks_nothing_of_any_container_though_its_gpu_stays_on_nvidia() -> None:
    inventory = inspect(DirectoryHost(str(EXAMPLES / "vgpu")))
    plan = plan_split(inventory, SplitPolicy(vgpus=[(400, "nvidia-1155")]))
    assert any(group.role == "vgpu" for group in plan.groups) and plan.userspace == []


def test_a_container_with_a_mig_instance_needs_the_same_user_space() -> None:
    inventory = inspect(DirectoryHost(str(EXAMPLES / "mig")))
    policy = SplitPolicy(lxc_mig=[MigSpec(vmid=200, gpu="0", gi=2)])
    assert [(n.vmid, n.version) for n in plan_split(inventory, policy).userspace] == [
        (200, HOST_DRIVER)
    ]


def test_a_container_given_amd_gpus_needs_no_nvidia_user_space() -> None:
    amd = [make_gpu(bus, 1, driver="amdgpu") for bus in ("c1", "d1")]
    inventory = with_gpus(ct200(), *(g.model_copy(update={"vendor_id": "1002"}) for g in amd))
    inventory = inventory.model_copy(
        update={"gpus": [g for g in inventory.gpus if g.vendor_id == "1002"]}
    )
    plan = plan_split(inventory, SplitPolicy(lxc=200))
    assert plan.groups and plan.userspace == []


def test_without_a_loaded_nvidia_module_the_step_says_where_the_version_will_show(
    tmp_path: Path,
) -> None:
    root = copy_example(tmp_path)
    (root / "proc/driver/nvidia/version").unlink()
    (need,) = plan_split(inspect(DirectoryHost(str(root))), SplitPolicy(lxc=200)).userspace
    assert need.version is None and need.installer is None
    assert "/proc/driver/nvidia/version on the host names the version" in need.step()


def test_plan_prints_it_as_a_next_step_and_its_json_holds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    assert main(["plan", "--root", str(root), "--lxc", "200", "--vm", "300"]) == 0
    steps = [line for line in capsys.readouterr().out.splitlines() if "next step:" in line]
    assert steps == [
        f"  next step: CT 200 needs NVIDIA's user space (libcuda, libnvidia-ml, nvidia-smi) of "
        f"{HOST_DRIVER}, the host's nvidia module, without a kernel module: in CT 200, "
        f"sh NVIDIA-Linux-x86_64-{HOST_DRIVER}.run --no-kernel-module, or the distribution's "
        f"NVIDIA packages of exactly {HOST_DRIVER}; again after every host driver upgrade "
        "(else NVML fails: Driver/library version mismatch)"
    ]
    assert main(["plan", "--root", str(root), "--lxc", "200", "--json"]) == 0
    (need,) = json.loads(capsys.readouterr().out)["userspace"]
    assert need["vmid"] == 200 and need["version"] == HOST_DRIVER


def test_the_report_and_the_ansible_result_name_it_too(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    report = tmp_path / "report.html"
    assert main(["report", "--root", str(root), "--lxc", "200", "-o", str(report)]) == 0
    html = report.read_text()
    assert "Next steps in the containers" in html
    assert "CT 200 needs NVIDIA&#39;s user space" in html and HOST_DRIVER in html
    done = split_host(DirectoryHost(str(root)), SplitPolicy(lxc=200))
    (step,) = split_result(done, diff=False, reboot=False)["next_steps"]
    assert step.startswith("CT 200 needs NVIDIA's user space") and HOST_DRIVER in step
