"""What a GPU's sysfs entry says beyond its IDs: its memory BARs, its DRM nodes, and the NVSwitch
bridges that tie GPUs into one NVLink fabric.

>>> bar_sizes(["0x00000000f0000000 0x00000000f3ffffff 0x0000000000040200",
...            "0x0000020000000000 0x0000021fffffffff 0x000000000014220c",
...            "0x0000000000000000 0x0000000000000000 0x0000000000000000"])
[67108864, 137438953472]
>>> bar64_sizes(["0x00000000f0000000 0x00000000f3ffffff 0x0000000000040200",
...              "0x0000020000000000 0x0000021fffffffff 0x000000000014220c"])
[137438953472]
>>> is_nvswitch(PciFunction(address="0000:05:00.0", class_code="0x068000",
...                         vendor_id="10de", device_id="22a3"))
True
"""

from __future__ import annotations

from proxgpu.inspection.capture import Capture
from proxgpu.inspection.inventory import MdevType, PciFunction, VgpuType
from proxgpu.paths import PCI_DEVICES
from proxgpu.pci import NVIDIA

#: ``IORESOURCE_MEM`` in a sysfs ``resource`` line's flags: a memory (not I/O port) region.
_IORESOURCE_MEM = 0x200
#: ``IORESOURCE_PREFETCH`` and ``IORESOURCE_MEM_64``: a prefetchable BAR, a 64-bit BAR.
_IORESOURCE_PREFETCH = 0x2000
_IORESOURCE_MEM_64 = 0x100000
#: Lines 0-5 of ``resource`` are the six BARs; the ROM and bridge windows follow.
_BARS = 6


def _memory_bars(lines: list[str]) -> list[tuple[int, int]]:
    """``(size, flags)`` of each memory BAR in sysfs ``resource`` lines (``start end flags`` in
    hex, one line per resource; unused ones are all zero)."""
    bars = []
    for line in lines[:_BARS]:
        fields = line.split()
        if len(fields) != 3:
            continue
        try:
            start, end, flags = (int(field, 16) for field in fields)
        except ValueError:
            continue
        if flags & _IORESOURCE_MEM and end > start:
            bars.append((end - start + 1, flags))
    return bars


def bar_sizes(lines: list[str]) -> list[int]:
    """The sizes in bytes of a function's memory BARs, from its sysfs ``resource`` lines."""
    return [size for size, _ in _memory_bars(lines)]


def bar64_sizes(lines: list[str]) -> list[int]:
    """The sizes of the 64-bit prefetchable memory BARs: a bridge forwards 64-bit addresses
    only through its prefetchable window, so these are the BARs a VM's firmware can place above
    4 GiB (a 64-bit BAR that is not prefetchable stays below)."""
    wanted = _IORESOURCE_PREFETCH | _IORESOURCE_MEM_64
    return [size for size, flags in _memory_bars(lines) if flags & wanted == wanted]


def gpu_bars(capture: Capture, address: str) -> list[int]:
    """The GPU's memory BAR sizes (empty when the capture did not read ``resource``)."""
    return bar_sizes(capture.lines.get(f"{PCI_DEVICES}{address}/resource", []))


def gpu_bars64(capture: Capture, address: str) -> list[int]:
    """The GPU's 64-bit prefetchable BAR sizes (empty when ``resource`` was not read)."""
    return bar64_sizes(capture.lines.get(f"{PCI_DEVICES}{address}/resource", []))


def reads_reset_methods(capture: Capture) -> bool:
    """Whether the capture read ``reset_method`` files at all (Linux 5.15 and later have them;
    an older capture or kernel does not)."""
    return any(path.endswith("/reset_method") for path in capture.lines)


def reset_methods(capture: Capture, address: str, captured: bool) -> list[str] | None:
    """The resets the kernel can do to the function, as sysfs ``reset_method`` lists them; the
    kernel hides the file when there is none. ``None`` when ``captured`` (see
    :func:`reads_reset_methods`) is false."""
    if not captured:
        return None
    return " ".join(capture.lines.get(f"{PCI_DEVICES}{address}/reset_method", [])).split()


def drm_nodes(capture: Capture, address: str) -> list[str]:
    """The function's DRM nodes by their ``/dev/dri`` names (``card1``, ``renderD129``)."""
    prefix = f"{PCI_DEVICES}{address}/drm/"
    return sorted(
        path[len(prefix) :]
        for path in capture.dirs
        if path.startswith(prefix) and "/" not in path[len(prefix) :]
    )


def mdev_type_ids(capture: Capture) -> dict[str, list[str]]:
    """The ids of the mediated device types each function offers (its
    ``mdev_supported_types/`` entries the capture read), by address: looked up once for every
    GPU, not once per GPU through every file.

    >>> mdev_type_ids(Capture(lines={
    ...     f"{PCI_DEVICES}0000:01:00.0/mdev_supported_types/nvidia-1/name": ["A"],
    ...     f"{PCI_DEVICES}0000:01:00.0/mdev_supported_types/nvidia-2/name": ["B"],
    ...     f"{PCI_DEVICES}0000:01:00.0/vendor": ["0x10de"]}))
    {'0000:01:00.0': ['nvidia-1', 'nvidia-2']}
    """
    found: dict[str, set[str]] = {}
    for path in capture.lines:
        if path.startswith(PCI_DEVICES) and "/mdev_supported_types/" in path:
            address, _, rest = path[len(PCI_DEVICES) :].partition("/mdev_supported_types/")
            if "/" not in address:
                found.setdefault(address, set()).add(rest.split("/")[0])
    return {address: sorted(ids) for address, ids in found.items()}


def mdev_types(capture: Capture, address: str, ids: list[str]) -> list[MdevType]:
    """The mediated device types ``mdev_supported_types/`` offers (``ids``, as
    :func:`mdev_type_ids` finds them), by id: what qemu-server reads to create a VM's ``mdev=``
    device (``get_mdev_types`` in PVE/QemuServer/PCI/Mdev.pm), an unreadable
    ``available_instances`` counting as none left, as there (``int`` of nothing)."""
    prefix = f"{PCI_DEVICES}{address}/mdev_supported_types/"
    types = []
    for type_id in ids:
        base = f"{prefix}{type_id}/"
        available = capture.first_line(base + "available_instances") or ""
        types.append(
            MdevType(
                id=type_id,
                name=capture.first_line(base + "name"),
                available=int(available) if available.isdigit() else 0,
                device_api=capture.first_line(base + "device_api"),
                instances=sorted(
                    path.rsplit("/", 1)[1]
                    for path in capture.links
                    if path.startswith(base + "devices/")
                ),
            )
        )
    return types


def current_vgpu_type(capture: Capture, address: str) -> int | None:
    """The id of the vGPU type a VF holds (``nvidia/current_vgpu_type``: 0 for none), ``None``
    when the VF has no such file (not NVIDIA's vGPU 17 interface, or not read)."""
    value = capture.first_line(f"{PCI_DEVICES}{address}/nvidia/current_vgpu_type")
    return int(value) if value is not None and value.isdigit() else None


def creatable_vgpu_types(capture: Capture, address: str) -> list[VgpuType] | None:
    """The vGPU types NVIDIA's driver can create on a VF now, as its
    ``nvidia/creatable_vgpu_types`` lists them (``1155 : NVIDIA L40S-8Q``, after a header line
    on some drivers); ``None`` when the VF has no ``nvidia/`` files. The file is empty when
    nothing can be made there now (a read of it gives no line), so ``current_vgpu_type``, which
    always holds a number, says that the files exist.

    >>> cap = Capture(lines={f"{PCI_DEVICES}0000:81:00.4/nvidia/current_vgpu_type": ["0"],
    ...     f"{PCI_DEVICES}0000:81:00.4/nvidia/creatable_vgpu_types": [
    ...         "ID    : vGPU Name", "1155  : NVIDIA L40S-8Q"]})
    >>> creatable_vgpu_types(cap, "0000:81:00.4"), creatable_vgpu_types(cap, "0000:81:00.5")
    ([VgpuType(id=1155, name='NVIDIA L40S-8Q')], None)
    """
    if current_vgpu_type(capture, address) is None:
        return None
    types = []
    for line in capture.lines.get(f"{PCI_DEVICES}{address}/nvidia/creatable_vgpu_types", []):
        type_id, _, name = line.partition(":")
        if type_id.strip().isdigit():
            types.append(VgpuType(id=int(type_id), name=name.strip()))
    return types


def is_nvswitch(function: PciFunction) -> bool:
    """An NVIDIA NVSwitch: a bridge of class "other" (``0x0680``) by NVIDIA, the crossbar of an
    HGX board's NVLink fabric, which NVIDIA's Fabric Manager programs for every GPU on it."""
    return function.vendor_id == NVIDIA and function.class_code.startswith("0x0680")
