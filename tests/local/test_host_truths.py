"""What a real host does that proxgpu must predict: minors per bind method, kmod's first install
command, the Proxmox release an option needs, what inspection reads of BARs, DRM nodes and
NVSwitches (from example trees with those sysfs files added), and the advice Proxmox accepts."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from proxgpu.apply.layout import Layout
from proxgpu.apply.remote import probe
from proxgpu.errors import PlanRefusedError, RenderError
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.paths import INITRAMFS_HOOK
from proxgpu.pipeline import plan_inventory
from proxgpu.planning import SplitPolicy, plan_split
from proxgpu.planning.policy import BindMethod
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering import RenderOptions, render
from proxgpu.rendering.changes import ChangeSet
from tests.support.pvevalidate import assert_all_ok, validate_tree, write_tree
from tests.support.trees import copy_example

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hosts"
CT_200 = "/etc/pve/lxc/200.conf"
VM_300 = "/etc/pve/qemu-server/300.conf"
NODE_1 = ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]


@cache
def ct200() -> Inventory:
    return inspect(DirectoryHost(str(EXAMPLES / "ct200")))


def rendered(
    inventory: Inventory, policy: SplitPolicy, bind_method: BindMethod = "modprobe"
) -> ChangeSet:
    options = RenderOptions(bind_method=bind_method)
    return render(inventory, plan_split(inventory, policy), options)


def after(changes: ChangeSet, path: str) -> str:
    (text,) = [f.after for f in changes.files if f.path == path]
    assert text is not None
    return text


def container_nvidia_nodes(changes: ChangeSet) -> list[str]:
    config = GuestConfig.parse(after(changes, CT_200))
    values = [value.split(",")[0] for key, value in config.entries() if key.startswith("dev")]
    return [value for value in values if re.fullmatch(r"/dev/nvidia\d+", value)]


# --- Device Minors after the reboot, per bind method ---------------------------------------------


def test_modprobe_binding_renumbers_the_kept_gpus_from_zero() -> None:
    changes = rendered(ct200(), SplitPolicy(lxc=200, host_gpus=NODE_1))
    assert container_nvidia_nodes(changes) == [f"/dev/nvidia{n}" for n in range(4)]
    assert any("becomes /dev/nvidia0" in warning for warning in changes.warnings)


def test_the_kept_gpus_are_renumbered_in_probe_order_not_address_order() -> None:
    # The minors record the order nvidia probed the GPUs in, which follows the kernel's PCI
    # enumeration (host bridges in firmware order), not the addresses: on the e2e test host
    # node 1's bridge comes first. Here 0000:11 was probed before 0000:01.
    probe = {"0000:11:00.0": 0, "0000:81:00.0": 1, "0000:01:00.0": 2, "0000:91:00.0": 3}
    rest = {a: 4 + n for n, a in enumerate(["0000:61:00.0", "0000:71:00.0"])}
    gpus = [replace(g, nvidia_minor={**probe, **rest}.get(g.address, 6 + n))
            for n, g in enumerate(ct200().gpus)]  # fmt: skip
    inventory = replace(ct200(), gpus=gpus)
    policy = SplitPolicy(lxc=200, host_gpus=["0000:01:00.0", "0000:11:00.0"])
    changes = rendered(inventory, policy)
    said = next(w for w in changes.warnings if "numbers its GPUs anew" in w)
    assert "0000:01:00.0 becomes /dev/nvidia1" in said, "in address order it would be 0"
    assert "0000:11:00.0" not in said, "probed first, it keeps /dev/nvidia0"
    assert sorted(container_nvidia_nodes(changes)) == ["/dev/nvidia0", "/dev/nvidia1"]


def test_driverctl_binding_keeps_the_minors_nvidia_gave_at_probe() -> None:
    # driverctl's udev rule runs after nvidia has probed every GPU, so node 1 keeps 4-7.
    changes = rendered(ct200(), SplitPolicy(lxc=200, host_gpus=NODE_1), "driverctl")
    assert container_nvidia_nodes(changes) == [f"/dev/nvidia{n}" for n in range(4, 8)]
    assert not any("numbers its GPUs anew" in warning for warning in changes.warnings)


def test_driverctl_numbers_a_gpu_back_from_vfio_among_all_it_probes() -> None:
    # 0000:01:00.0 sits on vfio-pci today; with driverctl nvidia probes all eight at boot.
    gpus = [
        replace(gpu, driver="vfio-pci", nvidia_minor=None) if gpu.address == "0000:01:00.0" else gpu
        for gpu in ct200().gpus
    ]
    inventory = replace(ct200(), gpus=gpus)
    policy = SplitPolicy(lxc=200, host_gpus=["0000:01:00.0", "0000:11:00.0"])
    changes = rendered(inventory, policy, "driverctl")
    assert sorted(container_nvidia_nodes(changes)) == ["/dev/nvidia0", "/dev/nvidia1"]


def test_another_containers_minor_is_judged_by_the_binding_the_plan_is_rendered_with() -> None:
    # CT 202 uses 0000:91:00.0 as /dev/nvidia5: kept alone with node 1, it is /dev/nvidia1 after
    # the modprobe binding's boot and still /dev/nvidia5 after driverctl's.
    configs = {**ct200().guest_configs, "/etc/pve/lxc/202.conf": "dev0: /dev/nvidia5\n"}
    inventory = replace(ct200(), guest_configs=configs)
    policy = SplitPolicy(lxc=200, host_gpus=NODE_1)
    with pytest.raises(PlanRefusedError) as refused:
        plan_inventory(inventory, policy, RenderOptions(bind_method="modprobe"))
    assert "0000:91:00.0 becomes /dev/nvidia1, and /dev/nvidia5 will not exist" in str(
        refused.value
    )
    plan, _ = plan_inventory(inventory, policy, RenderOptions(bind_method="driverctl"))
    assert any("used by CT 202" in warning for warning in plan.warnings)


# --- kmod runs only the first install command for a module ----------------------------------------


def with_modprobe_file(name: str, text: str) -> Inventory:
    files = {**ct200().host_files, f"/etc/modprobe.d/{name}": text}
    return replace(ct200(), host_files=files)


def test_an_earlier_install_command_for_vfio_pci_is_refused() -> None:
    # "0-" sorts before proxgpu's "00-proxgpu-vfio.conf" ("-" is below "0").
    inventory = with_modprobe_file("0-local.conf", "install vfio_pci /bin/true\n")
    with pytest.raises(RenderError) as refused:
        rendered(inventory, SplitPolicy(lxc=200))
    assert "/etc/modprobe.d/0-local.conf:1: install vfio_pci /bin/true" in str(refused.value)


def test_an_install_command_in_a_file_named_like_most_is_read_after_proxgpus() -> None:
    inventory = with_modprobe_file("local.conf", "install vfio_pci /bin/true\n")
    changes = rendered(inventory, SplitPolicy(lxc=200))
    assert any("local.conf:1" in w and "no longer runs" in w for w in changes.warnings)


def test_a_later_install_command_for_vfio_pci_is_reported_as_dead() -> None:
    inventory = with_modprobe_file("zz-local.conf", "install vfio-pci /bin/true\n")
    changes = rendered(inventory, SplitPolicy(lxc=200))
    assert any("zz-local.conf:1" in w and "no longer runs" in w for w in changes.warnings)


def test_driverctl_binding_does_not_care_about_install_commands() -> None:
    inventory = with_modprobe_file("local.conf", "install vfio_pci /bin/true\n")
    assert rendered(inventory, SplitPolicy(lxc=200), "driverctl").changed


def test_an_install_command_for_nvidia_is_reported() -> None:
    inventory = with_modprobe_file("nv.conf", "install nvidia /sbin/modprobe -i nvidia; true\n")
    changes = rendered(inventory, SplitPolicy(lxc=200))
    assert any(w.startswith("/etc/modprobe.d/nv.conf:1:") for w in changes.warnings)


def test_the_initramfs_hook_carries_the_vfio_modules() -> None:
    hook = after(rendered(ct200(), SplitPolicy(lxc=200)), INITRAMFS_HOOK)
    assert "manual_add_modules vfio_pci" in hook.splitlines()


# --- options by Proxmox VE release ---------------------------------------------------------------


@pytest.mark.parametrize(("pve", "affinity"), [("7.2-3", False), ("7.3-1", True), ("8.4.1", True)])
def test_vm_affinity_only_where_proxmox_has_it(pve: str, affinity: bool) -> None:
    inventory = replace(ct200(), pve_version=pve)
    changes = rendered(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    config = GuestConfig.parse(after(changes, VM_300))
    assert (config.get("affinity") is not None) is affinity
    assert any("no affinity option" in w for w in changes.warnings) is not affinity


# --- what inspection reads -----------------------------------------------------------------------


def test_inspection_reads_bars_drm_nodes_and_nvswitches(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    gpu_dir = (root / "sys/bus/pci/devices/0000:81:00.0").resolve()
    for node in ("card1", "renderD129"):
        (gpu_dir / "drm" / node).mkdir(parents=True)
    switch = root / "sys/devices/pci0000:00/0000:00:05.0"
    switch.mkdir(parents=True)
    for name, value in (("class", "0x068000"), ("vendor", "0x10de"), ("device", "0x22a3")):
        (switch / name).write_text(value + "\n")
    (root / "sys/bus/pci/devices/0000:00:05.0").symlink_to(
        "../../../devices/pci0000:00/0000:00:05.0"
    )
    inventory = inspect(DirectoryHost(str(root)))
    gpu = inventory.gpu("0000:81:00.0")
    assert max(gpu.bar_bytes) == 128 << 30
    assert gpu.drm_nodes == ["card1", "renderD129"]
    assert [f.address for f in inventory.nvswitches] == ["0000:00:05.0"]


# --- advice Proxmox accepts ----------------------------------------------------------------------


def vm_300_advice(inventory: Inventory) -> str:
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    return " ".join(w for w in plan.warnings if w.startswith("VM 300"))


def with_vm_300(inventory: Inventory, config: str) -> Inventory:
    return replace(inventory, guest_configs={**inventory.guest_configs, VM_300: config})


def test_the_advised_cpu_and_bios_are_what_qemu_server_starts(tmp_path: Path) -> None:
    config = ct200().guest_configs[VM_300]
    inventory = with_vm_300(
        ct200(), config.replace("bios: ovmf\n", "").replace("cpu: host", "cpu: kvm64")
    )
    advice = vm_300_advice(inventory)
    cpu = re.search(r"--cpu (\S+)`", advice)
    assert cpu is not None and "--bios ovmf" in advice
    changes = rendered(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    fixed = after(changes, VM_300).replace("cpu: kvm64\n", f"cpu: {cpu[1]}\nbios: ovmf\n")
    assert_all_ok(validate_tree(write_tree(tmp_path / "host", {VM_300: fixed}), "ct200"))
    assert vm_300_advice(with_vm_300(inventory, fixed)) == ""


# --- the boot id that tells a pending reboot from drift ------------------------------------------


@pytest.mark.parametrize("files", [1, 7, 12])
def test_probe_reads_the_boot_id_of_the_hosts_root_whatever_the_number_of_files(
    tmp_path: Path, files: int
) -> None:
    root = copy_example(tmp_path)
    boot = root / "proc/sys/kernel/random/boot_id"
    boot.parent.mkdir(parents=True)
    boot.write_text("5c4e2f8a-0d1b-4f57-9a3e-6b2d8c1f0e74\n")
    host = DirectoryHost(str(root))
    layout = Layout.of(host)
    paths = [layout.on_host(f"/etc/modprobe.d/file{n}.conf") for n in range(files)]
    found = probe(host, layout, paths, lock_id=None)
    assert found.boot_id == "5c4e2f8a-0d1b-4f57-9a3e-6b2d8c1f0e74"
