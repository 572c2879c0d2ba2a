"""The proxgpu.pve collection run by a real ansible-playbook over real SSH: an inventory of four
hosts on two loopback sshd servers (one reached through the other as a jump host, one through
``become``), each with its own example tree, run with several forks. proxgpu runs on this
controller only; the hosts get shell commands. A split's whole life goes through Ansible:
reviewed (check and diff), applied, left alone, verified, drifted by hand, its rollback
reviewed, rolled back, and left alone again."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.host import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.pipeline import split_host
from proxgpu.planning import SplitPolicy
from tests.support.collection import adhoc_results, ansible, inventory, recap, ssh_config
from tests.support.sshd import Sshd, free_port, running_sshd
from tests.support.trees import EXAMPLES, copy_example, snapshot

pytestmark = pytest.mark.sshd

PLAYBOOK = EXAMPLES.parent / "ansible" / "collection.yml"

#: Every module of the collection on every host, a tag per step; each host's registered
#: results are kept on the controller as RESULTS/HOST.json (a task skipped by its tag: null).
LIFECYCLE = """
- hosts: all
  gather_facts: false
  tasks:
    - proxgpu.pve.gpu_split:
        root: "{{ proxgpu_root }}"
        lxc: "{{ proxgpu_lxc | default(omit) }}"
        vms: "{{ proxgpu_vms | default(omit) }}"
        vfio_gpus: "{{ proxgpu_vfio_gpus | default(omit) }}"
        enable_iommu: "{{ proxgpu_enable_iommu | default(omit) }}"
      register: split
      tags: split
    - proxgpu.pve.gpu_verify:
        root: "{{ proxgpu_root }}"
      register: verified
      ignore_errors: true
      tags: verify
    - proxgpu.pve.gpu_rollback:
        root: "{{ proxgpu_root }}"
        force: "{{ proxgpu_force | default(false) }}"
      register: undone
      ignore_errors: true
      tags: rollback
    - proxgpu.pve.gpu_rollback:
        root: "{{ proxgpu_root }}"
      register: undone_again
      ignore_errors: true
      tags: rollback
    - ansible.builtin.copy:
        content: "{{ {'split': split | default(None), 'verified': verified | default(None),
                      'undone': undone | default(None),
                      'undone_again': undone_again | default(None)} | to_json }}"
        dest: "{{ results }}/{{ inventory_hostname }}.json"
        mode: "0600"
      delegate_to: localhost
      check_mode: false
      changed_when: false
      tags: always
"""


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

    def lifecycle(self, *args: str) -> tuple[str, dict[str, dict[str, Any]]]:
        """Run :data:`LIFECYCLE` with ``args`` (tags, check, diff): its output, and each host's
        registered results."""
        playbook, results = self.scratch / "lifecycle.yml", self.scratch / "results"
        playbook.write_text(LIFECYCLE)
        results.mkdir(exist_ok=True)
        for old in results.glob("*.json"):
            old.unlink()
        output = self.run("--forks", "4", "-e", f"results={results}", *args, str(playbook))
        return output, {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}

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
        split_host(DirectoryHost(str(reference)), member.policy, how=ApplyOptions())
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
    # The failure is the error document --json prints, not only a message.
    failed = re.search(r"^fatal: \[pve1\]: FAILED! => ", output, re.MULTILINE)
    assert failed is not None, output
    error = json.JSONDecoder().raw_decode(output, failed.end())[0]["error"]
    # The planner names the host as it was given (Ansible's inventory name), not by its hostname.
    assert (error["code"], error["kind"], error["host"]) == (9, "PlanRefusedError", "pve1")
    assert error["fix"] and "path" in error


def without_host(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan document without its change set's host name (Ansible's name, or a tree's path)."""
    return {**plan, "changes": {k: v for k, v in plan["changes"].items() if k != "host"}}


def test_a_split_is_reviewed_applied_verified_and_rolled_back_through_ansible(
    fleet: Fleet, tmp_path: Path
) -> None:
    before = {name: snapshot(root) for name, root in fleet.roots.items()}
    output, results = fleet.lifecycle("--tags", "split", "--check", "--diff")
    assert {name: c["changed"] for name, c in recap(output).items()} == dict.fromkeys(FLEET, 1)
    assert {name: snapshot(root) for name, root in fleet.roots.items()} == before, "check mode"
    for name, member in FLEET.items():
        # The plan document is plan --json's for the same tree (tests/local/test_undo.py shows
        # the library's is the command line's).
        expected = split_host(DirectoryHost(str(fleet.roots[name])), member.policy)
        assert without_host(results[name]["split"]["plan"]) == without_host(
            expected.plan_document()
        ), name

    output, results = fleet.lifecycle("--tags", "split")
    assert {name: c["changed"] for name, c in recap(output).items()} == dict.fromkeys(FLEET, 1)
    applied = {name: results[name]["split"]["journal_id"] for name in FLEET}
    assert all(applied.values()), applied

    # Applied, left alone: nothing changes, no drift; the trees' drivers are still the old
    # ones on the same boot, which plan --json and verify both call a pending reboot.
    output, results = fleet.lifecycle("--tags", "split,verify")
    assert {name: (c["changed"], c["failed"]) for name, c in recap(output).items()} == (
        dict.fromkeys(FLEET, (0, 0))
    ), output
    assert results["pve1"]["split"]["plan"]["reboot_pending"]
    for name in FLEET:
        assert results[name]["verified"]["verify"]["drifted"] is False, name

    # A hand edit of a file proxgpu owns on pve1: drift there and nowhere else; its rollback
    # would lose the edit, so it is refused, in check mode too, naming the file.
    owned = fleet.roots["pve1"] / "etc/modprobe.d/00-proxgpu-vfio.conf"
    owned.write_text(owned.read_text() + "options vfio-pci disable_idle_d3=1\n")
    edited = {name: snapshot(root) for name, root in fleet.roots.items()}
    output, results = fleet.lifecycle("--tags", "verify,rollback", "--check", "--diff")
    assert {name: snapshot(root) for name, root in fleet.roots.items()} == edited, "check mode"
    drifted = results["pve1"]["verified"]
    assert drifted["failed"] is True and drifted["error"]["kind"] == "DriftError"
    assert drifted["error"]["code"] == 17 and drifted["error"]["host"] == "pve1"
    assert any("00-proxgpu-vfio.conf" in line for line in drifted["verify"]["drift"])
    refused = results["pve1"]["undone"]
    assert refused["failed"] is True and refused["error"]["kind"] == "FileChangedError"
    assert refused["error"]["path"] == "/etc/modprobe.d/00-proxgpu-vfio.conf", refused
    predicted = {}
    for name in ("pve2", "pve3", "pve4"):
        assert results[name]["verified"]["verify"]["drifted"] is False, name
        undone = results[name]["undone"]
        assert undone["changed"] is True and undone["journal_id"] == applied[name], name
        assert undone["restored"], name
        predicted[name] = (undone["restored"], undone["actions"], undone["diff"])
    # Diff mode shows what each rollback would put back, e.g. the IOMMU flag pve2's apply
    # turned on.
    assert re.search(r"^-.*intel_iommu=on", output, re.MULTILINE), output

    # Forced on pve1 (its own variable), every host goes back to how it was; a second rollback
    # in the same play finds nothing left to undo.
    output, results = fleet.lifecycle("--tags", "rollback", "-e", '{"proxgpu_force": true}')
    counts = recap(output)
    assert {name: (c["changed"], c["failed"]) for name, c in counts.items()} == (
        dict.fromkeys(FLEET, (1, 0))
    ), output
    assert {name: snapshot(root) for name, root in fleet.roots.items()} == before
    for name in FLEET:
        assert results[name]["undone"]["journal_id"] == applied[name]
        assert results[name]["undone_again"]["changed"] is False, name
    # What check mode said each rollback would restore, and run again, is what it did.
    for name, (restored, actions, diff) in predicted.items():
        done = results[name]["undone"]
        assert (done["restored"], done["actions"]) == (restored, actions), name
        assert diff and not done["diff"], "the diff is shown in diff mode only"


def test_an_apply_another_controller_signed_is_acted_on_only_with_trust_unsigned(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A CI runner with a fresh home has a key of its own: verify and rollback refuse the
    entry another controller signed, and take it with trust_unsigned, warning that they did."""
    fleet.lifecycle("--tags", "split", "--limit", "pve1")
    applied = snapshot(fleet.roots["pve1"])
    fresh = str(tmp_path / "fresh-runner")

    def run(module: str, trust: bool) -> tuple[dict[str, Any], str]:
        args = ["pve1", "-i", str(fleet.inventory), "-m", f"proxgpu.pve.{module}"]
        options = f"root={{{{ proxgpu_root }}}} trust_unsigned={trust}"
        completed = ansible("ansible", fleet.scratch, *args, "-a", options, XDG_CONFIG_HOME=fresh)
        return adhoc_results(completed.stdout)["pve1"], completed.stdout + completed.stderr

    for module in ("gpu_verify", "gpu_rollback"):
        refused, _ = run(module, trust=False)
        assert refused["error"]["kind"] == "JournalError", refused
        assert snapshot(fleet.roots["pve1"]) == applied
    verified, said = run("gpu_verify", trust=True)
    assert verified["verify"]["drifted"] is False, verified
    assert "trust_unsigned: the journal entry's signature" in said
    undone, said = run("gpu_rollback", trust=True)
    assert undone["changed"] is True, undone
    assert "trust_unsigned: the journal entry's signature" in said


def test_gpu_verify_looks_at_the_guests_and_warns_of_those_it_could_not(fleet: Fleet) -> None:
    """After the reboot (a new boot id in the tree), gpu_verify looks at CT 200 too: what it
    holds is unknown in this tree (its storage is in no storage.cfg), which is a warning with
    the command that would tell, never a pass; ``guests: false`` looks at none. (A tree runs no
    guests, so nothing is looked at from inside: tests/sshd/test_verify_guests.py does that.)"""
    fleet.lifecycle("--tags", "split", "--limit", "pve1")
    boot_id = fleet.roots["pve1"] / "proc/sys/kernel/random/boot_id"
    boot_id.parent.mkdir(parents=True, exist_ok=True)
    boot_id.write_text("6b3a9c1e-0000-4000-8000-000000000001\n")

    def run(guests: bool) -> tuple[dict[str, Any], str]:
        args = ["pve1", "-i", str(fleet.inventory), "-m", "proxgpu.pve.gpu_verify"]
        options = f"root={{{{ proxgpu_root }}}} guests={guests}"
        completed = ansible("ansible", fleet.scratch, *args, "-a", options)
        return adhoc_results(completed.stdout)["pve1"], completed.stdout + completed.stderr

    verified, said = run(guests=True)
    [check] = verified["verify"]["guests"]
    assert (check["guest"], check["verdict"]) == ("CT 200", "unchecked"), check
    assert "what CT 200 holds now is unknown (storage 'local-zfs' is not in" in check["line"]
    assert "[WARNING]: pve1: " + check["line"] in " ".join(said.split()), said
    # The tree's drivers did not change at its "reboot": drift, whatever the guests say.
    assert verified["error"]["code"] == 17
    alone, said = run(guests=False)
    assert alone["verify"]["guests"] == [] and "holds now is unknown" not in said
