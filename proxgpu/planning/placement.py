"""Where the GPUs of a set sit, as ``check-gpus`` checks a set and ``run`` chooses one: their
indexes, addresses and NUMA nodes, and whether they are NUMA-local."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class GpuPlacement:
    """Where one GPU of a checked or chosen set sits: its index (CUDA's, or its runtime's, with
    the GPUs in PCI bus order), address and NUMA node. ``not_whole`` says why it is no whole GPU
    for a job (in MIG mode, serving vGPUs), and ``mig_devices`` are the ``MIG-<UUID>`` values
    of its MIG devices that inspection knows, each a ``CUDA_VISIBLE_DEVICES`` value.

    >>> GpuPlacement(index=4, address="0000:81:00.0", model=None, numa_node=1).numa_node
    1
    """

    index: int
    address: str
    model: str | None
    numa_node: int | None
    not_whole: str | None = None
    mig_devices: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class GpuSetCheck:
    """Whether a set of GPUs shares one known NUMA node, and why (or why not).

    The GPUs' indexes are CUDA's: ``ordering`` is the environment that makes CUDA number them so.

    >>> GpuSetCheck(gpus=[], numa_local=True, numa_node=0, explanation="").numa_local
    True
    """

    gpus: list[GpuPlacement]
    numa_local: bool
    numa_node: int | None
    explanation: str
    ordering: str = "CUDA_DEVICE_ORDER=PCI_BUS_ID"
