"""Which modules could take a moved function, from the host's own aliases, against Debian's real
kmod: proxgpu's model of kmod's lookup finds, for each function's modalias, the modules
``modprobe --resolve-alias`` finds (what udev's builtin kmod loads), and after the plan's files
are written, vfio-pci loads before every one of them, drivers proxgpu's fixed table never named
included (nova-core, the USB-C UCSI function's i2c-nvidia-gpu), with each kmod a Proxmox VE
release ships (the system's 30, and builds of 28 and 34.2).

The module trees are real to kmod: ELF ``.ko`` files with ``.modinfo`` sections and a
``modules.builtin.modinfo``, indexed by the real ``depmod``, which writes ``modules.alias`` from
them; the host trees are copies of the ct200 example read by the real gather script.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from proxgpu.cli import main
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.capture import ALIAS_LIST, gather, write_tree
from proxgpu.inspection.inventory import Inventory
from proxgpu.kmod import KmodConfig, lookup_modalias, matching_aliases, normalize
from proxgpu.kmodglob import alias_normalize
from proxgpu.paths import BIND_SCRIPT, MODPROBE_CONF
from proxgpu.planning import plan_split
from proxgpu.planning.model import SplitPolicy
from proxgpu.rendering import render
from tests.support.kmodtree import (
    KMODS,
    XHCI_BUILTIN,
    Kmod,
    Module,
    build_tree,
    drivers_tables_miss,
    gpu_modules,
    module_with_aliases,
    resolve_alias,
    show_depends,
    write_files,
)
from tests.support.trees import copy_example

KERNEL = "6.8.12-11-pve"
HOOK = f"install {BIND_SCRIPT};"
SPLIT = SplitPolicy(lxc=200, vms=[(300, None)])
#: The moved GPU that gets a USB-C controller's two functions, as Turing boards have them.
USB_C_SLOT = "0000:81:00"

#: A modalias of each kind of function a GPU card has, and of others (as sysfs prints them).
MODALIASES = {
    "VGA": "pci:v000010DEd00002BB1sv000010DEsd0000204Bbc03sc00i00",
    "3D": "pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00",
    "HD audio": "pci:v000010DEd000022E8sv000010DEsd0000204Bbc04sc03i00",
    "USB": "pci:v000010DEd00001AD6sv000010DEsd000012FCbc0Csc03i30",
    "UCSI": "pci:v000010DEd00001AD7sv000010DEsd000012FCbc0Csc80i00",
    "AMD VGA": "pci:v00001002d0000744Csv00001002sd00000E3Bbc03sc00i00",
    "nothing": "pci:v00001AF4d00001050sv00001AF4sd00001100bc03sc80i00",
}

#: modprobe.d files whose ``alias`` lines kmod reads first: a glob that overrides the modules'
#: own, two exact lines (one without the trailing ``*``, one spelled with ``-``), a bracket and
#: an escaped character, and a line kmod skips (a bracket that does not close).
CONFIGS = {
    "none": {},
    "override": {"/etc/modprobe.d/gpu.conf": "alias pci:v000010DEd*sv*sd*bc03sc0[02]i* nvidia\n"},
    "exact": {
        "/etc/modprobe.d/audio.conf": "alias pci:v000010DEd000022E8* vendor_audio\n"
        "alias pci:v000010DEd000022E8sv000010DEsd0000204Bbc04sc03i00 snd-hda-intel\n"
    },
    "escaped": {"/run/modprobe.d/odd.conf": "alias pci:v0000[!2]002d*\\s?0* odd_amd\n"},
    "skipped": {"/etc/modprobe.d/broken.conf": "alias pci:v000010DE[d* broken\n"},
}


@pytest.fixture(params=KMODS, ids=str)
def kmod(request: pytest.FixtureRequest) -> Kmod:
    """Each kmod in turn: the system's and every Proxmox VE release's (tests/kmod/versions.toml)."""
    chosen: Kmod = request.param
    return chosen


def _modules(kernel: str = KERNEL) -> list[Module]:
    """The GPU drivers of the binding tests, the two the fixed table misses, and a vendor's
    out-of-tree module that names one device exactly."""
    vendor = module_with_aliases(
        kernel, "updates/vendor_gpu.ko", "pci:v000010DEd00002BB1sv*sd*bc*sc*i*"
    )
    return [*gpu_modules(kernel), *drivers_tables_miss(kernel), vendor]


def _own_aliases(directory: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """What depmod wrote to ``modules.alias``, and the built-in aliases, as ``(alias, module)``."""
    own = [
        (words[1], words[2])
        for words in map(str.split, (directory / "modules.alias").read_text().splitlines())
        if words[:1] == ["alias"]
    ]
    entries = (directory / "modules.builtin.modinfo").read_bytes().split(b"\0")
    builtin = [
        (alias, module)
        for module, _, alias in (e.decode().partition(".alias=") for e in entries if e)
    ]
    return own, builtin


def _indexes_builtin(kmod: Kmod) -> bool:
    """Whether ``kmod``'s depmod indexes the built-in modules' aliases: kmod 28's writes
    ``modules.builtin.alias.bin`` empty (fixed in 29 by kmod's commit f0a1360, "depmod: fix
    modules.builtin.alias.bin output"), so there kmod finds no built-in module by its alias
    (the module, in the kernel, takes the function all the same)."""
    return int(kmod.version.split(".")[0]) >= 29


def test_the_lookup_finds_what_the_real_modprobe_resolves(kmod: Kmod, tmp_path: Path) -> None:
    """Each function's modalias against each config: the modules kmod's lookup returns, by a
    modprobe.d alias (which overrides everything), ``modules.alias`` or a built-in module's."""
    root = tmp_path / "host"
    directory = build_tree(kmod, root, KERNEL, _modules(), XHCI_BUILTIN)
    own, builtin = _own_aliases(directory)
    indexed = builtin if _indexes_builtin(kmod) else []
    seen: set[frozenset[str]] = set()
    for config, files in CONFIGS.items():
        write_files(root, dict.fromkeys(f for c in CONFIGS.values() for f in c))
        write_files(root, dict(files))
        for kind, modalias in MODALIASES.items():
            found = lookup_modalias(modalias, KmodConfig.of(files, KERNEL), own, indexed)
            real = resolve_alias(kmod, root, KERNEL, modalias)
            assert {r.module for r in found} == real, (config, kind, found)
            seen.add(frozenset(real))
    # The cases are not vacuous: each source answered somewhere.
    assert {"nova_core", "nouveau", "nvidia", "vendor_gpu"} in seen
    assert {"nvidia"} in seen and {"vendor_audio", "snd_hda_intel"} in seen
    assert ({"xhci_pci"} in seen) == _indexes_builtin(kmod)
    assert {"odd_amd"} in seen and set() in seen


def _usb_c(root: Path) -> None:
    """Give the ct200 tree's GPU at :data:`USB_C_SLOT` a USB-C controller: an xHCI function on
    the built-in xhci_hcd and a UCSI function on i2c-nvidia-gpu's driver, nvidia-gpu."""
    parent = "devices/pci0000:80/0000:80:01.1"
    audio = root / "sys" / parent / f"{USB_C_SLOT}.1"
    for number, (device, cls, driver, module) in enumerate(
        (("1ad6", "0c0330", "xhci_hcd", None), ("1ad7", "0c8000", "nvidia-gpu", "i2c_nvidia_gpu")),
        start=2,
    ):
        address = f"{USB_C_SLOT}.{number}"
        function = root / "sys" / parent / address
        shutil.copytree(audio, function, symlinks=True)
        (function / "device").write_text(f"0x{device}\n")
        (function / "class").write_text(f"0x{cls}\n")
        (function / "subsystem_device").write_text("0x12fc\n")
        modalias = f"pci:v000010DEd0000{device.upper()}sv000010DEsd000012FC"
        (function / "modalias").write_text(f"{modalias}bc{cls[:2].upper()}sc{cls[2:4]}i{cls[4:]}\n")
        (function / "driver").unlink()
        (function / "driver").symlink_to(f"../../../../bus/pci/drivers/{driver}")
        (root / "sys/bus/pci/devices" / address).symlink_to(f"../../../{parent}/{address}")
        drivers = root / "sys/bus/pci/drivers" / driver
        drivers.mkdir(parents=True)
        if module:
            (drivers / "module").symlink_to(f"../../../../module/{module}")


def _host(kmod: Kmod, tmp_path: Path, files: dict[str, str]) -> tuple[Path, Inventory]:
    """A ct200 tree with a USB-C GPU, its module tree indexed by ``kmod``'s depmod, the
    modprobe.d ``files``, and the plan's files written; the host as inspection read it first."""
    root = copy_example(tmp_path)
    _usb_c(root)
    build_tree(kmod, root, KERNEL, _modules(), XHCI_BUILTIN)
    write_files(root, dict(files))
    inventory = inspect(DirectoryHost(str(root)))
    changes = render(inventory, plan_split(inventory, SPLIT))
    write_files(root, {c.path: c.after for c in changes.files})
    return root, replace(inventory, warnings=changes.warnings)


def _inserted(lines: list[str]) -> list[str]:
    """The modules ``--show-depends`` would insert, in order, as kmod names them."""
    return [
        normalize(line.split()[1].rsplit("/", 1)[1].split(".ko")[0])
        for line in lines
        if line.startswith("insmod ")
    ]


def _vfio_first(lines: list[str], module: str) -> bool:
    hook = next((n for n, line in enumerate(lines) if line.startswith(HOOK)), None)
    inserts = [n for n, line in enumerate(lines) if line.startswith("insmod ")]
    at = dict(zip(_inserted(lines), inserts, strict=True)).get(module)
    return hook is not None and at is not None and hook < at


@pytest.mark.parametrize("config", ["none", "override"])
def test_vfio_pci_loads_before_every_module_udev_loads_for_a_moved_function(
    kmod: Kmod, tmp_path: Path, config: str
) -> None:
    """For each moved function, by its modalias as udev asks: vfio-pci (through proxgpu's hook)
    before every module kmod resolves; a built-in one is warned about, as nothing can come
    before it. Every module whose own alias matches also gets vfio-pci first when it is loaded
    by name, even where a modprobe.d alias keeps udev from loading it by the modalias."""
    root, inventory = _host(kmod, tmp_path, CONFIGS[config])
    known = inventory.gpu_functions
    moved = [
        a for g in plan_split(inventory, SPLIT).groups if g.role.moves_to_vfio for a in g.functions
    ]
    own, _ = _own_aliases(root / "lib/modules" / KERNEL)
    resolved: set[str] = set()
    for address in moved:
        modalias = known[address].modalias
        assert modalias is not None, address
        found = resolve_alias(kmod, root, KERNEL, modalias)
        lines = show_depends(kmod, root, KERNEL, modalias) if found else []
        for module in found:
            resolved.add(module)
            if f"builtin {module}" not in lines:
                assert _vfio_first(lines, module), (address, module, lines)
        for own_alias in matching_aliases(modalias, own, "modules.alias"):
            by_name = show_depends(kmod, root, KERNEL, own_alias.module)
            assert _vfio_first(by_name, own_alias.module), (address, own_alias.module, by_name)
    conf = (root / MODPROBE_CONF.lstrip("/")).read_text()
    assert "softdep nova_core pre: vfio-pci" in conf
    assert "softdep i2c_nvidia_gpu pre: vfio-pci" in conf
    expected = {"nvidia", "snd_hda_intel", "i2c_nvidia_gpu"}
    expected |= {"nova_core", "nouveau", "vendor_gpu"} if config == "none" else set()
    assert resolved == expected | ({"xhci_pci"} if _indexes_builtin(kmod) else set())
    # Built in, the xHCI driver takes the function at boot whatever kmod finds: the plan says so.
    usb = f"{USB_C_SLOT}.2: xhci_pci, built into kernel {KERNEL}, would take it"
    assert any(w.startswith(usb) for w in inventory.warnings), inventory.warnings


def test_inspect_names_the_modules_from_the_hosts_aliases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = _host(KMODS[0], tmp_path, {})
    assert main(["inspect", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "softdep kmod uses for nova_core: /etc/modprobe.d/00-proxgpu-vfio.conf:" in out
    assert "softdep kmod uses for i2c_nvidia_gpu: /etc/modprobe.d/00-proxgpu-vfio.conf:" in out
    assert f"built into {KERNEL}: xhci_pci (takes {USB_C_SLOT}.2)" in out
    assert f"built into the kernel: xhci_hcd (takes {USB_C_SLOT}.2)" in out
    assert "modalias or modules.alias not read" not in out


def test_a_snapshot_keeps_the_aliases_that_matter_and_reads_back_the_same(
    tmp_path: Path,
) -> None:
    """Of a real, whole ``modules.alias`` (depmod's, with its other buses' lines) and built-in
    modinfo, a snapshot keeps only the lines that find a module for a GPU's function: a
    ``modules.alias`` still, and a modinfo of NUL-ended strings; read again, they give the
    same inventory."""
    root, first = _host(KMODS[0], tmp_path, {})
    directory = root / "lib/modules" / KERNEL
    with (directory / "modules.alias").open("a") as whole:
        whole.write("alias usb:v1D6Bp0003d*dc*dsc*dp*ic09isc*ip*in* hub\n")
    modinfo = directory / "modules.builtin.modinfo"
    modinfo.write_bytes(modinfo.read_bytes() + b"ext4.alias=fs-ext4\0ext4.license=GPL\0")
    snap = tmp_path / "snap"
    write_tree(gather(DirectoryHost(str(root))), str(snap))
    kept = (snap / "lib/modules" / KERNEL / "modules.alias").read_text().splitlines()
    assert kept[0] == ALIAS_LIST and not any("usb:" in line for line in kept)
    assert "alias pci:v000010DEd*sv*sd*bc03sc00i* nova_core" in kept
    assert "alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci" not in kept
    copied = (snap / "lib/modules" / KERNEL / "modules.builtin.modinfo").read_bytes()
    assert copied == f"{ALIAS_LIST}\0xhci_pci.alias=pci:v*d*sv*sd*bc0Csc03i30*\0".encode()
    again = inspect(DirectoryHost(str(snap)))
    assert again.kernel_modules == first.kernel_modules
    assert again.kernel_modules[KERNEL].builtin_aliases


def test_the_gathers_filter_keeps_every_alias_that_can_match(tmp_path: Path) -> None:
    """The gather script keeps a ``modules.alias`` line by a cheaper test than kmod's; over
    thousands of globs made to come close to the GPUs' modaliases (wildcards, brackets,
    escapes, other vendors and buses), it never drops one that proxgpu's model of kmod matches
    to one of them, so the filter can only keep too much, never miss a driver."""
    root = copy_example(tmp_path)
    inventory = inspect(DirectoryHost(str(root)))
    names = sorted({f.modalias for g in inventory.gpus for f in g.function_info if f.modalias})
    rng = random.Random(19)
    pieces = ["*", "?", "[0-9A-F]", "[!1]", "\\D", "[", "]", "-", "pci:", "usb:", "v", "d", "i"]
    globs = []
    for _ in range(3000):
        name = rng.choice(names)
        cut = sorted(rng.sample(range(len(name) + 1), 2))
        middle = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 3)))
        globs.append(name[: cut[0]] + middle + name[cut[1] :])
    lines = [f"alias {glob} mod{n}" for n, glob in enumerate(globs)]
    directory = root / "lib/modules" / KERNEL
    (directory / "modules.alias").write_text("".join(f"{line}\n" for line in lines))
    kept = set(inspect(DirectoryHost(str(root))).kernel_modules[KERNEL].aliases)
    pairs = [(glob, f"mod{n}") for n, glob in enumerate(globs)]
    matched = {r.module for name in names for r in matching_aliases(name, pairs, "modules.alias")}
    assert matched, "the globs never came close"
    assert matched <= {alias.module for alias in kept}
    assert all(alias_normalize(a.alias) is not None or a.module not in matched for a in kept)


@pytest.mark.parametrize("unread", ["modalias", "modules.alias"])
def test_a_snapshot_from_before_says_once_that_proxgpus_table_stood_in(
    tmp_path: Path, unread: str
) -> None:
    """A tree captured before proxgpu read the modaliases, or the kernels' aliases, plans as
    before, from proxgpu's table of drivers by vendor and class, and the plan says so once."""
    root = copy_example(tmp_path)
    where = "sys/devices/**" if unread == "modalias" else "lib/modules/*"
    for path in root.glob(f"{where}/{unread}"):
        path.unlink()
    inventory = inspect(DirectoryHost(str(root)))
    changes = render(inventory, plan_split(inventory, SPLIT))
    said = [w for w in changes.warnings if "modules.alias was not read" in w]
    assert len(said) == 1, changes.warnings
    assert said[0].startswith("0000:81:00.0, 0000:81:00.1, 0000:91:00.0")
    assert "(nouveau, nvidia, snd_hda_intel)" in said[0]
    conf = next(c.after for c in changes.files if c.path == MODPROBE_CONF) or ""
    softdeps = [line.split()[1] for line in conf.splitlines() if line.startswith("softdep ")]
    assert softdeps == ["nouveau", "nvidia", "snd_hda_intel"]
