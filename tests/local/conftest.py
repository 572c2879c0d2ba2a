"""Fixtures of the local tier: stand-in tools first on PATH, a live host rooted at a tree copy,
and a stand-in for the kernel's PCI core."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxgpu.host.local import LocalHost
from tests.support.kernel import NODE1, FakeKernel
from tests.support.standins import fake_nvidia_smi, fake_pvesh, on_path


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory first on PATH, holding a stand-in pvesh."""
    directory = tmp_path / "bin"
    fake_pvesh(directory)
    on_path(monkeypatch, directory)
    return directory


@pytest.fixture
def gpu_tools(bin_dir: Path) -> Path:
    """``bin_dir`` with a stand-in nvidia-smi too: persistence mode off on node 1's GPUs."""
    fake_nvidia_smi(bin_dir, {a: "Disabled" for a, d in NODE1.items() if d == "nvidia"})
    return bin_dir


@pytest.fixture
def live_host(root: Path, bin_dir: Path) -> LocalHost:
    """This machine with the tree as its root: post-actions run, guests are asked about."""
    return LocalHost(str(root))


@pytest.fixture
def kernel(root: Path) -> Iterator[FakeKernel]:
    """The tree's node-1 functions bound to their drivers, probed by a stand-in PCI core."""
    fake = FakeKernel(root, NODE1)
    yield fake
    fake.stop()
