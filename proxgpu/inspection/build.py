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
from dataclasses import dataclass

from proxgpu.errors import SysfsError, not_utf8
from proxgpu.inspection import hostfacts
from proxgpu.inspection.capture import ALIAS_LIST, Capture
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
    BootLoader,
    Gpu,
    Inventory,
    KernelModules,
    ModuleAlias,
    NumaNode,
    NvidiaCap,
    PassedOver,
    PassedOverReason,
    PciFunction,
    VirtualFunction,
)
from proxgpu.inspection.mig import in_mig_mode, mig_instances
from proxgpu.inspection.names import check_names
from proxgpu.inspection.smi import mig_uuids
from proxgpu.inspection.validate import validate
from proxgpu.kmod import MODULES_ALIAS, MODULES_BUILTIN_MODINFO, module_dir
from proxgpu.paths import (
    GUEST_FILE_PREFIXES,
    NVIDIA_GPUS,
    NVIDIA_SMI_LIST,
    NVIDIA_SMI_TABLE,
    PCI_DEVICES,
    PCI_IDS,
)
from proxgpu.pci import is_accelerator, is_bmc_display, is_gpu_accelerator

_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HEX4 = re.compile(r"^0x[0-9a-f]{4}$")


@dataclass(frozen=True)
class GpuFilter:
    """Which PCI functions count as GPUs.

    ``classes`` are prefixes of the six-digit class code without ``0x``: the default takes every
    display controller (``03``: VGA ``0300``, 3D ``0302``, other ``0380``) of any vendor, and the
    processing accelerators (``12``) that are GPUs, AMD Instinct (see
    :func:`~proxgpu.pci.is_gpu_accelerator`). ``vendors`` (four hex digits) narrows it further
    when given, and is the only way to take a processing accelerator that is not a GPU (an FPGA,
    a Gaudi): naming class ``12`` alone never puts one in the split.

    >>> mi300x = PciFunction(address="0000:05:00.0", class_code="0x120000", vendor_id="1002",
    ...                      device_id="74a1", driver="amdgpu")
    >>> fpga = mi300x.model_copy(update={"vendor_id": "10ee", "device_id": "903f", "driver": None})
    >>> GpuFilter().matches(mi300x), GpuFilter(classes=("12",)).matches(fpga)
    (True, False)
    >>> GpuFilter(vendors=("10ee",)).why_not(fpga), GpuFilter(vendors=("10de",)).why_not(mi300x)
    (None, 'filtered')
    """

    classes: tuple[str, ...] = ("03", "12")
    vendors: tuple[str, ...] | None = None

    def matches(self, function: PciFunction) -> bool:
        """Whether ``function`` is a GPU."""
        return self.why_not(function) is None

    def why_not(self, function: PciFunction) -> PassedOverReason | None:
        """Why ``function`` is not a GPU (see :class:`~proxgpu.inspection.inventory.PassedOver`),
        or ``None`` when it is one."""
        named = self.vendors is not None and function.vendor_id in self.vendors
        if (
            is_accelerator(function.class_code)
            and not named
            and not is_gpu_accelerator(function.vendor_id, function.class_code, function.driver)
        ):
            return "accelerator"
        if not self.takes_class(function.class_code) or (self.vendors is not None and not named):
            return "filtered"
        return None

    def takes_class(self, class_code: str) -> bool:
        """Whether ``class_code`` begins with one of ``classes``."""
        return class_code.removeprefix("0x").startswith(self.classes)


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
    found = _Found(_nvidia_info(capture), _nvidia_caps(capture), mdev_type_ids(capture), parents)
    gpus = _with_mig_uuids(_gpus(functions, gpu_filter, found, capture, warnings), capture, source)
    passed_over = _passed_over(functions, gpus, parents, gpu_filter)
    warnings += capture.notes
    warnings += _accelerators_left_out(passed_over, gpus, gpu_filter)
    warnings += _initramfs_warnings(capture)
    numa_nodes = _numa_nodes(capture)
    cmdline = capture.first_line("/proc/cmdline")
    hostname = capture.first_line("/proc/sys/kernel/hostname")
    if hostname is None:
        warnings.append("/proc/sys/kernel/hostname: missing; using the host's address")
    inventory = Inventory(
        source=source,
        hostname=hostname or source,
        kernel=capture.first_line("/proc/sys/kernel/osrelease"),
        pve_version=_pve_version(capture),
        boot_loader=_boot_loader(capture, cmdline),
        kernel_cmdline=cmdline,
        iommu_enabled=any(f.iommu_group is not None for f in functions.values()),
        numa_nodes=numa_nodes,
        gpus=gpus,
        passed_over=passed_over,
        nics=_nics(functions, gpus),
        nvswitches=[f for f in functions.values() if is_nvswitch(f)],
        char_majors=_char_majors(capture),
        cpu_vendor=_cpu_vendor(capture),
        driver_modules=_driver_modules(capture),
        commands=sorted(
            {p.rsplit("/", 1)[1] for p in capture.files if not p.startswith(("/dev/", "/proc/"))}
        ),
        device_nodes=sorted(p for p in capture.files if p.startswith("/dev/")),
        nvidia_driver_version=_nvidia_version(capture),
        nvidia_device_file_mode=_nvidia_param(capture, "DeviceFileMode"),
        nvidia_device_file_gid=_nvidia_param(capture, "DeviceFileGID"),
        initramfs_files=_initramfs_files(capture),
        is_root=capture.uid == 0,
        guest_configs=_texts(capture, GUEST_FILE_PREFIXES, include=True),
        host_files=_texts(capture, GUEST_FILE_PREFIXES, include=False),
        not_utf8=_not_utf8(capture),
        warnings=warnings,
        container=_container(capture),
        pve_container_version=_pve_container_version(capture),
        nvidia_caps=found.caps,
        cpu_phys_bits=hostfacts.cpu_phys_bits(capture),
        cpu_pdpe1gb=hostfacts.cpu_pdpe1gb(capture),
        secure_boot=hostfacts.secure_boot(capture),
        framebuffers=hostfacts.framebuffers(capture),
        kernel_modules=_kernel_modules(capture),
    )
    validate(inventory)
    return inventory.model_copy(update={"warnings": warnings + _topology_warnings(inventory)})


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
        gpu.model_copy(
            update={
                "mig_instances": [
                    i.model_copy(update={"uuid": uuids.get((gpu.nvidia_uuid or "", i.gi, i.ci))})
                    for i in gpu.mig_instances
                ]
            }
        )
        for gpu in gpus
    ]


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _nvidia_info(capture: Capture) -> dict[str, dict[str, str]]:
    info: dict[str, dict[str, str]] = {}
    for path, lines in capture.lines.items():
        if path.startswith(NVIDIA_GPUS) and path.endswith("/information"):
            fields = dict(_key_value(line) for line in lines if ":" in line)
            address = fields.get("Bus Location") or path[len(NVIDIA_GPUS) :].split("/")[0]
            info[address.lower()] = fields
    return info


def _key_value(line: str) -> tuple[str, str]:
    key, _, value = line.partition(":")
    return key.strip(), value.strip()


def _numa_nodes(capture: Capture) -> list[NumaNode]:
    nodes = []
    pattern = re.compile(r"^/sys/devices/system/node/node(\d+)/cpulist$")
    for path in capture.lines:
        match = pattern.match(path)
        if match:
            node = int(match.group(1))
            cpus = capture.first_line(path) or ""
            nodes.append(NumaNode(id=node, cpus=cpus, memory_kib=_node_memory(capture, node)))
    return sorted(nodes, key=lambda n: n.id)


def _node_memory(capture: Capture, node: int) -> int | None:
    for line in capture.lines.get(f"/sys/devices/system/node/node{node}/meminfo", []):
        match = re.match(r"Node \d+ MemTotal:\s+(\d+) kB", line)
        if match:
            return int(match.group(1))
    return None


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


def _pve_version(capture: Capture) -> str | None:
    text = capture.text("/usr/share/perl5/PVE/pvecfg.pm") or ""
    match = re.search(r"sub version\s*\{\s*return\s*'([^']+)'", text)
    return match.group(1) if match else None


def _boot_loader(capture: Capture, cmdline: str | None) -> BootLoader:
    # GRUB always passes BOOT_IMAGE=; systemd-boot loads the initrd from the ESP (initrd=\EFI\...).
    if cmdline and "BOOT_IMAGE=" in cmdline:
        return "grub"
    efi = "/sys/firmware/efi" in capture.dirs
    if efi and (
        "/etc/kernel/proxmox-boot-uuids" in capture.raw or "initrd=\\EFI" in (cmdline or "")
    ):
        return "systemd-boot"
    if "/etc/default/grub" in capture.raw:
        return "grub"
    return "unknown"


def _char_majors(capture: Capture) -> dict[str, int]:
    majors: dict[str, int] = {}
    in_char = False
    for line in capture.lines.get("/proc/devices", []):
        if line.strip().endswith("devices:"):
            in_char = line.strip() == "Character devices:"
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def _cpu_vendor(capture: Capture) -> str | None:
    return hostfacts.cpuinfo_field(capture, "vendor_id") or None


def _passed_over(
    functions: dict[str, PciFunction],
    gpus: list[Gpu],
    parents: dict[str, str],
    gpu_filter: GpuFilter,
) -> list[PassedOver]:
    """The display controllers and processing accelerators (and functions of the classes the
    filter names) that are no GPU's, each with why. An SR-IOV VF goes with its physical
    function, which is named instead."""
    taken = {address for gpu in gpus for address in gpu.functions}
    candidates = [
        f
        for f in functions.values()
        if f.address not in taken
        and f.address not in parents
        and (f.class_code.startswith(("0x03", "0x12")) or gpu_filter.takes_class(f.class_code))
    ]
    return [
        PassedOver(function=f, reason=reason)
        for f in candidates
        if (reason := gpu_filter.why_not(f)) is not None
    ]


def _accelerators_left_out(
    passed_over: list[PassedOver], gpus: list[Gpu], gpu_filter: GpuFilter
) -> list[str]:
    """Processing accelerators that are not GPUs (an FPGA, Habana's Gaudi): the split does not
    move them, so say how to include one: name its vendor beside those of the GPUs taken (a
    vendor filter takes no other vendor's), with class 12 when the filter leaves it out. A class
    alone never takes one: ``--gpu-class 12`` would put every FPGA of the host in the split."""
    vendors = gpu_filter.vendors or [gpu.vendor_id for gpu in gpus if not gpu.bmc_display]
    warnings = []
    for f in (p.function for p in passed_over if p.reason == "accelerator"):
        flags = [f"--gpu-vendor {vendor}" for vendor in sorted({*vendors, f.vendor_id})]
        if not gpu_filter.takes_class(f.class_code):
            flags += [f"--gpu-class {prefix}" for prefix in (*gpu_filter.classes, "12")]
        warnings.append(
            f"{f.address} ({f.name or f'{f.vendor_id}:{f.device_id}'}) is a processing "
            "accelerator (PCI class 0x12) but not a GPU (only AMD's, on amdgpu, are): left out "
            f"of the split; add {' '.join(flags)} to split it too"
        )
    return warnings


def _driver_modules(capture: Capture) -> dict[str, str]:
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


def _initramfs_files(capture: Capture) -> list[str] | None:
    found = _initramfs_lines(capture)
    if found is None or any(line.startswith(_INITRAMFS_FAILED) for line in found[1]):
        return None
    return sorted({line for line in found[1][1:] if line})


def _initramfs_warnings(capture: Capture) -> list[str]:
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


def _kernel_modules(capture: Capture) -> dict[str, KernelModules]:
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


def _container(capture: Capture) -> str | None:
    """The file that shows the capture was taken inside a container: ``/dev/.lxc-boot-id``, which
    LXC writes into the container's autodev ``/dev`` (lxc ``src/lxc/conf.c``,
    ``lxc_setup_boot_id``), or ``/run/systemd/container``, which systemd as the container's init
    writes from the ``container=lxc`` LXC puts in its environment (systemd ``src/core/main.c``,
    ``write_container_id``; lxc ``src/lxc/start.c``, ``do_start``). Neither exists on a host."""
    markers = ("/dev/.lxc-boot-id", "/run/systemd/container")
    return next((path for path in markers if path in capture.lines), None)


def _nvidia_param(capture: Capture, name: str) -> int | None:
    """A number from the nvidia driver's ``params`` file (``DeviceFileMode: 438``, decimal, as
    nv-procfs.c prints them)."""
    for line in capture.lines.get("/proc/driver/nvidia/params", []):
        key, _, value = line.partition(":")
        if key.strip() == name and value.strip().isdigit():
            return int(value.strip())
    return None


def _nvidia_version(capture: Capture) -> str | None:
    line = capture.first_line("/proc/driver/nvidia/version") or ""
    match = re.search(r"Kernel Module(?: for [\w.]+)?\s+([\d.]+)", line)
    return match.group(1) if match else None


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


def _pve_container_version(capture: Capture) -> str | None:
    """The installed pve-container's version, from its dpkg status paragraph."""
    lines = capture.lines.get("/var/lib/dpkg/status", [])
    fields = dict(_key_value(line) for line in lines if ":" in line)
    installed = fields.get("Status", "").endswith(" installed")
    return fields.get("Version") if installed and fields.get("Package") == "pve-container" else None


def _nvidia_caps(capture: Capture) -> list[NvidiaCap]:
    """The capabilities whose /proc file gives a minor and a mode (both in decimal)."""
    caps = []
    for path, lines in capture.lines.items():
        if path.startswith(("/proc/driver/nvidia/capabilities/", "/proc/driver/nvidia-nvlink/")):
            fields = dict(_key_value(line) for line in lines if ":" in line)
            minor, mode = fields.get("DeviceFileMinor", ""), fields.get("DeviceFileMode", "")
            if minor.isdigit() and mode.isdigit():
                caps.append(NvidiaCap(proc_path=path, minor=int(minor), mode=int(mode)))
    return sorted(caps, key=lambda cap: cap.minor)
