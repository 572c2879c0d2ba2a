"""One planning run's state: its inputs, the GPUs indexed, and the problems found so far."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

from proxgpu.errors import PlanRefusedError
from proxgpu.inspection.inventory import Gpu, Inventory, PassedOver, VirtualFunction
from proxgpu.pci import is_bmc_display, normalize_pci_address
from proxgpu.planning import wording
from proxgpu.planning.model import Problem, ProblemCode
from proxgpu.planning.policy import SplitPolicy
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
    #: The BMCs' display controllers that no --host-gpus or --vfio-gpus names: left out.
    bmc_displays: list[Gpu] = field(init=False)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: What the plan does or assumes, asking nothing (see :class:`~proxgpu.planning.Plan`).
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        gpus = sorted(self.inventory.gpus, key=wording.address)
        # A server's BMC display (ASPEED, Matrox G200, ATI ES1000) is its console, not a GPU:
        # only split it when asked by address.
        displays = [gpu for gpu in gpus if is_bmc_display(gpu.vendor_id, gpu.device_id)]
        self.bmc_displays = [gpu for gpu in displays if not self._named(gpu)]
        self.index = GpuIndex([gpu for gpu in gpus if gpu not in self.bmc_displays])
        self.notes += [
            f"{gpu.address} ({gpu.model or 'display controller'}) is the BMC's display "
            "controller, not a GPU: left out of the split (name it in --host-gpus or --vfio-gpus "
            "to split it too)"
            for gpu in self.bmc_displays
        ]

    def check_gpus_found(self) -> None:
        """Refuse a host with no GPU to split, naming each display controller and processing
        accelerator inspection saw and did not take, why not, and what would take it."""
        if self.index.gpus:
            return
        passed = self.inventory.passed_over
        seen = [_bmc_display(gpu) for gpu in self.bmc_displays] + [_passed(p) for p in passed]
        if not seen:
            self.problem(
                "no-gpus",
                "the inventory holds no GPUs: inspection saw no display controller or accelerator",
                "check that the host sees its GPUs (lspci -nnk shows each device's class and "
                "driver)",
            )
            return
        fixes = []
        if self.bmc_displays:
            fixes.append(
                "name a BMC's display in --host-gpus or --vfio-gpus to split it all the same"
            )
        accelerators = sorted({p.function.vendor_id for p in passed if p.reason == "accelerator"})
        if accelerators:
            flags = " ".join(f"--gpu-vendor {vendor}" for vendor in accelerators)
            fixes.append(f"add {flags} to split those accelerators too")
        if any(p.reason == "filtered" for p in passed):
            fixes.append("inspect without --gpu-class/--gpu-vendor, or with ones that take them")
        fixes.append("if the host has other GPUs, check that it sees them (lspci -nnk)")
        self.problem(
            "no-gpus",
            f"the inventory holds no GPUs; inspection saw {wording.count(len(seen), 'device')} "
            f"it did not take: {'; '.join(seen)}",
            "; ".join(fixes),
        )

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


def _device(address: str, ids: str, class_code: str, driver: str | None, name: str | None) -> str:
    """A device as a refusal names it: its address, name, IDs, class and driver.

    >>> _device("0000:41:00.0", "10ee:903f", "0x120000", None, None)
    '0000:41:00.0 (10ee:903f, class 0x120000, no driver)'
    """
    held = f"on {driver}" if driver else "no driver"
    return f"{address} ({f'{name}, ' if name else ''}{ids}, class {class_code}, {held})"


def _bmc_display(gpu: Gpu) -> str:
    ids = f"{gpu.vendor_id}:{gpu.device_id}"
    device = _device(gpu.address, ids, gpu.class_code, gpu.driver, gpu.model)
    return f"{device}: the BMC's display controller, split only when named"


def _passed(passed: PassedOver) -> str:
    fn = passed.function
    device = _device(
        fn.address, f"{fn.vendor_id}:{fn.device_id}", fn.class_code, fn.driver, fn.name
    )
    if passed.reason == "accelerator":
        return f"{device}: a processing accelerator, not a GPU (only AMD's, on amdgpu, are)"
    return f"{device}: left out by --gpu-class/--gpu-vendor"
