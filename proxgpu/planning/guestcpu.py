"""What a VM's virtual CPU tells its firmware: physical address bits, vendor, 1 GiB pages.

qemu-server turns ``cpu:`` into QEMU's ``-cpu`` (PVE/QemuServer/CPUConfig.pm,
``get_cpu_options``): a VM without ``cpu:`` runs ``get_default_cpu_type``'s ``kvm64``; the
built-in ``x86-64-v2``, ``-v2-AES``, ``-v3`` and ``-v4`` run QEMU's ``qemu64`` with flags added
(``$builtin_models_by_arch``), none of them ``pdpe1gb`` (which QEMU's server models such as the
EPYC family carry: :mod:`~proxgpu.planning.cpumodels`); ``phys-bits=N`` becomes QEMU's
``phys-bits=N`` and ``phys-bits=host`` its ``host-phys-bits=true``. QEMU reports 40 bits for a
named model unless told otherwise, and the host's own for ``host`` and ``max`` under KVM (which
turn ``host-phys-bits`` on); under KVM every model that does not force a vendor shows the
host's (qemu-server's ``$cpu_models_by_arch`` gives ``default`` for those).

>>> amd = HostCpu(vendor="AuthenticAMD", phys_bits=52, pdpe1gb=True)
>>> guest_cpu(GuestConfig.parse("bios: ovmf\\n"), amd)
GuestCpu(cputype='kvm64', reported='kvm64', phys_bits=40, vendor='AuthenticAMD', pdpe1gb=False, \
guest_phys_bits=None)
>>> guest_cpu(GuestConfig.parse("cpu: x86-64-v2-AES,flags=+pdpe1gb,phys-bits=44\\n"), amd).reported
'qemu64'
>>> guest_cpu(GuestConfig.parse("cpu: host\\n"), amd).phys_bits
52
"""

from __future__ import annotations

from dataclasses import dataclass

from proxgpu.inspection.inventory import Inventory
from proxgpu.planning.cpumodels import has_1g_pages
from proxgpu.pve.config import GuestConfig, parse_property_string

#: qemu-server's CPU type when ``cpu:`` is absent, with KVM (``get_default_cpu_type``).
DEFAULT_CPUTYPE = "kvm64"
#: The physical address bits QEMU reports for a named CPU model without ``phys-bits``.
QEMU_DEFAULT_PHYS_BITS = 40
#: qemu-server's built-in models: QEMU's qemu64 with x86-64 micro-architecture level flags.
X86_64_LEVELS = ("x86-64-v2", "x86-64-v2-AES", "x86-64-v3", "x86-64-v4")
#: The models that take the host's physical address bits (``host-phys-bits``) and flags.
HOST_MODELS = ("host", "max")
#: QEMU models that report AMD whatever the host (qemu-server forces their vendor); the other
#: named models report Intel, and the generic ones (kvm64, qemu64, host, max) the host's vendor.
_AMD_MODELS = ("EPYC", "Opteron", "athlon", "phenom")
_GENERIC_MODELS = ("kvm64", "kvm32", "qemu64", "qemu32", *HOST_MODELS)


@dataclass(frozen=True)
class HostCpu:
    """The host CPU facts that reach a VM: vendor, physical address bits, 1 GiB pages."""

    vendor: str | None
    phys_bits: int | None
    pdpe1gb: bool | None

    @classmethod
    def of(cls, inventory: Inventory) -> HostCpu:
        return cls(inventory.cpu_vendor, inventory.cpu_phys_bits, inventory.cpu_pdpe1gb)


@dataclass(frozen=True)
class GuestCpu:
    """The CPU a VM's firmware sees. ``reported`` is the QEMU model qemu-server runs
    (``qemu64`` for ``x86-64-v2-AES``), the one its "OVMF firmware might limit CPU
    'phys-bits' to 40" warning looks at; ``vendor`` is ``None`` when unknown."""

    cputype: str
    reported: str
    phys_bits: int
    vendor: str | None
    pdpe1gb: bool
    guest_phys_bits: int | None


def cpu_options(config: GuestConfig) -> dict[str, str] | None:
    """The VM's ``cpu:`` as options, ``cputype`` filled in; ``None`` when Proxmox would refuse
    the value.

    >>> cpu_options(GuestConfig.parse("cpu: host,flags=+aes\\n"))
    {'cputype': 'host', 'flags': '+aes'}
    """
    try:
        props = parse_property_string(config.get("cpu") or "", "cputype")
    except ValueError:
        return None
    props.setdefault("cputype", DEFAULT_CPUTYPE)
    return props


def flag_set(props: dict[str, str]) -> dict[str, str]:
    """The ``flags`` option as flag name -> ``+`` or ``-``.

    >>> flag_set({"flags": "+aes;-pdpe1gb"})
    {'aes': '+', 'pdpe1gb': '-'}
    """
    flags = [flag for flag in props.get("flags", "").split(";") if flag]
    return {flag[1:]: flag[0] for flag in flags if flag[0] in "+-"}


def guest_cpu(config: GuestConfig, host: HostCpu) -> GuestCpu | None:
    """The VM's CPU as its firmware sees it; ``None`` when proxgpu cannot tell: a ``custom-``
    model (defined in the cluster's cpu-models.conf, which inspection does not read), a value
    Proxmox refuses, or host bits that the capture did not record."""
    props = cpu_options(config)
    if props is None or props["cputype"].startswith("custom-"):
        return None
    cputype = props["cputype"]
    reported = "qemu64" if cputype in X86_64_LEVELS else cputype
    bits = _phys_bits(props, reported, host)
    if bits is None:
        return None
    guest_bits = props.get("guest-phys-bits", "")
    return GuestCpu(
        cputype=cputype,
        reported=reported,
        phys_bits=bits,
        vendor=_vendor(reported, host),
        pdpe1gb=_one_gib_pages(reported, flag_set(props), host),
        guest_phys_bits=int(guest_bits) if guest_bits.isdigit() else None,
    )


def _one_gib_pages(reported: str, flags: dict[str, str], host: HostCpu) -> bool:
    """Whether the VM's CPU has 1 GiB pages: never where the host lacks them (KVM cannot add a
    page size the host has not); else as the VM's ``+pdpe1gb`` or ``-pdpe1gb`` says; else host
    and max do (they pass the host's flags through), and another model as QEMU's own definition
    of it says (:mod:`~proxgpu.planning.cpumodels`; an unknown model is taken to lack them: the
    advice that follows, ``+pdpe1gb``, is right either way)."""
    if host.pdpe1gb is False:
        return False
    if "pdpe1gb" in flags:
        return flags["pdpe1gb"] == "+"
    return reported in HOST_MODELS or has_1g_pages(reported) is True


def _phys_bits(props: dict[str, str], reported: str, host: HostCpu) -> int | None:
    value = props.get("phys-bits")
    if value == "host" or (value is None and reported in HOST_MODELS):
        return host.phys_bits
    return int(value) if value is not None and value.isdigit() else QEMU_DEFAULT_PHYS_BITS


def _vendor(reported: str, host: HostCpu) -> str | None:
    if reported in _GENERIC_MODELS:
        return host.vendor
    return "AuthenticAMD" if reported.startswith(_AMD_MODELS) else "GenuineIntel"
