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

A GPU in MIG mode keeps its place in this numbering: ``nvidia-smi`` lists it under its index,
and the indexes ``CUDA_VISIBLE_DEVICES`` takes are nvidia-smi's (the CUDA programming guide's
``CUDA_VISIBLE_DEVICES``). But it is never a CUDA device itself: CUDA runs only on its MIG
devices, each a compute instance with its GPU instance, and a GPU in MIG mode without them runs
no CUDA work at all (the MIG user guide's "Getting Started", "CUDA Device Enumeration").
``nvidia-smi -L`` lists them under their GPU as "MIG ... Device N", N counting from 0 for each
GPU, with their ``MIG-<UUID>`` (the value ``CUDA_VISIBLE_DEVICES`` selects one by). Since driver
R570 one process may use one compute instance of each GPU instance, MIG devices of several GPUs
and whole GPUs together, 64 MIG devices at most; before it, one MIG device and no whole GPU
beside it. In which order CUDA numbers MIG devices of several GPUs NVIDIA does not say, so
proxgpu names them by UUID, never by a CUDA index. A GPU that serves vGPUs to VMs (its mediated
devices exist) stays numbered too, but NVIDIA's vGPU documentation describes no CUDA work on the
host beside them. :func:`not_whole` says why such a GPU is no whole GPU for a job.

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
>>> from dataclasses import replace
>>> not_whole(replace(inventory.gpus[0], mig_mode=True))
'0000:81:00.0 is in MIG mode: CUDA runs only on its MIG devices, never on the whole GPU; give \
a job one of them with CUDA_VISIBLE_DEVICES=MIG-<UUID> (nvidia-smi -L lists them under the GPU)'
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.pci import NVIDIA, NVIDIA_DRIVER


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

    @property
    def ordering_environment(self) -> str:
        """The variables that fix its order, as a shell sets them (empty: none does).

        >>> CUDA.ordering_environment, ROCM.ordering_environment
        ('CUDA_DEVICE_ORDER=PCI_BUS_ID', '')
        """
        return " ".join(f"{name}={value}" for name, value in self.ordering)

    def environment(self, indexes: Iterable[int]) -> dict[str, str]:
        """The variables that select the GPUs of these indexes, ordering first.

        >>> CUDA.environment([4, 5])
        {'CUDA_DEVICE_ORDER': 'PCI_BUS_ID', 'CUDA_VISIBLE_DEVICES': '4,5'}
        """
        return {**dict(self.ordering), self.variable: ",".join(map(str, indexes))}


CUDA = Runtime(
    name="CUDA",
    vendor_id=NVIDIA,
    drivers=(NVIDIA_DRIVER,),
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


def not_whole(gpu: Gpu) -> str | None:
    """Why ``gpu``, though numbered, is no whole GPU to give a job (``None``: it is one): it is
    in MIG mode, or it serves vGPUs to VMs (see the module's docstring)."""
    if gpu.mig_mode:
        return (
            f"{gpu.address} is in MIG mode: CUDA runs only on its MIG devices, never on the whole "
            f"GPU; give a job one of them with {mig_selection(gpu)}"
        )
    mediated = sum(len(kind.instances) for kind in gpu.mdev_types)
    on_vfs = sum(len(vf.live_vgpus) for vf in gpu.virtual_functions)
    if mediated or on_vfs:
        vgpus = mediated + on_vfs
        shown = "mediated devices exist" if mediated else "its SR-IOV virtual functions hold them"
        return (
            f"{gpu.address} serves {vgpus} vGPU{'s' if vgpus > 1 else ''} to VMs ({shown}): "
            "NVIDIA's vGPU software describes no CUDA work on the host beside them, so no job "
            "is placed there"
        )
    return None


def mig_selection(gpu: Gpu) -> str:
    """How a process selects one of ``gpu``'s MIG devices: ``CUDA_VISIBLE_DEVICES`` and each
    device's UUID, or where to read them when inspection could not.

    >>> from proxgpu.inspection import Gpu
    >>> mig_selection(Gpu(address="0000:18:00.0", vendor_id="10de", device_id="2335",
    ...                   class_code="0x030200", functions=[], function_info=[]))
    'CUDA_VISIBLE_DEVICES=MIG-<UUID> (nvidia-smi -L lists them under the GPU)'
    """
    uuids = known_mig_uuids(gpu)
    if not uuids or len(uuids) < len(gpu.mig_instances):
        return "CUDA_VISIBLE_DEVICES=MIG-<UUID> (nvidia-smi -L lists them under the GPU)"
    return "CUDA_VISIBLE_DEVICES=" + " or ".join(
        f"{uuid} (GI {i.gi} CI {i.ci})" for i, uuid in zip(gpu.mig_instances, uuids, strict=True)
    )


def known_mig_uuids(gpu: Gpu) -> list[str]:
    """The ``MIG-<UUID>`` of each of ``gpu``'s MIG devices inspection knows, in GI, CI order."""
    return [instance.uuid for instance in gpu.mig_instances if instance.uuid is not None]
