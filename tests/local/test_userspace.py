"""What each container given NVIDIA GPUs must hold (proxgpu.planning.userspace): the NVIDIA
user space of the host's kernel module version, named as a next step in the plan (text and
JSON), the report and the Ansible result, and never for a guest that needs none."""

from __future__ import annotations

import json
from dataclasses import replace
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
    inventory = with_gpus(ct200(), *(replace(g, vendor_id="1002") for g in amd))
    inventory = replace(inventory, gpus=[g for g in inventory.gpus if g.vendor_id == "1002"])
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


def with_rootfs(tmp_path: Path, version: str) -> Path:
    """ct200 with its storage.cfg and CT 200's stopped rootfs (a ZFS subvolume) holding
    NVIDIA's user space of ``version``, as the .run installer lays it out."""
    root = copy_example(tmp_path)
    (root / "etc/pve/storage.cfg").write_text("zfspool: local-zfs\n\tpool rpool/data\n")
    lib = root / "rpool/data/subvol-200-disk-0/usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / f"libnvidia-ml.so.{version}").write_bytes(b"")
    (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{version}")
    return root


def next_steps_printed(root: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["plan", "--root", str(root), "--lxc", "200", "--vm", "300"]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if "next step:" in line]


def test_plan_names_a_container_holding_another_version_with_both_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = with_rootfs(tmp_path, "550.100")
    assert next_steps_printed(root, capsys) == [
        "  next step: CT 200 holds NVIDIA's user space 550.100 (read from its storage, "
        f"stopped), but the host's nvidia module is {HOST_DRIVER}: NVML fails there "
        "(Driver/library version mismatch); in CT 200, "
        f"sh NVIDIA-Linux-x86_64-{HOST_DRIVER}.run --no-kernel-module, or the distribution's "
        f"NVIDIA packages of exactly {HOST_DRIVER}"
    ]
    assert main(["plan", "--root", str(root), "--lxc", "200", "--json"]) == 0
    (need,) = json.loads(capsys.readouterr().out)["userspace"]
    assert (need["vmid"], need["version"]) == (200, HOST_DRIVER)
    held = need["holds"]
    assert (held["state"], held["seen"], held["nvml"]) == ("stopped", "storage", "550.100")
    assert held["where"] == "/usr/lib/x86_64-linux-gnu"


def test_a_container_holding_the_hosts_version_is_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = with_rootfs(tmp_path, HOST_DRIVER)
    assert next_steps_printed(root, capsys) == []
    done = split_host(DirectoryHost(str(root)), SplitPolicy(lxc=200))
    assert split_result(done, diff=False, reboot=False)["next_steps"] == []
    (need,) = done.plan.userspace
    assert need.holds is not None and need.holds.nvml == HOST_DRIVER


def test_a_container_holding_none_is_told_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = with_rootfs(tmp_path, HOST_DRIVER)
    for lib in (root / "rpool/data/subvol-200-disk-0/usr/lib/x86_64-linux-gnu").iterdir():
        lib.unlink()
    (step,) = next_steps_printed(root, capsys)
    assert step.startswith("  next step: CT 200 needs NVIDIA's user space (libcuda, ")
    assert step.endswith(
        "(else NVML fails: Driver/library version mismatch); CT 200 holds none now"
    )


def test_a_stopped_container_on_nvidias_lxc_hook_needs_none_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """LXC's hooks/nvidia (nvidia-container-cli) mounts the host's libraries in at each start
    when NVIDIA_VISIBLE_DEVICES is set to neither "" nor "void": holding none is then right."""
    root = with_rootfs(tmp_path, HOST_DRIVER)
    for lib in (root / "rpool/data/subvol-200-disk-0/usr/lib/x86_64-linux-gnu").iterdir():
        lib.unlink()
    config = root / "etc/pve/lxc/200.conf"
    hook = "lxc.hook.mount: /usr/share/lxc/hooks/nvidia\n"
    config.write_text(config.read_text() + hook + "lxc.environment: NVIDIA_VISIBLE_DEVICES=void\n")
    assert next_steps_printed(root, capsys), "void turns the hook off: it still needs its own"
    config.write_text(config.read_text() + "lxc.environment: NVIDIA_VISIBLE_DEVICES=all\n")
    assert next_steps_printed(root, capsys) == []
    (need,) = split_host(DirectoryHost(str(root)), SplitPolicy(lxc=200)).plan.userspace
    assert need.holds is not None and need.holds.hook and need.met
    assert need.step() == (
        "CT 200 gets the host's NVIDIA user space from NVIDIA's LXC hook at each start: "
        "nothing to do"
    )


def test_plan_prints_it_as_a_next_step_with_why_what_the_container_holds_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The example keeps no storage.cfg: where CT 200's rootfs lies is unknown.
    root = copy_example(tmp_path)
    assert next_steps_printed(root, capsys) == [
        f"  next step: CT 200 needs NVIDIA's user space (libcuda, libnvidia-ml, nvidia-smi) of "
        f"{HOST_DRIVER}, the host's nvidia module, without a kernel module: in CT 200, "
        f"sh NVIDIA-Linux-x86_64-{HOST_DRIVER}.run --no-kernel-module, or the distribution's "
        f"NVIDIA packages of exactly {HOST_DRIVER}; again after every host driver upgrade "
        "(else NVML fails: Driver/library version mismatch); what CT 200 holds now is unknown "
        "(storage 'local-zfs' is not in /etc/pve/storage.cfg); on the host, this tells: "
        "pct mount 200 && ls -l /var/lib/lxc/200/rootfs/usr/lib/x86_64-linux-gnu/"
        "libnvidia-ml.so.1; pct unmount 200"
    ]


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
