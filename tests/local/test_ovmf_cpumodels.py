"""proxgpu.planning.cpumodels against the pinned qemu-server: every x86 model it offers is in the
table, and the models its "OVMF firmware might limit CPU 'phys-bits' to 40" check names are the
ones the table says lack 1 GiB pages."""

from __future__ import annotations

import re

from proxgpu.planning.cpumodels import WITHOUT_1G_PAGES, has_1g_pages
from proxgpu.planning.guestcpu import HOST_MODELS
from tests.support.pvevalidate import proxmox_sources


def cpu_config() -> str:
    return (proxmox_sources() / "qemu-server/src/PVE/QemuServer/CPUConfig.pm").read_text()


def x86_models(text: str) -> list[str]:
    """The keys of the x86_64 list qemu-server falls back on without QEMU's JSON model file."""
    start = text.index("$cpu_models_by_arch = {")
    block = text[text.index("x86_64 => {", start) : text.index("aarch64 => {", start)]
    return re.findall(r"^\s*'?([\w.-]+)'?\s*=>\s*'", block, re.MULTILINE)


def test_every_x86_model_qemu_server_offers_is_known() -> None:
    models = [model for model in x86_models(cpu_config()) if model not in HOST_MODELS]
    assert {"EPYC-Rome", "kvm64", "Icelake-Client", "ClearwaterForest"} <= set(models)
    assert [model for model in models if has_1g_pages(model) is None] == []


def test_the_models_qemu_servers_phys_bits_check_names_lack_1g_pages() -> None:
    text = cpu_config()
    check = text[text.index("sub check_phys_bits_above_40_compat") :]
    named = re.findall(r"\$cpu_type ne '([\w-]+)'", check[: check.index("}")])
    assert named == ["qemu64", "kvm64"]
    assert set(named) <= WITHOUT_1G_PAGES
    # qemu-server's own x86-64 levels are QEMU's qemu64 with flags, none of them pdpe1gb.
    levels = re.findall(r"'(x86-64-v[\w-]+)' => \{\s*'reported-model' => '(\w+)'", text)
    assert {model for model, _ in levels} <= WITHOUT_1G_PAGES
    assert {reported for _, reported in levels} == {"qemu64"}
