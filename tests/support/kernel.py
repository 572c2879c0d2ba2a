"""The kernel's side of a live rebind, stood in for in a copy of the ct200 example tree.

The kernel cannot be driven here, so two stand-ins take its place: a file under the tree's
``dev/`` that a test holds open (:func:`held_open`) stands in for a GPU's device node (fuser treats
both alike), and :class:`FakeKernel` answers writes to ``drivers_probe`` the way the PCI core does.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

# The kernel's side of things in a tree, which the tests drive on purpose (snapshot ignores it).
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
    """The tree's PCI devices directory."""
    return root / "sys/bus/pci/devices"


def driver(root: Path, address: str) -> str | None:
    """The driver a function of the tree is bound to, if any."""
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


@contextlib.contextmanager
def held_open(path: Path) -> Iterator[None]:
    """Hold ``path`` open, as a CUDA process holds /dev/nvidiaN."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    with open(path):
        yield
