"""One rendering pass: the options, the inventory and plan it reads, the changes it collects."""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import get_args

from proxgpu.errors import NOT_UTF8_FIX, NOT_UTF8_WHY, RenderError, UsageError
from proxgpu.inspection.inventory import Inventory, PciFunction
from proxgpu.paths import LXC_CONFIG_DIR, guest_config
from proxgpu.planning.model import VMID_MAX, VMID_MIN, Plan
from proxgpu.planning.policy import BindMethod
from proxgpu.pve.claims import GuestRef
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering.changes import FileChange


@dataclass(frozen=True, kw_only=True)
class RenderOptions:
    """Choices that change the files but not the split.

    ``bind_method``: ``modprobe`` (a softdep plus an ``install`` hook that writes
    driver_override before any GPU driver loads, also inside the initramfs) or ``driverctl``
    (its per-address overrides in /etc/driverctl.d). ``mapping``: give VMs their GPUs through
    a cluster PCI mapping of this name instead of raw ``hostpciN: host=`` addresses.
    ``nvidia_nodes_unit``: also write a systemd unit, pulled in by ``pve-guests.service`` and
    ``pve-ha-lrm.service``, that makes the container's NVIDIA device nodes at boot (see
    :mod:`proxgpu.rendering.nodes`); on
    by default, since Proxmox refuses to start a container whose ``devN`` node is missing and
    the nvidia module makes none by itself.

    >>> RenderOptions(bind_method="udev")
    Traceback (most recent call last):
    ...
    proxgpu.errors.UsageError: bind_method 'udev': choose modprobe or driverctl

    :raises UsageError: for a binding method proxgpu does not write.
    """

    bind_method: BindMethod = "modprobe"
    mapping: str | None = None
    nvidia_nodes_unit: bool = True

    def __post_init__(self) -> None:
        # A script's value is not checked by mypy: an unknown one would render modprobe's files.
        methods = get_args(BindMethod)
        if self.bind_method not in methods:
            raise UsageError(f"bind_method {self.bind_method!r}: choose {' or '.join(methods)}")


@dataclass
class RenderContext:
    """What one rendering pass collects."""

    inventory: Inventory
    plan: Plan
    options: RenderOptions
    files: list[FileChange] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: What the files do or assume, asking nothing (a warning asks something of the admin).
    notes: list[str] = field(default_factory=list)

    def file(self, path: str, after: str | None, why: str, mode: int | None = 0o644) -> None:
        """Change ``path`` to ``after`` (``None``: remove it), for ``why``.

        :raises RenderError: when the file is not UTF-8: its text holds U+FFFD where its bytes
            were, so a change would rewrite them (apply's preflight refuses it the same way).
        """
        before = self.inventory.host_files.get(path, self.inventory.guest_configs.get(path))
        if before is None and after is None:
            return
        fault = self.inventory.not_utf8.get(path)
        if fault is not None and after != before:
            raise RenderError(self.inventory.source, path, f"{fault}: {NOT_UTF8_WHY}", NOT_UTF8_FIX)
        if any(f.path == path and f.after == after for f in self.files):
            return  # Containers sharing a group share its files (the nodes unit): written once.
        self.files.append(FileChange(path=path, before=before, after=after, mode=mode, why=why))


def containers_named(ctx: RenderContext) -> str:
    """Every container the plan gives GPUs, as messages name them (``CT 200 and CT 201``).

    >>> from proxgpu.inspection import Inventory
    >>> from proxgpu.planning.model import PlanGroup
    >>> group = PlanGroup(role="host", numa_node=0, gpus=[], functions=[], cpus="0-3",
    ...                   memory_nodes=[0], driver="nvidia", guest={"type": "lxc", "vmid": 200},
    ...                   shared_with=[{"type": "lxc", "vmid": 201}])
    >>> containers_named(RenderContext(Inventory(source="t", hostname="t"),
    ...                                Plan(groups=[group], warnings=[], tensor_parallel=[]),
    ...                                RenderOptions()))
    'CT 200 and CT 201'
    """
    labels = list(
        dict.fromkeys(
            guest.label
            for group in ctx.plan.groups
            for guest in group.guests
            if guest.type == "lxc"
        )
    )
    if len(labels) < 3:
        return " and ".join(labels) or "no container"
    return f"{', '.join(labels[:-1])} and {labels[-1]}"


def role_functions(ctx: RenderContext, *, to_vfio: bool) -> list[PciFunction]:
    """Every function the plan moves to vfio-pci (``to_vfio``) or keeps on its host driver
    (bridges never move), in address order."""
    known = ctx.inventory.gpu_functions
    addresses = {a for g in ctx.plan.groups if g.role.moves_to_vfio == to_vfio for a in g.functions}
    return [known[a] for a in sorted(addresses) if a in known and not known[a].is_bridge]


def require_guests(inventory: Inventory, guests: Iterable[GuestRef]) -> None:
    """Refuse the first of ``guests`` that has no config on the host, as rendering it would:
    said before any refusal of the plan, which a guest that is not there would only hide. A VMID
    Proxmox cannot have is left to the planner, whose refusal says so.

    >>> require_guests(Inventory(source="pve1", hostname="pve1"), [GuestRef(type="lxc", vmid=999)])
    Traceback (most recent call last):
    ...
    proxgpu.errors.RenderError: pve1: /etc/pve/lxc/999.conf: no such container config; create \
the container first (`pct create`) or name one that exists (none on this host)

    :raises RenderError: naming the config and the guests of that kind the host has.
    """
    path = missing_guest(guests, inventory.guest_configs)
    if path is not None:
        raise no_such_guest(inventory.source, path, inventory.guest_configs)


def missing_guest(guests: Iterable[GuestRef], configs: Container[str]) -> str | None:
    """The config of the first of ``guests`` that ``configs`` (paths) lacks, else ``None``; a
    VMID Proxmox cannot have is left to the planner.

    >>> missing_guest([GuestRef(type="vm", vmid=300)], {"/etc/pve/lxc/300.conf"})
    '/etc/pve/qemu-server/300.conf'
    """
    for guest in guests:
        path = guest_config(guest.type, guest.vmid)
        if VMID_MIN <= guest.vmid <= VMID_MAX and path not in configs:
            return path
    return None


def guest_config_of(ctx: RenderContext, path: str, kind: str) -> GuestConfig:
    before = ctx.inventory.guest_configs.get(path)
    if before is None:
        raise no_such_guest(ctx.inventory.source, path, ctx.inventory.guest_configs)
    return GuestConfig.parse(before)


def no_such_guest(
    source: str, path: str, configs: Iterable[str], where: str = "", none: str = "on this host"
) -> RenderError:
    """The error for a guest whose config ``path`` is not among ``configs`` (those of the host,
    or of every node of a cluster read, ``where`` saying so): what to create, or which guests of
    that kind there are.

    >>> print(no_such_guest("cluster gpu-lab", "/etc/pve/qemu-server/999.conf",
    ...                     ["/etc/pve/qemu-server/300.conf"], " on any node read"))
    cluster gpu-lab: /etc/pve/qemu-server/999.conf: no such VM config on any node read; create \
the VM first (`qm create`) or name one that exists (300)
    """
    folder = path.rsplit("/", 1)[0] + "/"
    kind = "container" if folder == LXC_CONFIG_DIR else "VM"
    existing = sorted(
        {p.rsplit("/", 1)[1].removesuffix(".conf") for p in configs if p.startswith(folder)}
    )
    return RenderError(
        source,
        path,
        f"no such {kind} config{where}",
        f"create the {kind} first (`{'pct create' if kind == 'container' else 'qm create'}`)"
        f" or name one that exists ({', '.join(existing) or f'none {none}'})",
    )
