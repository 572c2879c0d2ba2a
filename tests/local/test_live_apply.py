"""``apply --live``: the files, then the rebind, verified and rolled back; a busy GPU refused
before writing, and a failed rebind restoring the files.

The kernel cannot be driven here: the stand-ins of ``tests/support/kernel.py`` take its place (a
file held open for a device node, :class:`FakeKernel` for the PCI core's probe). ``nvidia-smi``
and ``pvesh`` are not installable either; stand-ins on PATH (``gpu_tools``) print only what the
real tools print.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions
from proxgpu.apply.journal import history
from proxgpu.apply.rebind import vfio_functions
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.apply.verify import verify
from proxgpu.errors import ApplyError, DeviceBusyError
from proxgpu.host.local import DirectoryHost, LocalHost
from tests.support.kernel import GPU, KERNEL, NODE1, FakeKernel, driver, held_open
from tests.support.trees import changeset, ct200_plan, snapshot


def test_live_apply_rebinds_verifies_and_rolls_back(
    root: Path, gpu_tools: Path, kernel: FakeKernel
) -> None:
    host = LocalHost(str(root))
    plan = ct200_plan(root)
    original = snapshot(root, KERNEL)
    result = apply_changes(host, changeset(root), options=ApplyOptions(live=True), plan=plan)
    assert [b.address for b in result.live] == vfio_functions(plan) == list(NODE1)
    assert {driver(root, a) for a in NODE1} == {"vfio-pci"}
    [entry] = history(host)
    assert entry.live == result.live
    assert not verify(host, entry).drifted, "files and drivers match the plan now"
    rollback(host, options=ApplyOptions(live=True))
    assert {a: driver(root, a) for a in NODE1} == NODE1
    assert snapshot(root, KERNEL) == original


def test_live_apply_refuses_a_busy_gpu_before_writing(
    root: Path, gpu_tools: Path, kernel: FakeKernel
) -> None:
    host = LocalHost(str(root))
    original = snapshot(root, KERNEL)
    with held_open(root / "dev/nvidia4"), pytest.raises(DeviceBusyError, match=GPU):
        apply_changes(host, changeset(root), options=ApplyOptions(live=True), plan=ct200_plan(root))
    assert snapshot(root, KERNEL) == original and history(host) == []
    assert kernel.probed == []


def test_live_apply_refuses_a_gpu_with_a_mediated_device_made_since_the_plan(
    root: Path, gpu_tools: Path, kernel: FakeKernel
) -> None:
    """The plan was made when GPU had no vGPU; one made since (its mdev core's link in its
    type's devices/) holds the GPU's driver: the live rebind must not unbind it."""
    host = LocalHost(str(root))
    plan = ct200_plan(root)
    uuid = "0b8a5c3e-9d41-4f6e-8a27-3c5d9e1f7a20"
    made = root / "sys/bus/pci/devices" / GPU / "mdev_supported_types/nvidia-1155/devices"
    made.mkdir(parents=True)
    (made / uuid).symlink_to(f"../../../{uuid}")
    original = snapshot(root, KERNEL)
    with pytest.raises(DeviceBusyError) as err:
        apply_changes(host, changeset(root), options=ApplyOptions(live=True), plan=plan)
    assert f"mediated device {uuid} (nvidia-1155) exists" in str(err.value)
    assert snapshot(root, KERNEL) == original and history(host) == []
    assert kernel.probed == []


def test_a_gpu_opened_while_the_post_actions_ran_stops_the_live_rebind(
    root: Path, gpu_tools: Path, kernel: FakeKernel
) -> None:
    # Preflight finds the GPUs idle; by the time the post-actions are done (minutes for an
    # initramfs rebuild) a process has opened one: unbinding it now would block the kernel.
    host = LocalHost(str(root))
    original = snapshot(root, KERNEL)
    with contextlib.ExitStack() as stack:

        def open_a_gpu(step: str, message: str) -> None:
            if step == "action":
                stack.enter_context(held_open(root / "dev/nvidia4"))

        with pytest.raises(ApplyError, match="every file was restored") as err:
            apply_changes(
                host,
                changeset(root, actions=[["true"]]),
                options=ApplyOptions(live=True),
                plan=ct200_plan(root),
                progress=open_a_gpu,
            )
    assert isinstance(err.value.__cause__, DeviceBusyError)
    assert f"{GPU} (nvidia): {root}/dev/nvidia4 is held by pid {os.getpid()}" in str(err.value)
    assert kernel.probed == [], "nothing was unbound"
    assert {a: driver(root, a) for a in NODE1} == NODE1
    assert snapshot(root, KERNEL) == original
    [entry] = history(host)
    assert entry.status == "failed" and entry.live == []


def test_a_failed_live_rebind_restores_the_files(
    root: Path, gpu_tools: Path, kernel: FakeKernel
) -> None:
    host = LocalHost(str(root))
    original = snapshot(root, KERNEL)
    kernel.inert = True
    with pytest.raises(ApplyError, match="every file was restored") as err:
        apply_changes(host, changeset(root), options=ApplyOptions(live=True), plan=ct200_plan(root))
    assert "bound to nvidia after the rebind" in str(err.value)
    assert snapshot(root, KERNEL) == original


def test_live_steps_on_a_directory_tree_are_listed(root: Path) -> None:
    result = apply_changes(
        DirectoryHost(str(root)),
        changeset(root),
        options=ApplyOptions(live=True),
        plan=ct200_plan(root),
    )
    assert result.live == []
    assert result.messages[-1].startswith("listed, not run (a directory tree): rebind 0000:81:00.0")
