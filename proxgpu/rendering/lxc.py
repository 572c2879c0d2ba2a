"""The container's config: exactly its GPUs' device nodes (by nvidia Device Minor), pinned."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from proxgpu.cpulist import parse_cpulist
from proxgpu.errors import RenderError
from proxgpu.inspection.inventory import Gpu, Inventory, NvidiaCap
from proxgpu.inspection.mig import cap_gpu, cap_minor, cap_node, instance_cap, instance_of
from proxgpu.pci import NVIDIA_DRIVER
from proxgpu.planning.minors import boot_minors
from proxgpu.planning.model import MigUse, PlanGroup
from proxgpu.pve.claims import NVIDIA_MAJOR
from proxgpu.pve.config import GuestConfig, format_property_string, parse_property_string
from proxgpu.pve.versions import dev_entries
from proxgpu.rendering.context import RenderContext, containers_named, guest_config_of
from proxgpu.rendering.dri import KFD, DeviceNode, dri_nodes, drm_device_nodes, managed_dri_paths
from proxgpu.rendering.nodes import (
    NODES_UNIT_NAME,
    Given,
    capability,
    gpus_first,
    is_rules_file,
    kept_for_others,
    render_nodes_unit,
    rules_file,
)
from proxgpu.rendering.templating import render_template

#: The mode the nvidia driver gives its nodes on the host (its NVreg_DeviceFileMode default).
NVIDIA_NODE_MODE = "0666"
#: The nodes the boot unit makes whether or not inspection found them: a freshly booted host has
#: not loaded nvidia-uvm yet (the unit loads it, as ``nvidia-modprobe -u -c 0`` does).
_MADE_AT_BOOT = frozenset({"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"})


def _nvidia_minors(ctx: RenderContext) -> dict[str, int]:
    """``/dev/nvidiaN`` for each GPU that is on nvidia after the plan, as the binding numbers
    them at the next boot (:func:`~proxgpu.planning.minors.boot_minors`); a warning names each
    GPU whose number changes."""
    kept = [a for g in ctx.plan.groups if not g.role.moves_to_vfio for a in g.gpus]
    ranks = boot_minors(ctx.inventory, kept, ctx.options.bind_method)
    minors = {g.address: g.nvidia_minor for g in ctx.inventory.gpus}
    moved = [a for a in ranks if minors[a] != ranks[a]]
    if moved:
        ctx.warnings.append(
            "the nvidia driver numbers its GPUs anew at the next boot: "
            + ", ".join(f"{a} becomes /dev/nvidia{ranks[a]}" for a in moved)
            + f"; start {containers_named(ctx)} only after the reboot"
        )
    return ranks


def _control_nodes(
    ctx: RenderContext, vmid: int, gpus: list[Gpu], *, with_caps: bool = True
) -> list[DeviceNode]:
    uvm = ctx.inventory.char_majors.get("nvidia-uvm")
    nodes = [
        DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, 255),
        DeviceNode("/dev/nvidia-modeset", NVIDIA_MAJOR, 254),
        DeviceNode("/dev/nvidia-uvm", uvm, 0),
        DeviceNode("/dev/nvidia-uvm-tools", uvm, 1),
    ]
    present = set(ctx.inventory.device_nodes)
    if not present:
        return nodes  # the capture did not look at /dev: offer them all
    caps = _capability_nodes(ctx, present, vmid, gpus) if with_caps else []
    nodes += caps
    if ctx.options.nvidia_nodes_unit:
        # It makes them at boot, a renumbered GPU's instances' at their new minors too.
        present |= _MADE_AT_BOOT | {node.path for node in caps}
    missing = [n.path for n in nodes if n.path not in present]
    if missing:
        # Proxmox refuses to start a container whose devN node is missing.
        ctx.warnings.append(
            f"{', '.join(missing)} missing on the host, so not given to CT {vmid} "
            f"({'; '.join(_how_to_make(missing))}; plan again once "
            f"{'it exists' if len(missing) == 1 else 'they exist'})"
        )
    return [n for n in nodes if n.path in present]


def _how_to_make(missing: list[str]) -> list[str]:
    """What makes each of the missing control nodes: its module, loaded by nvidia-modprobe.

    >>> _how_to_make(["/dev/nvidia-modeset"])
    ['nvidia-modprobe -m loads nvidia-modeset and makes /dev/nvidia-modeset']
    """
    how = {
        "/dev/nvidiactl": "nvidia-modprobe -c 255 loads nvidia and makes /dev/nvidiactl",
        "/dev/nvidia-modeset": "nvidia-modprobe -m loads nvidia-modeset and makes "
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm": "nvidia-modprobe -u -c 0 loads nvidia-uvm and makes its two nodes",
        "/dev/nvidia-uvm-tools": "nvidia-modprobe -u -c 0 loads nvidia-uvm and makes its two nodes",
    }
    return list(dict.fromkeys(how[path] for path in missing if path in how))


def _capability_nodes(
    ctx: RenderContext, present: set[str], vmid: int, gpus: list[Gpu]
) -> list[DeviceNode]:
    """The NVIDIA capability nodes the host has (``/dev/nvidia-caps/nvidia-capN``, minor N) that
    the boot unit can make again (those whose /proc file says how) and that belong to the
    container, whose GPUs are ``gpus``: MIG's config and monitor, and those GPUs' MIG instances;
    never another GPU's (not its, and those of a GPU leaving for vfio-pci are gone after the
    reboot)."""
    major = ctx.inventory.char_majors.get("nvidia-caps")
    minors = {path: minor for path in present if (minor := cap_minor(path)) is not None}
    paths = sorted(minors, key=minors.__getitem__)
    caps = {path: capability(ctx.inventory, path) for path in paths}
    caps = _renumbered(ctx, _of_gpus(caps, gpus), gpus, vmid)
    unknown = [path for path, cap in caps.items() if cap is None]
    if unknown:
        ctx.warnings.append(
            f"{', '.join(unknown)}: not given to CT {vmid}, since the capture holds no "
            "/proc/driver/nvidia/capabilities file saying how to make them again at boot; "
            "inspect the host again"
        )
    instances = [path for path, cap in caps.items() if cap and "/mig/gi" in cap.proc_path]
    if instances:
        ctx.warnings.append(
            f"{', '.join(instances)}: a MIG instance's capability exists only while the instance "
            f"does; create the instances again at each boot before {NODES_UNIT_NAME} runs (it "
            f"makes their nodes, and the guests start after it), or CT {vmid} will not start"
        )
    return [DeviceNode(path, major, cap.minor) for path, cap in caps.items() if cap]


def _of_gpus(caps: dict[str, NvidiaCap | None], gpus: list[Gpu]) -> dict[str, NvidiaCap | None]:
    """Of ``caps``, those a container with ``gpus`` gets (see :func:`_capability_nodes`); those
    the capture does not describe stay, to be said."""
    mine = {gpu.nvidia_minor for gpu in gpus} | {None}
    return {path: cap for path, cap in caps.items() if cap is None or cap_gpu(cap) in mine}


def _renumbered(
    ctx: RenderContext, caps: dict[str, NvidiaCap | None], gpus: list[Gpu], vmid: int
) -> dict[str, NvidiaCap | None]:
    """``caps``, the MIG instances of a GPU the next boot numbers anew at the capability nodes
    they get then: the driver names an instance's /proc file and minor after its GPU's minor,
    from one fixed table (:func:`~proxgpu.inspection.mig.instance_cap`); a warning names each
    node that changes."""
    boot = _nvidia_minors(ctx)
    new = {g.nvidia_minor: boot[g.address] for g in gpus if g.address in boot}
    result: dict[str, NvidiaCap | None] = {}
    moved = []
    for path, cap in caps.items():
        where = instance_of(cap) if cap is not None else None
        if where is None or new.get(where[0], where[0]) == where[0]:
            result[path] = cap
            continue
        now = instance_cap(new[where[0]], where[1], where[2])
        result[cap_node(now.minor)] = now
        moved.append(f"{path} becomes {cap_node(now.minor)}")
    if moved:
        ctx.notes.append(
            f"CT {vmid}: its GPU gets another nvidia minor at the next boot, and its MIG "
            f"instances other capability nodes with it: {', '.join(moved)}"
        )
    return result


def _at_boot(path: str, dev_mode: bool) -> bool:
    """Whether the boot unit takes care of node ``path``: it makes every nvidia node, and
    without ``devN`` entries it also writes amdgpu's ``/dev/kfd`` rule with that boot's major
    (the kernel makes the node itself; amdkfd registers its character device with major 0, so
    the kernel picks a free major as it loads, which need not be the one seen at plan time)."""
    return path.startswith("/dev/nvidia") or (path == KFD and not dev_mode)


def _every_containers_boot_nodes(ctx: RenderContext, dev_mode: bool) -> list[Given]:
    """The nodes the boot unit takes care of (:func:`_at_boot`) for each container the plan
    gives GPUs or MIG instances, GPU nodes first, with the container's own rules file where it
    has no ``devN`` entries: the one unit serves them all, listed alike from each container so
    that each renders the same unit. The nodes it made that containers the plan does not name
    still name it keeps making (:func:`~proxgpu.rendering.nodes.kept_for_others`), their rules
    in the file each includes."""
    quiet = replace(ctx, warnings=[])  # each container's own render says its warnings
    planned: dict[int, list[str]] = {}
    for group in ctx.plan.groups:
        for guest in (guest for guest in group.guests if guest.type == "lxc"):
            nodes = _device_nodes(quiet, group, guest.vmid)
            planned.setdefault(guest.vmid, []).extend(
                node.path for node in nodes if _at_boot(node.path, dev_mode)
            )
    every = list(dict.fromkeys(path for paths in planned.values() for path in paths))
    given = [
        Given(None if dev_mode else rules_file(vmid), gpus_first(paths), f"CT {vmid}")
        for vmid, paths in planned.items()
        if paths
    ]
    return given + kept_for_others(ctx, every, set(_nvidia_minors(quiet).values()))


def _device_nodes(ctx: RenderContext, group: PlanGroup, vmid: int) -> list[DeviceNode]:
    """The nodes container ``vmid`` gets of ``group``: its GPUs' and the control nodes; of a
    MIG group its instance's capability nodes instead of every capability the host has."""
    gpus = [ctx.inventory.gpu(a) for a in group.gpus]
    nvidia = [g for g in gpus if g.host_driver == NVIDIA_DRIVER]
    minors = _nvidia_minors(ctx) if nvidia else {}
    nodes = [
        DeviceNode(f"/dev/nvidia{minors[g.address]}", NVIDIA_MAJOR, minors[g.address])
        for g in nvidia
    ]
    use = next((use for use in group.mig if use.vmid == vmid), None)
    if nvidia:
        nodes += _control_nodes(ctx, vmid, nvidia, with_caps=use is None)
    if use is not None:
        nodes += _mig_nodes(ctx, use, vmid)
    others = [gpu for gpu in gpus if gpu not in nvidia]
    return nodes + (dri_nodes(ctx, others) if others else [])


def _mig_nodes(ctx: RenderContext, use: MigUse, vmid: int) -> list[DeviceNode]:
    """The two capability nodes of a MIG instance (its GPU instance's and compute instance's
    ``access``: what CUDA opens to run on it); never ``mig/config`` or ``mig/monitor``, which no
    CUDA program needs (``nvidia-smi`` then lists no MIG device, but CUDA runs)."""
    major = ctx.inventory.char_majors.get("nvidia-caps")
    paths = use.cap_nodes
    ctx.warnings.append(
        f"CT {vmid}: MIG GI {use.gi} CI {use.ci} ({', '.join(paths)}) exists only while the "
        f"instance does: make it again at each boot before {NODES_UNIT_NAME} runs (it makes "
        f"the instance's nodes, and the guests start after it: nvidia-smi mig -cgi ... -C), or "
        f"CT {vmid} will not start"
    )
    gpu = next(g for g in ctx.inventory.gpus if g.nvidia_minor == use.gpu_minor)
    minors = [use.gi_minor, use.ci_minor]
    boot = _nvidia_minors(ctx).get(gpu.address, use.gpu_minor)
    if boot != use.gpu_minor:
        # The driver numbers the instance's capabilities after its GPU's minor, which changes.
        minors = [instance_cap(boot, use.gi).minor, instance_cap(boot, use.gi, use.ci).minor]
        ctx.notes.append(
            f"CT {vmid}: {gpu.address} becomes /dev/nvidia{boot} at the next boot, and MIG GI "
            f"{use.gi} CI {use.ci}'s capability nodes with it: {', '.join(paths)} become "
            f"{', '.join(cap_node(minor) for minor in minors)}"
        )
        paths = [cap_node(minor) for minor in minors]
    present = set(ctx.inventory.device_nodes)
    missing = [p for p in paths if present and p not in present]
    if missing and not ctx.options.nvidia_nodes_unit:
        ctx.warnings.append(
            f"CT {vmid}: {', '.join(missing)} missing on the host: make them before it starts "
            "(nvidia-modprobe -f /proc/driver/nvidia/capabilities/gpuN/mig/giG/ciC/access)"
        )
    return [DeviceNode(path, major, minor) for path, minor in zip(paths, minors, strict=True)]


@dataclass(frozen=True)
class _Managed:
    """Which container entries belong to the GPU setup proxgpu manages.

    Every nvidia node and cgroup rule is ours to rewrite; of the DRM nodes only those of the
    inventory's GPUs, so that another card the container uses (an iGPU's renderD128) stays.
    """

    majors: frozenset[int]
    gpu_addresses: frozenset[str]
    dri: frozenset[str]
    #: ``c MAJOR:MINOR`` of the DRM nodes and /dev/kfd above, for their cgroup rules.
    dri_numbers: frozenset[str]

    @classmethod
    def of(cls, inventory: Inventory) -> _Managed:
        nvidia = {m for name, m in inventory.char_majors.items() if name.startswith("nvidia")}
        names = [name for gpu in inventory.gpus for name in gpu.drm_nodes]
        numbers = {f"{n.major}:{n.minor}" for n in drm_device_nodes(names, inventory.char_majors)}
        if "kfd" in inventory.char_majors:
            numbers.add(f"{inventory.char_majors['kfd']}:0")
        return cls(
            frozenset({NVIDIA_MAJOR, *nvidia}),
            frozenset(g.address for g in inventory.gpus),
            managed_dri_paths(inventory),
            frozenset(numbers),
        )

    def node(self, path: str) -> bool:
        if path.startswith("/dev/nvidia") or path in self.dri:
            return True
        match = re.fullmatch(r"/dev/dri/by-path/pci-(.+)-(card|render)", path)
        return match is not None and match.group(1) in self.gpu_addresses

    def raw(self, key: str, value: str) -> bool:
        if key in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
            match = re.match(r"c\s+(\d+):(\S+)", value)
            return match is not None and (
                int(match.group(1)) in self.majors or f"{match[1]}:{match[2]}" in self.dri_numbers
            )
        if key == "lxc.include":
            return is_rules_file(value)
        return key == "lxc.mount.entry" and self.node(value.split(" ", 1)[0])


def _lxc_entries(
    ctx: RenderContext,
    group: PlanGroup,
    nodes: list[DeviceNode],
    dev_mode: bool,
    include: str | None,
) -> list[tuple[str, str]]:
    # With the include, the boot unit writes the cgroup rules of the nvidia nodes and /dev/kfd
    # with that boot's majors (nvidia-uvm's, nvidia-caps' and kfd's are dynamic); every other
    # node's rule (DRM's fixed 226) is written here.
    ruled = [n for n in nodes if not (include and _at_boot(n.path, dev_mode))]
    if not dev_mode and any(n.major is None for n in ruled):
        version = ctx.inventory.pve_container_version or "unknown"
        raise RenderError(
            ctx.inventory.source,
            None,
            f"Proxmox VE {ctx.inventory.pve_version} (pve-container {version}) has no devN "
            "entries and the major of "
            f"{', '.join(n.path for n in ruled if n.major is None)} is unknown",
            "load its driver first (for nvidia-uvm: nvidia-modprobe -u), then plan again",
        )
    text = render_template(
        "lxc-devices.conf.j2",
        use_dev_entries=dev_mode,
        device_nodes=nodes,
        ruled_nodes=ruled,
        include=include,
        cpus=group.cpus,
        mems=",".join(str(n) for n in group.memory_nodes),
    )
    return [
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines())
    ]


def render_lxc(ctx: RenderContext, group: PlanGroup, path: str, vmid: int) -> None:
    config = guest_config_of(ctx, path, "container")
    group = _local_pinning(ctx, group, vmid)
    dev_mode = dev_entries(ctx.inventory.pve_container_version, ctx.inventory.pve_version)
    nodes = _device_nodes(ctx, group, vmid)
    nvidia = [node.path for node in nodes if node.path.startswith("/dev/nvidia")]
    unit = ctx.options.nvidia_nodes_unit
    # A raw container includes the rules file the unit writes for it alone.
    at_boot = any(_at_boot(node.path, dev_mode) for node in nodes)
    include = rules_file(vmid) if unit and not dev_mode and at_boot else None
    wanted = _lxc_entries(ctx, group, nodes, dev_mode, include)
    if unit:
        render_nodes_unit(ctx, _every_containers_boot_nodes(ctx, dev_mode))
    managed = _Managed.of(ctx.inventory)
    modes = {p: cap.mode for p in nvidia if (cap := capability(ctx.inventory, p))}
    modes |= _driver_modes(ctx, [p for p in nvidia if p not in modes], vmid)
    devs = [v for k, v in wanted if k == "dev"] if dev_mode else []
    _sync_dev_entries(config, devs, managed, modes)
    raw = [
        (k, v)
        for k, v in wanted
        if k.startswith("lxc.cgroup2.devices") or k in ("lxc.mount.entry", "lxc.include")
    ]
    _sync_raw_entries(config, raw, managed)
    for key, value in wanted:
        if key.startswith("lxc.cgroup2.cpuset."):
            config.set(key, value)
    if group.cpus:
        _match_cores(ctx, config, group.cpus, vmid)
    ctx.file(path, config.render(), f"container {vmid}: its own GPUs and NUMA pinning", mode=None)


def _local_pinning(ctx: RenderContext, group: PlanGroup, vmid: int) -> PlanGroup:
    """``group``, or it without CPUs and memory nodes when pinning the container to them gives no
    locality: on a host of one NUMA node every CPU is as near its GPUs as any other, and GPUs
    whose node the firmware does not give (sysfs ``numa_node`` -1) have no near CPUs to pin to.
    The container's ``cpuset`` and ``cores:`` are then the admin's, left as they are."""
    if len(ctx.inventory.numa_nodes) <= 1:
        why = "the host has one NUMA node"
    elif any(ctx.inventory.gpu(a).numa_node is None for a in group.gpus):
        why = "the NUMA node of its GPUs is unknown (sysfs numa_node -1)"
    else:
        return group
    ctx.notes.append(
        f"CT {vmid}: cpuset and cores left as they are: pinning gives no locality, {why}"
    )
    return group.model_copy(update={"cpus": "", "memory_nodes": []})


def _match_cores(ctx: RenderContext, config: GuestConfig, cpus: str, vmid: int) -> None:
    """``cores:`` as many as the CPUs the container is pinned to.

    With a cpuset of its own, pve-container no longer picks ``cores`` CPUs for the container, so
    a different number would only mislead Proxmox's accounting (its CPU count, HA's ``max-cpu``).
    """
    pinned = len(parse_cpulist(cpus))
    old = config.get("cores")
    if old == str(pinned):
        return
    config.set("cores", str(pinned))
    if old is not None and old.isdigit() and int(old) < pinned:
        ctx.warnings.append(
            f"CT {vmid}: cores {old} becomes {pinned}, the CPUs it is pinned to ({cpus}): "
            f"pinned, it runs on all of them; cap its CPU time with cpulimit: {old} if need be"
        )


def _driver_modes(ctx: RenderContext, paths: list[str], vmid: int) -> dict[str, int]:
    """The mode the host's nvidia driver gives its device files (``NVreg_DeviceFileMode``), for
    the container's GPU nodes, ``nvidiactl`` and ``nvidia-modeset`` when it is narrower than
    NVIDIA's 0666 default: the container never gets them wider than the host has them.
    nvidia-modprobe makes all of them from the driver's params file (``nvidia-modprobe-utils.c``,
    ``nvidia_mknod`` and ``nvidia_modeset_mknod``), and nvidia-uvm's nodes 0666 whatever it
    says (``nvidia_uvm_mknod`` reads no params file). Its group (``DeviceFileGID``) is the
    admin's to give to the container's users."""
    mode = ctx.inventory.nvidia_device_file_mode
    if mode is None or mode & 0o777 == 0o666:
        return {}
    gid = ctx.inventory.nvidia_device_file_gid or 0
    if gid:
        ctx.warnings.append(
            f"CT {vmid}: the host's nvidia device files are mode {mode & 0o777:04o}, group {gid} "
            f"(NVreg_DeviceFileMode/GID): its entries get that mode; add gid={gid} to them (or "
            "its users to that group) for those users to reach the GPUs"
        )
    return {
        path: mode & 0o777 for path in paths if re.fullmatch(r"/dev/nvidia(\d+|ctl|-modeset)", path)
    }


def _sync_dev_entries(
    config: GuestConfig, paths: list[str], managed: _Managed, caps: dict[str, int]
) -> None:
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
                else:
                    _give_access_policy(config, key, path, props, caps.get(path))
            present.add(path)
    # New nodes get the options (gid=44, mode...) the container's GPU nodes already share.
    shared = parse_property_string(options.pop()) if len(options) == 1 and "" not in options else {}
    missing = [p for p in paths if p not in present]
    for index, path in zip(config.free_indices("dev", len(missing)), missing, strict=True):
        props = {"path": path, **shared}
        policy = _access_policy(path, props, caps.get(path))
        config.set(f"dev{index}", format_property_string(policy, "path"))


def _access_policy(path: str, props: dict[str, str], cap_mode: int | None) -> dict[str, str]:
    """``props`` with ``mode=0666`` on a compute node (nvidia's, a render node, /dev/kfd) whose
    entry states no access policy, and on a capability node (``cap_mode``: the host's) the
    host's mode unless the entry states one within it.

    pve-container creates a ``devN`` node 0660 root:root unless told otherwise, so the
    container's other users would lose the GPU the host gives everyone (its nvidia nodes are
    0666; its render nodes and kfd are the render group's, which the container does not share);
    a ``mode=`` or ``gid=`` already there is the admin's choice and stays. A capability node is
    an access right of NVIDIA's itself (MIG's config: 0400, root alone), so the container never
    gets it wider than the host has it, 0660 included.
    """
    if cap_mode is not None:
        stated = props.get("mode", "")
        if not re.fullmatch(r"0[0-7]{3}", stated) or int(stated, 8) & ~cap_mode:
            return {**props, "mode": f"0{cap_mode & 0o777:03o}"}
        return props
    compute = path.startswith(("/dev/nvidia", "/dev/dri/renderD")) or path == KFD
    if compute and "mode" not in props and "gid" not in props:
        return {**props, "mode": NVIDIA_NODE_MODE}
    return props


def _give_access_policy(
    config: GuestConfig, key: str, path: str, props: dict[str, str], cap_mode: int | None
) -> None:
    wanted = _access_policy(path, props, cap_mode)
    if wanted != props:
        config.set(key, format_property_string({"path": path, **wanted}, "path"))


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
