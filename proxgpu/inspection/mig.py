"""A GPU's MIG instances, from the capabilities NVIDIA's driver describes in /proc.

What this relies on (NVIDIA's open kernel modules, ``src/nvidia/arch/nvalloc/unix/src/os.c``
and ``kernel-open/nvidia/nv-caps.c``, and the MIG user guide's "Device Nodes and
Capabilities"): the driver makes ``/proc/driver/nvidia/capabilities/gpuN/mig/`` for each GPU,
``N`` being the GPU's nvidia minor (its ``/dev/nvidiaN``, "Device Minor" in
``/proc/driver/nvidia/gpus/ADDR/information``), whether or not MIG is on. Inside it a directory
``giG`` exists for each GPU instance while it exists (``G`` its id, the "GPU instance ID"
``nvidia-smi mig -lgi`` prints), with an ``access`` file readable by all, and inside that a
``ciC/access`` for each of its compute instances. Each ``access`` file says the minor of the
``/dev/nvidia-caps/nvidia-capM`` node that grants the right (``DeviceFileMinor``) and that node's
mode (``DeviceFileMode``, decimal). A process needs both its GPU instance's and its compute
instance's node to run CUDA on that MIG device; ``mig/config`` (create and destroy instances,
root alone) and ``mig/monitor`` (read every instance's state) are rights no CUDA program needs.

GPU instances exist only in MIG mode, so a GPU with a ``giG`` is in MIG mode
(:func:`in_mig_mode`). The ``mig/`` directory itself says nothing: ``osRmCapRegisterGpu`` makes
it for every GPU, MIG on or off. Nor does ``/proc/driver/nvidia/gpus/ADDR/information``
(``nv-procfs.c`` prints no MIG line). So a GPU put in MIG mode before any GPU instance is made
reads as not in MIG mode here; only NVML (``nvidia-smi --query-gpu=mig.mode.current``) tells.

The minors come from one fixed table (``nv-caps.c``, ``nv_cap_tables_init``: one counter runs
over its tables in order as the module loads): nvlink's ``fabric-mgmt`` 0, ``mig/config`` 1,
``mig/monitor`` 2, then for each GPU minor 0 to 31 its GPU instances 0 to 14, each its own
``access`` then its compute instances 0 to 7 (:func:`table_cap`). So an instance's minor follows
from its GPU's minor and its ids, also after a boot that gives the GPU another minor. Every
instance's ``access`` file is readable by all (``os.c``, ``OS_RUGO``); ``config`` by root
alone (``OS_RUSR``).

>>> from proxgpu.inspection.inventory import NvidiaCap
>>> base = "/proc/driver/nvidia/capabilities/gpu0/mig"
>>> caps = [NvidiaCap(proc_path=f"{base}/gi1/access", minor=12, mode=0o444),
...         NvidiaCap(proc_path=f"{base}/gi1/ci0/access", minor=13, mode=0o444)]
>>> [(i.gi, i.ci, i.gi_cap.minor, i.ci_cap.minor) for i in mig_instances(caps, 0)]
[(1, 0, 12, 13)]
>>> in_mig_mode(caps, 0), in_mig_mode(caps, 1)
(True, False)
"""

from __future__ import annotations

import re

from proxgpu.inspection.inventory import MigInstance, NvidiaCap

_ACCESS = re.compile(r"/proc/driver/nvidia/capabilities/gpu(\d+)/mig/gi(\d+)(?:/ci(\d+))?/access")
_CAPABILITIES = "/proc/driver/nvidia/capabilities"
#: nv-caps.c's table: the minors before the first GPU's, and each GPU's and GPU instance's share.
_FIRST_GPU_MINOR = 3
_GPU_COUNT = 32
_GI_SLOTS = 1 + 8  # its own access file, then its compute instances 0 to 7
_GPU_SLOTS = 15 * _GI_SLOTS  # GPU instances 0 to 14
_GLOBAL = {
    1: NvidiaCap(proc_path=f"{_CAPABILITIES}/mig/config", minor=1, mode=0o400),
    2: NvidiaCap(proc_path=f"{_CAPABILITIES}/mig/monitor", minor=2, mode=0o444),
}


def instance_cap(gpu_minor: int, gi: int, ci: int | None = None) -> NvidiaCap:
    """The capability of GPU instance ``gi`` (with ``ci``: of its compute instance ``ci``) of the
    GPU whose nvidia minor is ``gpu_minor``, from NVIDIA's table.

    >>> instance_cap(0, 2).minor, instance_cap(0, 2, 0).minor, instance_cap(1, 0, 7).minor
    (21, 22, 146)
    >>> instance_cap(4, 3, 1).proc_path
    '/proc/driver/nvidia/capabilities/gpu4/mig/gi3/ci1/access'
    """
    minor = _FIRST_GPU_MINOR + gpu_minor * _GPU_SLOTS + gi * _GI_SLOTS
    path = f"{_CAPABILITIES}/gpu{gpu_minor}/mig/gi{gi}"
    if ci is not None:
        minor, path = minor + 1 + ci, f"{path}/ci{ci}"
    return NvidiaCap(proc_path=f"{path}/access", minor=minor, mode=0o444)


def table_cap(minor: int) -> NvidiaCap | None:
    """The MIG capability NVIDIA's table gives ``minor``: ``mig/config``, ``mig/monitor`` or an
    instance's ``access``; ``None`` for another minor (nvlink's, IMEX's).

    >>> table_cap(2).proc_path, table_cap(32).proc_path, table_cap(0)
    ('/proc/driver/nvidia/capabilities/mig/monitor', \
'/proc/driver/nvidia/capabilities/gpu0/mig/gi3/ci1/access', None)
    """
    if minor in _GLOBAL:
        return _GLOBAL[minor]
    slot = minor - _FIRST_GPU_MINOR
    if not 0 <= slot < _GPU_COUNT * _GPU_SLOTS:
        return None
    gpu, rest = divmod(slot, _GPU_SLOTS)
    gi, ci = divmod(rest, _GI_SLOTS)
    return instance_cap(gpu, gi, ci - 1 if ci else None)


def instance_of(cap: NvidiaCap) -> tuple[int, int, int | None] | None:
    """The GPU minor, GPU instance and compute instance (``None``: the GPU instance's own) an
    instance's capability belongs to; ``None`` for MIG's config and monitor.

    >>> instance_of(instance_cap(5, 14, 7))
    (5, 14, 7)
    """
    match = _ACCESS.fullmatch(cap.proc_path)
    if match is None:
        return None
    return int(match[1]), int(match[2]), None if match[3] is None else int(match[3])


def mig_instances(caps: list[NvidiaCap], gpu_minor: int | None) -> list[MigInstance]:
    """The compute instances of the GPU whose nvidia minor is ``gpu_minor``, each with its GPU
    instance's capability, by GPU instance then compute instance id (none without a minor, or
    a GPU instance without a compute instance: nothing can run on it)."""
    if gpu_minor is None:
        return []
    gis: dict[int, NvidiaCap] = {}
    cis: list[tuple[int, int, NvidiaCap]] = []
    for cap in caps:
        owner = instance_of(cap)
        if owner is None or owner[0] != gpu_minor:
            continue
        _, gi, ci = owner
        if ci is None:
            gis[gi] = cap
        else:
            cis.append((gi, ci, cap))
    return [
        MigInstance(gi=gi, ci=ci, gi_cap=gis[gi], ci_cap=cap)
        for gi, ci, cap in sorted(cis, key=lambda item: item[:2])
        if gi in gis
    ]


def in_mig_mode(caps: list[NvidiaCap], gpu_minor: int | None) -> bool:
    """Whether the GPU whose nvidia minor is ``gpu_minor`` has a GPU instance, which only a GPU
    in MIG mode has (a GPU instance without compute instances counts: CUDA cannot use the GPU
    whole either way)."""
    return gpu_minor is not None and any(
        (owner := instance_of(cap)) is not None and owner[0] == gpu_minor for cap in caps
    )


def cap_node(minor: int) -> str:
    """The ``/dev`` node of the capability with ``minor``.

    >>> cap_node(21)
    '/dev/nvidia-caps/nvidia-cap21'
    """
    return f"/dev/nvidia-caps/nvidia-cap{minor}"


def cap_minor(path: str) -> int | None:
    """M of ``/dev/nvidia-caps/nvidia-capM``; ``None`` for any other path.

    >>> cap_minor("/dev/nvidia-caps/nvidia-cap21"), cap_minor("/dev/nvidia0")
    (21, None)
    """
    match = re.fullmatch(r"/dev/nvidia-caps/nvidia-cap(\d+)", path)
    return int(match[1]) if match else None


def cap_gpu(cap: NvidiaCap) -> int | None:
    """The nvidia minor of the GPU whose MIG instance ``cap`` is; None for MIG's config and
    monitor.

    >>> cap_gpu(NvidiaCap(proc_path="/proc/driver/nvidia/capabilities/gpu3/mig/gi1/access",
    ...                   minor=399, mode=0o444))
    3
    """
    where = instance_of(cap)
    return None if where is None else where[0]
