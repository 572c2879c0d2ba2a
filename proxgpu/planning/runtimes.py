"""Which GPUs each compute runtime numbers, and in what order: the indexes that ``check-gpus``,
the plan's tensor-parallel sets and ``proxgpu run`` print.

A runtime numbers only the GPUs its own driver drives. CUDA (and nvidia-smi) count the GPUs
bound to nvidia: a server BMC's display (ASPEED, Matrox G200), a GPU on vfio-pci or on nouveau
is none of theirs, so counting every display controller, as ``lspci`` does, shifts every index
after it. With ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` CUDA orders its GPUs by PCI address, as
nvidia-smi does; its default, ``FASTEST_FIRST``, puts the fastest first and may differ (NVIDIA's
CUDA environment variables reference). ROCm's HIP counts the GPUs amdgpu drives, in the order of
KFD's topology (amdgpu's probe order, PCI order unless something reorders the probe; rocm-smi
shows it); an inherited ``ROCR_VISIBLE_DEVICES`` narrows that list first, so ``run`` drops it.
oneAPI Level Zero counts the GPUs i915 and xe drive, in PCI order with
``ZE_ENABLE_PCI_ID_DEVICE_ORDER=1``.

Inside a container, ``/sys`` and ``/proc/driver/nvidia`` show every GPU of the host, but CUDA
there uses only the GPUs whose ``/dev/nvidiaN`` (N: the GPU's Device Minor) the container has:
so in a container CUDA's numbering counts only those. Inspection does not record the
``/dev/dri`` render nodes a container has, so ROCm's and Level Zero's numbering there counts
every GPU of their driver.

>>> from proxgpu.inspection import Gpu, Inventory
>>> def gpu(address, vendor, device, driver):
...     return Gpu(address=address, vendor_id=vendor, device_id=device, class_code="0x030000",
...                driver=driver, functions=[address], function_info=[])
>>> inventory = Inventory(source="pve1", hostname="pve1", gpus=[
...     gpu("0000:81:00.0", "10de", "2bb1", "nvidia"),
...     gpu("0000:02:00.0", "1a03", "2000", "ast"),
...     gpu("0000:41:00.0", "10de", "2bb1", "vfio-pci"),
...     gpu("0000:01:00.0", "10de", "2bb1", "nvidia")])
>>> [g.address for g in numbered(inventory, CUDA)]
['0000:01:00.0', '0000:81:00.0']
>>> unseen_reason(inventory, CUDA, inventory.gpus[2])
'0000:41:00.0 is on vfio-pci, not nvidia'
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxgpu.inspection.inventory import Gpu, Inventory


@dataclass(frozen=True)
class Runtime:
    """A compute runtime: the vendor's GPUs it numbers (those on ``drivers``), the variable that
    selects among them, and what makes it number them as proxgpu does.

    ``ordering`` holds the variables that fix its order, ``cleared`` the inherited ones that
    would renumber its GPUs before ``variable`` applies; ``ordering_note`` says it in words.
    """

    name: str
    vendor_id: str
    drivers: tuple[str, ...]
    variable: str
    ordering: tuple[tuple[str, str], ...]
    ordering_note: str
    cleared: tuple[str, ...] = ()

    def counts(self, driver: str | None) -> bool:
        """Whether a GPU on ``driver`` is one of this runtime's.

        >>> CUDA.counts("nvidia"), CUDA.counts("vfio-pci"), LEVEL_ZERO.counts("xe")
        (True, False, True)
        """
        return driver in self.drivers

    def environment(self, indexes: Iterable[int]) -> dict[str, str]:
        """The variables that select the GPUs of these indexes, ordering first.

        >>> CUDA.environment([4, 5])
        {'CUDA_DEVICE_ORDER': 'PCI_BUS_ID', 'CUDA_VISIBLE_DEVICES': '4,5'}
        """
        return {**dict(self.ordering), self.variable: ",".join(map(str, indexes))}


CUDA = Runtime(
    name="CUDA",
    vendor_id="10de",
    drivers=("nvidia",),
    variable="CUDA_VISIBLE_DEVICES",
    ordering=(("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),),
    ordering_note="with CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default, FASTEST_FIRST, may differ",
)
ROCM = Runtime(
    name="ROCm",
    vendor_id="1002",
    drivers=("amdgpu",),
    variable="HIP_VISIBLE_DEVICES",
    ordering=(),
    ordering_note="in KFD's order, PCI order as a rule; check the numbering with rocm-smi",
    cleared=("ROCR_VISIBLE_DEVICES",),
)
LEVEL_ZERO = Runtime(
    name="Level Zero",
    vendor_id="8086",
    drivers=("i915", "xe"),
    variable="ZE_AFFINITY_MASK",
    ordering=(("ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1"),),
    ordering_note="with ZE_ENABLE_PCI_ID_DEVICE_ORDER=1",
)
#: Every runtime proxgpu numbers GPUs for, in the order ``run`` prefers them on a mixed host.
RUNTIMES = (CUDA, ROCM, LEVEL_ZERO)


def pci_order(gpu: Gpu) -> tuple[int, ...]:
    """Sort key: domain, bus, device and function as numbers (a 5-digit VMD domain sorts last).

    >>> from proxgpu.inspection import Gpu
    >>> pci_order(Gpu(address="0000:c1:00.0", vendor_id="10de", device_id="2330",
    ...               class_code="0x030200", functions=[], function_info=[]))
    (0, 193, 0, 0)
    """
    domain, bus, rest = gpu.address.split(":")
    device, function = rest.split(".")
    return (int(domain, 16), int(bus, 16), int(device, 16), int(function))


def numbered(inventory: Inventory, runtime: Runtime) -> list[Gpu]:
    """The GPUs ``runtime`` numbers on this host (in a container: those it can open), in its
    order: index ``i`` of the result is the runtime's device ``i``."""
    gpus = [gpu for gpu in inventory.gpus if unseen_reason(inventory, runtime, gpu) is None]
    return sorted(gpus, key=pci_order)


def unseen_reason(inventory: Inventory, runtime: Runtime, gpu: Gpu) -> str | None:
    """Why ``runtime`` does not number ``gpu`` here, or ``None`` when it does."""
    if gpu.bmc_display:
        return f"{gpu.address} is the BMC's display controller, not a GPU"
    if not runtime.counts(gpu.driver):
        held = f"on {gpu.driver}" if gpu.driver else "bound to no driver"
        return f"{gpu.address} is {held}, not {' or '.join(runtime.drivers)}"
    if runtime is CUDA and inventory.container is not None:
        if gpu.nvidia_minor is None:
            return f"{gpu.address} has no Device Minor in /proc/driver/nvidia"
        node = f"/dev/nvidia{gpu.nvidia_minor}"
        if node not in inventory.device_nodes:
            return f"{gpu.address} has no {node} in this container"
    return None


def numbering_note(inventory: Inventory, runtime: Runtime) -> str:
    """How the runtime's indexes are meant, for a message that prints them.

    >>> from proxgpu.inspection import Inventory
    >>> numbering_note(Inventory(source="pve1", hostname="pve1"), CUDA)
    "CUDA's indexes, with CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default, FASTEST_FIRST, may differ"
    """
    where = " in this container" if inventory.container is not None else ""
    return f"{runtime.name}'s indexes{where}, {runtime.ordering_note}"


def none_seen(inventory: Inventory, runtime: Runtime) -> str:
    """The message for a host where ``runtime`` numbers no GPU: why, GPU by GPU.

    >>> from proxgpu.inspection import Inventory
    >>> none_seen(Inventory(source="pve1", hostname="pve1"), CUDA)
    'pve1: CUDA sees no GPU: the host has no GPU'
    """
    reasons = [unseen_reason(inventory, runtime, gpu) for gpu in inventory.gpus]
    why = "; ".join(r for r in reasons if r) or "the host has no GPU"
    return f"{inventory.source}: {runtime.name} sees no GPU: {why}"
