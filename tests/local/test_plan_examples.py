"""The planner on every example host, as a user meets them with `proxgpu plan`."""

from __future__ import annotations

import pytest

from proxgpu.errors import PlanRefusedError
from proxgpu.planning import plan_split
from proxgpu.planning.advice import check_gpu_set
from proxgpu.planning.model import SplitPolicy
from tests.support.trees import inspect_example


def codes(name: str, policy: SplitPolicy) -> list[str]:
    with pytest.raises(PlanRefusedError) as err:
        plan_split(inspect_example(name), policy)
    return [p.code for p in err.value.problems]


def test_ct200_default_split_keeps_node0_for_the_container() -> None:
    plan = plan_split(inspect_example("ct200"), SplitPolicy(lxc=200, vms=[(300, None)]))
    host, vfio = plan.groups
    assert (host.role, host.numa_node, host.cpus, host.driver) == ("host", 0, "0-31", "nvidia")
    assert (vfio.role, vfio.numa_node, vfio.cpus, vfio.driver) == ("vfio", 1, "32-63", "vfio-pci")
    assert host.gpus == ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"]
    assert len(vfio.functions) == 8, "every audio function moves with its GPU"
    assert [a.size for a in plan.tensor_parallel] == [1, 2, 4]
    assert plan.tensor_parallel[-1].device_sets == ["0,1,2,3"]


def test_ct200_without_target_plans_for_the_container_that_holds_the_kept_gpus() -> None:
    plan = plan_split(inspect_example("ct200"), SplitPolicy())
    host = next(g for g in plan.groups if g.role == "host")
    assert host.guest is not None and (host.guest.type, host.guest.vmid) == ("lxc", 200)
    assert plan.notes[0].startswith("CT 200 uses the GPUs that stay on the host driver")


def test_ct200_for_another_container_refuses_once_listing_the_gpus_ct200_holds() -> None:
    with pytest.raises(PlanRefusedError) as refused:
        plan_split(inspect_example("ct200"), SplitPolicy(lxc=201))
    error = refused.value
    assert [p.code for p in error.problems] == ["claimed"]
    assert error.problems[0].what.startswith(
        "0000:81:00.0, 0000:91:00.0, 0000:e1:00.0 and 0000:f1:00.0 go to vfio-pci but CT 200"
    )


def test_ct200_tp4_on_gpus_1_to_4_straddles_and_0_to_3_does_not() -> None:
    inventory = inspect_example("ct200")
    assert not check_gpu_set(inventory, ["1", "2", "3", "4"]).numa_local
    assert check_gpu_set(inventory, ["0", "1", "2", "3"]).numa_local


def test_unknown_numa_refuses_until_assigned_by_address() -> None:
    assert codes("single-socket", SplitPolicy()) == ["unknown-numa"]
    plan = plan_split(inspect_example("single-socket"), SplitPolicy(vfio_gpus=["0b:00.0"], lxc=101))
    assert [g.gpus for g in plan.groups] == [["0000:01:00.0"], ["0000:0b:00.0"]]


def test_boot_vga_to_vfio_is_a_warning() -> None:
    plan = plan_split(
        inspect_example("single-socket"), SplitPolicy(vfio_gpus=["0000:01:00.0"], lxc=101)
    )
    assert any("boot" in w.lower() and "0000:01:00.0" in w for w in plan.warnings)


def test_uneven_split_is_reported_and_iommu_off_needs_the_cmdline_change() -> None:
    assert codes("uneven-5-3", SplitPolicy(lxc=150)) == ["iommu-off"]
    plan = plan_split(inspect_example("uneven-5-3"), SplitPolicy(enable_iommu=True, lxc=150))
    assert [len(g.gpus) for g in plan.groups] == [5, 3]
    assert any("uneven" in w for w in plan.notes)
    assert plan.enable_iommu


def test_shared_iommu_group_moves_as_a_whole_or_not_at_all() -> None:
    plan = plan_split(inspect_example("shared-iommu-group"), SplitPolicy())
    assert plan.groups[1].gpus == ["0000:83:00.0", "0000:84:00.0"]
    assert codes("shared-iommu-group", SplitPolicy(vfio_gpus=["0000:83:00.0"])) == ["iommu-mixed"]


def test_real_h200_capture_needs_an_explicit_assignment() -> None:
    assert codes("h200-vm", SplitPolicy()) == ["unknown-numa"]
