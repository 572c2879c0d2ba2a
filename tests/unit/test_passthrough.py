"""The passthrough checks (proxgpu.planning.passthrough): NVLink fabrics, large BARs, resets."""

from __future__ import annotations

import pytest

from proxgpu.errors import PlanRefusedError
from proxgpu.inspection.inventory import Inventory
from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy
from proxgpu.planning.passthrough import is_blackwell
from tests.support.factories import ct200, make_fn

NVSWITCHES = [
    make_fn(f"0000:0{n}:00.0", 200 + n, class_code="0x068000", device_id="22a3", driver=None)
    for n in range(4)
]
VM_300 = "/etc/pve/qemu-server/300.conf"
BAR1 = 128 << 30


def with_gpus(inventory: Inventory, **fields: object) -> Inventory:
    gpus = [gpu.model_copy(update=fields) for gpu in inventory.gpus]
    return inventory.model_copy(update={"gpus": gpus})


def hgx(configs: dict[str, str] | None = None) -> Inventory:
    return ct200(configs).model_copy(update={"nvswitches": NVSWITCHES})


def test_a_split_across_an_nvlink_fabric_is_refused() -> None:
    with pytest.raises(PlanRefusedError) as refused:
        plan_split(hgx())
    problem = next(p for p in refused.value.problems if p.code == "fabric-split")
    assert "4 NVSwitches" in problem.what and "0000:03:00.0" in problem.what
    assert "0000:81:00.0" in problem.what and "Fabric Manager" in problem.fix


def test_the_whole_fabric_to_guests_is_planned_with_a_warning() -> None:
    every = [gpu.address for gpu in ct200().gpus]
    plan = plan_split(hgx(), SplitPolicy(vfio_gpus=every))
    assert {group.role for group in plan.groups} == {"vfio"}
    assert any("get no NVLink" in warning for warning in plan.warnings)


def test_the_whole_fabric_on_the_host_is_planned() -> None:
    every = [gpu.address for gpu in ct200().gpus]
    plan = plan_split(hgx(), SplitPolicy(host_gpus=every))
    assert {group.role for group in plan.groups} == {"host"}
    assert not any("NVSwitch" in warning for warning in plan.warnings)


def test_without_nvswitches_the_same_split_is_planned() -> None:
    assert {group.role for group in plan_split(ct200()).groups} == {"host", "vfio"}


@pytest.mark.parametrize(
    ("device_id", "model", "expected"),
    [
        ("2bb1", None, True),  # RTX PRO 6000 Blackwell Workstation
        ("2b85", None, True),  # RTX 5090
        ("2c02", None, True),  # RTX 5080
        ("2330", "NVIDIA H100", False),
        ("2684", None, False),  # RTX 4090
        ("2330", "GB202GL [RTX PRO 6000 Blackwell Server Edition]", True),
    ],
)
def test_blackwell_by_id_or_name(device_id: str, model: str | None, expected: bool) -> None:
    gpu = ct200().gpus[0].model_copy(update={"device_id": device_id, "model": model})
    assert is_blackwell(gpu) is expected


def blackwell_warnings(inventory: Inventory, policy: SplitPolicy) -> list[str]:
    return [w for w in plan_split(inventory, policy).warnings if "Blackwell" in w]


def test_blackwell_gpus_going_to_vfio_get_reset_advice() -> None:
    inventory = with_gpus(ct200(), device_id="2bb1")
    (warning,) = blackwell_warnings(inventory, SplitPolicy(lxc=200))
    assert "0000:81:00.0" in warning and "0000:01:00.0" not in warning
    assert "disable_idle_d3=1" in warning


def test_no_reset_advice_for_gpus_that_reset_well() -> None:
    assert blackwell_warnings(ct200(), SplitPolicy(lxc=200)) == []


def vm_warnings(config: str, bars: list[int], count: int = 4) -> list[str]:
    inventory = with_gpus(ct200({VM_300: config}), bar_bytes=bars)
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, count)]))
    return [w for w in plan.warnings if w.startswith("VM 300")]


def test_large_bars_need_ovmf() -> None:
    (warning,) = vm_warnings("bios: seabios\ncpu: host\nmemory: 65536\n", [64 << 20, BAR1])
    assert "128 GiB BARs" in warning and "qm set 300 --bios ovmf" in warning


def test_large_bars_need_more_than_qemus_default_address_bits() -> None:
    config = "bios: ovmf\ncpu: kvm64,flags=+pdpe1gb\nmemory: 262144\n"
    (warning,) = vm_warnings(config, [BAR1])
    assert "40 physical address bits" in warning and "at least 41" in warning
    assert "--cpu kvm64,flags=+pdpe1gb,phys-bits=host" in warning


def test_kvm64_gets_the_flag_ovmf_needs_for_more_than_40_bits() -> None:
    (warning,) = vm_warnings("bios: ovmf\ncpu: kvm64,flags=+aes\nmemory: 262144\n", [BAR1])
    assert "--cpu kvm64,flags=+aes;+pdpe1gb,phys-bits=host" in warning


@pytest.mark.parametrize(
    "config",
    [
        "bios: ovmf\ncpu: host\nmemory: 262144\n",  # QEMU gives -cpu host the host's bits
        "bios: ovmf\ncpu: kvm64,phys-bits=host\nmemory: 262144\n",
        "bios: ovmf\ncpu: kvm64,phys-bits=46\nmemory: 262144\n",
    ],
)
def test_enough_address_bits_get_no_advice(config: str) -> None:
    assert vm_warnings(config, [BAR1]) == []


def test_one_small_vm_fits_qemus_default_bits() -> None:
    # One 128 GiB BAR and 64 GiB of RAM: within 40 bits (1 TiB).
    assert vm_warnings("bios: ovmf\nmemory: 65536\n", [BAR1], count=1) == []


def test_small_bars_need_nothing() -> None:
    assert vm_warnings("bios: seabios\nmemory: 262144\n", [256 << 20]) == []


def test_unread_bars_give_no_advice() -> None:
    assert vm_warnings("bios: seabios\nmemory: 262144\n", []) == []


def test_the_default_cpu_type_is_named_in_the_fix() -> None:
    (warning,) = vm_warnings("bios: ovmf\nmemory: 262144\n", [BAR1])
    assert "--cpu x86-64-v2-AES,phys-bits=host" in warning
