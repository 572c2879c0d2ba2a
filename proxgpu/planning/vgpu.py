"""The vGPU role: GPUs that VMs use mediated devices of, and the vGPUs ``--vm VMID:vgpu=TYPE``
asks for.

qemu-server creates a ``hostpciN: ADDR,mdev=TYPE`` device through the GPU's host driver at the
VM's start (``prepare_pci_device`` in PVE/QemuServer/PCI.pm calls ``pci_create_mdev_device``,
which writes a UUID into ``mdev_supported_types/TYPE/create`` and refuses when
``available_instances`` is 0; an NVIDIA ``nvidia-N`` type on the newer driver interface is left
to the driver, "nothing to do"): such a GPU must stay on its host driver, and it must be named by
its function (``0000:81:00.0``), since a slot's several functions make a "multifunction device"
qemu-server refuses with ``mdev``.

So ``available_instances`` counts only the instances still free now: those of running VMs
exist already (``mdev_supported_types/TYPE/devices/`` lists them), while each stopped VM's
entry will take one more at its start; both count against a type's capacity.
"""

from __future__ import annotations

import re
from collections import defaultdict

from proxgpu.inspection.inventory import Gpu
from proxgpu.pci import normalize_pci_address
from proxgpu.planning import wording
from proxgpu.planning.context import Context
from proxgpu.planning.model import Role, VgpuUse
from proxgpu.pve.claims import device_claims


def vgpu_users(ctx: Context) -> dict[str, list[VgpuUse]]:
    """GPU address -> the vGPUs the VMs' ``hostpciN: ...,mdev=TYPE`` entries use of it."""
    users: dict[str, list[VgpuUse]] = defaultdict(list)
    for claim in device_claims(ctx.inventory.guest_configs, ctx.inventory.node_name):
        if claim.mdev is None or claim.pci_address is None:
            continue
        use = VgpuUse(vmid=claim.guest.vmid, mdev_type=claim.mdev)
        for gpu in _at(ctx, claim.pci_address):
            if use not in users[gpu.address]:
                users[gpu.address].append(use)
    return dict(users)


def plan_vgpus(
    ctx: Context, roles: dict[str, Role]
) -> tuple[dict[str, Role], dict[str, list[VgpuUse]]]:
    """The roles with every GPU that has or gets vGPUs in the vGPU role, and those vGPUs by GPU.

    A GPU with vGPUs in use keeps its host driver whatever its node's role: only naming it in
    ``--vfio-gpus`` sends it to vfio-pci (and the claim check refuses that). A requested vGPU goes
    on a GPU offering its type with an instance left: one serving vGPUs already, then one that
    would go to vfio-pci, then one of the container's, the most instances left first.
    """
    named = {gpu.address for text in ctx.policy.vfio_gpus for gpu in _at(ctx, text)}
    uses = vgpu_users(ctx)
    roles = {a: Role.VGPU if a in uses and a not in named else r for a, r in roles.items()}
    _warn_about_overcommit(ctx, uses)
    for vmid, mdev_type in ctx.policy.vgpus:
        if any(u.vmid == vmid and u.mdev_type == mdev_type for a in uses for u in uses[a]):
            continue  # the VM's config has that vGPU already
        gpu = _pick(ctx, roles, uses, mdev_type, named)
        if gpu is None:
            _report_none_left(ctx, vmid, mdev_type, uses, named)
            continue
        roles[gpu.address] = Role.VGPU
        uses.setdefault(gpu.address, []).append(VgpuUse(vmid=vmid, mdev_type=mdev_type, added=True))
    return roles, uses


def _left(gpu: Gpu, mdev_type: str, uses: dict[str, list[VgpuUse]]) -> int:
    """Instances of ``mdev_type`` left on ``gpu`` once every VM configured with one has started
    and the plan's added vGPUs exist: the driver's count leaves out only the instances that exist
    (running VMs'); each stopped VM's entry takes one more at its start."""
    added = sum(u.added and u.mdev_type == mdev_type for u in uses.get(gpu.address, []))
    return _free(gpu, mdev_type) - len(_waiting(gpu, mdev_type, uses)) - added


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
        offered = {t.id for t in gpu.mdev_types}
        for mdev_type in sorted({u.mdev_type for u in uses.get(gpu.address, [])} & offered):
            waiting = _waiting(gpu, mdev_type, uses)
            if len(waiting) > _free(gpu, mdev_type):
                vms = wording.join(f"VM {vmid}" for vmid in waiting)
                ctx.warnings.append(
                    f"{gpu.address}: {vms} (stopped) {'each need' if len(waiting) > 1 else 'needs'}"
                    f" a {mdev_type} vGPU at start, but only {_free(gpu, mdev_type)} can be made "
                    "now (available_instances): a VM started without one fails to start; move "
                    "one to another GPU or type"
                )


def _pick(
    ctx: Context,
    roles: dict[str, Role],
    uses: dict[str, list[VgpuUse]],
    mdev_type: str,
    named: set[str],
) -> Gpu | None:
    preference = {Role.VGPU: 0, Role.VFIO: 1, Role.HOST: 2}
    fits = [
        gpu
        for gpu in ctx.index.gpus
        if gpu.address not in named and _left(gpu, mdev_type, uses) > 0
    ]
    return min(
        fits,
        key=lambda g: (preference[roles[g.address]], -_left(g, mdev_type, uses), g.address),
        default=None,
    )


def _report_none_left(
    ctx: Context, vmid: int, mdev_type: str, uses: dict[str, list[VgpuUse]], named: set[str]
) -> None:
    offering = [g for g in ctx.index.gpus if any(t.id == mdev_type for t in g.mdev_types)]
    if not offering:
        types = sorted({t.id for g in ctx.index.gpus for t in g.mdev_types})
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
    driver offers now; nothing otherwise."""
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
