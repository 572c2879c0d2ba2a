"""A PCI mapping file that Proxmox itself could not read is refused, naming the line, instead of
being edited into a file that looks whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxgpu.errors import RenderError
from proxgpu.host import DirectoryHost
from proxgpu.pipeline import propose
from proxgpu.planning import SplitPolicy
from proxgpu.rendering import RenderOptions
from tests.support.trees import copy_example

POLICY = SplitPolicy(lxc=200, vms=[(300, None)], mapping="gpus")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("gpus\n\tmap node=pve9,path=0000:c1:00.0\nnot a property\n", 3),
        ("# GPUs\n9gpus\n\tmap node=pve9,path=0000:c1:00.0\n", 2),
    ],
)
def test_a_damaged_mapping_file_is_refused_naming_the_line(
    tmp_path: Path, text: str, line: int
) -> None:
    root = copy_example(tmp_path)
    mapping = root / "etc/pve/mapping/pci.cfg"
    mapping.parent.mkdir(parents=True, exist_ok=True)
    mapping.write_text(text)
    with (
        DirectoryHost(str(root)) as host,
        pytest.raises(RenderError, match=f"pci.cfg: line {line} ") as refused,
    ):
        propose(host, POLICY, RenderOptions(mapping="gpus"))
    assert "plan again" in str(refused.value)


def test_a_readable_mapping_file_of_another_node_is_kept(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    mapping = root / "etc/pve/mapping/pci.cfg"
    mapping.parent.mkdir(parents=True, exist_ok=True)
    other = "gpus\n\tmap id=10de:2bb1,node=pve9,path=0000:c1:00.0\n"
    mapping.write_text(other)
    with DirectoryHost(str(root)) as host:
        changes = propose(host, POLICY, RenderOptions(mapping="gpus")).changes
    after = next(f.after for f in changes.files if f.path == "/etc/pve/mapping/pci.cfg")
    assert after is not None and "node=pve9,path=0000:c1:00.0" in after
