"""Human-readable text of a plan and its change set, as ``plan`` and ``apply`` print them."""

from __future__ import annotations

from proxgpu.cli.text import table
from proxgpu.inspection.inventory import Inventory
from proxgpu.planning.model import Plan, PlanGroup
from proxgpu.planning.runtimes import CUDA, numbered
from proxgpu.planning.userspace import next_steps
from proxgpu.planning.wording import vgpu_list
from proxgpu.rendering.changes import ChangeSet


def _group_title(group: PlanGroup) -> str:
    target = ", ".join(f"{g.type.upper()} {g.vmid}" for g in group.guests) or "no guest"
    if group.vgpus:
        target = f"vGPUs of {vgpu_list(group.vgpus)}"
    action = f"{group.driver} ({group.role.action})"
    return f"{group.node_label} -> {action}, for {target}; CPUs {group.cpus}"


def mig_lines(group: PlanGroup, inv: Inventory) -> list[str]:
    """Each container's MIG instance of the group's GPU, and how it selects it in CUDA."""
    lines = []
    hosts = [gpu.address for gpu in numbered(inv, CUDA)]
    for use in group.mig:
        nodes = ", ".join(path.rsplit("/", 1)[1] for path in use.cap_nodes)
        lines.append(f"CT {use.vmid}: MIG GI {use.gi} CI {use.ci} ({nodes})")
        value = use.cuda_visible_devices
        if value is not None:
            lines.append(f"  in it: CUDA_VISIBLE_DEVICES={value}")
        else:
            index = hosts.index(group.gpus[0]) if group.gpus[0] in hosts else "?"
            lines.append(
                "  in it: CUDA_VISIBLE_DEVICES=MIG-<UUID>; the UUID is unknown to inspection: "
                f"nvidia-smi -L on the host lists it as the MIG Device of GPU {index} that "
                f"nvidia-smi's MIG devices table shows for GI {use.gi} CI {use.ci}"
            )
    return lines


def render_plan(plan: Plan, inv: Inventory) -> str:
    """The split as a sysadmin reviews it: each group, its GPUs, pinning and target."""
    lines = [f"Plan for {inv.hostname}:"]
    for group in plan.groups:
        lines.append(
            f"  {_group_title(group)}, memory node(s) "
            f"{','.join(str(n) for n in group.memory_nodes) or '-'}"
        )
        rows = [["GPU", "MODEL", "NOW", "FUNCTIONS"]]
        for address in group.gpus:
            gpu = inv.gpu(address)
            rows.append([address, gpu.label, gpu.driver or "-", str(len(gpu.functions))])
        lines.append(table(rows, indent="    "))
        lines += [f"    {line}" for line in mig_lines(group, inv)]
    lines += _tensor_parallel_lines(plan)
    if plan.enable_iommu:
        lines.append("  The kernel command line gets the IOMMU turned on.")
    lines += [f"  warning: {w}" for w in plan.warnings]
    lines += [f"  note: {n}" for n in plan.notes]
    lines += [f"  next step: {step}" for step in next_steps(plan.userspace)]
    return "\n".join(lines)


def _tensor_parallel_lines(plan: Plan) -> list[str]:
    """Each host group's NUMA-local sets under a heading naming its containers, each set with
    the GPUs that form it (the numbers are the container's own, so they differ between groups)."""
    lines: list[str] = []
    for whom, sizes in plan.advice_by_guests():
        first = sizes[0]
        # With no container named, the numbers are those a container given the group's
        # GPUs would see: say so rather than speak of a container that is not there.
        seen_by = "the container will" if first.guests else "a container given them would"
        lines.append(
            f"  NUMA-local {first.variable} for {whom}, numbered as {seen_by} "
            f"see them ({first.ordering_note}):"
        )
        for advice in sizes:
            # A plan recorded before gpu_sets existed (an older journal entry) has numbers only.
            gpu_sets = advice.gpu_sets or [[] for _ in advice.device_sets]
            sets = [
                f"{numbers} ({', '.join(gpus)})" if gpus else numbers
                for numbers, gpus in zip(advice.device_sets, gpu_sets, strict=True)
            ]
            lines.append(f"    TP={advice.size}: " + " | ".join(sets))
    return lines


def render_changes(changes: ChangeSet, color: bool = False) -> str:
    """Every changed file as a unified diff, then the actions and a one-line summary."""
    diffs = changes.unified_diff(color)
    notes = [f"warning: {w}\n" for w in changes.warnings]
    notes += [f"note: {n}\n" for n in changes.notes]
    notes += [f"then run: {' '.join(a.argv)}  ({a.why})\n" for a in changes.actions]
    return (diffs + "\n" if diffs else "") + "".join(notes) + changes.summary() + "\n"
