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


def mig_instances(caps: list[NvidiaCap], gpu_minor: int | None) -> list[MigInstance]:
    """The compute instances of the GPU whose nvidia minor is ``gpu_minor``, each with its GPU
    instance's capability, by GPU instance then compute instance id (none without a minor, or
    a GPU instance without a compute instance: nothing can run on it)."""
    if gpu_minor is None:
        return []
    gis: dict[int, NvidiaCap] = {}
    cis: list[tuple[int, int, NvidiaCap]] = []
    for cap in caps:
        match = _ACCESS.fullmatch(cap.proc_path)
        if match is None or int(match[1]) != gpu_minor:
            continue
        if match[3] is None:
            gis[int(match[2])] = cap
        else:
            cis.append((int(match[2]), int(match[3]), cap))
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
        (match := _ACCESS.fullmatch(cap.proc_path)) is not None and int(match[1]) == gpu_minor
        for cap in caps
    )
