"""A kernel module tree for Debian's real kmod: ``.ko`` files that carry real ``.modinfo``
sections (what ``modinfo`` and ``depmod`` read), indexed by the real ``depmod``, and ``modprobe
--show-depends`` run over it with a host's modprobe.d files, as udev and ``modprobe`` would load
a driver.

The modules hold no code: kmod never loads them here (``--show-depends`` only says what it would
run, in order), so an ELF object with the ``.modinfo`` section is all it reads.

Every function that runs kmod takes the :class:`Kmod` to run: :data:`KMODS` is the system's and
a build of each release ``tests/kmod/versions.toml`` pins (Proxmox VE 7 to 9's), so a test can
run once with each.

>>> ko = elf_module([("name", "nvidia"), ("softdep", "pre: ecdh_generic,ecdsa_generic")])
>>> ko[:4], b"softdep=pre: ecdh_generic,ecdsa_generic\\0" in ko
(b'\\x7fELF', True)
"""

from __future__ import annotations

import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from proxgpu.kmod import CONFIG_DIRS
from tests.kmod.builds import KmodUnavailableError, Release, load_manifest, locate
from tests.support.tools import find_tool, require_tool, unavailable

_SECTION = struct.Struct("<IIQQQQIIQQ")
_SHT_PROGBITS, _SHT_STRTAB, _SHF_ALLOC = 1, 3, 2
_ET_REL, _EM_X86_64 = 1, 62


@dataclass(frozen=True)
class Kmod:
    """One kmod to run: the system's (``release`` None) or the build of a pinned release."""

    version: str
    release: Release | None = None

    def __str__(self) -> str:
        return f"kmod-{self.version}"

    def tool(self, name: str) -> str:
        """The path of ``depmod`` or ``modprobe`` of this kmod; else skip, or fail under CI."""
        if self.release is None:
            return require_tool(name, "kmod")
        try:
            return str(locate(self.release) / name)
        except KmodUnavailableError as error:
            unavailable(str(error))


def system_kmod() -> Kmod:
    """The system's kmod, named by the version its ``modprobe`` says (``system`` without one:
    its tests then skip, or fail under CI, for want of it)."""
    modprobe = find_tool("modprobe")
    if modprobe is None:
        return Kmod("system")
    said = subprocess.run([modprobe, "--version"], capture_output=True, text=True, check=True)
    return Kmod(said.stdout.split()[2])


#: Every kmod the binding tests run: the system's, then each pinned release's build.
KMODS = (system_kmod(), *(Kmod(release.version, release) for release in load_manifest()))


def elf_module(modinfo: Sequence[tuple[str, str]]) -> bytes:
    """A relocatable x86-64 ELF object whose ``.modinfo`` holds ``key=value`` strings, as the
    kernel's ``MODULE_INFO`` macros lay them out (each NUL-terminated)."""
    info = b"".join(f"{key}={value}".encode() + b"\0" for key, value in modinfo)
    names = b"\0.modinfo\0.shstrtab\0"
    info_at = 64
    names_at = info_at + len(info)
    headers_at = (names_at + len(names) + 7) & ~7
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)  # 64-bit, little-endian, version 1
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", _ET_REL, _EM_X86_64, 1, 0, 0, headers_at, 0, 64, 0, 0, 64, 3, 2
    )
    sections = bytes(64)  # the null section
    sections += _SECTION.pack(1, _SHT_PROGBITS, _SHF_ALLOC, 0, info_at, len(info), 0, 0, 1, 0)
    sections += _SECTION.pack(10, _SHT_STRTAB, 0, 0, names_at, len(names), 0, 0, 1, 0)
    body = header + info + names
    return body + bytes(headers_at - len(body)) + sections


@dataclass(frozen=True)
class Module:
    """A module file: where it lives under the kernel's directory and what its modinfo says."""

    file: str
    modinfo: tuple[tuple[str, str], ...]


def pci_alias(vendor: str, device: str, class_code: str) -> str:
    """The modalias the kernel gives a PCI function (what udev asks kmod to load), any
    subsystem: ``pci:vVVVVVVVVdDDDDDDDDsvSSSSSSSSsdSSSSSSSSbcBBscSSiII``.

    >>> pci_alias("10de", "2bb1", "0x030000")
    'pci:v000010DEd00002BB1sv000010DEsd0000204Bbc03sc00i00'
    """
    code = class_code.removeprefix("0x")
    return (
        f"pci:v0000{vendor.upper()}d0000{device.upper()}sv000010DEsd0000204B"
        f"bc{code[0:2].upper()}sc{code[2:4].upper()}i{code[4:6].upper()}"
    )


def _vermagic(kernel: str) -> tuple[str, str]:
    return ("vermagic", f"{kernel} SMP preempt mod_unload modversions ")


def gpu_modules(kernel: str) -> list[Module]:
    """The drivers that claim GPU functions, with their real aliases and softdeps (NVIDIA's open
    module declares ``pre: ecdh_generic,ecdsa_generic`` in kernel-open/nvidia/libspdm_ecc.c),
    and the vfio modules."""
    magic = _vermagic(kernel)
    return [
        Module(
            "updates/dkms/nvidia.ko",
            (
                ("alias", "pci:v000010DEd*sv*sd*bc03sc00i00*"),
                ("alias", "pci:v000010DEd*sv*sd*bc03sc02i00*"),
                ("softdep", "pre: ecdh_generic,ecdsa_generic"),
                ("license", "Dual MIT/GPL"),
                ("name", "nvidia"),
                magic,
            ),
        ),
        Module(
            "kernel/drivers/gpu/drm/nouveau/nouveau.ko",
            (("alias", "pci:v000010DEd*sv*sd*bc03sc*i*"), ("name", "nouveau"), magic),
        ),
        Module(
            "kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko",
            (("alias", "pci:v00001002d0000744Csv*sd*bc*sc*i*"), ("name", "amdgpu"), magic),
        ),
        Module(
            "kernel/sound/pci/hda/snd-hda-intel.ko",
            (("alias", "pci:v*d*sv*sd*bc04sc03i00*"), ("name", "snd_hda_intel"), magic),
        ),
        Module("kernel/drivers/vfio/vfio.ko", (("name", "vfio"), magic)),
        Module(
            "kernel/drivers/vfio/pci/vfio-pci.ko",
            (("alias", "vfio_pci:v*d*sv*sd*bc*sc*i*"), ("name", "vfio_pci"), magic),
        ),
        Module("kernel/drivers/vfio/vfio_iommu_type1.ko", (("name", "vfio_iommu_type1"), magic)),
    ]


def extra_module(kernel: str, name: str) -> Module:
    """A module with nothing but its name, for a softdep to name."""
    return Module(f"kernel/extra/{name}.ko", (("name", name), _vermagic(kernel)))


def module_with_aliases(kernel: str, file: str, *aliases: str) -> Module:
    """A module at ``file`` (its name the file's) declaring ``aliases``, as ``MODULE_DEVICE_TABLE``
    makes them."""
    name = file.rsplit("/", 1)[1].removesuffix(".ko").replace("-", "_")
    info = (*(("alias", alias) for alias in aliases), ("name", name), _vermagic(kernel))
    return Module(file, info)


def drivers_tables_miss(kernel: str) -> list[Module]:
    """Drivers of an NVIDIA GPU's functions that proxgpu's fixed table does not name: nova-core
    (Linux 6.15 and later; drivers/gpu/nova-core/driver.rs, VGA and 3D controllers of NVIDIA's,
    any programming interface: ``ClassMask::ClassSubclass``), and i2c-nvidia-gpu, the USB-C UCSI
    function's (drivers/i2c/busses/i2c-nvidia-gpu.c: NVIDIA's class 0x0c80 functions)."""
    return [
        module_with_aliases(
            kernel,
            "kernel/drivers/gpu/nova-core/nova_core.ko",
            "pci:v000010DEd*sv*sd*bc03sc00i*",
            "pci:v000010DEd*sv*sd*bc03sc02i*",
        ),
        module_with_aliases(
            kernel, "kernel/drivers/i2c/busses/i2c-nvidia-gpu.ko", "pci:v000010DEd*sv*sd*bc0Csc80i*"
        ),
    ]


#: A driver built into the kernel, as ``modules.builtin.modinfo`` lists its aliases: the xHCI
#: controller's (drivers/usb/host/xhci-pci.c, ``PCI_CLASS_SERIAL_USB_XHCI``), which a GPU's USB-C
#: function is.
XHCI_BUILTIN = (("xhci_pci", "pci:v*d*sv*sd*bc0Csc03i30*"),)


def write_files(root: Path, files: dict[str, str | None]) -> None:
    """Write each of ``files`` (absolute host paths) under ``root``; ``None`` removes one."""
    for path, text in files.items():
        target = root / path.lstrip("/")
        if text is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)


def build_tree(
    kmod: Kmod,
    root: Path,
    kernel: str,
    modules: Sequence[Module],
    builtin: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write ``modules`` under ``root/lib/modules/KERNEL`` and index them with ``kmod``'s depmod
    (which writes ``modules.softdep`` and ``modules.alias`` from their modinfo); ``builtin``, as
    ``(module, alias)``, are the kernel's built-in modules' aliases (``modules.builtin.modinfo``,
    each ``MODULE.alias=GLOB`` string ending in a NUL, which depmod indexes). The module
    directory."""
    depmod = kmod.tool("depmod")
    directory = root / "lib/modules" / kernel
    for module in modules:
        path = directory / module.file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(elf_module(module.modinfo))
    (directory / "modules.order").touch()
    names = sorted({name for name, _ in builtin})
    (directory / "modules.builtin").write_text("".join(f"kernel/{n}.ko\n" for n in names))
    modinfo = b"".join(f"{name}.alias={alias}".encode() + b"\0" for name, alias in builtin)
    (directory / "modules.builtin.modinfo").write_bytes(modinfo)
    subprocess.run([depmod, "-b", str(root), kernel], check=True, capture_output=True)
    return directory


def _modprobe(kmod: Kmod, root: Path, kernel: str, *words: str) -> list[str]:
    """``kmod``'s ``modprobe`` on the host laid out under ``root``: kmod's own config
    directories there, its module directory there."""
    configs = [f"--config={root}{d.rstrip('/')}" for d in CONFIG_DIRS]
    command = [kmod.tool("modprobe"), f"--dirname={root}", f"--set-version={kernel}", *configs]
    result = subprocess.run([*command, *words], check=True, capture_output=True, text=True)
    return result.stdout.splitlines()


def resolve_alias(kmod: Kmod, root: Path, kernel: str, name: str) -> set[str]:
    """The modules ``kmod``'s ``modprobe --resolve-alias`` finds for ``name`` (a modalias), as
    udev's builtin kmod would load them; none when it finds none."""
    try:
        return set(_modprobe(kmod, root, kernel, "--resolve-alias", name))
    except subprocess.CalledProcessError as error:
        if "not found" in error.stderr:
            return set()
        raise


def show_depends(kmod: Kmod, root: Path, kernel: str, name: str, *flags: str) -> list[str]:
    """What ``kmod``'s ``modprobe`` would run to load ``name`` (a module or a modalias) on the
    host laid out under ``root``: kmod's own config directories there, its module directory there.
    ``--use-blacklist`` among ``flags`` applies blacklists as udev does."""
    return _modprobe(kmod, root, kernel, "--show-depends", *flags, name)
