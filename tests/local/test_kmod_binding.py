"""The boot-time binding against Debian's real kmod: over the files proxgpu writes, ``modprobe``
loads vfio-pci (through proxgpu's ``install`` hook, which writes each driver_override) before
every driver that could claim a moved function, whether asked for the driver by name (the
initramfs, modules-load.d, nvidia-persistenced, by hand) or for the function's modalias (udev
at coldplug), and keeps the driver's own softdeps.

The module tree is real to kmod (ELF ``.ko`` files with ``.modinfo`` sections, indexed by the
real ``depmod``, which writes ``modules.softdep`` from NVIDIA's own softdep); nothing is loaded.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxgpu.errors import RenderError
from proxgpu.inspection.inventory import Inventory
from proxgpu.kmod import KmodConfig
from proxgpu.paths import BIND_SCRIPT, LEGACY_MODPROBE_CONF, MODPROBE_CONF
from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy
from proxgpu.rendering import render
from proxgpu.rendering.changes import ChangeSet
from tests.support.factories import ct200, make_gpu, make_inventory
from tests.support.kmodtree import (
    KMODS,
    Kmod,
    Module,
    build_tree,
    extra_module,
    gpu_modules,
    pci_alias,
    show_depends,
    write_files,
)

KERNEL = "6.8.12-11-pve"
HOOK = f"install {BIND_SCRIPT};"


@pytest.fixture(params=KMODS, ids=str)
def kmod(request: pytest.FixtureRequest) -> Kmod:
    """Each kmod in turn: the system's and every Proxmox VE release's (tests/kmod/versions.toml)."""
    chosen: Kmod = request.param
    return chosen


def test_each_kmod_is_the_release_it_is_named_for(kmod: Kmod) -> None:
    """The matrix is real: each build's modprobe and depmod say the version the test is named by."""
    for name in ("modprobe", "depmod"):
        said = subprocess.run(
            [kmod.tool(name), "--version"], capture_output=True, text=True, check=True
        )
        assert said.stdout.splitlines()[0] == f"kmod version {kmod.version}", (name, said.stdout)


def _with_files(inventory: Inventory, files: dict[str, str]) -> Inventory:
    return replace(inventory, kernel=KERNEL, host_files=files)


def _changes(inventory: Inventory, policy: SplitPolicy | None = None) -> ChangeSet:
    return render(inventory, plan_split(inventory, policy or SplitPolicy()))


def _host(
    kmod: Kmod, tmp_path: Path, inventory: Inventory, modules: list[Module]
) -> tuple[Path, ChangeSet]:
    """A host tree: the module tree indexed by depmod, the host's own files, then proxgpu's."""
    root = tmp_path / "host"
    directory = build_tree(kmod, root, KERNEL, modules)
    softdep = (directory / "modules.softdep").read_text()
    files = {**inventory.host_files, f"/lib/modules/{KERNEL}/modules.softdep": softdep}
    inventory = _with_files(inventory, files)
    write_files(root, dict(files))
    changes = _changes(inventory)
    write_files(root, {c.path: c.after for c in changes.files})
    return root, changes


def _loads_vfio_first(lines: list[str], driver: str) -> bool:
    """Whether the hook (which loads vfio-pci) runs before ``driver``'s module is inserted."""
    hook = next((n for n, line in enumerate(lines) if line.startswith(HOOK)), None)
    insert = next(
        (n for n, line in enumerate(lines) if line.startswith("insmod ") and f"/{driver}" in line),
        None,
    )
    return hook is not None and insert is not None and hook < insert


def _amd_host() -> Inventory:
    """Two AMD GPUs (Radeon PRO W7900 IDs), one per node, each with its HDMI audio function."""
    ids: dict[str, Any] = {"vendor_id": "1002", "device_id": "744c", "class_code": "0x030000"}
    gpus = []
    for bus, node in (("01", 0), ("81", 1)):
        gpu = make_gpu(bus, node, audio=True, driver="amdgpu")
        info = [
            replace(f, **ids if f.address == gpu.address else {"vendor_id": "1002"})
            for f in gpu.function_info
        ]
        gpus.append(replace(gpu, **{**ids, "function_info": info}))
    return make_inventory(gpus)


def test_nvidia_loaded_by_name_or_by_udev_gets_vfio_pci_first(kmod: Kmod, tmp_path: Path) -> None:
    inventory = ct200()
    root, changes = _host(kmod, tmp_path, inventory, gpu_modules(KERNEL))
    moved = [f for gpu in inventory.gpus if gpu.numa_node == 1 for f in gpu.function_info]
    conf = next(c.after for c in changes.files if c.path == MODPROBE_CONF) or ""
    assert "softdep nvidia pre: vfio-pci ecdh_generic,ecdsa_generic" in conf
    for module in ("nvidia", "nouveau", "snd_hda_intel"):
        assert _loads_vfio_first(show_depends(kmod, root, KERNEL, module), module.replace("_", "-"))
    for function in moved:
        alias = pci_alias(function.vendor_id, function.device_id, function.class_code)
        lines = show_depends(kmod, root, KERNEL, alias)
        drivers = {ln.split()[1].rsplit("/", 1)[1].split(".")[0] for ln in lines if "insmod" in ln}
        assert drivers - {"vfio", "vfio-pci"}, f"{alias} resolved to no driver: {lines}"
        for driver in drivers - {"vfio", "vfio-pci"}:
            assert _loads_vfio_first(lines, driver), (alias, lines)


def test_a_blacklisted_vfio_pci_still_loads_first_as_udev_loads_the_driver(
    kmod: Kmod, tmp_path: Path
) -> None:
    """udev applies blacklists to the module it looks up by alias, not to its softdeps."""
    root, _ = _host(kmod, tmp_path, ct200(), gpu_modules(KERNEL))
    write_files(root, {"/etc/modprobe.d/local.conf": "blacklist vfio_pci\nblacklist nouveau\n"})
    alias = pci_alias("10de", "2bb1", "0x030000")
    lines = show_depends(kmod, root, KERNEL, alias, "--use-blacklist")
    assert _loads_vfio_first(lines, "nvidia") and not any("nouveau" in ln for ln in lines)


def test_amdgpu_gets_vfio_pci_first_and_keeps_an_admins_post_module(
    kmod: Kmod, tmp_path: Path
) -> None:
    admin = {"/etc/modprobe.d/amdgpu-extra.conf": "softdep amdgpu post: amdgpu_extra\n"}
    inventory = replace(_amd_host(), host_files=admin)
    modules = [*gpu_modules(KERNEL), extra_module(KERNEL, "amdgpu_extra")]
    root, _ = _host(kmod, tmp_path, inventory, modules)
    lines = show_depends(kmod, root, KERNEL, "amdgpu")
    assert _loads_vfio_first(lines, "amdgpu")
    inserted = [line.split()[1].rsplit("/", 1)[1] for line in lines if line.startswith("insmod")]
    assert inserted.index("amdgpu_extra.ko") > inserted.index("amdgpu.ko"), lines


def test_the_name_proxgpu_used_before_loses_to_modules_softdep(kmod: Kmod, tmp_path: Path) -> None:
    """What this fixes, shown with kmod itself: under its old name, after ``modules.softdep``,
    proxgpu's softdep for nvidia was never used."""
    root, _ = _host(kmod, tmp_path, ct200(), gpu_modules(KERNEL))
    new = root / MODPROBE_CONF.lstrip("/")
    new.rename(root / LEGACY_MODPROBE_CONF.lstrip("/"))
    assert not _loads_vfio_first(show_depends(kmod, root, KERNEL, "nvidia"), "nvidia")
    # snd_hda_intel declares no softdep of its own, so the old file's line still served it.
    assert _loads_vfio_first(show_depends(kmod, root, KERNEL, "snd_hda_intel"), "snd-hda-intel")


def test_the_old_file_is_replaced_and_the_new_one_is_idempotent(kmod: Kmod, tmp_path: Path) -> None:
    root, first = _host(kmod, tmp_path, ct200(), gpu_modules(KERNEL))
    old = next(c.after for c in first.files if c.path == MODPROBE_CONF)
    files = {
        p: (root / p.lstrip("/")).read_text()
        for p in (f"/lib/modules/{KERNEL}/modules.softdep", LEGACY_MODPROBE_CONF)
        if (root / p.lstrip("/")).exists()
    }
    legacy = _with_files(ct200(), {**files, LEGACY_MODPROBE_CONF: old or ""})
    moved = {c.path: c.after for c in _changes(legacy).files}
    assert moved[LEGACY_MODPROBE_CONF] is None and moved[MODPROBE_CONF] == old
    again = _with_files(ct200(), {**files, MODPROBE_CONF: old or ""})
    assert not [c.path for c in _changes(again).changed_files() if "modprobe" in c.path]


def test_a_softdep_before_proxgpus_file_is_refused_with_its_line() -> None:
    early = {"/etc/modprobe.d/0-nvidia.conf": "softdep nvidia pre: nvidia_peermem_helper\n"}
    with pytest.raises(RenderError) as refused:
        _changes(_with_files(ct200(), early))
    assert "/etc/modprobe.d/0-nvidia.conf:1" in str(refused.value)
    with_vfio = {"/etc/modprobe.d/0-nvidia.conf": "softdep nvidia pre: vfio-pci\n"}
    assert _changes(_with_files(ct200(), with_vfio)).changed


def test_the_plan_says_which_line_would_have_won() -> None:
    softdep = "softdep nvidia pre: ecdh_generic,ecdsa_generic\n"
    changes = _changes(_with_files(ct200(), {f"/lib/modules/{KERNEL}/modules.softdep": softdep}))
    said = [w for w in changes.warnings if w.startswith("nvidia:")]
    assert said and f"/lib/modules/{KERNEL}/modules.softdep:1" in said[0]


def test_a_softdep_line_kmod_never_uses_is_told() -> None:
    own = "softdep nvidia pre: ecdh_generic,ecdsa_generic\n"
    files = {
        f"/lib/modules/{KERNEL}/modules.softdep": own,
        "/etc/modprobe.d/nvidia.conf": "softdep nvidia post: nvidia-drm\n",
    }
    warnings = _changes(_with_files(ct200(), files)).warnings
    unused = [w for w in warnings if w.startswith("/etc/modprobe.d/nvidia.conf:1:")]
    assert unused and f"(/lib/modules/{KERNEL}/modules.softdep:1)" in unused[0]


def test_kmod_order_matches_the_real_modprobe(kmod: Kmod, tmp_path: Path) -> None:
    """proxgpu's model of kmod picks the same softdep line, and reads the same modules from it,
    as modprobe does: across config directories, a name hidden by the same name earlier, a
    glob, a continued line, and kmod's way with a blank too many (the line loses its post:)."""
    files = {
        "/lib/modprobe.d/b.conf": "softdep amdgpu post: from_lib_b\n",
        "/etc/modprobe.d/b.conf": "softdep amdgpu post: from_etc_b\n",
        "/run/modprobe.d/a.conf": "# a comment\nsoftdep amd* \\\n post: from_run_a\n",
    }
    root = tmp_path / "host"
    modules = [
        *gpu_modules(KERNEL),
        *(extra_module(KERNEL, n) for n in ("from_lib_b", "from_etc_b", "from_run_a")),
    ]
    build_tree(kmod, root, KERNEL, modules)
    write_files(root, dict(files))
    for drop in (
        [],
        ["/run/modprobe.d/a.conf"],
        ["/run/modprobe.d/a.conf", "/etc/modprobe.d/b.conf"],
    ):
        write_files(root, dict.fromkeys(drop))
        left = {p: t for p, t in files.items() if p not in drop}
        line = KmodConfig.of(left, KERNEL).softdep("amdgpu")
        assert line is not None
        inserted = [
            ln for ln in show_depends(kmod, root, KERNEL, "amdgpu") if ln.startswith("insmod")
        ]
        extra = [ln.split()[1].rsplit("/", 1)[1] for ln in inserted if "from_" in ln]
        assert extra == [f"{name}.ko" for name in line.softdeps()[1]], (drop, inserted)


def test_backslashes_are_read_as_kmod_reads_them(kmod: Kmod, tmp_path: Path) -> None:
    r"""A backslash before any character but a newline stands for that character, so ``\_`` in
    a name is ``_`` and two at a line's end are a backslash, not a continuation (kmod's
    ``freadline_wrapped``, alike in 28, 30 and 34.2): the next line is a line of its own."""
    root = tmp_path / "host"
    modules = [*gpu_modules(KERNEL), *(extra_module(KERNEL, n) for n in ("from_a", "from_b"))]
    build_tree(kmod, root, KERNEL, modules)
    files = {
        "/etc/modprobe.d/a.conf": "softdep amdgpu post: from\\_a \\\\\nsoftdep amdgpu pre: from_b\n"
    }
    write_files(root, dict(files))
    inserted = [ln for ln in show_depends(kmod, root, KERNEL, "amdgpu") if ln.startswith("insmod")]
    extra = [ln.split()[1].rsplit("/", 1)[1] for ln in inserted if "from_" in ln]
    line = KmodConfig.of(files, KERNEL).softdep("amdgpu")
    assert line is not None and line.softdeps() == ([], ["from_a", "\\"])
    assert extra == ["from_a.ko"], inserted


def test_an_alias_file_counts_as_kmod_before_33_reads_it(kmod: Kmod, tmp_path: Path) -> None:
    """kmod 28 and 30 (Proxmox VE 7 and 8) read modprobe.d's ``*.alias`` files as config files
    too, and kmod 33 stopped (libkmod-config.c ``conf_files_filter_out``): proxgpu's model reads
    them on every release, as the oldest kmod does, so an early one is refused like a ``.conf``."""
    root = tmp_path / "host"
    build_tree(kmod, root, KERNEL, [*gpu_modules(KERNEL), extra_module(KERNEL, "from_alias")])
    files = {"/etc/modprobe.d/0-amd.alias": "softdep amdgpu post: from_alias\n"}
    write_files(root, dict(files))
    used = any("from_alias" in ln for ln in show_depends(kmod, root, KERNEL, "amdgpu"))
    assert used == (int(kmod.version.split(".")[0]) < 33)
    line = KmodConfig.of(files, KERNEL).softdep("amdgpu")
    assert line is not None and line.where == "/etc/modprobe.d/0-amd.alias:1"
    early = {"/etc/modprobe.d/0-nvidia.alias": "softdep nvidia pre: nvidia_peermem_helper\n"}
    with pytest.raises(RenderError, match=re.escape("/etc/modprobe.d/0-nvidia.alias:1")):
        _changes(_with_files(ct200(), early))


def test_blacklisting_another_claimant_of_the_kept_gpus_is_fine() -> None:
    """Found on the e2e host, whose GPUs' IDs name bochs first while nvidia drives them: kept
    GPUs lose nothing to a blacklist of another module that could claim them, only to one of
    the module that drives them."""
    ids: dict[str, Any] = {"vendor_id": "1234", "device_id": "1111", "class_code": "0x038000"}
    gpus = []
    for gpu in ct200().gpus:
        info = [replace(f, **ids) if f.address == gpu.address else f for f in gpu.function_info]
        gpus.append(replace(gpu, **{**ids, "function_info": info}))
    standins = replace(ct200(), gpus=gpus)
    fine = {"/etc/modprobe.d/testhost-blacklist.conf": "blacklist bochs\n"}
    assert _changes(_with_files(standins, fine)).changed
    with pytest.raises(RenderError, match="nvidia would not load by itself"):
        _changes(_with_files(standins, {"/etc/modprobe.d/x.conf": "blacklist nvidia\n"}))


def test_once_proxgpus_line_is_in_effect_the_plan_says_nothing_of_the_race() -> None:
    softdep = {f"/lib/modules/{KERNEL}/modules.softdep": "softdep nvidia pre: ecdh_generic\n"}
    first = _changes(_with_files(ct200(), softdep))
    written = {c.path: c.after for c in first.files if c.after is not None}
    applied = {**softdep, MODPROBE_CONF: written[MODPROBE_CONF], BIND_SCRIPT: written[BIND_SCRIPT]}
    again = _changes(_with_files(ct200(), applied))
    assert any(w.startswith("nvidia: kmod uses only") for w in first.warnings)
    assert not any(w.startswith("nvidia: kmod uses only") for w in again.warnings)


def test_a_line_read_before_proxgpus_is_refused_once_for_every_kernel() -> None:
    files = {
        "/etc/modprobe.d/0-nvidia.conf": "softdep nvidia pre: helper\n",
        "/lib/modules/6.8.12-9-pve/modules.softdep": "softdep nvidia pre: ecdh_generic\n",
        f"/lib/modules/{KERNEL}/modules.softdep": "softdep nvidia pre: ecdh_generic\n",
    }
    with pytest.raises(RenderError) as refused:
        _changes(_with_files(ct200(), files))
    assert str(refused.value).count("0-nvidia.conf:1") == 1
    assert "add vfio-pci first to its pre: modules" in str(refused.value)


def test_one_notion_of_the_module_that_drives_a_gpu() -> None:
    """The moved GPUs' softdeps and the kept GPUs' blacklist check ask the same question: a
    driver bound now without a module link (where the capture read them) is built in; one not
    loaded now is its module by name; a capture without module links cannot tell built-ins."""
    blacklist = {"/etc/modprobe.d/x.conf": "blacklist nvidia\n"}
    links = replace(ct200(), driver_modules={"snd_hda_intel": "snd_hda_intel"})
    built_in = _changes(_with_files(links, blacklist))
    # modprobe.d cannot keep a built-in driver from its GPUs, and nothing loads before it.
    assert any("driver nvidia is built into the kernel" in w for w in built_in.warnings)
    gpus = [
        replace(
            g,
            driver=None,
            function_info=[replace(f, driver=None) for f in g.function_info],
        )
        for g in links.gpus
    ]
    unbound = replace(links, gpus=gpus)
    with pytest.raises(RenderError, match="nvidia would not load by itself"):
        _changes(_with_files(unbound, blacklist))
    unknown = _changes(_with_files(ct200(), {}))
    assert not any("built into the kernel" in w for w in unknown.warnings)
