"""The container's config after a split: device access for every user, cores as pinned; and
whether each guest's memory fits the NUMA node it is kept on.

Each test takes the ct200 example (inspected once) and changes the one fact it is about.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from proxgpu.errors import PlanRefusedError
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory, NvidiaCap
from proxgpu.inspection.mig import instance_cap
from proxgpu.planning import SplitPolicy, plan_split
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering import render
from proxgpu.rendering.changes import ChangeSet
from proxgpu.rendering.nodes import NODES_SCRIPT

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hosts"
CT_200 = "/etc/pve/lxc/200.conf"
VM_300 = "/etc/pve/qemu-server/300.conf"
NODE_1_MIB = 528476160 // 1024  # ct200's /sys/devices/system/node/node1/meminfo


@cache
def ct200() -> Inventory:
    return inspect(DirectoryHost(str(EXAMPLES / "ct200")))


def with_configs(configs: dict[str, str]) -> Inventory:
    return replace(ct200(), guest_configs={**ct200().guest_configs, **configs})


def rendered(inventory: Inventory, policy: SplitPolicy) -> ChangeSet:
    return render(inventory, plan_split(inventory, policy))


def after(changes: ChangeSet, path: str) -> str:
    return next(f.after for f in changes.files if f.path == path) or ""


def dev_entries(changes: ChangeSet) -> dict[str, str]:
    entries = GuestConfig.parse(after(changes, CT_200)).entries()
    return {v.split(",")[0]: v for k, v in entries if k.startswith("dev")}


def test_new_nvidia_nodes_are_open_to_every_user_of_the_container_as_on_the_host() -> None:
    devs = dev_entries(rendered(ct200(), SplitPolicy(lxc=200)))
    assert devs["/dev/nvidia0"] == "/dev/nvidia0,mode=0666"
    assert devs["/dev/nvidiactl"] == "/dev/nvidiactl,mode=0666"
    assert all(v.endswith(",mode=0666") for v in devs.values())


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("/dev/nvidia0", "/dev/nvidia0,mode=0666"),
        ("/dev/nvidia0,uid=0", "/dev/nvidia0,uid=0,mode=0666"),
        ("/dev/nvidia0,gid=44", "/dev/nvidia0,gid=44"),
        ("/dev/nvidia0,mode=0660", "/dev/nvidia0,mode=0660"),
        ("/dev/nvidia0,deny-write=1,mode=0640", "/dev/nvidia0,deny-write=1,mode=0640"),
    ],
)
def test_an_access_policy_the_config_states_stays(entry: str, expected: str) -> None:
    text = "arch: amd64\nostype: debian\ndev0: " + entry + "\n"
    devs = dev_entries(rendered(with_configs({CT_200: text}), SplitPolicy(lxc=200)))
    assert devs["/dev/nvidia0"] == expected


def test_new_nodes_take_the_policy_the_gpu_nodes_share() -> None:
    text = "arch: amd64\nostype: debian\ndev0: /dev/nvidia0,gid=44\ndev1: /dev/nvidiactl,gid=44\n"
    devs = dev_entries(rendered(with_configs({CT_200: text}), SplitPolicy(lxc=200)))
    assert devs["/dev/nvidia1"] == "/dev/nvidia1,gid=44"


# --- MIG capability nodes -------------------------------------------------------------------------

GI_ACCESS = "/proc/driver/nvidia/capabilities/gpu0/mig/gi1/access"


def with_caps(text: str | None = None) -> Inventory:
    """ct200 with MIG's config and monitor nodes (no /proc file captured for them), a GPU
    instance's access node of GPU 0 whose /proc file was captured, and a node of unknown
    capability."""
    caps = [f"/dev/nvidia-caps/nvidia-cap{n}" for n in (1, 2, 12, 99)]
    inventory = with_configs({CT_200: text}) if text else ct200()
    return replace(
        inventory,
        device_nodes=[*inventory.device_nodes, *caps],
        nvidia_caps=[NvidiaCap(proc_path=GI_ACCESS, minor=12, mode=0o444)],
    )


def test_a_host_that_narrows_nvidias_device_files_narrows_the_containers_too(
    tmp_path: Path,
) -> None:
    # NVreg_DeviceFileMode=0660 and DeviceFileGID=44, as the driver's params file prints them.
    root = tmp_path / "host"
    shutil.copytree(EXAMPLES / "ct200", root, symlinks=True)
    params = root / "proc/driver/nvidia/params"
    params.write_text(
        "ModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 44\nDeviceFileMode: 432\n"
    )
    inventory = inspect(DirectoryHost(str(root)))
    assert (inventory.nvidia_device_file_mode, inventory.nvidia_device_file_gid) == (0o660, 44)
    changes = rendered(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    entries = dev_entries(changes)
    assert entries["/dev/nvidia0"] == "/dev/nvidia0,mode=0660"
    assert entries["/dev/nvidiactl"] == "/dev/nvidiactl,mode=0660"
    # nvidia-modprobe makes nvidia-modeset from the same params (nvidia_modeset_mknod), but
    # nvidia-uvm's nodes 0666 whatever they say (nvidia_uvm_mknod reads no params file).
    assert entries["/dev/nvidia-modeset"] == "/dev/nvidia-modeset,mode=0660"
    assert entries["/dev/nvidia-uvm"] == "/dev/nvidia-uvm,mode=0666"
    assert any("add gid=44" in w for w in changes.warnings)


def test_capability_nodes_are_given_no_wider_than_nvidia_makes_them() -> None:
    changes = rendered(with_caps(), SplitPolicy(lxc=200))
    devs = dev_entries(changes)
    assert devs["/dev/nvidia-caps/nvidia-cap1"] == "/dev/nvidia-caps/nvidia-cap1,mode=0400"
    assert devs["/dev/nvidia-caps/nvidia-cap2"] == "/dev/nvidia-caps/nvidia-cap2,mode=0444"
    assert devs["/dev/nvidia-caps/nvidia-cap12"] == "/dev/nvidia-caps/nvidia-cap12,mode=0444"
    assert "/dev/nvidia-caps/nvidia-cap99" not in devs, "nothing says how to make it at boot"
    assert any(w.startswith("/dev/nvidia-caps/nvidia-cap99: not given") for w in changes.warnings)
    assert any(
        w.startswith("/dev/nvidia-caps/nvidia-cap12: a MIG instance's capability")
        for w in changes.warnings
    )


def test_a_container_gets_no_other_gpu_s_mig_instance() -> None:
    """GPU 0's instance is not CT 200's when GPU 0 is not (issue #19 point 4)."""
    policy = SplitPolicy(lxc=200, host_gpus=["0000:11:00.0", "0000:61:00.0"])
    devs = dev_entries(rendered(with_caps(), policy))
    assert "/dev/nvidia1" in devs
    assert "/dev/nvidia-caps/nvidia-cap1" in devs
    assert "/dev/nvidia-caps/nvidia-cap12" not in devs


def test_the_instances_of_a_mig_gpu_the_next_boot_numbers_anew_get_their_new_nodes() -> None:
    """GPU 1 in MIG mode becomes GPU 0 once GPU 0 leaves: its instances' /proc files and minors
    change with it, by NVIDIA's fixed table, so the container gets the nodes of the new minor
    and the unit makes them from the new /proc file."""
    old = instance_cap(1, 1)  # GPU instance 1 of the GPU at minor 1: nvidia-cap147
    moving = replace(
        with_caps(),
        nvidia_caps=[old],
        device_nodes=[*with_caps().device_nodes, f"/dev/nvidia-caps/nvidia-cap{old.minor}"],
    )
    changes = rendered(moving, SplitPolicy(lxc=200, host_gpus=["0000:11:00.0", "0000:61:00.0"]))
    devs = dev_entries(changes)
    assert "/dev/nvidia-caps/nvidia-cap1" in devs
    assert f"/dev/nvidia-caps/nvidia-cap{old.minor}" not in devs
    assert "/dev/nvidia-caps/nvidia-cap12" in devs, "GPU instance 1 of the GPU at minor 0"
    assert (
        "CT 200: its GPU gets another nvidia minor at the next boot, and its MIG instances other "
        f"capability nodes with it: /dev/nvidia-caps/nvidia-cap{old.minor} becomes "
        "/dev/nvidia-caps/nvidia-cap12"
    ) in changes.notes
    script = next(f.after or "" for f in changes.files if f.path == NODES_SCRIPT)
    assert "cap driver/nvidia/capabilities/gpu0/mig/gi1/access\n" in script


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("mode=0666", "mode=0400"),  # what proxgpu wrote before it knew better
        ("gid=44", "gid=44,mode=0400"),  # pve-container's default 0660 is wider too
        ("mode=0400,deny-write=1", "mode=0400,deny-write=1"),
    ],
)
def test_a_capability_entry_wider_than_the_host_s_node_is_narrowed(
    entry: str, expected: str
) -> None:
    text = f"arch: amd64\nostype: debian\ndev0: /dev/nvidia-caps/nvidia-cap1,{entry}\n"
    devs = dev_entries(rendered(with_caps(text), SplitPolicy(lxc=200)))
    assert devs["/dev/nvidia-caps/nvidia-cap1"] == f"/dev/nvidia-caps/nvidia-cap1,{expected}"


# --- cores ---------------------------------------------------------------------------------------


def ct_with(line: str) -> Inventory:
    return with_configs({CT_200: f"arch: amd64\nostype: debian\n{line}\n"})


@pytest.mark.parametrize(
    ("before", "warned"), [("cores: 8", True), ("cores: 64", False), ("", False)]
)
def test_cores_match_the_cpus_the_container_is_pinned_to(before: str, warned: bool) -> None:
    changes = rendered(ct_with(before), SplitPolicy(lxc=200))
    config = GuestConfig.parse(after(changes, CT_200))
    pinned = config.get("lxc.cgroup2.cpuset.cpus")
    assert pinned == "0-31"  # ct200's NUMA node 0
    assert config.get("cores") == "32"
    assert any("CT 200: cores 8 becomes 32" in w for w in changes.warnings) == warned


# --- memory fit ----------------------------------------------------------------------------------


def vm_with_memory(memory: int, extra: str = "") -> Inventory:
    text = ct200().guest_configs[VM_300].replace("memory: 262144", f"memory: {memory}")
    return with_configs({VM_300: text + extra})


def test_a_vm_bound_to_a_node_too_small_for_it_is_refused() -> None:
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(vm_with_memory(NODE_1_MIB + 1), SplitPolicy(lxc=200, vms=[(300, None)]))
    assert [p.code for p in caught.value.problems] == ["memory"]
    assert f"which has {NODE_1_MIB} MiB" in caught.value.problems[0].what


@pytest.mark.parametrize(
    ("memory", "extra", "warning"),
    [
        (NODE_1_MIB - 1, "", "little is left there"),
        (NODE_1_MIB // 2, "", None),
        (NODE_1_MIB * 2, "hotplug: memory\n", None),  # not bound: no numa0 with memory hotplug
        (NODE_1_MIB * 2, "numa0: cpus=0-31,hostnodes=0-1,memory=1024,policy=bind\n", None),
    ],
)
def test_a_vm_close_to_its_node_s_size_is_warned_about(
    memory: int, extra: str, warning: str | None
) -> None:
    plan = plan_split(vm_with_memory(memory, extra), SplitPolicy(lxc=200, vms=[(300, None)]))
    found = [w for w in plan.warnings if w.startswith("VM 300 has")]
    if warning is None:
        assert found == []
    else:
        assert len(found) == 1 and warning in found[0]


def test_a_container_limited_beyond_its_node_is_warned_about() -> None:
    plan = plan_split(ct_with(f"memory: {NODE_1_MIB * 2}"), SplitPolicy(lxc=200))
    assert any(w.startswith("CT 200 has") and "more than the node has" in w for w in plan.warnings)


# --- no locality: cpuset and cores left alone ----------------------------------------------------


def _container_after(
    argv: list[str], capsys: pytest.CaptureFixture[str], path: str
) -> tuple[str, list[str]]:
    """The container config ``plan --json`` would write, and the plan's notes (what it does,
    asking nothing)."""
    from proxgpu.cli import main  # noqa: PLC0415 - only these tests go through the command line

    assert main(["plan", *argv, "--json"]) == 0
    changes = json.loads(capsys.readouterr().out)["changes"]
    after = next(f["after"] for f in changes["files"] if f["path"] == path)
    return after, changes["notes"]


def test_on_a_host_of_one_numa_node_cpuset_and_cores_are_left_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = EXAMPLES / "single-socket"
    argv = ["--root", str(root), "--lxc", "101", "--host-gpus", "0000:01:00.0"]
    after, warnings = _container_after(
        [*argv, "--vfio-gpus", "0000:0b:00.0"], capsys, "/etc/pve/lxc/101.conf"
    )
    config = GuestConfig.parse(after)
    assert config.get("cores") == "8", "as the admin left it"
    assert config.get("lxc.cgroup2.cpuset.cpus") is None
    assert config.get("lxc.cgroup2.cpuset.mems") is None
    assert "dev3: /dev/nvidia-uvm-tools,gid=44" in after, "the GPUs are still given"
    assert (
        "CT 101: cpuset and cores left as they are: pinning gives no locality, "
        "the host has one NUMA node"
    ) in warnings


def test_gpus_of_unknown_node_leave_the_containers_cpuset_and_cores_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ct200"
    shutil.copytree(EXAMPLES / "ct200", root, symlinks=True)
    for gpu in root.glob("sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0*/numa_node"):
        gpu.write_text("-1\n")  # firmware without locality for this slot
    kept = ["--host-gpus", "0000:01:00.0"]  # the others go to vfio-pci
    after, warnings = _container_after(
        ["--root", str(root), "--lxc", "200", "--vm", "300", *kept], capsys, CT_200
    )
    before = GuestConfig.parse((EXAMPLES / "ct200" / CT_200.lstrip("/")).read_text())
    config = GuestConfig.parse(after)
    assert config.get("cores") == before.get("cores")
    assert config.get("lxc.cgroup2.cpuset.cpus") == before.get("lxc.cgroup2.cpuset.cpus")
    assert any("the NUMA node of its GPUs is unknown" in w for w in warnings), warnings


def test_two_known_nodes_still_pin_the_container(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--root", str(EXAMPLES / "ct200"), "--lxc", "200", "--vm", "300"]
    after, warnings = _container_after(argv, capsys, CT_200)
    assert GuestConfig.parse(after).get("lxc.cgroup2.cpuset.cpus") == "0-31"
    assert not any("no locality" in w for w in warnings)
