"""The proxgpu.pve collection's controller code on directory trees, without Ansible running it:
when gpu_split asks for a reboot, and the examples in its docstrings."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from types import ModuleType

import pytest
from ansible_collections.proxgpu.pve.plugins.plugin_utils import host, tasks

from proxgpu.apply import ApplyOptions, rollback
from proxgpu.host import DirectoryHost
from proxgpu.pipeline import reboot_awaited, split_host
from proxgpu.planning import SplitPolicy
from tests.support.trees import REPO, copy_example

POLICY = SplitPolicy(lxc=200, vms=[(300, None)])


def test_a_reboot_is_awaited_until_the_host_boots_after_the_apply(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    tree = DirectoryHost(str(root))
    applied = split_host(tree, POLICY, how=ApplyOptions())
    assert applied.changed and reboot_awaited(tree, applied)
    # A later run changes nothing, but the drivers are still the old ones on the same boot.
    again = split_host(tree, POLICY)
    assert not again.changed and reboot_awaited(tree, again)
    # A tree is never the machine that reboots.
    assert not tasks.reboot_required(tree, again)
    # The apply as if made in an earlier boot: whatever the drivers are now, another reboot
    # would not change them.
    entry = root / "var/lib/proxgpu/journal" / f"{applied.applied.journal_id}.json"
    record = json.loads(entry.read_text())
    entry.write_text(json.dumps({**record, "boot_id": "5f0c6a3e-0000-4000-8000-000000000001"}))
    assert not reboot_awaited(tree, split_host(tree, POLICY))


def test_a_rolled_back_apply_awaits_no_reboot(tmp_path: Path) -> None:
    tree = DirectoryHost(str(copy_example(tmp_path)))
    split_host(tree, POLICY, how=ApplyOptions())
    unchanged = split_host(tree, POLICY)
    assert not unchanged.changed and reboot_awaited(tree, unchanged)
    rollback(tree, options=ApplyOptions(run_actions=False))
    # The boot files are the running kernel's again: nothing to reboot for.
    assert not reboot_awaited(tree, unchanged)


@pytest.mark.parametrize("module", [host, tasks], ids=lambda m: m.__name__.rpartition(".")[2])
def test_docstring_examples(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # they name the example hosts from the checkout
    failed, attempted = doctest.testmod(module)
    assert attempted > 0 and failed == 0
