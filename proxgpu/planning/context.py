"""One planning run's state: its inputs, the GPUs indexed, and the problems found so far."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from proxgpu.errors import PlanRefusedError
from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.planning import wording
from proxgpu.planning.model import Problem, ProblemCode, SplitPolicy
from proxgpu.pve.claims import GuestRef


class GpuIndex:
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
class Context:
    """One planning run: its inputs, and the problems and warnings found so far."""

    inventory: Inventory
    policy: SplitPolicy
    index: GpuIndex = field(init=False)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.index = GpuIndex(sorted(self.inventory.gpus, key=wording.address))

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
