"""GPUs already claimed by other guests (proxgpu.pve.claims), and how the planner treats them."""

from __future__ import annotations

import pytest

from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy
from proxgpu.pve.claims import device_claims
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
