"""A systemd unit that makes the containers' NVIDIA device nodes exist before the guests start.

The nvidia kernel module creates no ``/dev/nvidia*`` node; user space does (``nvidia-modprobe``,
run by nvidia-smi or CUDA). After a reboot nothing may have run yet when Proxmox starts its
guests, and Proxmox refuses to start a container whose ``devN`` node is missing. So the unit runs
a script that makes each node the container is given, and drop-ins pull it in and order after it
both ``pve-guests.service`` and ``pve-ha-lrm.service`` (which starts the HA-managed guests that
pve-guests skips). All are plain files, so the journal and rollback cover them.

The script uses ``nvidia-modprobe`` where the host has it at boot (it ships with NVIDIA's .run
installer and some packages, not all); without it, it loads the modules and makes the same nodes
with ``mknod``, as nvidia-modprobe would: the owner, mode and ``ModifyDeviceFiles`` of
``/proc/driver/nvidia/params`` for ``/dev/nvidiaN``, ``nvidiactl`` and ``nvidia-modeset``, 0666
for nvidia-uvm's nodes, each capability's ``DeviceFileMinor`` and ``DeviceFileMode`` from its
/proc file, and the dynamic majors (nvidia-uvm, nvidia-caps) from ``/proc/devices`` at that boot.

The unit is one for the whole host, rendered from the containers a plan names; the nodes it made
that a container the plan does not name still names (an earlier plan gave them) it keeps making
(:func:`kept_for_others`), so that planning one container again never stops another from
starting.

>>> from proxgpu.inspection.inventory import Inventory
>>> inventory = Inventory(source="pve1", hostname="pve1")
>>> boot_steps(inventory, ["/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm",
...                        "/dev/nvidia-caps/nvidia-cap1"])
['gpu nvidiactl 255', 'gpu nvidia2 2', 'uvm', 'cap driver/nvidia/capabilities/mig/config']
"""

from __future__ import annotations

import re

from proxgpu.inspection.inventory import Inventory, NvidiaCap
from proxgpu.paths import GUEST_CONFIG
from proxgpu.pve.config import GuestConfig, parse_property_string
from proxgpu.rendering.context import RenderContext, containers_named
from proxgpu.rendering.dri import KFD
from proxgpu.rendering.templating import render_template

NODES_UNIT_NAME = "proxgpu-nvidia-nodes.service"
NODES_UNIT = f"/etc/systemd/system/{NODES_UNIT_NAME}"
NODES_SCRIPT = "/usr/local/sbin/proxgpu-nvidia-nodes"
GUESTS_DROPIN = "/etc/systemd/system/pve-guests.service.d/proxgpu-nvidia-nodes.conf"
HA_DROPIN = "/etc/systemd/system/pve-ha-lrm.service.d/proxgpu-nvidia-nodes.conf"
#: The cgroup rules the script writes at boot for a container without ``devN`` entries.
NODES_INCLUDE = "/run/proxgpu/nvidia-devices.conf"
NVIDIA_MODPROBE = "/usr/bin/nvidia-modprobe"

#: MIG's config and monitor capabilities where the capture holds no /proc file for them: NVIDIA
#: numbers its capabilities in a fixed table order (nv-caps.c: nvlink's fabric-mgmt 0, then
#: mig/config 1 and mig/monitor 2) and makes config readable by root alone and monitor by all
#: (os.c, osRmCapRegisterSys: OS_RUSR and OS_RUGO).
_MIG_CAPS = {
    1: NvidiaCap(proc_path="/proc/driver/nvidia/capabilities/mig/config", minor=1, mode=0o400),
    2: NvidiaCap(proc_path="/proc/driver/nvidia/capabilities/mig/monitor", minor=2, mode=0o444),
}
_CAP_NODE = re.compile(r"/dev/nvidia-caps/nvidia-cap(\d+)")
#: The nodes the unit makes that belong to no one GPU.
_CONTROL_NODES = frozenset(
    {"/dev/nvidiactl", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
)
#: The script's list of the nodes it makes (``set -- \\`` and one name a line).
_LISTED = re.compile(r"^set --((?: \\\n\s+\S+)*)$", re.MULTILINE)


def capability(inventory: Inventory, path: str) -> NvidiaCap | None:
    """The capability whose node ``path`` (``/dev/nvidia-caps/nvidia-cap1``) is, from its /proc
    file as captured, else MIG's config and monitor by NVIDIA's fixed minors; ``None`` for
    another node, or a capability the capture does not describe.

    >>> capability(Inventory(source="s", hostname="h"), "/dev/nvidia-caps/nvidia-cap2").mode
    292
    """
    match = _CAP_NODE.fullmatch(path)
    if match is None:
        return None
    minor = int(match[1])
    known = {cap.minor: cap for cap in inventory.nvidia_caps}
    return known.get(minor, _MIG_CAPS.get(minor))


def unit_nodes(inventory: Inventory) -> list[str]:
    """The nodes the unit proxgpu wrote on the host makes today (its script's list), as /dev
    paths; none where there is no such script.

    >>> script = "set -- \\\\\\n    nvidia0 \\\\\\n    nvidia-caps/nvidia-cap21\\nfor node; do\\n"
    >>> unit_nodes(Inventory(source="s", hostname="h", host_files={NODES_SCRIPT: script}))
    ['/dev/nvidia0', '/dev/nvidia-caps/nvidia-cap21']
    """
    listed = _LISTED.search(inventory.host_files.get(NODES_SCRIPT, ""))
    names = [] if listed is None else listed[1].replace("\\", " ").split()
    return [f"/dev/{name}" for name in names]


def named_nodes(config: str) -> list[str]:
    """The ``/dev/nvidia*`` nodes a container config's ``devN`` and ``lxc.mount.entry`` entries
    name (its main section: pending changes and snapshots hold no devices).

    >>> named_nodes("dev0: /dev/nvidia0,mode=0666\\nlxc.mount.entry: /dev/nvidiactl dev/nvidiactl "
    ...             "none bind,optional,create=file\\ndev1: /dev/dri/renderD128\\n")
    ['/dev/nvidia0', '/dev/nvidiactl']
    """
    paths = []
    for key, value in GuestConfig.parse(config).entries():
        if re.fullmatch(r"dev\d+", key):
            try:
                paths.append(parse_property_string(value, "path").get("path", ""))
            except ValueError:
                continue  # pve-container refuses it: it names no node
        elif key == "lxc.mount.entry":
            paths.append(value.split(maxsplit=1)[0] if value else "")
    return [path for path in paths if path.startswith("/dev/nvidia")]


def kept_for_others(
    ctx: RenderContext, planned: list[str], gpu_minors: set[int]
) -> dict[int, list[str]]:
    """The nodes the unit makes today that containers the plan does not name still name, by
    container, beyond ``planned`` (the nodes the plan's containers get): the unit keeps making
    them, so that rewriting it for some containers does not stop the others (given their nodes
    by an earlier plan) from starting. A GPU's node counts only where its minor is one of
    ``gpu_minors`` (the GPUs on nvidia after the next boot), a capability's only where its /proc
    file says how to make it; a warning names any other such node, which the unit leaves."""
    made = set(unit_nodes(ctx.inventory)) - set(planned)
    named = {guest.vmid for group in ctx.plan.groups for guest in group.guests}
    kept: dict[int, list[str]] = {}
    for vmid, config in _containers(ctx.inventory):
        if vmid in named:
            continue
        theirs = [path for path in dict.fromkeys(named_nodes(config)) if path in made]
        makeable = [path for path in theirs if _makeable(ctx.inventory, path, gpu_minors)]
        if makeable:
            kept[vmid] = makeable
        lost = [path for path in theirs if path not in makeable]
        if lost:
            say_once(
                ctx,
                f"CT {vmid}: its entries name {', '.join(lost)}, which the nodes unit made but "
                "can no longer make (their MIG instance or GPU is gone): CT "
                f"{vmid} will not start until those entries are removed",
            )
    return kept


def _containers(inventory: Inventory) -> list[tuple[int, str]]:
    """Each container config of the host by VMID."""
    found = (
        (GUEST_CONFIG.match(path), text) for path, text in sorted(inventory.guest_configs.items())
    )
    return [(int(m[2]), text) for m, text in found if m is not None and m[1] == "lxc"]


def _makeable(inventory: Inventory, path: str, gpu_minors: set[int]) -> bool:
    """Whether the unit can make node ``path`` at the next boot."""
    gpu = re.fullmatch(r"/dev/nvidia(\d+)", path)
    if gpu is not None:
        return int(gpu[1]) in gpu_minors
    if _CAP_NODE.fullmatch(path):
        return capability(inventory, path) is not None
    return path in _CONTROL_NODES


def say_once(ctx: RenderContext, warning: str) -> None:
    """A warning, once: the unit is rendered for each container the plan gives GPUs.

    >>> from proxgpu.planning.model import Plan
    >>> from proxgpu.rendering.context import RenderOptions
    >>> ctx = RenderContext(Inventory(source="s", hostname="h"),
    ...                     Plan(groups=[], warnings=[], tensor_parallel=[]), RenderOptions())
    >>> say_once(ctx, "CT 201: ..."); say_once(ctx, "CT 201: ..."); ctx.warnings
    ['CT 201: ...']
    """
    if warning not in ctx.warnings:
        ctx.warnings.append(warning)


def boot_steps(inventory: Inventory, paths: list[str]) -> list[str]:
    """The script's steps that make ``paths``: ``gpu NAME MINOR`` for ``/dev/nvidiaN`` and
    ``nvidiactl`` (control node first), ``uvm`` for both of nvidia-uvm's nodes, ``modeset``,
    ``cap PROC_FILE`` (relative to /proc) for each capability, each once; ``kfd`` for amdgpu's
    ``/dev/kfd``, which the kernel makes itself: the step loads amdgpu when its major is not in
    ``/proc/devices`` yet, and the rules take that major.

    >>> boot_steps(Inventory(source="pve1", hostname="pve1"), ["/dev/kfd"])
    ['kfd']
    """
    gpus = sorted(int(m[1]) for p in paths if (m := re.fullmatch(r"/dev/nvidia(\d+)", p)))
    steps = ["gpu nvidiactl 255"] if "/dev/nvidiactl" in paths else []
    steps += [f"gpu nvidia{minor} {minor}" for minor in gpus]
    if {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} & set(paths):
        steps.append("uvm")
    if "/dev/nvidia-modeset" in paths:
        steps.append("modeset")
    caps = sorted((c for p in paths if (c := capability(inventory, p))), key=lambda c: c.minor)
    steps += [f"cap {cap.proc_path.removeprefix('/proc/')}" for cap in caps]
    return steps + (["kfd"] if KFD in paths else [])


def render_nodes_unit(ctx: RenderContext, paths: list[str], include: str | None) -> None:
    """The unit, its script and the two drop-ins for the nvidia nodes in ``paths`` (with
    ``include``, the script also writes their cgroup rules there); with none, none of them (what
    proxgpu wrote earlier goes)."""
    steps = boot_steps(ctx.inventory, paths)
    files: dict[str, str | None] = dict.fromkeys(
        (NODES_UNIT, NODES_SCRIPT, GUESTS_DROPIN, HA_DROPIN)
    )
    nvidia = any(path.startswith("/dev/nvidia") for path in paths)
    done = "made the NVIDIA device nodes the containers are given"
    if not nvidia:
        done = "written the cgroup rule of /dev/kfd the containers are given"
    if steps:
        files[NODES_SCRIPT] = render_template(
            "nvidia-nodes.sh.j2",
            unit=NODES_UNIT_NAME,
            nvidia_modprobe=NVIDIA_MODPROBE,
            steps=steps,
            kinds={step.split()[0] for step in steps},
            nodes=[p.removeprefix("/dev/") for p in paths],
            include=include,
            nvidia=nvidia,
        )
        files[NODES_UNIT] = render_template(
            "nvidia-nodes.service.j2",
            script=NODES_SCRIPT,
            dropins=[GUESTS_DROPIN, HA_DROPIN],
            nvidia=nvidia,
        )
        for dropin, service, what in (
            (GUESTS_DROPIN, "pve-guests.service", "its guests"),
            (HA_DROPIN, "pve-ha-lrm.service", "the HA-managed guests"),
        ):
            files[dropin] = render_template(
                "pve-guests-nvidia-nodes.conf.j2",
                unit=NODES_UNIT_NAME,
                service=service,
                what=what,
                done=done,
            )
    what = "make the NVIDIA device nodes" if nvidia or not steps else "write the /dev/kfd rule"
    ctx.file(NODES_UNIT, files[NODES_UNIT], f"{what} of {containers_named(ctx)} at boot")
    ctx.file(NODES_SCRIPT, files[NODES_SCRIPT], "the nodes that unit makes, and how", mode=0o755)
    ctx.file(GUESTS_DROPIN, files[GUESTS_DROPIN], "start the guests after those nodes exist")
    ctx.file(HA_DROPIN, files[HA_DROPIN], "start the HA-managed guests after them too")
