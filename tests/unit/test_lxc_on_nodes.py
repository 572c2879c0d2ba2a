"""``--lxc VMID@NODE`` in the planner: a 4-node host keeping two nodes gives each container its
node's kept GPUs, pinned to that node; a node keeping none, or too few, is refused with counts."""

from __future__ import annotations

from typing import Any

import pytest

from proxgpu.errors import UsageError
from proxgpu.inspection.inventory import Inventory
from proxgpu.planning import parse_lxc_specs, plan_split
from proxgpu.planning.model import SplitPolicy
from proxgpu.planning.requests import MigSpec
from tests.support.factories import make_gpu, make_inventory
from tests.support.plans import refusal

FOUR_NODES = {0: "0-15", 1: "16-31", 2: "32-47", 3: "48-63"}


def four_nodes() -> Inventory:
    """Two GPUs on each of four NUMA nodes (buses 0x10*node+1 and +2)."""
    gpus = [make_gpu(f"{0x10 * node + i:02x}", node) for node in range(4) for i in (1, 2)]
    return make_inventory(gpus, FOUR_NODES)


KEEP_0_1: dict[str, Any] = {"host_nodes": [0, 1], "vfio_nodes": [2, 3]}


def host_groups(policy: SplitPolicy) -> list[tuple[list[int], int | None, str, list[int]]]:
    """(containers, node, cpus, memory nodes) of each host group, in plan order."""
    return [
        ([g.vmid for g in group.guests], group.numa_node, group.cpus, group.memory_nodes)
        for group in plan_split(four_nodes(), policy).groups
        if group.role == "host"
    ]


def test_each_container_gets_its_nodes_kept_gpus_pinned_to_that_node() -> None:
    policy = SplitPolicy(lxc_nodes=[(200, 0, None), (201, 1, None)], **KEEP_0_1)
    assert host_groups(policy) == [([200], 0, "0-15", [0]), ([201], 1, "16-31", [1])]
    vfio = [g for g in plan_split(four_nodes(), policy).groups if g.role == "vfio"]
    assert [g.numa_node for g in vfio] == [2, 3]


def test_containers_naming_one_node_share_it() -> None:
    policy = SplitPolicy(lxc_nodes=[(200, 1, None), (201, 1, None)], **KEEP_0_1)
    plan = plan_split(four_nodes(), policy)
    [shared] = [g for g in plan.groups if g.guest is not None]
    assert [g.vmid for g in shared.guests] == [200, 201] and shared.numa_node == 1
    assert (
        "2 GPUs on the host driver go to no container the plan names: 0000:01:00.0 and 0000:02:00.0"
        in (plan.warnings)
    )


def test_a_count_on_a_node_takes_that_many_and_leaves_the_rest_to_its_others() -> None:
    policy = SplitPolicy(lxc_nodes=[(201, 0, None), (200, 0, 1)], lxc=202, **KEEP_0_1)
    plan = plan_split(four_nodes(), policy)
    owned = {g.guest.vmid: (g.gpus, g.numa_node) for g in plan.groups if g.guest is not None}
    assert owned == {
        200: (["0000:01:00.0"], 0),
        201: (["0000:02:00.0"], 0),
        202: (["0000:11:00.0", "0000:12:00.0"], 1),
    }


def test_a_node_that_keeps_none_is_refused_with_the_kept_counts() -> None:
    error = refusal(four_nodes(), SplitPolicy(lxc_nodes=[(200, 0, None), (201, 2, None)]))
    [problem] = error.problems
    assert problem.code == "no-fit"
    assert problem.what == (
        "CT 201 asks for node 2's host GPUs, but node 2 keeps none on the host driver "
        "(kept: node 0: 2)"
    )
    assert "--host-node 2" in problem.fix


def test_a_count_the_node_cannot_hold_is_refused_with_what_is_left() -> None:
    policy = SplitPolicy(lxc_nodes=[(200, 1, 2), (201, 1, 1)], **KEEP_0_1)
    [problem] = refusal(four_nodes(), policy).problems
    assert problem.what == (
        "CT 201 asks for 1 host GPU of node 1, but none of node 1's 2 host GPUs are left for it"
    )
    assert "VMID:N@NODE" in problem.fix


def test_a_sharing_container_left_nothing_is_refused() -> None:
    policy = SplitPolicy(lxc=202, lxc_nodes=[(200, 0, None), (201, 1, None)], **KEEP_0_1)
    [problem] = refusal(four_nodes(), policy).problems
    assert problem.what == (
        "CT 202 should share the host GPUs the other containers leave, but they leave none"
    )


def test_a_container_bound_to_a_node_and_named_again_is_refused() -> None:
    policy = SplitPolicy(lxc=200, lxc_nodes=[(200, 0, None)], **KEEP_0_1)
    assert "guest 200 is named more than once" in refusal(four_nodes(), policy).problems[0].what


def test_node_specs_parse_apart_from_counts() -> None:
    policy = SplitPolicy(requests=parse_lxc_specs(["200@0", "201:2@1", "202:1", "203"]))
    assert policy.lxc_nodes == [(200, 0, None), (201, 1, 2)]
    assert (policy.lxc_subsets, policy.shared) == ([(202, 1)], [203])


@pytest.mark.parametrize("spec", ["200@", "200@x", "200@-1", "@1", "200:0@1", "200@1@2"])
def test_a_node_spec_that_cannot_be_is_a_usage_error(spec: str) -> None:
    with pytest.raises(UsageError, match=r"container '.*'"):
        parse_lxc_specs([spec])


# --- tensor-parallel advice for every host group ------------------------------------------------


def test_every_host_group_gets_its_own_tp_sets_numbered_from_zero_with_its_gpus() -> None:
    policy = SplitPolicy(lxc_nodes=[(200, 0, None), (201, 1, None)], **KEEP_0_1)
    advice = plan_split(four_nodes(), policy).tensor_parallel
    assert [(a.for_whom, a.size, a.device_sets, a.gpu_sets) for a in advice] == [
        ("CT 200", 1, ["0", "1"], [["0000:01:00.0"], ["0000:02:00.0"]]),
        ("CT 200", 2, ["0,1"], [["0000:01:00.0", "0000:02:00.0"]]),
        ("CT 201", 1, ["0", "1"], [["0000:11:00.0"], ["0000:12:00.0"]]),
        ("CT 201", 2, ["0,1"], [["0000:11:00.0", "0000:12:00.0"]]),
    ]


def test_a_shared_group_spanning_nodes_has_one_set_per_node_naming_both_containers() -> None:
    policy = SplitPolicy(lxc=200, shared_lxc=[201], **KEEP_0_1)
    advice = plan_split(four_nodes(), policy).tensor_parallel
    pairs = [a for a in advice if a.size == 2]
    assert [(a.for_whom, a.device_sets, a.gpu_sets) for a in pairs] == [
        (
            "CT 200 and CT 201",
            ["0,1", "2,3"],
            [["0000:01:00.0", "0000:02:00.0"], ["0000:11:00.0", "0000:12:00.0"]],
        )
    ]
    assert not [a for a in advice if a.size == 4], "no node holds 4: no NUMA-local set of 4"


def test_the_policy_takes_the_command_line_s_spellings_of_every_guest() -> None:
    """A script writes the guests as the CLI and Ansible do; the policy sorts them into the same
    fields as the explicit form, and a spelling that is none of them is a UsageError."""
    spelt = SplitPolicy(
        lxc=["200", "201", "202:2", "203:1@1", "204:mig=0/1"],
        vms=["300:2", 301, "400:vgpu=nvidia-1155"],
    )
    explicit = SplitPolicy(
        lxc=200,
        shared_lxc=[201],
        lxc_subsets=[(202, 2)],
        lxc_nodes=[(203, 1, 1)],
        lxc_mig=[MigSpec(vmid=204, gpu="0", gi=1)],
        vms=[(300, 2), (301, None)],
        vgpus=[(400, "nvidia-1155")],
    )
    assert spelt == explicit
    assert SplitPolicy(lxc="202:2").lxc_subsets == [(202, 2)]
    assert SplitPolicy(lxc=[]).lxc is None
    with pytest.raises(UsageError, match="container 'two hundred'"):
        SplitPolicy(lxc="two hundred")
