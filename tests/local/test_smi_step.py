"""The smi step: on a live host proxgpu runs nvidia-smi for the MIG devices' UUIDs, only when
/proc shows compute instances; a snapshot keeps its outputs and a tree is read from them.

The step's script (``scripts/smi.sh``) runs for real through the local runner. No NVIDIA GPU is
here, so a stand-in ``nvidia-smi``, first in PATH, prints what NVIDIA's MIG user guide shows for
``-L`` and a plain ``nvidia-smi`` (:func:`tests.support.standins.mig_nvidia_smi`); it is no
capture of a real host.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.host import DirectoryHost, LocalHost
from proxgpu.inspection import inspect
from proxgpu.inspection.smi import mig_uuids, read_smi
from proxgpu.paths import NVIDIA_SMI_LIST, NVIDIA_SMI_TABLE
from tests.support.standins import (
    MIG_CI,
    MIG_GPU0,
    MIG_LISTING,
    MIG_TABLE,
    fake_tool,
    mig_nvidia_smi,
    on_path,
)
from tests.support.trees import EXAMPLES


def test_on_a_live_host_both_outputs_are_read_as_nvidia_smi_printed_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mig_nvidia_smi(tmp_path)
    on_path(monkeypatch, tmp_path)
    outputs, notes = read_smi(LocalHost())
    assert outputs == {NVIDIA_SMI_LIST: MIG_LISTING.encode(), NVIDIA_SMI_TABLE: MIG_TABLE.encode()}
    assert notes == []
    assert mig_uuids(MIG_LISTING, MIG_TABLE, "localhost")[MIG_GPU0, 1, 2] == MIG_CI[2]


@pytest.mark.parametrize(
    ("body", "note"),
    [
        ("exit 9", "nvidia-smi -L: it exited 9, so the MIG devices' UUIDs are unknown"),
        (None, "nvidia-smi -L: no nvidia-smi on the host, so the MIG devices' UUIDs are unknown"),
    ],
    ids=["failing", "missing"],
)
def test_an_output_nvidia_smi_cannot_give_is_left_out_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str | None, note: str
) -> None:
    if body:
        fake_tool(tmp_path, "nvidia-smi", body + "\n")
    # Where the tools are, and no nvidia-smi there.
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    outputs, notes = read_smi(LocalHost())
    assert outputs == {}
    assert notes[0] == note


def test_a_snapshot_keeps_the_outputs_and_its_tree_gives_the_same_uuids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "snap"
    assert main(["snapshot", "--root", str(EXAMPLES / "mig"), "-o", str(out)]) == 0
    capsys.readouterr()
    for path in (NVIDIA_SMI_LIST, NVIDIA_SMI_TABLE):
        kept = (out / path.lstrip("/")).read_bytes()
        assert kept == (EXAMPLES / "mig" / path.lstrip("/")).read_bytes()
    original = inspect(DirectoryHost(str(EXAMPLES / "mig"))).gpu("0000:18:00.0")
    again = inspect(DirectoryHost(str(out))).gpu("0000:18:00.0")
    assert [i.uuid for i in again.mig_instances] == [i.uuid for i in original.mig_instances]
    assert all(i.uuid and i.uuid.startswith("MIG-") for i in again.mig_instances)


def test_a_tree_is_read_from_its_kept_outputs_never_by_running_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    fake_tool(tmp_path, "nvidia-smi", f"touch {marker}\n")
    on_path(monkeypatch, tmp_path)
    gpu = inspect(DirectoryHost(str(EXAMPLES / "mig"))).gpu("0000:18:00.0")
    assert gpu.mig_instances[0].uuid == "MIG-00000000-5a1e-5c2b-9f3d-02000000c7a2"
    assert not marker.exists()


def test_the_gpu_is_found_by_its_uuid_whatever_index_nvidia_smi_gives_it(tmp_path: Path) -> None:
    """The kept -L lists 18:00.0 second: its MIG devices are still its own."""
    tree = tmp_path / "mig"
    shutil.copytree(EXAMPLES / "mig", tree, symlinks=True)
    listing = (tree / NVIDIA_SMI_LIST.lstrip("/")).read_text().splitlines()
    first, devices, rest = listing[0], listing[1:5], listing[5:]
    swapped = [rest[0].replace("GPU 1:", "GPU 0:"), first.replace("GPU 0:", "GPU 1:"), *devices]
    (tree / NVIDIA_SMI_LIST.lstrip("/")).write_text("\n".join([*swapped, *rest[1:]]) + "\n")
    table = tree / NVIDIA_SMI_TABLE.lstrip("/")
    table.write_text(table.read_text().replace("|  0    ", "|  1    "))
    moved = inspect(DirectoryHost(str(tree))).gpu("0000:18:00.0")
    kept = inspect(DirectoryHost(str(EXAMPLES / "mig"))).gpu("0000:18:00.0")
    uuids = [i.uuid for i in moved.mig_instances]
    assert uuids == [i.uuid for i in kept.mig_instances]
    assert all(uuid and uuid.startswith("MIG-") for uuid in uuids)
