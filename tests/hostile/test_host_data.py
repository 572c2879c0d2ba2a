"""Host data is never code: every name read from a host tree that reaches a command line, a
modprobe.d, unit or container file is one the kernel can make, or the tree is refused naming the
file (exit 8; a softdep word proxgpu would copy: exit 16), before anything is planned or written.

Each case copies the ct200 example into its scratch folder, plants one hostile name (shell syntax
that would touch the canary, a space, a newline, ``..``; or nvidia-smi's outputs as a snapshot
keeps them, stand-ins laid out as NVIDIA's MIG user guide shows them), runs ``proxgpu apply
--yes`` on it in process and checks the exact refusal, that the tree is byte for byte as planted
and that nothing outside the scratch folder changed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.paths import NVIDIA_SMI_LIST, NVIDIA_SMI_TABLE
from tests.support.hostile_scratch import Scratch, fingerprint
from tests.support.standins import MIG_CI, MIG_LISTING, MIG_TABLE
from tests.support.trees import copy_example

GPU = "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0"
ENTRY = "sys/bus/pci/devices/0000:01:00.0"
MODULES_DIR = "lib/modules/6.8.12-11-pve"
Plant = Callable[[Path, Path], None]


def APPLY(tree: Path) -> list[str]:  # noqa: N802 - reads as the command it is
    """``proxgpu apply`` of ct200's split on ``tree``, without asking."""
    return ["apply", "--root", str(tree), "--split", "numa", "--lxc", "200", "--vm", "300", "--yes"]


def _relink(tree: Path, link: str, target: str) -> None:
    (tree / link).unlink()
    os.symlink(target, tree / link)


def _write(tree: Path, path: str, text: str) -> None:
    (tree / path).parent.mkdir(parents=True, exist_ok=True)
    (tree / path).write_text(text)


def _device_dir(tree: Path, name: str) -> None:
    os.symlink(f"../../../{GPU}", tree / "sys/bus/pci/devices" / name)


#: An SR-IOV virtual function planted beside the GPU, below the same root port.
VF = "0000:01:00.4"


def _vf(
    tree: Path,
    physfn: str,
    address: str = VF,
    nvidia: dict[str, str] | None = None,
    before: str | None = None,
) -> None:
    """A virtual function of the GPU (a 3D controller below its root port) whose ``physfn``
    link points at ``physfn``, with ``nvidia/`` files as NVIDIA's vGPU 17 driver makes them;
    ``before``: the physfn of a VF at :data:`VF` planted first."""
    if before is not None:
        _vf(tree, before)
    device = f"{GPU.rsplit('/', 1)[0]}/{address}"
    for name, value in (("vendor", "0x10de"), ("device", "0x2bb1"), ("class", "0x030200")):
        _write(tree, f"{device}/{name}", value + "\n")
    os.symlink(f"../../../{device.removeprefix('sys/')}", tree / "sys/bus/pci/devices" / address)
    os.symlink(physfn, tree / device / "physfn")
    for name, text in (nvidia or {}).items():
        _write(tree, f"{device}/nvidia/{name}", text)


def _mig(tree: Path, listing: str, table: str = MIG_TABLE) -> None:
    """GPU 0 in MIG mode with a compute instance, and what a snapshot kept of nvidia-smi."""
    access = "DeviceFileMinor: {}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    caps = "proc/driver/nvidia/capabilities/gpu0/mig/gi1"
    _write(tree, f"{caps}/access", access.format(12))
    _write(tree, f"{caps}/ci0/access", access.format(13))
    _write(tree, NVIDIA_SMI_LIST.lstrip("/"), listing)
    _write(tree, NVIDIA_SMI_TABLE.lstrip("/"), table)


# (what is planted, how, the file the refusal names, the words of the refusal)
CASES: list[tuple[str, Plant, str, str]] = [
    (
        "driver with shell syntax",
        lambda t, c: _relink(t, f"{GPU}/driver", f"../../../../bus/pci/drivers/nvidia;touch {c}"),
        f"/{ENTRY}/driver",
        "link component 'nvidia;touch '",
    ),
    (
        "driver named ..",
        lambda t, c: _relink(t, f"{GPU}/driver", "../../../../bus/pci/drivers/.."),
        f"/{ENTRY}/driver",
        "driver '..' is not a name the kernel can make",
    ),
    (
        "module with a space",
        lambda t, c: _relink(t, "sys/bus/pci/drivers/nvidia/module", "../../../../module/nv idia"),
        "/sys/bus/pci/drivers/nvidia/module",
        "module 'nv idia' is not a name the kernel can make",
    ),
    (
        "module with shell syntax",
        lambda t, c: _relink(
            t, "sys/bus/pci/drivers/nvidia/module", f"../../../../module/$(touch {c})"
        ),
        "/sys/bus/pci/drivers/nvidia/module",
        "module 'canary)' is not a name the kernel can make",
    ),
    (
        "IOMMU group that is no number",
        lambda t, c: _relink(t, f"{GPU}/iommu_group", "../../../../kernel/iommu_groups/1 2"),
        f"/{ENTRY}/iommu_group",
        "IOMMU group '1 2' is not a name the kernel can make (a number)",
    ),
    (
        "parent chain with a space",
        lambda t, c: _relink(t, ENTRY, "../../../devices/pci0000:00/0000:00:01.1 x/0000:01:00.0"),
        f"/{ENTRY}",
        "link component '0000:00:01.1 x' is not a name the kernel can make",
    ),
    (
        "link target with a newline",
        lambda t, c: _relink(t, f"{GPU}/driver", "../../../../bus/pci/drivers/nvidia\ninstall x"),
        f"/{ENTRY}/driver",
        "a name or link target with a newline, which the kernel never makes",
    ),
    (
        "device that is no PCI address",
        lambda t, c: _device_dir(t, "0000:01:00.0;reboot"),
        "/sys/bus/pci/devices/0000:01:00.0;reboot",
        "PCI function '0000:01:00.0;reboot' is not a name the kernel can make",
    ),
    (
        "device name with a newline",
        lambda t, c: _device_dir(t, "0000:01:00.0\n0000:02:00.0"),
        "/sys/bus/pci/devices/0000:01:00.0",
        "a name or link target with a newline",
    ),
    (
        # The type's id is written into a VM's hostpciN line: a comma would add properties.
        "mdev type that would end the hostpci property",
        lambda t, c: _write(t, f"{GPU}/mdev_supported_types/nvidia-1,romfile=x/name", "GRID\n"),
        f"/{ENTRY}/mdev_supported_types/nvidia-1,romfile=x/name",
        "mdev type 'nvidia-1,romfile=x' is not a name the kernel can make",
    ),
    (
        # A VF is a part of the GPU its physfn names: the link must name a PCI function.
        "SR-IOV physfn leading out of the devices",
        lambda t, c: _vf(t, "../../../../../etc"),
        f"/sys/bus/pci/devices/{VF}/physfn",
        "physical function 'etc' is not a name the kernel can make (DDDD:BB:DD.F)",
    ),
    (
        "SR-IOV physfn naming a function the host does not have",
        lambda t, c: _vf(t, "../0000:09:00.0"),
        f"/sys/bus/pci/devices/{VF}/physfn",
        "names 0000:09:00.0, which is not among the host's PCI functions",
    ),
    (
        "SR-IOV physfn naming another virtual function",
        lambda t, c: _vf(t, f"../{VF}", address="0000:01:00.5", before="../0000:01:00.0"),
        "/sys/bus/pci/devices/0000:01:00.5/physfn",
        f"names {VF}, which is itself a virtual function",
    ),
    (
        # The id goes into a VM's hostpciN line as mdev=nvidia-ID.
        "vGPU type id with shell syntax",
        lambda t, c: _vf(
            t,
            "../0000:01:00.0",
            nvidia={
                "current_vgpu_type": "0\n",
                "creatable_vgpu_types": f"1155;touch {c} : NVIDIA L40S-8Q\n",
            },
        ),
        f"/sys/bus/pci/devices/{VF}/nvidia/creatable_vgpu_types",
        "vGPU type line '1155;touch",
    ),
    (
        "current vGPU type that is no number",
        lambda t, c: _vf(t, "../0000:01:00.0", nvidia={"current_vgpu_type": "1155 x\n"}),
        f"/sys/bus/pci/devices/{VF}/nvidia/current_vgpu_type",
        "vGPU type id '1155 x' is not a name the kernel can make (a number, 0 for none)",
    ),
    (
        "vendor ID with shell syntax",
        lambda t, c: _write(t, f"{GPU}/vendor", f"0x10de$(touch {c})\n"),
        f"/{ENTRY}/vendor",
        "vendor '0x10de$(touch",
    ),
    (
        "class with a space",
        lambda t, c: _write(t, f"{GPU}/class", "0x0300 0\n"),
        f"/{ENTRY}/class",
        "class '0x0300 0' is not a name the kernel can make (0x and 6 hex digits)",
    ),
    (
        "modalias with shell syntax",
        lambda t, c: _write(
            t, f"{GPU}/modalias", f"pci:v000010DEd00002BB1sv000010DEsd0000204Bbc03sc00i00;{c}\n"
        ),
        f"/{ENTRY}/modalias",
        "modalias 'pci:v000010DEd00002BB1sv000010DEsd0000204Bbc03sc00i00;",
    ),
    (
        # kmod would be asked about another vendor's device than the one that is there.
        "modalias that names another device",
        lambda t, c: _write(
            t, f"{GPU}/modalias", "pci:v00001002d00002BB1sv000010DEsd0000204Bbc03sc00i00\n"
        ),
        f"/{ENTRY}/modalias",
        "says vendor 00001002, but its vendor file says 10de",
    ),
    (
        # The module's name would be written into proxgpu's modprobe.d file.
        "module alias naming a module with shell syntax",
        lambda t, c: _write(
            t, f"{MODULES_DIR}/modules.alias", "alias pci:v000010DEd*sv*sd*bc03sc*i* nv;reboot\n"
        ),
        f"/{MODULES_DIR}/modules.alias",
        "'alias pci:v000010DEd*sv*sd*bc03sc*i* nv;reboot' is not a line depmod or the kernel",
    ),
    (
        "built-in module's alias naming a module with shell syntax",
        lambda t, c: _write(
            t, f"{MODULES_DIR}/modules.builtin.modinfo", "nv$(reboot).alias=pci:v000010DEd*\0"
        ),
        f"/{MODULES_DIR}/modules.builtin.modinfo",
        "'nv$(reboot).alias=pci:v000010DEd*' is not a line depmod or the kernel writes there",
    ),
    (
        "driver_override with a space",
        lambda t, c: _write(t, f"{GPU}/driver_override", "vfio pci\n"),
        f"/{ENTRY}/driver_override",
        "driver 'vfio pci' is not a name the kernel can make",
    ),
    (
        "DRM node with a space",
        lambda t, c: (t / GPU / "drm" / "card1 x").mkdir(parents=True),
        f"/{ENTRY}/drm/card1 x",
        "DRM node 'card1 x' is not a name the kernel can make (cardN or renderDN)",
    ),
    (
        "device node with a space",
        lambda t, c: _write(t, "dev/nvidia0 x", ""),
        "/dev/nvidia0 x",
        "device node '/dev/nvidia0 x' is not a name the kernel can make",
    ),
    (
        "kernel release with shell syntax",
        lambda t, c: _write(t, "proc/sys/kernel/osrelease", f"6.8.12-11-pve;touch {c}\n"),
        "/proc/sys/kernel/osrelease",
        "kernel release '6.8.12-11-pve;touch",
    ),
    (
        "kernel module directory with a space",
        lambda t, c: _write(t, "lib/modules/6.8 x/modules.softdep", "softdep a pre: b\n"),
        "/lib/modules/6.8 x/modules.softdep",
        "kernel release '6.8 x' is not a name the kernel can make",
    ),
    (
        "host name with shell syntax",
        lambda t, c: _write(t, "proc/sys/kernel/hostname", f"ct200$(touch {c})\n"),
        "/proc/sys/kernel/hostname",
        "host name 'ct200$(touch",
    ),
    (
        "MIG UUID with shell syntax",
        lambda t, c: _mig(t, MIG_LISTING.replace(MIG_CI[1], f"MIG-$(touch {c})")),
        NVIDIA_SMI_LIST,
        "UUID 'MIG-$(touch",
    ),
    (
        "GPU nvidia-smi lists twice",
        lambda t, c: _mig(t, MIG_LISTING + MIG_LISTING),
        NVIDIA_SMI_LIST,
        "GPU 0 is listed twice",
    ),
    (
        "MIG device nvidia-smi's table lists twice",
        lambda t, c: _mig(
            t, MIG_LISTING, MIG_TABLE.replace("|  0    1   2   2  |", "|  0    1   2   1  |")
        ),
        NVIDIA_SMI_TABLE,
        "GPU 0's MIG device 1 (GI 1 CI 2) is listed twice",
    ),
    (
        "NVIDIA capability with a space",
        lambda t, c: _write(t, "proc/driver/nvidia/capabilities/gpu0/mig/gi1 x/access", "x\n"),
        "/proc/driver/nvidia/capabilities/gpu0/mig/gi1 x/access",
        "NVIDIA capability",
    ),
]


@pytest.mark.parametrize(("what", "plant", "path", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_hostile_name_in_the_tree_is_refused_before_anything_is_written(  # noqa: PLR0917
    scratch: Scratch,
    capsys: pytest.CaptureFixture[str],
    what: str,
    plant: Plant,
    path: str,
    words: str,
) -> None:
    tree = copy_example(scratch.root, dest="host")
    plant(tree, scratch.canary)
    planted = fingerprint(tree)
    code = main(APPLY(tree))
    err = capsys.readouterr().err
    assert code == 8, err
    where = f"dir:{tree}: {path.format(canary=scratch.canary)}: "
    assert where in err, err
    assert words in err.split(where, 1)[1], err
    assert "refusing" in err
    assert fingerprint(tree) == planted, "a refused tree was written to"


def test_a_softdep_word_that_is_no_module_name_is_not_copied_into_proxgpus_file(
    scratch: Scratch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An admin's softdep line for the driver proxgpu binds around is kept in proxgpu's own
    line; a word ending in a backslash, last on proxgpu's line, would join the next line to it,
    so it is refused."""
    tree = copy_example(scratch.root, dest="host")
    # kmod reads a backslash before any other character as that character, so two make one:
    # the word kmod reads is snd_hda_codec\, which last on a line would join the next to it.
    _write(tree, "etc/modprobe.d/zz-audio.conf", "softdep snd_hda_intel post: snd_hda_codec\\\\ \n")
    planted = fingerprint(tree)
    code = main(APPLY(tree))
    err = capsys.readouterr().err
    assert code == 16, err
    assert f"dir:{tree}: /etc/modprobe.d/zz-audio.conf:1: 'snd_hda_codec\\\\'" in err, err
    assert "is not a module name" in err
    assert fingerprint(tree) == planted


def test_the_same_tree_without_the_hostile_name_applies(
    scratch: Scratch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control: the unplanted tree passes every check and is written to."""
    tree = copy_example(scratch.root, dest="host")
    before = fingerprint(tree)
    code = main(APPLY(tree))
    assert code == 0, capsys.readouterr().err
    assert fingerprint(tree) != before
