"""One planning run's state: its inputs, the GPUs indexed, and the problems found so far."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

from proxgpu.errors import PlanRefusedError
from proxgpu.inspection.inventory import Gpu, Inventory, VirtualFunction
from proxgpu.pci import is_bmc_display, normalize_pci_address
from proxgpu.planning import wording
from proxgpu.planning.model import Problem, ProblemCode, SplitPolicy
from proxgpu.pve.claims import DeviceClaim, GuestRef, device_claims


class GpuIndex:
    """The GPUs in PCI bus order, found by any address or minor a user or a config names (an
    SR-IOV virtual function's address finds the GPU it is a part of)."""

    def __init__(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        self.position = {gpu.address: i for i, gpu in enumerate(gpus)}
        self._by_address = {gpu.address: gpu for gpu in gpus}
        self._by_function: dict[str, list[Gpu]] = defaultdict(list)
        self._by_slot: dict[str, list[Gpu]] = defaultdict(list)
        self._virtual: dict[str, VirtualFunction] = {}
        for gpu in gpus:
            self._by_slot[gpu.slot].append(gpu)
            for function in gpu.functions:
                self._by_function[function].append(gpu)
            for vf in gpu.virtual_functions:
                self._by_function[vf.address].append(gpu)
                self._virtual[vf.address] = vf
        self.by_minor = {gpu.nvidia_minor: gpu for gpu in gpus if gpu.nvidia_minor is not None}

    def virtual_function(self, text: str | None) -> VirtualFunction | None:
        """The SR-IOV virtual function at an address as written (``81:01.2``), if it is one."""
        try:
            return self._virtual.get(normalize_pci_address(text or ""))
        except ValueError:
            return None

    def get(self, address: str) -> Gpu:
        """The GPU whose own address this is."""
        return self._by_address[address]

    def at(self, address: str) -> list[Gpu]:
        """The GPU at a normalised address; else every GPU having that function or slot."""
        if address in self._by_address:
            return [self._by_address[address]]
        return self._by_function.get(address) or self._by_slot.get(address, [])


@dataclass
class Context:
    """One planning run: its inputs, and the problems and warnings found so far."""

    inventory: Inventory
    policy: SplitPolicy
    index: GpuIndex = field(init=False)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        gpus = sorted(self.inventory.gpus, key=wording.address)
        # A server's BMC display (ASPEED, Matrox G200) is its console, not a GPU: only split it
        # when asked by address.
        left_out = [gpu for gpu in gpus if is_bmc_display(gpu.vendor_id, gpu.device_id)]
        left_out = [gpu for gpu in left_out if not self._named(gpu)]
        self.index = GpuIndex([gpu for gpu in gpus if gpu not in left_out])
        self.warnings += [
            f"{gpu.address} ({gpu.model or 'display controller'}) is the BMC's display "
            "controller, not a GPU: left out of the split (name it in --host-gpus or --vfio-gpus "
            "to split it too)"
            for gpu in left_out
        ]

    def _named(self, gpu: Gpu) -> bool:
        """Whether ``--host-gpus``/``--vfio-gpus`` name any function or the slot of ``gpu``."""
        named = set()
        for text in [*self.policy.host_gpus, *self.policy.vfio_gpus]:
            try:
                named.add(normalize_pci_address(text))
            except ValueError:
                continue  # assign_roles reports it
        return not named.isdisjoint({gpu.address, gpu.slot, *gpu.functions})

    @cached_property
    def claims(self) -> list[DeviceClaim]:
        """Every device claim in the host's guest configs (see
        :func:`~proxgpu.pve.claims.device_claims`), parsed once for the whole run."""
        return device_claims(self.inventory.guest_configs, self.inventory.node_name)

    def problem(self, code: ProblemCode, what: str, fix: str) -> None:
        self.problems.append(Problem(code=code, what=what, fix=fix))

    def raise_problems(self) -> None:
        if self.problems:
            raise PlanRefusedError(self.inventory.source, self.problems)

    def targets(self) -> set[GuestRef]:
        return set(self.policy.guests)
