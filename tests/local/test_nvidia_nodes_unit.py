"""The systemd unit and script that make the container's NVIDIA device nodes before guests start.

The script runs here for real, under a directory standing in for ``/`` (``PROXGPU_ROOT``, with
a ``/proc/devices`` of that "boot"), as root, so that its ``mknod`` makes real nodes. Where the
host has nvidia-modprobe, a stand-in does what NVIDIA documents for each option (``-c N`` makes
``/dev/nvidiaN``, N 255 ``/dev/nvidiactl``; ``-u -c 0`` loads nvidia-uvm and makes its two
nodes; ``-m`` makes ``/dev/nvidia-modeset``; ``-f FILE`` the capability node whose minor FILE
names), and a stand-in ``modprobe`` records the modules loaded. systemd's own
``systemd-analyze verify`` checks the unit files, and shellcheck the script.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from proxgpu.apply import ApplyOptions, rollback
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.pipeline import split_host
from proxgpu.planning import SplitPolicy, plan_split
from proxgpu.pve.config import GuestConfig
from proxgpu.rendering import RenderOptions, render
from proxgpu.rendering.changes import ChangeSet
from proxgpu.rendering.nodes import (
    GUESTS_DROPIN,
    HA_DROPIN,
    NODES_SCRIPT,
    NODES_UNIT,
    NODES_UNIT_NAME,
    SHARED_RULES,
    rules_file,
)
from tests.support.tools import require_tool
from tests.support.trees import copy_example

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hosts"
CT_200 = "/etc/pve/lxc/200.conf"
WITH_UNIT = RenderOptions(nvidia_nodes_unit=True)
UNIT_FILES = (NODES_UNIT, NODES_SCRIPT, GUESTS_DROPIN, HA_DROPIN)
# NVIDIA's MIG capabilities as /proc/driver/nvidia/capabilities/mig/* read (nv-caps.c prints
# DeviceFileMode in decimal: 256 is 0400, 292 is 0444).
MIG_CAPS = {"config": (1, 256), "monitor": (2, 292)}
NVIDIA_MODPROBE_STUB = """\
#!/bin/sh
echo "$*" >> "$PROXGPU_ROOT/nvidia-modprobe.log"
dev=$PROXGPU_ROOT/dev
case "$1" in
-c) if [ "$2" = 255 ]; then name=nvidiactl; else name=nvidia$2; fi
    mknod -m 666 "$dev/$name" c 195 "$2" ;;
-u) mknod -m 666 "$dev/nvidia-uvm" c 511 0 && mknod -m 666 "$dev/nvidia-uvm-tools" c 511 1 ;;
-m) mknod -m 666 "$dev/nvidia-modeset" c 195 254 ;;
-f) minor=$(awk '$1 == "DeviceFileMinor:" { print $2 }' "$2")
    mkdir -p "$dev/nvidia-caps"
    mknod -m 400 "$dev/nvidia-caps/nvidia-cap$minor" c 508 "$minor" ;;
esac
"""


@cache
def ct200() -> Inventory:
    return inspect(DirectoryHost(str(EXAMPLES / "ct200")))


def with_mig(tmp_path: Path, pve_container: str | None = None) -> Inventory:
    """ct200 as inspected with MIG's capability nodes and their /proc files, and, when given, a
    dpkg status naming that pve-container version."""
    root = copy_example(tmp_path, dest="ct200-mig")
    (root / "dev/nvidia-caps").mkdir()
    for name, (minor, mode) in MIG_CAPS.items():
        (root / f"dev/nvidia-caps/nvidia-cap{minor}").touch()
        proc = root / "proc/driver/nvidia/capabilities/mig" / name
        proc.parent.mkdir(parents=True, exist_ok=True)
        proc.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
    if pve_container:
        status = root / "var/lib/dpkg/status"
        status.parent.mkdir(parents=True)
        status.write_text(
            "Package: pve-cluster\nStatus: install ok installed\nVersion: 8.0.7\n\n"
            "Package: pve-container\nStatus: install ok installed\nPriority: optional\n"
            f"Version: {pve_container}\n\n"
        )
    return inspect(DirectoryHost(str(root)))


def rendered(policy: SplitPolicy, inventory: Inventory | None = None) -> ChangeSet:
    inventory = inventory or ct200()
    return render(inventory, plan_split(inventory, policy), WITH_UNIT)


def text(changes: ChangeSet, path: str) -> str | None:
    return next((f.after for f in changes.files if f.path == path), None)


def given_nodes(changes: ChangeSet) -> set[str]:
    config = GuestConfig.parse(text(changes, CT_200) or "")
    devs = {v.split(",")[0] for k, v in config.entries() if re.fullmatch(r"dev\d+", k)}
    mounts = {v.split()[0] for k, v in config.entries() if k == "lxc.mount.entry"}
    return devs | mounts


def boot_root(tmp_path: Path, nvidia_modprobe: bool, uvm_major: int = 511) -> Path:
    """A directory standing in for / at boot: /proc/devices (nvidia-uvm at ``uvm_major``),
    NVIDIA's params and MIG capability files, an empty /dev, and nvidia-modprobe if asked."""
    root = tmp_path / "boot"
    devices = (EXAMPLES / "ct200/proc/devices").read_text()
    (root / "proc/driver/nvidia/capabilities/mig").mkdir(parents=True)
    (root / "proc/devices").write_text(devices.replace("511 nvidia-uvm", f"{uvm_major} nvidia-uvm"))
    (root / "proc/driver/nvidia/params").write_text(
        "ResmanDebugLevel: 4294967295\nDeviceFileUID: 0\nDeviceFileGID: 0\n"
        "DeviceFileMode: 438\nModifyDeviceFiles: 1\n"
    )
    for name, (minor, mode) in MIG_CAPS.items():
        (root / "proc/driver/nvidia/capabilities/mig" / name).write_text(
            f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"
        )
    (root / "dev").mkdir()
    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "modprobe").write_text('#!/bin/sh\necho "$1" >> "$PROXGPU_ROOT/modprobe.log"\n')
    (bin_dir / "modprobe").chmod(0o755)
    if nvidia_modprobe:
        (bin_dir / "nvidia-modprobe").write_text(NVIDIA_MODPROBE_STUB)
        (bin_dir / "nvidia-modprobe").chmod(0o755)
    return root


def run_script(changes: ChangeSet, root: Path) -> subprocess.CompletedProcess[str]:
    """Run the rendered script as the unit would, against ``root``."""
    if os.geteuid() != 0:
        pytest.skip("the script's mknod needs root")
    script = root / "proxgpu-nvidia-nodes"
    script.write_text(text(changes, NODES_SCRIPT) or "")
    path = f"{root}/usr/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {"PATH": path, "PROXGPU_ROOT": str(root)}
    return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, check=False)


def made(root: Path) -> dict[str, tuple[int, int, int]]:
    """Each character device under ``root``/dev: its major, minor and permission bits."""
    nodes = {}
    for path in (root / "dev").rglob("*"):
        info = path.lstat()
        if stat.S_ISCHR(info.st_mode):
            numbers = (os.major(info.st_rdev), os.minor(info.st_rdev))
            nodes["/" + str(path.relative_to(root))] = (*numbers, stat.S_IMODE(info.st_mode))
    return nodes


# --- the nodes it makes --------------------------------------------------------------------------


@pytest.mark.parametrize("nvidia_modprobe", [True, False], ids=["nvidia-modprobe", "mknod"])
@pytest.mark.parametrize(
    "policy",
    [SplitPolicy(lxc=200), SplitPolicy(lxc=200, host_nodes=[1], vfio_nodes=[0])],
    ids=["same-minors", "renumbered-minors"],
)
def test_the_script_makes_every_nvidia_node_the_container_is_given(
    tmp_path: Path, policy: SplitPolicy, nvidia_modprobe: bool
) -> None:
    changes = rendered(policy, with_mig(tmp_path))
    root = boot_root(tmp_path, nvidia_modprobe)
    result = run_script(changes, root)
    assert result.returncode == 0, result.stderr
    given = given_nodes(changes)
    assert "/dev/nvidia-caps/nvidia-cap1" in given
    assert set(made(root)) == given


def test_without_nvidia_modprobe_the_nodes_get_nvidia_s_numbers_and_modes(tmp_path: Path) -> None:
    changes = rendered(SplitPolicy(lxc=200), with_mig(tmp_path))
    root = boot_root(tmp_path, nvidia_modprobe=False, uvm_major=500)
    # A node left from a boot where nvidia-uvm had another major is made again.
    os.mknod(root / "dev/nvidia-uvm", 0o600 | stat.S_IFCHR, os.makedev(511, 0))
    assert run_script(changes, root).returncode == 0
    nodes = made(root)
    assert nodes["/dev/nvidia0"] == (195, 0, 0o666)
    assert nodes["/dev/nvidiactl"] == (195, 255, 0o666)
    assert nodes["/dev/nvidia-uvm"] == (500, 0, 0o666)
    assert nodes["/dev/nvidia-uvm-tools"] == (500, 1, 0o666)
    assert nodes["/dev/nvidia-caps/nvidia-cap1"] == (508, 1, 0o400), "MIG config: root only"
    assert nodes["/dev/nvidia-caps/nvidia-cap2"] == (508, 2, 0o444)
    modules = (root / "modprobe.log").read_text().split()
    assert {"nvidia", "nvidia-uvm", "nvidia-modeset"} <= set(modules)


def test_without_nvidia_modprobe_the_driver_s_own_mode_and_group_hold(tmp_path: Path) -> None:
    changes = rendered(SplitPolicy(lxc=200))
    root = boot_root(tmp_path, nvidia_modprobe=False)
    params = root / "proc/driver/nvidia/params"
    params.write_text(params.read_text().replace("GID: 0", "GID: 44").replace("438", "432"))
    assert run_script(changes, root).returncode == 0
    node = (root / "dev/nvidia0").stat()
    assert (stat.S_IMODE(node.st_mode), node.st_gid) == (0o660, 44)


def test_with_nvidia_modprobe_each_node_is_asked_for_once(tmp_path: Path) -> None:
    changes = rendered(SplitPolicy(lxc=200), with_mig(tmp_path))
    root = boot_root(tmp_path, nvidia_modprobe=True)
    assert run_script(changes, root).returncode == 0
    calls = (root / "nvidia-modprobe.log").read_text().splitlines()
    proc = f"{root}/proc/driver/nvidia/capabilities/mig"
    assert calls == [
        "-c 255",
        *(f"-c {n}" for n in range(4)),
        "-u -c 0",
        "-m",
        f"-f {proc}/config",
        f"-f {proc}/monitor",
    ]
    assert not (root / "modprobe.log").exists(), "nvidia-modprobe loads the modules itself"


def test_a_node_it_cannot_make_fails_the_unit_naming_it(tmp_path: Path) -> None:
    changes = rendered(SplitPolicy(lxc=200), with_mig(tmp_path))
    root = boot_root(tmp_path, nvidia_modprobe=False)
    (root / "proc/driver/nvidia/capabilities/mig/monitor").unlink()
    result = run_script(changes, root)
    assert result.returncode == 1
    assert f"{root}/dev/nvidia-caps/nvidia-cap2 is missing" in result.stderr
    assert "/dev/nvidia-caps/nvidia-cap1" in made(root), "the other nodes are still made"


def test_shellcheck_accepts_the_script(tmp_path: Path) -> None:
    shellcheck = require_tool("shellcheck", "shellcheck")
    for pve_container, name in (("5.2.3", "dev"), ("5.0.6", "raw")):
        script = tmp_path / f"{name}.sh"
        changes = rendered(SplitPolicy(lxc=200), with_mig(tmp_path / name, pve_container))
        script.write_text(text(changes, NODES_SCRIPT) or "")
        result = subprocess.run(
            [shellcheck, str(script)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout


def test_inspection_reads_each_capability_s_minor_and_mode(tmp_path: Path) -> None:
    caps = with_mig(tmp_path).nvidia_caps
    proc = "/proc/driver/nvidia/capabilities/mig"
    assert [(c.proc_path, c.minor, c.mode) for c in caps] == [
        (f"{proc}/config", 1, 0o400),
        (f"{proc}/monitor", 2, 0o444),
    ]


# --- what the container is given -----------------------------------------------------------------


def without_uvm(tmp_path: Path) -> Inventory:
    """ct200 freshly booted: nvidia-uvm not loaded, so neither its major nor its nodes."""
    root = copy_example(tmp_path, dest="ct200-fresh")
    for name in ("nvidia-uvm", "nvidia-uvm-tools"):
        (root / "dev" / name).unlink()
    devices = root / "proc/devices"
    devices.write_text(devices.read_text().replace("511 nvidia-uvm\n", ""))
    return inspect(DirectoryHost(str(root)))


@pytest.mark.parametrize("pve_container", ["5.2.3", "5.0.6"], ids=["devN", "raw"])
def test_a_host_that_has_not_loaded_nvidia_uvm_keeps_the_container_s_uvm_nodes(
    tmp_path: Path, pve_container: str
) -> None:
    inventory = without_uvm(tmp_path)
    changes = rendered(
        SplitPolicy(lxc=200), replace(inventory, pve_container_version=pve_container)
    )
    assert {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= given_nodes(changes)
    root = boot_root(tmp_path, nvidia_modprobe=False)
    assert run_script(changes, root).returncode == 0
    assert "nvidia-uvm" in (root / "modprobe.log").read_text().split()


def test_without_the_unit_a_missing_uvm_node_is_not_given(tmp_path: Path) -> None:
    inventory = without_uvm(tmp_path)
    plan = plan_split(inventory, SplitPolicy(lxc=200))
    changes = render(inventory, plan, RenderOptions(nvidia_nodes_unit=False))
    assert "/dev/nvidia-uvm" not in given_nodes(changes)
    missing = "/dev/nvidia-uvm, /dev/nvidia-uvm-tools missing"
    assert any(w.startswith(missing) for w in changes.warnings)


def test_without_devn_entries_the_unit_writes_the_cgroup_rules_with_this_boot_s_majors(
    tmp_path: Path,
) -> None:
    changes = rendered(SplitPolicy(lxc=200), with_mig(tmp_path, pve_container="5.0.6"))
    config = GuestConfig.parse(text(changes, CT_200) or "")
    raw = [(k, v) for k, v in config.entries() if k.startswith("lxc.")]
    assert ("lxc.include", rules_file(200)) in raw
    assert not [v for k, v in raw if k == "lxc.cgroup2.devices.allow"], "no major fixed at plan"
    assert not [k for k, _ in config.entries() if k.startswith("dev")]
    root = boot_root(tmp_path, nvidia_modprobe=False, uvm_major=500)
    assert run_script(changes, root).returncode == 0
    rules = (root / rules_file(200).lstrip("/")).read_text().splitlines()
    assert "lxc.cgroup2.devices.allow = c 500:0 rwm" in rules
    assert "lxc.cgroup2.devices.allow = c 508:1 rwm" in rules
    assert len(rules) == len(given_nodes(changes)) == len(made(root))


@pytest.mark.parametrize(
    ("pve_container", "pve_manager", "dev_entries"),
    [
        ("5.0.6", "8.4.1", False),  # pve-container decides, not pve-manager
        ("5.0.7", "8.0.4", True),
        (None, "8.2.4", True),  # requires pve-container >= 5.1.11
        (None, "8.1.3", False),  # accepts pve-container 5.0.5
    ],
)
def test_devn_entries_where_pve_container_parses_them(
    tmp_path: Path, pve_container: str | None, pve_manager: str, dev_entries: bool
) -> None:
    inventory = replace(with_mig(tmp_path, pve_container), pve_version=pve_manager)
    assert inventory.pve_container_version == pve_container
    config = GuestConfig.parse(text(rendered(SplitPolicy(lxc=200), inventory), CT_200) or "")
    assert any(re.fullmatch(r"dev\d+", k) for k, _ in config.entries()) is dev_entries


# --- the unit ------------------------------------------------------------------------------------


def test_both_guest_starters_pull_the_unit_in_and_wait_for_it() -> None:
    changes = rendered(SplitPolicy(lxc=200))
    unit = text(changes, NODES_UNIT)
    assert unit is not None
    assert re.search(r"^Before=pve-guests\.service pve-ha-lrm\.service$", unit, re.MULTILINE)
    assert re.search(rf"^ExecStart={re.escape(NODES_SCRIPT)}$", unit, re.MULTILINE)
    for dropin, service in ((GUESTS_DROPIN, "pve-guests"), (HA_DROPIN, "pve-ha-lrm")):
        assert dropin.startswith(f"/etc/systemd/system/{service}.service.d/")
        text_of = text(changes, dropin) or ""
        assert re.search(rf"^Wants={re.escape(NODES_UNIT_NAME)}$", text_of, re.MULTILINE)
        assert re.search(rf"^After={re.escape(NODES_UNIT_NAME)}$", text_of, re.MULTILINE)
    assert ["systemctl", "daemon-reload"] in [a.argv for a in changes.actions]
    assert next(f.mode for f in changes.files if f.path == NODES_SCRIPT) == 0o755


def test_the_unit_runs_at_once_where_no_reboot_will_run_it() -> None:
    rebooting = rendered(SplitPolicy(lxc=200))
    staying = rendered(SplitPolicy(lxc=200, host_nodes=[0, 1]))
    restart = ["systemctl", "restart", NODES_UNIT_NAME]
    assert rebooting.reboot_required and restart not in [a.argv for a in rebooting.actions]
    assert not staying.reboot_required
    assert [a.argv for a in staying.actions][-2:] == [["systemctl", "daemon-reload"], restart]


def test_the_unit_is_written_unless_turned_off() -> None:
    inventory = ct200()
    plan = plan_split(inventory, SplitPolicy(lxc=200))
    assert set(UNIT_FILES) <= {f.path for f in render(inventory, plan).files}
    off = render(inventory, plan, RenderOptions(nvidia_nodes_unit=False))
    assert set(UNIT_FILES).isdisjoint(f.path for f in off.files)


def test_a_container_left_without_nvidia_gpus_loses_the_unit() -> None:
    first = rendered(SplitPolicy(lxc=200))
    written = {path: text(first, path) or "" for path in UNIT_FILES}
    # As inspection sees the host once the unit is there and the GPUs moved to another driver.
    gpus = [replace(g, driver="amdgpu") for g in ct200().gpus]
    files = {**ct200().host_files, **written}
    inventory = replace(ct200(), host_files=files, gpus=gpus)
    changes = rendered(SplitPolicy(lxc=200, host_gpus=["0000:01:00.0"]), inventory)
    assert [text(changes, path) for path in UNIT_FILES] == [None] * len(UNIT_FILES)


def test_systemd_accepts_the_unit_and_the_dropins(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze", "systemd")
    root = tmp_path / "root"
    changes = rendered(SplitPolicy(lxc=200))
    for path in UNIT_FILES:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text(changes, path) or "")
    (root / NODES_SCRIPT.lstrip("/")).chmod(0o755)
    units = root / "usr/lib/systemd/system"
    units.mkdir(parents=True)
    for target in Path("/usr/lib/systemd/system").glob("*.target"):
        shutil.copy(target, units)
    for service, tool in (("pve-guests", "pvesh"), ("pve-ha-lrm", "pve-ha-lrm")):
        (units / f"{service}.service").write_text(
            f"[Unit]\nDescription={service}\n[Service]\nType=oneshot\nExecStart=/usr/bin/{tool}\n"
        )
        stub = root / "usr/bin" / tool
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    for unit in (NODES_UNIT_NAME, "pve-guests.service", "pve-ha-lrm.service"):
        result = subprocess.run(
            [analyze, "verify", f"--root={root}", unit],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "proxgpu" not in result.stderr, result.stderr


def test_rollback_removes_what_an_apply_wrote(tmp_path: Path) -> None:
    root = tmp_path / "ct200"
    shutil.copytree(EXAMPLES / "ct200", root, symlinks=True)
    host = DirectoryHost(str(root))
    split_host(host, SplitPolicy(lxc=200), WITH_UNIT, how=ApplyOptions())
    files = [root / path.lstrip("/") for path in UNIT_FILES]
    assert all(f.is_file() for f in files)
    assert (root / NODES_SCRIPT.lstrip("/")).stat().st_mode & 0o777 == 0o755
    rollback(host)
    assert not any(f.exists() for f in files)
    for dropin in (GUESTS_DROPIN, HA_DROPIN):
        assert not (root / dropin.lstrip("/")).parent.exists(), "drop-in directories made go too"


# --- MIG instances -------------------------------------------------------------------------------

MIG_TWO = SplitPolicy.model_validate(
    {"lxc_mig": [{"vmid": 200, "gpu": "0", "gi": 2}, {"vmid": 201, "gpu": "0", "gi": 3, "ci": 1}]}
)


def mig_boot_root(tmp_path: Path) -> Path:
    """A boot of the ``mig`` example host: its /proc/devices and NVIDIA /proc files (the MIG
    instances made again before the unit runs), an empty /dev, no nvidia-modprobe."""
    root = boot_root(tmp_path, nvidia_modprobe=False)
    shutil.copy(EXAMPLES / "mig/proc/devices", root / "proc/devices")
    shutil.rmtree(root / "proc/driver/nvidia/capabilities")
    shutil.copytree(
        EXAMPLES / "mig/proc/driver/nvidia/capabilities", root / "proc/driver/nvidia/capabilities"
    )
    return root


def test_the_script_makes_each_containers_mig_instance_nodes_with_nvidias_modes(
    tmp_path: Path,
) -> None:
    inventory = inspect(DirectoryHost(str(EXAMPLES / "mig")))
    changes = rendered(MIG_TWO, inventory)
    root = mig_boot_root(tmp_path)
    result = run_script(changes, root)
    assert result.returncode == 0, result.stderr
    caps = {path: numbers for path, numbers in made(root).items() if "nvidia-caps" in path}
    # 508: nvidia-caps' major in that boot's /proc/devices; 0444 from each access file.
    assert caps == {
        "/dev/nvidia-caps/nvidia-cap21": (508, 21, 0o444),
        "/dev/nvidia-caps/nvidia-cap22": (508, 22, 0o444),
        "/dev/nvidia-caps/nvidia-cap30": (508, 30, 0o444),
        "/dev/nvidia-caps/nvidia-cap32": (508, 32, 0o444),
    }
    assert {"/dev/nvidia0", "/dev/nvidiactl"} <= set(made(root))


def test_the_script_fails_naming_an_instance_not_made_again_at_boot(tmp_path: Path) -> None:
    inventory = inspect(DirectoryHost(str(EXAMPLES / "mig")))
    changes = rendered(MIG_TWO, inventory)
    root = mig_boot_root(tmp_path)
    shutil.rmtree(root / "proc/driver/nvidia/capabilities/gpu0/mig/gi3")
    result = run_script(changes, root)
    assert result.returncode == 1
    assert (
        f"{root}/proc/driver/nvidia/capabilities/gpu0/mig/gi3/ci1/access is missing: a MIG "
        "instance's capability exists only while it does"
    ) in result.stderr
    assert f"{root}/dev/nvidia-caps/nvidia-cap32 is missing" in result.stderr


# --- raw containers: each its own cgroup rules ---------------------------------------------------

RAW_CONTAINER = "arch: amd64\nhostname: {name}\nmemory: 4096\nostype: debian\nrootfs: local:1\n"


def raw_host(tmp_path: Path, vmids: list[int], extra: dict[str, str] | None = None) -> Inventory:
    """ct200 on a pve-container without devN entries, with a container for each of ``vmids`` in
    place of its CT 200, and the ``extra`` files (host files, by path)."""
    inventory = with_mig(tmp_path, pve_container="5.0.6")
    configs = {f"/etc/pve/lxc/{v}.conf": RAW_CONTAINER.format(name=f"ct{v}") for v in vmids}
    kept = {path: text for path, text in inventory.guest_configs.items() if path != CT_200}
    return replace(
        inventory,
        guest_configs={**kept, **configs},
        host_files={**inventory.host_files, **(extra or {})},
    )


def rules_of(root: Path, path: str) -> set[tuple[int, int]]:
    """The (major, minor) of each rule in the rules file ``path`` the script wrote."""
    lines = (root / path.lstrip("/")).read_text().splitlines()
    found = (re.fullmatch(r"lxc\.cgroup2\.devices\.allow = c (\d+):(\d+) rwm", ln) for ln in lines)
    return {(int(m[1]), int(m[2])) for m in found if m is not None}


def test_raw_containers_each_include_rules_for_their_own_nodes_alone(tmp_path: Path) -> None:
    """Two containers of two GPUs each, no devN entries: each config includes a rules file of
    its own, and each file allows that container's GPUs and the control nodes, never the other's
    GPUs (with one shared file, root in either could mknod and open the other's)."""
    policy = SplitPolicy(lxc_subsets=[(117, 2), (4242, 2)])
    changes = rendered(policy, raw_host(tmp_path, [117, 4242]))
    minors: dict[int, set[int]] = {}
    for vmid in (117, 4242):
        config = GuestConfig.parse(text(changes, f"/etc/pve/lxc/{vmid}.conf") or "")
        assert [v for k, v in config.entries() if k == "lxc.include"] == [rules_file(vmid)]
        mounts = [v.split()[0] for k, v in config.entries() if k == "lxc.mount.entry"]
        minors[vmid] = {int(p[len("/dev/nvidia") :]) for p in mounts if p[11:].isdigit()}
    assert len(minors[117]) == len(minors[4242]) == 2
    assert not minors[117] & minors[4242]
    root = boot_root(tmp_path, nvidia_modprobe=False)
    assert run_script(changes, root).returncode == 0
    for vmid, other in ((117, 4242), (4242, 117)):
        allowed = rules_of(root, rules_file(vmid))
        assert {(195, minor) for minor in minors[vmid]} | {(195, 255), (511, 0)} <= allowed
        assert not {(195, minor) for minor in minors[other]} & allowed, f"CT {vmid}"
    assert not (root / SHARED_RULES.lstrip("/")).exists()


def test_a_container_still_on_the_shared_rules_file_keeps_only_its_own_rules_there(
    tmp_path: Path,
) -> None:
    """A unit written before rules files were each container's own (one ``set --`` list) made
    CT 905's nodes, and CT 905 still includes the shared file; planning CT 117 alone gives CT
    117 its own file, keeps making CT 905's nodes, and the shared file now holds CT 905's rules
    only, with a warning that says how to give it its own."""
    old_unit = "set -- \\\n    nvidia2 \\\n    nvidia3 \\\n    nvidiactl\nfor node; do\n"
    inventory = raw_host(tmp_path, [117], {NODES_SCRIPT: old_unit})
    legacy = (
        RAW_CONTAINER.format(name="legacy") + f"lxc.include: {SHARED_RULES}\n"
        "lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file\n"
        "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file\n"
    )
    configs = {**inventory.guest_configs, "/etc/pve/lxc/905.conf": legacy}
    inventory = replace(inventory, guest_configs=configs)
    changes = rendered(SplitPolicy(lxc_subsets=[(117, 1)]), inventory)
    assert text(changes, "/etc/pve/lxc/905.conf") in (None, legacy), "CT 905 is left as it is"
    assert any(f"CT 905 still includes {SHARED_RULES}" in w for w in changes.warnings)
    root = boot_root(tmp_path, nvidia_modprobe=False)
    assert run_script(changes, root).returncode == 0
    assert rules_of(root, SHARED_RULES) == {(195, 2), (195, 255)}
    assert (195, 2) not in rules_of(root, rules_file(117))
