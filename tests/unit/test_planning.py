"""The planner (proxgpu.planning) on in-memory inventories: the split, NUMA, IOMMU groups, VMs."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxgpu.errors import PlanRefusedError, ProxgpuError
from proxgpu.inspection.inventory import Inventory, PciFunction
from proxgpu.planning import plan_split
from proxgpu.planning.model import Plan, Role, SplitPolicy
from proxgpu.pve.claims import GuestRef
from tests.support.factories import ct200, make_fn, make_gpu, make_inventory
from tests.support.plans import codes, refusal
from tests.support.strategies import random_hosts

# --- the JSON contract and the default split ---------------------------------------------------


def test_ct200_default_split_matches_the_json_contract() -> None:
    plan = plan_split(ct200(), SplitPolicy(lxc=200, vms=[(300, None)]))
    dumped = plan.model_dump(mode="json")
    assert set(dumped) >= {"groups", "warnings"}
    host, vfio = dumped["groups"]
    assert host == {
        "role": "host",
        "numa_node": 0,
        "gpus": ["0000:01:00.0", "0000:11:00.0", "0000:61:00.0", "0000:71:00.0"],
        "functions": [
            "0000:01:00.0", "0000:01:00.1", "0000:11:00.0", "0000:11:00.1",
            "0000:61:00.0", "0000:61:00.1", "0000:71:00.0", "0000:71:00.1",
        ],
        "cpus": "0-31,64-95",
        "memory_nodes": [0],
        "driver": "nvidia",
        "guest": {"type": "lxc", "vmid": 200},
        "shared_with": [],
        "vgpus": [],
        "mig": [],
    }  # fmt: skip
    assert vfio["role"] == "vfio"
    assert vfio["numa_node"] == 1
    assert vfio["gpus"] == ["0000:81:00.0", "0000:91:00.0", "0000:e1:00.0", "0000:f1:00.0"]
    assert "0000:f1:00.1" in vfio["functions"]
    assert vfio["cpus"] == "32-63,96-127"
    assert vfio["memory_nodes"] == [1]
    assert vfio["driver"] == "vfio-pci"
    assert vfio["guest"] == {"type": "vm", "vmid": 300}
    assert dumped["warnings"] == []


def test_without_targets_the_plan_covers_binding_only() -> None:
    plan = plan_split(ct200(), SplitPolicy())
    assert [group.guest for group in plan.groups] == [None, None]


def test_plan_is_deterministic_and_round_trips_through_json() -> None:
    inventory = ct200()
    policy = SplitPolicy(lxc=200, vms=[(300, 2), (301, 2)])
    plan = plan_split(inventory, policy)
    assert plan == plan_split(inventory, policy)
    assert Plan.model_validate_json(plan.model_dump_json()) == plan


def test_unbound_or_vfio_bound_gpu_returns_to_nvidia_on_the_host() -> None:
    gpus = [make_gpu("01", 0, driver="vfio-pci"), make_gpu("81", 1, driver=None)]
    host, _ = plan_split(make_inventory(gpus)).groups
    assert host.driver == "nvidia"


def test_no_gpus_is_refused() -> None:
    assert codes(refusal(make_inventory([]))) == ["no-gpus"]


def test_refusal_is_a_proxgpu_error_naming_host_problem_and_fix() -> None:
    error = refusal(make_inventory([make_gpu("01", None), make_gpu("02", None)]))
    assert isinstance(error, ProxgpuError)
    assert error.exit_code != 0
    text = str(error)
    assert text.startswith("pve1: plan refused (1 problem)")
    assert error.problems[0].what in text
    assert error.problems[0].fix in text


# --- NUMA: unknown, uneven, empty nodes, more than two nodes ----------------------------------


def test_single_socket_with_unknown_numa_is_refused_with_a_way_out() -> None:
    inventory = make_inventory([make_gpu("01", None), make_gpu("02", None)], {0: "0-15"})
    error = refusal(inventory)
    assert codes(error) == ["unknown-numa"]
    assert "0000:01:00.0 and 0000:02:00.0" in error.problems[0].what
    assert "--vfio-gpus 0000:02:00.0" in error.problems[0].fix


def test_unknown_numa_assigned_by_address_pins_to_every_cpu() -> None:
    inventory = make_inventory([make_gpu("01", None), make_gpu("02", None)], {0: "0-15"})
    plan = plan_split(inventory, SplitPolicy(vfio_gpus=["02:00.0"], lxc=200))
    host, vfio = plan.groups
    assert (host.gpus, vfio.gpus) == (["0000:01:00.0"], ["0000:02:00.0"])
    assert host.numa_node is None
    assert host.cpus == "0-127"  # local_cpulist of an unknown node: every online CPU
    assert host.memory_nodes == [0]
    assert plan.tensor_parallel == []


def test_unknown_numa_on_a_two_node_host_warns_that_pinning_covers_every_node() -> None:
    inventory = make_inventory([make_gpu("01", None), make_gpu("81", 1)])
    plan = plan_split(inventory, SplitPolicy(host_gpus=["01:00.0"]))
    host, vfio = plan.groups
    assert (host.memory_nodes, vfio.memory_nodes) == ([0, 1], [1])
    assert plan.warnings == [
        "the host group holds GPUs of unknown NUMA node: its pinning covers every node"
    ]


def test_uneven_split_is_reported() -> None:
    gpus = [make_gpu(f"{i:02x}", 0) for i in range(1, 6)] + [
        make_gpu(f"{i:02x}", 1) for i in range(0x81, 0x84)
    ]
    plan = plan_split(make_inventory(gpus))
    assert [len(group.gpus) for group in plan.groups] == [5, 3]
    assert plan.notes == ["uneven split: 5 GPUs on the host driver, 3 GPUs on vfio-pci"]


def test_all_gpus_on_one_node_stay_on_the_host() -> None:
    plan = plan_split(make_inventory([make_gpu("01", 0), make_gpu("02", 0)]))
    assert [group.role for group in plan.groups] == ["host"]
    assert "nothing goes to vfio-pci" in plan.warnings[0]
    assert any("NUMA node 1" in warning for warning in plan.warnings)


def nps4(configs: dict[str, str] | None = None) -> Inventory:
    nodes = {n: f"{n * 16}-{n * 16 + 15}" for n in range(4)}
    gpus = [
        make_gpu(f"{bus:02x}", node, minor=i)
        for i, (node, bus) in enumerate(
            (n, 0x10 + 0x20 * n + k) for n in range(4) for k in range(2)
        )
    ]
    return make_inventory(gpus, nodes, configs=configs)


def test_nps4_default_keeps_the_lowest_node_and_sends_the_others_per_node() -> None:
    plan = plan_split(nps4())
    assert [(g.role, g.numa_node, len(g.gpus)) for g in plan.groups] == [
        ("host", 0, 2), ("vfio", 1, 2), ("vfio", 2, 2), ("vfio", 3, 2),
    ]  # fmt: skip
    assert [g.cpus for g in plan.groups] == ["0-15", "16-31", "32-47", "48-63"]


def test_nps4_host_nodes_join_one_host_group_spanning_them() -> None:
    plan = plan_split(nps4(), SplitPolicy(host_nodes=[0, 1], lxc=200))
    host = plan.groups[0]
    assert (host.numa_node, host.memory_nodes, host.cpus) == (None, [0, 1], "0-31")
    assert len(host.gpus) == 4
    assert [g.numa_node for g in plan.groups[1:]] == [2, 3]
    assert any("spans NUMA nodes 0 and 1" in warning for warning in plan.warnings)
    assert {tp.size: tp.device_sets for tp in plan.tensor_parallel}[2] == ["0,1", "2,3"]


def test_nps4_vfio_node_only_keeps_the_rest_on_the_host() -> None:
    plan = plan_split(nps4(), SplitPolicy(vfio_nodes=[3]))
    assert [(g.role, g.memory_nodes) for g in plan.groups] == [
        ("host", [0, 1, 2]),
        ("vfio", [3]),
    ]


def test_nps4_both_node_lists_must_cover_every_gpu_node() -> None:
    error = refusal(nps4(), SplitPolicy(host_nodes=[0], vfio_nodes=[1]))
    assert codes(error) == ["policy", "policy"]
    assert "NUMA node 2" in error.problems[0].what
    assert "--host-node 2 or --vfio-node 2" in error.problems[0].fix


@pytest.mark.parametrize(
    ("policy", "fragment"),
    [
        (SplitPolicy(host_nodes=[0], vfio_nodes=[0, 1, 2, 3]), "in both --host-node"),
        (SplitPolicy(vfio_nodes=[7]), "NUMA node 7 holds no GPUs"),
        (SplitPolicy(vfio_gpus=["0000:99:00.0"]), "no GPU at that address"),
        (SplitPolicy(vfio_gpus=["gpu0"]), "not a PCI address"),
        (SplitPolicy(host_gpus=["10:00.0"], vfio_gpus=["0000:10:00"]), "in both --host-gpus"),
        (SplitPolicy(host_gpus=["10:00.0"], vfio_gpus=["30:00.0"]), "in neither --host-gpus"),
        (SplitPolicy(lxc=200, vms=[(200, None)]), "named more than once"),
        (SplitPolicy(vms=[(300, None), (301, None)]), "all ask for the remaining"),
        (SplitPolicy(vms=[(300, 0)]), "asks for no GPU"),
    ],
)
def test_policy_mistakes_are_refused(policy: SplitPolicy, fragment: str) -> None:
    error = refusal(nps4(), policy)
    assert "policy" in codes(error)
    assert any(fragment in problem.what for problem in error.problems)


# --- explicit assignment -----------------------------------------------------------------------


@pytest.mark.parametrize("form", ["0000:81:00.0", "81:00.0", "0000:81:00", "81:00", "0000:81:00.1"])
def test_explicit_vfio_gpus_accept_every_address_form(form: str) -> None:
    plan = plan_split(ct200(), SplitPolicy(vfio_gpus=[form]))
    host, vfio = plan.groups
    assert vfio.gpus == ["0000:81:00.0"]
    assert vfio.functions == ["0000:81:00.0", "0000:81:00.1"]
    assert len(host.gpus) == 7
    assert host.numa_node is None and host.memory_nodes == [0, 1]


def test_explicit_addresses_override_node_rules() -> None:
    plan = plan_split(ct200(), SplitPolicy(host_nodes=[0], host_gpus=["81:00.0"]))
    host = plan.groups[0]
    assert host.gpus[-1] == "0000:81:00.0"
    assert len(plan.groups[1].gpus) == 3


def test_both_address_lists_naming_every_gpu() -> None:
    addresses = [gpu.address for gpu in ct200().gpus]
    policy = SplitPolicy(host_gpus=addresses[::2], vfio_gpus=addresses[1::2])
    plan = plan_split(ct200(), policy)
    assert plan.groups[0].gpus == addresses[::2]
    assert [group.numa_node for group in plan.groups[1:]] == [0, 1]


def test_slot_holding_two_gpus_moves_together() -> None:
    first = make_gpu("41", 0, function=0, slot_functions=(1,))
    second = make_gpu("41", 0, function=1, slot_functions=(0,))
    inventory = make_inventory([first, second, make_gpu("81", 1)])
    assert plan_split(inventory).groups[0].gpus == ["0000:41:00.0", "0000:41:00.1"]
    error = refusal(inventory, SplitPolicy(vfio_gpus=["0000:41:00.1"]))
    assert codes(error) == ["slot-split", "iommu-mixed"]
    assert "slot 0000:41:00" in error.problems[0].what


# --- IOMMU groups --------------------------------------------------------------------------------


def shared_group_host() -> Inventory:
    """Node 1 has two GPUs behind one switch without ACS: one IOMMU group (50)."""
    a, b = "0000:81:00.0", "0000:82:00.0"
    gpus = [
        make_gpu("01", 0),
        make_gpu("02", 0),
        make_gpu("81", 1, group=50, peers=(make_fn(b, 50, node=1),)),
        make_gpu("82", 1, group=50, peers=(make_fn(a, 50, node=1),)),
    ]
    return make_inventory(gpus)


def test_gpus_sharing_an_iommu_group_move_together() -> None:
    plan = plan_split(shared_group_host())
    assert plan.groups[1].gpus == ["0000:81:00.0", "0000:82:00.0"]


def test_iommu_group_with_both_roles_is_refused_naming_group_and_members() -> None:
    error = refusal(shared_group_host(), SplitPolicy(host_nodes=[0], host_gpus=["81:00.0"]))
    assert codes(error) == ["iommu-mixed"]
    what = error.problems[0].what
    assert "IOMMU group 50" in what
    assert "0000:81:00.0 (host), 0000:82:00.0 (vfio)" in what
    assert "ACS" in error.problems[0].fix


def test_vms_never_split_an_iommu_group() -> None:
    plan = plan_split(shared_group_host(), SplitPolicy(vms=[(301, 2)]))
    assert [(g.guest, g.gpus) for g in plan.groups[1:]] == [
        (GuestRef(type="vm", vmid=301), ["0000:81:00.0", "0000:82:00.0"]),
    ]
    error = refusal(shared_group_host(), SplitPolicy(vms=[(300, 1)]))
    assert codes(error) == ["no-fit"]
    assert "GPUs sharing an IOMMU group go together" in error.problems[0].what


def nic_peer(*, bridge: bool) -> PciFunction:
    return make_fn(
        "0000:80:01.0" if bridge else "0000:83:00.0",
        60,
        node=1,
        class_code="0x060400" if bridge else "0x020000",
        vendor_id="8086",
        device_id="1572",
        name="PCI bridge" if bridge else "Ethernet controller X710",
        driver="pcieport" if bridge else "i40e",
        is_bridge=bridge,
    )


def test_non_bridge_peer_in_a_vfio_group_is_refused() -> None:
    gpus = [make_gpu("01", 0), make_gpu("81", 1, group=60, peers=(nic_peer(bridge=False),))]
    error = refusal(make_inventory(gpus))
    assert codes(error) == ["iommu-peer"]
    what = error.problems[0].what
    assert "IOMMU group 60" in what and "0000:83:00.0" in what
    assert "Ethernet controller X710, driver i40e" in what
    assert "--host-gpus 0000:81:00.0" in error.problems[0].fix


def test_non_bridge_peer_of_a_host_gpu_is_fine() -> None:
    gpus = [make_gpu("01", 0, group=60, peers=(nic_peer(bridge=False),)), make_gpu("81", 1)]
    assert len(plan_split(make_inventory(gpus)).groups) == 2


def test_bridge_in_the_group_is_allowed_and_does_not_move() -> None:
    gpus = [make_gpu("01", 0), make_gpu("81", 1, group=60, peers=(nic_peer(bridge=True),))]
    vfio = plan_split(make_inventory(gpus)).groups[1]
    assert vfio.functions == ["0000:81:00.0"]


def test_iommu_off_with_a_vfio_group_is_refused_unless_planned() -> None:
    assert codes(refusal(ct200(iommu=False))) == ["iommu-off"]
    plan = plan_split(ct200(iommu=False), SplitPolicy(enable_iommu=True))
    assert plan.enable_iommu
    assert any("IOMMU is off" in warning for warning in plan.warnings)
    assert not plan_split(ct200(), SplitPolicy(enable_iommu=True)).enable_iommu


def test_iommu_off_without_vfio_is_fine() -> None:
    plan = plan_split(ct200(iommu=False), SplitPolicy(host_nodes=[0, 1]))
    assert [group.role for group in plan.groups] == ["host"]


def test_boot_vga_to_vfio_warns() -> None:
    gpus = [make_gpu("01", 0, boot_vga=True), make_gpu("81", 1, boot_vga=True)]
    plan = plan_split(make_inventory(gpus))
    boot = [warning for warning in plan.warnings if "boot VGA" in warning]
    assert len(boot) == 1 and boot[0].startswith("0000:81:00.0")


# --- several VMs ---------------------------------------------------------------------------------


def test_two_vms_share_the_vfio_node() -> None:
    plan = plan_split(ct200(), SplitPolicy(lxc=200, vms=[(300, 2), (301, 2)]))
    assert [(g.guest.vmid if g.guest else None, g.gpus, g.numa_node) for g in plan.groups[1:]] == [
        (300, ["0000:81:00.0", "0000:91:00.0"], 1),
        (301, ["0000:e1:00.0", "0000:f1:00.0"], 1),
    ]


def test_each_vm_lands_on_one_node_when_one_fits() -> None:
    plan = plan_split(nps4(), SplitPolicy(vms=[(300, 1), (301, 2), (302, 2), (303, None)]))
    vms = {g.guest.vmid: (g.numa_node, len(g.gpus)) for g in plan.groups if g.guest}
    # The two-GPU VMs each take a whole node; the one-GPU VM and the rest share the last.
    assert vms == {300: (3, 1), 301: (1, 2), 302: (2, 2), 303: (3, 1)}
    assert plan.notes == ["uneven split: 2 GPUs on the host driver, 6 GPUs on vfio-pci"]


def test_vm_larger_than_any_node_spans_nodes_with_a_warning() -> None:
    plan = plan_split(nps4(), SplitPolicy(vms=[(300, 3)]))
    vm = next(g for g in plan.groups if g.guest)
    assert (vm.numa_node, len(vm.gpus), vm.memory_nodes) == (None, 3, [1, 2])
    assert any("VM 300 spans NUMA nodes 1 and 2" in warning for warning in plan.warnings)
    assert any("go to no VM" in warning for warning in plan.warnings)


def test_vms_asking_for_too_many_gpus_are_refused() -> None:
    error = refusal(ct200(), SplitPolicy(vms=[(300, 3), (301, 2)]))
    assert codes(error) == ["no-fit"]
    assert (
        "VM 301 asks for 2 GPUs, but at most 1 of the 4 vfio GPUs are left for it"
        in error.problems[0].what
    )


def test_lxc_target_needs_a_host_group() -> None:
    error = refusal(ct200(), SplitPolicy(lxc=200, vfio_nodes=[0, 1]))
    assert codes(error) == ["no-fit"]


# --- property tests ------------------------------------------------------------------------------


def assert_invariants(inventory: Inventory, plan: Plan) -> dict[str, str]:
    """No GPU lost or duplicated, functions complete, one role per IOMMU group; -> roles."""
    placed = [address for group in plan.groups for address in group.gpus]
    assert sorted(placed) == sorted(gpu.address for gpu in inventory.gpus)
    moved = sorted(function for group in plan.groups for function in group.functions)
    assert moved == sorted(function for gpu in inventory.gpus for function in gpu.functions)
    roles: dict[str, str] = {a: group.role for group in plan.groups for a in group.gpus}
    by_iommu: dict[int | None, set[str]] = defaultdict(set)
    for gpu in inventory.gpus:
        by_iommu[gpu.iommu_group].add(roles[gpu.address])
    assert all(len(group_roles) == 1 for group_roles in by_iommu.values())
    return roles


@settings(max_examples=150, deadline=None)
@given(random_hosts())
def test_property_numa_split_is_complete_and_numa_pure(inventory: Inventory) -> None:
    plan = plan_split(inventory, SplitPolicy(lxc=200))
    assert_invariants(inventory, plan)
    node_of = {gpu.address: gpu.numa_node for gpu in inventory.gpus}
    for group in plan.groups:
        assert {node_of[address] for address in group.gpus} == {group.numa_node}
    assert [group.role for group in plan.groups].count(Role.HOST) == 1


@settings(max_examples=150, deadline=None)
@given(random_hosts(), st.data())
def test_property_explicit_assignment_is_honoured_or_refused(
    inventory: Inventory, data: st.DataObject
) -> None:
    addresses = [gpu.address for gpu in inventory.gpus]
    chosen = data.draw(st.lists(st.sampled_from(addresses), min_size=1, unique=True))
    wanted = {a: "vfio" if a in chosen else "host" for a in addresses}
    split_groups = {
        gpu.iommu_group
        for gpu in inventory.gpus
        for other in inventory.gpus
        if gpu.iommu_group == other.iommu_group and wanted[gpu.address] != wanted[other.address]
    }
    try:
        plan = plan_split(inventory, SplitPolicy(vfio_gpus=chosen))
    except PlanRefusedError as error:
        assert split_groups
        assert set(codes(error)) == {"iommu-mixed"}
        return
    assert not split_groups
    assert assert_invariants(inventory, plan) == wanted


@settings(max_examples=150, deadline=None)
@given(random_hosts(), st.lists(st.integers(1, 3), max_size=4))
def test_property_vms_get_exactly_what_they_ask(inventory: Inventory, counts: list[int]) -> None:
    vms = [(300 + i, count) for i, count in enumerate(counts)]
    try:
        plan = plan_split(inventory, SplitPolicy(vms=vms, host_nodes=[0]))
    except PlanRefusedError as error:
        assert set(codes(error)) <= {"no-fit", "policy"}
        return
    assert_invariants(inventory, plan)
    got = {g.guest.vmid: len(g.gpus) for g in plan.groups if g.guest is not None}
    assert got == dict(vms)
