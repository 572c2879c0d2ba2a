"""The Ansible module in examples/ansible, run by a real ansible-playbook on this machine."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.ansible import ansible_playbook
from tests.support.trees import REPO, copy_example, tree_bytes


def run_playbook(tmp_path: Path, root: Path, *flags: str) -> dict[str, object]:
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
    library = REPO / "examples/ansible/library"
    completed = ansible_playbook(playbook, tmp_path, *flags, library=library)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    result: dict[str, object] = json.loads((tmp_path / "result.json").read_text())
    return result


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
    applied = run_playbook(tmp_path, root)
    # A tree is not the machine the playbook runs on: no reboot is asked for it.
    assert applied["changed"] is True and applied["reboot_required"] is False
    assert "hostpci0: 0000:81:00,pcie=1" in (root / "etc/pve/qemu-server/300.conf").read_text()
    again = run_playbook(tmp_path, root)
    assert again["changed"] is False
