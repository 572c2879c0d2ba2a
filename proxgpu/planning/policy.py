"""What the user asked for: how to split, and the guests the groups are for, one request each
(:mod:`~proxgpu.planning.requests`).

>>> SplitPolicy(vms=["301:2"]).vms
[(301, 2)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from pydantic import Field, ModelWrapValidatorHandler, ValidationError, model_validator

from proxgpu.errors import UsageError
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
from proxgpu.pve.claims import GuestRef

#: How the vfio GPUs are bound at boot (``--bind-method``): it decides which nvidia minors the
#: kept GPUs get at the next boot (see :mod:`~proxgpu.planning.minors`).
BindMethod = Literal["modprobe", "driverctl"]

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
