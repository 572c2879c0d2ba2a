"""The proxgpu.pve collection as users get it: ``ansible-doc`` renders each module, and
``ansible-galaxy collection build`` makes a tarball that, once installed, runs over Ansible's
local connection."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.proxgpu.pve.plugins.plugin_utils.tasks import MODULES

from tests.support.collection import COLLECTION, adhoc_results, ansible
from tests.support.trees import copy_example


@pytest.mark.parametrize("module", sorted(MODULES))
def test_ansible_doc_renders_each_module_as_people_read_it(module: str, tmp_path: Path) -> None:
    # Its options equal the argument spec: tests/local/test_ansible_docs.py.
    text = ansible("ansible-doc", tmp_path, f"proxgpu.pve.{module}")
    assert text.returncode == 0 and "OPTIONS" in text.stdout and "root" in text.stdout


def test_the_built_collection_installs_and_runs_over_the_local_connection(
    tmp_path: Path,
) -> None:
    built = ansible(
        "ansible-galaxy", tmp_path, "collection", "build", str(COLLECTION),
        "--output-path", str(tmp_path / "dist"),
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (tarball,) = (tmp_path / "dist").glob("proxgpu-pve-*.tar.gz")
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
    assert "plugins/action/gpu_split.py" in names and "plugins/modules/gpu_split.py" in names
    assert not [n for n in names if "__pycache__" in n]

    installed = tmp_path / "collections"
    # Found only where it is installed, not in the checkout (which would make it "installed").
    install = ["collection", "install", str(tarball), "-p", str(installed)]
    done = ansible("ansible-galaxy", tmp_path, *install, collections=installed)
    assert done.returncode == 0, done.stdout + done.stderr
    root = copy_example(tmp_path)

    def run(module: str, *args: str) -> dict[str, Any]:
        argv = ["localhost", "-c", "local", "-m", f"proxgpu.pve.{module}", *args]
        completed = ansible("ansible", tmp_path, *argv, collections=installed)
        assert completed.returncode == 0, completed.stdout + completed.stderr
        return adhoc_results(completed.stdout)["localhost"]

    facts = run("gpu_facts", "-a", f"root={root}")["ansible_facts"]["proxgpu"]
    assert facts["hostname"] == "ct200" and len(facts["gpus"]) == 8
    split = run("gpu_split", "-a", json.dumps({"root": str(root), "lxc": 200, "vms": ["300"]}))
    assert split["changed"] is True and split["reboot_required"] is False
    assert "hostpci0:" in (root / "etc/pve/qemu-server/300.conf").read_text()


def test_the_modules_that_share_a_fragment_document_it_alike(tmp_path: Path) -> None:
    docs = {}
    for module in ("gpu_facts", "gpu_rollback", "gpu_verify"):
        completed = ansible("ansible-doc", tmp_path, "--json", f"proxgpu.pve.{module}")
        assert completed.returncode == 0, completed.stderr
        docs[module] = json.loads(completed.stdout)[f"proxgpu.pve.{module}"]["doc"]
    assert len({json.dumps(doc["options"]["root"]) for doc in docs.values()}) == 1
    for doc in docs.values():
        assert doc["attributes"]["action"]["support"] == "full"
        assert any("through the task's connection" in note for note in doc["notes"])
    for module in ("gpu_facts", "gpu_verify"):  # they change nothing
        assert docs[module]["attributes"]["diff_mode"]["support"] == "none"
    assert docs["gpu_rollback"]["attributes"]["diff_mode"]["support"] == "full"
