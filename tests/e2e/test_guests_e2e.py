"""The guests start after ``apply`` and a cold reboot, with the real tools a Proxmox host uses.

One apply (``--lxc 200:2 --lxc 201:2 --vm 300``) and one cold reboot serve the module; it ends
with a rollback and a cold reboot, after which every GPU is on its old driver again, as the other
modules expect the host.

* CTs 200 and 201, two GPUs of node 0 each, run side by side in Debian's LXC from the
  configuration Proxmox would give them (the test-side model in ``pve_guests.py``, with its
  sources), in the raw ``lxc.*`` lines written for Proxmox VE before 8.1 (the test host has no
  pve-container); CT 200 also in the ``devN:`` entries planned once a pve-container that has
  them is installed. Inside each, as uid 1000, its GPUs' nodes open and no other GPU's does; as
  root, a node it makes of the other container's GPU does not open (the device cgroup, from the
  rules file the boot unit writes for that container alone); its cpuset is node 0's CPUs.
  Each holds a stand-in of NVIDIA's user space (``nvidia-smi``, beside this file, and the
  library link naming its version): CT 200 the stand-in module's version, CT 201 another one.
  ``proxgpu verify`` looks from inside both: CT 200 lists exactly its GPUs; CT 201 is drift,
  naming both versions, until it holds the module's version too.
* VM 300's ``hostpciN`` entries become QEMU's ``-device vfio-pci`` arguments as qemu-server's
  ``vm_commandline`` writes them (the harness's ``qemu-start --print-cmd``), and the test
  host's own QEMU opens every function with them: VFIO lets it only when the function's whole
  IOMMU group is on vfio-pci; ``proxgpu verify`` finds it holding every group the plan gives
  VM 300, as qemu-server's pidfile names it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.pvevalidate import STORAGE_CFG, proxmox_sources, pve_check_command

from .cli import proxgpu
from .phases import phase
from .pve_guests import (
    NodeStat,
    autodev_hook,
    lxc_config,
    passthrough_devices,
    prestart_hook,
    vfio_devices,
)
from .test_cli_e2e import assert_original
from .testhost import QemuTestHost

pytestmark = pytest.mark.e2e

NODE0 = [f"0000:{bus:02x}:00.0" for bus in (0x21, 0x22, 0x23, 0x24)]
NODE1 = [f"0000:{bus:02x}:00.0" for bus in (0x81, 0x82, 0x83, 0x84)]
CT = "/etc/pve/lxc/{vmid}.conf"
VM = "/etc/pve/qemu-server/300.conf"
CT_CONFIG = (
    "arch: amd64\nhostname: inference{vmid}\nmemory: 256\nostype: debian\n"
    "rootfs: local:{vmid}/vm-{vmid}-disk-0.raw,size=1G\n"
)
#: The two containers of the split, two GPUs of node 0 each.
CONTAINERS = (200, 201)
SPLIT_OPTIONS = ["--lxc", "200:2", "--lxc", "201:2", "--vm", "300"]
#: The root file system the image holds for CT 200 (guest/build-image.sh); CT 201 gets a copy.
CT_ROOTFS = "/var/lib/lxc/{vmid}/rootfs"
VM_CONFIG = "machine: q35\nmemory: 256\nname: train\nostype: l26\n"
# A pve-container with devN entries (5.0.7 and later, proxgpu/pve/versions.py): a stand-in
# dpkg status paragraph, as the test host has no Proxmox package; proxgpu reads only these lines.
PVE_CONTAINER = "Package: pve-container\nStatus: install ok installed\nVersion: 6.0.9\n"
DPKG_STATUS = "/var/lib/dpkg/status"
# qemu-server's machine file, which vm_commandline names with -readconfig.
# qemu-server's machine configs (-readconfig), in the pinned sources (tests/proxmox/sources.toml).
PVE_Q35 = Path("qemu-server") / "src" / "usr"
CT_USER = "1000:1000"  # gpu in the container's /etc/passwd (guest/build-image.sh)
QMP_PORT = 4444
LXC_LOG = "/run/lxc-{vmid}.log"
#: The stand-in module's version (guest/nvidia-standin/nvidia.c), and another one.
MODULE_VERSION, OTHER_VERSION = "595.45.04", "590.48.01"
#: The stand-in for NVIDIA's nvidia-smi that the containers hold (see the file).
STANDIN_SMI = Path(__file__).with_name("nvidia-smi")
LIBS = "usr/lib/x86_64-linux-gnu"
#: Where qemu-server's QEMU writes its PID (vm_pidfile_name in PVE/QemuServer/Helpers.pm).
VM_PIDFILE = "/var/run/qemu-server/300.pid"


@dataclass(frozen=True)
class Split:
    """The applied split after its cold reboot: the rendered guest configs (the containers' by
    VMID) and node 0's CPUs."""

    containers: dict[int, str]
    vm: str
    node0_cpus: str


def give_user_space(host: QemuTestHost, vmid: int, version: str) -> None:
    """Put the stand-in NVIDIA user space of ``version`` into container ``vmid``'s root file
    system, as NVIDIA's installer lays out its library (the link naming the version)."""
    rootfs = CT_ROOTFS.format(vmid=vmid)
    write(host, f"{rootfs}/usr/bin/nvidia-smi", STANDIN_SMI.read_text(), "755")
    lib = f"libnvidia-ml.so.{version}"
    run_ok(host, f"cd {rootfs} && mkdir -p {LIBS} && cd {LIBS} && rm -f libnvidia-ml.so.* && "
           f": > {lib} && ln -s {lib} libnvidia-ml.so.1")  # fmt: skip


def run_ok(host: QemuTestHost, script: str, stdin: str = "", timeout: float = 120) -> str:
    rc, out, err = host.ssh(["sh", "-c", script], timeout=timeout, stdin=stdin.encode())
    assert rc == 0, f"{script} exited {rc}: {out}{err}"
    return out


def write(host: QemuTestHost, path: str, text: str, mode: str = "644") -> None:
    quoted = shlex.quote(path)
    run_ok(host, f"mkdir -p $(dirname {quoted}) && cat > {quoted} && chmod {mode} {quoted}", text)


@pytest.fixture(scope="module")
def split(testhost: QemuTestHost, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    tmp = tmp_path_factory.mktemp("guests")
    # A host whose NVIDIA user space has not run since its boot has no /dev/nvidia* node: the
    # plan then gives the container every control node, nvidia-modeset's among them (the tests
    # before on this host may have made some).
    run_ok(testhost, "rm -f /dev/nvidia*")
    for vmid in CONTAINERS:
        write(testhost, CT.format(vmid=vmid), CT_CONFIG.format(vmid=vmid))
    rootfs = CT_ROOTFS.format(vmid=201)
    run_ok(
        testhost,
        f"rm -rf {rootfs} && mkdir -p {rootfs} && cp -a {CT_ROOTFS.format(vmid=200)}/. {rootfs}",
    )
    give_user_space(testhost, 200, MODULE_VERSION)
    give_user_space(testhost, 201, OTHER_VERSION)
    write(testhost, VM, VM_CONFIG)
    # The test host has no Proxmox API to ask whether the guests run.
    applied = proxgpu(testhost, tmp, "apply", "--yes", *SPLIT_OPTIONS, "--skip-guest-check")
    try:
        assert applied.returncode == 0, applied.stdout + applied.stderr
        testhost.reboot()
        inventory = proxgpu(testhost, tmp, "inspect", "--json")
        assert inventory.returncode == 0, inventory.stderr
        cpus = next(n["cpus"] for n in json.loads(inventory.stdout)["numa_nodes"] if n["id"] == 0)
        configs = {vmid: run_ok(testhost, f"cat {CT.format(vmid=vmid)}") for vmid in CONTAINERS}
        yield Split(configs, run_ok(testhost, f"cat {VM}"), cpus)
    finally:
        # CT 200's root file system is the image's, which the other modules expect as it was.
        testhost.ssh(["rm", "-rf", f"{CT_ROOTFS.format(vmid=200)}/usr"])
        back = proxgpu(testhost, tmp, "rollback", "--yes")
        testhost.reboot()
    assert back.returncode == 0, back.stdout + back.stderr
    assert_original(testhost)


# -- CTs 200 and 201 -------------------------------------------------------------------------------


def node_stats(host: QemuTestHost, paths: list[str]) -> dict[str, NodeStat]:
    """Each path's type and device number on the host, as LXC.pm's stat() reads them."""
    if not paths:
        return {}
    out = run_ok(host, "stat -c '%n %t %T %F' " + " ".join(shlex.quote(p) for p in paths))
    stats = {}
    for line in out.splitlines():
        name, major, minor, kind, *_ = line.split()  # kind: "character" or "block" (special file)
        stats[name] = NodeStat("b" if kind == "block" else "c", int(major, 16), int(minor, 16))
    return stats


def common_conf(host: QemuTestHost) -> str:
    """LXC.pm's include: OSTYPE.common.conf where the host's lxc has it, else common.conf."""
    config = "/usr/share/lxc/config"
    rc, _, _ = host.ssh(["test", "-f", f"{config}/debian.common.conf"])
    return f"{config}/debian.common.conf" if rc == 0 else f"{config}/common.conf"


@pytest.fixture
def container(testhost: QemuTestHost) -> Iterator[Callable[[int, str], None]]:
    """Starts a container from its VMID and a Proxmox config text (call it); stops each one
    started, and its mounts, after."""
    started: list[int] = []

    def start(vmid: int, text: str) -> None:
        devices = [d.path for d in passthrough_devices(text)]
        config = lxc_config(vmid, text, node_stats(testhost, devices), common_conf(testhost))
        directory = f"/var/lib/lxc/{vmid}"
        write(testhost, f"{directory}/config", config)
        write(testhost, f"{directory}/pve-prestart-hook", prestart_hook(vmid, text), "755")
        write(testhost, f"{directory}/pve-autodev-hook", autodev_hook(vmid), "755")
        # The container's payload: a process that waits (its root file system has no init).
        log = LXC_LOG.format(vmid=vmid)
        argv = ["lxc-start", "-n", str(vmid), "-d", "-l", "DEBUG", "-o", log, "--",
                "/bin/sleep", "100000"]  # fmt: skip
        started.append(vmid)
        with phase("guest start"):
            rc, out, err = testhost.ssh(argv)
        tail = testhost.ssh(["tail", "-n", "60", log])[1]
        assert rc == 0, f"lxc-start exited {rc}: {out}{err}\n{tail}"
        run_ok(testhost, f"lxc-wait -n {vmid} -s RUNNING -t 30")

    yield start
    for vmid in started:
        testhost.ssh(["lxc-stop", "-n", str(vmid), "-k"])
        unmount = f"umount /var/lib/lxc/{vmid}/passthrough 2>/dev/null"
        testhost.ssh(["sh", "-c", f"{unmount}; rm -f {LXC_LOG.format(vmid=vmid)}"])


def in_container(host: QemuTestHost, vmid: int, script: str, user: str = CT_USER) -> str:
    """Run a busybox sh script in container ``vmid`` as ``user`` (uid:gid)."""
    uid, gid = user.split(":")
    argv = ["lxc-attach", "-n", str(vmid), "--clear-env", "--uid", uid, "--gid", gid, "--",
            "/bin/sh", "-c", script]  # fmt: skip
    rc, out, err = host.ssh(argv)
    assert rc == 0, f"in CT {vmid}: {script} exited {rc}: {out}{err}"
    return out


# Opens each path for reading as busybox's sh does for "<": "PATH ok", or "PATH ERROR" with the
# error sh reports (strerror: "Operation not permitted" is the device cgroup's EPERM).
OPEN_EACH = """
for p; do
    if err=$( { : < "$p"; } 2>&1 ); then echo "$p ok"; else echo "$p ${err##*: }"; fi
done"""


def opened(host: QemuTestHost, vmid: int, paths: list[str], user: str = CT_USER) -> dict[str, str]:
    """Each path opened in container ``vmid`` as ``user``: ``ok`` or the error."""
    script = "set -- " + " ".join(shlex.quote(p) for p in paths) + OPEN_EACH
    lines = in_container(host, vmid, script, user).splitlines()
    return dict(line.split(" ", 1) for line in lines)


def gpu_minors(paths: list[str]) -> set[int]:
    """The minors of the ``/dev/nvidiaN`` among ``paths``."""
    return {int(m[1]) for p in paths if (m := re.fullmatch(r"/dev/nvidia(\d+)", p))}


def assert_exactly_its_gpus(host: QemuTestHost, vmid: int, given: list[str], cpus: str) -> None:
    """As uid 1000 in container ``vmid``: every node it is given opens, two of node 0's GPUs
    (minors 0-3 after the reboot), nvidiactl, nvidia-uvm and nvidia-modeset among them; no
    other GPU's node exists, and one made by root of another node-0 GPU (the other container's,
    where both run) is refused (EPERM from the device cgroup); its cpuset is node 0's CPUs."""
    mine = gpu_minors(given)
    assert len(mine) == 2 and mine <= set(range(4)), given
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-modeset"} <= set(given), given
    present = in_container(host, vmid, "ls /dev").split()
    assert {f"/dev/{n}" for n in present if n.startswith("nvidia")} == set(given), present
    assert opened(host, vmid, given) == dict.fromkeys(given, "ok")
    # Root in the container may make any node (LXC's common.conf allows "c *:* m"); the device
    # cgroup (BPF on cgroup2) still refuses to open one the container was not given, and opens
    # one it was given.
    other, own = min(set(range(4)) - mine), min(mine)
    nodes = f"mknod -m 666 /tmp/other c 195 {other} && mknod -m 666 /tmp/own c 195 {own}"
    in_container(host, vmid, nodes, "0:0")
    try:
        assert opened(host, vmid, ["/tmp/other", "/tmp/own"]) == {
            "/tmp/other": "Operation not permitted",
            "/tmp/own": "ok",
        }, f"CT {vmid}: /dev/nvidia{other} is not its"
    finally:
        in_container(host, vmid, "rm -f /tmp/other /tmp/own", "0:0")
    pid = run_ok(host, f"lxc-info -n {vmid} -p -H").strip()
    cgroup = run_ok(host, f"cat /proc/{pid}/cgroup").strip().removeprefix("0::")
    assert cgroup == f"/lxc/{vmid}/ns", "LXC.pm's lxc.cgroup.dir.container and .inner"
    effective = run_ok(host, f"cat /sys/fs/cgroup{cgroup}/cpuset.cpus.effective").strip()
    assert effective == cpus
    allowed = in_container(host, vmid, "cat /proc/self/status")
    assert f"Cpus_allowed_list:\t{cpus}" in allowed.splitlines()


def test_two_raw_containers_run_side_by_side_each_opening_its_own_gpus_alone(
    testhost: QemuTestHost, split: Split, container: Callable[[int, str], None], tmp_path: Path
) -> None:
    """Proxmox VE before 8.1 (the test host has no pve-container): the rendered raw lines, each
    container including the rules file the boot unit wrote for it alone; both run at once, and
    root in either cannot open the other's GPUs."""
    given: dict[int, list[str]] = {}
    for vmid, text in split.containers.items():
        assert not passthrough_devices(text)
        raw = [line for line in text.splitlines() if line.startswith("lxc.")]
        assert f"lxc.include: /run/proxgpu/nvidia-devices-{vmid}.conf" in raw, raw
        mounts = [line.split()[1] for line in raw if line.startswith("lxc.mount.entry: ")]
        given[vmid] = [path for path in mounts if path.startswith("/dev/nvidia")]
        container(vmid, text)
    assert not gpu_minors(given[200]) & gpu_minors(given[201])
    for vmid, paths in given.items():
        assert_exactly_its_gpus(testhost, vmid, paths, split.node0_cpus)
    assert_verified_inside(testhost, tmp_path, split)


def assert_verified_inside(host: QemuTestHost, tmp: Path, split: Split) -> None:
    """``proxgpu verify`` from inside the running containers: CT 200's NVIDIA tool lists exactly
    the GPUs the plan gives it; CT 201, holding another user space, is drift naming both
    versions, and passes once it holds the module's."""
    found = proxgpu(host, tmp, "verify", "--json")
    report = json.loads(found.stdout)
    checks = {check["guest"]: check for check in report["guests"]}
    assert found.returncode == 17, found.stdout + found.stderr
    assert checks["CT 200"]["verdict"] == "ok", checks
    mine = [
        f"0000:{bus}:00.0" for bus in re.findall(r"0000:(\w\w):00\.0", checks["CT 200"]["line"])
    ]
    assert len(mine) == 2 and set(mine) <= set(NODE0), checks["CT 200"]
    assert checks["CT 201"]["verdict"] == "drift", checks
    assert checks["CT 201"]["line"].startswith(
        f"CT 201 holds NVIDIA's user space {OTHER_VERSION} (read through its init's root), but "
        f"the host's nvidia module is {MODULE_VERSION}"
    ), checks["CT 201"]
    assert report["drift"] == [checks["CT 201"]["line"]], "nothing else drifted"
    assert checks["VM 300"]["verdict"] == "unchecked", "VM 300 does not run"
    give_user_space(host, 201, MODULE_VERSION)
    again = proxgpu(host, tmp, "verify")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[0].endswith(": no drift, the host matches the applied plan")
    for vmid in CONTAINERS:
        assert f"  CT {vmid}: nvidia-smi inside it lists exactly its GPUs, " in again.stdout
    assert "VM 300 is not running: not looked at; start it (qm start 300)" in again.stderr


@pytest.fixture
def dev_entries(testhost: QemuTestHost, tmp_path: Path) -> Iterator[str]:
    """CT 200's config as proxgpu plans it once a pve-container with devN entries is installed."""
    backup = f"{DPKG_STATUS}.proxgpu-e2e"
    run_ok(testhost, f"cp -p {DPKG_STATUS} {backup} && printf '\\n' >> {DPKG_STATUS} && "
           f"cat >> {DPKG_STATUS}", PVE_CONTAINER)  # fmt: skip
    try:
        planned = proxgpu(testhost, tmp_path, "plan", *SPLIT_OPTIONS, "--json")
        assert planned.returncode == 0, planned.stderr
        files = json.loads(planned.stdout)["changes"]["files"]
        yield next(f["after"] for f in files if f["path"] == CT.format(vmid=200))
    finally:
        run_ok(testhost, f"mv {backup} {DPKG_STATUS}")


def test_ct200_starts_from_its_dev_entries_and_opens_exactly_its_gpus(
    testhost: QemuTestHost, split: Split, dev_entries: str, container: Callable[[int, str], None]
) -> None:
    """Proxmox VE 8.1 and later: devN entries, each node made by the hooks with its mode."""
    devices = passthrough_devices(dev_entries)
    assert {d.path for d in devices} >= {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert not [line for line in dev_entries.splitlines() if line.startswith("lxc.mount")]
    # proxgpu gives them NVIDIA's 0666, else pve-container's 0660 root:root shuts uid 1000 out.
    assert {d.mode for d in devices} == {"0666"}, dev_entries
    container(200, dev_entries)
    stats = node_stats(testhost, [d.path for d in devices])
    # create_passthrough_device_node: the entry's mode (0660 unless given) and uid:gid.
    paths = " ".join(shlex.quote(d.path) for d in devices)
    made = in_container(testhost, 200, f"stat -c '%n %a %u:%g %t:%T' {paths}").splitlines()
    assert made == [
        f"{d.path} {int(d.mode or '0660', 8):o} {d.uid}:{d.gid} "
        f"{stats[d.path].major:x}:{stats[d.path].minor:x}"
        for d in devices
    ]
    assert_exactly_its_gpus(testhost, 200, [d.path for d in devices], split.node0_cpus)


# -- VM 300 -------------------------------------------------------------------------------------


def qemu_server_command(vm_config: str, tmp: Path) -> list[str]:
    """qemu-server's QEMU command line for the config (the harness's qemu-start --print-cmd)."""
    conf = tmp / "300.conf"
    conf.write_text(vm_config)
    storage = tmp / "storage.cfg"
    storage.write_text(STORAGE_CFG)
    argv = [*pve_check_command(), "--storage-cfg", str(storage), "--print-cmd", "qemu-start"]
    result = subprocess.run([*argv, str(conf)], capture_output=True, text=True, timeout=300,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith(f"CMD {conf}: "))
    return shlex.split(line.removeprefix(f"CMD {conf}: "))


def slot_functions(host: QemuTestHost, addresses: list[str]) -> dict[str, list[str]]:
    """Each function 0's slot, all its functions, from the host's sysfs."""
    found = {}
    for address in addresses:
        out = run_ok(host, f"cd /sys/bus/pci/devices && ls -d {address[:-1]}*")
        found[address] = sorted(out.split())
    return found


# Whether QEMU (PID) has exited within 30 s.
QUIT_WAIT = "for i in $(seq 30); do kill -0 {pid} 2>/dev/null || exit 0; sleep 1; done; exit 1"
# QEMU's QMP on a loopback port inside the test host, spoken with bash's /dev/tcp: one JSON
# document per line; reply waits for the answer to the last command, skipping events.
QMP = f"""
exec 3<>/dev/tcp/127.0.0.1/{QMP_PORT}
reply() {{
    while read -r line <&3; do
        case $line in *'"return"'*|*'"error"'*) echo "$line"; return ;; esac
    done
}}
read -r greeting <&3
echo '{{"execute": "qmp_capabilities"}}' >&3; reply >/dev/null
echo '{{"execute": "human-monitor-command", "arguments": {{"command-line": "info qtree"}}}}' >&3
reply
echo '{{"execute": "quit"}}' >&3; reply >/dev/null
"""


def test_qemu_opens_every_vfio_function_of_vm300(
    testhost: QemuTestHost, split: Split, tmp_path: Path
) -> None:
    command = qemu_server_command(split.vm, tmp_path)
    readconfig = command[command.index("-readconfig") + 1]
    hostpci = [v for k, v in (ln.split(": ", 1) for ln in split.vm.splitlines() if ": " in ln)
               if re.fullmatch(r"hostpci\d+", k)]  # fmt: skip
    assert sorted(entry.split(",")[0] for entry in hostpci) == [a[:-2] for a in NODE1], split.vm
    firsts = re.findall(r"vfio-pci,host=([0-9a-f:.]+),", " ".join(command))
    assert sorted(firsts) == NODE1
    devices = vfio_devices(command, slot_functions(testhost, firsts))
    machine = proxmox_sources() / PVE_Q35 / Path(readconfig).name
    write(testhost, readconfig, machine.read_text())
    # No guest OS: -S stops the CPUs before the first instruction; -daemonize returns once every
    # device is realized, so its exit status says whether QEMU opened every VFIO device.
    qemu = ["qemu-system-x86_64", "-S", "-nodefaults", "-display", "none", "-machine", "q35",
            "-accel", "tcg,tb-size=16", "-m", "64", "-readconfig", readconfig, *devices,
            "-qmp", f"tcp:127.0.0.1:{QMP_PORT},server=on,wait=off",
            "-daemonize", "-pidfile", VM_PIDFILE]  # fmt: skip
    with phase("guest start"):
        started = run_ok(testhost, f"mkdir -p {Path(VM_PIDFILE).parent} && "
                         + shlex.join(qemu) + " 2>&1; echo rc=$?")  # fmt: skip
    assert started.strip().endswith("rc=0"), started
    pid = run_ok(testhost, f"cat {VM_PIDFILE}").strip()
    try:
        fds = run_ok(testhost, f"ls -l /proc/{pid}/fd")
        verified = proxgpu(testhost, tmp_path, "verify")
        answer = json.loads(run_ok(testhost, "exec bash -c " + shlex.quote(QMP)))["return"]
        qtree = answer.replace("\r", "")  # HMP's text has CRLF line ends
        gone = testhost.ssh(["sh", "-c", QUIT_WAIT.format(pid=pid)])[0] == 0
    finally:
        testhost.ssh(["sh", "-c", f"kill {pid} 2>/dev/null; true"])
    # Each IOMMU group's /dev/vfio/N is open: QEMU got every group of VM 300's functions.
    groups = set(re.findall(r"-> /dev/vfio/(\d+)", fds))
    assert groups == set(run_ok(testhost, "ls /dev/vfio").split()) - {"vfio"}, fds
    assert len(groups) == 4, fds
    # The VM's PCI devices are the host's functions, read through VFIO: the GPU's IDs
    # (bochs-display 1234:1111) on function 0, the HDA function's (Intel's) on 1. (QEMU's
    # query-pci cannot list them: without firmware, -S, no bridge has a bus number yet.)
    seen = dict(re.findall(r'dev: vfio-pci, id "([^"]+)"\n.*?pci id (\w{4}:\w{4})', qtree, re.S))
    wanted = [v.split(",id=")[1].split(",")[0] for v in devices if v.startswith("vfio-pci,")]
    assert sorted(seen) == sorted(wanted), qtree
    assert {seen[i] for i in wanted if i.endswith(".0")} == {"1234:1111"}
    assert {seen[i][:4] for i in wanted if i.endswith(".1")} == {"8086"}
    assert gone, "QEMU quits when told to over QMP"
    # proxgpu finds VM 300's QEMU as qemu-server does, holding every group the plan gives it.
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"  VM 300: its QEMU (PID {pid}) holds every planned function's IOMMU group" in (
        verified.stdout
    )
