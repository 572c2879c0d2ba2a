"""What the planner gives: the plan with its groups, each GPU's role and the problems that
refuse a plan. What it takes, the policy, is :mod:`~proxgpu.planning.policy`'s (and keeps its
name here: ``planning.model.SplitPolicy``).

>>> Plan(groups=[], warnings=[], tensor_parallel=[]).userspace
[]
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    Field,
    model_validator,
)

from proxgpu.inspection.mig import cap_node
from proxgpu.model import FrozenModel

# The policy is the planner's input; it keeps the name planning.model.SplitPolicy it had here.
from proxgpu.planning.policy import SplitPolicy as SplitPolicy  # noqa: PLC0414 - re-exported
from proxgpu.planning.runtimes import RUNTIMES
from proxgpu.planning.userspace import UserSpace
from proxgpu.pve.claims import GuestRef


class Role(StrEnum):
    """What the plan does with a GPU; every stage asks its role rather than comparing names.

    ``HOST`` keeps the GPU on its host driver for the container; ``VFIO`` binds it to vfio-pci
    for a VM; ``VGPU`` keeps it on its host driver for VMs using mediated devices (``mdev=``) of
    it or of its SR-IOV virtual functions, which qemu-server creates through that driver
    (``prepare_pci_device`` in PVE/QemuServer/PCI.pm), or for vGPUs that exist on it, so it
    never moves and no container gets it. ``MIG`` keeps a GPU in
    MIG mode on nvidia for containers that each get one of its MIG instances
    (``--lxc 200:mig=0/1``): its node and that instance's capability nodes, nothing wider.

    >>> [(r.value, r.moves_to_vfio, r.serves) for r in Role]
    [('host', False, 'lxc'), ('vfio', True, 'vm'), ('vgpu', False, 'vm'), ('mig', False, 'lxc')]
    >>> Role.VGPU.action
    'stays on the host driver for vGPU VMs'
    """

    HOST = "host"
    VFIO = "vfio"
    VGPU = "vgpu"
    MIG = "mig"

    def __repr__(self) -> str:
        # Plans print as their JSON spells them ('host'), in doctests and error texts alike.
        return repr(self.value)

    @property
    def moves_to_vfio(self) -> bool:
        """Whether the GPU is bound to vfio-pci (every other role keeps its host driver)."""
        return self is Role.VFIO

    @property
    def serves(self) -> Literal["lxc", "vm"]:
        """The kind of guest the role's GPUs go to."""
        return "lxc" if self in (Role.HOST, Role.MIG) else "vm"

    @property
    def action(self) -> str:
        """What happens to the GPU, as the plan text and the picture's legend say it."""
        return _ACTIONS[self]

    @property
    def badge_without_guest(self) -> str:
        """The picture's badge on a GPU of this role whose group has no guest yet.

        >>> Role.VFIO.badge_without_guest
        'vfio, no guest'
        """
        return _BADGES_WITHOUT_GUEST[self]


_ACTIONS = {
    Role.HOST: "stays on the host driver",
    Role.VFIO: "goes to vfio-pci",
    Role.VGPU: "stays on the host driver for vGPU VMs",
    Role.MIG: "stays on the host driver, its MIG instances for containers",
}
_BADGES_WITHOUT_GUEST = {
    Role.HOST: "host",
    Role.VFIO: "vfio, no guest",
    Role.VGPU: "vGPU, no VM",
    Role.MIG: "MIG, no container",
}
ProblemCode = Literal[
    "no-gpus",
    "policy",
    "unknown-numa",
    "slot-split",
    "iommu-mixed",
    "iommu-peer",
    "claimed",
    "iommu-off",
    "no-iommu-group",
    "mapping",
    "memory",
    "no-fit",
    "fabric-split",
]

#: The VMIDs Proxmox accepts (pve-common's ``pve-vmid`` format: 3 to 9 digits, no leading 0).
VMID_MIN, VMID_MAX = 100, 999_999_999


TP_SIZES = (1, 2, 4, 8)


class VgpuUse(FrozenModel):
    """One VM's vGPU of a GPU: the mediated device type, and whether the plan adds its
    ``hostpciN: ADDR,mdev=TYPE`` entry (``added``) or found it in the VM's config.
    ``function`` is the SR-IOV virtual function of the GPU it is on (NVIDIA vGPU on Ampere and
    later), which the entry names; ``None``: the GPU's own function. ``mdev_type`` is ``None``
    for a VF passed through whole (an entry without ``mdev=``), which needs the GPU kept the
    same way.

    >>> VgpuUse(vmid=400, mdev_type="nvidia-1155", added=True).added
    True
    """

    vmid: int
    mdev_type: str | None
    added: bool = False
    function: str | None = None


class MigUse(FrozenModel):
    """The MIG instance a container gets of a GPU, as planned: its ids, the minors of its GPU
    instance's and compute instance's capability nodes (what ``verify`` and apply compare with
    the host's, since recreated instances may get other minors), and the MIG device's UUID,
    ``MIG-`` and a UUID's hex form as ``nvidia-smi -L`` prints it (``None``: unknown to
    inspection, see :mod:`~proxgpu.inspection.smi`).

    ``gpu_minor`` is the GPU's nvidia minor, the N of the instance's
    ``/proc/driver/nvidia/capabilities/gpuN/`` files.

    >>> use = MigUse(vmid=200, gpu_minor=0, gi=1, ci=0, gi_minor=12, ci_minor=13)
    >>> use.cuda_visible_devices is None, use.cap_nodes
    (True, ['/dev/nvidia-caps/nvidia-cap12', '/dev/nvidia-caps/nvidia-cap13'])
    >>> use.proc_files[1]
    '/proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access'
    """

    vmid: int
    gpu_minor: int
    gi: int
    ci: int
    gi_minor: int
    ci_minor: int
    uuid: str | None = None

    @property
    def cuda_visible_devices(self) -> str | None:
        """The ``CUDA_VISIBLE_DEVICES`` value that selects the instance in the container (its
        UUID), ``None`` while the UUID is unknown."""
        return self.uuid

    @property
    def cap_nodes(self) -> list[str]:
        """The instance's two capability nodes: its GPU instance's, then its compute
        instance's."""
        return [cap_node(m) for m in (self.gi_minor, self.ci_minor)]

    @property
    def proc_files(self) -> list[str]:
        """The /proc files that describe the two capabilities, in the same order."""
        gi = f"/proc/driver/nvidia/capabilities/gpu{self.gpu_minor}/mig/gi{self.gi}"
        return [f"{gi}/access", f"{gi}/ci{self.ci}/access"]


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One reason to refuse a plan: what is wrong and what to do about it.

    >>> Problem(code="iommu-off", what="IOMMU is off", fix="turn it on").fix
    'turn it on'
    """

    code: ProblemCode
    what: str
    fix: str


class PlanGroup(FrozenModel):
    """GPUs that go one way together, with the pinning that goes with them.

    ``gpus`` are the GPUs' own addresses; ``functions`` every function that moves with them
    (audio and other functions of their slots). ``cpus`` (a cpulist) and ``memory_nodes`` are the
    NUMA-local CPUs and memory: a container's ``cpuset.cpus``/``cpuset.mems``, a VM's
    ``affinity`` and ``hostnodes``. ``numa_node`` is ``None`` when the GPUs span nodes or their
    node is unknown; then the pinning covers every node they may sit on. A ``vgpu`` group (one
    GPU) lists in ``vgpus`` the VMs using vGPUs of it, and those the plan gives one; a ``mig``
    group (one GPU) in ``mig`` each container's instance of it, those containers being its
    guests. The host
    group goes to ``guest`` and, when several containers share its GPUs, to those in
    ``shared_with`` too; :attr:`guests` lists them all.

    >>> PlanGroup(role="vfio", numa_node=1, gpus=["0000:81:00.0"], functions=["0000:81:00.0"],
    ...           cpus="32-63", memory_nodes=[1], driver="vfio-pci").guest is None
    True
    """

    role: Role
    numa_node: int | None
    gpus: list[str]
    functions: list[str]
    cpus: str
    memory_nodes: list[int]
    driver: str
    guest: GuestRef | None = None
    shared_with: list[GuestRef] = Field(default_factory=list)
    vgpus: list[VgpuUse] = Field(default_factory=list)
    mig: list[MigUse] = Field(default_factory=list)

    @property
    def guests(self) -> list[GuestRef]:
        """The guests that get the group's GPUs: ``guest`` and those it shares them with.

        >>> group = PlanGroup(role="host", numa_node=0, gpus=[], functions=[], cpus="0-3",
        ...                   memory_nodes=[0], driver="nvidia", guest={"type": "lxc", "vmid": 200},
        ...                   shared_with=[{"type": "lxc", "vmid": 201}])
        >>> [guest.vmid for guest in group.guests]
        [200, 201]
        """
        return [] if self.guest is None else [self.guest, *self.shared_with]

    @property
    def node_label(self) -> str:
        """``NUMA node 1`` (``NUMA node ?`` where the node is unknown), as the plan names it."""
        return "NUMA node ?" if self.numa_node is None else f"NUMA node {self.numa_node}"


class TensorParallelAdvice(FrozenModel):
    """NUMA-local device sets of one tensor-parallel size, as values of ``variable``
    (``CUDA_VISIBLE_DEVICES`` for NVIDIA, ``HIP_VISIBLE_DEVICES`` for AMD, ``ZE_AFFINITY_MASK``
    for Intel: see :mod:`~proxgpu.planning.runtimes`).

    The advice is for one host group: the containers in ``guests`` (none: a group no container
    gets), each seeing exactly the group's GPUs. The numbers are the indexes the runtime gives
    them there: the position of each GPU among the group's GPUs on that runtime's driver (nvidia
    for CUDA), sorted by PCI address, which the runtime follows with the environment in
    ``ordering`` (``CUDA_DEVICE_ORDER=PCI_BUS_ID``; empty for ROCm, which has no such variable:
    its order is KFD's). ``gpu_sets`` are the same sets as PCI addresses.

    >>> advice = TensorParallelAdvice(size=2, device_sets=["0,1", "2,3"],
    ...                               gpu_sets=[["0000:01:00.0", "0000:11:00.0"],
    ...                                         ["0000:61:00.0", "0000:71:00.0"]],
    ...                               guests=[{"type": "lxc", "vmid": 201}])
    >>> advice.device_sets[1], advice.gpu_sets[1][0], advice.for_whom, advice.ordering
    ('2,3', '0000:61:00.0', 'CT 201', 'CUDA_DEVICE_ORDER=PCI_BUS_ID')
    """

    size: int
    device_sets: list[str]
    variable: str = "CUDA_VISIBLE_DEVICES"
    gpu_sets: list[list[str]] = Field(default_factory=list)
    guests: list[GuestRef] = Field(default_factory=list)
    #: Filled from ``variable`` where not given (see :meth:`_ordering_of_the_runtime`).
    ordering: str = ""

    @model_validator(mode="before")
    @classmethod
    def _ordering_of_the_runtime(cls, data: Any) -> Any:
        """``ordering`` from the runtime ``variable`` selects GPUs of, where not given (a plan
        recorded before the field existed).

        >>> TensorParallelAdvice(size=1, device_sets=["0"], variable="ZE_AFFINITY_MASK").ordering
        'ZE_ENABLE_PCI_ID_DEVICE_ORDER=1'
        """
        if not isinstance(data, dict) or "ordering" in data:
            return data
        variable = data.get("variable", "CUDA_VISIBLE_DEVICES")
        runtime = next((r for r in RUNTIMES if r.variable == variable), None)
        return {**data, "ordering": "" if runtime is None else runtime.ordering_environment}

    @property
    def for_whom(self) -> str:
        """The containers the numbering is theirs, as the plan text names them.

        >>> TensorParallelAdvice(size=1, device_sets=["0"]).for_whom
        'the host group'
        """
        if not self.guests:
            return "the host group"
        labels = [guest.label for guest in self.guests]
        return (
            " and ".join(labels)
            if len(labels) < 3
            else f"{', '.join(labels[:-1])} and {labels[-1]}"
        )

    @property
    def ordering_note(self) -> str:
        """How the runtime numbers the GPUs in PCI order, in words.

        >>> TensorParallelAdvice(size=1, device_sets=["0"],
        ...                      variable="ZE_AFFINITY_MASK").ordering_note
        'with ZE_ENABLE_PCI_ID_DEVICE_ORDER=1'
        """
        return next((r.ordering_note for r in RUNTIMES if r.variable == self.variable), "")


class Plan(FrozenModel):
    """The planned split: groups, warnings, tensor-parallel advice for each host group.

    ``warnings`` ask something of the admin (or say what will go wrong unless they act);
    ``notes`` say what the plan does or assumes and ask nothing. ``enable_iommu`` is true when
    the plan relies on turning the IOMMU on at the next boot. ``userspace``: each container
    given NVIDIA GPUs, with the NVIDIA user-space version it must hold (a next step).

    >>> Plan(groups=[], warnings=["uneven split"], tensor_parallel=[]).model_dump()["warnings"]
    ['uneven split']
    """

    groups: list[PlanGroup]
    warnings: list[str]
    tensor_parallel: list[TensorParallelAdvice]
    enable_iommu: bool = False
    notes: list[str] = Field(default_factory=list)
    userspace: list[UserSpace] = Field(default_factory=list)

    def advice_by_guests(self) -> list[tuple[str, list[TensorParallelAdvice]]]:
        """The tensor-parallel advice as (the containers, their sets), one entry per host
        group, in plan order: each container numbers its own GPUs.

        >>> def ct(vmid, size):
        ...     guests = [{"type": "lxc", "vmid": vmid}]
        ...     return TensorParallelAdvice(size=size, device_sets=["0"], guests=guests)
        >>> advice = [ct(200, 1), ct(200, 2), ct(201, 1)]
        >>> plan = Plan(groups=[], warnings=[], tensor_parallel=advice)
        >>> [(whom, len(sets)) for whom, sets in plan.advice_by_guests()]
        [('CT 200', 2), ('CT 201', 1)]
        """
        groups: list[tuple[str, list[TensorParallelAdvice]]] = []
        for item in self.tensor_parallel:
            if not groups or groups[-1][0] != item.for_whom:
                groups.append((item.for_whom, []))
            groups[-1][1].append(item)
        return groups
