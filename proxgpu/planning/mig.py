"""The MIG role: GPUs in MIG mode whose instances go to containers, one each
(``--lxc 200:mig=0/1``).

The MIG layout is the admin's (``nvidia-smi mig -cgi ... -C``); the plan takes the instance the
host has now, by its ids, and records its capability minors so that ``verify`` and apply can
tell when it is gone or was made again (:func:`mig_drift`). A GPU is named as the rest of the
command line names GPUs: by CUDA's index as the host numbers its GPUs today (nvidia-smi's order,
PCI bus order), or by PCI address.
"""

from __future__ import annotations

from collections import defaultdict

from proxgpu.inspection.inventory import Gpu, Inventory, MigInstance
from proxgpu.pci import normalize_pci_address
from proxgpu.planning import wording
from proxgpu.planning.context import Context
from proxgpu.planning.model import MigUse, Plan, Role
from proxgpu.planning.requests import MigSpec
from proxgpu.planning.runtimes import CUDA, numbered


def plan_mig(
    ctx: Context, roles: dict[str, Role]
) -> tuple[dict[str, Role], dict[str, list[MigUse]]]:
    """The roles with every GPU a container gets a MIG instance of in the MIG role, and those
    instances by GPU address (refusing, as problems, a GPU or instance that is not there, one
    asked for twice, or a GPU named in ``--vfio-gpus`` or serving vGPUs)."""
    roles = dict(roles)
    uses: dict[str, list[MigUse]] = defaultdict(list)
    for spec in ctx.policy.lxc_mig:
        gpu = _gpu(ctx, spec)
        if gpu is None:
            continue
        instance = _instance(ctx, spec, gpu)
        if instance is None or gpu.nvidia_minor is None or not _free(ctx, spec, gpu, roles, uses):
            continue
        roles[gpu.address] = Role.MIG
        uses[gpu.address].append(
            MigUse(
                vmid=spec.vmid,
                gpu_minor=gpu.nvidia_minor,
                gi=instance.gi,
                ci=instance.ci,
                gi_minor=instance.gi_cap.minor,
                ci_minor=instance.ci_cap.minor,
                uuid=instance.uuid,
            )
        )
    return roles, dict(uses)


def _gpu(ctx: Context, spec: MigSpec) -> Gpu | None:
    """The GPU ``spec`` names, or ``None`` (a problem said why)."""
    cuda = numbered(ctx.inventory, CUDA)
    if spec.gpu.isdigit():
        if int(spec.gpu) < len(cuda):
            return cuda[int(spec.gpu)]
        what = (
            f"CUDA numbers {wording.count(len(cuda), 'GPU')} on nvidia here, from 0, "
            f"{CUDA.ordering_note}"
        )
    else:
        try:
            found = ctx.index.at(normalize_pci_address(spec.gpu))
        except ValueError:
            found = []
        if len(found) == 1:
            return found[0]
        what = "no GPU at that address"
    ctx.problem(
        "policy",
        f"CT {spec.vmid}: --lxc {spec.vmid}:mig={spec.gpu}/...: {what}",
        "name the GPU by its index in nvidia-smi -L or by its PCI address",
    )
    return None


def _instance(ctx: Context, spec: MigSpec, gpu: Gpu) -> MigInstance | None:
    """The compute instance ``spec`` asks for on ``gpu``, or ``None`` (a problem said why)."""
    of_gi = [i for i in gpu.mig_instances if i.gi == spec.gi]
    chosen = [i for i in of_gi if spec.ci is None or i.ci == spec.ci]
    if len(chosen) == 1:
        return chosen[0]
    if not gpu.mig_instances:
        what = "has no MIG instance (MIG mode off, or no instance made)"
        smi = _smi_index(ctx, gpu)
        fix = f"turn MIG on and make the instances (nvidia-smi -i {smi} -mig 1; nvidia-smi mig "
        fix += f"-i {smi} -cgi PROFILE -C), then inspect again"
    elif not chosen and of_gi:
        what = f"has no compute instance {spec.ci} in GPU instance {spec.gi}"
        fix = f"name one it has: {wording.join(i.label for i in of_gi)}"
    elif not chosen:
        what = f"has no GPU instance {spec.gi}"
        fix = f"name one it has: GI {wording.join(sorted({i.gi for i in gpu.mig_instances}))}"
    else:
        what = f"GPU instance {spec.gi} holds {len(chosen)} compute instances"
        fix = f"name one as {spec.gpu}/{spec.gi}/CI: {wording.join(i.label for i in chosen)}"
    ctx.problem("policy", f"CT {spec.vmid}: {gpu.address} {what}", fix)
    return None


def _smi_index(ctx: Context, gpu: Gpu) -> str:
    """How ``nvidia-smi -i`` names ``gpu``: its index (nvidia-smi's are CUDA's in PCI order),
    or its PCI address where CUDA numbers it not."""
    cuda = [g.address for g in numbered(ctx.inventory, CUDA)]
    return str(cuda.index(gpu.address)) if gpu.address in cuda else gpu.address


def _free(
    ctx: Context,
    spec: MigSpec,
    gpu: Gpu,
    roles: dict[str, Role],
    uses: dict[str, list[MigUse]],
) -> bool:
    """Whether ``gpu`` can serve a MIG instance to ``spec``'s container (else a problem)."""
    named_vfio = {g.address for text in ctx.policy.vfio_gpus for g in _at(ctx, text)}
    taken = next(
        (u for u in uses.get(gpu.address, []) if u.gi == spec.gi and spec.ci in (None, u.ci)),
        None,
    )
    if gpu.address in named_vfio:
        what, fix = "is named in --vfio-gpus", "leave it out of --vfio-gpus"
    elif roles.get(gpu.address) is Role.VGPU:
        what, fix = "serves vGPU VMs", f"give CT {spec.vmid} a MIG instance of another GPU"
    elif taken is not None:
        what = f"GI {taken.gi} CI {taken.ci} goes to CT {taken.vmid} already"
        fix = "give each container an instance of its own (nvidia-smi mig -lci lists them)"
    else:
        return True
    ctx.problem("policy", f"CT {spec.vmid}: {gpu.address} {what}", fix)
    return False


def _at(ctx: Context, text: str) -> list[Gpu]:
    try:
        return ctx.index.at(normalize_pci_address(text))
    except ValueError:
        return []


def mig_drift(inventory: Inventory, plan: Plan) -> list[str]:
    """One line per MIG instance ``plan`` gives a container that the host no longer has as
    planned: gone, or made again with other capability minors (its container's ``devN``
    entries then name nodes of another instance or none).

    >>> mig_drift(Inventory(source="t", hostname="t"), Plan(groups=[], warnings=[],
    ...                                                      tensor_parallel=[]))
    []
    """
    lines = []
    for group in plan.groups:
        for use in group.mig:
            gpu = next((g for g in inventory.gpus if g.address in group.gpus), None)
            now = next(
                (i for i in (gpu.mig_instances if gpu else []) if (i.gi, i.ci) == (use.gi, use.ci)),
                None,
            )
            where = f"{group.gpus[0]} GI {use.gi} CI {use.ci} (CT {use.vmid})"
            if now is None:
                lines.append(
                    f"{where}: gone from the host; make it again (nvidia-smi mig -cgi ... -C) "
                    "or plan again"
                )
            elif (now.gi_cap.minor, now.ci_cap.minor) != (use.gi_minor, use.ci_minor):
                lines.append(
                    f"{where}: its capability minors are {now.gi_cap.minor},{now.ci_cap.minor}, "
                    f"the plan has {use.gi_minor},{use.ci_minor}: it was made again; plan again"
                )
    return lines
