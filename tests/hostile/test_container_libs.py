"""Reading which NVIDIA libraries a stopped container holds, through its rootfs on the host's
storage (issue 38, point 2): the real ``ctlibs.sh`` run with ``sh`` on a copy of the ct200
example (``DirectoryHost``: a snapshot's tree, where no container runs, so only storage is read).

The rootfs is hostile: a container's root wrote it. Each hostile case asserts the exact answer
and that nothing outside the scratch folder changed; none may report a version that only a
directory outside the rootfs holds.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

from proxgpu.errors import CommandTimeoutError
from proxgpu.host import DirectoryHost
from proxgpu.host.base import CommandResult
from proxgpu.host.local import LocalHost
from proxgpu.host.scripts import run_script
from proxgpu.inspection import Inventory, inspect
from proxgpu.inspection.containerlibs import ContainerLibs, read_container_libs
from tests.support.hostile_scratch import Scratch
from tests.support.standins import fake_tool
from tests.support.trees import EXAMPLES

STORAGE = "zfspool: local-zfs\n\tpool rpool/data\n\tcontent rootdir\n"
ROOTFS = "rpool/data/subvol-200-disk-0"
LIB = f"{ROOTFS}/usr/lib/x86_64-linux-gnu"
HOST_VERSION = "575.57.08"
OUTSIDE_VERSION = "999.99.99"


def ct_tree(scratch: Scratch, version: str | None = HOST_VERSION) -> Path:
    """ct200 with a storage.cfg and CT 200's stopped rootfs on local-zfs, holding NVIDIA's
    libraries of ``version`` as the .run installer lays them out."""
    root = scratch.root / "ct200"
    shutil.copytree(EXAMPLES / "ct200", root, symlinks=True)
    (root / "etc/pve/storage.cfg").write_text(STORAGE)
    lib = root / LIB
    lib.mkdir(parents=True)
    (root / ROOTFS / "etc").mkdir()
    if version is not None:
        install(lib, version)
    return root


def install(lib: Path, version: str) -> None:
    for name in ("libnvidia-ml", "libcuda"):
        (lib / f"{name}.so.{version}").write_bytes(b"\x7fELF")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.{version}")


def outside(scratch: Scratch) -> Path:
    """A directory beside the host tree holding another version: what no answer may name."""
    elsewhere = scratch.root / "elsewhere"
    lib = elsewhere / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    install(lib, OUTSIDE_VERSION)
    return elsewhere


def read(root: Path) -> ContainerLibs:
    host = DirectoryHost(str(root))
    [found] = read_container_libs(host, inspect(host), [200])
    return found


def test_a_stopped_container_on_a_zfs_subvolume_is_read_through_storage(scratch: Scratch) -> None:
    found = read(ct_tree(scratch))
    assert found == ContainerLibs(
        vmid=200,
        state="stopped",
        seen="storage",
        nvml=HOST_VERSION,
        versions=(HOST_VERSION,),
        where="/usr/lib/x86_64-linux-gnu",
    )


def test_debian_packages_under_nvidia_current_and_two_part_versions(scratch: Scratch) -> None:
    root = ct_tree(scratch, version=None)
    current = root / LIB / "nvidia/current"
    current.mkdir(parents=True)
    install(current, "550.100")
    found = read(root)
    assert (found.nvml, found.where) == ("550.100", "/usr/lib/x86_64-linux-gnu/nvidia/current")


def test_a_container_without_nvidia_libraries_holds_none(scratch: Scratch) -> None:
    found = read(ct_tree(scratch, version=None))
    assert (found.state, found.nvml, found.versions, found.why) == ("stopped", None, (), None)


def test_an_old_installation_left_beside_the_new_one_shows_both(scratch: Scratch) -> None:
    root = ct_tree(scratch)
    (root / LIB / "libnvidia-ml.so.550.100").write_bytes(b"")
    found = read(root)
    assert (found.nvml, found.versions) == (HOST_VERSION, ("550.100", HOST_VERSION))


def test_an_unmounted_subvolume_is_unknown_not_empty(scratch: Scratch) -> None:
    root = ct_tree(scratch)
    shutil.rmtree(root / ROOTFS)
    (root / ROOTFS).mkdir()
    found = read(root)
    assert found.why == f"its rootfs /{ROOTFS} holds no usr: it is not mounted"
    assert found.ask == (
        "pct mount 200 && ls -l /var/lib/lxc/200/rootfs/usr/lib/x86_64-linux-gnu/"
        "libnvidia-ml.so.1; pct unmount 200"
    )


def test_lvm_thin_is_unknown_with_the_command_that_tells(scratch: Scratch) -> None:
    root = ct_tree(scratch)
    config = root / "etc/pve/lxc/200.conf"
    config.write_text(
        config.read_text().replace("local-zfs:subvol-200-disk-0", "local-lvm:vm-200-disk-0")
    )
    (root / "etc/pve/storage.cfg").write_text(
        STORAGE + "\nlvmthin: local-lvm\n\tvgname pve\n\tthinpool data\n"
    )
    found = read(root)
    assert found.state == "stopped" and found.nvml is None
    assert found.why == "volume 'local-lvm:vm-200-disk-0' is an LVM-thin volume (a block device)"
    assert found.ask is not None and found.ask.startswith("pct mount 200 && ls -l ")


def test_a_mount_point_over_usr_makes_the_rootfs_no_answer(scratch: Scratch) -> None:
    root = ct_tree(scratch)
    config = root / "etc/pve/lxc/200.conf"
    config.write_text(config.read_text().replace("mp=/models", "mp=/usr/lib"))
    assert read(root).why == "mp0 mounts over /usr, which its rootfs cannot show"


@pytest.mark.parametrize(
    ("link", "target", "why"),
    [
        (
            ROOTFS + "/usr",
            "/",
            f"usr in its rootfs /{ROOTFS} is a link, which proxgpu does not follow in a container",
        ),
        (
            ROOTFS + "/usr",
            "../../../../elsewhere/usr",
            f"usr in its rootfs /{ROOTFS} is a link, which proxgpu does not follow in a container",
        ),
    ],
)
def test_usr_as_a_link_is_refused(scratch: Scratch, link: str, target: str, why: str) -> None:
    root = ct_tree(scratch)
    outside(scratch)
    shutil.rmtree(root / link)
    (root / link).symlink_to(target)
    found = read(root)
    assert (found.why, found.nvml) == (why, None)


def test_a_lib_dir_that_links_out_is_not_followed(scratch: Scratch) -> None:
    root = ct_tree(scratch, version=None)
    elsewhere = outside(scratch)
    shutil.rmtree(root / LIB)
    (root / LIB).symlink_to(elsewhere / "usr/lib/x86_64-linux-gnu")
    # Only the lib dirs that are real directories are read: none holds NVIDIA's libraries.
    found = read(root)
    assert (found.state, found.nvml, found.versions) == ("stopped", None, ())


def test_a_library_link_pointing_out_is_read_as_a_name_never_followed(scratch: Scratch) -> None:
    root = ct_tree(scratch, version=None)
    elsewhere = outside(scratch)
    (root / LIB / "libnvidia-ml.so.1").symlink_to(
        elsewhere / f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{OUTSIDE_VERSION}"
    )
    # The link's target is only a name: it says which version the container's loader would
    # ask for, which is all the plan needs; nothing outside was opened.
    found = read(root)
    assert (found.nvml, found.versions) == (OUTSIDE_VERSION, ())


def test_the_rootfs_itself_linking_out_of_the_tree_is_refused(scratch: Scratch) -> None:
    root = ct_tree(scratch)
    elsewhere = outside(scratch)
    shutil.rmtree(root / ROOTFS)
    (root / ROOTFS).symlink_to(elsewhere)
    found = read(root)
    assert (found.why, found.nvml) == (f"its rootfs /{ROOTFS} leads outside", None)


def test_hostile_names_forge_no_record_and_no_version(scratch: Scratch) -> None:
    root = ct_tree(scratch, version=None)
    lib = root / LIB
    for name in (
        "libnvidia-ml.so.1\n#libs\t200\tusr\tAAAA",
        f"libnvidia-ml.so.{OUTSIDE_VERSION}\t",
        f"libcuda.so.1\n{OUTSIDE_VERSION}",
        "libcuda.so.1;touch canary",
    ):
        (lib / name).write_bytes(b"")
    os.mkfifo(lib / "libnvidia-ml.so.1")
    found = read(root)
    assert (found.state, found.nvml, found.versions, found.where) == (
        "stopped",
        None,
        (),
        "/usr/lib/x86_64-linux-gnu",
    )


def test_a_huge_directory_is_read_within_bounds(scratch: Scratch) -> None:
    root = ct_tree(scratch, version=None)
    lib = root / LIB
    for i in range(3000):
        (lib / f"libnvidia-ml.so.{i}.{'x' * 200}").write_bytes(b"")
    install(lib, HOST_VERSION)
    found = read(root)
    # The listing is cut at its limit: what it shows is whole entries, whatever the cut missed.
    assert found.state == "stopped" and found.why is None
    assert set(found.versions) <= {HOST_VERSION}


def test_a_lib_dir_swapped_for_a_link_meanwhile_never_shows_what_is_outside(
    scratch: Scratch,
) -> None:
    root = ct_tree(scratch)
    elsewhere = outside(scratch)
    lib, real, evil = root / LIB, root / (LIB + ".real"), root / (LIB + ".evil")
    evil.symlink_to(elsewhere / "usr/lib/x86_64-linux-gnu")
    stop = threading.Event()

    def swap() -> None:
        # The directory, then a link to the outside one in its place, as fast as renames go.
        while not stop.is_set():
            os.rename(lib, real)
            os.rename(evil, lib)
            os.rename(lib, evil)
            os.rename(real, lib)

    # One script run reads the same container 400 times, while the swaps run.
    reads = ["200", f"/{ROOTFS}", "x86_64-linux-gnu"] * 400
    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        output = run_script(DirectoryHost(str(root)), "ctlibs", "tree", "5", "16384", *reads)
    finally:
        stop.set()
        swapper.join()
    listed = [base64.b64decode(record[2]) for record in output.of("libs")]
    assert any(HOST_VERSION.encode() in names for names in listed)  # the swaps raced the reads
    assert not any(OUTSIDE_VERSION.encode() in names for names in listed)


class ToolsLocalHost(LocalHost):
    """This machine's / as the live host, its commands finding ``tools`` first."""

    def __init__(self, tools: Path) -> None:
        super().__init__("/")
        self.tools = tools

    def _run(self, argv: tuple[str, ...], stdin: bytes | None, timeout: float) -> CommandResult:
        path = f"PATH={self.tools}:{os.environ['PATH']}"
        return super()._run(("env", path, *argv), stdin, timeout)


@pytest.mark.skipif(os.geteuid() != 0, reason="a process of its own root needs chroot: root")
def test_a_real_process_root_is_read_through_proc_and_its_absolute_links_never_lead_out(
    scratch: Scratch,
) -> None:
    """The kernel's own /proc/PID/root of a process chrooted into a container-like tree (no LXC
    runs here; lxc-info is a stand-in naming that process), read by the real script with dash
    on this machine's /, where a link is resolved against the reader's root: an absolute link
    in the container leads to the host's directory of that name."""
    rootfs = scratch.root / "ct"
    (rootfs / "usr/lib").mkdir(parents=True)
    install(rootfs / "usr/lib", "550.100")
    (rootfs / "usr/lib/x86_64-linux-gnu").mkdir()
    elsewhere = outside(scratch)
    (rootfs / "usr/lib64").symlink_to(elsewhere / "usr/lib/x86_64-linux-gnu")
    code = "import os, sys, time; os.chroot(sys.argv[1]); print(flush=True); time.sleep(60)"
    sleeper = subprocess.Popen([sys.executable, "-c", code, str(rootfs)], stdout=subprocess.PIPE)
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == b"\n"
        tools = scratch.root / "tools"
        fake_tool(tools, "lxc-info", f'[ "$*" = "-n 200 -p" ] && echo "PID: {sleeper.pid}"\n')
        config = {"/etc/pve/lxc/200.conf": "arch: amd64\nrootfs: gone:subvol-200-disk-0\n"}
        inventory = Inventory(source="s", hostname="pve1", guest_configs=config)
        [found] = read_container_libs(ToolsLocalHost(tools), inventory, [200])
    finally:
        sleeper.kill()
        sleeper.wait()
    assert found == ContainerLibs(
        vmid=200,
        state="running",
        seen="init root",
        nvml="550.100",
        versions=("550.100",),
        where="/usr/lib",
    )


def test_a_read_past_its_deadline_leaves_the_plan_standing(
    scratch: Scratch, mocker: MockerFixture
) -> None:
    """A directory on a hung NFS storage blocks even ``cd`` in the kernel, past every deadline
    of the script's own; no such mount can be made here, so the runner's timeout is raised in
    its place (a stand-in, pytest-mock), the way the real transport raises it."""
    root = ct_tree(scratch)
    host = DirectoryHost(str(root))
    inventory = inspect(host)
    hung = CommandTimeoutError(host.name, ["sh"], 57)
    mocker.patch("proxgpu.inspection.containerlibs.run_script", side_effect=hung)
    [found] = read_container_libs(host, inventory, [200])
    assert (found.state, found.why) == (
        "unknown",
        "reading the containers took longer than 57 s (a hung storage?)",
    )
