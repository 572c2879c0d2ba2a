"""examples/ansible/split.yml itself, and the module shipped in the package, run by a real
ansible-playbook on this machine against copies of the example hosts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from proxgpu.ansible import LIBRARY
from tests.support.ansible import ansible_playbook
from tests.support.trees import EXAMPLES, REPO, copy_example

PLAYBOOK = EXAMPLES.parent / "ansible" / "split.yml"


def play(tmp_path: Path, *args: str, library: Path | None = None) -> str:
    """Run split.yml on localhost; its whole output (stdout and stderr)."""
    completed = ansible_playbook(
        PLAYBOOK,
        tmp_path,
        *args,
        library=library,
        # Not the playbook's directory: the module must come from library/ beside the playbook
        # or from ANSIBLE_LIBRARY, not from the working directory.
        cwd=tmp_path,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    return output


def recap(output: str) -> dict[str, int]:
    """The PLAY RECAP counters of the one host."""
    line = output[output.index("PLAY RECAP") :].splitlines()[1]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


def test_example_playbook_takes_guests_from_variables_and_warns_of_nothing_deprecated(
    tmp_path: Path,
) -> None:
    root = copy_example(tmp_path)
    guests = ["-e", f"proxgpu_root={root}", "-e", "proxgpu_lxc=200"]
    guests += ["-e", '{"proxgpu_vms": ["300:2"]}']
    checked = play(tmp_path, *guests, "--check", "--diff")
    assert "DEPRECATION" not in checked, checked
    assert recap(checked)["changed"] == 1
    assert "hostpci" not in (root / "etc/pve/qemu-server/300.conf").read_text()

    applied = play(tmp_path, *guests)
    assert "DEPRECATION" not in applied, applied
    # VM 300 asked for two GPUs through the variable, not the playbook's default "the rest".
    vm = (root / "etc/pve/qemu-server/300.conf").read_text()
    assert re.findall(r"^hostpci\d+:", vm, re.MULTILINE) == ["hostpci0:", "hostpci1:"]
    # A tree is not the machine the play runs on: the reboot task is skipped, not run.
    assert recap(applied) == {**recap(applied), "changed": 1, "skipped": 1, "failed": 0}
    again = play(tmp_path, *guests)
    assert recap(again)["changed"] == 0 and recap(again)["skipped"] == 1


def test_packaged_module_is_found_through_ansible_library(tmp_path: Path) -> None:
    """The module as `pip install proxgpu` ships it, found through ANSIBLE_LIBRARY (the
    playbook's own library/ link is bypassed by copying the playbook elsewhere)."""
    playbook = tmp_path / "split.yml"
    playbook.write_text(PLAYBOOK.read_text())
    root = copy_example(tmp_path)
    library = subprocess.run(
        [sys.executable, "-m", "proxgpu.ansible"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout.strip()
    assert Path(library) == LIBRARY
    completed = ansible_playbook(playbook, tmp_path, "-e", f"proxgpu_root={root}", library=library)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "hostpci0:" in (root / "etc/pve/qemu-server/300.conf").read_text()
