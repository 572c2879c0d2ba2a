"""Human-readable text of an inventory: GPUs grouped by NUMA node (plans are in
:mod:`~proxgpu.cli.plan_text`, so that ``inspect`` loads neither the planner nor the renderer).

>>> print(table([["A", "BB"], ["ccc", "d"]]))
A    BB
ccc  d
"""

from __future__ import annotations

from collections.abc import Sequence

from proxgpu.inspection.claiming import claimants
from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.kmod import KmodConfig, module_of
from proxgpu.paths import BIND_SCRIPT_NAME, MODPROBE_CONF_NAME


def table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Align ``rows`` in columns two spaces apart; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent
        + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _gib(kib: int | None) -> str:
    return f"{kib / 1048576:.0f} GiB" if kib else "? GiB"


def _gpu_row(gpu: Gpu) -> list[str]:
    others = [f".{f.address.rsplit('.', 1)[1]} {f.driver or '-'}" for f in gpu.function_info[1:]]
    peers = [p.address for p in gpu.iommu_group_peers if not p.is_bridge]
    bridges = len(gpu.iommu_group_peers) - len(peers)
    if bridges:
        peers.append(f"{bridges} bridge{'s' if bridges > 1 else ''}")
    return [
        gpu.address,
        gpu.label,
        gpu.driver or "-",
        "-" if gpu.nvidia_minor is None else f"/dev/nvidia{gpu.nvidia_minor}",
        "-" if gpu.iommu_group is None else str(gpu.iommu_group),
        ", ".join(others + ([f"group shared with {', '.join(peers)}"] if peers else [])) or "-",
    ]


def _gpu_details(gpu: Gpu) -> str:
    """The facts the table has no room for, one line per GPU."""
    facts = [
        f"{gpu.vendor_id}:{gpu.device_id}",
        f"local CPUs {gpu.local_cpus or '?'}",
        f"driver_override {gpu.driver_override or '-'}",
    ]
    if gpu.bar_bytes:
        facts.append(f"largest BAR {_size(max(gpu.bar_bytes))}")
    if gpu.drm_nodes:
        facts.append(" ".join(f"/dev/dri/{node}" for node in gpu.drm_nodes))
    if gpu.nvidia_uuid:
        facts.append(gpu.nvidia_uuid)
    if gpu.mig_mode:
        devices = [f"GI {i.gi} CI {i.ci} {i.uuid or '(UUID unknown)'}" for i in gpu.mig_instances]
        facts.append(f"MIG mode: {', '.join(devices) or 'no compute instance'}")
    if said := gpu.virtual_functions_said:
        facts.append(said)
    if gpu.bmc_display:
        facts.append("BMC display (the board's remote console): never planned unless named")
    return f"    {gpu.address}  " + ", ".join(facts)


def _size(size: int) -> str:
    return f"{size / 2**30:g} GiB" if size >= 2**30 else f"{size / 2**20:g} MiB"


def _boot_loading(inv: Inventory) -> list[str]:
    """What decides which driver takes a GPU at boot: for each module that drives one of its
    functions or would claim one by its IDs (nouveau for an NVIDIA GPU, snd_hda_intel for its
    audio), the softdep line kmod uses, any ``install`` command and blacklist line for it; and
    what the running kernel's initramfs holds."""
    config = KmodConfig.of(inv.host_files, inv.kernel)
    modules, said = _claiming_modules(inv)
    lines = []
    for module in modules:
        line = config.softdep(module)
        used = f"{line.where}: {line.text}" if line else "none"
        lines.append(f"softdep kmod uses for {module}: {used}")
        install = config.install(module)
        if install is not None:
            lines.append(f"install command for {module}: {install.where}: {install.text}")
        lines += [
            f"blacklisted {module}: {found.where}"
            for found in config.lines("blacklist")
            if found.matches(module)
        ]
    lines += said
    if inv.initramfs_files is None:
        lines.append(f"initramfs of {inv.kernel or '?'}: not read")
    else:
        inside = sorted({m for f in inv.initramfs_files if (m := module_of(f)) in modules})
        lines.append(
            f"initramfs of {inv.kernel}: GPU drivers {', '.join(inside) or 'none'}; "
            f"proxgpu's binding {_binding_in(inv.initramfs_files)}"
        )
    return lines


def _binding_in(files: list[str]) -> str:
    """Whether an initramfs holds proxgpu's binding: both its files, as the plan asks
    (:func:`~proxgpu.rendering.binding.initramfs_lacks_binding`), or which one of them.

    >>> _binding_in(["00-proxgpu-vfio.conf", "nvidia.ko"])
    'partly in it (00-proxgpu-vfio.conf, not proxgpu-vfio-bind)'
    """
    parts = (MODPROBE_CONF_NAME, BIND_SCRIPT_NAME)
    have = [name for name in parts if name in files]
    if len(have) == len(parts):
        return "in it"
    if not have:
        return "not in it"
    return f"partly in it ({have[0]}, not {next(p for p in parts if p not in have)})"


def _claiming_modules(inv: Inventory) -> tuple[list[str], list[str]]:
    """The modules that could take a GPU's function (:func:`claimants`), and lines telling the
    built-in ones and the functions whose modules come from proxgpu's table."""
    modules: set[str] = set()
    said: list[str] = []
    guessed = []
    for function in (f for gpu in inv.gpus for f in gpu.function_info):
        found = claimants(inv, function)
        modules.update(found.modules)
        guessed += [function.address] if found.guessed else []
        said += [
            f"built into {built.kernel or 'the kernel'}: {built.module} (takes {function.address})"
            for built in found.built_in
        ]
    if guessed:
        said.append(
            f"modalias or modules.alias not read for {', '.join(guessed)}: the modules above "
            "for them are proxgpu's list for their vendor and class"
        )
    return sorted(modules), said


def render_inventory(inv: Inventory) -> str:
    """The inventory as a sysadmin reads it at a glance."""
    lines = [inv.summary, f"Kernel command line: {inv.kernel_cmdline or '?'}", ""]
    header = ["ADDRESS", "MODEL", "DRIVER", "DEVICE", "IOMMU", "OTHER FUNCTIONS"]
    groups: list[tuple[str, list[Gpu]]] = [
        (
            f"NUMA node {n.id}: CPUs {n.cpus}, {_gib(n.memory_kib)}",
            [g for g in inv.gpus if g.numa_node == n.id],
        )
        for n in inv.numa_nodes
    ]
    unknown = [g for g in inv.gpus if g.numa_node is None]
    if unknown:
        groups.append(("NUMA node unknown (firmware reports -1)", unknown))
    for title, gpus in groups:
        lines.append(f"{title}: {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}")
        if gpus:
            lines.append(table([header, *(_gpu_row(g) for g in gpus)], indent="  "))
            lines += [_gpu_details(g) for g in gpus]
        lines.append("")
    uvm = inv.char_majors.get("nvidia-uvm")
    if uvm is not None:
        lines.append(
            f"nvidia-uvm major {uvm}, nvidia-caps major {inv.char_majors.get('nvidia-caps', '-')}"
        )
    if inv.nvswitches:
        lines.append(
            f"NVSwitches (one NVLink fabric): {', '.join(f.address for f in inv.nvswitches)}"
        )
    lines += _boot_loading(inv)
    if inv.pve_container_version:
        lines.append(f"pve-container {inv.pve_container_version}")
    for cap in inv.nvidia_caps:
        lines.append(f"NVIDIA capability {cap.proc_path}: minor {cap.minor}, mode {cap.mode:04o}")
    lines.append(f"Guest configs: {len(inv.guest_configs)}, host files read: {len(inv.host_files)}")
    if inv.warnings:
        lines += ["", "Warnings:", *(f"  - {w}" for w in inv.warnings)]
    return "\n".join(lines)
