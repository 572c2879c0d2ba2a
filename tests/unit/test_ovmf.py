"""OVMF's 64-bit PCI window and BAR layout (proxgpu.planning.ovmf) and the VM CPU that decides
it (proxgpu.planning.guestcpu), each rule against edk2's and qemu-server's."""

from __future__ import annotations

import pytest

from proxgpu.planning.bars import advised_cpu, with_bits
from proxgpu.planning.guestcpu import GuestCpu, HostCpu, guest_cpu
from proxgpu.planning.ovmf import (
    CLASSIC_WINDOW,
    GIB,
    MIB,
    TIB,
    address_width,
    first_non_address,
    hotplug_reservation,
    needed_bytes,
    window_size,
)
from proxgpu.pve.config import GuestConfig

AMD = HostCpu(vendor="AuthenticAMD", phys_bits=52, pdpe1gb=True)
INTEL = HostCpu(vendor="GenuineIntel", phys_bits=46, pdpe1gb=True)
GPU = [128 * GIB, 32 * MIB]


def cpu(bits: int, vendor: str, pdpe1gb: bool = True, guest: int | None = None) -> GuestCpu:
    return GuestCpu("kvm64", "kvm64", bits, vendor, pdpe1gb, guest)


@pytest.mark.parametrize(
    ("bits", "vendor", "pdpe1gb", "guest", "width"),
    [
        (40, "AuthenticAMD", False, None, 40),  # AMD's 40 is a known-good value
        (40, "GenuineIntel", False, None, None),  # Intel's is not: QEMU's default, untrusted
        (39, "GenuineIntel", False, None, 39),
        (36, "GenuineIntel", False, None, 36),
        (38, "AuthenticAMD", True, None, None),
        (41, "GenuineIntel", False, None, 40),  # above 40 only with 1 GiB pages
        (41, "GenuineIntel", True, None, 41),
        (52, "AuthenticAMD", True, None, 46),  # 4-level paging: at most 46
        (46, "AuthenticAMD", True, 44, 44),  # GuestPhysBits caps them
    ],
)
def test_the_address_width_ovmf_trusts(
    bits: int, vendor: str, pdpe1gb: bool, guest: int | None, width: int | None
) -> None:
    assert address_width(cpu(bits, vendor, pdpe1gb, guest)) == width


def test_the_dynamic_window_is_the_top_eighth_of_the_address_space() -> None:
    assert window_size(40, 258 * GIB) == 128 * GIB
    assert window_size(46, 258 * GIB) == 8 * TIB
    assert window_size(None, 258 * GIB) == CLASSIC_WINDOW


def test_the_classic_window_stays_when_the_dynamic_one_would_start_below_it() -> None:
    # 41 bits: 256 GiB ending at 2 TiB would start at 1792 GiB, below the classic base.
    assert window_size(41, 1800 * GIB) == CLASSIC_WINDOW
    assert window_size(41, 1700 * GIB) == 256 * GIB


@pytest.mark.parametrize(
    ("window", "reservation"),
    [(CLASSIC_WINDOW, 0), (128 * GIB, 512 * MIB), (TIB, 4 * GIB), (8 * TIB, 32 * GIB)],
)
def test_each_hotplug_bridge_reserves_a_256th_above_32_gib(window: int, reservation: int) -> None:
    assert hotplug_reservation(window) == reservation


def test_root_ports_are_aligned_to_their_largest_bar() -> None:
    # 1 TiB window, 4 GiB reservations. Ports 1 and 2 take 128 GiB + 32 MiB each at 128 GiB
    # alignment (0 and 256 GiB, ending at 384 GiB + 32 MiB); ports 3 and 4 and the four PCI
    # bridges reserve 4 GiB each from 388 GiB on: 412 GiB.
    assert needed_bytes({0: GPU, 1: GPU}, TIB) == 412 * GIB


def test_without_reservations_only_the_bars_count() -> None:
    assert needed_bytes({0: GPU}, CLASSIC_WINDOW) == 128 * GIB + 32 * MIB


def test_an_extra_root_port_holds_its_gpu_like_the_fixed_ones() -> None:
    # hostpci4 adds root port 5: five ports of GPUs, the fifth at 1 TiB.
    ports = {index: GPU for index in range(5)}
    assert needed_bytes(ports, CLASSIC_WINDOW) == 4 * 256 * GIB + 128 * GIB + 32 * MIB


@pytest.mark.parametrize(
    ("config", "host", "end"),
    [
        ("memory: 262144\n", AMD, 258 * GIB),  # 2 GiB below 4 GiB, the rest above
        ("memory: 2048\n", AMD, 4 * GIB),  # all of it below 4 GiB
        # Memory hotplug: maxmem for 40 bits (512 GiB), less the static 1 GiB, 255 slots.
        ("memory: 65536\nhotplug: memory\nnuma: 1\n", INTEL, 4 * GIB + 511 * GIB + 255 * GIB),
        # An AMD vCPU whose RAM would reach the HyperTransport hole: it moves to 1 TiB.
        ("memory: 1024000\n", AMD, TIB + 998 * GIB),
    ],
)
def test_the_ram_below_the_window(config: str, host: HostCpu, end: int) -> None:
    parsed = GuestConfig.parse(config)
    vcpu = guest_cpu(parsed, host)
    assert vcpu is not None
    assert first_non_address(parsed, vcpu, host) == end


@pytest.mark.parametrize(
    ("config", "fields"),
    [
        ("", ("kvm64", "kvm64", 40, "GenuineIntel", False)),  # qemu-server's default
        ("cpu: x86-64-v3\n", ("x86-64-v3", "qemu64", 40, "GenuineIntel", False)),
        (
            "cpu: x86-64-v2-AES,flags=+pdpe1gb\n",
            ("x86-64-v2-AES", "qemu64", 40, "GenuineIntel", True),
        ),
        ("cpu: host\n", ("host", "host", 46, "GenuineIntel", True)),
        ("cpu: host,flags=-pdpe1gb\n", ("host", "host", 46, "GenuineIntel", False)),
        ("cpu: kvm64,phys-bits=host\n", ("kvm64", "kvm64", 46, "GenuineIntel", False)),
        # QEMU's EPYC models carry 1 GiB pages (proxgpu/planning/cpumodels.py).
        ("cpu: EPYC-Genoa,phys-bits=44\n", ("EPYC-Genoa", "EPYC-Genoa", 44, "AuthenticAMD", True)),
    ],
)
def test_what_the_vms_cpu_reports(config: str, fields: tuple[str, str, int, str, bool]) -> None:
    vcpu = guest_cpu(GuestConfig.parse(config), INTEL)
    assert vcpu is not None
    assert (vcpu.cputype, vcpu.reported, vcpu.phys_bits, vcpu.vendor, vcpu.pdpe1gb) == fields


@pytest.mark.parametrize(
    ("config", "host"),
    [
        ("cpu: custom-mine\n", INTEL),  # defined in cpu-models.conf, which is not read
        ("cpu: host\n", HostCpu(vendor="GenuineIntel", phys_bits=None, pdpe1gb=True)),
    ],
)
def test_a_cpu_proxgpu_cannot_tell_is_not_guessed(config: str, host: HostCpu) -> None:
    assert guest_cpu(GuestConfig.parse(config), host) is None


def test_no_advice_asks_for_1_gib_pages_the_host_lacks() -> None:
    """KVM gives a guest no CPU flag the host lacks, so +pdpe1gb on such a host changes nothing:
    OVMF stays at 40 bits, and no cpu: value is advised."""
    bare = HostCpu(vendor="AuthenticAMD", phys_bits=48, pdpe1gb=False)
    assert with_bits({"cputype": "kvm64"}, 43, bare) is None
    assert with_bits({"cputype": "kvm64"}, 43, AMD) == "kvm64,flags=+pdpe1gb,phys-bits=43"
    config = GuestConfig.parse("bios: ovmf\nmemory: 4096\n")
    assert advised_cpu(config, bare, {0: [128 * GIB]}) is None
    assert advised_cpu(config, AMD, {0: [128 * GIB]}) is not None
