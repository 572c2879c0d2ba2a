"""Runtime rebind and the busy check, against a copy of an example host tree.

The kernel cannot be driven here, so two stand-ins take its place, each said where it is used:
a file under the tree's ``dev/`` that the test holds open stands in for a GPU's device node (fuser
treats both alike), and :class:`FakeKernel` answers writes to ``drivers_probe`` the way the PCI
core does. ``nvidia-smi`` and ``pvesh`` are not installable either; stand-ins on PATH print only
what the real tools print.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxgpu.apply.busy import check_not_busy, find_busy
from proxgpu.apply.journal import history
from proxgpu.apply.rebind import Binding, bind_to_vfio, restore_drivers, vfio_functions
from proxgpu.apply.rollback import rollback
from proxgpu.apply.transaction import apply_changes
from proxgpu.apply.verify import verify
from proxgpu.errors import ApplyError, DeviceBusyError, LiveRebindError
from proxgpu.host.local import DirectoryHost, LocalHost
from tests.support.standins import fake_pvesh, fake_tool, on_path
from tests.test_transaction import changeset, ct200_plan, snapshot

# The kernel's side of things, which the tests drive on purpose.
KERNEL = ("sys", "dev")

GPU = "0000:81:00.0"  # an nvidia GPU of ct200's node 1, Device Minor 4
AUDIO = "0000:81:00.1"  # its HDMI audio function
BRIDGE = "0000:80:01.1"  # the root port above it
NODE1 = {
    f"0000:{bus}:00.{fn}": "nvidia" if fn == 0 else "snd_hda_intel"
    for bus in ("81", "91", "e1", "f1")
    for fn in (0, 1)
}


def devices(root: Path) -> Path:
    return root / "sys/bus/pci/devices"


def driver(root: Path, address: str) -> str | None:
    link = devices(root) / address / "driver"
    return os.readlink(link).rsplit("/", 1)[-1] if link.is_symlink() else None


class FakeKernel:
    """Stands in for the kernel's PCI core in a host tree.

    ``sys/bus/pci/drivers_probe`` becomes a FIFO; for each address written there, the function is
    bound to the driver its ``driver_override`` names or, with the override cleared, to its
    original driver, as the kernel's probe does. ``inert`` makes it bind nothing.
    """

    def __init__(self, root: Path, originals: dict[str, str]) -> None:
        self.root = root
        self.originals = originals
        self.inert = False
        self.probed: list[str] = []
        self.fifo = root / "sys/bus/pci/drivers_probe"
        for name in {*originals.values(), "vfio-pci"}:
            (root / "sys/bus/pci/drivers" / name).mkdir(parents=True, exist_ok=True)
            (root / "sys/bus/pci/drivers" / name / "unbind").touch()
        for address, name in originals.items():
            self.bind(address, name)
        os.mkfifo(self.fifo)
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def bind(self, address: str, name: str) -> None:
        link = devices(self.root) / address / "driver"
        link.unlink(missing_ok=True)
        link.symlink_to(f"../../drivers/{name}")  # resolves inside the tree, unlike a capture's

    def _serve(self) -> None:
        while not self.stopped:
            with open(self.fifo) as fifo:
                for line in fifo:
                    self._probe(line.strip())

    def _probe(self, address: str) -> None:
        if not address:
            return
        self.probed.append(address)
        override = (devices(self.root) / address / "driver_override").read_text().strip()
        if not self.inert:
            self.bind(address, override or self.originals[address])

    def stop(self) -> None:
        self.stopped = True
        with contextlib.suppress(OSError):  # ENXIO: the thread is not waiting to read
            os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
        self.thread.join(2)


def fake_nvidia_smi(directory: Path, persistence: dict[str, str]) -> None:
    """A stand-in for nvidia-smi: it prints only what ``--query-gpu=pci.bus_id,persistence_mode
    --format=csv,noheader`` prints, the bus id with its 8-digit upper-case domain."""
    rows = "".join(f"00000000:{a[5:].upper()}, {mode}\\n" for a, mode in persistence.items())
    fake_tool(directory, "nvidia-smi", f"printf '{rows}'\n")


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "bin"
    fake_pvesh(directory)
    fake_nvidia_smi(directory, {a: "Disabled" for a, d in NODE1.items() if d == "nvidia"})
    on_path(monkeypatch, directory)
    return directory


@pytest.fixture
def kernel(root: Path) -> Iterator[FakeKernel]:
    fake = FakeKernel(root, NODE1)
    yield fake
    fake.stop()


@contextlib.contextmanager
def held_open(path: Path) -> Iterator[None]:
    """Hold ``path`` open, as a CUDA process holds /dev/nvidiaN."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    with open(path):
        yield


# --- busy check ------------------------------------------------------------------------------


def test_a_process_holding_the_device_node_makes_the_gpu_busy(root: Path, bin_dir: Path) -> None:
    host = LocalHost(str(root))
    # Stands in for /dev/nvidia4, the node of Device Minor 4 from procfs; real nodes need a GPU.
    with held_open(root / "dev/nvidia4"), pytest.raises(DeviceBusyError) as err:
        check_not_busy(host, [GPU, AUDIO])
    message = str(err.value)
    assert f"{GPU} (nvidia): {root}/dev/nvidia4 is held by pid {os.getpid()}" in message
    assert "stop the processes" in message and err.value.addresses == [GPU]
    check_not_busy(host, [GPU, AUDIO])
    assert host.commands_run == 2, "one command per check"


def test_persistence_mode_on_makes_the_gpu_busy(root: Path, bin_dir: Path) -> None:
    fake_nvidia_smi(bin_dir, {GPU: "Enabled", "0000:91:00.0": "Disabled"})
    busy = find_busy(LocalHost(str(root)), [GPU, "0000:91:00.0"])
    assert [(b.address, b.reasons) for b in busy] == [
        (GPU, ["persistence mode is on (nvidia-persistenced keeps it open)"])
    ]


def test_persistence_mode_that_cannot_be_read_counts_as_busy(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    on_path(monkeypatch, empty)  # no nvidia-smi anywhere on PATH
    [busy] = find_busy(LocalHost(str(root)), [GPU])
    assert "persistence mode cannot be read" in busy.reasons[0]
    fake_nvidia_smi(empty, {"0000:91:00.0": "Disabled"})
    [busy] = find_busy(LocalHost(str(root)), [GPU])
    assert busy.reasons == ["persistence mode is not reported, so it counts as in use"]


def test_other_gpus_are_checked_through_their_dri_nodes(root: Path) -> None:
    (devices(root) / GPU / "driver").unlink()
    (devices(root) / GPU / "driver").symlink_to("../../drivers/amdgpu")
    host = LocalHost(str(root))
    assert find_busy(host, [GPU]) == [], "no nvidia GPU: nvidia-smi is not asked"
    # Stands in for the render node udev links under /dev/dri/by-path.
    with held_open(root / f"dev/dri/by-path/pci-{GPU}-render"):
        [busy] = find_busy(host, [GPU])
    assert busy.driver == "amdgpu" and "-render is held by pid" in busy.reasons[0]


def test_a_vfio_function_is_busy_while_its_group_is_open(root: Path) -> None:
    (devices(root) / GPU / "driver").unlink()
    (devices(root) / GPU / "driver").symlink_to("../../drivers/vfio-pci")
    # Stands in for /dev/vfio/60, which a running VM holds open.
    with held_open(root / "dev/vfio/60"):
        [busy] = find_busy(LocalHost(str(root)), [GPU])
    assert f"{root}/dev/vfio/60 is held" in busy.reasons[0]


# --- rebind ------------------------------------------------------------------------------------


def test_rebind_moves_each_function_to_vfio_and_restore_returns_it(
    root: Path, kernel: FakeKernel
) -> None:
    host = LocalHost(str(root))
    bindings = bind_to_vfio(host, [GPU, AUDIO])
    assert bindings == [
        Binding(address=GPU, driver_before="nvidia", driver_after="vfio-pci"),
        Binding(address=AUDIO, driver_before="snd_hda_intel", driver_after="vfio-pci"),
    ]
    assert (devices(root) / GPU / "driver_override").read_text() == "vfio-pci\n"
    assert kernel.probed == [GPU, AUDIO]
    restored = restore_drivers(host, bindings)
    assert [(b.address, b.driver_after) for b in restored] == [
        (GPU, "nvidia"),
        (AUDIO, "snd_hda_intel"),
    ]
    assert (devices(root) / GPU / "driver_override").read_text() == "\n", "override cleared"
    assert host.commands_run == 2, "one command per direction, whatever the function count"


def test_bridges_are_skipped_and_bound_functions_left_alone(root: Path, kernel: FakeKernel) -> None:
    host = LocalHost(str(root))
    bind_to_vfio(host, [GPU])
    assert bind_to_vfio(host, [BRIDGE, GPU]) == [
        Binding(address=GPU, driver_before="vfio-pci", driver_after="vfio-pci")
    ]
    assert (devices(root) / BRIDGE / "driver_override").read_text() == "(null)\n"
    assert kernel.probed == [GPU], "an already bound function is not probed again"


def test_a_kernel_write_that_never_returns_is_abandoned(root: Path) -> None:
    # No reader ever opens this FIFO: writing to it blocks, as an unbind of a busy GPU does.
    os.mkfifo(root / "sys/bus/pci/drivers_probe")
    started = time.monotonic()
    with pytest.raises(LiveRebindError, match="drivers_probe timed out") as err:
        bind_to_vfio(LocalHost(str(root)), [GPU], write_timeout=1)
    assert time.monotonic() - started < 20
    assert err.value.address == GPU


def test_a_function_left_on_the_wrong_driver_is_reported_and_returned(
    root: Path, kernel: FakeKernel
) -> None:
    kernel.inert = True
    with pytest.raises(LiveRebindError, match="is bound to nvidia after the rebind") as err:
        bind_to_vfio(LocalHost(str(root)), [GPU, AUDIO], write_timeout=1)
    assert f"returned to their drivers: {GPU}" in str(err.value)
    assert (devices(root) / GPU / "driver_override").read_text() == "\n"
    assert driver(root, AUDIO) == "snd_hda_intel", "the rebind stopped at the first failure"


def test_a_missing_function_is_named(root: Path) -> None:
    with pytest.raises(LiveRebindError, match=r"0000:aa:00\.0: no such PCI device"):
        bind_to_vfio(LocalHost(str(root)), ["0000:aa:00.0"])


# --- apply --live ---------------------------------------------------------------------------------


def test_live_apply_rebinds_verifies_and_rolls_back(
    root: Path, bin_dir: Path, kernel: FakeKernel
) -> None:
    host = LocalHost(str(root))
    plan = ct200_plan(root)
    original = snapshot(root, KERNEL)
    result = apply_changes(host, changeset(root), plan=plan, live=True)
    assert [b.address for b in result.live] == vfio_functions(plan) == list(NODE1)
    assert {driver(root, a) for a in NODE1} == {"vfio-pci"}
    [entry] = history(host)
    assert entry.live == result.live
    assert not verify(host, entry).drifted, "files and drivers match the plan now"
    rollback(host, live=True)
    assert {a: driver(root, a) for a in NODE1} == NODE1
    assert snapshot(root, KERNEL) == original


def test_live_apply_refuses_a_busy_gpu_before_writing(
    root: Path, bin_dir: Path, kernel: FakeKernel
) -> None:
    host = LocalHost(str(root))
    original = snapshot(root, KERNEL)
    with held_open(root / "dev/nvidia4"), pytest.raises(DeviceBusyError, match=GPU):
        apply_changes(host, changeset(root), plan=ct200_plan(root), live=True)
    assert snapshot(root, KERNEL) == original and history(host) == []
    assert kernel.probed == []


def test_a_gpu_opened_while_the_post_actions_ran_stops_the_live_rebind(
    root: Path, bin_dir: Path, kernel: FakeKernel
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
                plan=ct200_plan(root),
                live=True,
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
    root: Path, bin_dir: Path, kernel: FakeKernel
) -> None:
    host = LocalHost(str(root))
    original = snapshot(root, KERNEL)
    kernel.inert = True
    with pytest.raises(ApplyError, match="every file was restored") as err:
        apply_changes(host, changeset(root), plan=ct200_plan(root), live=True)
    assert "bound to nvidia after the rebind" in str(err.value)
    assert snapshot(root, KERNEL) == original


def test_live_steps_on_a_directory_tree_are_listed(root: Path) -> None:
    result = apply_changes(
        DirectoryHost(str(root)), changeset(root), plan=ct200_plan(root), live=True
    )
    assert result.live == []
    assert result.messages[-1].startswith("listed, not run (a directory tree): rebind 0000:81:00.0")
