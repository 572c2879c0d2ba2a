"""The Proxmox API through the stand-in pvesh on PATH, for a LocalHost rooted at a tree copy.

Proxmox VE cannot be installed here: the stand-in ``pvesh`` of ``tests/support/standins.py``
answers ``set .../qemu/<vmid>/config`` the way qemu-server does (digest checked, file rewritten).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxgpu.errors import PveApiError
from proxgpu.host.local import LocalHost
from proxgpu.pve.api import config_digest, proxmox_api
from tests.support.standins import fake_pvesh, on_path, pvesh_calls
from tests.support.trees import VM, copy_example, text


def test_a_config_written_through_the_stand_in_pvesh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = copy_example(tmp_path, dest="host")
    bin_dir = tmp_path / "bin"
    fake_pvesh(bin_dir, root)
    on_path(monkeypatch, bin_dir)
    host = LocalHost(str(root))
    before = text(root, VM)
    assert before is not None
    config = proxmox_api(host).nodes("pve1").qemu(300).config
    with pytest.raises(PveApiError, match="digest: detected modified configuration"):
        config.put(numa="1", digest=config_digest(before + "x"))
    assert text(root, VM) == before, "a stale digest writes nothing"
    config.put(numa="1", delete="vmgenid", digest=config_digest(before))
    after = text(root, VM)
    assert after is not None and "numa: 1\n" in after and "vmgenid" not in after
    assert [call[:2] for call in pvesh_calls(bin_dir)] == [
        ["set", "/nodes/pve1/qemu/300/config"]
    ] * 2
