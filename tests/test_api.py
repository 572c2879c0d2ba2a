"""The Python API for scripts, and the Ansible module run by a real ansible-playbook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import proxgpu
from proxgpu.pipeline import split_host
from proxgpu.planning.model import SplitPolicy
from tests.conftest import REPO, copy_example, require_tool

POLICY = SplitPolicy(lxc=200, vms=[(300, None)])


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def test_check_reports_changes_and_writes_nothing(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    before = tree_bytes(root)
    with proxgpu.connect(root=str(root)) as host:
        result = split_host(host, POLICY, check=True)
    assert result.changed and result.applied.dry_run
    assert {d["after_header"] for d in result.diff} >= {
        "/etc/pve/lxc/200.conf",
        "/etc/modprobe.d/proxgpu-vfio.conf",
    }
    assert ["update-initramfs", "-u", "-k", "all"] in result.actions
    assert tree_bytes(root) == before


def test_apply_then_again_changes_nothing(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    with proxgpu.connect(root=str(root)) as host:
        first = split_host(host, POLICY, check=False)
        second = split_host(host, POLICY, check=False)
    assert first.changed and first.applied.journal_id
    assert "dev0: /dev/nvidia0" in (root / "etc/pve/lxc/200.conf").read_text()
    assert not second.changed and second.diff == []


def run_playbook(tmp_path: Path, root: Path, *flags: str) -> dict[str, object]:
    ansible = require_tool("ansible-playbook", "ansible-core (pip install ansible-core)")
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
    env = {
        **os.environ,
        "ANSIBLE_LIBRARY": str(REPO / "examples/ansible/library"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "PYTHONPATH": str(REPO),
    }
    completed = subprocess.run(
        [
            ansible,
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(playbook),
            *flags,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
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
    assert applied["changed"] is True and applied["reboot_required"] is True
    assert "hostpci0: 0000:81:00,pcie=1" in (root / "etc/pve/qemu-server/300.conf").read_text()
    again = run_playbook(tmp_path, root)
    assert again["changed"] is False
