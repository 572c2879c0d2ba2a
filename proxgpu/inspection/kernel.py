"""What the capture says of the kernel's modules: which module each PCI driver comes from, the
module aliases of every installed kernel (``modules.alias``, ``modules.builtin.modinfo``), and
the files an initramfs holds (the gather lists them with ``lsinitramfs``)."""

from __future__ import annotations

import re

from proxgpu.inspection.capture import ALIAS_LIST, Capture
from proxgpu.inspection.inventory import KernelModules, ModuleAlias
from proxgpu.kmod import MODULES_ALIAS, MODULES_BUILTIN_MODINFO, module_dir


def driver_modules(capture: Capture) -> dict[str, str]:
    """Each PCI driver's module, by the driver's name (``bochs-drm`` -> ``bochs``), from its
    sysfs ``module`` link; a built-in driver has none."""
    pattern = re.compile(r"^/sys/bus/pci/drivers/([^/]+)/module$")
    modules = {}
    for path, target in capture.links.items():
        match = pattern.match(path)
        if match:
            modules[match.group(1)] = target.rstrip("/").rsplit("/", 1)[-1]
    return dict(sorted(modules.items()))


#: The first line of the gather script's list of an initramfs (and of a snapshot's copy of it).
_INITRAMFS_LIST = "#proxgpu: the files in this initramfs, by base name"


#: The gather script's last line of a list that lsinitramfs did not finish (failed, or ran past
#: its time): such a list is not believed.
_INITRAMFS_FAILED = "#proxgpu: lsinitramfs failed"


def _initramfs_lines(capture: Capture) -> tuple[str, list[str]] | None:
    kernel = capture.first_line("/proc/sys/kernel/osrelease")
    path = f"/boot/initrd.img-{kernel}"
    lines = capture.lines.get(path) if kernel else None
    if not lines or lines[0] != _INITRAMFS_LIST:
        return None
    return path, lines


def initramfs_files(capture: Capture) -> list[str] | None:
    """The base names of the files in the running kernel's initramfs; ``None`` when it was not
    listed, or ``lsinitramfs`` did not finish."""
    found = _initramfs_lines(capture)
    if found is None or any(line.startswith(_INITRAMFS_FAILED) for line in found[1]):
        return None
    return sorted({line for line in found[1][1:] if line})


def initramfs_warnings(capture: Capture) -> list[str]:
    """Why the initramfs's list is not believed, where ``lsinitramfs`` failed."""
    found = _initramfs_lines(capture)
    if found is None:
        return []
    path, lines = found
    failed = next((line for line in lines if line.startswith(_INITRAMFS_FAILED)), None)
    if failed is None:
        return []
    # The status in brackets: 124 is the script's 60 s limit on lsinitramfs.
    return [f"{path}: {failed.removeprefix('#proxgpu: ')}: which modules it holds is unknown"]


def _alias_list(capture: Capture, kernel: str, name: str) -> list[str] | None:
    """The gather's list of a kernel's ``modules.alias`` or ``modules.builtin.modinfo``
    (:data:`~proxgpu.inspection.capture.ALIAS_LIST`), without its first line; ``None`` when the
    file was not read."""
    lines = capture.lines.get(module_dir(kernel) + name)
    return lines[1:] if lines and lines[0] == ALIAS_LIST else None


def kernel_modules(capture: Capture) -> dict[str, KernelModules]:
    """Each installed kernel's module aliases for the GPUs' functions, where its
    ``modules.alias`` was read (its lines ``alias GLOB MODULE``, the built-in modules' entries
    ``MODULE.alias=GLOB``; :mod:`~proxgpu.inspection.names` refused any other)."""
    found: dict[str, KernelModules] = {}
    suffix = "/" + MODULES_ALIAS
    for path in sorted(capture.lines):
        kernel = path.removeprefix("/lib/modules/").removesuffix(suffix)
        aliases = _alias_list(capture, kernel, MODULES_ALIAS) if path.endswith(suffix) else None
        if aliases is None or "/" in kernel:
            continue
        builtin = _alias_list(capture, kernel, MODULES_BUILTIN_MODINFO)
        found[kernel] = KernelModules(
            aliases=[ModuleAlias(alias=a, module=m) for _, a, m in map(str.split, aliases)],
            builtin_aliases=None
            if builtin is None
            else [
                ModuleAlias(alias=a, module=m)
                for m, _, a in (line.partition(".alias=") for line in builtin)
            ],
        )
    return found
