"""Where ``proxgpu run --tp N`` puts a job (proxgpu.planning.jobs.place_job): N GPUs of one NUMA
node by the runtime's own numbering, that node's CPUs and memory, or a refusal naming each node's
count."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from proxgpu.errors import UsageError
from proxgpu.inspection.inventory import Gpu, Inventory, MdevType, MigInstance, NvidiaCap
from proxgpu.planning.jobs import place_job
from tests.support.factories import (
    bmc_display,
    container,
    ct200,
    make_gpu,
    make_inventory,
    with_gpus,
)


def on(gpu: Gpu, vendor: str, driver: str) -> Gpu:
    return replace(gpu, vendor_id=vendor, driver=driver, nvidia_minor=None)


def vendor_host(vendor: str, driver: str) -> Inventory:
    base = ct200()
    return replace(base, gpus=[on(gpu, vendor, driver) for gpu in base.gpus])


def changed(inventory: Inventory, address: str, **fields: Any) -> Inventory:
    """The inventory with the GPU at ``address`` changed as ``fields`` say."""
    gpus = [replace(g, **fields) if g.address == address else g for g in inventory.gpus]
    return replace(inventory, gpus=gpus)


def mig_instance(gi: int, uuid: str | None) -> MigInstance:
    cap = NvidiaCap(proc_path=f"/proc/driver/nvidia/capabilities/gpu0/mig/gi{gi}/access", minor=gi,
                    mode=0o444)  # fmt: skip
    return MigInstance(gi=gi, ci=0, gi_cap=cap, ci_cap=cap, uuid=uuid)


def test_tp4_takes_the_first_node_with_four_cuda_gpus() -> None:
    job = place_job(with_gpus(ct200(), bmc_display()), 4)
    assert (job.runtime, job.numa_node, job.cpus) == ("CUDA", 0, "0-31,64-95")
    assert [g.address for g in job.gpus] == [
        "0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0",
    ]  # fmt: skip
    assert job.environment == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in job.numbering


def test_a_node_short_of_gpus_is_passed_over_with_cudas_indexes_kept() -> None:
    # 11:00.0 on vfio-pci leaves node 0 three CUDA GPUs: node 1's four are CUDA's 3-6.
    job = place_job(with_gpus(ct200(), vfio=("0000:11:00.0",)), 4)
    assert job.numa_node == 1
    assert job.environment["CUDA_VISIBLE_DEVICES"] == "3,4,5,6"
    assert job.cpus == "32-63,96-127"


def test_node_chooses_the_node_and_the_first_gpus_on_it() -> None:
    job = place_job(ct200(), 2, node=1)
    assert [g.index for g in job.gpus] == [4, 5]
    assert job.environment["CUDA_VISIBLE_DEVICES"] == "4,5"


@pytest.mark.parametrize(
    ("size", "node", "message"),
    [
        (
            5,
            None,
            "pve1: no NUMA node has 5 CUDA GPUs: node 0 has 4, node 1 has 3; "
            "ask for fewer with --tp",
        ),
        (
            4,
            1,
            "pve1: NUMA node 1 has fewer than 4 CUDA GPUs: node 0 has 4, node 1 has 3; "
            "choose another --node or ask for fewer with --tp",
        ),
        (1, 2, "pve1: no NUMA node 2; its nodes are 0 and 1"),
        (0, None, "--tp 0: a job needs at least 1 GPU"),
    ],
)
def test_refusals_are_usage_errors_naming_each_nodes_count(
    size: int, node: int | None, message: str
) -> None:
    inventory = with_gpus(ct200(), vfio=("0000:f1:00.0",))
    with pytest.raises(UsageError) as error:
        place_job(inventory, size, node)
    assert str(error.value) == message
    assert error.value.exit_code == 2


def test_gpus_of_unknown_node_are_counted_apart_and_never_chosen() -> None:
    inventory = make_inventory([make_gpu("01", None), make_gpu("02", None), make_gpu("81", 1)])
    with pytest.raises(UsageError, match="node 0 has 0, node 1 has 1, 2 of unknown node"):
        place_job(inventory, 2)


def test_on_a_host_of_one_node_gpus_of_unknown_node_are_on_it() -> None:
    inventory = make_inventory([make_gpu("01", None), make_gpu("02", None)], {0: "0-15"})
    job = place_job(inventory, 2)
    assert (job.numa_node, job.cpus, job.environment["CUDA_VISIBLE_DEVICES"]) == (0, "0-15", "0,1")


def test_in_a_container_only_its_gpus_are_placed() -> None:
    job = place_job(container(ct200(), [5, 6]), 2)
    assert job.numa_node == 1
    assert job.environment["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert [g.address for g in job.gpus] == ["0000:91:00.0", "0000:e1:00.0"]
    assert "in this container" in job.numbering


def test_amd_gpus_get_hips_variable_and_lose_an_inherited_rocr_mask() -> None:
    job = place_job(vendor_host("1002", "amdgpu"), 2, node=1)
    assert (job.runtime, job.environment) == ("ROCm", {"HIP_VISIBLE_DEVICES": "4,5"})
    assert job.unset == ["ROCR_VISIBLE_DEVICES"]


def test_intel_gpus_get_level_zeros_mask_in_pci_order() -> None:
    job = place_job(vendor_host("8086", "xe"), 1)
    assert job.environment == {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1", "ZE_AFFINITY_MASK": "0"}


def test_a_host_where_no_runtime_sees_a_gpu_says_why() -> None:
    inventory = make_inventory([make_gpu("81", 1, driver="vfio-pci")])
    with pytest.raises(UsageError) as error:
        place_job(inventory, 1)
    assert str(error.value) == (
        "pve1: CUDA sees no GPU: 0000:81:00.0 is on vfio-pci, not nvidia; "
        "nor does ROCm (amdgpu) or Level Zero (i915, xe)"
    )


def test_a_job_gets_only_the_cpus_it_may_use() -> None:
    # A container pinned to half of node 1's CPUs.
    job = place_job(ct200(), 4, node=1, usable_cpus=range(32, 48))
    assert job.cpus == "32-47"


def test_a_node_whose_cpus_are_all_out_of_reach_is_passed_over() -> None:
    job = place_job(ct200(), 4, usable_cpus=[40, 41])
    assert (job.numa_node, job.cpus) == (1, "40-41")


def test_no_usable_cpu_on_the_node_asked_for_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="none of NUMA node 0's CPUs"):
        place_job(ct200(), 4, node=0, usable_cpus=[40])
    with pytest.raises(UsageError, match="have no CPU this process may run on"):
        place_job(ct200(), 4, usable_cpus=[200])


# --- GPUs that are numbered but no whole GPU for a job ------------------------------------------


def test_a_gpu_in_mig_mode_keeps_its_index_but_no_job_gets_it() -> None:
    inventory = changed(ct200(), "0000:01:00.0", mig_mode=True)
    job = place_job(inventory, 4)
    # Node 0 has three whole GPUs left; node 1's keep nvidia-smi's indexes 4-7, not 3-6.
    assert (job.numa_node, job.environment["CUDA_VISIBLE_DEVICES"]) == (1, "4,5,6,7")
    assert job.passed_over == [
        "CUDA GPU 0: 0000:01:00.0 is in MIG mode: CUDA runs only on its MIG devices, never on "
        "the whole GPU; give a job one of them with CUDA_VISIBLE_DEVICES=MIG-<UUID> "
        "(nvidia-smi -L lists them under the GPU)"
    ]
    job = place_job(inventory, 3, node=0)
    assert job.environment["CUDA_VISIBLE_DEVICES"] == "1,2,3"


def test_a_refusal_names_the_mig_gpu_and_its_mig_devices_to_use_instead() -> None:
    uuids = ["MIG-c7384736-a75d-5afc-978f-d2f1294409fd", "MIG-a28ad590-3fda-56dd-84fc-0a0b96edc58d"]
    instances = [mig_instance(1, uuids[0]), mig_instance(2, uuids[1])]
    inventory = changed(ct200(), "0000:01:00.0", mig_mode=True, mig_instances=instances)
    with pytest.raises(UsageError) as error:
        place_job(inventory, 4, node=0)
    assert str(error.value) == (
        "pve1: NUMA node 0 has fewer than 4 CUDA GPUs: node 0 has 3, node 1 has 4 (not counted: "
        "CUDA GPU 0: 0000:01:00.0 is in MIG mode: CUDA runs only on its MIG devices, never on "
        f"the whole GPU; give a job one of them with CUDA_VISIBLE_DEVICES={uuids[0]} (GI 1 CI 0) "
        f"or {uuids[1]} (GI 2 CI 0)); choose another --node or ask for fewer with --tp"
    )


def test_a_host_whose_only_gpu_is_in_mig_mode_places_no_job() -> None:
    inventory = make_inventory([replace(make_gpu("18", 0, minor=0), mig_mode=True)])
    with pytest.raises(UsageError, match=r"node 0 has 0, node 1 has 0 \(not counted: CUDA GPU 0"):
        place_job(inventory, 1)


def test_a_gpu_serving_vgpus_keeps_its_index_but_no_job_gets_it() -> None:
    running = MdevType(
        id="nvidia-1072", available=5, instances=["00000000-0000-0000-0000-000000000310"]
    )
    inventory = changed(ct200(), "0000:11:00.0", mdev_types=[running])
    job = place_job(inventory, 2)
    assert job.environment["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert job.passed_over == [
        "CUDA GPU 1: 0000:11:00.0 serves 1 vGPU to VMs (mediated devices exist): NVIDIA's vGPU "
        "software describes no CUDA work on the host beside them, so no job is placed there"
    ]
    # Types offered but no vGPU made: the GPU is whole.
    idle = changed(ct200(), "0000:11:00.0", mdev_types=[replace(running, instances=[])])
    assert place_job(idle, 2).environment["CUDA_VISIBLE_DEVICES"] == "0,1"
