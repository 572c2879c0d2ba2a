"""The Ansible module in examples/ansible, run by a real ansible-playbook on this machine."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.support.ansible import ansible_playbook
from tests.support.trees import REPO, copy_example, tree_bytes


def run_playbook(tmp_path: Path, root: Path, *flags: str) -> dict[str, Any]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - proxgpu_split:\n"
        f"        root: {root}\n        lxc: 200\n        vms: ['300']\n"
        "      register: split\n"
        "    - ansible.builtin.copy:\n"
        "        content: '{{ split | to_json }}'\n"
        f"        dest: {tmp_path}/result.json\n"
        "      check_mode: false\n"
    )
    completed = ansible_playbook(playbook, tmp_path, *flags, library=LIBRARY)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    result: dict[str, Any] = json.loads((tmp_path / "result.json").read_text())
    return result


LIBRARY = REPO / "examples/ansible/library"


def test_ansible_module_check_diff_apply_and_idempotence(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    before = tree_bytes(root)
    checked = run_playbook(tmp_path, root, "--check", "--diff")
    assert checked["changed"] is True
    assert tree_bytes(root) == before, "check mode writes nothing"
    diff = checked["diff"]
    assert isinstance(diff, list) and any(
        d["after_header"] == "/etc/pve/qemu-server/300.conf" for d in diff
    )
    # The plan document is plan --json's: with its changes and the reboot it waits for.
    assert checked["plan"]["changes"]["changed"] is True
    assert checked["plan"]["changes"]["diff"] == diff and checked["plan"]["reboot_pending"] == []
    applied = run_playbook(tmp_path, root)
    # A tree is not the machine the playbook runs on: no reboot is asked for it.
    assert applied["changed"] is True and applied["reboot_required"] is False
    assert "hostpci0: 0000:81:00,pcie=1" in (root / "etc/pve/qemu-server/300.conf").read_text()
    again = run_playbook(tmp_path, root)
    assert again["changed"] is False
    # Applied on a tree whose drivers never change: the reboot is pending, as plan --json says.
    assert again["plan"]["changes"]["changed"] is False and again["plan"]["reboot_pending"]


def test_ansible_module_fails_with_the_error_document(tmp_path: Path) -> None:
    """single-socket's firmware gives its GPUs no NUMA node: the plan is refused."""
    root = copy_example(tmp_path, "single-socket")
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        f"    - proxgpu_split:\n        root: {root}\n        lxc: 101\n"
    )
    completed = ansible_playbook(playbook, tmp_path, library=LIBRARY)
    output = completed.stdout + completed.stderr
    failed = re.search(r"^fatal: \[localhost\]: FAILED! => ", output, re.MULTILINE)
    assert completed.returncode != 0 and failed is not None, output
    result = json.JSONDecoder().raw_decode(output, failed.end())[0]
    error = result["error"]
    # The host is named as it was given: here the tree the task's root names.
    assert (error["code"], error["kind"], error["host"]) == (9, "PlanRefusedError", f"dir:{root}")
    assert error["message"] == result["msg"] and "NUMA" in error["message"] and error["fix"]
