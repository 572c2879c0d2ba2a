"""Turn what a host's files say into an :class:`~proxgpu.inspection.inventory.Inventory`.

:func:`build_inventory` is pure: the same capture always gives the same inventory, so it is tested
on captured trees without any host.

>>> from proxgpu.inspection.capture import parse_gather_output
>>> build_inventory(parse_gather_output(b""), "empty", GpuFilter())
Traceback (most recent call last):
...
proxgpu.errors.SysfsError: empty: /sys/bus/pci/devices/: no PCI devices found; name the root of a \
Linux host's file system, or a tree `proxgpu snapshot` wrote
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace

from proxgpu.errors import SysfsError, not_utf8
from proxgpu.inspection import hostfacts
from proxgpu.inspection.capture import Capture
from proxgpu.inspection.hardware import (
    creatable_vgpu_types,
    current_vgpu_type,
    drm_nodes,
    gpu_bars,
    gpu_bars64,
    is_nvswitch,
    mdev_type_ids,
    mdev_types,
    reads_reset_methods,
    reset_methods,
)
from proxgpu.inspection.inventory import (
    Gpu,
    Inventory,
    NvidiaCap,
    PciFunction,
    VirtualFunction,
)
from proxgpu.inspection.kernel import (
    driver_modules,
    initramfs_files,
    initramfs_warnings,
    kernel_modules,
)
from proxgpu.inspection.mig import in_mig_mode, mig_instances
from proxgpu.inspection.names import check_names
from proxgpu.inspection.nvidia import (
    char_majors,
    nvidia_caps,
    nvidia_info,
    nvidia_param,
    nvidia_version,
)
from proxgpu.inspection.recognition import GpuFilter, accelerators_left_out, passed_over
from proxgpu.inspection.smi import mig_uuids
from proxgpu.inspection.validate import validate
from proxgpu.paths import (
    GUEST_FILE_PREFIXES,
    NVIDIA_GPUS,
    NVIDIA_SMI_LIST,
    NVIDIA_SMI_TABLE,
    PCI_DEVICES,
    PCI_IDS,
)
from proxgpu.pci import is_bmc_display

_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HEX4 = re.compile(r"^0x[0-9a-f]{4}$")


@dataclass(frozen=True)
class _Found:
    """What the capture says of every GPU, looked up once for all of them: each GPU's nvidia
    ``information`` (by address), the NVIDIA capabilities (each GPU's MIG instances are among
    them), the mediated device types each function offers, and each SR-IOV virtual function's
    physical function (VF -> PF)."""

    nvidia: dict[str, dict[str, str]]
    caps: list[NvidiaCap]
    mdev_ids: dict[str, list[str]]
    parents: dict[str, str]


def build_inventory(capture: Capture, source: str, gpu_filter: GpuFilter) -> Inventory:
    """Interpret a capture. Pure: the same capture always gives the same inventory.

    :raises SysfsError: when the PCI tree is missing, or a file says what cannot be (see
        :mod:`~proxgpu.inspection.validate` and :mod:`~proxgpu.inspection.names`).
    """
    check_names(capture, source)
    warnings: list[str] = [f"{path}: cannot read (run as root)" for path in capture.unreadable]
    warnings += [
        f"{path!r}: skipped, a file name with a newline or tab" for path in capture.bad_names
    ]
    warnings += [
        f"{path}: skipped, it leads out of the tree (to {target}) through a symlink"
        for path, target in capture.outside.items()
    ]
    names = _pci_names(capture)
    functions = _pci_functions(capture, source, names, warnings)
    parents = _sriov_parents(capture, source, functions)
    found = _Found(nvidia_info(capture), nvidia_caps(capture), mdev_type_ids(capture), parents)
    gpus = _with_mig_uuids(_gpus(functions, gpu_filter, found, capture, warnings), capture, source)
    passed = passed_over(functions, gpus, parents, gpu_filter)
    warnings += capture.notes
    warnings += accelerators_left_out(passed, gpus, gpu_filter)
    warnings += initramfs_warnings(capture)
    numa_nodes = hostfacts.numa_nodes(capture)
    cmdline = capture.first_line("/proc/cmdline")
    hostname = capture.first_line("/proc/sys/kernel/hostname")
    if hostname is None:
        warnings.append("/proc/sys/kernel/hostname: missing; using the host's address")
    inventory = Inventory(
        source=source,
        hostname=hostname or source,
        kernel=capture.first_line("/proc/sys/kernel/osrelease"),
        pve_version=hostfacts.pve_version(capture),
        boot_loader=hostfacts.boot_loader(capture, cmdline),
        kernel_cmdline=cmdline,
        iommu_enabled=any(f.iommu_group is not None for f in functions.values()),
        numa_nodes=numa_nodes,
        gpus=gpus,
        passed_over=passed,
        nics=_nics(functions, gpus),
        nvswitches=[f for f in functions.values() if is_nvswitch(f)],
        char_majors=char_majors(capture),
        cpu_vendor=hostfacts.cpu_vendor(capture),
        driver_modules=driver_modules(capture),
        commands=sorted(
            {p.rsplit("/", 1)[1] for p in capture.files if not p.startswith(("/dev/", "/proc/"))}
        ),
        device_nodes=sorted(p for p in capture.files if p.startswith("/dev/")),
        nvidia_driver_version=nvidia_version(capture),
        nvidia_device_file_mode=nvidia_param(capture, "DeviceFileMode"),
        nvidia_device_file_gid=nvidia_param(capture, "DeviceFileGID"),
        initramfs_files=initramfs_files(capture),
        is_root=capture.uid == 0,
        guest_configs=_texts(capture, GUEST_FILE_PREFIXES, include=True),
        host_files=_texts(capture, GUEST_FILE_PREFIXES, include=False),
        not_utf8=_not_utf8(capture),
        warnings=warnings,
        container=hostfacts.container_marker(capture),
        pve_container_version=hostfacts.pve_container_version(capture),
        nvidia_caps=found.caps,
        cpu_phys_bits=hostfacts.cpu_phys_bits(capture),
        cpu_pdpe1gb=hostfacts.cpu_pdpe1gb(capture),
        secure_boot=hostfacts.secure_boot(capture),
        framebuffers=hostfacts.framebuffers(capture),
        kernel_modules=kernel_modules(capture),
    )
    validate(inventory)
    return replace(inventory, warnings=warnings + _topology_warnings(inventory))


def _attr(capture: Capture, address: str, name: str) -> str | None:
    return capture.first_line(f"{PCI_DEVICES}{address}/{name}")


def _link_name(capture: Capture, address: str, name: str) -> str | None:
    target = capture.links.get(f"{PCI_DEVICES}{address}/{name}")
    return target.rstrip("/").rsplit("/", 1)[-1] if target else None


def _pci_addresses(capture: Capture, source: str) -> list[str]:
    addresses = {
        path[len(PCI_DEVICES) :].split("/", 1)[0]
        for path in [*capture.lines, *capture.links]
        if path.startswith(PCI_DEVICES)
    }
    if not addresses:
        raise SysfsError(
            source,
            PCI_DEVICES,
            "no PCI devices found",
            "name the root of a Linux host's file system, or a tree `proxgpu snapshot` wrote",
        )
    return sorted(a for a in addresses if _ADDRESS.match(a))


def _pci_functions(
    capture: Capture, source: str, names: dict[str, str], warnings: list[str]
) -> dict[str, PciFunction]:
    functions: dict[str, PciFunction] = {}
    resets = reads_reset_methods(capture)
    for address in _pci_addresses(capture, source):
        ids = {key: _attr(capture, address, key) for key in ("class", "vendor", "device")}
        missing = [key for key, value in ids.items() if value is None or not value.startswith("0x")]
        if missing:
            warnings.append(
                f"{PCI_DEVICES}{address}/{missing[0]}: missing or unparsable; device skipped"
            )
            continue
        vendor, device = _hex4(ids["vendor"]), _hex4(ids["device"])
        functions[address] = PciFunction(
            address=address,
            class_code=str(ids["class"]),
            vendor_id=vendor,
            device_id=device,
            subsystem_vendor_id=_opt_hex4(_attr(capture, address, "subsystem_vendor")),
            subsystem_device_id=_opt_hex4(_attr(capture, address, "subsystem_device")),
            name=names.get(vendor + device),
            driver=_link_name(capture, address, "driver"),
            driver_override=_override(_attr(capture, address, "driver_override")),
            numa_node=_numa(capture, source, address),
            iommu_group=_group(_link_name(capture, address, "iommu_group")),
            is_bridge=f"{PCI_DEVICES}{address}/pci_bus" in capture.dirs,
            pci_path=_pci_path(capture, address),
            reset_methods=reset_methods(capture, address, resets),
            modalias=_attr(capture, address, "modalias"),
        )
    return functions


def _sriov_parents(
    capture: Capture, source: str, functions: dict[str, PciFunction]
) -> dict[str, str]:
    """Each SR-IOV virtual function's physical function, from its ``physfn`` link (VF -> PF).

    :raises SysfsError: when a link names a function the host does not have, or one that is
        itself a VF: the kernel links a VF to its physical function only.
    """
    parents = {
        address: parent
        for address in functions
        if (parent := _link_name(capture, address, "physfn")) is not None
    }
    for address, parent in sorted(parents.items()):
        path = f"{PCI_DEVICES}{address}/physfn"
        if parent not in functions:
            raise SysfsError(
                source,
                path,
                f"names {parent}, which is not among the host's PCI functions: refusing the "
                "host's data",
            )
        if parent in parents:
            raise SysfsError(
                source,
                path,
                f"names {parent}, which is itself a virtual function: the kernel links a VF "
                "to its physical function only; refusing the host's data",
            )
    return parents


def _pci_path(capture: Capture, address: str) -> list[str] | None:
    """The bridges above ``address``, root port first, from its entry's link into
    ``/sys/devices/pci0000:00/...``; ``None`` when the capture holds no such link."""
    target = capture.links.get(f"{PCI_DEVICES}{address}")
    if target is None:
        return None
    parts = target.rstrip("/").split("/")
    if not parts or parts[-1] != address:
        return None
    return [part for part in parts[:-1] if _ADDRESS.match(part)]


def _nics(functions: dict[str, PciFunction], gpus: list[Gpu]) -> list[PciFunction]:
    # Same root port as a GPU: behind one switch with it, so traffic between them stays off the
    # host bridge (nvidia-smi topo's PIX/PXB).
    ports = {gpu.pci_path[0] for gpu in gpus if gpu.pci_path}
    return [
        function
        for function in functions.values()
        if function.class_code.startswith("0x02")
        and function.pci_path
        and function.pci_path[0] in ports
    ]


def _hex4(value: str | None) -> str:
    return (value or "").removeprefix("0x").lower()


def _opt_hex4(value: str | None) -> str | None:
    return _hex4(value) if value and _HEX4.match(value.lower()) else None


def _override(value: str | None) -> str | None:
    return None if value in (None, "", "(null)") else value


def _group(name: str | None) -> int | None:
    return int(name) if name and name.isdigit() else None


def _numa(capture: Capture, source: str, address: str) -> int | None:
    value = _attr(capture, address, "numa_node")
    if value is None:
        return None
    try:
        node = int(value)
    except ValueError:
        raise SysfsError(
            source, f"{PCI_DEVICES}{address}/numa_node", f"not a number: {value!r}"
        ) from None
    # -1 means the firmware gave no proximity information: unknown, not node 0.
    return node if node >= 0 else None


def _gpus(
    functions: dict[str, PciFunction],
    gpu_filter: GpuFilter,
    found: _Found,
    capture: Capture,
    warnings: list[str],
) -> list[Gpu]:
    by_slot: dict[str, list[PciFunction]] = defaultdict(list)
    vfs_of: dict[str, list[PciFunction]] = defaultdict(list)
    for function in functions.values():
        # A VF is a part of its GPU, never a function that moves with its slot's.
        if function.address in found.parents:
            vfs_of[found.parents[function.address]].append(function)
        else:
            by_slot[function.slot].append(function)
    by_group: dict[int, list[PciFunction]] = defaultdict(list)
    for function in functions.values():
        if function.iommu_group is not None:
            by_group[function.iommu_group].append(function)
    gpus = []
    for slot in sorted(by_slot):
        display = [f for f in by_slot[slot] if gpu_filter.matches(f)]
        if display:
            gpus.append(
                _gpu(
                    display[0],
                    slot_functions=by_slot[slot],
                    vfs=vfs_of.get(display[0].address, []),
                    by_group=by_group,
                    found=found,
                    capture=capture,
                    warnings=warnings,
                )
            )
    return gpus


def _gpu(
    main: PciFunction,
    *,
    slot_functions: list[PciFunction],
    vfs: list[PciFunction],
    by_group: dict[int, list[PciFunction]],
    found: _Found,
    capture: Capture,
    warnings: list[str],
) -> Gpu:
    ordered = [main] + [f for f in slot_functions if f is not main]
    own = {f.address for f in [*ordered, *vfs]}
    peers = (
        [f for f in by_group.get(main.iommu_group, []) if f.address not in own]
        if (main.iommu_group is not None)
        else []
    )
    info = found.nvidia.get(main.address, {})
    if main.driver == "nvidia" and not info:
        warnings.append(f"{NVIDIA_GPUS}{main.address}/information: missing; Device Minor unknown")
    if _attr(capture, main.address, "numa_node") is None:
        # Not the firmware's -1 but no file at all (an old kernel, a damaged snapshot).
        warnings.append(f"{PCI_DEVICES}{main.address}/numa_node: missing; NUMA node unknown")
    return Gpu(
        address=main.address,
        vendor_id=main.vendor_id,
        device_id=main.device_id,
        subsystem_vendor_id=main.subsystem_vendor_id,
        subsystem_device_id=main.subsystem_device_id,
        class_code=main.class_code,
        model=info.get("Model") or main.name,
        numa_node=main.numa_node,
        local_cpus=_attr(capture, main.address, "local_cpulist"),
        iommu_group=main.iommu_group,
        driver=main.driver,
        driver_override=main.driver_override,
        boot_vga=_attr(capture, main.address, "boot_vga") == "1",
        functions=[f.address for f in ordered],
        function_info=ordered,
        iommu_group_peers=peers,
        nvidia_minor=(minor := _int_or_none(info.get("Device Minor"))),
        nvidia_uuid=info.get("GPU UUID"),
        pci_path=main.pci_path,
        bar_bytes=gpu_bars(capture, main.address),
        drm_nodes=drm_nodes(capture, main.address),
        bmc_display=is_bmc_display(main.vendor_id, main.device_id),
        bar64_bytes=gpu_bars64(capture, main.address),
        mdev_types=mdev_types(capture, main.address, found.mdev_ids.get(main.address, [])),
        mig_instances=mig_instances(found.caps, minor),
        mig_mode=in_mig_mode(found.caps, minor),
        virtual_functions=[_virtual_function(capture, vf, found) for vf in vfs],
    )


def _virtual_function(capture: Capture, function: PciFunction, found: _Found) -> VirtualFunction:
    """An SR-IOV VF of a GPU with the vGPU types it offers, either way NVIDIA's driver shows
    them (see :class:`~proxgpu.inspection.inventory.VirtualFunction`)."""
    address = function.address
    return VirtualFunction(
        address=address,
        driver=function.driver,
        iommu_group=function.iommu_group,
        mdev_types=mdev_types(capture, address, found.mdev_ids.get(address, [])),
        creatable_vgpu_types=creatable_vgpu_types(capture, address),
        current_vgpu_type=current_vgpu_type(capture, address),
    )


def _with_mig_uuids(gpus: list[Gpu], capture: Capture, source: str) -> list[Gpu]:
    """The GPUs with their MIG devices' UUIDs, where nvidia-smi's outputs, as captured, name
    them (see :mod:`~proxgpu.inspection.smi`); found by the GPU's UUID, never its index."""
    listing, table = capture.text(NVIDIA_SMI_LIST), capture.text(NVIDIA_SMI_TABLE)
    if listing is None or table is None:
        return gpus
    uuids = mig_uuids(listing, table, source)
    return [
        replace(
            gpu,
            mig_instances=[
                replace(i, uuid=uuids.get((gpu.nvidia_uuid or "", i.gi, i.ci)))
                for i in gpu.mig_instances
            ],
        )
        for gpu in gpus
    ]


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _pci_names(capture: Capture) -> dict[str, str]:
    names: dict[str, str] = {}
    for path in PCI_IDS:
        vendor, vendor_name = "", ""
        for line in capture.lines.get(path, []):
            if line[:1] not in ("\t", "#") and len(line) > 6:
                vendor, vendor_name = line[:4], _short_vendor(line[6:])
            elif line.startswith("\t") and not line.startswith("\t\t") and vendor:
                names.setdefault(vendor + line[1:5], f"{vendor_name} {line[7:]}".strip())
    return names


def _short_vendor(name: str) -> str:
    for long, short in (("NVIDIA Corporation", "NVIDIA"), ("Advanced Micro Devices, Inc.", "AMD")):
        if name.startswith(long):
            return short
    return name.split(" Corporation", maxsplit=1)[0].split(",", maxsplit=1)[0]


def _texts(capture: Capture, prefixes: tuple[str, ...], include: bool) -> dict[str, str]:
    return {
        path: data.decode("utf-8", "replace")
        for path, data in sorted(capture.raw.items())
        # EFI variables are binary facts (Secure Boot), not files a split edits.
        if path.startswith(prefixes) == include and not path.startswith("/sys/")
    }


def _not_utf8(capture: Capture) -> dict[str, str]:
    """The files read as text (see :func:`_texts`) that are not UTF-8, with where."""
    found = {
        path: not_utf8(data)
        for path, data in sorted(capture.raw.items())
        if not path.startswith("/sys/")
    }
    return {path: fault for path, fault in found.items() if fault is not None}


def _topology_warnings(inventory: Inventory) -> list[str]:
    warnings = []
    if inventory.gpus and not inventory.iommu_enabled:
        warnings.append("IOMMU is off: no IOMMU groups, so no GPU can be passed to a VM yet")
    unknown = [g.address for g in inventory.gpus if g.numa_node is None]
    if unknown:
        warnings.append(
            f"NUMA node unknown (numa_node -1 or missing) for {', '.join(unknown)}: "
            "assign these GPUs explicitly when planning"
        )
    for gpu in inventory.gpus:
        busy = [p.address for p in gpu.iommu_group_peers if not p.is_bridge]
        if busy:
            warnings.append(
                f"{gpu.address}: shares IOMMU group {gpu.iommu_group} with {', '.join(busy)}; "
                "they can only be passed through together"
            )
    return warnings
