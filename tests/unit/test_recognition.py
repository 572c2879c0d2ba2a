"""Which display controllers and processing accelerators are GPUs (proxgpu.pci,
proxgpu.inspection.build), and what the plan says when none is: real machines' shapes, built as
captures with no host involved. A server's onboard display is never split; AMD Instinct
accelerators (class 0x1200) on amdgpu are GPUs; an FPGA of that class is not, whatever class is
asked for, unless its vendor is named."""

from __future__ import annotations

import pytest

from proxgpu.errors import PlanRefusedError
from proxgpu.inspection.build import build_inventory
from proxgpu.inspection.capture import Capture
from proxgpu.inspection.inventory import Inventory
from proxgpu.inspection.recognition import GpuFilter
from proxgpu.pci import host_driver, is_bmc_display, is_gpu_accelerator
from proxgpu.planning import Plan, SplitPolicy, plan_split

DEVICES = "/sys/bus/pci/devices/"
ES1000 = "0000:02:00.0"  # the onboard ATI ES1000 of an older Intel server, on radeon
FPGA = "0000:c1:00.0"  # a Xilinx Alveo, a processing accelerator that is no GPU
ACCELERATOR = "0x120000"

#: (address, class, vendor, device, driver, NUMA node) of one PCI function.
Function = tuple[str, str, str, str, str | None, int]


def es1000() -> Function:
    return (ES1000, "0x030000", "1002", "515e", "radeon", 0)


def fpga() -> Function:
    return (FPGA, ACCELERATOR, "10ee", "903f", None, 1)


def nvidia(bus: str, node: int) -> Function:
    return (f"0000:{bus}:00.0", "0x030200", "10de", "2330", "nvidia", node)


def mi300x(bus: str, node: int, driver: str | None = "amdgpu") -> Function:
    return (f"0000:{bus}:00.0", ACCELERATOR, "1002", "74a1", driver, node)


def capture(*functions: Function) -> Capture:
    """A two-socket host (CPUs 0-31 and 32-63) with these functions, each in an IOMMU group of
    its own (its bus number)."""
    lines = {
        "/sys/devices/system/node/node0/cpulist": ["0-31"],
        "/sys/devices/system/node/node1/cpulist": ["32-63"],
    }
    links = {}
    for address, cls, vendor, device, driver, node in functions:
        values = {"class": cls, "vendor": f"0x{vendor}", "device": f"0x{device}"}
        for name, value in {**values, "numa_node": str(node)}.items():
            lines[f"{DEVICES}{address}/{name}"] = [value]
        group = int(address.split(":")[1], 16)
        links[f"{DEVICES}{address}/iommu_group"] = f"../../../kernel/iommu_groups/{group}"
        if driver:
            links[f"{DEVICES}{address}/driver"] = f"../../../bus/pci/drivers/{driver}"
    return Capture(lines=lines, links=links)


def inventory(*functions: Function, gpu_filter: GpuFilter | None = None) -> Inventory:
    return build_inventory(capture(*functions), "pve1", gpu_filter or GpuFilter())


def planned(plan: Plan) -> list[str]:
    return sorted(address for group in plan.groups for address in group.gpus)


def refusal(inv: Inventory) -> str:
    with pytest.raises(PlanRefusedError) as refused:
        plan_split(inv, SplitPolicy(lxc=200))
    return str(refused.value)


NVIDIA_HOST = [nvidia("41", 0), nvidia("42", 0), nvidia("c2", 1), nvidia("c3", 1)]
INSTINCT_HOST = [mi300x(f"{bus:02x}", 0 if bus < 0x80 else 1) for bus in (5, 21, 37, 53, 133, 149)]
INSTINCT_HOST += [mi300x("a5", 1, driver="vfio-pci"), mi300x("b5", 1, driver=None)]


@pytest.mark.parametrize(
    ("vendor", "device"),
    [
        ("1002", "515e"),  # ATI ES1000 (RN50)
        ("1002", "5969"),  # ATI ES1000, the other RN50 ID
        ("1a03", "2010"),  # ASPEED AST2100
        ("102b", "053a"),  # Matrox G200eH5
        ("19e5", "1711"),  # Huawei iBMC
    ],
)
def test_a_servers_onboard_display_is_no_gpu(vendor: str, device: str) -> None:
    assert is_bmc_display(vendor, device)


def test_an_es1000_beside_nvidia_gpus_is_not_split() -> None:
    inv = inventory(es1000(), *NVIDIA_HOST)
    assert [gpu.address for gpu in inv.gpus if gpu.bmc_display] == [ES1000]
    plan = plan_split(inv, SplitPolicy(lxc=200))
    assert planned(plan) == sorted(address for address, *_ in NVIDIA_HOST)
    assert any(w.startswith(f"{ES1000} (display controller) is the BMC's") for w in plan.notes)


def test_eight_mi300x_on_amdgpu_are_gpus_and_split() -> None:
    """MI300X enumerate as processing accelerators: GPUs all the same, on amdgpu, on vfio-pci or
    on no driver (amdgpu's table takes them), and a GPU on vfio-pci returns to amdgpu."""
    inv = inventory(*INSTINCT_HOST)
    assert len(inv.gpus) == 8 and inv.passed_over == []
    assert inv.gpu("0000:a5:00.0").host_driver == "amdgpu"
    plan = plan_split(inv, SplitPolicy(lxc=200))
    assert planned(plan) == sorted(address for address, *_ in INSTINCT_HOST)
    assert [(group.numa_node, len(group.gpus)) for group in plan.groups] == [(0, 4), (1, 4)]


@pytest.mark.parametrize(
    "gpu_filter",
    [GpuFilter(), GpuFilter(classes=("03", "12")), GpuFilter(classes=("12",))],
    ids=["default", "old-advice", "class-12-only"],
)
def test_an_fpga_of_class_12_beside_them_is_never_in_the_split(gpu_filter: GpuFilter) -> None:
    inv = inventory(*INSTINCT_HOST, fpga(), gpu_filter=gpu_filter)
    assert FPGA not in [gpu.address for gpu in inv.gpus]
    assert [(p.function.address, p.reason) for p in inv.passed_over] == [(FPGA, "accelerator")]
    assert FPGA not in planned(plan_split(inv, SplitPolicy(lxc=200)))
    assert [w for w in inv.warnings if w.startswith(FPGA)] == [
        f"{FPGA} (10ee:903f) is a processing accelerator (PCI class 0x12) but not a GPU (only "
        "AMD's, on amdgpu, are): left out of the split; add --gpu-vendor 1002 --gpu-vendor 10ee "
        "to split it too"
    ]


def test_naming_its_vendor_takes_the_fpga_as_the_warning_says() -> None:
    inv = inventory(*INSTINCT_HOST, fpga(), gpu_filter=GpuFilter(vendors=("1002", "10ee")))
    assert len(inv.gpus) == 9 and inv.passed_over == []


def test_a_host_with_only_an_fpga_and_an_onboard_display_is_refused_naming_both() -> None:
    message = refusal(inventory(es1000(), fpga()))
    assert message == (
        "pve1: plan refused (1 problem)\n"
        "  - the inventory holds no GPUs; inspection saw 2 devices it did not take: "
        f"{ES1000} (1002:515e, class 0x030000, on radeon): the BMC's display controller, split "
        f"only when named; {FPGA} (10ee:903f, class 0x120000, no driver): a processing "
        "accelerator, not a GPU (only AMD's, on amdgpu, are)\n"
        "    fix: name a BMC's display in --host-gpus or --vfio-gpus to split it all the same; "
        "add --gpu-vendor 10ee to split those accelerators too; if the host has other GPUs, "
        "check that it sees them (lspci -nnk)"
    )


def test_gpus_a_filter_leaves_out_are_named_in_the_refusal() -> None:
    inv = inventory(*INSTINCT_HOST[:1], gpu_filter=GpuFilter(vendors=("10de",)))
    message = refusal(inv)
    assert (
        "0000:05:00.0 (1002:74a1, class 0x120000, on amdgpu): left out by --gpu-class/" in message
    )
    assert "fix: inspect without --gpu-class/--gpu-vendor, or with ones that take them" in message


def test_a_host_with_nothing_to_take_says_so() -> None:
    nic: Function = ("0000:01:00.0", "0x020000", "15b3", "101d", "mlx5_core", 0)
    assert "inspection saw no display controller or accelerator" in refusal(inventory(nic))


@pytest.mark.parametrize(
    ("vendor", "driver", "gpu"),
    [
        ("1002", "amdgpu", True),
        ("1002", "vfio-pci", True),
        ("1002", None, True),
        ("10ee", None, False),  # Xilinx FPGA
        ("8086", "dfl-pci", False),  # Intel FPGA (PAC)
        ("1da3", "habanalabs", False),  # Gaudi
        ("1002", "some-other-driver", False),  # bound to a driver that is no GPU's
    ],
)
def test_which_processing_accelerators_are_gpus(vendor: str, driver: str | None, gpu: bool) -> None:
    assert is_gpu_accelerator(vendor, ACCELERATOR, driver) is gpu
    assert (host_driver(vendor, ACCELERATOR) == "amdgpu") is (vendor == "1002")
