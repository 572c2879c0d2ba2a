"""Output a real Proxmox VE host accepts: PCI mappings, VM NUMA settings, guests it can have.

Each test takes the ct200 example (inspected once) and changes the one fact it is about: the IOMMU
off, a second VM, memory hotplug, a VMID out of range, a GPU outside every IOMMU group.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from proxgpu.errors import PlanRefusedError, RenderError
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory, PciFunction
from proxgpu.paths import PCI_MAPPING
from proxgpu.planning import Plan, SplitPolicy, plan_split
from proxgpu.pve.config import GuestConfig
from proxgpu.pve.mapping import PciMappingConfig
from proxgpu.rendering import RenderOptions, render
from proxgpu.rendering.changes import ChangeSet
from tests.support.pvevalidate import assert_all_ok, failures_of, validate_tree, write_tree

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hosts"
CT_200 = "/etc/pve/lxc/200.conf"
VM_300 = "/etc/pve/qemu-server/300.conf"
VM_301 = "/etc/pve/qemu-server/301.conf"


@cache
def ct200() -> Inventory:
    return inspect(DirectoryHost(str(EXAMPLES / "ct200")))


def with_configs(configs: dict[str, str], inventory: Inventory | None = None) -> Inventory:
    inventory = inventory or ct200()
    return replace(inventory, guest_configs={**inventory.guest_configs, **configs})


def with_vm_301() -> Inventory:
    return with_configs({VM_301: ct200().guest_configs[VM_300].replace("train", "train2")})


def iommu_off(inventory: Inventory) -> Inventory:
    """``inventory`` as the same host boots with the IOMMU off: no GPU has an IOMMU group."""
    gpus = [
        replace(
            gpu,
            iommu_group=None,
            function_info=[replace(f, iommu_group=None) for f in gpu.function_info],
            iommu_group_peers=[],
        )
        for gpu in inventory.gpus
    ]
    return replace(inventory, iommu_enabled=False, gpus=gpus)


def refusal(inventory: Inventory, policy: SplitPolicy) -> PlanRefusedError:
    with pytest.raises(PlanRefusedError) as caught:
        plan_split(inventory, policy)
    return caught.value


def after(changes: ChangeSet, path: str) -> str:
    texts = [f.after for f in changes.files if f.path == path]
    assert len(texts) == 1, f"{path}: {len(texts)} changes"
    assert texts[0] is not None
    return texts[0]


def rendered(inventory: Inventory, policy: SplitPolicy, **options: Any) -> ChangeSet:
    return render(inventory, plan_split(inventory, policy), RenderOptions(**options))


# --- the PCI mapping -----------------------------------------------------------------------------


@pytest.mark.parametrize("enable_iommu", [False, True])
def test_a_mapping_while_the_iommu_is_off_is_refused_with_the_way_there(enable_iommu: bool) -> None:
    policy = SplitPolicy(lxc=200, vms=[(300, None)], mapping="gpu-node1", enable_iommu=enable_iommu)
    error = refusal(iommu_off(ct200()), policy)
    mapping = [p for p in error.problems if p.code == "mapping"]
    assert len(mapping) == 1
    assert "IOMMU is off" in mapping[0].what
    assert "reboot, then plan the mapping" in mapping[0].fix
    assert ("plan without --mapping now" in mapping[0].fix) == enable_iommu


def test_a_mapping_is_never_rendered_without_iommu_groups() -> None:
    plan = plan_split(ct200(), SplitPolicy(lxc=200, vms=[(300, None)]))
    with pytest.raises(RenderError, match=r"pci\.cfg: mapping gpu-node1 needs the IOMMU group"):
        render(iommu_off(ct200()), plan, RenderOptions(mapping="gpu-node1"))


def test_a_mapping_name_proxmox_would_reject_is_refused() -> None:
    error = refusal(ct200(), SplitPolicy(lxc=200, vms=[(300, None)], mapping="1st"))
    assert [p.code for p in error.problems] == ["mapping"]


def test_two_vms_sharing_a_mapping_get_one_pci_cfg_change_holding_both() -> None:
    policy = SplitPolicy(lxc=200, vms=[(300, 2), (301, 2)], mapping="gpu-node1")
    changes = rendered(with_vm_301(), policy, mapping="gpu-node1")
    plan = plan_split(with_vm_301(), policy)
    pool = PciMappingConfig.parse(after(changes, PCI_MAPPING)).entries("gpu-node1")
    vfio = [a for g in plan.groups if g.guest and g.guest.type == "vm" for a in g.gpus]
    assert len(vfio) == 4
    assert [value.split("path=")[1].split(",")[0] for _, value in pool] == [
        a.rsplit(".", 1)[0] for a in vfio
    ]
    for path in (VM_300, VM_301):
        entries = GuestConfig.parse(after(changes, path)).entries()
        assert [v for k, v in entries if k.startswith("hostpci")] == [
            "mapping=gpu-node1,pcie=1"
        ] * 2


def test_the_mapping_change_comes_before_the_vms_that_name_it() -> None:
    changes = rendered(ct200(), SplitPolicy(lxc=200, vms=[(300, None)]), mapping="gpu-node1")
    paths = [f.path for f in changes.files]
    assert paths.index(PCI_MAPPING) < paths.index(VM_300)


def test_vms_on_different_nodes_cannot_share_one_mapping() -> None:
    policy = SplitPolicy(
        vfio_gpus=["0000:01:00.0", "0000:81:00.0"],
        lxc=200,
        vms=[(300, 1), (301, 1)],
        mapping="gpus",
    )
    plan = plan_split(with_vm_301(), policy.model_copy(update={"mapping": None}))
    assert {g.numa_node for g in plan.groups if g.guest and g.guest.type == "vm"} == {0, 1}
    error = refusal(with_vm_301(), policy)
    assert [p.code for p in error.problems] == ["mapping"]
    assert "VMs 300 and 301" in error.problems[0].what


# --- memory hotplug ------------------------------------------------------------------------------


def vm_config(plan_changes: ChangeSet) -> GuestConfig:
    return GuestConfig.parse(after(plan_changes, VM_300))


@pytest.mark.parametrize("hotplug", ["memory", "network,disk,memory", "cpu;memory"])
def test_a_vm_hotplugging_memory_is_pinned_by_affinity_without_numa0(hotplug: str) -> None:
    inventory = with_configs({VM_300: ct200().guest_configs[VM_300] + f"hotplug: {hotplug}\n"})
    changes = rendered(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    config = vm_config(changes)
    assert config.get("numa0") is None
    assert (config.get("numa"), config.get("affinity")) == ("1", "32-63")
    assert any("VM 300 hotplugs memory" in w for w in changes.warnings)


@pytest.mark.parametrize("hotplug", ["1", "0", "network,disk,usb"])
def test_a_vm_without_memory_hotplug_gets_numa0(hotplug: str) -> None:
    inventory = with_configs({VM_300: ct200().guest_configs[VM_300] + f"hotplug: {hotplug}\n"})
    config = vm_config(rendered(inventory, SplitPolicy(lxc=200, vms=[(300, None)])))
    assert config.get("numa0") == "cpus=0-31,hostnodes=1,memory=262144,policy=bind"


def test_our_numa0_goes_when_memory_hotplug_is_turned_on_later() -> None:
    policy = SplitPolicy(lxc=200, vms=[(300, None)])
    first = after(rendered(ct200(), policy), VM_300)
    assert "numa0:" in first
    config = vm_config(rendered(with_configs({VM_300: first + "hotplug: memory\n"}), policy))
    assert config.get("numa0") is None


def test_numa0_memory_is_the_current_memory_of_a_memory_property_string() -> None:
    text = ct200().guest_configs[VM_300].replace("memory: 262144", "memory: current=65536")
    policy = SplitPolicy(lxc=200, vms=[(300, None)])
    config = vm_config(rendered(with_configs({VM_300: text}), policy))
    assert config.get("numa0") == "cpus=0-31,hostnodes=1,memory=65536,policy=bind"


# --- refusals for what Proxmox or vfio-pci cannot take -------------------------------------------


@pytest.mark.parametrize("policy", [SplitPolicy(lxc=99), SplitPolicy(vms=[(1_000_000_000, None)])])
def test_a_vmid_proxmox_cannot_have_is_refused(policy: SplitPolicy) -> None:
    error = refusal(ct200(), policy)
    assert [p.code for p in error.problems] == ["policy"]
    assert "Proxmox VMIDs run from 100 to 999999999" in error.problems[0].what


@pytest.mark.parametrize("vmid", [100, 999_999_999])
def test_the_ends_of_the_vmid_range_are_fine(vmid: int) -> None:
    plan: Plan = plan_split(ct200(), SplitPolicy(lxc=200, vms=[(vmid, None)]))
    assert [g.guest.vmid for g in plan.groups if g.guest] == [200, vmid]


def test_a_vfio_gpu_without_iommu_group_is_refused_while_the_iommu_is_on() -> None:
    gpus = [
        replace(g, iommu_group=None) if g.address == "0000:81:00.0" else g for g in ct200().gpus
    ]
    error = refusal(replace(ct200(), gpus=gpus), SplitPolicy(lxc=200, vms=[(300, None)]))
    assert [p.code for p in error.problems] == ["no-iommu-group"]
    assert error.problems[0].what.startswith("0000:81:00.0 would go to vfio-pci")
    assert "--host-gpus 0000:81:00.0" in error.problems[0].fix


# --- a server's BMC display controller ----------------------------------------------------------

ASPEED = "0000:03:00.0"


def with_aspeed() -> Inventory:
    """ct200 with the ASPEED BMC display every such server board has, on NUMA node 0."""
    function = PciFunction(
        address=ASPEED,
        class_code="0x030000",
        vendor_id="1a03",
        device_id="2000",
        driver="ast",
        numa_node=0,
        iommu_group=7,
    )
    bmc = replace(
        ct200().gpus[0],
        address=ASPEED,
        vendor_id="1a03",
        device_id="2000",
        class_code="0x030000",
        model="ASPEED Graphics Family",
        driver="ast",
        iommu_group=7,
        functions=[ASPEED],
        function_info=[function],
        iommu_group_peers=[],
        nvidia_minor=None,
        boot_vga=True,
    )
    return replace(ct200(), gpus=[bmc, *ct200().gpus])


@pytest.mark.parametrize(
    "policy",
    [SplitPolicy(lxc=200, vms=[(300, None)]), SplitPolicy(lxc=200, host_nodes=[1], vfio_nodes=[0])],
    ids=["bmc-node-kept", "bmc-node-to-vfio"],
)
def test_a_bmc_display_is_left_out_of_the_split(policy: SplitPolicy) -> None:
    plan = plan_split(with_aspeed(), policy)
    assert all(ASPEED not in g.functions for g in plan.groups)
    assert sum(len(g.gpus) for g in plan.groups) == 8
    assert any(w.startswith(f"{ASPEED} (ASPEED Graphics Family) is the BMC's") for w in plan.notes)
    changes = render(with_aspeed(), plan)
    assert not any(ASPEED in (f.after or "") for f in changes.files), "no binding, no DRI node"


def test_a_bmc_display_named_by_address_is_split() -> None:
    plan = plan_split(with_aspeed(), SplitPolicy(lxc=200, host_gpus=["03:00"]))
    host = next(g for g in plan.groups if g.role == "host")
    assert host.gpus == [ASPEED]


# --- large BARs as OVMF lays them out ------------------------------------------------------------


def vm_300_advice(inventory: Inventory, policy: SplitPolicy) -> list[str]:
    return [w for w in plan_split(inventory, policy).warnings if w.startswith("VM 300")]


@pytest.mark.parametrize(
    ("cpu", "count"),
    [
        ("", None),  # qemu-server's default, kvm64
        ("", 1),
        ("cpu: x86-64-v2-AES\n", None),  # QEMU's qemu64 with flags
        ("cpu: host,phys-bits=40\n", None),
    ],
)
def test_the_advised_cpu_starts_without_the_phys_bits_warning_and_fits(
    tmp_path: Path, cpu: str, count: int | None
) -> None:
    inventory = with_configs({VM_300: ct200().guest_configs[VM_300].replace("cpu: host\n", cpu)})
    policy = SplitPolicy(lxc=200, vms=[(300, count)])
    (warning,) = vm_300_advice(inventory, policy)
    advised = re.search(r"--cpu (\S+)`", warning)
    assert advised is not None
    config = GuestConfig.parse(after(rendered(inventory, policy), VM_300))
    config.set("cpu", advised[1])
    # Proxmox's own start path takes it, without "OVMF firmware might limit CPU 'phys-bits'".
    assert_all_ok(validate_tree(write_tree(tmp_path / "host", {VM_300: config.render()}), "ct200"))
    assert vm_300_advice(with_configs({VM_300: config.render()}), policy) == []


def test_more_than_40_bits_without_pdpe1gb_is_what_qemu_server_warns_about(tmp_path: Path) -> None:
    text = ct200().guest_configs[VM_300].replace("cpu: host", "cpu: kvm64,phys-bits=43")
    policy = SplitPolicy(lxc=200, vms=[(300, None)])
    (warning,) = vm_300_advice(with_configs({VM_300: text}), policy)
    assert "of which OVMF uses 40 without 1 GiB pages" in warning
    verdicts = validate_tree(write_tree(tmp_path / "host", {VM_300: text}), "ct200")
    assert any("might limit CPU 'phys-bits' to 40" in f for f in failures_of(verdicts.values()))


def test_a_target_vms_vgpu_entry_stays_as_written(tmp_path: Path) -> None:
    vgpu = "hostpci5: 0000:01:00.0,mdev=nvidia-1072"
    inventory = with_configs({VM_300: ct200().guest_configs[VM_300] + vgpu + "\n"})
    policy = SplitPolicy(lxc=200, vms=[(300, None)])
    text = after(rendered(inventory, policy), VM_300)
    assert f"\n{vgpu}\n" in text
    assert not [w for w in plan_split(inventory, policy).warnings if "vGPU" in w]
    assert_all_ok(validate_tree(write_tree(tmp_path / "host", {VM_300: text}), "ct200"))


def test_a_target_vms_driver_keep_entry_stays_and_qemu_server_starts_it(tmp_path: Path) -> None:
    keep = "hostpci7: 0000:81:00,driver=keep,pcie=1"
    inventory = with_configs({VM_300: ct200().guest_configs[VM_300] + keep + "\n"})
    policy = SplitPolicy(lxc=200, vms=[(300, None)])
    text = after(rendered(inventory, policy), VM_300)
    assert f"\n{keep}\n" in text
    assert "0000:81:00," not in text.replace(keep, ""), "the GPU is not given twice"
    (told,) = [w for w in plan_split(inventory, policy).warnings if "with driver=keep" in w]
    assert told.startswith("VM 300 passes 0000:81:00.0 through with driver=keep")
    assert_all_ok(validate_tree(write_tree(tmp_path / "host", {VM_300: text}), "ct200"))
