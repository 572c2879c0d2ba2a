"""Tensor-parallel advice and ``check_gpu_set`` (proxgpu.planning.advice) on in-memory hosts."""

from __future__ import annotations

import pytest

from proxgpu.errors import UsageError
from proxgpu.planning import plan_split
from proxgpu.planning.advice import check_gpu_set
from proxgpu.planning.model import SplitPolicy
from tests.support.factories import ct200, make_gpu, make_inventory


def test_tp_advice_for_ct200_host_group() -> None:
    plan = plan_split(ct200(), SplitPolicy(lxc=200))
    advice = {tp.size: tp.device_sets for tp in plan.tensor_parallel}
    assert advice == {1: ["0", "1", "2", "3"], 2: ["0,1", "2,3"], 4: ["0,1,2,3"]}


def test_tp_advice_numbers_gpus_as_the_container_sees_them() -> None:
    # A host group across both sockets: sets never straddle, numbers follow the group's PCI order.
    policy = SplitPolicy(host_gpus=["0000:61:00.0", "0000:71:00.0", "81:00.0", "91:00.0", "e1:00"])
    plan = plan_split(ct200(), policy)
    advice = {tp.size: tp.device_sets for tp in plan.tensor_parallel}
    assert advice == {1: ["0", "1", "2", "3", "4"], 2: ["0,1", "2,3"]}


@pytest.mark.parametrize(
    ("selectors", "local", "node"),
    [
        (["0", "1", "2", "3"], True, 0),
        (["4", "5", "6", "7"], True, 1),
        (["1", "2", "3", "4"], False, None),
        (["81:00.0", "0000:91:00.0"], True, 1),
        (["5"], True, 1),
    ],
)
def test_check_gpu_set_on_ct200(selectors: list[str], local: bool, node: int | None) -> None:
    check = check_gpu_set(ct200(), selectors)
    assert (check.numa_local, check.numa_node) == (local, node)


def test_check_gpu_set_explains_a_straddling_set() -> None:
    check = check_gpu_set(ct200(), ["1", "2", "3", "4"])
    assert [(p.index, p.numa_node) for p in check.gpus] == [(1, 0), (2, 0), (3, 0), (4, 1)]
    assert "straddle NUMA nodes 0 and 1" in check.explanation
    assert "node 1 holds 4 (0000:81:00.0)" in check.explanation
    assert "0,1,2,3; 4,5,6,7" in check.explanation


def test_check_gpu_set_of_one_gpu_says_how_cuda_numbers_it() -> None:
    explanation = check_gpu_set(ct200(), ["f1:00.0"]).explanation
    assert explanation.startswith("GPU 7 is on NUMA node 1. (CUDA's indexes, ")
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in explanation


def test_check_gpu_set_with_unknown_node_is_not_local() -> None:
    inventory = make_inventory([make_gpu("01", None), make_gpu("02", None)])
    check = check_gpu_set(inventory, ["0", "1"])
    assert not check.numa_local
    assert "unknown" in check.explanation


@pytest.mark.parametrize("selectors", [["8"], ["zz"], ["0000:02:00.0"], []])
def test_check_gpu_set_rejects_bad_selectors(selectors: list[str]) -> None:
    with pytest.raises(UsageError):
        check_gpu_set(ct200(), selectors)
