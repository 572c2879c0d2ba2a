"""Names read from a host are checked against what the kernel can make before anything uses
them: they reach command lines, modprobe.d, systemd and udev files, container configs and paths.

A name the kernel could not have made (a module name with a space, a driver called ``..``, a PCI
address with shell syntax) means the tree is not what a host wrote, so inspection refuses it,
naming the file (exit 8), instead of quoting it into a file proxgpu writes.

>>> check_names(Capture(links={"/sys/bus/pci/devices/0000:01:00.0/driver":
...                            "../../../bus/pci/drivers/nvidia;reboot"}), "pve1")
... # doctest: +ELLIPSIS
Traceback (most recent call last):
...
proxgpu.errors.SysfsError: pve1: /sys/bus/pci/devices/0000:01:00.0/driver: driver 'nvidia;reboot' \
is not a name the kernel can make (letters, digits and _ . + -); refusing the host's data; the \
kernel writes this file: ...
"""

from __future__ import annotations

import re

from proxgpu.errors import SysfsError
from proxgpu.inspection.capture import ALIAS_LIST, Capture
from proxgpu.kmod import MODULES_ALIAS, MODULES_BUILTIN_MODINFO
from proxgpu.paths import PCI_DEVICES

#: A PCI function as sysfs names it (``pci_setup_device``: ``%04x:%02x:%02x.%d``).
PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
#: A module name: a ``.ko`` file's base name, at most MODULE_NAME_LEN - 1 (55) bytes; kmod and
#: /sys/module spell ``-`` as ``_``.
MODULE_NAME = re.compile(r"[A-Za-z0-9_-]{1,55}")
#: A driver's name (``struct device_driver.name``): in-tree PCI drivers use letters, digits and
#: ``_ - .`` (``vfio-pci``, ``snd_hda_intel``, ``bochs-drm``); never ``/``, a space or ``..``.
DRIVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
#: A kernel release (``uname -r``: UTS_RELEASE, at most 64 bytes), as Debian and Proxmox name them.
KERNEL_RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~-]{0,63}")
#: A host name: dot-separated labels of letters, digits and inner hyphens (RFC 1123).
HOSTNAME = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)
#: One component of a device's link into /sys/devices (``..``, ``devices``, ``pci0000:00``, an
#: address): letters, digits and ``: . _ -``.
SYSFS_COMPONENT = re.compile(r"[A-Za-z0-9:._-]+")
#: The device nodes a container can be given, as the drivers name them.
DEVICE_NODE = re.compile(
    r"/dev/(nvidia[0-9]{1,3}|nvidiactl|nvidia-[a-z-]{1,16}|nvidia-caps/nvidia-cap[0-9]{1,6}|kfd)"
)
#: A function's DRM nodes (``card1``, ``renderD129``).
DRM_NODE = re.compile(r"(card|renderD)[0-9]{1,4}")
#: A mediated device type: the parent's driver and the type's sysfs name joined by "-"
#: (drivers/vfio/mdev/mdev_sysfs.c), nvidia-1155 or i915-GVTg_V5_4; qemu-server refuses
#: "/", "." and ":" in ``mdev=`` (PVE/QemuServer/PCI.pm), and ",", "=" or blanks would end the
#: property in the VM's config line.
MDEV_TYPE = re.compile(r"[A-Za-z0-9_+-]{1,64}")
#: A line of a VF's ``nvidia/creatable_vgpu_types``: a vGPU type's id (which goes into a VM's
#: ``mdev=nvidia-ID`` as written) and its name, ``1155 : NVIDIA L40S-8Q``; or the header some
#: drivers print first (``ID : vGPU Name``, which pve-common's reader skips).
VGPU_TYPE_LINE = re.compile(r"\s*(?:[0-9]{1,10}|ID)\s*:\s*[ -~]{0,128}")
#: A VF's ``nvidia/current_vgpu_type``: the id of the vGPU type it holds, 0 for none.
VGPU_TYPE_ID = re.compile(r"[0-9]{1,10}")
#: The NVIDIA capability files the boot unit reads (nv-caps.c's names).
NVIDIA_CAP = re.compile(
    r"/proc/driver/nvidia/capabilities/(mig/config|mig/monitor|fabric-imex-mgmt"
    r"|gpu[0-9]{1,3}/mig/gi[0-9]{1,3}/access|gpu[0-9]{1,3}/mig/gi[0-9]{1,3}/ci[0-9]{1,3}/access)"
    r"|/proc/driver/nvidia-nvlink/capabilities/fabric-mgmt"
)
#: A PCI function's modalias (pci-sysfs.c ``modalias_show``:
#: ``pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X``; older kernels printed the interface in
#: lower case).
PCI_MODALIAS = re.compile(
    r"pci:v[0-9A-F]{8}d[0-9A-F]{8}sv[0-9A-F]{8}sd[0-9A-F]{8}bc[0-9A-F]{2}sc[0-9A-F]{2}i[0-9A-Fa-f]{2}"
)
#: A glob a module declares as its alias: what depmod writes of it, printable and without a
#: blank (a blank would split its line), within kmod's PATH_MAX buffer.
_GLOB = r"[!-~]{1,4095}"
#: The lines of the gather's lists of a kernel's aliases (after their first line): ``alias GLOB
#: MODULE`` as depmod writes ``modules.alias``, ``MODULE.alias=GLOB`` as the kernel's build
#: writes ``modules.builtin.modinfo``.
ALIAS_LINES = {
    MODULES_ALIAS: (re.compile(rf"alias {_GLOB} {MODULE_NAME.pattern}"), "alias GLOB MODULE"),
    MODULES_BUILTIN_MODINFO: (
        re.compile(rf"{MODULE_NAME.pattern}\.alias={_GLOB}"),
        "MODULE.alias=GLOB",
    ),
}
_HEX = {"vendor": 4, "device": 4, "subsystem_vendor": 4, "subsystem_device": 4, "class": 6}
_DRIVERS = "/sys/bus/pci/drivers/"
_NVIDIA_CAPS = ("/proc/driver/nvidia/capabilities/", "/proc/driver/nvidia-nvlink/")


def check_names(capture: Capture, source: str) -> None:
    """Refuse the capture when a name in it is one the kernel cannot have made.

    :raises SysfsError: naming the file or link that holds it.
    """
    for path in [*capture.lines, *capture.links, *capture.dirs]:
        if path.startswith(PCI_DEVICES):
            _check_device_path(source, path)
    for path, target in capture.links.items():
        _check_link(source, path, target)
    for path, lines in capture.lines.items():
        _check_attribute(source, path, lines)
    for path in [*capture.raw, *capture.lines]:
        if path.startswith("/lib/modules/"):
            kernel = path.split("/")[3]
            _expect(
                source, path, "kernel release", kernel, (KERNEL_RELEASE, "as uname -r prints it")
            )
    for path, lines in capture.lines.items():
        if path.startswith("/lib/modules/") and lines[:1] == [ALIAS_LIST]:
            _check_alias_lines(source, path, lines[1:])
    for path in capture.files:
        if path.startswith("/dev/") and not DEVICE_NODE.fullmatch(path):
            _refuse(source, path, "device node", path, "the NVIDIA and amdkfd drivers' names")
    for path in capture.dirs:
        if "/drm/" in path and path.startswith(PCI_DEVICES):
            _expect(
                source, path, "a DRM node", path.rsplit("/", 1)[1], (DRM_NODE, "cardN or renderDN")
            )


def _check_device_path(source: str, path: str) -> None:
    name, _, rest = path[len(PCI_DEVICES) :].partition("/")
    _expect(
        source,
        PCI_DEVICES + name,
        "PCI function",
        name,
        (PCI_ADDRESS, "DDDD:BB:DD.F, lower-case hex"),
    )
    kind, _, inside = rest.partition("/")
    if kind == "mdev_supported_types" and inside:
        # The type's id goes into the VM's hostpciN line as written: it must be one word.
        type_id = inside.split("/", 1)[0]
        _expect(source, path, "mdev type", type_id, (MDEV_TYPE, "letters, digits and _ + -"))


def _check_link(source: str, path: str, target: str) -> None:
    last = target.rstrip("/").rsplit("/", 1)[-1]
    if path.endswith("/driver"):
        _expect(source, path, "driver", last, (DRIVER_NAME, "letters, digits and _ . + -"))
    elif path.endswith("/iommu_group"):
        _expect(source, path, "IOMMU group", last, (re.compile(r"[0-9]{1,6}"), "a number"))
    elif path.endswith("/physfn"):
        _expect(source, path, "physical function", last, (PCI_ADDRESS, "DDDD:BB:DD.F"))
    elif path.startswith(_DRIVERS) and path.endswith("/module"):
        driver = path[len(_DRIVERS) :].split("/", 1)[0]
        _expect(source, path, "driver", driver, (DRIVER_NAME, "letters, digits and _ . + -"))
        _expect(source, path, "module", last, (MODULE_NAME, "letters, digits, _ and -, 55 at most"))
    # Every link the kernel makes in sysfs points along sysfs names: none holds a space or ;.
    for part in target.split("/"):
        if part:
            _expect(
                source, path, "link component", part, (SYSFS_COMPONENT, "letters, digits, : . _ -")
            )


def _check_attribute(source: str, path: str, lines: list[str]) -> None:
    value = lines[0].strip() if lines else ""
    attribute = path.rsplit("/", 1)[-1]
    if path.startswith(PCI_DEVICES) and attribute in _HEX and value:
        digits = _HEX[attribute]
        pattern = re.compile(f"0x[0-9a-f]{{{digits}}}")
        _expect(source, path, attribute, value, (pattern, f"0x and {digits} hex digits"))
    elif path.startswith(PCI_DEVICES) and attribute == "driver_override" and value != "(null)":
        _expect(source, path, "driver", value, (DRIVER_NAME, "letters, digits and _ . + -"))
    elif path.startswith(PCI_DEVICES) and attribute == "modalias":
        _expect(source, path, "modalias", value, (PCI_MODALIAS, "pci:v...i.., as sysfs has it"))
    elif path.startswith(PCI_DEVICES) and path.endswith("/nvidia/current_vgpu_type"):
        _expect(source, path, "vGPU type id", value, (VGPU_TYPE_ID, "a number, 0 for none"))
    elif path.startswith(PCI_DEVICES) and path.endswith("/nvidia/creatable_vgpu_types"):
        for line in (line for line in lines if line.strip()):
            form = "ID : NAME, the id a number and the name printable"
            _expect(source, path, "vGPU type line", line, (VGPU_TYPE_LINE, form))
    elif path == "/proc/sys/kernel/osrelease":
        _expect(source, path, "kernel release", value, (KERNEL_RELEASE, "as uname -r prints it"))
    elif path == "/proc/sys/kernel/hostname":
        _expect(source, path, "host name", value, (HOSTNAME, "letters, digits, - and ."))
    elif path.startswith(_NVIDIA_CAPS) and not NVIDIA_CAP.fullmatch(path):
        _refuse(source, path, "NVIDIA capability", path, "nv-caps' names")


def _check_alias_lines(source: str, path: str, lines: list[str]) -> None:
    """Each line of a kernel's alias list is one its file holds as the kernel and depmod write
    it: a module name proxgpu may write into a softdep line, and a glob."""
    rule = ALIAS_LINES.get(path.rsplit("/", 1)[1])
    if rule is None:
        return
    pattern, form = rule
    for line in lines:
        if pattern.fullmatch(line) is None:
            raise SysfsError(
                source,
                path,
                f"{line[:200]!r} is not a line depmod or the kernel writes there ({form}: a "
                "module name of letters, digits, _ and -, a glob of printable characters); "
                "refusing the host's data",
            )


def _expect(
    source: str, path: str, what: str, value: str, rule: tuple[re.Pattern[str], str]
) -> None:
    pattern, words = rule
    if pattern.fullmatch(value) is None:
        _refuse(source, path, what, value, words)


def _refuse(source: str, path: str, what: str, value: str, rule: str) -> None:
    raise SysfsError(
        source,
        path,
        f"{what} {value!r} is not a name the kernel can make ({rule}); refusing the host's data",
    )
