"""Where one job runs: ``proxgpu run --tp N`` picks N GPUs on one NUMA node, and the CPUs and
memory of that node, on the machine it runs on (a host, or a container with its share of them).

>>> from proxgpu.inspection import Gpu, Inventory, NumaNode
>>> def gpu(bus, node):
...     address = f"0000:{bus}:00.0"
...     return Gpu(address=address, vendor_id="10de", device_id="2330", class_code="0x030200",
...                numa_node=node, driver="nvidia", functions=[address], function_info=[])
>>> inventory = Inventory(source="pve1", hostname="pve1",
...                       numa_nodes=[NumaNode(id=0, cpus="0-31"), NumaNode(id=1, cpus="32-63")],
...                       gpus=[gpu("01", 0), gpu("11", 0), gpu("81", 1), gpu("91", 1)])
>>> job = place_job(inventory, 2, node=1)
>>> (job.numa_node, job.cpus, job.environment)
(1, '32-63', {'CUDA_DEVICE_ORDER': 'PCI_BUS_ID', 'CUDA_VISIBLE_DEVICES': '2,3'})
>>> place_job(inventory, 4)
Traceback (most recent call last):
...
proxgpu.errors.UsageError: pve1: no NUMA node has 4 CUDA GPUs: node 0 has 2, node 1 has 2; \
ask for fewer with --tp
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field

from proxgpu.cpulist import format_cpulist, parse_cpulist
from proxgpu.errors import UsageError
from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.planning import wording
from proxgpu.planning.placement import GpuPlacement
from proxgpu.planning.runtimes import (
    RUNTIMES,
    Runtime,
    none_seen,
    not_whole,
    numbered,
    numbering_note,
)


@dataclass(frozen=True, kw_only=True)
class JobPlacement:
    """The GPUs, CPUs and memory node one job gets, and the environment that selects the GPUs.

    ``gpus`` carry the runtime's indexes (``runtime`` names it); ``environment`` holds its
    variables (``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for CUDA), and
    ``unset`` the inherited ones that would renumber the GPUs first. ``numbering`` says how the
    indexes are meant. ``passed_over`` says, for each GPU the runtime numbers but no job gets
    whole (in MIG mode, serving vGPUs), why and what to do instead.

    >>> JobPlacement(runtime="CUDA", numa_node=0, cpus="0-31", gpus=[], environment={},
    ...              numbering="").numa_node
    0
    """

    runtime: str
    numa_node: int
    cpus: str
    gpus: list[GpuPlacement]
    environment: dict[str, str]
    unset: list[str] = field(default_factory=list)
    numbering: str
    passed_over: list[str] = field(default_factory=list)


def place_job(
    inventory: Inventory,
    size: int,
    node: int | None = None,
    usable_cpus: Collection[int] | None = None,
) -> JobPlacement:
    """``size`` GPUs of one NUMA node, the first ``size`` in PCI order on it, for one job.

    The node is ``node``, else the lowest-numbered one with ``size`` GPUs and a CPU in
    ``usable_cpus``; a GPU of unknown node is on none, unless the host has only one. A GPU that
    is no whole GPU for a job (in MIG mode, serving vGPUs: see
    :func:`~proxgpu.planning.runtimes.not_whole`) keeps its index but is never chosen, and is
    named in ``passed_over`` and in any refusal.
    ``usable_cpus`` are the CPUs the job may run on (a container's cpuset, an inherited
    affinity; ``None``: every CPU): the job gets the node's CPUs among them, never one the
    kernel would not let it use. The runtime is the
    first of CUDA, ROCm and Level Zero that numbers a GPU on the host (narrow the inventory to one
    vendor to choose another); the indexes are that runtime's (see
    :mod:`~proxgpu.planning.runtimes`).

    >>> from proxgpu.inspection import Gpu, NumaNode
    >>> gpus = [Gpu(address=f"0000:{bus}:00.0", vendor_id="10de", device_id="2330",
    ...             class_code="0x030200", numa_node=node, driver="nvidia",
    ...             functions=[f"0000:{bus}:00.0"], function_info=[])
    ...         for bus, node in (("01", 0), ("81", 1), ("91", 1))]
    >>> inventory = Inventory(source="pve1", hostname="pve1", gpus=gpus,
    ...                       numa_nodes=[NumaNode(id=0, cpus="0-7"), NumaNode(id=1, cpus="8-15")])
    >>> job = place_job(inventory, 2)
    >>> job.numa_node, job.cpus, [gpu.index for gpu in job.gpus]
    (1, '8-15', [1, 2])
    >>> place_job(inventory, 2, usable_cpus=range(4, 12)).cpus
    '8-11'

    :raises UsageError: when ``size`` is below 1, the host has no such node, no runtime sees a
        GPU, or no node (or not ``node``) has ``size`` of them, naming each node's count.
    """
    if size < 1:
        raise UsageError(f"--tp {size}: a job needs at least 1 GPU")
    runtime = _runtime(inventory)
    gpus = numbered(inventory, runtime)
    index = {gpu.address: i for i, gpu in enumerate(gpus)}
    # Numbered, so their indexes count, but never a whole GPU for a job.
    passed = [
        f"{runtime.name} GPU {index[gpu.address]}: {why}"
        for gpu in gpus
        if (why := not_whole(gpu)) is not None
    ]
    # On a host of one NUMA node (a VM, a one-socket machine, often with numa_node -1), every
    # GPU is on that node, whatever the firmware says.
    only = inventory.numa_nodes[0].id if len(inventory.numa_nodes) == 1 else None
    by_node: dict[int | None, list[Gpu]] = defaultdict(list)
    for gpu in gpus:
        if not_whole(gpu) is None:
            by_node[only if only is not None else gpu.numa_node].append(gpu)
    cpus = _usable(inventory, usable_cpus)
    chosen = _node(inventory, runtime, by_node, size=size, node=node, cpus=cpus, passed=passed)
    picked = by_node[chosen][:size]
    return JobPlacement(
        runtime=runtime.name,
        numa_node=chosen,
        cpus=cpus[chosen],
        gpus=[
            GpuPlacement(
                index=index[gpu.address],
                address=gpu.address,
                model=gpu.model,
                numa_node=gpu.numa_node,
            )
            for gpu in picked
        ],
        environment=runtime.environment(index[gpu.address] for gpu in picked),
        unset=list(runtime.cleared),
        numbering=numbering_note(inventory, runtime),
        passed_over=passed,
    )


def _usable(inventory: Inventory, usable: Collection[int] | None) -> dict[int, str]:
    """Each node's CPUs that the job may use, as a CPU list ("" when none)."""
    if usable is None:
        return {n.id: n.cpus for n in inventory.numa_nodes}
    allowed = set(usable)
    return {
        n.id: format_cpulist(c for c in parse_cpulist(n.cpus) if c in allowed)
        for n in inventory.numa_nodes
    }


def _runtime(inventory: Inventory) -> Runtime:
    """The first runtime with a GPU a job can have whole, else the first numbering any (its
    refusal then says why none is whole)."""
    seen = [runtime for runtime in RUNTIMES if numbered(inventory, runtime)]
    for runtime in seen:
        if any(not_whole(gpu) is None for gpu in numbered(inventory, runtime)):
            return runtime
    if seen:
        return seen[0]
    raise UsageError(
        f"{none_seen(inventory, RUNTIMES[0])}; nor does ROCm (amdgpu) or Level Zero (i915, xe)"
    )


def _node(
    inventory: Inventory,
    runtime: Runtime,
    by_node: dict[int | None, list[Gpu]],
    *,
    size: int,
    node: int | None,
    cpus: dict[int, str],
    passed: list[str],
) -> int:
    known = sorted(n.id for n in inventory.numa_nodes)
    counts = ", ".join(
        [f"node {n} has {len(by_node.get(n, []))}" for n in known]
        + ([f"{len(by_node[None])} of unknown node"] if by_node.get(None) else [])
    )
    if passed:
        counts += f" (not counted: {'; '.join(passed)})"
    noun = f"{runtime.name} {'GPU' if size == 1 else 'GPUs'}"
    if node is not None:
        if node not in known:
            raise UsageError(
                f"{inventory.source}: no NUMA node {node}; its nodes are {wording.join(known)}"
            )
        if len(by_node.get(node, [])) < size:
            raise UsageError(
                f"{inventory.source}: NUMA node {node} has fewer than {size} {noun}: {counts}; "
                "choose another --node or ask for fewer with --tp"
            )
        if not cpus[node]:
            raise UsageError(
                f"{inventory.source}: none of NUMA node {node}'s CPUs "
                f"({inventory.numa_node(node).cpus}) is one this process may run on (its "
                "container's cpuset or inherited affinity): choose another --node"
            )
        return node
    enough = [n for n in known if len(by_node.get(n, [])) >= size]
    for candidate in enough:
        if cpus[candidate]:
            return candidate
    if enough:
        raise UsageError(
            f"{inventory.source}: the NUMA nodes with {size} {noun} (node "
            f"{wording.join([str(n) for n in enough])}) have no CPU this process may run on (its "
            "container's cpuset or inherited affinity); ask for fewer with --tp"
        )
    raise UsageError(
        f"{inventory.source}: no NUMA node has {size} {noun}: {counts}; ask for fewer with --tp"
    )
