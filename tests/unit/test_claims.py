"""GPUs already claimed by other guests (proxgpu.pve.claims), and how the planner treats them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxgpu.planning import Plan, plan_split
from proxgpu.planning.model import Role, SplitPolicy, VgpuUse
from proxgpu.pve.claims import device_claims, nvidia_cap_users
from tests.support.factories import ct200
from tests.support.plans import codes, refusal

LXC_201 = "/etc/pve/lxc/201.conf"
VM_300 = "/etc/pve/qemu-server/300.conf"


@pytest.mark.parametrize(
    "line",
    [
        "dev0: /dev/nvidia4,gid=44",
        "dev1: path=/dev/nvidia4,mode=0666",
        "lxc.mount.entry: /dev/nvidia4 dev/nvidia4 none bind,optional,create=file",
        "lxc.mount.entry = /dev/nvidia4 dev/nvidia4 none bind,optional,create=file",
        "lxc.cgroup2.devices.allow: c 195:4 rwm",
        "lxc.cgroup2.devices.allow: c 195:* rwm",
    ],
)
def test_container_holding_a_vfio_gpu_conflicts(line: str) -> None:
    inventory = ct200({LXC_201: f"arch: amd64\n{line}\n"})
    error = refusal(inventory, SplitPolicy(lxc=200))
    assert codes(error) == ["claimed"], "one problem for the container, listing its GPUs"
    held = (
        "0000:81:00.0, 0000:91:00.0, 0000:e1:00.0 and 0000:f1:00.0 go"
        if "*" in line
        else ("0000:81:00.0 goes")
    )
    assert error.problems[0].what.startswith(f"{held} to vfio-pci but CT 201 uses")
    assert LXC_201 in error.problems[0].what


def test_wildcard_of_the_target_container_is_no_conflict() -> None:
    configs = {"/etc/pve/lxc/200.conf": "lxc.cgroup2.devices.allow: c 195:* rwm\n"}
    assert plan_split(ct200(configs), SplitPolicy(lxc=200)).warnings == []


def test_other_container_sharing_a_host_gpu_is_reported_not_refused() -> None:
    plan = plan_split(ct200({LXC_201: "dev0: /dev/nvidia0\n"}), SplitPolicy(lxc=200))
    assert plan.warnings == [
        "0000:01:00.0 is also used by CT 201 ('dev0: /dev/nvidia0' in /etc/pve/lxc/201.conf); "
        "CT 200 will share it"
    ]


def test_the_sharing_warning_names_the_containers_of_the_gpus_group() -> None:
    inventory = ct200({"/etc/pve/lxc/202.conf": "dev0: /dev/nvidia2\n"})
    plan = plan_split(inventory, SplitPolicy(lxc_subsets=[(200, 2), (201, 2)]))
    (group,) = [g for g in plan.groups if "0000:61:00.0" in g.gpus]
    assert [guest.vmid for guest in group.guests] == [201], "the GPU is CT 201's alone"
    assert plan.warnings == [
        "0000:61:00.0 is also used by CT 202 ('dev0: /dev/nvidia2' in /etc/pve/lxc/202.conf); "
        "CT 201 will share it"
    ]


NODE_1_KEPT = SplitPolicy(lxc=200, host_nodes=[1], vfio_nodes=[0])


@pytest.mark.parametrize(
    ("line", "outcome"),
    [
        ("dev0: /dev/nvidia5", "CT 201 would not start after the reboot"),
        (
            "lxc.mount.entry: /dev/nvidia5 dev/nvidia5 none bind,optional,create=file",
            "CT 201 would lose the GPU after the reboot",
        ),
    ],
)
def test_a_container_naming_a_kept_gpu_by_a_minor_the_split_changes_is_refused(
    line: str, outcome: str
) -> None:
    # Node 1's GPUs are /dev/nvidia4-7 today; kept alone, the next boot numbers them 0-3.
    error = refusal(ct200({LXC_201: f"{line}\n"}), NODE_1_KEPT)
    assert codes(error) == ["claimed"]
    (problem,) = error.problems
    assert problem.what == (
        f"CT 201 names GPUs kept on nvidia by the numbers they have today ('{line}' in "
        "/etc/pve/lxc/201.conf), but the split numbers them anew at the next boot: 0000:91:00.0 "
        f"becomes /dev/nvidia1, and /dev/nvidia5 will not exist; {outcome}"
    )
    assert problem.fix == (
        "name CT 201 too (--lxc 201: proxgpu rewrites its GPU entries with the new numbers), or "
        "remove those entries and give it /dev/nvidia1 after the reboot"
    )


def test_a_minor_that_will_name_another_kept_gpu_is_refused_as_the_wrong_gpu() -> None:
    # Kept: /dev/nvidia1 and /dev/nvidia3 today, numbered 0 and 1 at the next boot, so CT 201's
    # /dev/nvidia1 would then be the other GPU.
    policy = SplitPolicy(lxc=200, host_gpus=["0000:11:00.0", "0000:71:00.0"])
    error = refusal(ct200({LXC_201: "dev0: /dev/nvidia1\n"}), policy)
    assert codes(error) == ["claimed"]
    assert (
        "0000:11:00.0 becomes /dev/nvidia0, and /dev/nvidia1 will be 0000:71:00.0, another GPU; "
        "CT 201 would get the wrong GPU after the reboot"
    ) in error.problems[0].what


def test_with_driverctl_the_kept_gpus_keep_their_minors_so_the_container_only_shares() -> None:
    inventory = ct200({LXC_201: "dev0: /dev/nvidia5\n"})
    plan = plan_split(inventory, NODE_1_KEPT.model_copy(update={"bind_method": "driverctl"}))
    assert plan.warnings == [
        "0000:91:00.0 is also used by CT 201 ('dev0: /dev/nvidia5' in /etc/pve/lxc/201.conf); "
        "CT 200 will share it"
    ]


def test_naming_the_container_lets_proxgpu_renumber_its_entries() -> None:
    inventory = ct200({LXC_201: "dev0: /dev/nvidia5\n"})
    policy = SplitPolicy(lxc=200, shared_lxc=[201], host_nodes=[1], vfio_nodes=[0])
    assert plan_split(inventory, policy).warnings == []


def test_claims_in_snapshot_and_pending_sections_do_not_count() -> None:
    text = "cores: 4\n\n[pve:pending]\ndev0: /dev/nvidia4\n[snap1]\ndev0: /dev/nvidia5\n"
    assert plan_split(ct200({LXC_201: text}), SplitPolicy(lxc=200)).warnings == []


def test_nvidiactl_and_other_minors_claim_no_gpu() -> None:
    text = "lxc.cgroup2.devices.allow: c 195:255 rwm\nlxc.cgroup2.devices.allow: c 511:* rwm\n"
    text += "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file\n"
    # nvidiactl is c 195:255 and nvidia-uvm has a major of its own: neither is a GPU. A claim on
    # a GPU kept on the host would be a warning (CT 201 shares it), on a vfio GPU a refusal.
    assert plan_split(ct200({LXC_201: text}), SplitPolicy(lxc=200)).warnings == []
    # A GPU's own minor in the same container is reported: the check above can fail.
    shared = plan_split(ct200({LXC_201: f"{text}dev0: /dev/nvidia0\n"}), SplitPolicy(lxc=200))
    assert [w.split(" is also used by ")[0] for w in shared.warnings] == ["0000:01:00.0"]


@pytest.mark.parametrize(
    "value",
    ["01:00,pcie=1", "host=0000:01:00.0", "0000:81:00.0;0000:01:00", "01:00.1,x-vga=1"],
)
def test_vm_passing_a_host_gpu_through_conflicts(value: str) -> None:
    error = refusal(ct200({VM_300: f"bios: ovmf\nhostpci0: {value}\n"}), SplitPolicy(lxc=200))
    assert codes(error) == ["claimed"]
    assert error.problems[0].what.startswith("0000:01:00.0 stays on the host driver but VM 300")


def pci_cfg(node: str) -> str:
    return (
        "gpu-node0\n"
        f"\tmap id=10de:2330,iommugroup=1,node={node},path=0000:11:00.0,subsystem-id=10de:16c1\n"
    )


def test_vm_mapping_to_a_host_gpu_conflicts() -> None:
    configs = {
        "/etc/pve/mapping/pci.cfg": pci_cfg("pve1"),
        VM_300: "hostpci0: mapping=gpu-node0,pcie=1\n",
    }
    error = refusal(ct200(configs), SplitPolicy(lxc=200))
    assert codes(error) == ["claimed"]
    assert "0000:11:00.0" in error.problems[0].what
    assert "via PCI mapping gpu-node0" in error.problems[0].what


def test_mapping_entries_of_another_node_are_ignored() -> None:
    configs = {
        "/etc/pve/mapping/pci.cfg": pci_cfg("pve2"),
        VM_300: "hostpci0: mapping=gpu-node0\n",
    }
    inventory = ct200(configs)
    assert device_claims(configs, inventory.node_name) == [], "pve2's GPU is not this host's"
    assert plan_split(inventory, SplitPolicy(lxc=200)).warnings == []
    # On pve2 the same map entry does pass its GPU through: the checks above can fail.
    assert [(c.guest.vmid, c.pci_address, c.mapping) for c in device_claims(configs, "pve2")] == [
        (300, "0000:11:00.0", "gpu-node0")
    ]


def test_vm_holding_a_gpu_given_to_another_vm_conflicts() -> None:
    error = refusal(ct200({VM_300: "hostpci0: 81:00\n"}), SplitPolicy(vms=[(301, None)]))
    assert codes(error) == ["claimed"]
    assert "goes to VM 301 but VM 300 already passes it through" in error.problems[0].what


def test_target_vm_and_binding_only_plans_accept_existing_passthrough() -> None:
    configs = {VM_300: "hostpci0: 81:00\n"}
    assert plan_split(ct200(configs), SplitPolicy(vms=[(300, None)])).warnings == []
    plan = plan_split(ct200(configs), SplitPolicy())
    assert plan.warnings == [
        "0000:81:00.0 is already passed through to VM 300 ('hostpci0: 81:00' in "
        "/etc/pve/qemu-server/300.conf); binding it to vfio-pci keeps that working"
    ]


def test_device_claims_reads_only_guest_configs_of_this_host() -> None:
    configs = {
        "/etc/pve/nodes/pve2/lxc/205.conf": "dev0: /dev/nvidia1\n",
        "/etc/pve/storage.cfg": "dev0: /dev/nvidia1\n",
        "/etc/pve/qemu-server/302.conf": "# hostpci0: 81:00\nnet0: virtio=AA:BB,bridge=vmbr0\n",
        "/etc/pve/qemu-server/303.conf": "hostpci2: host=81:00;91:00.0,mapping=none\n",
    }
    found = [(c.guest.vmid, c.pci_address) for c in device_claims(configs, "pve1")]
    assert found == [(303, "81:00"), (303, "91:00.0")]


def test_capability_nodes_name_the_containers_that_use_them() -> None:
    """A container runs on a MIG instance through its capability nodes, given as devN entries
    or raw mount entries; pending and snapshot sections, VMs and other nodes' guests do not."""
    configs = {
        LXC_201: "dev4: path=/dev/nvidia-caps/nvidia-cap22,mode=0444\n"
        "lxc.mount.entry: /dev/nvidia-caps/nvidia-cap21 dev/nvidia-caps/nvidia-cap21 none "
        "bind,optional,create=file\n[pending]\ndev5: /dev/nvidia-caps/nvidia-cap30\n",
        "/etc/pve/lxc/202.conf": "dev0: /dev/nvidia-caps/nvidia-cap22\ndev1: /dev/nvidia0\n",
        "/etc/pve/nodes/pve2/lxc/205.conf": "dev0: /dev/nvidia-caps/nvidia-cap84\n",
        VM_300: "dev0: /dev/nvidia-caps/nvidia-cap85\n",
    }
    users = nvidia_cap_users(configs)
    assert {minor: [g.vmid for g in guests] for minor, guests in users.items()} == {
        22: [201, 202],
        21: [201],
    }


# --- vGPUs: hostpciN with mdev= uses the GPU through its host driver ----------------------------

VM_310 = "/etc/pve/qemu-server/310.conf"
VGPU = "hostpci0: 0000:01:00.0,mdev=nvidia-1072,pcie=1"


def test_a_vgpu_entry_is_a_claim_that_keeps_the_host_driver() -> None:
    configs = {VM_310: f"{VGPU}\n", VM_300: "hostpci0: 01:00,pcie=1\n"}
    claims = device_claims(configs, "pve1")
    assert [(c.guest.vmid, c.mdev, c.keeps_host_driver) for c in claims] == [
        (300, None, False),
        (310, "nvidia-1072", True),
    ]


def test_a_vgpu_on_a_kept_gpu_is_no_passthrough_to_remove() -> None:
    plan = plan_split(ct200({VM_310: f"{VGPU}\n"}), SplitPolicy(lxc=200))
    (warning,) = [w for w in plan.notes if "VM 310" in w]
    assert warning.startswith("0000:01:00.0 stays on the host driver, where VM 310 uses a vGPU")
    assert "remove" not in warning


def test_a_vgpu_gpu_of_the_kept_node_is_not_given_to_the_container() -> None:
    plan = plan_split(ct200({VM_310: f"{VGPU}\n"}), SplitPolicy(lxc=200))
    host = next(g for g in plan.groups if g.role is Role.HOST)
    vgpu = next(g for g in plan.groups if g.role is Role.VGPU)
    assert "0000:01:00.0" not in host.gpus and len(host.gpus) == 3
    assert (vgpu.gpus, vgpu.driver, vgpu.guest) == (["0000:01:00.0"], "nvidia", None)
    assert vgpu.vgpus == [VgpuUse(vmid=310, mdev_type="nvidia-1072")]


@pytest.mark.parametrize(
    "policy",
    [
        SplitPolicy(lxc=200),
        SplitPolicy(lxc=200, vms=[(310, None)]),
        SplitPolicy(lxc=200, vfio_nodes=[1]),
        SplitPolicy(lxc=200, host_gpus=["01:00.0"]),
    ],
)
def test_a_vgpu_gpu_of_a_node_going_to_vfio_stays_on_the_host_driver(policy: SplitPolicy) -> None:
    config = VGPU.replace("01:00.0", "81:00.0")
    plan = plan_split(ct200({VM_310: f"{config}\n"}), policy)
    moved = [a for g in plan.groups if g.role.moves_to_vfio for a in g.gpus]
    (vgpu,) = [g for g in plan.groups if g.role is Role.VGPU]
    assert "0000:81:00.0" not in moved and moved, "the rest of the node still goes to vfio-pci"
    assert (vgpu.gpus, vgpu.numa_node, vgpu.driver) == (["0000:81:00.0"], 1, "nvidia")
    assert vgpu.vgpus == [VgpuUse(vmid=310, mdev_type="nvidia-1072")]
    assert "0000:81:00.0" in binding_kept(plan)


def binding_kept(plan: Plan) -> list[str]:
    """The functions the plan keeps on their host driver."""
    return [f for g in plan.groups if not g.role.moves_to_vfio for f in g.functions]


def test_two_vms_with_vgpus_of_one_gpu_are_both_listed() -> None:
    other = "/etc/pve/qemu-server/311.conf"
    config = VGPU.replace("01:00.0", "81:00.0")
    inventory = ct200({VM_310: f"{config}\n", other: f"{config.replace('hostpci0', 'hostpci3')}\n"})
    (vgpu,) = [g for g in plan_split(inventory).groups if g.role is Role.VGPU]
    assert [u.vmid for u in vgpu.vgpus] == [310, 311]


def test_a_gpu_named_for_vfio_is_refused_with_a_fix_that_keeps_the_vgpu() -> None:
    config = VGPU.replace("01:00.0", "81:00.0")
    policy = SplitPolicy(lxc=200, vfio_gpus=["81:00.0", "91:00.0"])
    error = refusal(ct200({VM_310: f"{config}\n"}), policy)
    assert codes(error) == ["claimed"]
    problem = error.problems[0]
    assert problem.what.startswith("0000:81:00.0 would go to vfio-pci, but VM 310 uses a vGPU")
    assert problem.fix.startswith("leave 0000:81:00.0 out of --vfio-gpus")
    fixed = policy.model_copy(update={"vfio_gpus": ["91:00.0"]})
    (vgpu,) = [
        g for g in plan_split(ct200({VM_310: f"{config}\n"}), fixed).groups if g.role is Role.VGPU
    ]
    assert vgpu.gpus == ["0000:81:00.0"]


# --- driver=keep: a passthrough whose binding qemu-server leaves to the host --------------------

KEEP = "hostpci0: 0000:81:00.0,driver=keep,pcie=1"


def test_a_driver_keep_entry_is_a_passthrough_claim_that_keeps_its_binding() -> None:
    claims = device_claims({VM_310: f"{KEEP}\n"}, "pve1")
    assert [(c.pci_address, c.keep_driver, c.keeps_host_driver) for c in claims] == [
        ("0000:81:00.0", True, False)
    ]


def test_driver_keep_on_a_gpu_going_to_vfio_waits_for_the_binding() -> None:
    plan = plan_split(ct200({VM_310: f"{KEEP}\n"}), SplitPolicy(lxc=200))
    (warning,) = [w for w in plan.warnings if "through with driver=keep" in w]
    assert warning.startswith("VM 310 passes 0000:81:00.0 through with driver=keep")
    assert "it is on nvidia today" in warning


def test_driver_keep_on_a_gpu_already_on_vfio_says_nothing_more() -> None:
    inventory = ct200({VM_310: f"{KEEP}\n"})
    gpus = [
        replace(g, driver="vfio-pci") if g.address == "0000:81:00.0" else g for g in inventory.gpus
    ]
    plan = plan_split(replace(inventory, gpus=gpus), SplitPolicy(lxc=200))
    assert not [w for w in plan.warnings if "through with driver=keep" in w]


def test_a_target_vms_driver_keep_entry_waits_for_the_binding_too() -> None:
    policy = SplitPolicy(lxc=200, vms=[(310, None)])
    plan = plan_split(ct200({VM_310: f"{KEEP}\n"}), policy)
    assert [w for w in plan.warnings if w.startswith("VM 310 passes 0000:81:00.0 through")]


def test_driver_keep_on_a_kept_gpu_is_refused_as_a_vm_that_cannot_start() -> None:
    config = KEEP.replace("81:00.0", "01:00.0")
    error = refusal(ct200({VM_310: f"{config}\n"}), SplitPolicy(lxc=200))
    assert codes(error) == ["claimed"]
    assert "VM 310 could not start while it stays there" in error.problems[0].what


def test_a_vgpu_through_a_pci_mapping_with_mdev_keeps_the_mapped_gpu_on_the_host_driver() -> None:
    mapping = "gpu-vgpu\n\tmap id=10de:2330,node=pve1,path=0000:81:00.0\n\tmdev 1\n"
    configs = {
        "/etc/pve/mapping/pci.cfg": mapping,
        VM_310: "hostpci0: mapping=gpu-vgpu,mdev=nvidia-1072\n",
    }
    plan = plan_split(ct200(configs), SplitPolicy(lxc=200))
    (vgpu,) = [g for g in plan.groups if g.role is Role.VGPU]
    assert vgpu.gpus == ["0000:81:00.0"]
    assert vgpu.vgpus == [VgpuUse(vmid=310, mdev_type="nvidia-1072")]
