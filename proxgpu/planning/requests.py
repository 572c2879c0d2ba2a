"""The guests a split is for: one request each (:data:`GuestRequest`, a variant per way a
guest takes a GPU), and their spellings on the command line and in Ansible: ``--lxc``'s
``VMID[:N][@NODE]`` and ``VMID:mig=GPU/GI[/CI]``, ``--vm``'s ``VMID[:N]`` and
``VMID:vgpu=TYPE``, each parsed here once (:class:`~proxgpu.planning.SplitPolicy` takes them
so).

>>> parse_vm_spec("301:2")
(301, 2)
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from proxgpu.errors import UsageError
from proxgpu.inspection.names import MDEV_TYPE
from proxgpu.model import FrozenModel


class ContainerRequest(FrozenModel):
    """A container given whole GPUs of the host group: ``count`` of its own on one NUMA node
    (``--lxc 200:2``), or of NUMA node ``node`` (``--lxc 201:2@1``; without a count every
    host GPU of that node the counted ones leave, shared with the node's other such
    containers: ``--lxc 202@1``); neither: it shares the host GPUs the others leave
    (``--lxc 200``).

    >>> ContainerRequest(vmid=201, count=2, node=1)
    ContainerRequest(vmid=201, count=2, node=1)
    """

    kind: Literal["lxc"] = Field(default="lxc", repr=False)
    vmid: int
    count: int | None = None
    node: int | None = None


class MigSpec(FrozenModel):
    """A container given one MIG instance, as ``--lxc VMID:mig=GPU/GI[/CI]`` asks for it:
    ``gpu`` as written (a CUDA index or a PCI address), the GPU instance id ``gi`` and, when
    named, the compute instance id ``ci`` (unnamed: the GPU instance's only one).

    >>> MigSpec(vmid=200, gpu="0", gi=1).ci is None
    True
    """

    kind: Literal["mig"] = Field(default="mig", repr=False)
    vmid: int
    gpu: str
    gi: int
    ci: int | None = None


class VmRequest(FrozenModel):
    """A VM given vfio GPUs: ``count`` of them (``--vm 301:2``), or (``None``) the vfio GPUs
    the counted VMs leave (``--vm 300``).

    >>> VmRequest(vmid=301, count=2)
    VmRequest(vmid=301, count=2)
    """

    kind: Literal["vm"] = Field(default="vm", repr=False)
    vmid: int
    count: int | None = None


class VgpuRequest(FrozenModel):
    """A VM given a mediated device of ``mdev_type`` on a GPU that offers one
    (``--vm 400:vgpu=nvidia-1155``); the GPU stays on its host driver.

    >>> VgpuRequest(vmid=400, mdev_type="nvidia-1155")
    VgpuRequest(vmid=400, mdev_type='nvidia-1155')
    """

    kind: Literal["vgpu"] = Field(default="vgpu", repr=False)
    vmid: int
    mdev_type: str


#: What one guest asks of the split: a variant for each way a guest takes a GPU (a new way of
#: sharing one is a new variant, its planner and its renderer).
GuestRequest = Annotated[
    ContainerRequest | MigSpec | VmRequest | VgpuRequest, Field(discriminator="kind")
]


def parse_vm_spec(spec: str) -> tuple[int, int | None]:
    """``VMID`` or ``VMID:N`` (N GPUs for that VM) as ``SplitPolicy.vms`` takes it.

    >>> parse_vm_spec("300"), parse_vm_spec("301:2")
    ((300, None), (301, 2))

    :raises UsageError: when ``spec`` is neither.
    """
    vmid, _, count = str(spec).partition(":")
    if not vmid.isdigit() or (count and not count.isdigit()):
        raise UsageError(f"VM {spec!r}: expected VMID, VMID:N or VMID:vgpu=TYPE")
    return int(vmid), int(count) if count else None


def parse_lxc_specs(specs: list[str]) -> list[GuestRequest]:
    """``VMID`` (the container shares the host group) or ``VMID:N`` (N GPUs of the host group
    on one NUMA node, its own) for each container, either one ending in ``@NODE`` to take them
    from that NUMA node (every host GPU of it without ``:N``); or ``VMID:mig=GPU/GI[/CI]`` (one
    MIG instance, see :func:`parse_lxc_mig_spec`): a request each, in the order given.

    >>> parse_lxc_specs(["200", "202:2", "204:1@0"])
    [ContainerRequest(vmid=200, count=None, node=None), ContainerRequest(vmid=202, count=2, \
node=None), ContainerRequest(vmid=204, count=1, node=0)]
    >>> parse_lxc_specs(["205:mig=0/2"])
    [MigSpec(vmid=205, gpu='0', gi=2, ci=None)]

    :raises UsageError: for a spec that is none of them, or a count of 0.
    """
    requests: list[GuestRequest] = []
    for spec in specs:
        if str(spec).partition(":")[2].startswith("mig="):
            requests.append(parse_lxc_mig_spec(str(spec)))
            continue
        rest, node = split_lxc_node(str(spec))
        vmid, colon, count = rest.partition(":")
        if not vmid.isdigit() or not (not colon or (count.isdigit() and int(count) > 0)):
            raise UsageError(
                f"container {spec!r}: expected VMID or VMID:N (N GPUs, at least 1), "
                "either one with @NODE, or VMID:mig=GPU/GI[/CI] (a MIG instance)"
            )
        requests.append(
            ContainerRequest(vmid=int(vmid), count=int(count) if count else None, node=node)
        )
    return requests


def split_lxc_node(spec: str) -> tuple[str, int | None]:
    """``spec`` without its ``@NODE`` suffix, and that NUMA node (``None`` without one).

    >>> split_lxc_node("201:2@1"), split_lxc_node("200")
    (('201:2', 1), ('200', None))

    :raises UsageError: when what follows ``@`` is not a node number.
    """
    rest, at, node = spec.rpartition("@")
    if not at:
        return spec, None
    if not node.isdigit():
        raise UsageError(f"container {spec!r}: expected a NUMA node number after @ (VMID@NODE)")
    return rest, int(node)


def parse_lxc_mig_spec(spec: str) -> MigSpec:
    """``VMID:mig=GPU/GI`` or ``VMID:mig=GPU/GI/CI``: the container gets that MIG instance of
    GPU (a CUDA index, or a PCI address as ``--host-gpus`` takes it), GI and CI being the ids
    ``nvidia-smi mig -lgi`` and ``-lci`` print (no CI: the GPU instance's only compute instance).

    >>> parse_lxc_mig_spec("200:mig=0000:81:00.0/1/0")
    MigSpec(vmid=200, gpu='0000:81:00.0', gi=1, ci=0)

    :raises UsageError: for anything else.
    """
    vmid, _, rest = spec.partition(":")
    gpu, *ids = rest.removeprefix("mig=").split("/")
    if not (vmid.isdigit() and gpu and 1 <= len(ids) <= 2 and all(i.isdigit() for i in ids)):
        raise UsageError(
            f"container {spec!r}: expected VMID:mig=GPU/GI or VMID:mig=GPU/GI/CI (GPU a CUDA "
            "index or PCI address, GI and CI the ids nvidia-smi mig -lgi and -lci print)"
        )
    return MigSpec(
        vmid=int(vmid), gpu=gpu, gi=int(ids[0]), ci=int(ids[1]) if len(ids) == 2 else None
    )


def parse_vm_specs(specs: list[str]) -> list[GuestRequest]:
    """``VMID``, ``VMID:N`` (N GPUs passed through) or ``VMID:vgpu=TYPE`` (a mediated device of
    that type, as ``mdev_supported_types/`` names it) for each VM: a request each, in the order
    given.

    >>> parse_vm_specs(["300", "301:2", "400:vgpu=nvidia-1155"])
    [VmRequest(vmid=300, count=None), VmRequest(vmid=301, count=2), \
VgpuRequest(vmid=400, mdev_type='nvidia-1155')]

    :raises UsageError: for a spec that is none of them.
    """
    requests: list[GuestRequest] = []
    for spec in specs:
        vmid, _, rest = str(spec).partition(":")
        if rest.startswith("vgpu="):
            kind = rest.removeprefix("vgpu=")
            if not vmid.isdigit() or not MDEV_TYPE.fullmatch(kind):
                raise UsageError(
                    f"VM {spec!r}: expected VMID:vgpu=TYPE, TYPE as mdev_supported_types names it"
                )
            requests.append(VgpuRequest(vmid=int(vmid), mdev_type=kind))
        else:
            number, count = parse_vm_spec(spec)
            requests.append(VmRequest(vmid=number, count=count))
    return requests
