"""Boot-time binding by PCI address: the modprobe.d hook (with the initramfs hook) or driverctl,
the modules to load, and the refusal of settings that would take the kept GPUs away at boot."""

from __future__ import annotations

import re

from proxgpu.errors import RenderError
from proxgpu.inspection.claiming import BuiltIn, claimants
from proxgpu.inspection.inventory import Inventory, PciFunction
from proxgpu.kmod import MODULES_SOFTDEP, ConfigLine, KmodConfig, module_of, normalize
from proxgpu.paths import (
    BIND_SCRIPT,
    BIND_SCRIPT_NAME,
    DRIVERCTL_DIR,
    INITRAMFS_HOOK,
    LEGACY_MODPROBE_CONF,
    MODPROBE_CONF,
    MODPROBE_CONF_NAME,
    MODULES_LOAD,
)
from proxgpu.pci import host_modules, returning_driver
from proxgpu.planning.model import Plan
from proxgpu.pve.versions import version_before
from proxgpu.rendering.conflicts import OURS, before_ours, refuse_shadowed_hook, theirs
from proxgpu.rendering.context import (
    RenderContext,
    RenderOptions,
    role_functions,
)
from proxgpu.rendering.templating import render_template


def _kernels(inventory: Inventory) -> list[str | None]:
    """The running kernel first, then every other kernel whose ``modules.softdep`` was read:
    one modprobe.d file serves whichever of them boots next."""
    found = sorted(
        path.split("/")[3]
        for path in inventory.host_files
        if path.startswith("/lib/modules/") and path.endswith("/" + MODULES_SOFTDEP)
    )
    return [inventory.kernel, *(k for k in found if k != inventory.kernel)]


def _softdep_line(
    ctx: RenderContext, module: str, configs: list[KmodConfig], problems: list[str]
) -> str:
    """``softdep MODULE pre: vfio-pci ...``, keeping the pre and post modules of the line kmod
    would use without proxgpu's in each kernel's config (the module's own ``MODULE_SOFTDEP`` in
    ``modules.softdep``, or an admin's line): ours comes first, so kmod would drop that one.
    modprobe.d serves every kernel, so the line keeps the modules of each kernel's: what one
    kernel's driver alone declares loads with the others too (kmod passes over a softdep module
    a kernel lacks), which is the price of never leaving out one a driver needs."""
    pre: list[str] = []
    post: list[str] = []
    for n, config in enumerate(configs):
        found = config.softdep(module)
        if found is None:
            continue
        if before_ours(found) and "vfio_pci" not in map(normalize, found.softdeps()[0]):
            entry = f"  - {found.where}: {found.text}"
            problems += [entry] if entry not in problems else []
            continue
        if n == 0 and not before_ours(found) and not ours_in_effect(ctx.inventory, module):
            ctx.warnings.append(
                f"{module}: kmod uses only the first softdep line for a module and reads "
                f"{found.where} (`{found.text}`) before any modprobe.d file named after it, so "
                f"a softdep there would leave vfio-pci to win a race at boot; proxgpu's line is "
                f"in {MODPROBE_CONF}, read first, and keeps that line's modules"
            )
        more_pre, more_post = found.softdeps()
        _refuse_odd_words(ctx, found, [*more_pre, *more_post])
        pre += [m for m in more_pre if m not in pre and normalize(m) != "vfio_pci"]
        post += [m for m in more_post if m not in post]
    return " ".join(
        ["softdep", module, "pre:", "vfio-pci", *pre, *(["post:", *post] if post else [])]
    )


#: A word of a softdep line proxgpu copies into its own: a module name as kmod looks it up (a
#: comma is kept: NVIDIA's ``ecdh_generic,ecdsa_generic`` is one name to kmod).
_SOFTDEP_WORD = re.compile(r"[A-Za-z0-9_.,-]{1,255}")


def _refuse_odd_words(ctx: RenderContext, found: ConfigLine, words: list[str]) -> None:
    """A host's softdep words go into proxgpu's file: one that is no module name (a trailing
    ``\\`` would join proxgpu's next line to it) is refused, never copied."""
    odd = next((word for word in words if _SOFTDEP_WORD.fullmatch(word) is None), None)
    if odd is not None:
        raise RenderError(
            ctx.inventory.source,
            found.where,
            f"{odd!r} in `{found.text}` is not a module name (letters, digits, _ - . ,), and "
            f"proxgpu would copy this line's modules into {MODPROBE_CONF}",
            "correct or remove the line",
        )


def ours_in_effect(inventory: Inventory, module: str) -> bool:
    """Whether kmod uses proxgpu's softdep line for ``module`` on the host as it is now."""
    line = KmodConfig.of(inventory.host_files, inventory.kernel).softdep(module)
    return line is not None and line.path == MODPROBE_CONF


def _tell_unused(ctx: RenderContext, module: str) -> None:
    """A softdep line for ``module`` after the first one kmod finds was never used, and stays
    so (proxgpu's line keeps the first one's modules only): whoever wrote it expects it to work.
    """
    found = [line for line in theirs(ctx.inventory).lines("softdep") if line.matches(module)]
    for line in found[1:]:
        if not line.path.endswith("/" + MODULES_SOFTDEP):
            ctx.warnings.append(
                f"{line.where}: `{line.text}` is never used: kmod uses only the first softdep "
                f"line for {module} ({found[0].where}), so its modules do not load with it"
            )


def _softdep_lines(ctx: RenderContext, modules: list[str]) -> list[str]:
    problems: list[str] = []
    # One config per installed kernel, running one first: each differs only in modules.softdep.
    configs = [theirs(ctx.inventory, kernel) for kernel in _kernels(ctx.inventory)]
    lines = [_softdep_line(ctx, module, configs, problems) for module in modules]
    for module in modules:
        _tell_unused(ctx, module)
    if problems:
        raise RenderError(
            ctx.inventory.source,
            None,
            "these softdep lines come before proxgpu's in kmod's order, and kmod uses only the "
            "first for a module, so vfio-pci would not load before the driver:\n"
            + "\n".join(problems),
            "add vfio-pci first to its pre: modules, or rename the file to sort between "
            f"{MODPROBE_CONF_NAME} and {MODULES_SOFTDEP} (proxgpu's line then "
            "keeps its modules)",
        )
    return lines


def _softdep_modules(ctx: RenderContext, functions: list[PciFunction]) -> list[str]:
    """Every module that could take a moved function (:func:`claimants`: by its modalias, even
    when it sits on vfio-pci today, and its driver's), and those proxgpu's file names already."""
    modules: set[str] = set()
    guessed: list[PciFunction] = []
    for function in functions:
        found = claimants(ctx.inventory, function)
        modules.update(found.modules)
        guessed += [function] if found.guessed else []
        ctx.warnings.extend(_built_in(function, built) for built in found.built_in)
    if guessed:
        _tell_guessed(ctx, guessed)
    # A function already on vfio-pci no longer shows the driver it had: keep what we wrote then.
    for path in sorted(OURS):
        previous = ctx.inventory.host_files.get(path, "")
        modules.update(re.findall(r"^softdep (\S+) pre: vfio-pci\b", previous, re.MULTILINE))
    return sorted(modules)


def _built_in(function: PciFunction, built: BuiltIn) -> str:
    """No modprobe.d line loads vfio-pci before a driver built into the kernel."""
    if built.kernel is None:
        what = f"driver {built.module} is built into the kernel"
    else:
        what = f"{built.module}, built into kernel {built.kernel}, would take it by its modalias"
    return (
        f"{function.address}: {what}, so no boot-time binding can run before it; bind this "
        "device with --live"
    )


def _tell_guessed(ctx: RenderContext, functions: list[PciFunction]) -> None:
    """Once: which functions' claimants come from proxgpu's table, not the host's aliases."""
    table = sorted({m for f in functions for m in host_modules(f.vendor_id, f.class_code)})
    ctx.warnings.append(
        f"{', '.join(f.address for f in functions)}: the modalias or the kernels' "
        "modules.alias was not read (a snapshot taken before proxgpu read them), so vfio-pci "
        "loads first only for proxgpu's list of drivers for their vendor and class "
        f"({', '.join(table) or 'none'}) and the driver each has now, not for any other driver "
        "the kernel has for them; inspect the host again to read them"
    )


def softdep_drift(inventory: Inventory, plan: Plan) -> tuple[list[tuple[str, str]], list[str]]:
    """How proxgpu's modprobe.d file has drifted from the softdep lines it would write today:

    * stale: its lines that no longer keep what the modules declare now, each with the line
      proxgpu would write (a kernel or driver upgrade that changed a module's own softdeps, its
      ``modules.softdep``, leaves proxgpu's line, which kmod uses instead, without them);
    * missing: the lines it would write for modules the file has none for (a kernel installed
      since, or a modprobe.d ``alias`` line, named another module that could take a moved
      function, see :func:`claimants`, which may then load before vfio-pci).

    >>> from proxgpu.host.local import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> from proxgpu.planning import SplitPolicy, plan_split
    >>> inventory = inspect(DirectoryHost("examples/hosts/ct200"))
    >>> softdep_drift(inventory, plan_split(inventory, SplitPolicy(lxc=200)))
    ([], [])
    """
    now, wanted = _softdeps_now_and_wanted(inventory, plan)
    stale = ((now.get(line.split()[1]), line) for line in wanted)
    missing = [line for line in wanted if now and line.split()[1] not in now]
    return [(old, new) for old, new in stale if old is not None and old != new], missing


def _softdeps_now_and_wanted(inventory: Inventory, plan: Plan) -> tuple[dict[str, str], list[str]]:
    """The softdep lines of proxgpu's modprobe.d file by module, and those it would write today
    (none when it has no file, or the plan is refused now: binding_conflicts tells why)."""
    written = inventory.host_files.get(MODPROBE_CONF)
    if not written:
        return {}, []
    ctx = RenderContext(inventory, plan, RenderOptions())
    functions = role_functions(ctx, to_vfio=True)
    try:
        wanted = _softdep_lines(ctx, _softdep_modules(ctx, functions))
    except RenderError:
        return {}, []
    now = {line.split()[1]: line for line in written.splitlines() if line.startswith("softdep ")}
    return now, wanted


def initramfs_lacks_binding(inventory: Inventory) -> bool:
    """Whether the running kernel's initramfs (as inspection listed it) lacks proxgpu's
    modprobe.d file or bind script."""
    listed = set(inventory.initramfs_files or ())
    return not {MODPROBE_CONF_NAME, BIND_SCRIPT_NAME} <= listed


def _tell_initramfs(ctx: RenderContext, modules: list[str]) -> None:
    """A driver in the initramfs loads there, before the root file system: only an initramfs
    rebuilt with proxgpu's files gives vfio-pci the functions first (early KMS is where the
    binding always lost)."""
    files = ctx.inventory.initramfs_files
    if files is None:
        ctx.notes.append(
            f"the initramfs of {ctx.inventory.kernel} was not read (no lsinitramfs, or no "
            f"/boot/initrd.img-{ctx.inventory.kernel}), so which drivers load there is not "
            "known; the update-initramfs step puts proxgpu's binding in it either way"
        )
        return
    inside = {module_of(f) for f in files}
    early = [m for m in modules if normalize(m) in inside]
    if early and initramfs_lacks_binding(ctx.inventory):
        ctx.warnings.append(
            f"{', '.join(early)} load{'s' if len(early) == 1 else ''} from the initramfs of "
            f"{ctx.inventory.kernel}, before the root file system, and it lacks proxgpu's "
            "binding until `update-initramfs -u -k all` runs (apply runs it when the binding's "
            "files change): without it they take the GPUs at boot"
        )


def render_binding(ctx: RenderContext) -> None:
    """The boot-time binding's files: the modprobe.d file and bind script with the initramfs
    hook (or driverctl's overrides), and the vfio modules to load; the old modprobe.d file goes.

    >>> from proxgpu.host.local import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> from proxgpu.planning import SplitPolicy, plan_split
    >>> from proxgpu.rendering.context import RenderOptions
    >>> inventory = inspect(DirectoryHost("examples/hosts/ct200"))
    >>> ctx = RenderContext(inventory, plan_split(inventory, SplitPolicy(lxc=200)), RenderOptions())
    >>> render_binding(ctx)
    >>> [f.path for f in ctx.files][:2]
    ['/etc/modprobe.d/00-proxgpu-vfio.conf', '/usr/local/sbin/proxgpu-vfio-bind']
    """
    functions = role_functions(ctx, to_vfio=True)
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
            softdeps=_softdep_lines(ctx, modules),
        )
        if modprobe
        else None,
        "load vfio-pci first and bind by PCI address",
    )
    ctx.file(LEGACY_MODPROBE_CONF, None, f"replaced by {MODPROBE_CONF}")
    conf = next((f for f in ctx.files if f.path == MODPROBE_CONF), None)
    # Unread, the initramfs is worth a word only while the binding changes; read, always.
    read = ctx.inventory.initramfs_files is not None
    if conf is not None and conf.after is not None and (conf.changed or read):
        _tell_initramfs(ctx, modules)
    kept = kept_overrides(ctx) if modprobe else []
    _tell_kept_overrides(ctx, kept)
    ctx.file(
        BIND_SCRIPT,
        render_template(
            "vfio-bind.sh.j2",
            functions=addresses,
            kept=kept,
            modprobe_conf=MODPROBE_CONF,
        )
        if modprobe
        else None,
        "mark the functions' driver_override: vfio ones for vfio-pci, kept ones for their driver",
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


#: What a driver's sysfs name may hold to be written into the bind script unquoted.
_DRIVER_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def kept_overrides(ctx: RenderContext) -> list[tuple[str, str]]:
    """``(address, driver)`` for each function the plan keeps on the host, its driver the one it
    holds now or returns to: the bind script writes that driver into its ``driver_override``,
    after which the kernel matches it to no other driver, vfio-pci's ``new_id`` included
    (``pci_match_device``). One whose driver proxgpu cannot tell is left as it is.

    >>> from proxgpu.host.local import DirectoryHost
    >>> from proxgpu.inspection import inspect
    >>> from proxgpu.planning import SplitPolicy, plan_split
    >>> from proxgpu.rendering.context import RenderOptions
    >>> inventory = inspect(DirectoryHost("examples/hosts/ct200"))
    >>> ctx = RenderContext(inventory, plan_split(inventory, SplitPolicy(lxc=200)), RenderOptions())
    >>> kept_overrides(ctx)[:2]
    [('0000:01:00.0', 'nvidia'), ('0000:01:00.1', 'snd_hda_intel')]
    """
    kept = []
    for function in role_functions(ctx, to_vfio=False):
        driver = returning_driver(function.driver, function.vendor_id, function.class_code)
        if driver is not None and _DRIVER_NAME.match(driver):
            kept.append((function.address, driver))
    return kept


def _tell_kept_overrides(ctx: RenderContext, kept: list[tuple[str, str]]) -> None:
    """Say what the kept GPUs' ``driver_override`` means for a later passthrough of one of them:
    Proxmox's own (``pci_dev_bind_to_vfio``: vfio-pci's ``new_id``, unbind, bind) unbinds the
    GPU and then cannot bind vfio-pci to it, which leaves it without a driver until a reboot."""
    own = {gpu.address for gpu in ctx.inventory.gpus}  # a GPU's own function, not its audio
    gpus = [(address, driver) for address, driver in kept if address in own]
    if not gpus:
        return
    first, driver = gpus[0]
    ctx.notes.append(
        f"the GPUs kept on the host ({', '.join(a for a, _ in gpus)}) get driver_override="
        f"{driver} at boot, so that vfio-pci never takes one whose driver failed to load; to "
        "give one of them to a VM later, plan it with proxgpu (--vfio-gpus ADDRESS): Proxmox's "
        "own passthrough would unbind it and then fail to bind vfio-pci, leaving it without a "
        f"driver until a reboot (or clear the mark before that VM starts: echo > "
        f"/sys/bus/pci/devices/{first}/driver_override)"
    )


def _render_driverctl(ctx: RenderContext, addresses: list[str]) -> None:
    if addresses and "driverctl" not in ctx.inventory.commands:
        ctx.warnings.append("driverctl is not installed on the host: apt install driverctl")
    if addresses:
        _tell_unmarked_twins(ctx)
    ours = render_template("driverctl-override.j2", driver="vfio-pci")
    stale = [
        path[len(DRIVERCTL_DIR) + 4 :]
        for path, text in ctx.inventory.host_files.items()
        if path.startswith(DRIVERCTL_DIR + "pci-") and text == ours
    ]
    known = ctx.inventory.gpu_functions
    for address in sorted(set(addresses) | {a for a in stale if a in known}):
        wanted = ours if address in addresses else None
        ctx.file(f"{DRIVERCTL_DIR}pci-{address}", wanted, "driverctl override for vfio-pci")


def _tell_unmarked_twins(ctx: RenderContext) -> None:
    """driverctl marks only the functions it moves: a kept function with the ID of a moved one
    keeps an empty ``driver_override``, so when its driver fails to load (a kernel upgrade
    without a matching module) a VM start's ``new_id`` write gives it to vfio-pci too (see
    :func:`kept_overrides`, which the modprobe binding's bind script writes)."""
    moved = {(f.vendor_id, f.device_id) for f in role_functions(ctx, to_vfio=True)}
    twins = [
        f.address for f in role_functions(ctx, to_vfio=False) if (f.vendor_id, f.device_id) in moved
    ]
    if twins:
        ctx.warnings.append(
            f"{', '.join(twins)} {'stays' if len(twins) == 1 else 'stay'} on the host with the "
            "ID of a GPU that moves, and driverctl marks only the moved ones: should the host's "
            "driver fail to load (a kernel upgrade without a matching module), a VM start's "
            "new_id write (qemu-server) gives them to vfio-pci too; the modprobe binding "
            "(--bind-method modprobe) writes their driver_override at every boot"
        )


def _vfio_modules(kernel: str | None) -> list[str]:
    modules = ["vfio", "vfio_iommu_type1", "vfio_pci"]
    # vfio_virqfd became part of vfio in kernel 6.2.
    if version_before(kernel, (6, 2)):
        modules.append("vfio_virqfd")
    return modules
