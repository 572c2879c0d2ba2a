"""Runtime rebind (proxgpu.apply.rebind): each function to vfio-pci and back, one command per
direction, and the kernel writes that hang or leave a function on the wrong driver.

The kernel cannot be driven here: :class:`FakeKernel` (``tests/support/kernel.py``) answers
writes to ``drivers_probe`` in the tree the way the PCI core does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from proxgpu.apply.rebind import Binding, bind_to_vfio, restore_drivers
from proxgpu.errors import LiveRebindError
from proxgpu.host.local import LocalHost
from tests.support.kernel import AUDIO, BRIDGE, GPU, FakeKernel, devices, driver


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
