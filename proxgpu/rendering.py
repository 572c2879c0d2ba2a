"""Rendering: turn a plan into the exact files a Proxmox VE host needs, as a change set.

Pure: the inventory carries every file's current text, so rendering reads nothing and writes
nothing. Whole files proxgpu owns come from the Jinja2 templates in ``templates/``; guest configs
are edited entry by entry (:mod:`proxgpu.pveconfig`), so every unrelated byte stays as it was.
Rendering against files that already hold the result yields no change.

>>> from proxgpu.hosts import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> from proxgpu.planning import SplitPolicy, plan_split
>>> inventory = inspect(DirectoryHost("examples/hosts/ct200"))  # doctest: +SKIP
>>> plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))  # doctest: +SKIP
>>> render(inventory, plan).summary()  # doctest: +SKIP
'6 files to change; then: update-initramfs -u -k all; proxmox-boot-tool refresh; reboot required.'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Literal

import jinja2

from proxgpu.changes import Action, ChangeSet, FileChange
from proxgpu.claims import NVIDIA_MAJOR, PCI_MAPPING_PATH
from proxgpu.drivers import host_driver, host_modules
from proxgpu.errors import ProxgpuError
from proxgpu.inventory import FrozenModel, Gpu, Inventory, PciFunction
from proxgpu.planning import Plan, PlanGroup, normalize_pci_address
from proxgpu.pveconfig import (
    GuestConfig,
    PciMappingConfig,
    format_property_string,
    hostpci_devices,
    parse_property_string,
)

MODPROBE_CONF = "/etc/modprobe.d/proxgpu-vfio.conf"
BIND_SCRIPT = "/usr/local/sbin/proxgpu-vfio-bind"
INITRAMFS_HOOK = "/etc/initramfs-tools/hooks/proxgpu"
MODULES_LOAD = "/etc/modules-load.d/proxgpu-vfio.conf"
DRIVERCTL_DIR = "/etc/driverctl.d/"
KERNEL_CMDLINE = "/etc/kernel/cmdline"
GRUB_DEFAULT = "/etc/default/grub"

BindMethod = Literal["modprobe", "driverctl"]


class RenderError(ProxgpuError):
    """The plan cannot be turned into files (a target's config is missing, a minor unknown...)."""

    exit_code = 16


class RenderOptions(FrozenModel):
    """Choices that change the files but not the split.

    ``bind_method``: ``modprobe`` (a softdep plus an ``install`` hook that writes
    driver_override before any GPU driver loads, also inside the initramfs) or ``driverctl``
    (its per-address overrides in /etc/driverctl.d). ``mapping``: give VMs their GPUs through
    a cluster PCI mapping of this name instead of raw ``hostpciN: host=`` addresses.
    """

    bind_method: BindMethod = "modprobe"
    mapping: str | None = None


@dataclass
class _Render:
    """What one rendering pass collects."""

    inventory: Inventory
    plan: Plan
    options: RenderOptions
    files: list[FileChange] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def file(self, path: str, after: str | None, why: str, mode: int | None = 0o644) -> None:
        before = self.inventory.host_files.get(path, self.inventory.guest_configs.get(path))
        if before is None and after is None:
            return
        self.files.append(FileChange(path=path, before=before, after=after, mode=mode, why=why))


def render(inventory: Inventory, plan: Plan, options: RenderOptions | None = None) -> ChangeSet:
    """Every file change and follow-up action ``plan`` needs on the inspected host.

    :raises RenderError: when a target guest has no config or a GPU's device node is unknown.
    """
    ctx = _Render(inventory, plan, options or RenderOptions())
    _refuse_conflicting_binding(ctx)
    _render_binding(ctx)
    _render_kernel_cmdline(ctx)
    for group in plan.groups:
        if group.guest is not None:
            _render_guest(ctx, group, group.guest.type, group.guest.vmid)
    return _with_actions(ctx)


def _render_guest(ctx: _Render, group: PlanGroup, kind: str, vmid: int) -> None:
    path = f"/etc/pve/lxc/{vmid}.conf" if kind == "lxc" else f"/etc/pve/qemu-server/{vmid}.conf"
    try:
        if kind == "lxc":
            _render_lxc(ctx, group, path, vmid)
        else:
            _render_vm(ctx, group, path, vmid)
    except ValueError as exc:
        # An entry Proxmox itself would reject (a malformed devN or hostpciN value).
        raise RenderError(f"{ctx.inventory.source}: {path}: {exc}") from exc


# --- templates -------------------------------------------------------------------------------


def _templates() -> Traversable:
    try:
        return resources.files("proxgpu.templates")
    except ModuleNotFoundError:
        # Run from a source checkout without installing: templates/ sits beside the package.
        return resources.files("proxgpu").joinpath("..", "templates")


@cache
def _environment() -> jinja2.Environment:
    def load(name: str) -> str:
        return _templates().joinpath(name).read_text(encoding="utf-8")

    return jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # plain config files and shell, never HTML
    )


def render_template(name: str, **values: object) -> str:
    """Render one template from ``templates/`` with ``values``.

    >>> render_template("driverctl-override.j2", driver="vfio-pci")
    'vfio-pci\\n'
    """
    return _environment().get_template(name).render(**values)


# --- settings that would undo the split --------------------------------------------------------


def _role_functions(ctx: _Render, role: str) -> list[PciFunction]:
    """Every function the plan gives ``role`` (bridges never move), in address order."""
    known = _functions_by_address(ctx.inventory)
    addresses = {a for g in ctx.plan.groups if g.role == role for a in g.functions}
    return [known[a] for a in sorted(addresses) if a in known and not known[a].is_bridge]


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


def _refuse_conflicting_binding(ctx: _Render) -> None:
    kept = _role_functions(ctx, "host")
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
            f"{ctx.inventory.source}: these settings would take the GPUs the plan keeps away from "
            "their driver at boot; remove them (proxgpu binds to vfio-pci by PCI address):\n"
            + "\n".join(problems)
        )
    for function in kept:
        if function.driver_override not in (None, function.driver):
            ctx.warnings.append(
                f"{function.address}: driver_override is {function.driver_override} until the "
                "next boot, so it cannot return to its driver before then"
            )


# --- boot-time binding -----------------------------------------------------------------------


def _functions_by_address(inventory: Inventory) -> dict[str, PciFunction]:
    return {f.address: f for g in inventory.gpus for f in [*g.function_info, *g.iommu_group_peers]}


def _softdep_modules(ctx: _Render, functions: list[PciFunction]) -> list[str]:
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


def _render_binding(ctx: _Render) -> None:
    functions = _role_functions(ctx, "vfio")
    addresses = [f.address for f in functions]
    modprobe = bool(functions) and ctx.options.bind_method == "modprobe"
    ctx.file(
        MODPROBE_CONF,
        render_template(
            "modprobe-vfio.conf.j2",
            functions=addresses,
            bind_script=BIND_SCRIPT,
            modules=_softdep_modules(ctx, functions),
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


def _render_driverctl(ctx: _Render, addresses: list[str]) -> None:
    if addresses and "driverctl" not in ctx.inventory.commands:
        ctx.warnings.append("driverctl is not installed on the host: apt install driverctl")
    ours = render_template("driverctl-override.j2", driver="vfio-pci")
    stale = [
        path[len(DRIVERCTL_DIR) + 4 :]
        for path, text in ctx.inventory.host_files.items()
        if path.startswith(DRIVERCTL_DIR + "pci-") and text == ours
    ]
    known = _functions_by_address(ctx.inventory)
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


# --- kernel command line ---------------------------------------------------------------------


def _iommu_parameters(ctx: _Render) -> list[str]:
    if ctx.inventory.cpu_vendor == "AuthenticAMD":
        ctx.warnings.append(
            "AMD IOMMU is on by default in the kernel: if it stays off after the reboot, "
            "enable IOMMU/SVM in the firmware setup"
        )
        return ["iommu=pt"]
    return ["intel_iommu=on", "iommu=pt"]


def _with_parameters(cmdline: str, parameters: Iterable[str]) -> str:
    words = cmdline.split()
    missing = [p for p in parameters if p not in words]
    return " ".join([*words, *missing])


def _render_kernel_cmdline(ctx: _Render) -> None:
    if ctx.inventory.iommu_enabled or not ctx.plan.enable_iommu:
        return
    parameters = _iommu_parameters(ctx)
    if ctx.inventory.boot_loader == "systemd-boot":
        current = ctx.inventory.host_files.get(KERNEL_CMDLINE)
        if current is None:
            ctx.warnings.append(f"{KERNEL_CMDLINE} is missing: it was built from /proc/cmdline")
            current = " ".join(
                w
                for w in (ctx.inventory.kernel_cmdline or "").split()
                if not w.startswith(("initrd=", "BOOT_IMAGE="))
            )
        after = _with_parameters(current.strip(), parameters) + "\n"
        ctx.file(KERNEL_CMDLINE, after, "turn the IOMMU on")
        return
    grub = ctx.inventory.host_files.get(GRUB_DEFAULT)
    if grub is None:
        raise RenderError(
            f"{ctx.inventory.source}: {GRUB_DEFAULT}: missing, cannot turn the IOMMU on"
        )
    ctx.file(GRUB_DEFAULT, _grub_with_parameters(grub, parameters), "turn the IOMMU on")
    for path, text in sorted(ctx.inventory.host_files.items()):
        if path.startswith("/etc/default/grub.d/") and _GRUB_DEFAULT_LINE.search(text):
            ctx.warnings.append(
                f"{path} sets GRUB_CMDLINE_LINUX_DEFAULT after {GRUB_DEFAULT}: add "
                f"{' '.join(parameters)} there too, or its value wins"
            )


_GRUB_DEFAULT_LINE = re.compile(
    r"^(?P<head>[ \t]*GRUB_CMDLINE_LINUX_DEFAULT=)"
    r"""(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>\S*))"""
    r"(?P<tail>[ \t]*(?:#.*)?)$",
    re.MULTILINE,
)


def _grub_with_parameters(text: str, parameters: list[str]) -> str:
    """``/etc/default/grub`` with ``parameters`` added to GRUB_CMDLINE_LINUX_DEFAULT.

    Only that value changes: its quotes, a trailing comment and every other line stay.

    >>> _grub_with_parameters('A=1\\nGRUB_CMDLINE_LINUX_DEFAULT="quiet" # x\\n', ["iommu=pt"])
    'A=1\\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt" # x\\n'
    """
    matches = list(_GRUB_DEFAULT_LINE.finditer(text))
    if not matches:
        line = f'GRUB_CMDLINE_LINUX_DEFAULT="{" ".join(parameters)}"\n'
        return text + ("" if text.endswith("\n") or not text else "\n") + line
    match = matches[-1]  # the shell reads the file top to bottom: the last assignment wins
    quote = "'" if match["sq"] is not None else '"'
    old = next(v for v in (match["dq"], match["sq"], match["bare"]) if v is not None)
    line = f"{match['head']}{quote}{_with_parameters(old, parameters)}{quote}{match['tail']}"
    return text[: match.start()] + line + text[match.end() :]


# --- LXC container ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _DeviceNode:
    path: str
    major: int | None
    minor: int | None


def _supports_dev_entries(pve_version: str | None) -> bool:
    """``devN:`` entries exist from pve-container 5.0.7, which is Proxmox VE 8.1."""
    match = re.match(r"(\d+)\.(\d+)", pve_version or "")
    return bool(match) and (int(match.group(1)), int(match.group(2))) >= (8, 1)  # type: ignore[union-attr]


def _planned_driver(gpu: Gpu) -> str | None:
    """The driver a GPU of a host group holds after the plan (its own, or the one it returns to)."""
    if gpu.driver and gpu.driver != "vfio-pci":
        return gpu.driver
    return host_driver(gpu.vendor_id, gpu.class_code)


def _nvidia_minors(ctx: _Render) -> dict[str, int]:
    """``/dev/nvidiaN`` for each GPU that is on nvidia after the plan.

    The driver hands out minors in probe order, so they hold only while the same GPUs stay on
    nvidia; once others go to vfio-pci, the next boot numbers the remaining ones 0, 1, ... in PCI
    order.
    """
    kept = [ctx.inventory.gpu(a) for g in ctx.plan.groups if g.role == "host" for a in g.gpus]
    planned = sorted(g.address for g in kept if _planned_driver(g) == "nvidia")
    current = sorted(g.address for g in ctx.inventory.gpus if g.driver == "nvidia")
    minors = {g.address: g.nvidia_minor for g in ctx.inventory.gpus}
    if planned == current and all(minors[a] is not None for a in planned):
        return {a: m for a, m in minors.items() if a in planned and m is not None}
    ranks = {address: rank for rank, address in enumerate(planned)}
    moved = [a for a in planned if minors[a] != ranks[a]]
    if moved:
        ctx.warnings.append(
            "the nvidia driver numbers its GPUs anew at the next boot: "
            + ", ".join(f"{a} becomes /dev/nvidia{ranks[a]}" for a in moved)
            + "; start the container only after the reboot"
        )
    return ranks


def _control_nodes(ctx: _Render) -> list[_DeviceNode]:
    uvm = ctx.inventory.char_majors.get("nvidia-uvm")
    nodes = [
        _DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, 255),
        _DeviceNode("/dev/nvidia-modeset", NVIDIA_MAJOR, 254),
        _DeviceNode("/dev/nvidia-uvm", uvm, 0),
        _DeviceNode("/dev/nvidia-uvm-tools", uvm, 1),
    ]
    present = set(ctx.inventory.device_nodes)
    if not present:
        return nodes  # the capture did not look at /dev: offer them all
    nodes += _capability_nodes(ctx, present)
    missing = [n.path for n in nodes if n.path not in present]
    if missing:
        # Proxmox refuses to start a container whose devN node is missing.
        ctx.warnings.append(
            f"{', '.join(missing)} missing on the host, so not given to the container (nvidia-uvm "
            "appears once loaded, e.g. nvidia-modprobe -u -c0; nvidia-modeset with nvidia_modeset)"
        )
    return [n for n in nodes if n.path in present]


def _capability_nodes(ctx: _Render, present: set[str]) -> list[_DeviceNode]:
    """The MIG capability nodes the host has (``/dev/nvidia-caps/nvidia-capN``, minor N)."""
    major = ctx.inventory.char_majors.get("nvidia-caps")
    caps = sorted(
        (int(m.group(1)), path)
        for path in present
        if (m := re.fullmatch(r"/dev/nvidia-caps/nvidia-cap(\d+)", path))
    )
    return [_DeviceNode(path, major, minor) for minor, path in caps] if major is not None else []


def _device_nodes(ctx: _Render, gpus: list[Gpu]) -> list[_DeviceNode]:
    nvidia = [g for g in gpus if _planned_driver(g) == "nvidia"]
    minors = _nvidia_minors(ctx) if nvidia else {}
    nodes = [
        _DeviceNode(f"/dev/nvidia{minors[g.address]}", NVIDIA_MAJOR, minors[g.address])
        for g in nvidia
    ]
    if nvidia:
        nodes += _control_nodes(ctx)
    for gpu in gpus:
        if gpu not in nvidia:
            nodes += [
                _DeviceNode(f"/dev/dri/by-path/pci-{gpu.address}-{kind}", None, None)
                for kind in ("card", "render")
            ]
    return nodes


@dataclass(frozen=True)
class _Managed:
    """Which container entries belong to the GPU setup proxgpu manages.

    Every nvidia node and cgroup rule is ours to rewrite; of the DRM nodes only those of the
    inventory's GPUs, so that another card the container uses (an iGPU's renderD128) stays.
    """

    majors: frozenset[int]
    gpu_addresses: frozenset[str]

    @classmethod
    def of(cls, inventory: Inventory) -> _Managed:
        nvidia = {m for name, m in inventory.char_majors.items() if name.startswith("nvidia")}
        return cls(frozenset({NVIDIA_MAJOR, *nvidia}), frozenset(g.address for g in inventory.gpus))

    def node(self, path: str) -> bool:
        if path.startswith("/dev/nvidia"):
            return True
        match = re.fullmatch(r"/dev/dri/by-path/pci-(.+)-(card|render)", path)
        return match is not None and match.group(1) in self.gpu_addresses

    def raw(self, key: str, value: str) -> bool:
        if key in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
            match = re.match(r"c\s+(\d+):", value)
            return match is not None and int(match.group(1)) in self.majors
        return key == "lxc.mount.entry" and self.node(value.split(" ", 1)[0])


def _lxc_entries(
    ctx: _Render, group: PlanGroup, gpus: list[Gpu], dev_mode: bool
) -> list[tuple[str, str]]:
    nodes = _device_nodes(ctx, gpus)
    if not dev_mode and any(n.major is None for n in nodes):
        raise RenderError(
            f"{ctx.inventory.source}: Proxmox VE {ctx.inventory.pve_version} has no devN entries "
            "and the device's major is unknown (for nvidia-uvm: load it with nvidia-modprobe -u)"
        )
    text = render_template(
        "lxc-devices.conf.j2",
        use_dev_entries=dev_mode,
        device_nodes=nodes,
        cpus=group.cpus,
        mems=",".join(str(n) for n in group.memory_nodes),
    )
    return [
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines())
    ]


def _guest_config(ctx: _Render, path: str, kind: str) -> GuestConfig:
    before = ctx.inventory.guest_configs.get(path)
    if before is None:
        raise RenderError(f"{ctx.inventory.source}: {path}: no such {kind} config")
    return GuestConfig.parse(before)


def _render_lxc(ctx: _Render, group: PlanGroup, path: str, vmid: int) -> None:
    config = _guest_config(ctx, path, "container")
    gpus = [ctx.inventory.gpu(a) for a in group.gpus]
    dev_mode = _supports_dev_entries(ctx.inventory.pve_version)
    wanted = _lxc_entries(ctx, group, gpus, dev_mode)
    managed = _Managed.of(ctx.inventory)
    _sync_dev_entries(config, [v for k, v in wanted if k == "dev"] if dev_mode else [], managed)
    raw = [
        (k, v) for k, v in wanted if k.startswith("lxc.cgroup2.devices") or k == "lxc.mount.entry"
    ]
    _sync_raw_entries(config, raw, managed)
    for key, value in wanted:
        if key.startswith("lxc.cgroup2.cpuset."):
            config.set(key, value)
    ctx.file(path, config.render(), f"container {vmid}: its own GPUs and NUMA pinning", mode=None)


def _sync_dev_entries(config: GuestConfig, paths: list[str], managed: _Managed) -> None:
    present: set[str] = set()
    options: set[str] = set()
    for key, value in config.entries():
        if re.fullmatch(r"dev\d+", key):
            props = parse_property_string(value, "path")
            path = props.pop("path", "")
            if managed.node(path):
                options.add(format_property_string(props))
                if path not in paths:
                    config.delete(key)
            present.add(path)
    # New nodes get the options (gid=44, mode...) the container's GPU nodes already share.
    suffix = "," + options.pop() if len(options) == 1 and "" not in options else ""
    missing = [p for p in paths if p not in present]
    for index, path in zip(config.free_indices("dev", len(missing)), missing, strict=True):
        config.set(f"dev{index}", path + suffix)


def _sync_raw_entries(
    config: GuestConfig, wanted: list[tuple[str, str]], managed: _Managed
) -> None:
    present = set()
    for key, value in config.entries():
        if managed.raw(key, value):
            if (key, value) in wanted:
                present.add((key, value))
            else:
                config.remove_raw(key, value)
    for key, value in wanted:
        if (key, value) not in present:
            config.add_raw(key, value)


# --- VM --------------------------------------------------------------------------------------


def _gpu_slots(inventory: Inventory) -> dict[str, Gpu]:
    return {gpu.slot: gpu for gpu in inventory.gpus}


def _hostpci_slots(value: str) -> list[str]:
    slots = []
    for address in hostpci_devices(value)[0]:
        try:
            slots.append(normalize_pci_address(address).split(".")[0])
        except ValueError:
            continue  # not a PCI address: not one of our GPUs
    return slots


def _render_vm(ctx: _Render, group: PlanGroup, path: str, vmid: int) -> None:
    config = _guest_config(ctx, path, "VM")
    q35 = "q35" in (config.get("machine") or "")
    if not q35:
        ctx.warnings.append(
            f"VM {vmid} is not a q35 machine: its GPUs get no pcie=1; set machine: q35 for PCIe"
        )
    gpus = [ctx.inventory.gpu(a) for a in group.gpus]
    if ctx.options.mapping:
        _sync_mapping(ctx, gpus)
        _sync_hostpci(ctx, config, gpus, q35)
    else:
        _sync_hostpci(ctx, config, gpus, q35)
    config.set("numa", "1")
    config.set("affinity", group.cpus)
    _vnuma(ctx, config, group, vmid)
    ctx.file(path, config.render(), f"VM {vmid}: its GPUs and NUMA pinning", mode=None)


def _sync_hostpci(ctx: _Render, config: GuestConfig, gpus: list[Gpu], q35: bool) -> None:
    mapping = ctx.options.mapping
    gpu_slots = _gpu_slots(ctx.inventory)
    wanted_slots = [g.slot for g in gpus]
    kept_slots: set[str] = set()
    kept_mapped = 0
    for key, value in config.entries():
        if not re.fullmatch(r"hostpci\d+", key):
            continue
        used = hostpci_devices(value)[1]
        if used is not None:
            if used == mapping and kept_mapped < len(gpus):
                kept_mapped += 1
            elif used == mapping:
                config.delete(key)
            continue
        slots = [s for s in _hostpci_slots(value) if s in gpu_slots]
        if slots and (mapping or not set(slots) <= set(wanted_slots)):
            config.delete(key)
        else:
            kept_slots.update(slots)
    extra = ",pcie=1" if q35 else ""
    if mapping:
        values = [f"mapping={mapping}{extra}"] * (len(gpus) - kept_mapped)
    else:
        values = [f"{slot}{extra}" for slot in wanted_slots if slot not in kept_slots]
    for index, value in zip(config.free_indices("hostpci", len(values)), values, strict=True):
        config.set(f"hostpci{index}", value)


def _sync_mapping(ctx: _Render, gpus: list[Gpu]) -> None:
    assert ctx.options.mapping is not None
    before = ctx.inventory.guest_configs.get(PCI_MAPPING_PATH, "")
    mapping = PciMappingConfig.parse(before)
    node = ctx.inventory.node_name
    entries = []
    for gpu in gpus:
        props = {
            "id": f"{gpu.vendor_id}:{gpu.device_id}",
            "iommugroup": str(gpu.iommu_group),
            "node": node,
            "path": gpu.slot,
        }
        if gpu.subsystem_vendor_id and gpu.subsystem_device_id:
            props["subsystem-id"] = f"{gpu.subsystem_vendor_id}:{gpu.subsystem_device_id}"
        entries.append(("map", format_property_string(props)))
    name = ctx.options.mapping
    existing = mapping.entries(name) if name in mapping.ids() else []
    merged = _with_node_maps(existing, entries, node)
    if merged != existing:
        mapping.set_entries(name, merged)
    ctx.file(PCI_MAPPING_PATH, mapping.render(), f"PCI mapping {name}", mode=None)


def _with_node_maps(
    existing: list[tuple[str, str]], ours: list[tuple[str, str]], node: str
) -> list[tuple[str, str]]:
    """A mapping's lines with this node's ``map`` lines replaced by ``ours``.

    A mapping is cluster-wide: its description and the other nodes' ``map`` lines stay as they
    are, and ours take the place of this node's first one (or go last).
    """

    def this_node(key: str, value: str) -> bool:
        if key != "map":
            return False
        try:
            return parse_property_string(value).get("node") == node
        except ValueError:
            return False

    at = next((i for i, (k, v) in enumerate(existing) if this_node(k, v)), len(existing))
    others = [(k, v) for k, v in existing if not this_node(k, v)]
    kept_before = sum(1 for k, v in existing[:at] if not this_node(k, v))
    return others[:kept_before] + ours + others[kept_before:]


def _vnuma(ctx: _Render, config: GuestConfig, group: PlanGroup, vmid: int) -> None:
    if group.numa_node is None:
        return
    vcpus = int(config.get("sockets") or 1) * int(config.get("cores") or 1)
    memory = config.get("memory") or "512"
    wanted = f"cpus=0-{vcpus - 1},hostnodes={group.numa_node},memory={memory},policy=bind"
    existing = [(k, v) for k, v in config.entries() if re.fullmatch(r"numa\d+", k)]
    if not existing:
        config.set("numa0", wanted)
    elif existing != [("numa0", wanted)]:
        # The guest's own vNUMA layout is the admin's; only point out where it may disagree.
        ctx.warnings.append(f"VM {vmid} has its own numaN entries: check their hostnodes")


# --- actions ---------------------------------------------------------------------------------


def _with_actions(ctx: _Render) -> ChangeSet:
    changed = {f.path for f in ctx.files if f.changed}
    initramfs = bool(changed & {MODPROBE_CONF, BIND_SCRIPT, INITRAMFS_HOOK})
    cmdline = bool(changed & {KERNEL_CMDLINE, GRUB_DEFAULT})
    boot = (
        initramfs
        or cmdline
        or any(p == MODULES_LOAD or p.startswith(DRIVERCTL_DIR) for p in changed)
    )
    actions = []
    if initramfs:
        actions.append(
            Action(
                argv=["update-initramfs", "-u", "-k", "all"],
                why="the initramfs must carry the new binding",
            )
        )
    # proxmox-boot-tool keeps the boot files on every ESP, for systemd-boot and GRUB alike.
    boot_tool = ctx.inventory.boot_loader == "systemd-boot" or (
        "/etc/kernel/proxmox-boot-uuids" in ctx.inventory.host_files
    )
    if boot_tool and (initramfs or cmdline):
        actions.append(
            Action(
                argv=["proxmox-boot-tool", "refresh"],
                why="copy kernel command line and initramfs to the ESPs",
            )
        )
    elif GRUB_DEFAULT in changed:
        actions.append(Action(argv=["update-grub"], why="regenerate grub.cfg"))
    guests = sorted(p for p in changed if p.startswith(("/etc/pve/lxc/", "/etc/pve/qemu-server/")))
    if guests:
        ctx.warnings.append(
            "restart the changed guests to apply their new config: " + ", ".join(guests)
        )
    return ChangeSet(
        host=ctx.inventory.source,
        files=ctx.files,
        actions=actions,
        reboot_required=boot,
        warnings=ctx.warnings,
    )
