"""Every read from a host is bounded as a whole: a host that answers 3 GB, trickles a byte every
few seconds, holds a FIFO where a file should be, lists thousands of functions or names a
million CPUs ends with a clear exit in bounded time and memory, and leaves no process behind.

Each case runs real commands on this machine (the host layer's local runner, the gather script
against a real tree in the scratch folder) and checks the exact outcome and that nothing outside
the scratch folder changed.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time

import pytest

from proxgpu.cli import main
from proxgpu.errors import CommandOutputTooLargeError, CommandTimeoutError
from proxgpu.host import DirectoryHost, LocalHost
from proxgpu.host.base import MAX_OUTPUT
from proxgpu.host.ssh import SSHHost
from proxgpu.inspection import inspect, smi
from proxgpu.inspection.capture import gather
from proxgpu.inspection.smi import read_smi
from tests.support.hostile_scratch import Scratch, gone
from tests.support.sshd import Sshd, client_options
from tests.support.standins import fake_tool, on_path
from tests.support.trees import copy_example, sriov_tree

GPU = "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0"
VFS = "/sys/bus/pci/devices/0001:"
#: A line of a probe script that sets ``hwm`` to its process's peak memory in KiB. VmHWM, not
#: ru_maxrss: Linux keeps ru_maxrss across exec, so a child forked from a large pytest would
#: report the parent's size.
PEAK_KIB = "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1]\n"


def test_a_command_that_answers_3_gb_is_stopped_at_the_limit_in_bounded_memory(
    scratch: Scratch,
) -> None:
    """The runner keeps at most MAX_OUTPUT bytes: its process's peak memory stays near that,
    not near 3 GB, and it stops within seconds."""
    probe = (
        "import time\n"
        "from proxgpu.host import LocalHost\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    LocalHost().run(['sh', '-c', 'head -c 3G /dev/zero'])\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        f"{PEAK_KIB}"
        "print(time.monotonic() - start, hwm)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    error, numbers = done.stdout.splitlines()
    seconds, peak_kib = (float(n) for n in numbers.split())
    assert error == (
        "CommandOutputTooLargeError localhost: sh answered more than 64 MiB, stopped reading; "
        "a host file that large is not one proxgpu reads: check what the host holds there"
    )
    assert seconds < 30
    assert peak_kib * 1024 < 3 * MAX_OUTPUT, f"peak {peak_kib} KiB"


def test_a_command_that_trickles_ends_at_its_deadline_with_every_process_it_started(
    scratch: Scratch,
) -> None:
    """One byte a second never lets a per-read timeout fire; the deadline is for the whole
    command, and the shell and the child it left in the background are both killed."""
    pids = scratch.root / "pids"
    script = f"sleep 300 & echo $$ $! > {pids}; while :; do printf x; sleep 1; done"
    start = time.monotonic()
    with pytest.raises(CommandTimeoutError) as caught:
        LocalHost().run(["sh", "-c", script], timeout=3)
    assert 3 <= time.monotonic() - start < 8
    assert str(caught.value) == "localhost: sh did not finish within 3 s"
    shell, child = (int(p) for p in pids.read_text().split())
    assert gone(shell) and gone(child), "a process of the command was left behind"


def test_a_fifo_where_host_files_should_be_is_skipped_not_waited_on(
    scratch: Scratch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO opened for reading blocks until a writer comes: never opened, it changes nothing
    but what it stands for, which is missing."""
    tree = copy_example(scratch.root, dest="host")
    for path in ("proc/cmdline", f"{GPU}/numa_node", "etc/pve/qemu-server/300.conf"):
        (tree / path).unlink()
        os.mkfifo(tree / path)
    start = time.monotonic()
    code = main(["inspect", "--root", str(tree), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert time.monotonic() - start < 60
    inventory = json.loads(out)
    assert inventory["kernel_cmdline"] is None
    assert "/etc/pve/qemu-server/300.conf" not in inventory["guest_configs"]
    gpu = next(g for g in inventory["gpus"] if g["address"] == "0000:01:00.0")
    assert gpu["numa_node"] is None


def test_a_3_gb_config_file_is_refused_in_bounded_time(
    scratch: Scratch, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = copy_example(scratch.root, dest="host")
    with open(tree / "etc/pve/qemu-server/300.conf", "r+b") as handle:
        handle.truncate(3 << 30)  # sparse: 3 GB to read, nothing on disk
    start = time.monotonic()
    code = main(["inspect", "--root", str(tree)])
    err = capsys.readouterr().err
    assert code == CommandOutputTooLargeError.exit_code == 7
    assert f"dir:{tree}: sh answered more than 64 MiB, stopped reading" in err
    assert time.monotonic() - start < 60


def test_thousands_of_sr_iov_functions_are_all_read(scratch: Scratch) -> None:
    """6000 functions name 54000 files: as one grep's arguments they pass the kernel's 2 MiB
    limit (grep would not run, and the capture would look empty); in batches every one is read."""
    count = 6000
    tree = sriov_tree(scratch.root, count)
    host = DirectoryHost(str(tree))
    listed = sum(len(str(p)) + 1 for p in tree.glob("sys/bus/pci/devices/*/*"))
    assert listed > int(subprocess.check_output(["getconf", "ARG_MAX"]))
    capture = gather(host)
    for attribute in ("vendor", "local_cpulist", "boot_vga"):
        read = [p for p in capture.lines if p.startswith(VFS) and p.endswith("/" + attribute)]
        assert len(read) == count, attribute
    assert host.commands_run == 1
    inventory = inspect(host)
    assert len(inventory.gpus) == 8
    assert not any("missing or unparsable" in w for w in inventory.warnings)


def test_a_batch_that_cannot_run_is_an_error_not_an_empty_host(
    scratch: Scratch, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grep killed while reading (here by a stand-in grep that kills itself: a real one
    killed by the OOM killer looks the same to xargs) leaves its files unread: the gather step
    fails naming the batch, instead of an inventory without them."""
    tree = copy_example(scratch.root, dest="host")
    tools = scratch.root / "bin"
    tools.mkdir()
    (tools / "grep").write_text("#!/bin/sh\nkill -KILL $$\n")
    (tools / "grep").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    code = main(["inspect", "--root", str(tree)])
    err = capsys.readouterr().err
    assert code == 7, err
    assert (
        f"dir:{tree}: the gather step (reading the sysfs and procfs files) exited with 125" in err
    )


def test_an_initramfs_list_cut_short_is_not_believed(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lsinitramfs that fails after a line (a damaged image) gives a partial list: it is said,
    and the initramfs counts as unread, never as one without the binding."""
    tree = copy_example(scratch.root, dest="host")
    kernel = (tree / "proc/sys/kernel/osrelease").read_text().strip()
    (tree / "boot").mkdir()
    (tree / f"boot/initrd.img-{kernel}").write_bytes(b"\x07\x07\x01 not a cpio archive")
    tools = scratch.root / "bin"
    tools.mkdir()
    (tools / "lsinitramfs").write_text("#!/bin/sh\necho usr/lib/modules/x/nvidia.ko\nexit 2\n")
    (tools / "lsinitramfs").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    inventory = inspect(DirectoryHost(str(tree)))
    assert inventory.initramfs_files is None
    assert (
        f"/boot/initrd.img-{kernel}: lsinitramfs failed (2): which modules it holds is unknown"
        in inventory.warnings
    )


@pytest.mark.parametrize(
    ("path", "text", "words"),
    [
        (
            "sys/devices/system/node/node0/cpulist",
            ",".join(["0"] * 1_000_000),
            "the list has more than 65536 ranges",
        ),
        (
            "sys/devices/system/node/node0/cpulist",
            ",".join(["0-65535"] * 1000),
            "the list names more than 65536 CPUs (some more than once)",
        ),
        (
            "sys/devices/system/node/node1/cpulist",
            "30-63",
            "CPU 30 is also node0's: a CPU is on one node",
        ),
        (
            f"{GPU}/local_cpulist",
            "0-31,4000",
            "names CPU 4000, which none of the host's NUMA nodes has (0-63)",
        ),
    ],
    ids=["a million ranges", "65536 CPUs a thousand times", "overlapping nodes", "no such CPU"],
)
def test_a_cpulist_the_host_cannot_have_is_refused_in_bounded_time(
    scratch: Scratch, capsys: pytest.CaptureFixture[str], path: str, text: str, words: str
) -> None:
    tree = copy_example(scratch.root, dest="host")
    (tree / path).write_text(text + "\n")
    start = time.monotonic()
    code = main(["inspect", "--root", str(tree)])
    err = capsys.readouterr().err
    assert code == 8, err
    named = path.replace(GPU, "sys/bus/pci/devices/0000:01:00.0")
    assert f"dir:{tree}: /{named}: {words}" in err
    assert time.monotonic() - start < 30


@pytest.mark.sshd
def test_a_host_that_answers_3_gb_over_ssh_is_stopped_at_the_limit(
    scratch: Scratch, sshd: Sshd
) -> None:
    host = SSHHost(sshd.target, client_options(sshd, scratch.root))
    start = time.monotonic()
    with pytest.raises(CommandOutputTooLargeError) as caught:
        host.run(["head", "-c", "3G", "/dev/zero"])
    assert time.monotonic() - start < 60
    assert str(caught.value).startswith(f"{sshd.target}: head answered more than 64 MiB")
    # The connection stays usable: only the command's channel was closed.
    assert host.run(["echo", "ok"]).stdout == b"ok\n"
    host.close()


@pytest.mark.sshd
def test_a_host_that_trickles_over_ssh_ends_at_the_deadline_and_its_command_dies(
    scratch: Scratch, sshd: Sshd
) -> None:
    """A byte a second: paramiko's per-read timeout would never fire. The deadline is for the
    whole command; closing its channel closes its pipes, so its next write kills it."""
    pid_file = scratch.root / "pid"
    host = SSHHost(sshd.target, client_options(sshd, scratch.root))
    start = time.monotonic()
    with pytest.raises(CommandTimeoutError) as caught:
        host.run(
            ["sh", "-c", f"echo $$ > {pid_file}; while :; do printf x; sleep 1; done"], timeout=3
        )
    assert 3 <= time.monotonic() - start < 8
    assert str(caught.value) == f"{sshd.target}: sh did not finish within 3 s"
    assert gone(int(pid_file.read_text())), "the remote command was left running"
    host.close()


def test_a_hung_nvidia_smi_ends_at_its_deadline_and_inspection_carries_on(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvidia-smi can hang on a GPU that is being reset: each run ends at its own deadline,
    with what it started, and the MIG devices' UUIDs are then unknown, not waited for. The
    stand-in nvidia-smi (no NVIDIA GPU is here) starts a child and waits on it forever."""
    pids = scratch.root / "pids"
    bin_dir = scratch.root / "bin"
    fake_tool(bin_dir, "nvidia-smi", f"sleep 600 & echo $$ $! >> {pids}\nwait\n")
    on_path(monkeypatch, bin_dir)
    monkeypatch.setattr(smi, "SMI_SECONDS", 1)
    start = time.monotonic()
    outputs, notes = read_smi(LocalHost())
    assert time.monotonic() - start < 10
    assert notes == [
        f"{command}: it did not finish within 1 s, so the MIG devices' UUIDs are unknown"
        for command in ("nvidia-smi -L", "nvidia-smi")
    ]
    assert outputs == {}
    started = [int(pid) for pid in pids.read_text().split()]
    assert len(started) == 4
    assert all(gone(pid) for pid in started), "a process nvidia-smi started was left behind"


def test_a_sparse_archive_member_unpacks_into_nothing_and_reads_unreadable(
    scratch: Scratch,
) -> None:
    """A few hundred bytes of GNU tar (a 1 GiB sparse member, as a host may append to the
    gather's archives) cost no gigabyte: only plain regular members are read, so the file it
    stands for is unreadable, and the reader's peak memory stays far under 512 MiB."""
    folder = scratch.root / "archive"
    (folder / "1").mkdir(parents=True)
    with (folder / "1" / "200.conf").open("wb") as handle:
        handle.truncate(1 << 30)  # sparse: 1 GiB of zeros, nothing on disk
    (folder / "2").mkdir()
    (folder / "2" / "vfio.conf").write_bytes(b"options vfio-pci ids=10de:2bb5\n")
    archive = subprocess.run(
        ["tar", "--sparse", "-cf", "-", "-C", str(folder), "1/200.conf", "2/vfio.conf"],
        capture_output=True,
        check=True,
    ).stdout
    assert len(archive) < 64 << 10, "the whole bomb is a few blocks"
    output = (
        b"#proxgpu-gather\t1\n#uid\t0\n#section\traw\n"
        b"etc/pve/lxc/200.conf\0@1/200.conf\netc/modprobe.d/vfio.conf\0@2/vfio.conf\n"
        b"#archive\t" + base64.b64encode(archive) + b"\n"
    )
    reader = (
        "import sys\n"
        "from proxgpu.inspection.capture import parse_gather_output\n"
        "capture = parse_gather_output(sys.stdin.buffer.read())\n"
        f"{PEAK_KIB}"
        "print(capture.unreadable, sorted(capture.raw), hwm)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", reader], input=output, capture_output=True, timeout=120, check=True
    )
    *said, peak = done.stdout.decode().split()
    assert " ".join(said) == "['/etc/pve/lxc/200.conf'] ['/etc/modprobe.d/vfio.conf']"
    assert int(peak) < 512 << 10, f"peak {int(peak) >> 10} MiB"
