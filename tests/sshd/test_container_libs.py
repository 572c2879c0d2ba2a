"""Which NVIDIA libraries a container holds, read over a real SSH connection (loopback sshd)
from a host taken as live (issue 38, point 2).

No LXC container can run here, so ``lxc-info`` is a stand-in first on PATH: it answers as the
real one does (``PID: N`` for a running container, nothing for a stopped one) and the tree holds
``proc/N/root/...`` where the kernel would show the container's init's root. Everything else is
real: the script, its walker, SSH and the parsing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proxgpu.inspection import inspect
from proxgpu.inspection.containerlibs import ContainerLibs, read_container_libs
from proxgpu.picture.report import plan_report
from proxgpu.pipeline import propose
from proxgpu.planning import SplitPolicy
from tests.support.sshd import Sshd, client_options
from tests.support.standins import ToolsHost, fake_tool

pytestmark = pytest.mark.sshd

LIB = "usr/lib/x86_64-linux-gnu"
INIT_ROOT = "proc/4242/root"
#: A stand-in lxc-info for CT 200 running with init 4242 (as `lxc-info -n 200 -p` prints it).
RUNNING = '[ "$*" = "-n 200 -p" ] || exit 1\necho "PID:          4242"\n'
HOST_DRIVER = "575.57.08"


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    found = tmp_path / "tools"
    found.mkdir()
    return found


@pytest.fixture
def host(sshd: Sshd, tmp_path: Path, root: Path, tools: Path) -> ToolsHost:
    return ToolsHost(sshd.target, client_options(sshd, tmp_path), str(root), tools)


def install(lib: Path, version: str) -> None:
    lib.mkdir(parents=True, exist_ok=True)
    (lib / f"libnvidia-ml.so.{version}").write_bytes(b"")
    (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{version}")


def read(host: ToolsHost) -> ContainerLibs:
    with host:
        [found] = read_container_libs(host, inspect(host), [200])
    return found


def test_a_running_container_is_read_through_its_inits_root(
    host: ToolsHost, root: Path, tools: Path
) -> None:
    fake_tool(tools, "lxc-info", RUNNING)
    install(root / INIT_ROOT / LIB, "550.100")
    found = read(host)
    assert (found.state, found.seen, found.nvml, found.why) == (
        "running",
        "init root",
        "550.100",
        None,
    )


def test_the_plan_names_both_versions_and_the_fix(host: ToolsHost, root: Path, tools: Path) -> None:
    fake_tool(tools, "lxc-info", RUNNING)
    install(root / INIT_ROOT / LIB, "550.100")
    with host:
        (need,) = propose(host, SplitPolicy(lxc=200)).plan.userspace
    assert need.step().startswith(
        "CT 200 holds NVIDIA's user space 550.100 (read through its init's root), but the host's "
        f"nvidia module is {HOST_DRIVER}"
    )


def test_a_container_restarted_while_read_is_unknown(
    host: ToolsHost, root: Path, tools: Path
) -> None:
    # Each call answers another PID, as after a restart between Proxmox's two questions.
    count = tools / "count"
    fake_tool(tools, "lxc-info", f'echo x >> {count}\necho "PID: $((4241 + $(wc -l < {count})))"\n')
    install(root / INIT_ROOT / LIB, HOST_DRIVER)
    found = read(host)
    assert (found.state, found.nvml, found.why) == (
        "unknown",
        None,
        "it restarted while it was read",
    )
    assert found.ask == "pct exec 200 -- ls -l /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"


@pytest.mark.parametrize(
    ("script", "why"),
    [
        ("exit 1\n", "lxc-info -n 200 -p failed (exit 1)"),
        ("echo 'State: RUNNING'\n", "lxc-info -n 200 -p answered no PID"),
        ("exec sleep 60\n", "lxc-info -n 200 -p failed (timed out)"),
    ],
)
def test_lxc_info_failing_leaves_it_unknown(
    host: ToolsHost, tools: Path, script: str, why: str
) -> None:
    fake_tool(tools, "lxc-info", script)
    found = read(host)
    assert (found.state, found.why) == ("unknown", why)
    assert found.ask == "pct exec 200 -- ls -l /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"


def test_without_lxc_info_it_is_unknown(host: ToolsHost) -> None:
    if shutil.which("lxc-info") is not None:
        pytest.skip("this machine has a real lxc-info, which would answer for its own LXC")
    assert read(host).why == "lxc-info -n 200 -p failed (not found)"


def test_a_stopped_container_is_read_through_its_storage(
    host: ToolsHost, root: Path, tools: Path
) -> None:
    fake_tool(tools, "lxc-info", '[ "$*" = "-n 200 -p" ] || exit 1\n')  # stopped: no PID
    (root / "etc/pve/storage.cfg").write_text("zfspool: local-zfs\n\tpool rpool/data\n")
    install(root / "rpool/data/subvol-200-disk-0" / LIB, HOST_DRIVER)
    found = read(host)
    assert (found.state, found.seen, found.nvml) == ("stopped", "storage", HOST_DRIVER)


def test_a_stopped_container_the_host_cannot_see_is_unknown(host: ToolsHost, tools: Path) -> None:
    fake_tool(tools, "lxc-info", "true\n")
    found = read(host)  # the example keeps no storage.cfg
    assert (found.state, found.why) == (
        "stopped",
        "storage 'local-zfs' is not in /etc/pve/storage.cfg",
    )
    assert found.ask is not None and found.ask.startswith("pct mount 200 && ")


def test_a_running_containers_usr_linking_out_is_refused(
    host: ToolsHost, root: Path, tools: Path
) -> None:
    fake_tool(tools, "lxc-info", RUNNING)
    install(root / "elsewhere" / LIB, "999.99.99")
    (root / INIT_ROOT).mkdir(parents=True)
    (root / INIT_ROOT / "usr").symlink_to(root / "elsewhere/usr")
    found = read(host)
    assert (found.state, found.nvml) == ("running", None)
    assert (
        found.why
        == "usr in its init's root is a link, which proxgpu does not follow in a container"
    )


def test_the_report_says_what_the_container_holds(host: ToolsHost, root: Path, tools: Path) -> None:
    """The HTML report's next steps are the plan's: read with the host, as plan reads them."""
    fake_tool(tools, "lxc-info", RUNNING)
    install(root / INIT_ROOT / LIB, "550.100")
    with host:
        report = plan_report(inspect(host), SplitPolicy(lxc=200), host=host)
    assert report.plan is not None
    [need] = report.plan.userspace
    assert need.holds is not None and (need.holds.state, need.holds.nvml) == ("running", "550.100")
