"""The busy check (proxgpu.apply.busy): a GPU is in use while a process holds its device node,
its DRI or VFIO node, or nvidia-persistenced keeps it open.

No GPU can be opened here: a file under the tree's ``dev/`` that the test holds open stands in
for a device node (fuser treats both alike; see ``tests/support/kernel.py``). ``nvidia-smi`` is not
installable either: a stand-in on PATH (``gpu_tools``) prints only what the real tool prints.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxgpu.apply.busy import check_not_busy, find_busy
from proxgpu.errors import DeviceBusyError
from proxgpu.host.local import LocalHost
from tests.support.kernel import AUDIO, GPU, devices, held_open
from tests.support.standins import fake_nvidia_smi, on_path


def test_a_process_holding_the_device_node_makes_the_gpu_busy(root: Path, gpu_tools: Path) -> None:
    host = LocalHost(str(root))
    # Stands in for /dev/nvidia4, the node of Device Minor 4 from procfs; real nodes need a GPU.
    with held_open(root / "dev/nvidia4"), pytest.raises(DeviceBusyError) as err:
        check_not_busy(host, [GPU, AUDIO])
    message = str(err.value)
    assert f"{GPU} (nvidia): {root}/dev/nvidia4 is held by pid {os.getpid()}" in message
    assert "stop the processes" in message and err.value.addresses == [GPU]
    check_not_busy(host, [GPU, AUDIO])
    assert host.commands_run == 2, "one command per check"


def test_persistence_mode_on_makes_the_gpu_busy(root: Path, gpu_tools: Path) -> None:
    fake_nvidia_smi(gpu_tools, {GPU: "Enabled", "0000:91:00.0": "Disabled"})
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


def framebuffer_on(root: Path, address: str, name: str = "fb0") -> None:
    """``/sys/class/graphics/fbN`` with its ``device`` link to the GPU, as the kernel has it."""
    fb = root / "sys/class/graphics" / name
    fb.mkdir(parents=True)
    (fb / "device").symlink_to(f"../../../bus/pci/devices/{address}")


def console(root: Path, name: str, bound: bool) -> None:
    con = root / "sys/class/vtconsole/vtcon1"
    con.mkdir(parents=True)
    (con / "name").write_text(f"{name}\n")
    (con / "bind").write_text("1\n" if bound else "0\n")


def nvidia_drm(root: Path, modeset: str, fbdev: str) -> None:
    params = root / "sys/module/nvidia_drm/parameters"
    params.mkdir(parents=True)
    (params / "modeset").write_text(f"{modeset}\n")
    (params / "fbdev").write_text(f"{fbdev}\n")


def test_a_framebuffer_console_on_an_nvidia_gpu_refuses_the_live_unbind(
    root: Path, gpu_tools: Path
) -> None:
    framebuffer_on(root, GPU)
    console(root, "(M) frame buffer device", bound=True)
    with pytest.raises(DeviceBusyError) as err:
        check_not_busy(LocalHost(str(root)), [GPU, AUDIO])
    message = str(err.value)
    assert f"{GPU} (nvidia): fb0 sits on it with the console bound to it (fbcon)" in message
    assert "apply without --live and reboot" in message and err.value.addresses == [GPU]


def test_nvidia_drm_fbdev_refuses_the_live_unbind_without_a_visible_framebuffer(
    root: Path, gpu_tools: Path
) -> None:
    nvidia_drm(root, "Y", "Y")
    [busy] = find_busy(LocalHost(str(root)), [GPU])
    assert busy.reasons == ["nvidia_drm runs with modeset=Y fbdev=Y, whose framebuffer holds it"]


def test_nvidia_drm_without_fbdev_and_no_framebuffer_is_not_busy(
    root: Path, gpu_tools: Path
) -> None:
    nvidia_drm(root, "Y", "N")
    console(root, "(S) dummy device", bound=True)
    assert find_busy(LocalHost(str(root)), [GPU]) == []


def test_a_process_on_nvidia_drms_card_node_makes_the_gpu_busy(root: Path, gpu_tools: Path) -> None:
    (devices(root) / GPU / "drm" / "card1").mkdir(parents=True)
    # Stands in for /dev/dri/card1, which a compositor holds open through nvidia_drm.
    with held_open(root / "dev/dri/card1"):
        [busy] = find_busy(LocalHost(str(root)), [GPU])
    assert f"{root}/dev/dri/card1 is held by pid {os.getpid()}" in busy.reasons[0]


def test_a_framebuffer_on_another_drivers_gpu_does_not_block(root: Path) -> None:
    # In-tree DRM drivers let their fbdev client go on unbind; only nvidia's unbind waits.
    (devices(root) / GPU / "driver").unlink()
    (devices(root) / GPU / "driver").symlink_to("../../drivers/amdgpu")
    framebuffer_on(root, GPU)
    console(root, "(M) frame buffer device", bound=True)
    assert find_busy(LocalHost(str(root)), [GPU]) == []


# --- vGPUs: the driver that made them holds the GPU (issue #24 point 2) --------------------------

MDEV = "0b8a5c3e-9d41-4f6e-8a27-3c5d9e1f7a20"


def mediated_device(function_dir: Path, uuid: str = MDEV, kind: str = "nvidia-1155") -> None:
    """A mediated device of ``kind`` on the function, a link in its type's ``devices/`` as the
    mdev core makes it."""
    devices = function_dir / "mdev_supported_types" / kind / "devices"
    devices.mkdir(parents=True)
    (devices / uuid).symlink_to(f"../../../{uuid}")


def virtual_function(root: Path, address: str, number: int) -> Path:
    """An SR-IOV VF of GPU beside it, with the PF's ``virtfnN`` link to it, as the kernel makes
    them."""
    vf = devices(root) / GPU / ".." / address
    vf.mkdir()
    (devices(root) / GPU / f"virtfn{number}").symlink_to(f"../{address}")
    (devices(root) / address).symlink_to(f"../../../{(vf.resolve()).relative_to(root / 'sys')}")
    return vf


def test_a_live_mediated_device_makes_its_gpu_busy(root: Path, gpu_tools: Path) -> None:
    mediated_device(devices(root) / GPU)
    with pytest.raises(DeviceBusyError) as err:
        check_not_busy(LocalHost(str(root)), [GPU, AUDIO])
    message = str(err.value)
    assert f"{GPU} (nvidia): mediated device {MDEV} (nvidia-1155) exists;" in message
    assert f"remove it (echo 1 > /sys/bus/mdev/devices/{MDEV}/remove)" in message
    assert err.value.addresses == [GPU]


def test_a_vgpu_on_a_vf_of_the_gpu_makes_it_busy(root: Path, gpu_tools: Path) -> None:
    first = virtual_function(root, "0000:81:00.4", 0)
    mediated_device(first)
    second = virtual_function(root, "0000:81:00.5", 1)
    (second / "nvidia").mkdir()
    (second / "nvidia" / "current_vgpu_type").write_text("1155\n")
    free = virtual_function(root, "0000:81:00.6", 2)
    (free / "nvidia").mkdir()
    (free / "nvidia" / "current_vgpu_type").write_text("0\n")
    [busy] = find_busy(LocalHost(str(root)), [GPU])
    assert busy.reasons == [
        f"mediated device {MDEV} (nvidia-1155) exists on its VF 0000:81:00.4",
        "its VF 0000:81:00.5 holds a vGPU (type nvidia-1155)",
    ]
    assert busy.removals[1] == "echo 0 > /sys/bus/pci/devices/0000:81:00.5/nvidia/current_vgpu_type"
