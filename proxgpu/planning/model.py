"""What the planner takes and gives: the policy asked for, and the plan with its groups (the
guests' spellings are :mod:`~proxgpu.planning.requests`').

>>> SplitPolicy(vms=["301:2"]).vms
[(301, 2)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)

from proxgpu.errors import UsageError
from proxgpu.inspection.mig import cap_node
from proxgpu.model import FrozenModel
from proxgpu.planning.requests import (
    ContainerRequest,
    GuestRequest,
    MigSpec,
    VgpuRequest,
    VmRequest,
    parse_lxc_specs,
    parse_vm_specs,
)
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

#: How the vfio GPUs are bound at boot (``--bind-method``): it decides which nvidia minors the
#: kept GPUs get at the next boot (see :mod:`~proxgpu.planning.minors`).
BindMethod = Literal["modprobe", "driverctl"]

#: The VMIDs Proxmox accepts (pve-common's ``pve-vmid`` format: 3 to 9 digits, no leading 0).
VMID_MIN, VMID_MAX = 100, 999_999_999


TP_SIZES = (1, 2, 4, 8)

_Request = TypeVar("_Request", ContainerRequest, MigSpec, VmRequest, VgpuRequest)
#: The kind of guest each request's ``kind`` is for.
_GUEST_TYPE: dict[str, Literal["lxc", "vm"]] = {
    "lxc": "lxc",
    "mig": "lxc",
    "vm": "vm",
    "vgpu": "vm",
}


class SplitPolicy(FrozenModel):
    """What the user asked for: how to split and who receives the groups.

    ``split="numa"`` (the only mode so far) keeps the lowest-numbered NUMA node holding GPUs on
    the host driver and sends every other node to vfio-pci. ``host_nodes``/``vfio_nodes`` choose
    nodes instead (nodes not named take the other role when only one list is given);
    ``host_gpus``/``vfio_gpus`` assign GPUs by address (one address per entry, any form
    :func:`normalize_pci_address` takes) and win over node rules.
    ``enable_iommu`` says the kernel command line change that turns the IOMMU on will be planned.
    ``mapping`` names the cluster PCI mapping the VMs will get their GPUs through (rendered with
    :class:`~proxgpu.rendering.RenderOptions` ``mapping``); the planner checks it can be written.
    ``bind_method`` is the binding the plan is rendered with (``RenderOptions.bind_method``): it
    decides the kept GPUs' nvidia minors after the reboot, which the planner checks the device
    entries of the containers it does not rewrite against.

    ``requests`` are the guests, one :data:`~proxgpu.planning.requests.GuestRequest` each: a
    container given whole GPUs (:class:`ContainerRequest`: shared, a count of its own, of a NUMA
    node) or a MIG instance (:class:`MigSpec`, the GPU staying on nvidia); a VM given vfio GPUs
    (:class:`VmRequest`) or a vGPU of an mdev type (:class:`VgpuRequest`, the GPU staying on
    its host driver). They are also taken as the command line and Ansible spell them, one or a
    list: ``lxc="200:2"`` or ``lxc=["200", "201:2@1", "202:mig=0/1"]`` (see
    :func:`parse_lxc_specs`), ``vms=[300, "301:2", "400:vgpu=nvidia-1155"]`` (see
    :func:`parse_vm_specs`), and as tuples by kind: ``shared_lxc`` (VMIDs sharing ``lxc``'s
    GPUs), ``lxc_subsets`` ``(vmid, count)``, ``lxc_nodes`` ``(vmid, node, count)``, ``lxc_mig``
    (:class:`MigSpec`), ``vms`` ``(vmid, count)`` (``None``: the rest) and ``vgpus``
    ``(vmid, mdev type)``; the same names read the requests back that way:

    >>> SplitPolicy(lxc=200, vms=[(300, 2), (301, None)]).vms
    [(300, 2), (301, None)]
    >>> SplitPolicy(vms=[300, "301:2", "400:vgpu=nvidia-1155"]).vgpus
    [(400, 'nvidia-1155')]
    >>> policy = SplitPolicy(lxc=["200", "201:2", "202@1"])
    >>> policy.lxc, policy.lxc_subsets, policy.lxc_nodes
    (200, [(201, 2)], [(202, 1, None)])
    >>> SplitPolicy(lxc=200, shared_lxc=[201]).containers
    [200, 201]

    :raises UsageError: for a spelling that is none of those, as for any other field.
    """

    split: Literal["numa"] = "numa"
    host_nodes: list[int] = Field(default_factory=list)
    vfio_nodes: list[int] = Field(default_factory=list)
    host_gpus: list[str] = Field(default_factory=list)
    vfio_gpus: list[str] = Field(default_factory=list)
    requests: list[GuestRequest] = Field(default_factory=list)
    enable_iommu: bool = False
    mapping: str | None = None
    bind_method: BindMethod = "modprobe"

    def __init__(
        self,
        *,
        lxc: int | str | Sequence[int | str] | None = None,
        shared_lxc: Sequence[int] = (),
        lxc_subsets: Sequence[tuple[int, int]] = (),
        lxc_nodes: Sequence[tuple[int, int, int | None]] = (),
        lxc_mig: Sequence[MigSpec] = (),
        vms: Sequence[int | str | tuple[int, int | None]] = (),
        vgpus: Sequence[tuple[int, str]] = (),
        **fields: Any,
    ) -> None:
        # The guests' spellings, typed for the callers; validation makes them requests.
        spelt = {
            "lxc": lxc,
            "shared_lxc": shared_lxc,
            "lxc_subsets": lxc_subsets,
            "lxc_nodes": lxc_nodes,
            "lxc_mig": lxc_mig,
            "vms": vms,
            "vgpus": vgpus,
        }
        super().__init__(**{k: v for k, v in spelt.items() if v}, **fields)

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: Any) -> Any:
        """The guests as the command line spells them, or as tuples by kind, made requests."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        lxc, shared = data.pop("lxc", None), data.pop("shared_lxc", None) or []
        if shared and lxc is None:
            raise ValueError("shared_lxc names containers that share lxc's GPUs, but lxc is unset")
        spelt = [lxc] if isinstance(lxc, int | str) else list(lxc or [])
        requests: list[Any] = parse_lxc_specs([str(s) for s in [*spelt, *shared]])
        requests += [{"kind": "lxc", "vmid": v, "count": n} for v, n in data.pop("lxc_subsets", [])]
        requests += [
            {"kind": "lxc", "vmid": v, "node": node, "count": n}
            for v, node, n in data.pop("lxc_nodes", [])
        ]
        requests += [
            {"kind": "mig", **m} if isinstance(m, dict) else m for m in data.pop("lxc_mig", [])
        ]
        vms = data.pop("vms", None) or []
        requests += parse_vm_specs([str(v) for v in vms if isinstance(v, int | str)])
        requests += [
            {"kind": "vm", "vmid": v[0], "count": v[1]} for v in vms if not isinstance(v, int | str)
        ]
        requests += [{"kind": "vgpu", "vmid": v, "mdev_type": t} for v, t in data.pop("vgpus", [])]
        data["requests"] = [*requests, *data.get("requests", [])]
        return data

    def _of(self, kind: type[_Request]) -> list[_Request]:
        return [request for request in self.requests if isinstance(request, kind)]

    @property
    def shared(self) -> list[int]:
        """The containers that share the host GPUs the others leave (``--lxc 200 --lxc 201``)."""
        return [c.vmid for c in self._of(ContainerRequest) if c.count is None and c.node is None]

    @property
    def lxc(self) -> int | None:
        """The first container of :attr:`shared`."""
        return self.shared[0] if self.shared else None

    @property
    def shared_lxc(self) -> list[int]:
        """The containers that share the host GPUs with :attr:`lxc`."""
        return self.shared[1:]

    @property
    def lxc_subsets(self) -> list[tuple[int, int]]:
        """``(vmid, count)``: each such container gets ``count`` host GPUs of its own on one
        NUMA node (``--lxc 200:2``)."""
        return [
            (c.vmid, c.count)
            for c in self._of(ContainerRequest)
            if c.count is not None and c.node is None
        ]

    @property
    def lxc_nodes(self) -> list[tuple[int, int, int | None]]:
        """``(vmid, node, count)``: each such container gets ``count`` host GPUs of that node,
        or when ``count`` is ``None`` every host GPU of it the counted ones leave, shared with
        the other containers naming that node (``--lxc 200@0``, ``--lxc 201:2@1``)."""
        return [(c.vmid, c.node, c.count) for c in self._of(ContainerRequest) if c.node is not None]

    @property
    def lxc_mig(self) -> list[MigSpec]:
        """The containers given one MIG instance each (``--lxc 200:mig=0/1``)."""
        return self._of(MigSpec)

    @property
    def vms(self) -> list[tuple[int, int | None]]:
        """``(vmid, count)``: the VMs sharing the vfio GPUs, a count of ``None`` meaning "the
        rest"."""
        return [(vm.vmid, vm.count) for vm in self._of(VmRequest)]

    @property
    def vgpus(self) -> list[tuple[int, str]]:
        """``(vmid, mdev type)``: each such VM gets a mediated device of that type on a GPU
        that offers one (``--vm 400:vgpu=nvidia-1155``)."""
        return [(vm.vmid, vm.mdev_type) for vm in self._of(VgpuRequest)]

    def only(self, keep: Callable[[GuestRef], bool]) -> SplitPolicy:
        """This policy for the guests ``keep`` keeps alone (a cluster's node: those it holds).

        >>> SplitPolicy(lxc=200, vms=[300]).only(lambda guest: guest.type == "vm").containers
        []
        """
        kept = [r for r in self.requests if keep(GuestRef(type=_GUEST_TYPE[r.kind], vmid=r.vmid))]
        return self.model_copy(update={"requests": kept})

    @property
    def keeps_drivers(self) -> bool:
        """Whether the request needs no GPU to change driver: vGPUs and MIG instances alone,
        without a node or address rule, a container given whole GPUs or a VM given vfio GPUs.
        Such a request leaves every GPU on the driver it has (a split is asked for, not implied).

        >>> SplitPolicy(vgpus=[(400, "nvidia-1155")]).keeps_drivers
        True
        >>> vgpu = [(400, "nvidia-1155")]
        >>> SplitPolicy(vgpus=vgpu, vms=[300]).keeps_drivers, SplitPolicy().keeps_drivers
        (False, False)
        """
        whole = (self.host_nodes, self.vfio_nodes, self.host_gpus, self.vfio_gpus)
        sharing = all(isinstance(r, MigSpec | VgpuRequest) for r in self.requests)
        return bool(self.requests) and sharing and not any(whole)

    @property
    def containers(self) -> list[int]:
        """Every container that gets host GPUs: ``lxc``, ``shared_lxc``, ``lxc_subsets``,
        ``lxc_nodes``, then ``lxc_mig``.

        >>> SplitPolicy(lxc=202, lxc_subsets=[(200, 2)], lxc_nodes=[(203, 1, None)]).containers
        [202, 200, 203]
        """
        return (
            self.shared
            + [vmid for vmid, _ in self.lxc_subsets]
            + [c[0] for c in self.lxc_nodes]
            + [m.vmid for m in self.lxc_mig]
        )

    @property
    def guests(self) -> list[GuestRef]:
        """Every guest the policy names, once each: its :attr:`containers`, then its VMs
        (``vms``, then ``vgpus``).

        >>> policy = SplitPolicy(lxc=200, vms=[300], vgpus=[(400, "nvidia-1155")])
        >>> [guest.label for guest in policy.guests]
        ['CT 200', 'VM 300', 'VM 400']
        """
        vms = [vmid for vmid, _ in [*self.vms, *self.vgpus]]
        guests = [GuestRef(type="lxc", vmid=vmid) for vmid in self.containers]
        guests += [GuestRef(type="vm", vmid=vmid) for vmid in vms]
        return list(dict.fromkeys(guests))

    @model_validator(mode="wrap")
    @classmethod
    def _as_usage_error(cls, data: Any, handler: ModelWrapValidatorHandler[SplitPolicy]) -> Any:
        """A policy that cannot be is the caller's mistake: a :class:`UsageError` naming the
        field, like every other error proxgpu raises, not pydantic's own.

        >>> SplitPolicy(host_nodes=["one"])
        Traceback (most recent call last):
        ...
        proxgpu.errors.UsageError: split policy: host_nodes.0: Input should be a valid integer, \
unable to parse string as an integer (got 'one')
        """
        try:
            return handler(data)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "policy"
            raise UsageError(
                f"split policy: {where}: {error['msg']} (got {error.get('input')!r})"
            ) from None


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


class Problem(FrozenModel):
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
