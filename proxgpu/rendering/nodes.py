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
starting. Without ``devN`` entries (pve-container before 5.0.7), it also writes each container's
cgroup rules, with that boot's majors, to a file of that container's own
(:func:`rules_file`), which only its config includes: a file shared by all would let root in one
container ``mknod`` and open another's GPUs (LXC lets a container make any node; the device
cgroup is the only barrier).

>>> from proxgpu.inspection.inventory import Inventory
>>> inventory = Inventory(source="pve1", hostname="pve1")
>>> boot_steps(inventory, ["/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm",
...                        "/dev/nvidia-caps/nvidia-cap1"])
['gpu nvidiactl 255', 'gpu nvidia2 2', 'uvm', 'cap driver/nvidia/capabilities/mig/config']
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxgpu.inspection.inventory import Inventory, NvidiaCap
from proxgpu.inspection.mig import cap_minor, instance_of, table_cap
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
#: Where the script writes each raw container's cgroup rules at boot (see :func:`rules_file`).
RULES_DIR = "/run/proxgpu"
#: The one rules file every raw container included before each had its own: a container an
#: earlier plan gave it still includes it, and the unit keeps writing it for such containers.
SHARED_RULES = f"{RULES_DIR}/nvidia-devices.conf"
NVIDIA_MODPROBE = "/usr/bin/nvidia-modprobe"

#: The nodes the unit makes that belong to no one GPU.
_CONTROL_NODES = frozenset(
    {"/dev/nvidiactl", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
)
#: The script's lists of the nodes it makes: ``given RULES \\`` and one name a line for each
#: container, or, in a unit written before containers had rules files of their own, one
#: ``set -- \\`` list for all.
_LISTED = re.compile(r"^(?:set --|given \S+)((?: \\\n\s+\S+)*)$", re.MULTILINE)
_RULES = re.compile(rf"{RULES_DIR}/nvidia-devices(?:-(\d+))?\.conf")


@dataclass(frozen=True)
class Given:
    """The nodes the unit makes for a container (``/dev`` paths), the file under
    :data:`RULES_DIR` it writes their cgroup rules to (``None`` where ``devN`` entries give
    them), and the containers they are (``CT 200``; several share :data:`SHARED_RULES`)."""

    rules: str | None
    paths: tuple[str, ...]
    guests: str


def rules_file(vmid: int) -> str:
    """The file a raw container's config includes for its nvidia nodes' cgroup rules.

    >>> rules_file(201)
    '/run/proxgpu/nvidia-devices-201.conf'
    """
    return f"{RULES_DIR}/nvidia-devices-{vmid}.conf"


def is_rules_file(path: str) -> bool:
    """Whether ``path`` is a rules file the unit writes: a container's own, or the one shared
    file of units written before (:data:`SHARED_RULES`).

    >>> is_rules_file("/run/proxgpu/nvidia-devices-201.conf"), is_rules_file(SHARED_RULES)
    (True, True)
    """
    return _RULES.fullmatch(path) is not None


def included_rules(config: str) -> str | None:
    """The rules file a container config's ``lxc.include`` names, if any.

    >>> included_rules("lxc.include: /run/proxgpu/nvidia-devices.conf\\n")
    '/run/proxgpu/nvidia-devices.conf'
    """
    for key, value in GuestConfig.parse(config).entries():
        if key == "lxc.include" and is_rules_file(value):
            return value
    return None


def capability(inventory: Inventory, path: str) -> NvidiaCap | None:
    """The capability whose node ``path`` (``/dev/nvidia-caps/nvidia-cap1``) is, from its /proc
    file as captured, else MIG's config and monitor from NVIDIA's fixed table; ``None`` for
    another node, or an instance's capability the capture does not show (the instance is
    gone, and its node cannot be made again).

    >>> capability(Inventory(source="s", hostname="h"), "/dev/nvidia-caps/nvidia-cap2").mode
    292
    """
    minor = cap_minor(path)
    if minor is None:
        return None
    known = {cap.minor: cap for cap in inventory.nvidia_caps}
    table = table_cap(minor)
    return known.get(minor) or (table if table and instance_of(table) is None else None)


def _boot_capability(inventory: Inventory, path: str) -> NvidiaCap | None:
    """What the unit makes node ``path`` from: its :func:`capability`, else NVIDIA's table (the
    instance of a GPU that the next boot numbers anew, at the minor it gets then)."""
    minor = cap_minor(path)
    cap = capability(inventory, path)
    return cap if cap is not None or minor is None else table_cap(minor)


def unit_nodes(inventory: Inventory) -> list[str]:
    """The nodes the unit proxgpu wrote on the host makes today (its script's list), as /dev
    paths; none where there is no such script.

    >>> script = ("given - \\\\\\n    nvidia0 \\\\\\n    nvidiactl\\n"
    ...           "given - \\\\\\n    nvidia-caps/nvidia-cap21 \\\\\\n    nvidiactl\\n")
    >>> unit_nodes(Inventory(source="s", hostname="h", host_files={NODES_SCRIPT: script}))
    ['/dev/nvidia0', '/dev/nvidiactl', '/dev/nvidia-caps/nvidia-cap21']
    """
    script = inventory.host_files.get(NODES_SCRIPT, "")
    names = [name for m in _LISTED.finditer(script) for name in m[1].replace("\\", " ").split()]
    return [f"/dev/{name}" for name in dict.fromkeys(names)]


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


def kept_for_others(ctx: RenderContext, planned: list[str], gpu_minors: set[int]) -> list[Given]:
    """What the unit keeps making for containers the plan does not name: the nodes it makes today
    that such a container still names (given by an earlier plan), so that rewriting the unit for
    some containers does not stop the others from starting, with the rules file the container's
    config includes. A GPU's node counts only where its minor is one of ``gpu_minors`` (the GPUs
    on nvidia after the next boot), a capability's only where its /proc file says how to make
    it; a warning names any other such node, which the unit leaves. Containers that still
    include :data:`SHARED_RULES` (from a proxgpu before rules files of their own) share it still,
    the unit writing only their rules there, and a warning says how to give each its own.
    ``planned`` (the nodes the plan's containers get) are made anyway: the warning that a
    container keeps its nodes names only the others."""
    made = set(unit_nodes(ctx.inventory))
    named = {guest.vmid for group in ctx.plan.groups for guest in group.guests}
    given: list[Given] = []
    shared: dict[int, list[str]] = {}
    for vmid, config in _containers(ctx.inventory):
        theirs = [path for path in dict.fromkeys(named_nodes(config)) if path in made]
        if vmid in named or not set(theirs) - set(planned):
            continue
        makeable = [path for path in theirs if _makeable(ctx.inventory, path, gpu_minors)]
        _say_kept(ctx, vmid, [p for p in makeable if p not in planned])
        _say_lost(ctx, vmid, [path for path in theirs if path not in makeable])
        if not makeable:
            continue
        rules = included_rules(config)
        if rules == SHARED_RULES:
            shared[vmid] = makeable
        else:
            given.append(Given(rules, gpus_first(makeable), f"CT {vmid}"))
    if shared:
        paths = gpus_first([path for paths in shared.values() for path in paths])
        given.append(Given(SHARED_RULES, paths, ", ".join(f"CT {vmid}" for vmid in shared)))
        _say_shared(ctx, list(shared))
    return given


def gpus_first(paths: list[str]) -> tuple[str, ...]:
    """``paths`` without repeats, the GPU nodes (``/dev/nvidiaN``) first.

    >>> gpus_first(["/dev/nvidiactl", "/dev/nvidia4", "/dev/nvidiactl"])
    ('/dev/nvidia4', '/dev/nvidiactl')
    """
    unique = list(dict.fromkeys(paths))
    gpus = [path for path in unique if re.fullmatch(r"/dev/nvidia\d+", path)]
    return (*gpus, *(path for path in unique if path not in gpus))


def _say_kept(ctx: RenderContext, vmid: int, paths: list[str]) -> None:
    if paths:
        say_once(
            ctx,
            f"CT {vmid}, which this plan does not name, still names {', '.join(paths)} (given "
            f"it by an earlier plan): {NODES_UNIT_NAME} keeps making them at boot, so that CT "
            f"{vmid} still starts (remove those entries from it for the unit to stop)",
        )


def _say_lost(ctx: RenderContext, vmid: int, paths: list[str]) -> None:
    if paths:
        say_once(
            ctx,
            f"CT {vmid}: its entries name {', '.join(paths)}, which the nodes unit made but "
            "can no longer make (their MIG instance or GPU is gone): CT "
            f"{vmid} will not start until those entries are removed",
        )


def _say_shared(ctx: RenderContext, vmids: list[int]) -> None:
    several = len(vmids) > 1
    say_once(
        ctx,
        f"{', '.join(f'CT {vmid}' for vmid in vmids)} still include{'' if several else 's'} "
        f"{SHARED_RULES}, the cgroup rules an earlier proxgpu wrote for all its containers: "
        f"{NODES_UNIT_NAME} now writes only {'theirs' if several else 'its'} there; plan "
        f"{'each of them' if several else 'it'} again (--lxc) to give "
        f"{'each' if several else 'it'} a rules file of its own",
    )


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
    if cap_minor(path) is not None:
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
    made = (cap for path in paths if (cap := _boot_capability(inventory, path)))
    caps = sorted(made, key=lambda cap: cap.minor)
    steps += [f"cap {cap.proc_path.removeprefix('/proc/')}" for cap in caps]
    return steps + (["kfd"] if KFD in paths else [])


def render_nodes_unit(ctx: RenderContext, given: list[Given]) -> None:
    """The unit, its script and the two drop-ins for the nodes each container is ``given``
    (where a :class:`Given` names a rules file, the script also writes that container's cgroup
    rules there); with none, none of them (what proxgpu wrote earlier goes)."""
    paths = list(dict.fromkeys(path for one in given for path in one.paths))
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
            given=[
                (one.guests, one.rules or "-", [p.removeprefix("/dev/") for p in one.paths])
                for one in given
            ],
            rules=any(one.rules for one in given),
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
