"""The planner: which GPUs stay on their host driver and which go to vfio-pci.

:func:`plan_split` turns an :class:`~proxgpu.inventory.Inventory` and a :class:`SplitPolicy` into
a :class:`Plan`, or raises :class:`PlanRefusedError` listing every problem together with what to do
about it. It reads and writes nothing; renderers turn the plan into configuration.
:func:`check_gpu_set` tells whether a set of GPUs shares one NUMA node.

>>> from proxgpu.inventory import Gpu, Inventory, PciFunction
>>> def gpu(bus, node):
...     address = f"0000:{bus}:00.0"
...     return Gpu(address=address, vendor_id="10de", device_id="2330", class_code="0x030200",
...                numa_node=node, iommu_group=int(bus, 16), driver="nvidia",
...                functions=[address], function_info=[])
>>> inventory = Inventory(source="doc", hostname="pve1", iommu_enabled=True,
...                       gpus=[gpu("01", 0), gpu("11", 0), gpu("81", 1)])
>>> plan = plan_split(inventory, SplitPolicy(lxc=200))
>>> [(g.role, g.numa_node, len(g.gpus), g.driver) for g in plan.groups]
[('host', 0, 2, 'nvidia'), ('vfio', 1, 1, 'vfio-pci')]
>>> plan.warnings
['uneven split: 2 GPUs on the host driver, 1 GPU on vfio-pci']
>>> [(tp.size, tp.device_sets) for tp in plan.tensor_parallel]
[(1, ['0', '1']), (2, ['0,1'])]
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from proxgpu.claims import DeviceClaim, GuestRef, device_claims
from proxgpu.cpulist import format_cpulist, parse_cpulist
from proxgpu.drivers import host_driver
from proxgpu.errors import ProxgpuError, UsageError
from proxgpu.inventory import FrozenModel, Gpu, Inventory, PciFunction

Role = Literal["host", "vfio"]
ProblemCode = Literal[
    "no-gpus",
    "policy",
    "unknown-numa",
    "slot-split",
    "iommu-mixed",
    "iommu-peer",
    "claimed",
    "iommu-off",
    "no-fit",
]

VFIO_DRIVER = "vfio-pci"
TP_SIZES = (1, 2, 4, 8)

_PCI_ADDRESS = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{4,8}):)?(?P<bus>[0-9a-f]{2}):(?P<device>[0-9a-f]{2})"
    r"(?:\.(?P<function>[0-7]))?$",
    re.IGNORECASE,
)


class SplitPolicy(FrozenModel):
    """What the user asked for: how to split and who receives the groups.

    ``split="numa"`` (the only mode so far) keeps the lowest-numbered NUMA node holding GPUs on
    the host driver and sends every other node to vfio-pci. ``host_nodes``/``vfio_nodes`` choose
    nodes instead (nodes not named take the other role when only one list is given);
    ``host_gpus``/``vfio_gpus`` assign GPUs by address (one address per entry, any form
    :func:`normalize_pci_address` takes) and win over node rules. ``lxc`` receives the host group;
    ``vms`` share the vfio GPUs as ``(vmid, count)``, a count of ``None`` meaning "the rest".
    ``enable_iommu`` says the kernel command line change that turns the IOMMU on will be planned.

    >>> SplitPolicy(lxc=200, vms=[(300, 2), (301, None)]).vms
    [(300, 2), (301, None)]
    """

    split: Literal["numa"] = "numa"
    host_nodes: list[int] = Field(default_factory=list)
    vfio_nodes: list[int] = Field(default_factory=list)
    host_gpus: list[str] = Field(default_factory=list)
    vfio_gpus: list[str] = Field(default_factory=list)
    lxc: int | None = None
    vms: list[tuple[int, int | None]] = Field(default_factory=list)
    enable_iommu: bool = False


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
    node is unknown; then the pinning covers every node they may sit on.

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


class TensorParallelAdvice(FrozenModel):
    """NUMA-local device sets of one tensor-parallel size, as ``CUDA_VISIBLE_DEVICES`` values.

    The numbers are the indices the container sees under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: the
    position of each GPU among the host group's GPUs sorted by PCI address.

    >>> TensorParallelAdvice(size=2, device_sets=["0,1", "2,3"]).device_sets[1]
    '2,3'
    """

    size: int
    device_sets: list[str]


class Plan(FrozenModel):
    """The planned split: groups, warnings, tensor-parallel advice for the host group.

    ``enable_iommu`` is true when the plan relies on turning the IOMMU on at the next boot.

    >>> Plan(groups=[], warnings=["uneven split"], tensor_parallel=[]).model_dump()["warnings"]
    ['uneven split']
    """

    groups: list[PlanGroup]
    warnings: list[str]
    tensor_parallel: list[TensorParallelAdvice]
    enable_iommu: bool = False


class GpuPlacement(FrozenModel):
    """Where one GPU of a checked set sits: its PCI-bus-order index, address and NUMA node.

    >>> GpuPlacement(index=4, address="0000:81:00.0", model=None, numa_node=1).numa_node
    1
    """

    index: int
    address: str
    model: str | None
    numa_node: int | None


class GpuSetCheck(FrozenModel):
    """Whether a set of GPUs shares one known NUMA node, and why (or why not).

    >>> GpuSetCheck(gpus=[], numa_local=True, numa_node=0, explanation="").numa_local
    True
    """

    gpus: list[GpuPlacement]
    numa_local: bool
    numa_node: int | None
    explanation: str


class PlanRefusedError(ProxgpuError):
    """The planner refused: ``problems`` lists each reason with what to do about it.

    >>> err = PlanRefusedError("pve1", [Problem(code="iommu-off", what="IOMMU is off",
    ...                                         fix="plan the kernel command line change")])
    >>> print(err)
    pve1: plan refused (1 problem)
      - IOMMU is off
        fix: plan the kernel command line change
    """

    exit_code = 9

    def __init__(self, host: str, problems: list[Problem]) -> None:
        lines = [f"{host}: plan refused ({_count(len(problems), 'problem')})"]
        for problem in problems:
            lines += [f"  - {problem.what}", f"    fix: {problem.fix}"]
        super().__init__("\n".join(lines))
        self.host = host
        self.problems = problems


def parse_vm_spec(spec: str) -> tuple[int, int | None]:
    """``VMID`` or ``VMID:N`` (N GPUs for that VM) as ``SplitPolicy.vms`` takes it.

    >>> parse_vm_spec("300"), parse_vm_spec("301:2")
    ((300, None), (301, 2))

    :raises UsageError: when ``spec`` is neither.
    """
    vmid, _, count = str(spec).partition(":")
    if not vmid.isdigit() or (count and not count.isdigit()):
        raise UsageError(f"VM {spec!r}: expected VMID or VMID:N")
    return int(vmid), int(count) if count else None


def normalize_pci_address(text: str) -> str:
    """The sysfs form of a PCI address: 4-digit domain, lower case; a slot stays a slot.

    Takes what ``hostpci``, ``lspci`` and ``nvidia-smi`` print.

    >>> normalize_pci_address("81:00.0"), normalize_pci_address("0000:81:00")
    ('0000:81:00.0', '0000:81:00')
    >>> normalize_pci_address("00000000:4F:00.0")
    '0000:4f:00.0'

    :raises ValueError: when ``text`` is not a PCI address.
    """
    match = _PCI_ADDRESS.match(text.strip())
    if match is None:
        raise ValueError(f"not a PCI address: {text!r}")
    domain = int(match["domain"] or "0", 16)
    slot = f"{domain:04x}:{match['bus']}:{match['device']}".lower()
    return f"{slot}.{match['function']}" if match["function"] else slot


def plan_split(inventory: Inventory, policy: SplitPolicy | None = None) -> Plan:
    """Split the inventory's GPUs into a host group and vfio groups as ``policy`` says.

    The result depends only on the arguments, and its lists are in a fixed order: the host group
    first, then one vfio group per VM in ``policy.vms`` order, then GPUs bound to vfio-pci for no
    VM, one group per NUMA node.

    >>> from proxgpu.inventory import Inventory
    >>> plan_split(Inventory(source="doc", hostname="pve1"))
    Traceback (most recent call last):
    ...
    proxgpu.planning.PlanRefusedError: pve1: plan refused (1 problem)
      - the inventory holds no GPUs
        fix: check that the GPUs are visible on the host (lspci -nn | grep -i nvidia)

    :raises PlanRefusedError: listing every problem found.
    """
    ctx = _Context(inventory, policy or SplitPolicy())
    if not ctx.index.gpus:
        ctx.problem(
            "no-gpus",
            "the inventory holds no GPUs",
            "check that the GPUs are visible on the host (lspci -nn | grep -i nvidia)",
        )
    ctx.raise_problems()
    roles = _assign_roles(ctx)
    ctx.raise_problems()
    groups = _build_groups(ctx, roles)
    _check_slots(ctx, roles)
    _check_iommu_groups(ctx, roles)
    _check_claims(ctx, groups)
    enable_iommu = _check_iommu_on(ctx, groups)
    ctx.raise_problems()
    _warn_about_shape(ctx, groups)
    host = next((group for group in groups if group.role == "host"), None)
    return Plan(
        groups=groups,
        warnings=ctx.warnings,
        tensor_parallel=_tensor_parallel(ctx, host),
        enable_iommu=enable_iommu,
    )


def check_gpu_set(inventory: Inventory, selectors: list[str]) -> GpuSetCheck:
    """Check that the selected GPUs share one NUMA node.

    A selector is an index in PCI bus order over all the host's GPUs (what ``nvidia-smi`` shows
    under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) or an address in any form
    :func:`normalize_pci_address` takes.

    >>> from proxgpu.inventory import Gpu, Inventory, PciFunction
    >>> gpus = [Gpu(address=a, vendor_id="10de", device_id="2330", class_code="0x030200",
    ...             numa_node=n, functions=[a], function_info=[])
    ...         for a, n in [("0000:01:00.0", 0), ("0000:11:00.0", 0), ("0000:81:00.0", 1)]]
    >>> check = check_gpu_set(Inventory(source="doc", hostname="pve1", gpus=gpus), ["1", "2"])
    >>> check.numa_local
    False
    >>> print(check.explanation)
    GPUs 1,2 straddle NUMA nodes 0 and 1: node 0 holds 1 (0000:11:00.0); node 1 holds 2 \
(0000:81:00.0). NUMA-local sets of 2: 0,1.

    :raises UsageError: when a selector names no GPU, none is given, or the host has no GPUs.
    """
    index = _GpuIndex(sorted(inventory.gpus, key=_address))
    if not index.gpus:
        raise UsageError(f"{inventory.hostname} has no GPUs to check")
    if not selectors:
        raise UsageError("name at least one GPU, by index (0, 1, ...) or by address")
    chosen: dict[str, Gpu] = {}
    for selector in selectors:
        for gpu in _select_for_check(index, selector):
            chosen[gpu.address] = gpu
    placements = [
        GpuPlacement(
            index=index.position[gpu.address],
            address=gpu.address,
            model=gpu.model,
            numa_node=gpu.numa_node,
        )
        for gpu in sorted(chosen.values(), key=_address)
    ]
    nodes = {placement.numa_node for placement in placements}
    local = len(nodes) == 1 and None not in nodes
    return GpuSetCheck(
        gpus=placements,
        numa_local=local,
        numa_node=placements[0].numa_node if local else None,
        explanation=_explain_set(index, placements, local),
    )


class _GpuIndex:
    """The GPUs in PCI bus order, found by any address or minor a user or a config names."""

    def __init__(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        self.position = {gpu.address: i for i, gpu in enumerate(gpus)}
        self._by_address = {gpu.address: gpu for gpu in gpus}
        self._by_function: dict[str, list[Gpu]] = defaultdict(list)
        self._by_slot: dict[str, list[Gpu]] = defaultdict(list)
        for gpu in gpus:
            self._by_slot[gpu.slot].append(gpu)
            for function in gpu.functions:
                self._by_function[function].append(gpu)
        self.by_minor = {gpu.nvidia_minor: gpu for gpu in gpus if gpu.nvidia_minor is not None}

    def get(self, address: str) -> Gpu:
        """The GPU whose own address this is."""
        return self._by_address[address]

    def at(self, address: str) -> list[Gpu]:
        """The GPU at a normalised address; else every GPU having that function or slot."""
        if address in self._by_address:
            return [self._by_address[address]]
        return self._by_function.get(address) or self._by_slot.get(address, [])


@dataclass
class _Context:
    """One planning run: its inputs, and the problems and warnings found so far."""

    inventory: Inventory
    policy: SplitPolicy
    index: _GpuIndex = field(init=False)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.index = _GpuIndex(sorted(self.inventory.gpus, key=_address))

    def problem(self, code: ProblemCode, what: str, fix: str) -> None:
        self.problems.append(Problem(code=code, what=what, fix=fix))

    def raise_problems(self) -> None:
        if self.problems:
            raise PlanRefusedError(self.inventory.hostname, self.problems)

    def targets(self) -> set[GuestRef]:
        guests = {GuestRef(type="vm", vmid=vmid) for vmid, _ in self.policy.vms}
        if self.policy.lxc is not None:
            guests.add(GuestRef(type="lxc", vmid=self.policy.lxc))
        return guests


# --- roles -------------------------------------------------------------------------------------


def _assign_roles(ctx: _Context) -> dict[str, Role]:
    """GPU address -> role: by address first, then by node (or the other list's complement)."""
    policy = ctx.policy
    _check_targets(ctx)
    named = _named_roles(ctx)
    use_nodes = bool(policy.host_nodes or policy.vfio_nodes) or not named
    node_roles = _node_roles(ctx) if use_nodes else {}
    roles: dict[str, Role] = {}
    unknown: list[Gpu] = []
    unnamed: list[Gpu] = []
    unlisted_nodes: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in ctx.index.gpus:
        if gpu.address in named:
            roles[gpu.address] = named[gpu.address]
        elif not use_nodes:
            unnamed.append(gpu)
        elif gpu.numa_node is None:
            unknown.append(gpu)
        elif gpu.numa_node in node_roles:
            roles[gpu.address] = node_roles[gpu.numa_node]
        else:
            unlisted_nodes[gpu.numa_node].append(gpu)
    if unnamed:
        _complement_roles(ctx, unnamed, roles)
    _report_unplaced(ctx, unknown, unlisted_nodes)
    return roles


def _check_targets(ctx: _Context) -> None:
    vmids = [vmid for vmid, _ in ctx.policy.vms]
    if ctx.policy.lxc is not None:
        vmids.append(ctx.policy.lxc)
    for vmid in sorted({vmid for vmid in vmids if vmids.count(vmid) > 1}):
        ctx.problem(
            "policy",
            f"guest {vmid} is named more than once among the targets",
            "name each container or VM once (a VMID is unique across containers and VMs)",
        )
    for vmid, count in ctx.policy.vms:
        if count is not None and count < 1:
            ctx.problem("policy", f"--vm {vmid}:{count} asks for no GPU", "ask for 1 GPU or more")
    rest = [vmid for vmid, count in ctx.policy.vms if count is None]
    if len(rest) > 1:
        ctx.problem(
            "policy",
            f"VMs {_join(rest)} all ask for the remaining vfio GPUs",
            "give every VM but one a GPU count, as --vm VMID:N",
        )


def _named_roles(ctx: _Context) -> dict[str, Role]:
    """The roles given by ``--host-gpus``/``--vfio-gpus``."""
    named: dict[str, Role] = {}
    lists: list[tuple[Role, str, list[str]]] = [
        ("host", "--host-gpus", ctx.policy.host_gpus),
        ("vfio", "--vfio-gpus", ctx.policy.vfio_gpus),
    ]
    for role, option, texts in lists:
        for gpu in _select_by_address(ctx, option, texts):
            if named.get(gpu.address, role) != role:
                ctx.problem(
                    "policy",
                    f"{gpu.address} is in both --host-gpus and --vfio-gpus",
                    "name each GPU in one list only",
                )
            named[gpu.address] = role
    return named


def _select_by_address(ctx: _Context, option: str, texts: list[str]) -> list[Gpu]:
    selected: list[Gpu] = []
    for text in texts:
        try:
            found = ctx.index.at(normalize_pci_address(text))
        except ValueError:
            ctx.problem(
                "policy",
                f"{option} {text}: not a PCI address",
                "write addresses as 0000:81:00.0, 81:00.0 or 81:00",
            )
            continue
        if not found:
            ctx.problem(
                "policy",
                f"{option} {text}: no GPU at that address",
                f"the GPUs of {ctx.inventory.hostname} are {_join(_addresses(ctx.index.gpus))}",
            )
        selected.extend(found)
    return selected


def _node_roles(ctx: _Context) -> dict[int, Role]:
    """NUMA node -> role for every node holding GPUs that the node rules place."""
    policy = ctx.policy
    gpu_nodes = sorted({gpu.numa_node for gpu in ctx.index.gpus if gpu.numa_node is not None})
    for option, nodes in (("--host-node", policy.host_nodes), ("--vfio-node", policy.vfio_nodes)):
        for node in sorted(set(nodes) - set(gpu_nodes)):
            ctx.problem(
                "policy",
                f"{option} {node}: NUMA node {node} holds no GPUs",
                f"the nodes holding GPUs are {_join(gpu_nodes) or 'none known'}",
            )
    for node in sorted(set(policy.host_nodes) & set(policy.vfio_nodes)):
        ctx.problem(
            "policy",
            f"NUMA node {node} is in both --host-node and --vfio-node",
            "name each node once",
        )
    if not policy.host_nodes and not policy.vfio_nodes:
        return {node: "host" if node == gpu_nodes[0] else "vfio" for node in gpu_nodes}
    roles: dict[int, Role] = {}
    for node in gpu_nodes:
        if node in policy.host_nodes or (node not in policy.vfio_nodes and not policy.host_nodes):
            roles[node] = "host"
        elif node in policy.vfio_nodes or not policy.vfio_nodes:
            roles[node] = "vfio"
    return roles


def _complement_roles(ctx: _Context, unnamed: list[Gpu], roles: dict[str, Role]) -> None:
    """GPUs left out of the one address list given take the other role."""
    if ctx.policy.host_gpus and ctx.policy.vfio_gpus:
        ctx.problem(
            "policy",
            f"{_join(_addresses(unnamed))} in neither --host-gpus nor --vfio-gpus",
            "name every GPU in one of the lists, or give only one list "
            "(the GPUs it does not name then take the other role)",
        )
        return
    other: Role = "vfio" if ctx.policy.host_gpus else "host"
    roles.update((gpu.address, other) for gpu in unnamed)


def _report_unplaced(
    ctx: _Context, unknown: list[Gpu], unlisted_nodes: dict[int, list[Gpu]]
) -> None:
    if unknown:
        addresses = _addresses(unknown)
        ctx.problem(
            "unknown-numa",
            f"the NUMA node of {_join(addresses)} is unknown (sysfs numa_node is -1: the firmware "
            "gave no locality), so the split by NUMA node cannot place "
            f"{'it' if len(unknown) == 1 else 'them'}",
            "assign GPUs by address instead, e.g. "
            f"--vfio-gpus {','.join(addresses[len(addresses) // 2 :])} (the GPUs not named stay "
            "on the host driver), or name both sides with --host-gpus and --vfio-gpus",
        )
    for node, gpus in sorted(unlisted_nodes.items()):
        ctx.problem(
            "policy",
            f"NUMA node {node} holds {_join(_addresses(gpus))} but is in neither --host-node nor "
            "--vfio-node",
            f"add --host-node {node} or --vfio-node {node}",
        )


# --- groups ------------------------------------------------------------------------------------


def _build_groups(ctx: _Context, roles: dict[str, Role]) -> list[PlanGroup]:
    host = [gpu for gpu in ctx.index.gpus if roles[gpu.address] == "host"]
    vfio = [gpu for gpu in ctx.index.gpus if roles[gpu.address] == "vfio"]
    groups: list[PlanGroup] = []
    lxc = None if ctx.policy.lxc is None else GuestRef(type="lxc", vmid=ctx.policy.lxc)
    if host:
        groups.append(_make_group(ctx, "host", host, lxc))
    elif lxc is not None:
        ctx.problem(
            "no-fit",
            f"CT {lxc.vmid} should receive the host group, but every GPU goes to vfio-pci",
            "keep a NUMA node on the host (--host-node N) or name GPUs with --host-gpus",
        )
    groups.extend(_make_group(ctx, "vfio", gpus, vm) for vm, gpus in _vfio_units(ctx, vfio))
    return groups


def _make_group(ctx: _Context, role: Role, gpus: list[Gpu], guest: GuestRef | None) -> PlanGroup:
    nodes = {gpu.numa_node for gpu in gpus}
    if role == "vfio":
        driver = VFIO_DRIVER
    else:
        driver = ",".join(sorted({_host_driver(gpu) for gpu in gpus}))
    return PlanGroup(
        role=role,
        numa_node=next(iter(nodes)) if len(nodes) == 1 else None,
        gpus=_addresses(gpus),
        functions=sorted({function for gpu in gpus for function in gpu.functions}),
        cpus=_group_cpus(ctx.inventory, gpus),
        memory_nodes=_memory_nodes(ctx.inventory, nodes),
        driver=driver,
        guest=guest,
    )


def _host_driver(gpu: Gpu) -> str:
    # A GPU that is unbound or on vfio-pci shows no host driver: infer the one it returns to.
    if gpu.driver is None or gpu.driver == VFIO_DRIVER:
        return host_driver(gpu.vendor_id, gpu.class_code) or "unknown"
    return gpu.driver


def _group_cpus(inventory: Inventory, gpus: list[Gpu]) -> str:
    node_cpus = {node.id: node.cpus for node in inventory.numa_nodes}
    cpus: set[int] = set()
    for gpu in gpus:
        if gpu.numa_node in node_cpus:
            cpus.update(parse_cpulist(node_cpus[gpu.numa_node]))
        elif gpu.local_cpus:
            # For an unknown node the kernel lists every online CPU here.
            cpus.update(parse_cpulist(gpu.local_cpus))
        else:
            cpus.update(cpu for node in inventory.numa_nodes for cpu in node.cpu_ids())
    return format_cpulist(cpus)


def _memory_nodes(inventory: Inventory, nodes: set[int | None]) -> list[int]:
    if None in nodes:
        # Locality unknown: allow every node rather than guess one.
        return sorted(node.id for node in inventory.numa_nodes)
    return sorted(node for node in nodes if node is not None)


def _vfio_units(ctx: _Context, vfio: list[Gpu]) -> list[tuple[GuestRef | None, list[Gpu]]]:
    """The vfio GPUs shared out: one unit per VM, then the rest per NUMA node for no VM."""
    free = _bundles_by_node(vfio)
    taken: dict[int, list[Gpu]] = {}
    counted = [(vmid, count) for vmid, count in ctx.policy.vms if count is not None]
    # Largest first, so that big VMs still find a whole node before small ones fragment it.
    for vmid, count in sorted(counted, key=lambda vm: -vm[1]):
        gpus = _take_for_vm(free, count)
        if gpus is None:
            _report_no_fit(ctx, vmid, count, vfio, free)
        else:
            taken[vmid] = gpus
    left = sorted(
        (gpu for bundles in free.values() for bundle in bundles for gpu in bundle),
        key=_address,
    )
    rest = [vmid for vmid, count in ctx.policy.vms if count is None]
    if rest and left:
        taken[rest[0]] = left
        left = []
    elif rest:
        _report_no_fit(ctx, rest[0], None, vfio, free)
    if left and ctx.policy.vms:
        ctx.warnings.append(
            f"{_count(len(left), 'GPU')} on vfio-pci go to no VM: {_join(_addresses(left))}"
        )
    units: list[tuple[GuestRef | None, list[Gpu]]] = [
        (GuestRef(type="vm", vmid=vmid), sorted(taken[vmid], key=_address))
        for vmid, _ in ctx.policy.vms
        if vmid in taken
    ]
    units.extend((None, gpus) for gpus in _split_by_node(left))
    return units


def _bundles_by_node(gpus: list[Gpu]) -> dict[int | None, list[list[Gpu]]]:
    """GPUs that must go to the same VM (one IOMMU group, or one slot), by NUMA node."""
    bundles: dict[tuple[str, int | str], list[Gpu]] = {}
    for gpu in gpus:
        key = ("group", gpu.iommu_group) if gpu.iommu_group is not None else ("slot", gpu.slot)
        bundles.setdefault(key, []).append(gpu)
    by_node: dict[int | None, list[list[Gpu]]] = defaultdict(list)
    for bundle in bundles.values():
        by_node[bundle[0].numa_node].append(bundle)
    return {node: by_node[node] for node in sorted(by_node, key=_node_order)}


def _take_for_vm(free: dict[int | None, list[list[Gpu]]], count: int) -> list[Gpu] | None:
    """Take ``count`` GPUs out of ``free``: from one node if any fits (the tightest), else across
    nodes starting with the fullest. ``None`` when the bundles cannot make ``count``."""
    fits = [
        (sum(map(len, bundles)), _node_order(node), node, picked)
        for node, bundles in free.items()
        if (picked := _pick_exact(bundles, count)) is not None
    ]
    if fits:
        _, _, node, picked = min(fits, key=lambda fit: fit[:2])
        free[node] = [bundle for bundle in free[node] if bundle not in picked]
        return [gpu for bundle in picked for gpu in bundle]
    order = sorted(free, key=lambda node: (-sum(map(len, free[node])), _node_order(node)))
    spanning = _pick_exact([bundle for node in order for bundle in free[node]], count)
    if spanning is None:
        return None
    for node in order:
        free[node] = [bundle for bundle in free[node] if bundle not in spanning]
    return [gpu for bundle in spanning for gpu in bundle]


def _pick_exact(bundles: list[list[Gpu]], count: int) -> list[list[Gpu]] | None:
    """The earliest bundles (in list order) holding exactly ``count`` GPUs, or ``None``."""
    # reachable[i]: the GPU counts some choice of bundles[i:] adds up to; lets the walk below
    # take a bundle only when the rest can still be made up, without backtracking.
    reachable = [{0}]
    for bundle in reversed(bundles):
        after = reachable[-1]
        reachable.append(after | {n + len(bundle) for n in after if n + len(bundle) <= count})
    reachable.reverse()
    if count not in reachable[0]:
        return None
    picked: list[list[Gpu]] = []
    left = count
    for i, bundle in enumerate(bundles):
        if len(bundle) <= left and left - len(bundle) in reachable[i + 1]:
            picked.append(bundle)
            left -= len(bundle)
    return picked


def _report_no_fit(
    ctx: _Context,
    vmid: int,
    count: int | None,
    vfio: list[Gpu],
    free: dict[int | None, list[list[Gpu]]],
) -> None:
    left = sum(len(bundle) for bundles in free.values() for bundle in bundles)
    asked = "the remaining vfio GPUs" if count is None else _count(count, "GPU")
    if count is not None and left >= count:
        why = f"the {left} vfio GPUs left cannot make that: GPUs sharing an IOMMU group go together"
    else:
        why = f"at most {left} of the {len(vfio)} vfio GPUs are left for it"
    ctx.problem(
        "no-fit",
        f"VM {vmid} asks for {asked}, but {why}",
        "change the VM GPU counts (--vm VMID:N), or send more GPUs to vfio-pci",
    )


def _split_by_node(gpus: list[Gpu]) -> list[list[Gpu]]:
    by_node: dict[int | None, list[Gpu]] = defaultdict(list)
    for gpu in gpus:
        by_node[gpu.numa_node].append(gpu)
    return [by_node[node] for node in sorted(by_node, key=_node_order)]


# --- checks ------------------------------------------------------------------------------------


def _check_slots(ctx: _Context, roles: dict[str, Role]) -> None:
    """All functions of a slot move together, so its GPUs need one role."""
    by_slot: dict[str, list[Gpu]] = defaultdict(list)
    for gpu in ctx.index.gpus:
        by_slot[gpu.slot].append(gpu)
    for slot, gpus in by_slot.items():
        if len({roles[gpu.address] for gpu in gpus}) > 1:
            ctx.problem(
                "slot-split",
                f"slot {slot} holds GPUs of both roles: {_with_roles(gpus, roles)}",
                "all functions of a slot move together: give its GPUs the same role",
            )


def _check_iommu_groups(ctx: _Context, roles: dict[str, Role]) -> None:
    """An IOMMU group moves to vfio-pci whole: no host GPU and no foreign device may be in it."""
    owner = {function: gpu for gpu in ctx.index.gpus for function in gpu.functions}
    gpus_in, members = _iommu_membership(ctx, owner)
    foreign = _foreign_peers(ctx, owner)
    for group, gpus in sorted(gpus_in.items()):
        group_roles = {roles[gpu.address] for gpu in gpus}
        listing = "; ".join(
            f"{address} ({label})" for address, label in sorted(members[group].items())
        )
        addresses = _addresses(gpus)
        if len(group_roles) > 1:
            ctx.problem(
                "iommu-mixed",
                f"IOMMU group {group} holds GPUs of both roles: {_with_roles(gpus, roles)}; "
                f"members: {listing}",
                "a group goes to vfio-pci as a whole: give these GPUs the same role, move one card "
                "to a slot with its own IOMMU group, or turn on ACS in the firmware",
            )
        elif group_roles == {"vfio"} and group in foreign:
            ctx.problem(
                "iommu-peer",
                f"IOMMU group {group} of {_join(addresses)} also holds {_join(foreign[group])}, "
                "which is no GPU function: vfio-pci would take it from the host; "
                f"members: {listing}",
                "move the GPU to another slot or turn on ACS so that it gets an IOMMU group of its "
                f"own, or keep it on the host driver (--host-gpus {','.join(addresses)})",
            )


def _iommu_membership(
    ctx: _Context, owner: dict[str, Gpu]
) -> tuple[dict[int, list[Gpu]], dict[int, dict[str, str]]]:
    """IOMMU group -> the GPUs with a function in it, and -> every member with a label."""
    gpus_in: dict[int, dict[str, Gpu]] = defaultdict(dict)
    members: dict[int, dict[str, str]] = defaultdict(dict)
    for gpu in ctx.index.gpus:
        if gpu.iommu_group is not None:
            gpus_in[gpu.iommu_group][gpu.address] = gpu
            members[gpu.iommu_group][gpu.address] = gpu.model or "GPU"
        for function in [*gpu.function_info, *gpu.iommu_group_peers]:
            if function.iommu_group is None:
                continue
            members[function.iommu_group].setdefault(function.address, _label(function, owner))
            if function.address in owner:
                gpu_there = owner[function.address]
                gpus_in[function.iommu_group][gpu_there.address] = gpu_there
    by_address = {group: sorted(gpus.values(), key=_address) for group, gpus in gpus_in.items()}
    return by_address, members


def _foreign_peers(ctx: _Context, owner: dict[str, Gpu]) -> dict[int, list[str]]:
    """IOMMU group -> its devices that are neither a GPU function nor a bridge."""
    foreign: dict[int, set[str]] = defaultdict(set)
    for gpu in ctx.index.gpus:
        for peer in gpu.iommu_group_peers:
            # Bridges stay with the host: vfio-pci never binds them (PVE skips them too).
            if peer.address not in owner and not peer.is_bridge and peer.iommu_group is not None:
                foreign[peer.iommu_group].add(peer.address)
    return {group: sorted(addresses) for group, addresses in foreign.items()}


def _label(function: PciFunction, owner: dict[str, Gpu]) -> str:
    if function.address in owner:
        return f"function of {owner[function.address].address}"
    kind = "bridge" if function.is_bridge else function.name or f"class {function.class_code}"
    return kind if function.driver is None else f"{kind}, driver {function.driver}"


def _check_claims(ctx: _Context, groups: list[PlanGroup]) -> None:
    """A GPU held by a guest other than the targets conflicts where the plan takes it away."""
    group_of = {address: group for group in groups for address in group.gpus}
    targets = ctx.targets()
    held: dict[tuple[GuestRef, str], list[DeviceClaim]] = defaultdict(list)
    for claim in device_claims(ctx.inventory.guest_configs, ctx.inventory.node_name):
        # The plan rewrites the targets' own device entries, so those never conflict.
        if claim.guest in targets:
            continue
        for gpu in _claimed_gpus(ctx.index, claim):
            held[claim.guest, gpu.address].append(claim)
    for (guest, address), claims in held.items():
        if guest.type == "lxc":
            _judge_container_claim(ctx, group_of[address], address, claims)
        else:
            _judge_vm_claim(ctx, group_of[address], address, claims)


def _claimed_gpus(index: _GpuIndex, claim: DeviceClaim) -> list[Gpu]:
    if claim.nvidia_minor == "*":
        return list(index.by_minor.values())
    if claim.nvidia_minor is not None:
        gpu = index.by_minor.get(claim.nvidia_minor)
        return [] if gpu is None else [gpu]
    try:
        return index.at(normalize_pci_address(claim.pci_address or ""))
    except ValueError:
        # PVE would refuse such a hostpci value; it claims nothing here.
        return []


def _judge_container_claim(
    ctx: _Context, group: PlanGroup, address: str, claims: list[DeviceClaim]
) -> None:
    vmid = claims[0].guest.vmid
    if group.role == "vfio":
        ctx.problem(
            "claimed",
            f"{address} goes to vfio-pci but CT {vmid} uses it: {_lines(claims)}",
            f"give CT {vmid} the host group (--lxc {vmid}: proxgpu rewrites its GPU entries), "
            f"or remove those entries yourself, or keep the GPU on the host driver "
            f"(--host-gpus {address})",
        )
    elif ctx.policy.lxc is not None:
        ctx.warnings.append(
            f"{address} is also used by CT {vmid} ({_lines(claims)}); CT {ctx.policy.lxc} "
            "will share it"
        )


def _judge_vm_claim(
    ctx: _Context, group: PlanGroup, address: str, claims: list[DeviceClaim]
) -> None:
    vmid = claims[0].guest.vmid
    if group.role == "host":
        ctx.problem(
            "claimed",
            f"{address} stays on the host driver but VM {vmid} passes it through: "
            f"{_lines(claims)}; starting VM {vmid} would take it from the host",
            f"remove that hostpci entry (or the GPU's map line in the PCI mapping), or move the "
            f"GPU to vfio-pci for that VM (--vm {vmid} with --vfio-gpus {address})",
        )
    elif group.guest is not None:
        ctx.problem(
            "claimed",
            f"{address} goes to VM {group.guest.vmid} but VM {vmid} already passes it through: "
            f"{_lines(claims)}",
            f"remove that hostpci entry from VM {vmid}, or give it the GPU (--vm {vmid}:N)",
        )
    else:
        ctx.warnings.append(
            f"{address} is already passed through to VM {vmid} ({_lines(claims)}); binding it to "
            "vfio-pci keeps that working"
        )


def _check_iommu_on(ctx: _Context, groups: list[PlanGroup]) -> bool:
    """Whether the plan must turn the IOMMU on; a problem when it may not."""
    vfio = [address for group in groups if group.role == "vfio" for address in group.gpus]
    if ctx.inventory.iommu_enabled or not vfio:
        return False
    if ctx.policy.enable_iommu:
        ctx.warnings.append(
            "the IOMMU is off: the plan turns it on on the kernel command line, which takes a "
            "reboot; IOMMU groups can only be checked after it, so plan again then"
        )
        return True
    ctx.problem(
        "iommu-off",
        f"the IOMMU is off, but {_count(len(vfio), 'GPU')} would go to vfio-pci",
        "let proxgpu plan the kernel command line change (--enable-iommu) and reboot, or keep "
        "every GPU on the host driver",
    )
    return False


# --- warnings and advice -----------------------------------------------------------------------


def _warn_about_shape(ctx: _Context, groups: list[PlanGroup]) -> None:
    host = sum(len(group.gpus) for group in groups if group.role == "host")
    vfio = sum(len(group.gpus) for group in groups if group.role == "vfio")
    if not vfio:
        ctx.warnings.append(f"nothing goes to vfio-pci: {_count(host, 'GPU')} on the host driver")
    elif not host:
        ctx.warnings.append(f"nothing stays on the host driver: {_count(vfio, 'GPU')} on vfio-pci")
    elif host != vfio:
        ctx.warnings.append(
            f"uneven split: {_count(host, 'GPU')} on the host driver, {_count(vfio, 'GPU')} "
            "on vfio-pci"
        )
    gpu_nodes = {gpu.numa_node for gpu in ctx.index.gpus}
    for node in ctx.inventory.numa_nodes:
        # A GPU of unknown node may sit on any node, so then no node is known to be empty.
        if None not in gpu_nodes and node.id not in gpu_nodes:
            ctx.warnings.append(
                f"NUMA node {node.id} (CPUs {node.cpus}) holds no GPUs; no group uses it"
            )
    for group in groups:
        _warn_about_locality(ctx, group)
        boot_vga = [a for a in group.gpus if group.role == "vfio" and ctx.index.get(a).boot_vga]
        for address in boot_vga:
            ctx.warnings.append(
                f"{address} is the boot VGA device: on vfio-pci the host loses its console "
                "there, so keep another way in (serial console, IPMI, SSH)"
            )


def _warn_about_locality(ctx: _Context, group: PlanGroup) -> None:
    nodes = {ctx.index.get(address).numa_node for address in group.gpus}
    known = sorted(node for node in nodes if node is not None)
    if len(known) > 1:
        ctx.warnings.append(
            f"{_group_name(group)} spans NUMA nodes {_join(known)}: its pinning covers them all, "
            "and work spread over them crosses the socket interconnect"
        )
    if None in nodes and len(ctx.inventory.numa_nodes) > 1:
        ctx.warnings.append(
            f"{_group_name(group)} holds GPUs of unknown NUMA node: its pinning covers every node"
        )


def _tensor_parallel(ctx: _Context, host: PlanGroup | None) -> list[TensorParallelAdvice]:
    if host is None:
        return []
    gpus = [ctx.index.get(address) for address in host.gpus]
    advice = []
    for size in TP_SIZES:
        sets = [",".join(map(str, chunk)) for chunk in _local_sets(gpus, size)]
        if sets:
            advice.append(TensorParallelAdvice(size=size, device_sets=sets))
    return advice


def _local_sets(gpus: list[Gpu], size: int) -> list[list[int]]:
    """Disjoint NUMA-local sets of ``size`` positions in ``gpus``, in PCI order per node."""
    by_node: dict[int, list[int]] = defaultdict(list)
    for position, gpu in enumerate(gpus):
        # An unknown node promises no locality, so those GPUs join no set.
        if gpu.numa_node is not None:
            by_node[gpu.numa_node].append(position)
    return [
        positions[start : start + size]
        for _, positions in sorted(by_node.items())
        for start in range(0, len(positions) - size + 1, size)
    ]


def _select_for_check(index: _GpuIndex, selector: str) -> list[Gpu]:
    text = selector.strip()
    if text.isdigit():
        if int(text) >= len(index.gpus):
            raise UsageError(
                f"GPU {text}: no such index; the host has {_count(len(index.gpus), 'GPU')} "
                f"(0-{len(index.gpus) - 1} in PCI bus order)"
            )
        return [index.gpus[int(text)]]
    try:
        found = index.at(normalize_pci_address(text))
    except ValueError:
        raise UsageError(f"{text!r}: neither a GPU index nor a PCI address") from None
    if not found:
        raise UsageError(f"{text}: no GPU at that address")
    return found


def _explain_set(index: _GpuIndex, placements: list[GpuPlacement], local: bool) -> str:
    ids = ",".join(str(placement.index) for placement in placements)
    if local and len(placements) == 1:
        return f"GPU {ids} is on NUMA node {placements[0].numa_node}."
    if local:
        return f"GPUs {ids} are all on NUMA node {placements[0].numa_node}: the set is NUMA-local."
    unknown = [placement for placement in placements if placement.numa_node is None]
    if unknown:
        return (
            f"cannot tell whether GPUs {ids} are NUMA-local: the NUMA node of "
            f"{_join(f'{p.index} ({p.address})' for p in unknown)} is unknown (sysfs numa_node -1)."
        )
    by_node: dict[int, list[str]] = defaultdict(list)
    for placement in placements:
        if placement.numa_node is not None:
            by_node[placement.numa_node].append(f"{placement.index} ({placement.address})")
    holds = "; ".join(
        f"node {node} holds {', '.join(gpus)}" for node, gpus in sorted(by_node.items())
    )
    sets = [",".join(map(str, chunk)) for chunk in _local_sets(index.gpus, len(placements))]
    alternatives = (
        f"NUMA-local sets of {len(placements)}: {'; '.join(sets)}."
        if sets
        else f"no NUMA node holds {len(placements)} GPUs."
    )
    return f"GPUs {ids} straddle NUMA nodes {_join(sorted(by_node))}: {holds}. {alternatives}"


# --- wording -----------------------------------------------------------------------------------


def _addresses(gpus: Iterable[Gpu]) -> list[str]:
    return [gpu.address for gpu in gpus]


def _address(gpu: Gpu) -> str:
    return gpu.address


def _join(items: Iterable[object]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    texts = [str(item) for item in items]
    return " and ".join(texts) if len(texts) < 3 else f"{', '.join(texts[:-1])} and {texts[-1]}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _with_roles(gpus: list[Gpu], roles: dict[str, Role]) -> str:
    return ", ".join(f"{gpu.address} ({roles[gpu.address]})" for gpu in sorted(gpus, key=_address))


def _lines(claims: list[DeviceClaim]) -> str:
    via = {f" via PCI mapping {c.mapping}" for c in claims if c.mapping}
    return f"{'; '.join(repr(c.line) for c in claims)} in {claims[0].path}{''.join(sorted(via))}"


def _group_name(group: PlanGroup) -> str:
    if group.guest is None:
        return f"the {group.role} group"
    kind = "CT" if group.guest.type == "lxc" else "VM"
    return f"the {group.role} group of {kind} {group.guest.vmid}"


def _node_order(node: int | None) -> tuple[bool, int]:
    """Sort key placing unknown nodes last."""
    return (node is None, node or 0)
