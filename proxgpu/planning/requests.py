"""The guests a split is for, as the command line and Ansible spell them: ``--lxc``'s
``VMID[:N][@NODE]`` and ``VMID:mig=GPU/GI[/CI]``, ``--vm``'s ``VMID[:N]`` and
``VMID:vgpu=TYPE``, each parsed here once (:class:`~proxgpu.planning.SplitPolicy` takes them
so).

>>> parse_vm_spec("301:2")
(301, 2)
"""

from __future__ import annotations

from typing import NamedTuple

from proxgpu.errors import UsageError
from proxgpu.inspection.names import MDEV_TYPE
from proxgpu.model import FrozenModel


class MigSpec(FrozenModel):
    """One container's MIG instance as ``--lxc VMID:mig=GPU/GI[/CI]`` asks for it: ``gpu`` as
    written (a CUDA index or a PCI address), the GPU instance id ``gi`` and, when named, the
    compute instance id ``ci`` (unnamed: the GPU instance's only one).

    >>> MigSpec(vmid=200, gpu="0", gi=1).ci is None
    True
    """

    vmid: int
    gpu: str
    gi: int
    ci: int | None = None


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


class LxcSpecs(NamedTuple):
    """``--lxc`` values sorted into containers sharing the host group, containers with a
    count of GPUs of their own, containers bound to a NUMA node and containers with a MIG
    instance, as :class:`SplitPolicy` takes them (``lxc`` is the first of ``shared``;
    ``on_nodes`` are its ``lxc_nodes``, ``mig`` its ``lxc_mig``)."""

    shared: list[int]
    subsets: list[tuple[int, int]]
    on_nodes: list[tuple[int, int, int | None]]
    mig: list[MigSpec]


def parse_lxc_specs(specs: list[str]) -> LxcSpecs:
    """``VMID`` (the container shares the host group) or ``VMID:N`` (N GPUs of the host group
    on one NUMA node, its own) for each container, either one ending in ``@NODE`` to take them
    from that NUMA node (every host GPU of it without ``:N``); or ``VMID:mig=GPU/GI[/CI]`` (one
    MIG instance, see :func:`parse_lxc_mig_spec`).

    >>> parse_lxc_specs(["200", "201", "202:2", "203@1", "204:1@0"])
    LxcSpecs(shared=[200, 201], subsets=[(202, 2)], on_nodes=[(203, 1, None), (204, 0, 1)], mig=[])
    >>> parse_lxc_specs(["205:mig=0/2"]).mig
    [MigSpec(vmid=205, gpu='0', gi=2, ci=None)]

    :raises UsageError: for a spec that is none of them, or a count of 0.
    """
    shared, subsets, on_nodes, mig = [], [], [], []
    for spec in specs:
        if str(spec).partition(":")[2].startswith("mig="):
            mig.append(parse_lxc_mig_spec(str(spec)))
            continue
        rest, node = split_lxc_node(str(spec))
        vmid, colon, count = rest.partition(":")
        if not vmid.isdigit() or not (not colon or (count.isdigit() and int(count) > 0)):
            raise UsageError(
                f"container {spec!r}: expected VMID or VMID:N (N GPUs, at least 1), "
                "either one with @NODE, or VMID:mig=GPU/GI[/CI] (a MIG instance)"
            )
        if node is not None:
            on_nodes.append((int(vmid), node, int(count) if count else None))
        elif count:
            subsets.append((int(vmid), int(count)))
        else:
            shared.append(int(vmid))
    return LxcSpecs(shared, subsets, on_nodes, mig)


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


class VmSpecs(NamedTuple):
    """``--vm`` values sorted into passthrough VMs and vGPU VMs, as :class:`SplitPolicy` takes
    them."""

    vms: list[tuple[int, int | None]]
    vgpus: list[tuple[int, str]]


def parse_vm_specs(specs: list[str]) -> VmSpecs:
    """``VMID``, ``VMID:N`` (N GPUs passed through) or ``VMID:vgpu=TYPE`` (a mediated device of
    that type, as ``mdev_supported_types/`` names it) for each VM.

    >>> parse_vm_specs(["300", "301:2", "400:vgpu=nvidia-1155"])
    VmSpecs(vms=[(300, None), (301, 2)], vgpus=[(400, 'nvidia-1155')])

    :raises UsageError: for a spec that is none of them.
    """
    vms, vgpus = [], []
    for spec in specs:
        vmid, _, rest = str(spec).partition(":")
        if rest.startswith("vgpu="):
            kind = rest.removeprefix("vgpu=")
            if not vmid.isdigit() or not MDEV_TYPE.fullmatch(kind):
                raise UsageError(
                    f"VM {spec!r}: expected VMID:vgpu=TYPE, TYPE as mdev_supported_types names it"
                )
            vgpus.append((int(vmid), kind))
        else:
            vms.append(parse_vm_spec(spec))
    return VmSpecs(vms, vgpus)
