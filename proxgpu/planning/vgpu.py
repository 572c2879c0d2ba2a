"""The vGPU role: GPUs that VMs use mediated devices of, and the vGPUs ``--vm VMID:vgpu=TYPE``
asks for.

qemu-server creates a ``hostpciN: ADDR,mdev=TYPE`` device through the GPU's host driver at the
VM's start (``prepare_pci_device`` in PVE/QemuServer/PCI.pm calls ``pci_create_mdev_device``,
which writes a UUID into ``mdev_supported_types/TYPE/create`` and refuses when
``available_instances`` is 0): such a GPU must stay on its host driver, and it must be named by
its function (``0000:81:00.0``), since a slot's several functions make a "multifunction device"
qemu-server refuses with ``mdev``.

On Ampere and later NVIDIA's vGPU runs on the GPU's SR-IOV virtual functions, one vGPU each,
and the entry names a VF (``hostpci0: 0000:81:01.2,mdev=nvidia-1155``): a VF with
``mdev_supported_types/`` gets a mediated device as above; one with NVIDIA's own ``nvidia/``
files (vGPU 17 and later) gets the type's id written to its ``current_vgpu_type``
(``parse_hostpci`` turns ``mdev=nvidia-ID`` into qemu-server's ``nvidia`` option when lspci
shows that directory, and ``create_nvidia_device`` in PCI/Mdev.pm writes it; the VF is then
passed through as itself). qemu-server uses exactly the VF the entry names, so a vGPU the plan
adds names a free one: holding no vGPU, named by no VM's config, listing the type as creatable.
VFs exist only while the GPU's driver keeps SR-IOV on, so a VM using one keeps the GPU there.

So ``available_instances`` counts only the instances still free now: those of running VMs
exist already (``mdev_supported_types/TYPE/devices/`` lists them), while each stopped VM's
entry will take one more at its start; both count against a type's capacity. A vGPU that exists
but that no VM's config names (made by hand, left behind) is a use too: its GPU stays.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from proxgpu.inspection.inventory import Gpu
from proxgpu.pci import normalize_pci_address
from proxgpu.planning import wording
from proxgpu.planning.context import Context
from proxgpu.planning.model import Role, VgpuUse
from proxgpu.pve.claims import DeviceClaim


@dataclass(frozen=True)
class LiveVgpu:
    """A vGPU that exists now: on ``function`` (the GPU's own, or one of its VFs), of
    ``mdev_type``, as mediated device ``uuid`` (``None``: a VF's vGPU of NVIDIA's own
    interface, its ``nvidia/current_vgpu_type``).

    >>> LiveVgpu("0000:81:00.0", "nvidia-1155", "0b8a5c3e-9d41-4f6e-8a27-3c5d9e1f7a20").removal
    'echo 1 > /sys/bus/mdev/devices/0b8a5c3e-9d41-4f6e-8a27-3c5d9e1f7a20/remove'
    >>> LiveVgpu("0000:81:00.6", "nvidia-1155", None).label
    'vGPU nvidia-1155 on VF 0000:81:00.6'
    """

    function: str
    mdev_type: str
    uuid: str | None

    @property
    def label(self) -> str:
        """How a message names it."""
        if self.uuid is None:
            return f"vGPU {self.mdev_type} on VF {self.function}"
        return f"mediated device {self.uuid} ({self.mdev_type})"

    @property
    def removal(self) -> str:
        """The command that removes it (the mdev sysfs ABI's ``remove``; NVIDIA's type 0)."""
        if self.uuid is None:
            return f"echo 0 > /sys/bus/pci/devices/{self.function}/nvidia/current_vgpu_type"
        return f"echo 1 > /sys/bus/mdev/devices/{self.uuid}/remove"


def vgpu_users(ctx: Context) -> dict[str, list[VgpuUse]]:
    """GPU address -> the vGPUs the VMs' ``hostpciN: ...,mdev=TYPE`` entries use of it, and the
    SR-IOV virtual functions of it they pass through."""
    users: dict[str, list[VgpuUse]] = defaultdict(list)
    for claim in ctx.claims:
        vf = ctx.index.virtual_function(claim.pci_address)
        if claim.pci_address is None or (claim.mdev is None and vf is None):
            continue
        use = VgpuUse(
            vmid=claim.guest.vmid,
            mdev_type=claim.mdev,
            function=None if vf is None else vf.address,
        )
        for gpu in _at(ctx, claim.pci_address):
            if use not in users[gpu.address]:
                users[gpu.address].append(use)
    return dict(users)


def live_vgpus(gpu: Gpu) -> list[LiveVgpu]:
    """Every vGPU that exists on ``gpu`` now: its mediated devices, its VFs' mediated devices and
    the vGPUs its VFs hold (NVIDIA's ``current_vgpu_type``)."""
    found = [LiveVgpu(gpu.address, t.id, uuid) for t in gpu.mdev_types for uuid in t.instances]
    for vf in gpu.virtual_functions:
        found += [LiveVgpu(vf.address, t.id, uuid) for t in vf.mdev_types for uuid in t.instances]
        if vf.current_vgpu_type:
            found.append(LiveVgpu(vf.address, f"nvidia-{vf.current_vgpu_type}", None))
    return found


def plan_vgpus(
    ctx: Context, roles: dict[str, Role]
) -> tuple[dict[str, Role], dict[str, list[VgpuUse]]]:
    """The roles with every GPU that has or gets vGPUs in the vGPU role, and those vGPUs by GPU.

    A GPU with vGPUs in use, or with vGPUs that exist and no VM's config names, keeps its host
    driver whatever its node's role: only naming it in ``--vfio-gpus`` sends it to vfio-pci (and
    the claim check, or here the unnamed vGPU, refuses that). A requested vGPU goes on a GPU
    offering its type with an instance (a free VF) left: one serving vGPUs already, then one
    that would go to vfio-pci, then one of the container's, the most instances left first.
    """
    named = {gpu.address for text in ctx.policy.vfio_gpus for gpu in _at(ctx, text)}
    uses = vgpu_users(ctx)
    unnamed = _unnamed_vgpus(ctx)
    kept = set(uses) | set(unnamed)
    roles = {a: Role.VGPU if a in kept and a not in named else r for a, r in roles.items()}
    _tell_unnamed(ctx, unnamed, named)
    _warn_about_overcommit(ctx, uses)
    for vmid, mdev_type in ctx.policy.vgpus:
        if any(u.vmid == vmid and u.mdev_type == mdev_type for a in uses for u in uses[a]):
            continue  # the VM's config has that vGPU already
        picked = _pick(ctx, roles, uses, mdev_type, named)
        if picked is None:
            _report_none_left(ctx, vmid, mdev_type, uses, named)
            continue
        gpu, vf = picked
        if vf is not None:
            _warn_about_promised_vfs(ctx, gpu, vf, uses)
        roles[gpu.address] = Role.VGPU
        added = VgpuUse(vmid=vmid, mdev_type=mdev_type, added=True, function=vf)
        uses.setdefault(gpu.address, []).append(added)
    return roles, uses


def _unnamed_vgpus(ctx: Context) -> dict[str, list[LiveVgpu]]:
    """GPU address -> its vGPUs that exist but that no VM's config names. qemu-server names the
    mediated device of a VM's ``hostpciN`` by N and the VMID (``generate_mdev_uuid``); a VF's
    own vGPU is the VM's whose config names the VF."""
    entries: set[tuple[int, int, str]] = set()  # (VMID, hostpci index, function)
    vfs_named: set[str] = set()
    for claim in ctx.claims:
        function = _claimed_function(ctx, claim)
        if function is None:
            continue
        vfs_named.add(function)
        index = claim.line.partition(":")[0].removeprefix("hostpci")
        if index.isdigit():
            entries.add((claim.guest.vmid, int(index), function))
    found: dict[str, list[LiveVgpu]] = {}
    for gpu in ctx.index.gpus:
        lone = [live for live in live_vgpus(gpu) if not _named(live, entries, vfs_named)]
        if lone:
            found[gpu.address] = lone
    return found


def _named(live: LiveVgpu, entries: set[tuple[int, int, str]], vfs_named: set[str]) -> bool:
    """Whether a VM's config names ``live``: its mediated device by the VMID and hostpci index
    qemu-server made it for, or a VF's own vGPU by the VF."""
    if live.uuid is None:
        return live.function in vfs_named
    return _qemu_server_entry(live.uuid, live.function) in entries


def _claimed_function(ctx: Context, claim: DeviceClaim) -> str | None:
    """The function a VM's entry makes its vGPU on (a VF, or the GPU's own), if it is one."""
    vf = ctx.index.virtual_function(claim.pci_address)
    if vf is not None:
        return vf.address
    gpus = _at(ctx, claim.pci_address or "") if claim.mdev else []
    return gpus[0].address if len(gpus) == 1 else None


def _qemu_server_entry(uuid: str, function: str) -> tuple[int, int, str] | None:
    """``(VMID, hostpci index, function)`` of a mediated device qemu-server made, from its UUID;
    ``None`` for one it did not make."""
    if not _PVE_UUID.fullmatch(uuid):
        return None
    return int(uuid.rsplit("-", 1)[1]), int(uuid.split("-", 1)[0]), function


def _tell_unnamed(ctx: Context, unnamed: dict[str, list[LiveVgpu]], named: set[str]) -> None:
    """A vGPU that exists holds its GPU's driver: moving the GPU would end it (and an unbind
    waits while a VM uses it). It is kept, and said, or refused where ``--vfio-gpus`` names it."""
    for address, lives in sorted(unnamed.items()):
        them = "it" if len(lives) == 1 else "them"
        listed = wording.join(live.label for live in lives)
        removal = "; ".join(live.removal for live in lives)
        if address in named:
            ctx.problem(
                "claimed",
                f"{address} is named in --vfio-gpus, but {listed} "
                f"{'exists' if len(lives) == 1 else 'exist'} on it and no VM's config names "
                f"{them}: moving the GPU to vfio-pci ends {them} (and its unbind waits while "
                f"something uses {them})",
                f"if nothing uses {them}, remove {them} ({removal}) and plan again, or leave "
                f"{address} out of --vfio-gpus",
            )
            continue
        ctx.warnings.append(
            f"{address} stays on the host driver for {listed}, which "
            f"{'exists' if len(lives) == 1 else 'exist'} on it but no VM's config names (made "
            "by hand, or left behind by a VM): no container or VM is given the GPU; if nothing "
            f"uses {them}, remove {them} ({removal}) and plan again"
        )


def _left(gpu: Gpu, mdev_type: str, uses: dict[str, list[VgpuUse]]) -> int:
    """Instances of ``mdev_type`` left on ``gpu`` once every VM configured with one has started
    and the plan's added vGPUs exist: the driver's count leaves out only the instances that exist
    (running VMs'); each stopped VM's entry takes one more at its start. On a GPU with VFs, the
    VFs that can make one now and that no VM names."""
    if gpu.virtual_functions:
        return len(_free_vfs(gpu, mdev_type, uses))
    added = sum(u.added and u.mdev_type == mdev_type for u in uses.get(gpu.address, []))
    return _free(gpu, mdev_type) - len(_waiting(gpu, mdev_type, uses)) - added


def _free_vfs(gpu: Gpu, mdev_type: str, uses: dict[str, list[VgpuUse]]) -> list[str]:
    """The VFs of ``gpu`` a vGPU of ``mdev_type`` can go on: each holds none and lists the type
    as creatable now, and no VM's entry (nor one the plan adds) names it."""
    taken = {u.function for u in uses.get(gpu.address, [])}
    return [
        vf.address
        for vf in gpu.virtual_functions
        if vf.offers(mdev_type) and vf.address not in taken
    ]


def _free(gpu: Gpu, mdev_type: str) -> int:
    """``available_instances`` of the type: what the driver can create now."""
    return next((t.available for t in gpu.mdev_types if t.id == mdev_type), 0)


def _waiting(gpu: Gpu, mdev_type: str, uses: dict[str, list[VgpuUse]]) -> list[int]:
    """The VMs whose config has a vGPU of ``mdev_type`` on ``gpu`` that does not exist now (the
    VM is stopped): qemu-server creates it at the VM's start (``pci_create_mdev_device``), named
    by the VM's id (the UUID's last group), and fails the start when none is available."""
    instances = next((t.instances for t in gpu.mdev_types if t.id == mdev_type), [])
    running = {int(uuid.rsplit("-", 1)[1]) for uuid in instances if _PVE_UUID.fullmatch(uuid)}
    return [
        u.vmid
        for u in uses.get(gpu.address, [])
        if not u.added and u.mdev_type == mdev_type and u.vmid not in running
    ]


#: The UUIDs qemu-server gives the mdevs it creates (``generate_mdev_uuid``: the hostpci index
#: in the first group, the VMID in the last).
_PVE_UUID = re.compile(r"[0-9]{8}-0000-0000-0000-[0-9]{12}")


def _warn_about_overcommit(ctx: Context, uses: dict[str, list[VgpuUse]]) -> None:
    """Warn where the VMs' configs already ask a GPU for more vGPUs of a type than it has left:
    the VM started last fails to start. Only types the GPU offers: a type it lacks is another
    matter (no host driver for vGPUs, or a capture without ``mdev_supported_types/``)."""
    for gpu in ctx.index.gpus:
        asked = {u.mdev_type for u in uses.get(gpu.address, []) if u.mdev_type}
        for mdev_type in sorted(asked & {t.id for t in gpu.mdev_types}):
            waiting = _waiting(gpu, mdev_type, uses)
            if len(waiting) > _free(gpu, mdev_type):
                vms = wording.join(f"VM {vmid}" for vmid in waiting)
                ctx.warnings.append(
                    f"{gpu.address}: {vms} (stopped) {'each need' if len(waiting) > 1 else 'needs'}"
                    f" a {mdev_type} vGPU at start, but only {_free(gpu, mdev_type)} can be made "
                    "now (available_instances): a VM started without one fails to start; move "
                    "one to another GPU or type"
                )


def _warn_about_promised_vfs(
    ctx: Context, gpu: Gpu, vf: str, uses: dict[str, list[VgpuUse]]
) -> None:
    """A VF says which types it could make now, not how many more the GPU has room for: stopped
    VMs whose entries name other VFs of the GPU take their share only at their start."""
    live = {vf.address for vf in gpu.virtual_functions if vf.live_vgpus}
    stopped = sorted(
        {u.vmid for u in uses.get(gpu.address, []) if u.function and u.function not in live}
    )
    if not stopped:
        return
    vms = wording.join(f"VM {vmid}" for vmid in stopped)
    ctx.warnings.append(
        f"{gpu.address}: the new vGPU goes on its VF {vf}, which can make one now, but {vms} "
        f"(stopped) {'make theirs' if len(stopped) > 1 else 'makes its own'} on this GPU at "
        "start, and a VF lists only what fits beside the vGPUs that exist: if the GPU has no "
        "room for all, the VM started last fails to start (nvidia-smi vgpu -c lists what still "
        "fits)"
    )


def _pick(
    ctx: Context,
    roles: dict[str, Role],
    uses: dict[str, list[VgpuUse]],
    mdev_type: str,
    named: set[str],
) -> tuple[Gpu, str | None] | None:
    """The GPU a new vGPU of ``mdev_type`` goes on and, on a GPU with VFs, the first free VF
    that can make one (qemu-server takes the one the entry names)."""
    preference = {Role.VGPU: 0, Role.VFIO: 1, Role.HOST: 2}
    fits = [
        gpu
        for gpu in ctx.index.gpus
        if gpu.address not in named and _left(gpu, mdev_type, uses) > 0
    ]
    gpu = min(
        fits,
        key=lambda g: (preference[roles[g.address]], -_left(g, mdev_type, uses), g.address),
        default=None,
    )
    if gpu is None:
        return None
    return gpu, (_free_vfs(gpu, mdev_type, uses)[0] if gpu.virtual_functions else None)


def _offers(gpu: Gpu) -> set[str]:
    """Every vGPU type ``gpu`` shows, on itself or on its VFs."""
    return {t.id for t in gpu.mdev_types} | {
        t for vf in gpu.virtual_functions for t in vf.known_types
    }


def _report_none_left(
    ctx: Context, vmid: int, mdev_type: str, uses: dict[str, list[VgpuUse]], named: set[str]
) -> None:
    offering = [g for g in ctx.index.gpus if mdev_type in _offers(g)]
    if not offering:
        types = sorted({t for g in ctx.index.gpus for t in _offers(g)})
        ctx.problem(
            "no-fit",
            f"VM {vmid} asks for a vGPU of type {mdev_type}, which no GPU of "
            f"{ctx.inventory.hostname} offers (no mdev_supported_types/{mdev_type})",
            f"ask for a type the GPUs offer: {wording.join(types)}"
            if types
            else "install and load the GPU vendor's vGPU host driver, which offers the types",
        )
        return
    counts = wording.join(
        f"{g.address} {max(_left(g, mdev_type, uses), 0)}{_why_none(g, mdev_type, uses)}"
        + (" but named in --vfio-gpus" if g.address in named else "")
        for g in offering
    )
    ctx.problem(
        "no-fit",
        f"VM {vmid} asks for a vGPU of type {mdev_type}, but no instance is left "
        f"(available_instances after the plan: {counts})",
        "free an instance (stop or reconfigure a VM using one), leave the GPUs offering it out "
        "of --vfio-gpus, or ask for a smaller type",
    )


def _why_none(gpu: Gpu, mdev_type: str, uses: dict[str, list[VgpuUse]]) -> str:
    """`` (1 free now, promised to stopped VM 311)`` when stopped VMs' entries take what the
    driver offers now; on a GPU with VFs, that none of them is free to make one; nothing
    otherwise."""
    if gpu.virtual_functions:
        if _left(gpu, mdev_type, uses) > 0:
            return ""
        return f" (of its {wording.count(len(gpu.virtual_functions), 'VF')}, no free one lists it)"
    waiting = _waiting(gpu, mdev_type, uses)
    if not waiting:
        return ""
    vms = wording.join(f"VM {vmid}" for vmid in waiting)
    return f" ({_free(gpu, mdev_type)} free now, promised to stopped {vms})"


def _at(ctx: Context, text: str) -> list[Gpu]:
    """The GPUs at an address as written; none for text that is no address (PVE refuses it, and
    the option checks have said so)."""
    try:
        return ctx.index.at(normalize_pci_address(text))
    except ValueError:
        return []
