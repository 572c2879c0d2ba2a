"""What on a host would undo the boot-time binding, and is refused or said before anything is
written: settings that take the GPUs the plan keeps away from their driver at boot (a vfio-pci
``ids=``, a blacklist of their module, in modprobe.d or on a kernel command line), and an
``install`` command that would run instead of proxgpu's hook. The host's kmod config is read
without proxgpu's own files (:func:`theirs`)."""

from __future__ import annotations

from proxgpu.errors import RenderError
from proxgpu.inspection.inventory import Inventory
from proxgpu.kmod import ConfigLine, KmodConfig, normalize
from proxgpu.paths import (
    GRUB_DEFAULT,
    KERNEL_CMDLINE,
    LEGACY_MODPROBE_CONF,
    MODPROBE_CONF,
    MODPROBE_CONF_NAME,
)
from proxgpu.planning.model import Plan
from proxgpu.rendering.context import RenderContext, role_functions

#: proxgpu's own modprobe.d files, now and as earlier versions named it.
OURS = frozenset({MODPROBE_CONF, LEGACY_MODPROBE_CONF})


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


def binding_conflicts(inventory: Inventory, plan: Plan) -> list[str]:
    """The settings that would keep the GPUs ``plan`` keeps from their driver at boot, one line
    each (``PATH:LINE: text: why``): ``ids=`` for vfio-pci that names their IDs, a blacklist of
    the module that drives them, in any modprobe.d file kmod reads, the kernel command line or
    the boot loader's.

    >>> binding_conflicts(Inventory(source="t", hostname="t"),
    ...                   Plan(groups=[], warnings=[], tensor_parallel=[]))
    []
    """
    known = inventory.gpu_functions
    addresses = {a for g in plan.groups if not g.role.moves_to_vfio for a in g.functions}
    kept = [known[a] for a in sorted(addresses) if a in known and not known[a].is_bridge]
    ids = {f"{f.vendor_id}:{f.device_id}" for f in kept}
    # The module that drives each after the boot; a blacklist of another that could claim it
    # (nouveau beside nvidia) takes nothing away.
    modules = {m for f in kept if (m := inventory.host_module(f)) is not None}
    sources = dict(theirs(inventory).files)
    sources["/proc/cmdline"] = inventory.kernel_cmdline or ""
    for path in (KERNEL_CMDLINE, GRUB_DEFAULT):
        sources[path] = inventory.host_files.get(path, "")
    problems = []
    for path, text in sorted(sources.items()):
        for number, line in enumerate(text.splitlines(), 1):
            reason = _conflicts_in_line(line.split("#", 1)[0].split(), ids, modules)
            if reason:
                problems.append(f"{path}:{number}: {line.strip()}: {reason}")
    return problems


def refuse_conflicting_binding(ctx: RenderContext) -> None:
    """Refuse the settings :func:`binding_conflicts` finds; warn of a kept function whose
    driver_override holds it elsewhere until the next boot."""
    problems = binding_conflicts(ctx.inventory, ctx.plan)
    if problems:
        raise RenderError(
            ctx.inventory.source,
            None,
            "these settings would take the GPUs the plan keeps away from their driver at boot:\n"
            + "\n".join(f"  - {line}" for line in problems),
            "remove them (proxgpu binds to vfio-pci by PCI address)",
        )
    for function in role_functions(ctx, to_vfio=False):
        if function.driver_override not in (None, function.driver):
            ctx.warnings.append(
                f"{function.address}: driver_override is {function.driver_override} until the "
                "next boot, so it cannot return to its driver before then"
            )


def refuse_shadowed_hook(ctx: RenderContext, modules: list[str]) -> None:
    """kmod runs only the first ``install`` command for a module, in its order of config files:
    an earlier ``install vfio-pci`` would run instead of our hook, so the overrides would never be
    written. An ``install`` line for a driver that the softdep puts vfio-pci before still runs,
    but it is reported: it may load the driver in its own way."""
    problems = []
    drivers = {normalize(m) for m in modules}
    for line in theirs(ctx.inventory).lines("install"):
        if len(line.words) < 3:
            continue
        where = f"{line.where}: {line.text}"
        if line.matches("vfio_pci") and before_ours(line):
            problems.append(f"  - {where}: runs instead of proxgpu's hook in {MODPROBE_CONF}")
        elif line.matches("vfio_pci"):
            ctx.warnings.append(f"{where}: no longer runs (proxgpu's hook comes first)")
        elif any(line.matches(driver) for driver in drivers):
            ctx.warnings.append(
                f"{where}: runs whenever {line.words[1]} loads; vfio-pci still loads before it, "
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


def theirs(inventory: Inventory, kernel: str | None = None) -> KmodConfig:
    """The host's kmod config for ``kernel`` (the running one by default) without proxgpu's."""
    return KmodConfig.of(inventory.host_files, kernel or inventory.kernel, without=OURS)


def before_ours(line: ConfigLine) -> bool:
    """Whether kmod reads ``line``'s file before proxgpu's (file names sorted by ``strcmp``)."""
    return line.path.rsplit("/", 1)[1].encode() < MODPROBE_CONF_NAME.encode()
