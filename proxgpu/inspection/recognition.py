"""Which PCI functions are GPUs: by what they are (their class, their vendor, the driver that
claims them), narrowed by ``--gpu-class``/``--gpu-vendor`` (:class:`GpuFilter`), and what was
passed over and why (:func:`passed_over`), so that a plan that finds no GPU can name them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxgpu.inspection.inventory import Gpu, PassedOver, PassedOverReason, PciFunction
from proxgpu.pci import is_accelerator, is_gpu_accelerator


@dataclass(frozen=True)
class GpuFilter:
    """Which PCI functions count as GPUs.

    ``classes`` are prefixes of the six-digit class code without ``0x``: the default takes every
    display controller (``03``: VGA ``0300``, 3D ``0302``, other ``0380``) of any vendor, and the
    processing accelerators (``12``) that are GPUs, AMD Instinct (see
    :func:`~proxgpu.pci.is_gpu_accelerator`). ``vendors`` (four hex digits) narrows it further
    when given, and is the only way to take a processing accelerator that is not a GPU (an FPGA,
    a Gaudi): naming class ``12`` alone never puts one in the split.

    >>> mi300x = PciFunction(address="0000:05:00.0", class_code="0x120000", vendor_id="1002",
    ...                      device_id="74a1", driver="amdgpu")
    >>> from dataclasses import replace
    >>> fpga = replace(mi300x, vendor_id="10ee", device_id="903f", driver=None)
    >>> GpuFilter().matches(mi300x), GpuFilter(classes=("12",)).matches(fpga)
    (True, False)
    >>> GpuFilter(vendors=("10ee",)).why_not(fpga), GpuFilter(vendors=("10de",)).why_not(mi300x)
    (None, 'filtered')
    """

    classes: tuple[str, ...] = ("03", "12")
    vendors: tuple[str, ...] | None = None

    @classmethod
    def of(cls, classes: Iterable[str] | None, vendors: Iterable[str] | None) -> GpuFilter:
        """The filter ``--gpu-class`` and ``--gpu-vendor`` (and the Ansible modules' options of
        those names) ask for: hex in any case, with or without ``0x``; none given, the default.

        >>> GpuFilter.of(None, ["0x10DE"])
        GpuFilter(classes=('03', '12'), vendors=('10de',))
        """
        chosen = tuple(c.lower().removeprefix("0x") for c in classes or cls.classes)
        only = tuple(v.lower().removeprefix("0x") for v in vendors or ())
        return cls(classes=chosen, vendors=only or None)

    def matches(self, function: PciFunction) -> bool:
        """Whether ``function`` is a GPU."""
        return self.why_not(function) is None

    def why_not(self, function: PciFunction) -> PassedOverReason | None:
        """Why ``function`` is not a GPU (see :class:`~proxgpu.inspection.inventory.PassedOver`),
        or ``None`` when it is one."""
        named = self.vendors is not None and function.vendor_id in self.vendors
        if (
            is_accelerator(function.class_code)
            and not named
            and not is_gpu_accelerator(function.vendor_id, function.class_code, function.driver)
        ):
            return "accelerator"
        if not self.takes_class(function.class_code) or (self.vendors is not None and not named):
            return "filtered"
        return None

    def takes_class(self, class_code: str) -> bool:
        """Whether ``class_code`` begins with one of ``classes``."""
        return class_code.removeprefix("0x").startswith(self.classes)


def passed_over(
    functions: dict[str, PciFunction],
    gpus: list[Gpu],
    parents: dict[str, str],
    gpu_filter: GpuFilter,
) -> list[PassedOver]:
    """The display controllers and processing accelerators (and functions of the classes the
    filter names) that are no GPU's, each with why. An SR-IOV VF goes with its physical
    function, which is named instead."""
    taken = {address for gpu in gpus for address in gpu.functions}
    candidates = [
        f
        for f in functions.values()
        if f.address not in taken
        and f.address not in parents
        and (f.class_code.startswith(("0x03", "0x12")) or gpu_filter.takes_class(f.class_code))
    ]
    return [
        PassedOver(function=f, reason=reason)
        for f in candidates
        if (reason := gpu_filter.why_not(f)) is not None
    ]


def accelerators_left_out(
    passed_over: list[PassedOver], gpus: list[Gpu], gpu_filter: GpuFilter
) -> list[str]:
    """Processing accelerators that are not GPUs (an FPGA, Habana's Gaudi): the split does not
    move them, so say how to include one: name its vendor beside those of the GPUs taken (a
    vendor filter takes no other vendor's), with class 12 when the filter leaves it out. A class
    alone never takes one: ``--gpu-class 12`` would put every FPGA of the host in the split."""
    vendors = gpu_filter.vendors or [gpu.vendor_id for gpu in gpus if not gpu.bmc_display]
    warnings = []
    for f in (p.function for p in passed_over if p.reason == "accelerator"):
        flags = [f"--gpu-vendor {vendor}" for vendor in sorted({*vendors, f.vendor_id})]
        if not gpu_filter.takes_class(f.class_code):
            flags += [f"--gpu-class {prefix}" for prefix in (*gpu_filter.classes, "12")]
        warnings.append(
            f"{f.address} ({f.name or f'{f.vendor_id}:{f.device_id}'}) is a processing "
            "accelerator (PCI class 0x12) but not a GPU (only AMD's, on amdgpu, are): left out "
            f"of the split; add {' '.join(flags)} to split it too"
        )
    return warnings
