"""Boot-time binding by PCI address: the modprobe.d hook (with the initramfs hook) or driverctl,
the modules to load, and the refusal of settings that would take the kept GPUs away at boot."""

from __future__ import annotations

import re

from proxgpu.errors import RenderError
from proxgpu.inspection.inventory import PciFunction
from proxgpu.paths import (
    BIND_SCRIPT,
    DRIVERCTL_DIR,
    GRUB_DEFAULT,
    INITRAMFS_HOOK,
    KERNEL_CMDLINE,
    MODPROBE_CONF,
    MODULES_LOAD,
)
from proxgpu.pci import host_modules
from proxgpu.rendering.context import RenderContext, functions_by_address, role_functions
from proxgpu.rendering.templating import render_template


def _conflicts_in_line(words: list[str], ids: set[str], modules: set[str]) -> str | None:
    """Why a modprobe.d line or kernel parameter would take a kept function away, if it does."""
    for word in words:
        name, _, value = word.partition("=")
        if name.replace("_", "-") in ("ids", "vfio-pci.ids"):
            taken = sorted(ids & {i[:9].lower() for i in value.split(",")})
            if taken and (
                name != "ids" or words[:2] in (["options", "vfio-pci"], ["options", "vfio_pci"])
            ):
                return f"vfio-pci would take every {', '.join(taken)} device, the kept ones too"
        if name == "modprobe.blacklist" and modules & set(value.split(",")):
            return f"{', '.join(sorted(modules & set(value.split(','))))} would never load"
    if words[:1] == ["blacklist"] and words[1:2] and words[1] in modules:
        return f"{words[1]} would not load by itself at boot"
    return None


def refuse_conflicting_binding(ctx: RenderContext) -> None:
    kept = role_functions(ctx, "host")
    ids = {f"{f.vendor_id}:{f.device_id}" for f in kept}
    modules = {m for f in kept for m in host_modules(f.vendor_id, f.class_code)[:1]}
    modules |= {
        ctx.inventory.driver_modules[f.driver]
        for f in kept
        if f.driver in ctx.inventory.driver_modules
    }
    sources = {
        p: t
        for p, t in ctx.inventory.host_files.items()
        if p.startswith("/etc/modprobe.d/") and p != MODPROBE_CONF
    }
    sources["/proc/cmdline"] = ctx.inventory.kernel_cmdline or ""
    for path in (KERNEL_CMDLINE, GRUB_DEFAULT):
        sources[path] = ctx.inventory.host_files.get(path, "")
    problems = []
    for path, text in sorted(sources.items()):
        for number, line in enumerate(text.splitlines(), 1):
            reason = _conflicts_in_line(line.split("#", 1)[0].split(), ids, modules)
            if reason:
                problems.append(f"  - {path}:{number}: {line.strip()}: {reason}")
    if problems:
        raise RenderError(
            ctx.inventory.source,
            None,
            "these settings would take the GPUs the plan keeps away from their driver at boot:\n"
            + "\n".join(problems),
            "remove them (proxgpu binds to vfio-pci by PCI address)",
        )
    for function in kept:
        if function.driver_override not in (None, function.driver):
            ctx.warnings.append(
                f"{function.address}: driver_override is {function.driver_override} until the "
                "next boot, so it cannot return to its driver before then"
            )


def refuse_shadowed_hook(ctx: RenderContext, modules: list[str]) -> None:
    """kmod runs only the first ``install`` command for a module, taking modprobe.d files in the
    order of their names: an earlier ``install vfio-pci`` would run instead of our hook, so the
    overrides would never be written. An ``install`` line for a driver that the softdep puts
    vfio-pci before still runs, but it is reported: it may load the driver in its own way."""
    ours = MODPROBE_CONF.rsplit("/", 1)[1]
    problems = []
    for path, text in sorted(ctx.inventory.host_files.items()):
        if not path.startswith("/etc/modprobe.d/") or path == MODPROBE_CONF:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if len(words) < 3 or words[0] != "install":
                continue
            module = words[1].replace("-", "_")
            where = f"{path}:{number}: {line.strip()}"
            if module == "vfio_pci" and path.rsplit("/", 1)[1] < ours:
                problems.append(f"  - {where}: runs instead of proxgpu's hook in {MODPROBE_CONF}")
            elif module == "vfio_pci":
                ctx.warnings.append(f"{where}: no longer runs (proxgpu's hook comes first)")
            elif module in {m.replace("-", "_") for m in modules}:
                ctx.warnings.append(
                    f"{where}: runs whenever {words[1]} loads; vfio-pci still loads before it, "
                    "but check that the command does not bind the vfio GPUs itself"
                )
    if problems:
        raise RenderError(
            ctx.inventory.source,
            None,
            "an install command for vfio-pci comes before proxgpu's, so the GPUs would never be "
            "marked for vfio-pci:\n" + "\n".join(problems),
            "remove it or use --bind-method driverctl",
        )


def _softdep_modules(ctx: RenderContext, functions: list[PciFunction]) -> list[str]:
    modules: set[str] = set()
    for function in functions:
        # The modules that would claim it by its IDs, even when it sits on vfio-pci today.
        modules.update(host_modules(function.vendor_id, function.class_code))
        if function.driver and function.driver != "vfio-pci":
            module = ctx.inventory.driver_modules.get(function.driver)
            if module is None:
                ctx.warnings.append(
                    f"{function.address}: driver {function.driver} is built into the kernel, so "
                    "no boot-time binding can run before it; bind this device with --live"
                )
            else:
                modules.add(module)
    # A function already on vfio-pci no longer shows the driver it had: keep what we wrote then.
    previous = ctx.inventory.host_files.get(MODPROBE_CONF, "")
    modules.update(re.findall(r"^softdep (\S+) pre: vfio-pci$", previous, re.MULTILINE))
    return sorted(modules)


def render_binding(ctx: RenderContext) -> None:
    functions = role_functions(ctx, "vfio")
    addresses = [f.address for f in functions]
    modprobe = bool(functions) and ctx.options.bind_method == "modprobe"
    modules = _softdep_modules(ctx, functions) if modprobe else []
    if modprobe:
        refuse_shadowed_hook(ctx, modules)
    ctx.file(
        MODPROBE_CONF,
        render_template(
            "modprobe-vfio.conf.j2",
            functions=addresses,
            bind_script=BIND_SCRIPT,
            modules=modules,
        )
        if modprobe
        else None,
        "load vfio-pci first and bind by PCI address",
    )
    ctx.file(
        BIND_SCRIPT,
        render_template(
            "vfio-bind.sh.j2",
            functions=addresses,
            modprobe_conf=MODPROBE_CONF,
        )
        if modprobe
        else None,
        "mark the vfio functions' driver_override",
        mode=0o755,
    )
    ctx.file(
        INITRAMFS_HOOK,
        render_template(
            "initramfs-hook.sh.j2",
            bind_script=BIND_SCRIPT,
            modules=_vfio_modules(ctx.inventory.kernel),
        )
        if modprobe
        else None,
        "carry the bind script into the initramfs",
        mode=0o755,
    )
    ctx.file(
        MODULES_LOAD,
        render_template(
            "modules-load-vfio.conf.j2",
            modules=_vfio_modules(ctx.inventory.kernel),
        )
        if functions
        else None,
        "load the vfio modules at boot",
    )
    _render_driverctl(ctx, addresses if ctx.options.bind_method == "driverctl" else [])


def _render_driverctl(ctx: RenderContext, addresses: list[str]) -> None:
    if addresses and "driverctl" not in ctx.inventory.commands:
        ctx.warnings.append("driverctl is not installed on the host: apt install driverctl")
    ours = render_template("driverctl-override.j2", driver="vfio-pci")
    stale = [
        path[len(DRIVERCTL_DIR) + 4 :]
        for path, text in ctx.inventory.host_files.items()
        if path.startswith(DRIVERCTL_DIR + "pci-") and text == ours
    ]
    known = functions_by_address(ctx.inventory)
    for address in sorted(set(addresses) | {a for a in stale if a in known}):
        wanted = ours if address in addresses else None
        ctx.file(f"{DRIVERCTL_DIR}pci-{address}", wanted, "driverctl override for vfio-pci")


def _vfio_modules(kernel: str | None) -> list[str]:
    modules = ["vfio", "vfio_iommu_type1", "vfio_pci"]
    # vfio_virqfd became part of vfio in kernel 6.2.
    if kernel and _kernel_version(kernel) < (6, 2):
        modules.append("vfio_virqfd")
    return modules


def _kernel_version(kernel: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", kernel)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)
