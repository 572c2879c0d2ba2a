"""The passthrough checks (proxgpu.planning.passthrough): NVLink fabrics, large BARs, resets."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

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


def with_gpus(inventory: Inventory, **fields: Any) -> Inventory:
    gpus = [replace(gpu, **fields) for gpu in inventory.gpus]
    return replace(inventory, gpus=gpus)


def hgx(configs: dict[str, str] | None = None) -> Inventory:
    return replace(ct200(configs), nvswitches=NVSWITCHES)


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
    gpu = replace(ct200().gpus[0], device_id=device_id, model=model)
    assert is_blackwell(gpu) is expected


def blackwell_warnings(inventory: Inventory, policy: SplitPolicy) -> list[str]:
    return [w for w in plan_split(inventory, policy).warnings if "Blackwell" in w]


def test_blackwell_gpus_going_to_vfio_get_reset_advice() -> None:
    inventory = with_gpus(ct200(), device_id="2bb1")
    (warning,) = blackwell_warnings(inventory, SplitPolicy(lxc=200))
    assert "0000:81:00.0" in warning and "0000:01:00.0" not in warning
    assert "no host setting is known to prevent it" in warning
    # Neither helps against what was reported: no setting proxgpu cannot stand behind.
    assert "disable_idle_d3" not in warning and "rather than reboot" not in warning


def test_no_reset_advice_for_gpus_that_reset_well() -> None:
    assert blackwell_warnings(ct200(), SplitPolicy(lxc=200)) == []


#: The ct200 example's CPU: AMD EPYC with 52 physical address bits and 1 GiB pages.
EPYC: dict[str, Any] = {"cpu_vendor": "AuthenticAMD", "cpu_phys_bits": 52, "cpu_pdpe1gb": True}
#: Its GPUs' 64-bit prefetchable BARs: VRAM (BAR1) and BAR3.
BARS64 = [BAR1, 32 << 20]


def vm_warnings(config: str, count: int = 4, **host: Any) -> list[str]:
    inventory = with_gpus(ct200({VM_300: config}), bar_bytes=[64 << 20, *BARS64])
    inventory = replace(with_gpus(inventory, bar64_bytes=BARS64), **{**EPYC, **host})
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, count)]))
    return [w for w in plan.warnings if w.startswith("VM 300")]


Q35 = "bios: ovmf\nmachine: q35\nmemory: 262144\n"


def test_large_bars_need_ovmf() -> None:
    (warning,) = vm_warnings("bios: seabios\ncpu: host\nmachine: q35\nmemory: 65536\n")
    assert "128 GiB BARs" in warning and "qm set 300 --bios ovmf" in warning


@pytest.mark.parametrize(
    ("cpu", "count", "advised"),
    [
        ("", 4, "kvm64,flags=+pdpe1gb,phys-bits=43"),  # qemu-server's default type
        ("", 1, "kvm64,flags=+pdpe1gb,phys-bits=41"),
        ("cpu: x86-64-v2-AES,flags=+aes\n", 4, "x86-64-v2-AES,flags=+aes;+pdpe1gb,phys-bits=43"),
        # Never fewer bits than the VM has: 46, with the 1 GiB pages its flag took away.
        ("cpu: kvm64,flags=-pdpe1gb,phys-bits=46\n", 4, "kvm64,flags=+pdpe1gb,phys-bits=46"),
        (
            "cpu: EPYC-Milan,flags=-pdpe1gb,phys-bits=45\n",
            4,
            "EPYC-Milan,flags=+pdpe1gb,phys-bits=45",
        ),
        ("cpu: host,phys-bits=40\n", 4, "host,phys-bits=43"),
    ],
)
def test_a_window_too_small_for_the_gpus_gets_the_cpu_that_fits(
    cpu: str, count: int, advised: str
) -> None:
    (warning,) = vm_warnings(Q35 + cpu, count)
    assert f"`qm set 300 --cpu {advised}`" in warning


def test_eight_gpus_take_two_tib_because_each_port_is_aligned_to_its_128_gib_bar() -> None:
    every = [gpu.address for gpu in ct200().gpus]
    inventory = with_gpus(ct200({VM_300: Q35}), bar_bytes=BARS64, bar64_bytes=BARS64)
    policy = SplitPolicy(vfio_gpus=every, vms=[(300, None)])
    plan = plan_split(replace(inventory, **EPYC), policy)
    (warning,) = [w for w in plan.warnings if w.startswith("VM 300")]
    # Today's 128 GiB window: 7 x 256 GiB + 128 GiB + 32 MiB, then the PCI bridges' 4 x 512 MiB
    # at 512 MiB alignment: 1922.5 GiB. Over 1 TiB, so 44 bits (2 TiB), not 43.
    assert "need 1923 GiB" in warning and "phys-bits=44` gives it 2 TiB" in warning


def test_amd_40_bits_are_trusted_and_give_an_eighth_of_the_space() -> None:
    (warning,) = vm_warnings(Q35, 1)
    assert "gives it 128 GiB (its CPU (kvm64, qemu-server's default without cpu:)" in warning
    assert "132 GiB" in warning  # 128 GiB + 32 MiB, with the hotplug reservations


def test_intel_40_bits_are_not_trusted_and_keep_the_classic_window() -> None:
    (warning,) = vm_warnings(Q35, 1, cpu_vendor="GenuineIntel", cpu_phys_bits=46)
    assert "not trust on an Intel CPU, so it keeps its 32 GiB default" in warning


def test_without_1g_pages_ovmf_stays_at_40_bits() -> None:
    (warning,) = vm_warnings(Q35 + "cpu: kvm64,phys-bits=46\n", 1)
    assert "of which OVMF uses 40 without 1 GiB pages" in warning


@pytest.mark.parametrize(
    "config",
    [
        Q35 + "cpu: host\n",  # QEMU gives -cpu host the host's bits: OVMF uses 46
        Q35 + "cpu: kvm64,flags=+pdpe1gb,phys-bits=host\n",
        Q35 + "cpu: x86-64-v2-AES,flags=+pdpe1gb,phys-bits=43\n",
    ],
)
def test_a_window_that_holds_the_gpus_gets_no_advice(config: str) -> None:
    assert vm_warnings(config) == []


def test_one_bit_short_is_one_bit_short() -> None:
    # Four ports of 128 GiB + 32 MiB need 896 GiB and more: 42 bits give 512 GiB.
    (warning,) = vm_warnings(Q35 + "cpu: x86-64-v2-AES,flags=+pdpe1gb,phys-bits=42\n")
    assert "phys-bits=43`" in warning and "gives it 512 GiB" in warning


def test_a_host_with_too_few_bits_gets_no_cpu_value_but_fewer_gpus() -> None:
    (warning,) = vm_warnings(Q35 + "cpu: host\n", cpu_phys_bits=42)
    assert "no CPU setting gives it enough on this host" in warning
    assert "the host has 42" in warning and "--vm 300:N" in warning and "--cpu" not in warning


def test_a_custom_cpu_model_is_not_guessed() -> None:
    assert vm_warnings(Q35 + "cpu: custom-mine\n") == []


def test_small_bars_need_nothing() -> None:
    inventory = with_gpus(ct200({VM_300: Q35}), bar_bytes=[256 << 20], bar64_bytes=[256 << 20])
    plan = plan_split(replace(inventory, **EPYC), SplitPolicy(lxc=200, vms=[(300, 4)]))
    assert not [w for w in plan.warnings if w.startswith("VM 300")]


def test_unread_bars_give_no_advice() -> None:
    inventory = with_gpus(ct200({VM_300: "bios: seabios\nmemory: 262144\n"}), bar_bytes=[])
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, 4)]))
    assert not [w for w in plan.warnings if w.startswith("VM 300")]
