"""Where OVMF puts a VM's 64-bit PCI BARs, and whether its GPUs fit there.

Modelled on edk2 as Proxmox VE ships it in pve-edk2-firmware: 3.20230228 (edk2-stable202302 with
Proxmox's patch capping phys-bits at 46; VE 8.0), 4.2023.08 (stable202308; 8.1 to 8.3), 4.2025.02
(stable202502; 8.4 and 9.0) and 4.2025.05 (stable202505; 9.1 on). Proxmox builds OvmfPkgX64
without 5-level paging. The rules, all in OvmfPkg/Library/PlatformInitLib/MemDetect.c:

* ``PlatformAddressWidthFromCpuid``: OVMF trusts the CPU's physical address bits when they are 41
  or more, or 36 or 39 on an Intel CPU, or 40 on an AMD one (QEMU's default of 40 is not trusted
  on Intel). Trusted bits are capped at 46 (4-level paging), and at 40 without 1 GiB pages
  (``pdpe1gb``). edk2 202408 and later also read QEMU's GuestPhysBits: a VM's
  ``guest-phys-bits`` caps the bits here too (that it also makes them trusted is not modelled,
  so the model errs towards warning). Whether a named QEMU model has 1 GiB pages is
  :mod:`proxgpu.planning.cpumodels`'s table (EPYC-Rome has them, kvm64 and qemu64 do not); the
  VM's ``flags=+pdpe1gb`` or ``-pdpe1gb`` overrides it, and a host without them gives none
  (KVM passes no flag the host lacks). A model the table does not know counts as without them:
  the warning it may cost advises ``+pdpe1gb``, which is right either way, where a missed one
  leaves GPUs without their BARs.
* ``PlatformDynamicMmioWindow``: with trusted bits W the 64-bit PCI window is the top eighth of
  the address space, 2^(W-3) bytes ending at 2^W, unless the classic window is as large or the
  dynamic one would start below the classic window's base. The classic window, used whenever
  the bits are not trusted, is 32 GiB (``PcdPciMmio64Size`` in OvmfPkgX64.dsc) above the RAM
  and memory hotplug area (``PlatformGetFirstNonAddress``: aligned to 1 GiB, then to its size).
  A conflict with a reserved range (AMD's HyperTransport hole) moves the window, never shrinks
  it; an ``opt/ovmf/X-PciMmio64Mb`` override in ``args:`` is not modelled.
* MdeModulePkg/Bus/Pci/PciBusDxe (``CalculateResourceAperture``, ``InsertResourceNode``): a
  bridge's 64-bit prefetchable window holds its devices' 64-bit prefetchable BARs, sorted
  largest first (so power-of-two BARs pack without gaps), its length rounded up to 1 MiB and
  aligned to its largest BAR. The root bridge places its bridges' windows largest alignment
  first, each at its own alignment: two root ports of 128 GiB + 32 MiB take 384 GiB + 32 MiB,
  since the second starts at 256 GiB. That layout must fit in the window.
* OvmfPkg/PciHotPlugInitDxe (``GetResourcePadding``): every hotplug bridge reserves at least
  2^ceil(log2(window / 256)) of 64-bit prefetchable space when the window is over 32 GiB.
  Proxmox's q35 VMs have four hotplug root ports (ich9-pcie-port-1 to 4, pve-q35-4.0.cfg), one
  more for each ``hostpciN`` with N >= 4 (``print_pcie_root_port``), and four SHPC PCI bridges
  (pci.0 to pci.3) behind the DMI bridge; each ``hostpciN,pcie=1`` sits on root port N+1.

The RAM below the window follows QEMU's q35 layout: 2 GiB below 4 GiB once the VM has 2.75 GiB,
the rest above; with memory hotplug, qemu-server's ``maxmem`` (``get_max_mem``) and a 1 GiB slot
alignment for each of its 255 slots follow; an AMD vCPU's RAM above 4 GiB moves to 1 TiB when it
would reach the HyperTransport hole at 1012 GiB.

>>> width = address_width(GuestCpu("kvm64", "kvm64", 40, "GenuineIntel", False, None))
>>> width is None, window_size(width, 258 * GIB) >> 30
(True, 32)
>>> window_size(43, 258 * GIB) >> 40, needed_bytes({0: [128 * GIB, 32 * MIB]}, TIB) >> 30
(1, 160)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proxgpu.planning.guestcpu import HOST_MODELS, GuestCpu, HostCpu, cpu_options
from proxgpu.pve.config import GuestConfig
from proxgpu.pve.resources import hotplugs_memory, memory_mib

MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
#: The classic 64-bit window of OvmfPkgX64.dsc's ``PcdPciMmio64Size``.
CLASSIC_WINDOW = 32 * GIB
#: ``PlatformAddressWidthFromCpuid``'s cap with 4-level paging.
MAX_WIDTH = 46
#: Bits that need 1 GiB pages to be used above.
NO_1G_WIDTH = 40
#: Root ports every Proxmox q35 VM has, and its SHPC PCI bridges (pve-q35-4.0.cfg).
FIXED_ROOT_PORTS = 4
PCI_BRIDGES = 4
#: A bridge window's own granularity before its children raise its alignment.
_BRIDGE_GRANULE = MIB
#: qemu-server's memory hotplug: 255 DIMM slots, 1 GiB static memory, at most 4 TiB.
_SLOTS, _STATIC, _MAX_HOTPLUG = 255, GIB, 4 * TIB
#: QEMU's q35: below 4 GiB it keeps 2 GiB of RAM once the VM has this much.
_LOWMEM_SPLIT = 0xB000_0000
#: AMD's HyperTransport hole starts here; QEMU then puts the RAM above 4 GiB at 1 TiB.
_AMD_HT_START = 1012 * GIB


def address_width(cpu: GuestCpu) -> int | None:
    """The address bits OVMF uses, or ``None`` when it does not trust the CPU's.

    >>> address_width(GuestCpu("host", "host", 52, "AuthenticAMD", True, None))
    46
    >>> address_width(GuestCpu("host", "host", 48, "GenuineIntel", False, None))
    40
    """
    bits = min(cpu.phys_bits, cpu.guest_phys_bits or cpu.phys_bits)
    trusted = (
        bits >= 41
        or (cpu.vendor == "GenuineIntel" and bits in (36, 39))
        or (cpu.vendor == "AuthenticAMD" and bits == 40)
    )
    if not trusted:
        return None
    bits = min(bits, MAX_WIDTH)
    return bits if cpu.pdpe1gb else min(bits, NO_1G_WIDTH)


def advisable_bits(cpu: GuestCpu, host: HostCpu) -> range:
    """The ``phys-bits`` values worth advising, fewest first: from 41 (OVMF trusts them on any
    vendor, with 1 GiB pages) to 46 (its cap), never below the VM's own bits (an advice must
    not take address space from the guest) nor above the host's. A VM already above 46 gets
    its own value alone, which with 1 GiB pages OVMF caps at 46.

    >>> from dataclasses import replace
    >>> host = HostCpu("AuthenticAMD", 52, True)
    >>> kvm64 = GuestCpu("kvm64", "kvm64", 40, "AuthenticAMD", False, None)
    >>> list(advisable_bits(kvm64, host)), list(advisable_bits(replace(kvm64, phys_bits=44), host))
    ([41, 42, 43, 44, 45, 46], [44, 45, 46])
    >>> list(advisable_bits(replace(kvm64, phys_bits=48), host))
    [48]
    """
    low = max(NO_1G_WIDTH + 1, cpu.phys_bits)
    high = max(low, MAX_WIDTH)
    if host.phys_bits:
        high = min(high, host.phys_bits)
    return range(low, high + 1)


def first_non_address(config: GuestConfig, cpu: GuestCpu, host: HostCpu) -> int:
    """The end of the VM's RAM and memory hotplug area, where the classic window starts.

    >>> cpu = GuestCpu("kvm64", "kvm64", 40, "GenuineIntel", False, None)
    >>> host = HostCpu("GenuineIntel", 46, True)
    >>> first_non_address(GuestConfig.parse("memory: 65536"), cpu, host) >> 30
    66
    """
    memory = (memory_mib(config) or 0) * MIB
    if hotplugs_memory(config):
        # Only the static 1 GiB is RAM at boot; the hotplug area follows it above 4 GiB.
        end = 4 * GIB + _max_hotplug_memory(config, host) - _STATIC + _SLOTS * GIB
    else:
        end = 4 * GIB + max(0, memory - 2 * GIB) if memory >= _LOWMEM_SPLIT else 4 * GIB
    if cpu.vendor == "AuthenticAMD" and end + CLASSIC_WINDOW > _AMD_HT_START:
        end += TIB - 4 * GIB
    return end


def _max_hotplug_memory(config: GuestConfig, host: HostCpu) -> int:
    """qemu-server's ``get_max_mem``: half the address space of the phys-bits it reads (its
    fallback: the host's, or at most 40 for a named model), rounded down to an even number of
    bits, and at most 4 TiB."""
    props = cpu_options(config) or {}
    host_bits = host.phys_bits or 36
    value = props.get("phys-bits")
    if value == "host":
        bits = host_bits
    elif value is not None and value.isdigit():
        bits = int(value)
    else:
        bits = host_bits if props.get("cputype") in HOST_MODELS else min(host_bits, 40)
    return min(1 << ((bits & ~1) - 1), _MAX_HOTPLUG)


def window_size(width: int | None, first_non: int) -> int:
    """The 64-bit PCI window's size for trusted ``width`` bits (``None``: not trusted).

    >>> window_size(None, 66 * GIB) >> 30, window_size(46, 66 * GIB) >> 40
    (32, 8)
    """
    if width is None:
        return CLASSIC_WINDOW
    classic_base = _align(_align(first_non, GIB), CLASSIC_WINDOW)
    dynamic = 1 << (width - 3)
    if dynamic > CLASSIC_WINDOW and classic_base + dynamic < 1 << width:
        return dynamic
    return CLASSIC_WINDOW


def hotplug_reservation(window: int) -> int:
    """What each hotplug bridge reserves of a window this size (PciHotPlugInitDxe).

    >>> hotplug_reservation(8 * TIB) >> 30, hotplug_reservation(CLASSIC_WINDOW)
    (32, 0)
    """
    return 1 << ((window >> 8) - 1).bit_length() if window > CLASSIC_WINDOW else 0


@dataclass
class _Node:
    length: int
    alignment: int

    def rest(self) -> int:
        return self.length & (self.alignment - 1)


def needed_bytes(ports: Mapping[int, list[int]], window: int) -> int:
    """The 64-bit space the root bridge's layout takes: ``ports`` maps each ``hostpciN`` index
    on a root port to its devices' 64-bit prefetchable BAR sizes (``[]``: another device, whose
    BARs are not known), with every other bridge reserving what :func:`hotplug_reservation`
    says.

    >>> needed_bytes({0: [128 * GIB, 32 * MIB]}, CLASSIC_WINDOW) >> 20
    131104
    """
    pad = hotplug_reservation(window)
    indices = sorted({*range(FIXED_ROOT_PORTS), *ports}, key=lambda i: (i < FIXED_ROOT_PORTS, i))
    # PciBusDxe meets the extra root ports (slot 0x10) before the fixed ones (0x1c), then the
    # DMI bridge (0x1e) holding the PCI bridges.
    nodes = [_port(ports.get(index, []), pad) for index in indices]
    nodes.append(_Node(PCI_BRIDGES * pad, max(pad, 1)))
    placed: list[_Node] = []
    for node in nodes:
        if node.length:
            _insert(placed, node)
    end = 0
    for node in placed:
        end = _align(end, node.alignment) + node.length
    return end


def _port(bars: list[int], pad: int) -> _Node:
    """A root port's window: its BARs largest first, at least the hotplug reservation."""
    length = max(_align(sum(bars), _BRIDGE_GRANULE) if bars else 0, pad)
    return _Node(length, max([*bars, pad, 1]))


def _insert(placed: list[_Node], node: _Node) -> None:
    """``InsertResourceNode``: largest alignment first; of equal ones, a node whose length is a
    multiple of it, or with the larger remainder, first."""
    position = 0
    for other in placed:
        if node.alignment > other.alignment:
            break
        if node.alignment == other.alignment and (node.rest() == 0 or node.rest() >= other.rest()):
            break
        position += 1
    placed.insert(position, node)


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class Fit:
    """A VM's window against its GPUs' needs; ``width`` is ``None`` when OVMF does not trust
    the CPU's bits."""

    width: int | None
    window: int
    needed: int

    @property
    def fits(self) -> bool:
        """Whether the layout fits the window.

        >>> Fit(width=None, window=CLASSIC_WINDOW, needed=128 * GIB).fits
        False
        """
        return self.needed <= self.window


def fit(config: GuestConfig, cpu: GuestCpu, host: HostCpu, ports: Mapping[int, list[int]]) -> Fit:
    """How the VM's GPUs on root ports ``ports`` fit the window its CPU gets.

    >>> config = GuestConfig.parse("memory: 65536")
    >>> host = HostCpu("AuthenticAMD", 48, True)
    >>> one_gpu = {0: [128 * GIB, 32 * MIB]}
    >>> small = fit(config, GuestCpu("kvm64", "kvm64", 40, "AuthenticAMD", False, None), host,
    ...             one_gpu)
    >>> small.width, small.window >> 30, small.needed >> 30, small.fits
    (40, 128, 132, False)
    >>> fit(config, GuestCpu("host", "host", 48, "AuthenticAMD", True, None), host, one_gpu).fits
    True
    """
    width = address_width(cpu)
    window = window_size(width, first_non_address(config, cpu, host))
    return Fit(width, window, needed_bytes(ports, window))
