"""Several containers sharing the host group (``--lxc 200 --lxc 201``): one plan group naming
them all, a config of its own for each, and the same refusals as for one container.

Each test takes the ct200 example, with CT 201 (and CT 202) added as copies of CT 200's config
without its GPU lines, or with them where a test is about a container holding GPUs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from proxgpu.ansible.request import split_request
from proxgpu.apply import ApplyOptions
from proxgpu.apply.rollback import rollback
from proxgpu.apply.verify import verify
from proxgpu.cli import main
from proxgpu.errors import FileChangedError, PlanRefusedError, UsageError
from proxgpu.fleet.cluster import node_policy
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection.inventory import Inventory
from proxgpu.pipeline import split_host
from proxgpu.planning import MigSpec, SplitPolicy, parse_lxc_specs, plan_split
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering import render
from proxgpu.rendering.nodes import NODES_SCRIPT, NODES_UNIT
from tests.support.trees import EXAMPLES, copy_example, inspect_example

CT = "/etc/pve/lxc/{}.conf"
NODE_0_CPUS = "0-31"  # ct200's node 0, where its kept GPUs sit
NODE_0_MIB = 528166912 // 1024  # ct200's /sys/devices/system/node/node0/meminfo


@cache
def ct200() -> Inventory:
    return inspect_example("ct200")


def gpuless(vmid: int) -> str:
    """CT 200's config without its GPU lines, as a second container's."""
    lines = ct200().guest_configs[CT.format(200)].splitlines()
    kept = [line for line in lines if not line.startswith("lxc.")]
    return "\n".join(kept).replace("hostname: llm", f"hostname: ct{vmid}") + "\n"


def with_containers(*vmids: int, holding: str | None = None) -> Inventory:
    """ct200 with gpuless containers ``vmids``; CT 202 holds GPUs ``holding`` if given."""
    configs = {CT.format(vmid): gpuless(vmid) for vmid in vmids}
    if holding is not None:
        configs[CT.format(202)] = gpuless(202) + holding
    guest_configs = {**ct200().guest_configs, **configs}
    return replace(ct200(), guest_configs=guest_configs)


SHARED = SplitPolicy(lxc=200, shared_lxc=[201], vms=[(300, None)])


def test_the_host_group_names_both_containers_and_keeps_guest_for_the_first() -> None:
    plan = plan_split(with_containers(201), SHARED)
    host = next(group for group in plan.groups if group.role == "host")
    assert host.guest is not None and host.guest.vmid == 200
    assert [(g.type, g.vmid) for g in host.guests] == [("lxc", 200), ("lxc", 201)]
    assert [g.vmid for g in host.shared_with] == [201]
    assert not any("will share it" in warning for warning in plan.warnings)


def test_each_container_gets_its_own_config_with_the_gpus_and_the_node_pinning() -> None:
    inventory = with_containers(201)
    changes = render(inventory, plan_split(inventory, SHARED))
    after = {f.path: f.after or "" for f in changes.files}
    assert len(after) == len(changes.files), "a file both containers need is written once"
    for vmid in (200, 201):
        config = GuestConfig.parse(after[CT.format(vmid)])
        values = [value for _, value in config.entries()]
        assert config.get("lxc.cgroup2.cpuset.cpus") == NODE_0_CPUS, vmid
        assert any("/dev/nvidia0" in value for value in values), vmid
        assert not any("/dev/nvidia4" in value for value in values), f"{vmid}: a vfio GPU"


def test_a_single_container_plans_exactly_as_before() -> None:
    one = plan_split(ct200(), SplitPolicy(lxc=200, vms=[(300, None)]))
    host = next(group for group in one.groups if group.role == "host")
    assert host.shared_with == [] and [g.vmid for g in host.guests] == [200]


def test_plan_text_and_json_name_every_container(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    (root / "etc/pve/lxc/201.conf").write_text(gpuless(201))
    argv = ["plan", "--root", str(root), "--lxc", "200", "--lxc", "201", "--vm", "300"]
    assert main(argv) == 0
    assert "for LXC 200, LXC 201; CPUs 0-31," in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    host = json.loads(capsys.readouterr().out)["groups"][0]
    assert host["guest"] == {"type": "lxc", "vmid": 200}
    assert host["shared_with"] == [{"type": "lxc", "vmid": 201}]


def test_another_container_losing_gpus_to_vfio_is_refused_with_the_way_out() -> None:
    vfio_gpu = "lxc.mount.entry: /dev/nvidia4 dev/nvidia4 none bind,optional,create=file\n"
    inventory = with_containers(201, holding=vfio_gpu)
    with pytest.raises(PlanRefusedError) as refused:
        plan_split(inventory, SHARED)
    [problem] = [p for p in refused.value.problems if "CT 202" in p.what]
    assert problem.code == "claimed" and "/etc/pve/lxc/202.conf" in problem.what
    assert problem.fix


def test_a_container_named_twice_is_refused() -> None:
    with pytest.raises(PlanRefusedError) as refused:
        plan_split(ct200(), SplitPolicy(lxc=200, shared_lxc=[200]))
    assert [p.code for p in refused.value.problems] == ["policy"]
    assert "guest 200 is named more than once" in refused.value.problems[0].what


def test_shared_containers_without_a_first_are_a_usage_error() -> None:
    with pytest.raises(UsageError, match="shared_lxc"):
        SplitPolicy(shared_lxc=[201])


def test_a_cluster_node_plans_only_the_containers_it_holds() -> None:
    policy = SplitPolicy(lxc=150, shared_lxc=[200, 999])
    pve1 = inspect_example("cluster-3/pve1")
    assert node_policy(policy, pve1).containers == [200]
    pve3 = inspect_example("cluster-3/pve3")
    assert node_policy(policy, pve3).containers == [150]


ANSIBLE_PARAMS: dict[str, Any] = {
    "vms": [],
    "host_nodes": [],
    "vfio_nodes": [],
    "host_gpus": [],
    "vfio_gpus": [],
    "enable_iommu": False,
    "bind_method": "driverctl",
    "mapping": None,
}


def test_ansible_takes_one_container_or_a_list() -> None:
    assert split_request({**ANSIBLE_PARAMS, "lxc": [200, 201]}).policy.containers == [200, 201]
    assert split_request({**ANSIBLE_PARAMS, "lxc": None}).policy.containers == []


def test_the_memory_of_every_sharing_container_is_weighed_against_the_node() -> None:
    inventory = with_containers(201)
    big = gpuless(201).replace("memory: 262144", "memory: 900000")
    inventory = replace(inventory, guest_configs={**inventory.guest_configs, CT.format(201): big})
    warnings = plan_split(inventory, SHARED).warnings
    assert [w for w in warnings if "MiB of memory" in w] == [
        f"CT 201 has 900000 MiB of memory and its memory is kept on NUMA node 0, which has "
        f"{NODE_0_MIB} MiB: more than the node has"
    ]


def test_planning_one_counted_container_again_keeps_the_gpu_nodes_the_other_was_given() -> None:
    inventory = with_containers(201)
    both = SplitPolicy(lxc_subsets=[(200, 2), (201, 2)], vms=[(300, None)])
    applied = {f.path: f.after or "" for f in render(inventory, plan_split(inventory, both)).files}
    inventory = replace(
        inventory,
        guest_configs={**inventory.guest_configs, CT.format(201): applied[CT.format(201)]},
        host_files={**inventory.host_files, NODES_SCRIPT: applied[NODES_SCRIPT]},
    )
    one = SplitPolicy(lxc_subsets=[(200, 2)], vms=[(300, None)])
    changes = render(inventory, plan_split(inventory, one))
    (script,) = [f.after for f in changes.files if f.path == NODES_SCRIPT]
    assert script == applied[NODES_SCRIPT], "CT 201's /dev/nvidia2 and nvidia3 are still made"
    assert any(
        w.startswith("CT 201, which this plan does not name, still names /dev/nvidia2, ")
        for w in changes.warnings
    )


# --- --lxc VMID:N: NUMA-local subsets of the host GPUs ------------------------------------------

NODE_1_CPUS = "32-63"  # ct200's /sys/devices/system/node/node1/cpulist
BOTH_NODES_KEPT: dict[str, Any] = {"host_nodes": [0, 1]}


def host_groups(
    policy: SplitPolicy, inventory: Inventory | None = None
) -> list[tuple[int, list[str]]]:
    plan = plan_split(inventory or with_containers(201), policy)
    return [
        (group.guest.vmid if group.guest else 0, group.gpus)
        for group in plan.groups
        if group.role == "host"
    ]


def test_containers_with_counts_get_their_own_gpus_of_one_node() -> None:
    policy = SplitPolicy(lxc_subsets=[(200, 2), (201, 2)], vms=[(300, None)])
    assert host_groups(policy) == [
        (200, ["0000:01:00.0", "0000:11:00.0"]),
        (201, ["0000:61:00.0", "0000:71:00.0"]),
    ]


def test_each_counted_container_is_pinned_to_the_node_of_its_gpus() -> None:
    inventory = with_containers(201)
    policy = SplitPolicy(lxc_subsets=[(200, 4), (201, 4)], **BOTH_NODES_KEPT)
    plan = plan_split(inventory, policy)
    assert [(g.guest.vmid if g.guest else 0, g.numa_node) for g in plan.groups] == [
        (200, 0),
        (201, 1),
    ]
    after = {f.path: f.after or "" for f in render(inventory, plan).files}
    for vmid, cpus in ((200, NODE_0_CPUS), (201, NODE_1_CPUS)):
        config = GuestConfig.parse(after[CT.format(vmid)])
        assert config.get("lxc.cgroup2.cpuset.cpus") == cpus, vmid
        assert config.get("lxc.cgroup2.cpuset.mems") == str(vmid - 200), vmid


def test_a_count_no_node_can_hold_is_refused_with_the_counts() -> None:
    with pytest.raises(PlanRefusedError) as refused:
        plan_split(with_containers(201), SplitPolicy(lxc_subsets=[(200, 2), (201, 3)]))
    [problem] = refused.value.problems
    assert problem.code == "no-fit"
    assert problem.what == (
        "CT 200 asks for 2 GPUs on one NUMA node, but no node has that many host GPUs left "
        "(node 0: 1)"
    )
    assert "--lxc VMID:N" in problem.fix


def test_containers_without_a_count_share_what_the_counted_ones_leave() -> None:
    inventory = with_containers(201, 202)
    policy = SplitPolicy(lxc=201, shared_lxc=[202], lxc_subsets=[(200, 3)])
    plan = plan_split(inventory, policy)
    rest = next(g for g in plan.groups if g.guest is not None and g.guest.vmid == 201)
    assert rest.gpus == ["0000:71:00.0"] and [g.vmid for g in rest.shared_with] == [202]


def test_gpus_no_counted_container_takes_are_said_to_go_to_none() -> None:
    plan = plan_split(ct200(), SplitPolicy(lxc_subsets=[(200, 3)]))
    assert "1 GPU on the host driver go to no container the plan names: 0000:71:00.0" in (
        plan.warnings
    )
    assert [g.guest for g in plan.groups if g.role == "host"][1] is None


def test_the_containers_the_plan_does_not_name_are_said_to_use_what_is_left() -> None:
    """CT 202's node of GPU 3 (0000:71:00.0) keeps it in use though no named container gets it."""
    inventory = with_containers(holding="dev0: /dev/nvidia3\n")
    plan = plan_split(inventory, SplitPolicy(lxc_subsets=[(200, 2)]))
    assert (
        "2 GPUs on the host driver go to no container the plan names: 0000:61:00.0 and "
        "0000:71:00.0 (CT 202 uses 0000:71:00.0)"
    ) in plan.warnings


@pytest.mark.parametrize("spec", ["200:0", "200:x", "ct200", "200:"])
def test_a_container_spec_that_cannot_be_is_a_usage_error(spec: str) -> None:
    with pytest.raises(UsageError, match="expected VMID or VMID:N"):
        parse_lxc_specs([spec])


def test_the_cli_and_ansible_spell_counts_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    (root / "etc/pve/lxc/201.conf").write_text(gpuless(201))
    assert main(["plan", "--root", str(root), "--lxc", "200:2", "--lxc", "201:2", "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["groups"]
    assert [g["guest"]["vmid"] for g in groups if g["role"] == "host"] == [200, 201]
    policy = split_request({**ANSIBLE_PARAMS, "lxc": [200, "201:2"]}).policy
    assert (policy.lxc, policy.lxc_subsets) == (200, [(201, 2)])


# --- --lxc VMID@NODE: a container per kept NUMA node ---------------------------------------------


def test_containers_bound_to_nodes_get_each_nodes_gpus_and_its_pinning_in_their_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    (root / "etc/pve/lxc/201.conf").write_text(gpuless(201))
    argv = ["plan", "--root", str(root), "--host-node", "0", "--host-node", "1"]
    assert main([*argv, "--lxc", "200@0", "--lxc", "201@1", "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["groups"]
    assert [(g["guest"]["vmid"], g["numa_node"], g["cpus"]) for g in groups] == [
        (200, 0, NODE_0_CPUS),
        (201, 1, NODE_1_CPUS),
    ]
    inventory = with_containers(201)
    policy = SplitPolicy(lxc_nodes=[(200, 0, None), (201, 1, None)], **BOTH_NODES_KEPT)
    after = {f.path: f.after or "" for f in render(inventory, plan_split(inventory, policy)).files}
    for vmid, own, other in ((200, "/dev/nvidia0", "/dev/nvidia4"), (201, "/dev/nvidia4", None)):
        config = GuestConfig.parse(after[CT.format(vmid)])
        values = [value for _, value in config.entries()]
        assert config.get("lxc.cgroup2.cpuset.mems") == str(vmid - 200), vmid
        assert any(own in value for value in values), vmid
        assert other is None or not any(other in value for value in values), vmid


def test_a_node_keeping_none_is_refused_on_the_command_line_with_the_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    (root / "etc/pve/lxc/201.conf").write_text(gpuless(201))
    assert main(["plan", "--root", str(root), "--lxc", "200@0", "--lxc", "201@1"]) != 0
    err = capsys.readouterr().err
    assert "CT 201 asks for node 1's host GPUs, but node 1 keeps none" in err
    assert "(kept: node 0: 4)" in err and "--host-node 1" in err


def test_ansible_and_a_cluster_node_take_node_bound_containers() -> None:
    policy = split_request({**ANSIBLE_PARAMS, "lxc": ["200@0", "150:1@1", 201]}).policy
    assert (policy.lxc, policy.lxc_nodes) == (201, [(200, 0, None), (150, 1, 1)])
    pve3 = inspect_example("cluster-3/pve3")
    held = node_policy(policy, pve3)
    assert (held.lxc, held.lxc_nodes) == (None, [(150, 1, 1)])


def test_the_plan_text_gives_each_container_its_own_tp_sets_with_their_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_example(tmp_path)
    (root / "etc/pve/lxc/201.conf").write_text(gpuless(201))
    assert main(["plan", "--root", str(root), "--lxc", "200:2", "--lxc", "201:2"]) == 0
    out = capsys.readouterr().out
    heading = "  NUMA-local CUDA_VISIBLE_DEVICES for CT {}, numbered as the container will see"
    first, second = out.index(heading.format(200)), out.index(heading.format(201))
    assert first < second
    assert "    TP=2: 0,1 (0000:01:00.0, 0000:11:00.0)\n" in out[first:second]
    assert "    TP=2: 0,1 (0000:61:00.0, 0000:71:00.0)\n" in out[second:]


def test_a_host_group_no_container_gets_is_numbered_for_one_that_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--root", str(EXAMPLES / "vgpu")]) == 0
    out = capsys.readouterr().out
    assert (
        "  NUMA-local CUDA_VISIBLE_DEVICES for the host group, numbered as a container given "
        "them would see them"
    ) in out
    assert "the container will see" not in out


# --- verify and rollback name the container --------------------------------------------------


def two_containers_applied(tmp_path: Path) -> tuple[Path, DirectoryHost]:
    """ct200 with CT 201, split for CT 200 on node 0 and CT 201 on node 1, applied."""
    root = copy_example(tmp_path)
    (root / "etc/pve/lxc/201.conf").write_text(gpuless(201))
    host = DirectoryHost(str(root))
    policy = SplitPolicy(lxc_nodes=[(200, 0, None), (201, 1, None)], **BOTH_NODES_KEPT)
    assert split_host(host, policy, how=ApplyOptions()).changed
    return root, host


def test_verify_checks_each_containers_entries_and_names_the_one_that_drifted(
    tmp_path: Path,
) -> None:
    root, host = two_containers_applied(tmp_path)
    assert not [line for line in verify(host).drift if line.startswith("/")]
    ct201 = root / "etc/pve/lxc/201.conf"
    lines = ct201.read_text().splitlines()
    cpuset = next(line for line in lines if line.startswith("lxc.cgroup2.cpuset.cpus"))
    ct201.write_text("\n".join(line for line in lines if line != cpuset) + "\n")
    drift = [line for line in verify(host).drift if line.startswith("/")]
    assert drift and all(line.startswith(f"{CT.format(201)} (CT 201): ") for line in drift)
    assert any("lxc.cgroup2.cpuset.cpus" in line for line in drift)


def test_rollback_names_the_container_whose_config_changed_since(tmp_path: Path) -> None:
    root, host = two_containers_applied(tmp_path)
    ct201 = root / "etc/pve/lxc/201.conf"
    ct201.write_bytes(b"\xff not UTF-8\n")
    with pytest.raises(FileChangedError, match="CT 201's config changed since apply"):
        rollback(host)


def test_the_nodes_unit_says_whose_nodes_it_makes() -> None:
    inventory = with_containers(201)
    policy = SplitPolicy(lxc_nodes=[(200, 0, None), (201, 1, None)], **BOTH_NODES_KEPT)
    changes = render(inventory, plan_split(inventory, policy))
    [unit] = [f for f in changes.files if f.path == NODES_UNIT]
    assert unit.why == "make the NVIDIA device nodes of CT 200 and CT 201 at boot"


def test_a_cluster_node_keeps_only_the_mig_containers_and_vgpu_vms_it_holds() -> None:
    """CT 200 and CT 201 (each on a MIG instance) and VM 300 are the mig host's; VM 400 and CT
    999 are another node's: this node plans neither, and its MIG containers share nothing."""
    mig = inspect_example("mig")
    policy = SplitPolicy(
        lxc=999,
        lxc_mig=[MigSpec(vmid=200, gpu="0", gi=2), MigSpec(vmid=998, gpu="0", gi=9)],
        vgpus=[(300, "nvidia-1155"), (400, "nvidia-1155")],
    )
    mine = node_policy(policy, mig)
    assert (mine.lxc, mine.shared_lxc) == (None, [])
    assert [spec.vmid for spec in mine.lxc_mig] == [200]
    assert mine.vgpus == [(300, "nvidia-1155")]
