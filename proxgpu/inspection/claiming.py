"""Which kernel modules could take a PCI function at boot, the modules vfio-pci must load before:
the plan's softdep lines and ``inspect``'s list of what decides the boot both ask here.

They are, for every installed kernel whose ``modules.alias`` inspection read: the modules kmod
returns for the function's modalias (:func:`~proxgpu.kmod.lookup_modalias`: what udev loads for
it), and every module whose own alias matches it even when a modprobe.d ``alias`` line overrides
them (loaded any other way, by name or from the initramfs, such a module probes the function
too); and the module of the driver it has now. A module built into a kernel is told apart: no
modprobe.d line loads anything before it. Where the modalias or ``modules.alias`` was not read
(a snapshot taken before proxgpu read them), proxgpu's table of drivers by vendor and class
(:func:`~proxgpu.pci.host_modules`) stands in, and says so.

>>> from proxgpu.inspection.inventory import KernelModules, ModuleAlias
>>> fn = PciFunction(address="0000:81:00.0", vendor_id="10de", device_id="2bb1",
...                  class_code="0x030000", driver="nvidia",
...                  modalias="pci:v000010DEd00002BB1sv000010DEsd0000204Bbc03sc00i00")
>>> aliases = [ModuleAlias(alias="pci:v000010DEd*sv*sd*bc03sc00i*", module="nova_core")]
>>> host = Inventory(source="s", hostname="h", driver_modules={"nvidia": "nvidia"},
...                  kernel_modules={"6.17.2-1-pve": KernelModules(aliases=aliases)})
>>> claimants(host, fn).modules
('nova_core', 'nvidia')
"""

from __future__ import annotations

from dataclasses import dataclass

from proxgpu.inspection.inventory import Inventory, KernelModules, PciFunction
from proxgpu.kmod import (
    MODULES_ALIAS,
    MODULES_BUILTIN_MODINFO,
    KmodConfig,
    lookup_modalias,
    matching_aliases,
)
from proxgpu.pci import VFIO_DRIVER, host_modules


@dataclass(frozen=True)
class BuiltIn:
    """A module built into ``kernel`` that would take a function; ``kernel`` is ``None`` for the
    driver that has it now, bound without a module."""

    module: str
    kernel: str | None = None


@dataclass(frozen=True)
class Claimants:
    """The modules that could take a function: ``modules`` kmod can load (vfio-pci must load
    before each), ``built_in`` those built into a kernel, and ``guessed`` when proxgpu's table
    stood in for the modalias lookup."""

    modules: tuple[str, ...] = ()
    built_in: tuple[BuiltIn, ...] = ()
    guessed: bool = False


def claimants(inventory: Inventory, function: PciFunction) -> Claimants:
    """The modules that could take ``function`` at boot on ``inventory``'s host (see above)."""
    modules: set[str] = set()
    built_in: set[BuiltIn] = set()
    guessed = function.modalias is None or not inventory.kernel_modules
    if function.modalias is not None and inventory.kernel_modules:
        config = KmodConfig.of(inventory.host_files, inventory.kernel)
        for kernel, table in sorted(inventory.kernel_modules.items()):
            loadable, built = _by_alias(function.modalias, config, table)
            modules |= loadable
            built_in |= {BuiltIn(module, kernel) for module in built}
    else:
        modules.update(host_modules(function.vendor_id, function.class_code))
    if function.driver and function.driver != VFIO_DRIVER:
        module = inventory.driver_module(function.driver)
        if module is None:
            built_in.add(BuiltIn(function.driver))
        else:
            modules.add(module)
    order = sorted(built_in, key=lambda b: (b.kernel or "", b.module))
    return Claimants(tuple(sorted(modules)), tuple(order), guessed)


def _by_alias(modalias: str, config: KmodConfig, table: KernelModules) -> tuple[set[str], set[str]]:
    """The modules one kernel's aliases name for ``modalias``: those it can load, and those
    built into it."""
    own = [(alias.alias, alias.module) for alias in table.aliases]
    builtin = [(alias.alias, alias.module) for alias in table.builtin_aliases or ()]
    found = [
        *lookup_modalias(modalias, config, own, builtin),
        *matching_aliases(modalias, own, MODULES_ALIAS),
        *matching_aliases(modalias, builtin, MODULES_BUILTIN_MODINFO, builtin=True),
    ]
    # A modprobe.d alias may name a built-in module: the kernel's own list says which are.
    known_builtin = {module for _, module in builtin}
    built = {r.module for r in found if r.builtin or r.module in known_builtin}
    return {r.module for r in found} - built, built
