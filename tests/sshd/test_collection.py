"""The proxgpu.pve collection run by a real ansible-playbook over real SSH: an inventory of four
hosts on two loopback sshd servers (one reached through the other as a jump host, one through
``become``), each with its own example tree, run with several forks. proxgpu runs on this
controller only; the hosts get shell commands."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxgpu.host import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.pipeline import split_host
from proxgpu.planning import SplitPolicy
from tests.support.collection import adhoc_results, ansible, inventory, recap, ssh_config
from tests.support.sshd import Sshd, free_port, running_sshd
from tests.support.trees import EXAMPLES, copy_example, snapshot

pytestmark = pytest.mark.sshd

PLAYBOOK = EXAMPLES.parent / "ansible" / "collection.yml"


@dataclass(frozen=True)
class Member:
    """A host of the inventory: its example tree, its variables and the same split in Python."""

    example: str
    variables: dict[str, Any]
    policy: SplitPolicy


FLEET = {
    "pve1": Member(
        "ct200",
        {"proxgpu_lxc": 200, "proxgpu_vms": ["300"]},
        SplitPolicy(lxc=200, vms=[(300, None)]),
    ),
    "pve2": Member(
        "uneven-5-3",
        {"proxgpu_lxc": 150, "proxgpu_enable_iommu": True},
        SplitPolicy(lxc=150, enable_iommu=True),
    ),
    # Reached through pve1 (ProxyJump), on the other server.
    "pve3": Member(
        "single-socket",
        {"proxgpu_lxc": 101, "proxgpu_vfio_gpus": ["0000:0b:00.0"]},
        SplitPolicy(lxc=101, vfio_gpus=["0000:0b:00.0"]),
    ),
    # Its commands go through `su` (become).
    "pve4": Member(
        "shared-iommu-group",
        {"ansible_become": True, "ansible_become_method": "su"},
        SplitPolicy(),
    ),
}


@dataclass(frozen=True)
class Fleet:
    """The inventory of :data:`FLEET`, each host's tree, and the directory Ansible works in."""

    inventory: Path
    roots: dict[str, Path]
    scratch: Path

    def run(self, *args: str) -> str:
        """ansible-playbook's output, after checking it succeeded."""
        completed = self.tool("ansible-playbook", "-i", str(self.inventory), *args)
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output
        return output

    def tool(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        # become to the same user (root to root here) is skipped unless allowed.
        return ansible(tool, self.scratch, *args, ANSIBLE_BECOME_ALLOW_SAME_USER="1")


@pytest.fixture
def fleet(sshd: Sshd, tmp_path: Path) -> Iterator[Fleet]:
    """Four hosts on two sshd servers, each with a private copy of its example tree."""
    (tmp_path / "sshd").mkdir()
    with running_sshd(tmp_path / "sshd") as other:
        servers = {"pve1": (sshd, None), "pve2": (sshd, None), "pve3": (other, "pve1")}
        servers["pve4"] = (sshd, None)
        config = ssh_config(tmp_path / "ssh_config", servers)
        roots = {name: copy_example(tmp_path, m.example, dest=name) for name, m in FLEET.items()}
        hosts = {
            name: {**member.variables, "proxgpu_root": str(roots[name])}
            for name, member in FLEET.items()
        }
        yield Fleet(inventory(tmp_path / "inventory.yml", config, hosts), roots, tmp_path)


def test_a_play_reviews_applies_and_then_leaves_every_host_alone(
    fleet: Fleet, tmp_path: Path
) -> None:
    before = {name: snapshot(root) for name, root in fleet.roots.items()}
    checked = fleet.run("--forks", "4", "--check", "--diff", str(PLAYBOOK))
    assert "DEPRECATION" not in checked, checked
    assert {name: counts["changed"] for name, counts in recap(checked).items()} == dict.fromkeys(
        FLEET, 1
    ), checked
    assert {name: snapshot(root) for name, root in fleet.roots.items()} == before, "check mode"
    # Diff mode shows each file change, e.g. the GPUs VM 300 gets on pve1.
    assert "+++ after: /etc/pve/qemu-server/300.conf" in checked
    assert "+hostpci0: 0000:81:00" in checked

    applied = fleet.run("--forks", "4", str(PLAYBOOK))
    counts = recap(applied)
    assert {name: (c["changed"], c["failed"], c["skipped"]) for name, c in counts.items()} == (
        dict.fromkeys(FLEET, (1, 0, 1))
    ), "changed, and no reboot asked for a tree"
    for name, member in FLEET.items():
        # The same split applied here, by proxgpu itself, to another copy of the tree.
        reference = copy_example(tmp_path / "reference", member.example, dest=name)
        split_host(DirectoryHost(str(reference)), member.policy, check=False)
        assert snapshot(fleet.roots[name]) == snapshot(reference), name

    again = fleet.run("--forks", "4", str(PLAYBOOK))
    assert {name: c["changed"] for name, c in recap(again).items()} == dict.fromkeys(FLEET, 0)


def test_gpu_facts_are_each_hosts_inventory(fleet: Fleet, tmp_path: Path) -> None:
    args = ["all", "-i", str(fleet.inventory), "-m", "proxgpu.pve.gpu_facts"]
    completed = fleet.tool("ansible", *args, "--forks", "4", "-a", "root={{ proxgpu_root }}")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    results = adhoc_results(completed.stdout)
    assert set(results) == set(FLEET)
    for name, member in FLEET.items():
        result = results[name]
        assert result["changed"] is False
        facts = result["ansible_facts"]["proxgpu"]
        expected = inspect(DirectoryHost(str(EXAMPLES / member.example)))
        assert facts["hostname"] == expected.hostname
        assert [g["address"] for g in facts["gpus"]] == [g.address for g in expected.gpus]
        assert [g["numa_node"] for g in facts["gpus"]] == [g.numa_node for g in expected.gpus]


def test_become_runs_every_command_as_the_become_user(fleet: Fleet, tmp_path: Path) -> None:
    """pve4 becomes root through su; becoming nobody instead, the same read of this machine's
    own / (no root option: read only) says it is not root."""
    args = ["pve4", "-i", str(fleet.inventory), "-m", "proxgpu.pve.gpu_facts"]
    nobody = ["-e", "ansible_become_user=nobody", "-e", "ansible_become_flags='-s /bin/sh'"]
    facts = {}
    for who, extra in (("root", []), ("nobody", nobody)):
        completed = fleet.tool("ansible", *args, *extra)
        assert completed.returncode == 0, completed.stdout + completed.stderr
        facts[who] = adhoc_results(completed.stdout)["pve4"]["ansible_facts"]["proxgpu"]
    assert facts["root"]["is_root"] is True
    assert facts["nobody"]["is_root"] is False


def test_a_refused_plan_fails_its_host_and_a_host_that_is_down_is_unreachable(
    sshd: Sshd, tmp_path: Path
) -> None:
    config = ssh_config(tmp_path / "ssh_config", {"pve1": (sshd, None)})
    with config.open("a") as handle:  # nothing listens there
        handle.write(f"Host down\n  HostName 127.0.0.1\n  Port {free_port()}\n")
    root = copy_example(tmp_path, "single-socket")
    hosts = {name: {"proxgpu_root": str(root)} for name in ("pve1", "down")}
    path = inventory(tmp_path / "inventory.yml", config, hosts)
    completed = ansible("ansible-playbook", tmp_path, "-i", str(path), str(PLAYBOOK))
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0
    counts = recap(output)
    assert counts["down"]["unreachable"] == 1, output
    # single-socket's firmware gives its GPUs no NUMA node: the plan is refused, with the reason.
    assert counts["pve1"]["failed"] == 1, output
    assert "PlanRefusedError" in output and "NUMA" in output, output
