"""CUDA's numbering (proxgpu.planning.runtimes) as check-gpus and the plan's tensor-parallel sets
print it: BMC displays and vfio-pci GPUs get no index, and in a container only the GPUs whose
/dev/nvidiaN it has do."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from proxgpu.errors import UsageError
from proxgpu.inspection.inventory import Inventory, MigInstance, NvidiaCap
from proxgpu.planning import SplitPolicy, plan_split
from proxgpu.planning.advice import check_gpu_set
from proxgpu.planning.runtimes import CUDA, LEVEL_ZERO, ROCM, numbered, pci_order
from tests.support.factories import (
    bmc_display,
    container,
    ct200,
    make_gpu,
    make_inventory,
    with_gpus,
)

BMC = "0000:02:00.0"


def test_cuda_numbers_neither_the_bmc_display_nor_a_vfio_gpu() -> None:
    inventory = with_gpus(ct200(), bmc_display(), vfio=("0000:11:00.0",))
    assert [g.address for g in numbered(inventory, CUDA)] == [
        "0000:01:00.0", "0000:61:00.0", "0000:71:00.0", "0000:81:00.0",
        "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0",
    ]  # fmt: skip


def test_with_a_bmc_display_3_4_is_a_cross_socket_pair() -> None:
    # Counting the BMC's display as GPU 1 made 3,4 the node-0 pair 61:00.0 and 71:00.0.
    check = check_gpu_set(with_gpus(ct200(), bmc_display()), ["3", "4"])
    assert [(p.index, p.address, p.numa_node) for p in check.gpus] == [
        (3, "0000:71:00.0", 0),
        (4, "0000:81:00.0", 1),
    ]
    assert not check.numa_local
    assert "NUMA-local sets of 2: 0,1; 2,3; 4,5; 6,7." in check.explanation


def test_an_index_cuda_does_not_have_names_the_ones_it_has() -> None:
    inventory = with_gpus(ct200(), bmc_display(), vfio=("0000:11:00.0",))
    with pytest.raises(UsageError) as error:
        check_gpu_set(inventory, ["7"])
    message = str(error.value)
    assert "GPU 7: CUDA has no such index on pve1: it numbers 0-6 (7 GPUs on nvidia" in message
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in message


@pytest.mark.parametrize(
    ("selector", "why"),
    [
        ("11:00.0", "0000:11:00.0 is on vfio-pci, not nvidia"),
        (BMC, f"{BMC} is the BMC's display controller, not a GPU"),
        ("0000:11:00", "0000:11:00.0 is on vfio-pci"),
    ],
)
def test_an_address_cuda_does_not_see_is_refused_saying_why(selector: str, why: str) -> None:
    inventory = with_gpus(ct200(), bmc_display(), vfio=("0000:11:00.0",))
    with pytest.raises(UsageError, match="CUDA does not see it on pve1") as error:
        check_gpu_set(inventory, [selector])
    assert why in str(error.value)


def test_addresses_of_cuda_gpus_get_cudas_indexes() -> None:
    inventory = with_gpus(ct200(), bmc_display(), vfio=("0000:11:00.0",))
    check = check_gpu_set(inventory, ["0000:81:00.0", "91:00.0"])
    assert [p.index for p in check.gpus] == [3, 4]
    assert check.numa_local and check.ordering == "CUDA_DEVICE_ORDER=PCI_BUS_ID"


def test_a_host_without_nvidia_gpus_says_cuda_sees_none_and_why() -> None:
    inventory = with_gpus(make_inventory([make_gpu("81", 1, driver="vfio-pci")]), bmc_display())
    with pytest.raises(UsageError) as error:
        check_gpu_set(inventory, ["0"])
    assert str(error.value) == (
        "pve1: CUDA sees no GPU: 0000:81:00.0 is on vfio-pci, not nvidia; "
        f"{BMC} is the BMC's display controller, not a GPU"
    )


def test_in_a_container_cuda_numbers_only_the_gpus_whose_nodes_it_has() -> None:
    inventory = container(ct200(), [4, 5, 6, 7])  # node 1's GPUs
    check = check_gpu_set(inventory, ["0", "1", "2", "3"])
    assert [p.address for p in check.gpus] == [
        "0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0",
    ]  # fmt: skip
    assert check.numa_local and check.numa_node == 1
    assert "CUDA's indexes in this container" in check.explanation
    why = "0000:01:00.0 has no /dev/nvidia0 in this container"
    with pytest.raises(UsageError, match=re.escape(why)):
        check_gpu_set(inventory, ["01:00.0"])


def test_in_a_container_minors_not_in_pci_order_still_number_by_address() -> None:
    # Device Minors follow the driver's probe, CUDA's indexes the PCI order.
    gpus = [make_gpu("01", 0, minor=1), make_gpu("81", 1, minor=0), make_gpu("91", 1, minor=2)]
    inventory = container(make_inventory(gpus), [0, 2])
    assert [g.address for g in numbered(inventory, CUDA)] == ["0000:81:00.0", "0000:91:00.0"]


def test_other_runtimes_number_only_their_drivers_gpus() -> None:
    amd = replace(make_gpu("c1", 1, driver="amdgpu"), vendor_id="1002")
    intel = replace(make_gpu("41", 0, driver="xe"), vendor_id="8086")
    inventory = with_gpus(ct200(), amd, intel, bmc_display())
    assert [g.address for g in numbered(inventory, ROCM)] == ["0000:c1:00.0"]
    assert [g.address for g in numbered(inventory, LEVEL_ZERO)] == ["0000:41:00.0"]
    assert len(numbered(inventory, CUDA)) == 8


def test_pci_order_compares_numbers_not_text() -> None:
    vmd, plain = make_gpu("01", 0), make_gpu("02", 0)
    vmd = replace(vmd, address="10000:01:00.0")
    assert sorted([vmd, plain], key=pci_order) == [plain, vmd]


def test_the_plans_sets_number_the_host_groups_nvidia_gpus_after_the_split() -> None:
    # Node 0 stays on nvidia with the BMC's display named into it and 11:00.0 back from
    # vfio-pci: CUDA will see 01, 11, 61 and 71 as 0-3, never the display.
    inventory = with_gpus(ct200(), bmc_display(), vfio=("0000:11:00.0",))
    plan = plan_split(inventory, SplitPolicy(lxc=200, host_nodes=[0], host_gpus=[BMC]))
    assert BMC in plan.groups[0].gpus
    advice = {tp.size: tp.device_sets for tp in plan.tensor_parallel}
    assert advice == {1: ["0", "1", "2", "3"], 2: ["0,1", "2,3"], 4: ["0,1,2,3"]}
    assert {tp.variable for tp in plan.tensor_parallel} == {"CUDA_VISIBLE_DEVICES"}


# --- a GPU in MIG mode keeps its index but is no CUDA device itself ------------------------------


def in_mig_mode(address: str, *, uuid: str | None = None) -> Inventory:
    """ct200 with the GPU at ``address`` in MIG mode, one MIG device (GI 1 CI 0) made."""
    cap = NvidiaCap(proc_path="/proc/driver/nvidia/capabilities/gpu0/mig/gi1/access", minor=12,
                    mode=0o444)  # fmt: skip
    instance = MigInstance(gi=1, ci=0, gi_cap=cap, ci_cap=cap, uuid=uuid)
    gpus = [
        replace(g, mig_mode=True, mig_instances=[instance]) if g.address == address else g
        for g in ct200().gpus
    ]
    return replace(ct200(), gpus=gpus)


def test_check_gpus_says_a_gpu_in_mig_mode_is_no_whole_cuda_device() -> None:
    uuid = "MIG-c7384736-a75d-5afc-978f-d2f1294409fd"
    inventory = in_mig_mode("0000:11:00.0", uuid=uuid)
    check = check_gpu_set(inventory, ["1", "2"])
    assert [(p.index, p.address) for p in check.gpus] == [(1, "0000:11:00.0"), (2, "0000:61:00.0")]
    assert check.gpus[0].mig_devices == [uuid]
    assert check.gpus[1].not_whole is None
    assert check.explanation.endswith(
        " GPU 1: 0000:11:00.0 is in MIG mode: CUDA runs only on its MIG devices, never on the "
        f"whole GPU; give a job one of them with CUDA_VISIBLE_DEVICES={uuid} (GI 1 CI 0)."
    )


def test_the_sets_check_gpus_offers_leave_a_gpu_in_mig_mode_out() -> None:
    inventory = in_mig_mode("0000:11:00.0")
    check = check_gpu_set(inventory, ["3", "4"])
    assert "NUMA-local sets of 2: 0,2; 4,5; 6,7." in check.explanation


def test_the_plans_sets_leave_a_kept_gpu_in_mig_mode_out_and_keep_its_index() -> None:
    inventory = in_mig_mode("0000:11:00.0")
    plan = plan_split(inventory, SplitPolicy(lxc=200))
    advice = {tp.size: tp.device_sets for tp in plan.tensor_parallel}
    assert advice == {1: ["0", "2", "3"], 2: ["0,2"]}
