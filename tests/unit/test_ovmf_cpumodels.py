"""1 GiB pages of QEMU's named CPU models (proxgpu.planning.cpumodels) and what they give OVMF's
64-bit window (proxgpu.planning.ovmf): a model with pdpe1gb uses its phys-bits above 40, one
without it (kvm64, qemu64, qemu-server's x86-64 levels) stays at 40, and the VM's flags win."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxgpu.planning import plan_split
from proxgpu.planning.cpumodels import (
    ALIASES,
    WITH_1G_PAGES,
    WITHOUT_1G_PAGES,
    base_model,
    has_1g_pages,
)
from proxgpu.planning.guestcpu import HostCpu, guest_cpu
from proxgpu.planning.model import SplitPolicy
from proxgpu.planning.ovmf import GIB, MIB, TIB, advisable_bits, fit
from proxgpu.pve.config import GuestConfig
from tests.support.factories import ct200

AMD = HostCpu(vendor="AuthenticAMD", phys_bits=52, pdpe1gb=True)
INTEL = HostCpu(vendor="GenuineIntel", phys_bits=46, pdpe1gb=True)
BARE = HostCpu(vendor="AuthenticAMD", phys_bits=48, pdpe1gb=False)
GPU = [128 * GIB, 32 * MIB]
VM_300 = "/etc/pve/qemu-server/300.conf"
Q35 = "bios: ovmf\nmachine: q35\nmemory: 262144\n"


def width_of(cpu: str, host: HostCpu = AMD) -> int | None:
    config = GuestConfig.parse(f"bios: ovmf\nmemory: 65536\ncpu: {cpu}\n")
    vcpu = guest_cpu(config, host)
    assert vcpu is not None
    return fit(config, vcpu, host, {0: GPU}).width


@pytest.mark.parametrize(
    ("cpu", "width"),
    [
        ("EPYC-Rome,phys-bits=46", 46),  # the VM
        ("EPYC-Rome-v2,phys-bits=44", 44),  # a versioned alias
        ("EPYC-Milan-v2,phys-bits=45", 45),
        ("EPYC-Genoa,phys-bits=43", 43),
        ("EPYC-IBPB,phys-bits=42", 42),  # EPYC's version 2 alias
        ("Icelake-Server-v6,phys-bits=45", 45),
        ("Icelake-Client,phys-bits=44", 44),  # qemu-server runs it as Icelake-Server
        ("Cascadelake-Server-noTSX,phys-bits=44", 44),
        ("Cooperlake,phys-bits=46", 46),
        ("Skylake-Server-IBRS,phys-bits=43", 43),
        ("SapphireRapids,phys-bits=46", 46),
        ("Denverton,phys-bits=42", 42),
        ("Opteron_G5,phys-bits=48", 46),  # 4-level paging caps them
    ],
)
def test_a_named_model_with_1g_pages_uses_its_bits_above_40(cpu: str, width: int) -> None:
    assert width_of(cpu) == width


@pytest.mark.parametrize(
    "cpu",
    [
        "kvm64,phys-bits=46",
        "qemu64,phys-bits=44",
        "x86-64-v2-AES,phys-bits=45",  # qemu-server's qemu64 with flags
        "x86-64-v4,phys-bits=43",
        "Haswell-noTSX-IBRS,phys-bits=44",
        "Skylake-Client-v4,phys-bits=46",
        "Opteron_G3,phys-bits=42",
    ],
)
def test_a_model_without_1g_pages_stays_at_40_bits(cpu: str) -> None:
    assert width_of(cpu) == 40


@pytest.mark.parametrize(
    ("cpu", "width"),
    [
        ("EPYC-Rome,flags=-pdpe1gb,phys-bits=46", 40),
        ("EPYC-Turin,flags=+aes;-pdpe1gb,phys-bits=44", 40),
        ("Broadwell-IBRS,flags=+pdpe1gb,phys-bits=44", 44),
        ("kvm64,flags=+pdpe1gb,phys-bits=43", 43),
    ],
)
def test_the_vms_pdpe1gb_flag_overrides_the_model(cpu: str, width: int) -> None:
    assert width_of(cpu) == width


def test_a_host_without_1g_pages_gives_a_named_model_none() -> None:
    # KVM passes the guest no flag the host lacks (and qemu-server's enforce refuses the start).
    assert width_of("EPYC-Milan,phys-bits=45", BARE) == 40


def test_a_model_the_table_does_not_know_errs_towards_the_warning() -> None:
    assert has_1g_pages("EPYC-Venice") is None
    assert width_of("EPYC-Venice,phys-bits=45") == 40
    assert width_of("EPYC-Venice,flags=+pdpe1gb,phys-bits=45") == 45


def vm_warnings(cpu: str) -> list[str]:
    inventory = ct200({VM_300: Q35 + cpu})
    gpus = [replace(gpu, bar_bytes=GPU, bar64_bytes=GPU) for gpu in inventory.gpus]
    inventory = replace(
        inventory, gpus=gpus, cpu_vendor="AuthenticAMD", cpu_phys_bits=52, cpu_pdpe1gb=True
    )
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, 4)]))
    return [w for w in plan.warnings if w.startswith("VM 300")]


@pytest.mark.parametrize(
    "cpu",
    [
        "cpu: EPYC-Rome,phys-bits=46\n",
        "cpu: EPYC-Genoa,phys-bits=45\n",
        "cpu: Icelake-Server-v7,phys-bits=44\n",
    ],
)
def test_a_named_model_with_enough_bits_gets_no_warning(cpu: str) -> None:
    # Four root ports of 128 GiB + 32 MiB take about 1 TiB: 44 bits give 2 TiB.
    assert vm_warnings(cpu) == []


@pytest.mark.parametrize(
    "cpu",
    [
        "cpu: EPYC-Milan,flags=-pdpe1gb,phys-bits=45\n",
        "cpu: x86-64-v3,phys-bits=45\n",
        "cpu: kvm64,phys-bits=44\n",
    ],
)
def test_a_model_without_1g_pages_is_still_warned_about(cpu: str) -> None:
    (warning,) = vm_warnings(cpu)
    assert "of which OVMF uses 40 without 1 GiB pages" in warning


@pytest.mark.parametrize(
    ("cpu", "host", "bits"),
    [
        ("kvm64", AMD, [41, 42, 43, 44, 45, 46]),  # QEMU's default 40: every trusted width
        ("kvm64,flags=-pdpe1gb,phys-bits=44", AMD, [44, 45, 46]),
        ("EPYC-Rome,flags=-pdpe1gb,phys-bits=45", AMD, [45, 46]),
        ("x86-64-v2-AES,phys-bits=48", AMD, [48]),  # above OVMF's 46: its own value only
        ("host,phys-bits=42", INTEL, [42, 43, 44, 45, 46]),
        ("qemu64,phys-bits=43", HostCpu("GenuineIntel", 44, True), [43, 44]),
    ],
)
def test_advice_never_takes_bits_from_the_vm(cpu: str, host: HostCpu, bits: list[int]) -> None:
    vcpu = guest_cpu(GuestConfig.parse(f"cpu: {cpu}\n"), host)
    assert vcpu is not None
    assert list(advisable_bits(vcpu, host)) == bits
    assert min(bits) >= vcpu.phys_bits


def test_the_advisable_bits_fit_where_the_vms_own_do_not() -> None:
    # A VM on 44 bits without 1 GiB pages: OVMF's 40 give 128 GiB; with them 44 bits give 2 TiB.
    config = GuestConfig.parse("memory: 65536\ncpu: EPYC-Rome,flags=-pdpe1gb,phys-bits=44\n")
    vcpu = guest_cpu(config, AMD)
    assert vcpu is not None
    assert not fit(config, vcpu, AMD, {0: GPU, 1: GPU}).fits
    first = advisable_bits(vcpu, AMD)[0]
    config.set("cpu", f"EPYC-Rome,flags=+pdpe1gb,phys-bits={first}")
    vcpu = guest_cpu(config, AMD)
    assert vcpu is not None
    better = fit(config, vcpu, AMD, {0: GPU, 1: GPU})
    assert (first, better.width, better.window, better.fits) == (44, 44, 2 * TIB, True)


def test_every_alias_and_base_model_is_in_one_table() -> None:
    assert not WITH_1G_PAGES & WITHOUT_1G_PAGES
    for alias, base in ALIASES.items():
        assert base in WITH_1G_PAGES | WITHOUT_1G_PAGES, alias
        assert has_1g_pages(alias) is has_1g_pages(base)
    assert base_model("EPYC-Rome-v5") == "EPYC-Rome"
    assert base_model("x86-64-v2") == "x86-64-v2"  # qemu-server's model, not a version
