"""A QEMU-emulated dual-socket "GPU server" running a real Debian kernel.

Machine layout (q35, TCG by default; KVM cannot run a stock kernel on the project's machines):

* 2 vCPUs, 1 GiB, as two NUMA nodes of one CPU and 512 MiB each;
* emulated VT-d (intel-iommu with interrupt remapping), so the guest has IOMMU groups;
* two pxb-pcie expander bridges, numa_node 0 (buses 0x20+) and 1 (buses 0x80+), with four root
  ports each. Behind every root port sits a stand-in GPU: a bochs-display (function 0, class
  0x0380) and an ich9-intel-hda (function 1, driver snd_hda_intel), which share an IOMMU group
  just like a real GPU and its HDMI audio function. The image's stand-in NVIDIA driver
  (``guest/nvidia-standin``, module ``nvidia``) drives the display functions as NVIDIA's open
  module drives GPUs (its softdep, minors, /proc/driver/nvidia, char devices, an unbind that
  waits for open files); bochs-drm is blacklisted so that it does not compete.

SSH is forwarded from a free port on 127.0.0.1 only, and the guest's network is restricted to
the host. The guest's host key is pinned from the image build (no trust on first use).

Reboots are cold: the guest powers off (QEMU runs with -no-reboot and exits) and QEMU starts
again on the same overlay. A warm reset inside one TCG QEMU process makes the next boot 2-5x
slower with soft lockups, so it is avoided. As QEMU boots with -kernel/-initrd, the harness
first copies the guest's newest /boot/vmlinuz-*, its initrd and /etc/kernel/cmdline (the
Proxmox systemd-boot convention) out of the guest, so that an initramfs regenerated inside the
guest, and the modprobe.d configuration baked into it, take effect at the next boot exactly as
on real hardware.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import paramiko

from tests.support.waiting import wait_for

from .image import GuestImage
from .phases import phase

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
WATCHDOG = Path(__file__).resolve().parent / "qemu_watchdog.py"
BOOT_TIMEOUT_S = 480.0  # measured 30-46 s under TCG; the rest is headroom for a loaded CI box
SHUTDOWN_TIMEOUT_S = 180.0  # measured ~9 s
SSH_COMMAND_TIMEOUT_S = 120.0
QEMU_LAUNCH_TIMEOUT_S = 60.0
SSH_CONNECT_TIMEOUT_S = 10.0
# sshd in a freshly booted TCG guest can take several seconds to send its banner.
SSH_HANDSHAKE_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 2.0
# A booting guest whose console has been silent this long, with no SSH yet, has stalled: once
# on a loaded CI machine a TCG guest stopped printing 4 s into the kernel's own driver setup
# (long before anything the tests change runs) and sat silent for the whole boot timeout. A
# sound boot prints every few seconds until sshd answers.
CONSOLE_STALL_S = 120.0
GPUS_PER_NODE = 4
# The first PCI bus number behind each NUMA node's expander bridge.
NODE_BUS_BASE = {0: 0x20, 1: 0x80}
# What update-grub writes, and GRUB reads at boot.
GRUB_CFG = "/boot/grub/grub.cfg"
# How a boot or reboot that had to be power-cycled is named in the e2e tier's phases.
POWER_CYCLED = ", power-cycled after a stall"
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class TestHostError(RuntimeError):
    """The test host failed to start, boot, reboot or answer."""

    __test__ = False  # not a pytest test class despite the name


class BootStalledError(TestHostError):
    """The boot never came up: the guest's console went silent before SSH answered (see
    :data:`CONSOLE_STALL_S`), or QEMU exited on its own while it booted."""


class HostKeyNotPinned(paramiko.SSHException):
    """The guest presented a host key that is not in the pinned known_hosts file."""


class _PinnedKeyPolicy(paramiko.RejectPolicy):
    """RejectPolicy with its own exception type, so boot polling can stop retrying at once."""

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> NoReturn:
        raise HostKeyNotPinned(f"{hostname} offered an unpinned {key.get_name()} host key")


@dataclass(frozen=True)
class BootFiles:
    """What QEMU boots: kernel, initramfs and kernel command line."""

    kernel: Path
    initrd: Path
    cmdline: str


_LIVE_HOSTS: set[QemuTestHost] = set()


def stop_all() -> None:
    """Stop every test host still running (a safety net for interrupted sessions)."""
    for host in list(_LIVE_HOSTS):
        host.stop()


atexit.register(stop_all)


class QemuTestHost:
    """One emulated GPU server: start it, run commands in it over SSH, reboot it, stop it."""

    user = "root"

    def __init__(
        self, image: GuestImage, rundir: Path, accel: str = "tcg", *, iommu: bool = True
    ) -> None:
        """Prepare (but do not start) a host whose state lives in ``rundir``.

        ``iommu=False``: VT-d is there (on in the firmware setup), but the kernel boots with
        ``intel_iommu=off``, so the guest has no IOMMU groups until a command line that turns it
        on boots. Debian 12's kernel turns Intel's IOMMU on by itself where VT-d is there
        (``CONFIG_INTEL_IOMMU_DEFAULT_ON_INTGPU_OFF``), so it is off only where the command line
        says so.
        """
        self.image = image
        self.rundir = rundir
        self.accel = accel
        self.iommu = iommu
        self.identity_file = image.identity_file
        self.known_hosts = rundir / "known_hosts"
        self.console_log = rundir / "console.log"
        self.overlay = rundir / "overlay.qcow2"
        self.pidfile = rundir / "qemu.pid"
        self.port = 0
        self.pid: int | None = None
        self.boot_count = 0
        self._boot = self._image_boot_files()
        self._client: paramiko.SSHClient | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = BOOT_TIMEOUT_S) -> None:
        """Create the overlay if needed, start QEMU and wait until SSH answers."""
        with phase("boot") as timed:
            self.rundir.mkdir(parents=True, exist_ok=True)
            if not self.overlay.exists():
                _create_overlay(self.image.base, self.overlay)
            if self._boot_until_ssh(time.monotonic(), timeout):
                timed.name += POWER_CYCLED

    def reboot(self, timeout: float = BOOT_TIMEOUT_S) -> None:
        """Reboot the guest cold, booting the kernel and initramfs now on its /boot."""
        with phase("reboot") as timed:
            started = time.monotonic()
            self._boot = self._fetch_next_boot_files()
            self._request_guest_reboot()
            self._wait_for_qemu_exit(SHUTDOWN_TIMEOUT_S)
            if self._boot_until_ssh(started, timeout):
                timed.name += POWER_CYCLED

    def revive(self) -> None:
        """Boot the host afresh from the image if a failed test left it down, so that the
        next test starts from the image's state and one failure stays one failure."""
        if self._qemu_alive():
            return
        log.warning("the test host is down after a failed test; booting a fresh overlay")
        self.overlay.unlink(missing_ok=True)
        self._boot = self._image_boot_files()
        self.start()

    def _image_boot_files(self) -> BootFiles:
        """The kernel, initramfs and command line the image was built with."""
        cmdline = self.image.cmdline if self.iommu else without_iommu(self.image.cmdline)
        return BootFiles(self.image.kernel, self.image.initrd, cmdline)

    def stop(self) -> None:
        """Stop QEMU by its PID (SIGTERM, then SIGKILL); the overlay is kept for inspection."""
        self._close_client()
        pid = self.pid
        if pid is not None and self._qemu_alive():
            for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                if wait_for(lambda: not self._qemu_alive(), grace, poll=0.25):
                    break
        self._forget_qemu()

    # -- commands ----------------------------------------------------------------------------

    def ssh(
        self, argv: list[str], timeout: float = SSH_COMMAND_TIMEOUT_S, stdin: bytes = b""
    ) -> tuple[int, str, str]:
        """Run ``argv`` in the guest; return (exit status, stdout, stderr).

        The argv is quoted with shlex.join here and nowhere else, so callers never build shell
        strings. Raises TimeoutError if the command is not done within ``timeout`` seconds.
        """
        command = shlex.join(argv)
        deadline = time.monotonic() + timeout
        channel = self._transport().open_session(timeout=timeout)
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = _drain(channel, deadline, command)
            return channel.recv_exit_status(), _text(out), _text(err)
        finally:
            channel.close()

    def fetch(self, remote: str, local: Path, timeout: float = SSH_COMMAND_TIMEOUT_S) -> None:
        """Copy the guest file ``remote`` to ``local`` over SFTP."""
        with self._sftp(timeout) as sftp:
            sftp.get(remote, str(local))

    def console_tail(self, lines: int = 80) -> str:
        """The last ``lines`` lines of the serial console log (all boots, in order)."""
        try:
            with self.console_log.open("rb") as handle:
                handle.seek(max(0, handle.seek(0, os.SEEK_END) - 256 * 1024))
                text = _text(handle.read())
        except FileNotFoundError:
            return "(no console log yet)"
        # systemd colours its status lines; escape codes only clutter a test report.
        text = _ANSI_ESCAPE.sub("", text.replace("\r", ""))
        return "\n".join(text.splitlines()[-lines:])

    # -- QEMU --------------------------------------------------------------------------------

    def _boot_until_ssh(self, started: float, timeout: float) -> bool:
        """Launch QEMU and wait for SSH; return whether the boot had to be power-cycled.

        A boot that stalls, or whose QEMU exits by itself, is power-cycled once, as an operator
        would a hung server: the same kernel, initramfs and disk boot again, so a failure that
        the tested state causes comes back on the second boot and fails the test.
        """
        try:
            self._boot_once(timeout)
            power_cycled = False
        except BootStalledError as stall:
            log.warning("%s; power-cycling the test host once", str(stall).splitlines()[0])
            self._boot_once(timeout)
            power_cycled = True
        seconds = time.monotonic() - started
        log.info("test host up after %.1f s (QEMU launch %d)", seconds, self.boot_count)
        return power_cycled

    def _boot_once(self, timeout: float) -> None:
        """Launch QEMU and wait for SSH; on any failure leave no QEMU running."""
        self._launch_qemu()
        try:
            self._wait_for_ssh(timeout)
        except BaseException:
            self.stop()
            raise

    def _launch_qemu(self) -> None:
        """Start QEMU daemonized on a free loopback port; retry if the port was taken."""
        error: str | None = None
        for _attempt in range(3):
            port = _free_port()
            argv = qemu_argv(self._boot, self.overlay, self.rundir, port, self.accel)
            self.boot_count += 1
            with self.console_log.open("a") as console:
                console.write(f"\n===== proxgpu test harness: boot {self.boot_count} =====\n")
            (self.rundir / "qemu-cmdline.txt").write_text(shlex.join(argv) + "\n")
            self.pidfile.unlink(missing_ok=True)
            error = _run_daemonizing(argv, self.rundir / "qemu.stderr")
            if error is None:
                self.pid = int(self.pidfile.read_text())
                _LIVE_HOSTS.add(self)
                self._watchdog = _start_watchdog(self.pid, self.pidfile)
                self.port = port
                self._write_known_hosts()
                return
            # Another process may grab the probed port before QEMU binds it; try a new one.
            if "host forwarding rule" not in error:
                raise TestHostError(f"QEMU failed to start: {error}")
        raise TestHostError(f"QEMU could not bind a loopback port: {error}")

    def _qemu_alive(self) -> bool:
        """Tell whether our QEMU still runs; the PID is checked to still be ours."""
        if self.pid is None:
            return False
        proc = Path(f"/proc/{self.pid}")
        try:
            state = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = proc.joinpath("cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return False
        # A zombie has exited already; a different cmdline means the PID was reused.
        return state != "Z" and str(self.pidfile).encode() in cmdline

    def _wait_for_qemu_exit(self, timeout: float) -> None:
        """Wait for QEMU to exit after the guest shut down (it runs with -no-reboot)."""
        if not wait_for(lambda: not self._qemu_alive(), timeout, poll=0.25):
            raise TestHostError(
                f"guest did not power off within {timeout:.0f} s\n{self.console_tail()}"
            )
        self._forget_qemu()

    def _forget_qemu(self) -> None:
        """Drop the bookkeeping of a QEMU that has exited, reaping its watchdog."""
        self.pid = None
        _LIVE_HOSTS.discard(self)
        if self._watchdog is not None:
            # The watchdog notices QEMU's exit within a second and ends by itself.
            try:
                self._watchdog.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
            self._watchdog = None

    def _write_known_hosts(self) -> None:
        """Pin the guest's build-time host key for the port of this boot."""
        key_type, key_b64 = self.image.host_public_key.read_text().split()[:2]
        self.known_hosts.write_text(f"[{LOOPBACK}]:{self.port} {key_type} {key_b64}\n")

    # -- SSH ---------------------------------------------------------------------------------

    def _wait_for_ssh(self, timeout: float) -> None:
        """Poll until an SSH login works; fail early if QEMU dies or the host key is wrong."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        console = _ConsoleWatch(self.console_log)
        while time.monotonic() < deadline:
            if not self._qemu_alive():
                # Once under TCG on a loaded CI machine, QEMU exited 0.1 s into the kernel's
                # boot, before anything the tests change runs: the boot is power-cycled once.
                stderr = _tail_of(self.rundir / "qemu.stderr")
                raise BootStalledError(
                    f"QEMU exited while booting (its stderr: {stderr or 'empty'})\n"
                    f"{self.console_tail()}"
                )
            if console.silent_for() > CONSOLE_STALL_S:
                raise BootStalledError(
                    f"the boot stalled: no console output for {CONSOLE_STALL_S:.0f} s and no SSH"
                    f"\n{self.console_tail()}"
                )
            try:
                # A bare banner probe first: paramiko logs every failed attempt as an ERROR
                # with a traceback, which would bury the useful log lines of a boot.
                if _ssh_banner_seen(self.port):
                    self._client = self._connect()
                    return
            except (HostKeyNotPinned, paramiko.AuthenticationException):
                raise
            except (OSError, EOFError, paramiko.SSHException) as exc:
                last_error = exc  # sshd may still be settling; try again
            time.sleep(POLL_INTERVAL_S)
        raise TestHostError(
            f"no SSH login within {timeout:.0f} s (last error: {last_error!r})\n"
            f"{self.console_tail()}"
        )

    def _connect(self) -> paramiko.SSHClient:
        """Open an SSH session that trusts only the pinned host key."""
        client = paramiko.SSHClient()
        client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_PinnedKeyPolicy())
        try:
            client.connect(
                LOOPBACK,
                port=self.port,
                username=self.user,
                key_filename=str(self.identity_file),
                look_for_keys=False,
                allow_agent=False,
                timeout=SSH_CONNECT_TIMEOUT_S,
                banner_timeout=SSH_HANDSHAKE_TIMEOUT_S,
                auth_timeout=SSH_HANDSHAKE_TIMEOUT_S,
            )
        except BaseException:
            client.close()
            raise
        return client

    def _transport(self) -> paramiko.Transport:
        """The live SSH transport, reconnecting once if the old one went away."""
        transport = self._client.get_transport() if self._client else None
        if transport is None or not transport.is_active():
            self._close_client()
            if not self._qemu_alive():
                raise TestHostError("the test host is not running")
            self._client = self._connect()
            transport = self._client.get_transport()
            assert transport is not None  # connect() succeeded, so there is one
        return transport

    @contextlib.contextmanager
    def _sftp(self, timeout: float) -> Iterator[paramiko.SFTPClient]:
        """An SFTP session on the live connection, its reads bounded by ``timeout``."""
        sftp = paramiko.SFTPClient.from_transport(self._transport())
        if sftp is None:
            raise TestHostError("the guest refused the SFTP subsystem")
        try:
            channel = sftp.get_channel()
            if channel is not None:
                channel.settimeout(timeout)
            yield sftp
        finally:
            sftp.close()

    def _close_client(self) -> None:
        """Drop the SSH connection, if any."""
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- reboot ------------------------------------------------------------------------------

    def _fetch_next_boot_files(self) -> BootFiles:
        """Copy the kernel, initramfs and command line the guest would boot next.

        Where the guest has a ``grub.cfg`` (update-grub made one), that is GRUB's default entry,
        with the ``BOOT_IMAGE=`` GRUB passes; else, as proxmox-boot-tool's systemd-boot entries
        do, the highest kernel version that has an initrd, with ``/etc/kernel/cmdline``.
        """
        target = self.rundir / f"boot{self.boot_count + 1}"
        target.mkdir(exist_ok=True)
        boot = BootFiles(target / "vmlinuz", target / "initrd.img", self._boot.cmdline)
        with self._sftp(SSH_COMMAND_TIMEOUT_S) as sftp:
            grub = _read_text(sftp, GRUB_CFG)
            if grub is not None:
                kernel, initrd, parameters = grub_default_entry(grub)
                boot = BootFiles(boot.kernel, boot.initrd, f"BOOT_IMAGE={kernel} {parameters}")
            else:
                version = _newest_kernel(set(sftp.listdir("/boot")))
                kernel, initrd = f"/boot/vmlinuz-{version}", f"/boot/initrd.img-{version}"
                cmdline = _read_text(sftp, "/etc/kernel/cmdline")
                if cmdline is not None:
                    boot = BootFiles(boot.kernel, boot.initrd, cmdline.strip())
            sftp.get(kernel, str(boot.kernel))
            sftp.get(initrd, str(boot.initrd))
        log.info("next boot: kernel %s, cmdline %r", kernel, boot.cmdline)
        return boot

    def _request_guest_reboot(self) -> None:
        """Ask systemd to reboot; the connection may drop before the command returns."""
        with contextlib.suppress(TimeoutError, EOFError, OSError, paramiko.SSHException):
            self.ssh(["systemctl", "reboot"], timeout=30)
        self._close_client()


def qemu_argv(boot: BootFiles, overlay: Path, rundir: Path, port: int, accel: str) -> list[str]:
    """The full QEMU command line for one boot of the test host."""
    if accel == "kvm":
        accel_args = ["-accel", "kvm", "-cpu", "host"]
    else:
        # A 256 MiB translation cache halves QEMU's RSS (1.5 GiB -> ~670 MiB) at no speed cost.
        # An Intel CPU, as the IOMMU is Intel's (VT-d): proxgpu's advice for turning the IOMMU on
        # follows the CPU's vendor. The image's kernel command line has mitigations=off: under
        # TCG they protect nothing, and PTI alone made every exec 1.5x slower.
        accel_args = ["-accel", "tcg,thread=multi,tb-size=256", "-cpu", "max,vendor=GenuineIntel"]
    console = rundir / "console.log"
    return [
        "qemu-system-x86_64",
        "-machine", "q35,kernel-irqchip=split",
        *accel_args,
        "-smp", "2,sockets=2,cores=1,threads=1",
        "-m", "1024M",
        "-object", "memory-backend-ram,id=mem0,size=512M",
        "-object", "memory-backend-ram,id=mem1,size=512M",
        "-numa", "node,nodeid=0,cpus=0,memdev=mem0",
        "-numa", "node,nodeid=1,cpus=1,memdev=mem1",
        "-device", "intel-iommu,intremap=on",
        "-nodefaults", "-display", "none", "-vga", "none",
        # append=on keeps the console output of every boot in one file.
        "-chardev", f"file,id=console,path={console},append=on",
        "-serial", "chardev:console",
        "-kernel", str(boot.kernel),
        "-initrd", str(boot.initrd),
        "-append", boot.cmdline,
        "-drive", f"file={overlay},if=none,id=disk0,format=qcow2,cache=unsafe",
        "-device", "virtio-blk-pci,drive=disk0",
        "-netdev", f"user,id=net0,restrict=on,hostfwd=tcp:{LOOPBACK}:{port}-:22",
        "-device", "virtio-net-pci,netdev=net0",
        *gpu_topology_args(),
        # A guest reboot makes QEMU exit; the harness restarts it (see the module docstring).
        "-no-reboot",
        "-daemonize", "-pidfile", str(rundir / "qemu.pid"),
    ]  # fmt: skip


def without_iommu(cmdline: str) -> str:
    """``cmdline`` with Intel's IOMMU turned off instead of on.

    >>> without_iommu("root=/dev/vda intel_iommu=on panic=-1")
    'root=/dev/vda panic=-1 intel_iommu=off'
    """
    kept = [word for word in cmdline.split() if not word.startswith("intel_iommu=")]
    return " ".join([*kept, "intel_iommu=off"])


def gpu_topology_args() -> list[str]:
    """Two NUMA-bound expander bridges, each with four (display + audio) stand-in GPUs."""
    args: list[str] = []
    for node, bus in NODE_BUS_BASE.items():
        args += ["-device", f"pxb-pcie,id=pxb{node},bus_nr={bus},numa_node={node},bus=pcie.0"]
        for slot in range(GPUS_PER_NODE):
            port = f"rp{node}{slot}"
            chassis = node * GPUS_PER_NODE + slot + 1
            args += [
                "-device", f"pcie-root-port,id={port},bus=pxb{node},chassis={chassis},slot=0,"
                f"addr={slot}.0",
                "-device", f"bochs-display,id=gpu{node}{slot},bus={port},addr=0.0,"
                "multifunction=on",
                "-device", f"ich9-intel-hda,id=hda{node}{slot},bus={port},addr=0.1",
            ]  # fmt: skip
    return args


def _tail_of(path: Path, size: int = 2000) -> str:
    """The last ``size`` characters of a log, on one line ("" when there is none)."""
    try:
        return " ".join(path.read_text(errors="replace")[-size:].split())
    except FileNotFoundError:
        return ""


class _ConsoleWatch:
    """How long the serial console log has not grown (it grows while a guest boots)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._size = self._current_size()
        self._since = time.monotonic()

    def _current_size(self) -> int:
        try:
            return self._path.stat().st_size
        except FileNotFoundError:
            return 0

    def silent_for(self) -> float:
        """Seconds since the log last grew (or since watching began)."""
        size = self._current_size()
        if size != self._size:
            self._size, self._since = size, time.monotonic()
        return time.monotonic() - self._since


def _create_overlay(base: Path, overlay: Path) -> None:
    """A throwaway copy-on-write layer over the cached image."""
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2", str(overlay)],
        check=True,
        timeout=60,
    )


def _run_daemonizing(argv: list[str], stderr_path: Path) -> str | None:
    """Run QEMU with -daemonize; return None once it runs, else its error output.

    The foreground process exits only after the machine is set up, so its status says whether
    the launch worked. stderr goes to a file because the daemon inherits it for a moment.
    """
    with stderr_path.open("wb") as stderr:
        result = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            timeout=QEMU_LAUNCH_TIMEOUT_S,
            check=False,
        )
    if result.returncode == 0:
        return None
    return stderr_path.read_text(errors="replace").strip() or f"exit status {result.returncode}"


def _start_watchdog(qemu_pid: int, pidfile: Path) -> subprocess.Popen[bytes]:
    """Make sure QEMU dies with this process, even if pytest is killed without teardown."""
    return subprocess.Popen(
        [sys.executable, str(WATCHDOG), str(os.getpid()), str(qemu_pid), str(pidfile)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # out of reach of signals sent to pytest's process group
    )


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _ssh_banner_seen(port: int) -> bool:
    """Tell whether something on ``port`` sends an SSH banner.

    Until sshd listens in the guest, QEMU's user network accepts the TCP connection and then
    closes it (or says nothing), so a plain connect() proves nothing.
    """
    try:
        with socket.create_connection((LOOPBACK, port), timeout=SSH_CONNECT_TIMEOUT_S) as sock:
            sock.settimeout(SSH_CONNECT_TIMEOUT_S)
            return sock.recv(4) == b"SSH-"
    except OSError:
        return False


def _drain(channel: paramiko.Channel, deadline: float, command: str) -> tuple[bytes, bytes]:
    """Read stdout and stderr until the command exits, or raise TimeoutError at ``deadline``."""
    out, err = bytearray(), bytearray()
    while True:
        while channel.recv_ready():
            out += channel.recv(65536)
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(65536)
        # sshd sends EOF after the last byte of output and then the exit status.
        if channel.exit_status_ready() and channel.eof_received:
            if not (channel.recv_ready() or channel.recv_stderr_ready()):
                return bytes(out), bytes(err)
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"test host command did not finish in time: {command}")
        time.sleep(0.02)


def _newest_kernel(names: set[str]) -> str:
    """The highest kernel version in /boot (``names``) that has an initrd."""
    versions = [
        name.removeprefix("vmlinuz-")
        for name in names
        if name.startswith("vmlinuz-") and "initrd.img-" + name.removeprefix("vmlinuz-") in names
    ]
    if not versions:
        raise TestHostError(f"no kernel with an initrd in the guest's /boot: {sorted(names)}")
    return max(versions, key=_version_key)


def grub_default_entry(grub_cfg: str) -> tuple[str, str, str]:
    """The kernel, initrd and kernel parameters of a grub.cfg's first menu entry: the one GRUB
    boots with update-grub's ``GRUB_DEFAULT=0``.

    >>> grub_default_entry(
    ...     "set default=0\\nmenuentry 'Debian GNU/Linux' {\\n\\techo 'Loading Linux ...'\\n"
    ...     "\\tlinux\\t/boot/vmlinuz-6.1 root=UUID=1f ro quiet\\n"
    ...     "\\tinitrd\\t/boot/initrd.img-6.1\\n}\\n"
    ... )
    ('/boot/vmlinuz-6.1', '/boot/initrd.img-6.1', 'root=UUID=1f ro quiet')
    """
    _, found, entry = grub_cfg.partition("\nmenuentry ")
    linux = re.search(r"^\s*linux\s+(\S+)[ \t]*(.*)$", entry, re.MULTILINE)
    initrd = re.search(r"^\s*initrd\s+(\S+)", entry, re.MULTILINE)
    if not (found and linux and initrd):
        raise TestHostError(f"no menu entry with a kernel and an initrd in {GRUB_CFG}")
    return linux.group(1), initrd.group(1), linux.group(2).strip()


def _read_text(sftp: paramiko.SFTPClient, path: str) -> str | None:
    """A guest file's text, or None where it does not exist."""
    try:
        with sftp.open(path) as handle:
            return _text(handle.read())
    except FileNotFoundError:
        return None


def _version_key(version: str) -> tuple[tuple[int, str], ...]:
    """Sort key that orders kernel versions numerically (6.1.0-10 after 6.1.0-9)."""
    parts = re.split(r"(\d+)", version)
    return tuple((int(part), "") if part.isdigit() else (-1, part) for part in parts)


def _text(data: bytes) -> str:
    """Decode command output, never failing on stray bytes."""
    return data.decode("utf-8", errors="replace")
