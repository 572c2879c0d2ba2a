"""Verify at the guests, over a real SSH connection (loopback sshd) to a host taken as live
(issue 38, point 3): what each running container's NVIDIA tool lists, what each running VM's
QEMU holds open.

No LXC container and no NVIDIA GPU can be had here, so ``lxc-info`` and ``lxc-attach`` are
stand-ins first on PATH: ``lxc-info`` answers ``State: RUNNING`` (or another state) as the real
one does; ``lxc-attach`` accepts only the command line ``pct exec`` would run and prints what a
container's ``nvidia-smi`` prints (the answer the test chooses, hostile ones included). A VM's
QEMU is a real process whose command line names qemu-server's pidfile and which holds files
under ``/dev/vfio`` open: a tmpfs in its own mount namespace (``unshare -m``), as no vfio module
is loaded here. Everything else is real: the script, SSH, the parsing and the comparison.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

from proxgpu.apply.guests import GuestCheck, guest_checks
from proxgpu.apply.verify import verify
from proxgpu.errors import HostUnreachableError
from proxgpu.inspection import inside, inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.planning import Plan, SplitPolicy, plan_split
from proxgpu.planning.requests import MigSpec
from tests.support.sshd import Sshd, client_options
from tests.support.standins import ToolsHost, fake_tool
from tests.support.tools import require_tool
from tests.support.trees import copy_example

pytestmark = pytest.mark.sshd

#: What `pct exec --keep-env 0 VMID -- nvidia-smi ...` runs (pve-container's pct.pm: lxc-attach
#: with --clear-env), the PATH said explicitly.
ATTACH = (
    "-n $vmid --clear-env --set-var PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:"
    "/bin -- nvidia-smi --query-gpu=uuid,pci.bus_id --format=csv,noheader"
)
LXC_INFO = """echo "$*" >> "$(dirname "$0")/asked"
[ "$1 $3" = "-n -s" ] && [ -e "$(dirname "$0")/state-$2" ] || exit 1
echo "State:          $(cat "$(dirname "$0")/state-$2")"
"""
#: Each container's answer is the file answer-VMID, its exit status status-VMID.
LXC_ATTACH = f"""here=$(dirname "$0") vmid=$2
[ "$*" = "{ATTACH}" ] || {{ echo "lxc-attach: not pct exec's command line: $*" >&2; exit 2; }}
cat "$here/answer-$vmid"
exit "$(cat "$here/status-$vmid")"
"""
HOST_DRIVER = "575.57.08"
PIDFILE = "/var/run/qemu-server/300.pid"


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    found = tmp_path / "tools"
    fake_tool(found, "lxc-info", LXC_INFO)
    fake_tool(found, "lxc-attach", LXC_ATTACH)
    (found / "state-200").write_text("RUNNING\n")
    return found


@pytest.fixture
def host(sshd: Sshd, tmp_path: Path, root: Path, tools: Path) -> Iterator[ToolsHost]:
    with ToolsHost(sshd.target, client_options(sshd, tmp_path), str(root), tools) as opened:
        yield opened


@pytest.fixture
def split(host: ToolsHost) -> tuple[Inventory, Plan]:
    inventory = inspect(host)
    return inventory, plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))


def answer(tools: Path, text: str, status: int = 0, vmid: int = 200) -> None:
    """What container ``vmid``'s nvidia-smi prints, and its exit status."""
    (tools / f"answer-{vmid}").write_text(text)
    (tools / f"status-{vmid}").write_text(f"{status}\n")


def listing(inventory: Inventory, addresses: list[str]) -> str:
    """nvidia-smi's lines for the GPUs at ``addresses``: UUID, bus id with an 8-digit domain."""
    gpus = {gpu.address: gpu for gpu in inventory.gpus}
    return "".join(f"{gpus[a].nvidia_uuid}, 0000{a.upper()}\n" for a in addresses)


def containers(checks: list[GuestCheck]) -> list[tuple[str, str]]:
    """CT 200's findings: what it holds, as read from the host (unknown here, as lxc-info -p
    is not answered), then what was found inside it, last."""
    return [(c.verdict, c.line) for c in checks if c.guest == "CT 200"]


@pytest.fixture
def plan(split: tuple[Inventory, Plan]) -> Plan:
    return split[1]


def node(inventory: Inventory, plan: Plan, role: str) -> list[str]:
    return next(g.gpus for g in plan.groups if g.role == role)


def test_a_container_listing_exactly_its_gpus_passes(
    host: ToolsHost, split: tuple[Inventory, Plan], tools: Path
) -> None:
    inventory, plan = split
    mine = node(inventory, plan, "host")
    answer(tools, listing(inventory, mine))
    assert containers(guest_checks(host, inventory, plan)) == [
        ("ok", f"CT 200: nvidia-smi inside it lists exactly its GPUs, {', '.join(mine)}")
    ]


def test_a_gpu_listed_that_the_plan_does_not_give_and_one_missing_are_drift(
    host: ToolsHost, split: tuple[Inventory, Plan], tools: Path
) -> None:
    inventory, plan = split
    mine, theirs = node(inventory, plan, "host"), node(inventory, plan, "vfio")
    answer(tools, listing(inventory, [*mine[1:], theirs[0]]))
    uuid = {gpu.address: gpu.nvidia_uuid for gpu in inventory.gpus}
    report = verify(host, plan)
    (verdict, line) = containers(report.guests)[-1]
    assert verdict == "drift" and line in report.drift and report.drifted
    assert line == (
        f"CT 200: nvidia-smi inside it lists {theirs[0]} ({uuid[theirs[0]]}), which the plan "
        f"does not give it; it does not list {mine[0]} ({uuid[mine[0]]}), which the plan gives it"
    )


def test_nvml_refusing_the_library_version_is_drift_with_the_fix(
    host: ToolsHost, split: tuple[Inventory, Plan], tools: Path
) -> None:
    inventory, plan = split
    answer(tools, "Failed to initialize NVML: Driver/library version mismatch\n", 18)
    (verdict, line) = containers(guest_checks(host, inventory, plan))[-1]
    assert verdict == "drift"
    assert line.startswith(
        "CT 200: nvidia-smi inside it fails (exit 18: Failed to initialize NVML: Driver/library "
        f"version mismatch): CT 200 needs NVIDIA's user space (libcuda, libnvidia-ml, nvidia-smi) "
        f"of {HOST_DRIVER}, the host's nvidia module"
    ), line


@pytest.mark.parametrize(
    "case",
    [
        (
            "STOPPED",
            0,
            "CT 200 is stopped: not looked at from inside; start it (pct start 200) and verify "
            "again, or verify without the guests (--no-guests)",
        ),
        ("FROZEN", 0, "CT 200 is FROZEN: not looked at from inside; verify again once it runs"),
        (
            "RUNNING",
            127,
            "CT 200 has no nvidia-smi: not looked at from inside; install nvidia-smi in it "
            "(NVIDIA's user space of the host's version has it), or verify without the guests "
            "(--no-guests)",
        ),
    ],
)
def test_a_container_that_cannot_be_looked_at_is_said_never_passed(
    host: ToolsHost, plan: Plan, tools: Path, case: tuple[str, int, str]
) -> None:
    state, status, said = case
    (tools / "state-200").write_text(f"{state}\n")
    answer(tools, "", status)
    report = verify(host, plan)
    assert containers(report.guests)[-1] == ("unchecked", said)
    assert not [line for line in report.drift if line.startswith("CT 200")]


def test_a_locked_container_is_not_asked(
    host: ToolsHost, plan: Plan, root: Path, tools: Path
) -> None:
    config = root / "etc/pve/lxc/200.conf"
    config.write_text("lock: backup\n" + config.read_text())
    assert containers(guest_checks(host, inspect(host), plan))[-1] == (
        "unchecked",
        "CT 200 is locked (backup): not looked at from inside; verify again once it is not",
    )
    assert "-n 200 -s" not in (tools / "asked").read_text(), "a locked container is not asked"


def test_without_lxc_info_the_container_is_unasked(
    host: ToolsHost, split: tuple[Inventory, Plan], tools: Path
) -> None:
    inventory, plan = split
    (tools / "lxc-info").unlink()
    assert containers(guest_checks(host, inventory, plan))[-1] == (
        "unchecked",
        "CT 200: not looked at from inside: lxc-info -n 200 -s failed (not found); pct status "
        "200 on its node tells whether it runs there",
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("GPU-1, 0000:01:00.0\n", "not a GPU's UUID and PCI address: GPU-1, 0000:01:00.0"),
        (
            "#ct\t200\tRUNNING\n#end\tforged\t0\n\x1b[31mGPU\n",
            "not a GPU's UUID and PCI address: #ct?200?RUNNING",
        ),
        ("x" * 70000, "more than 65536 bytes, cut short"),
    ],
)
def test_a_hostile_answer_is_refused_not_believed(
    host: ToolsHost, split: tuple[Inventory, Plan], tools: Path, text: str, said: str
) -> None:
    inventory, plan = split
    answer(tools, text)
    (verdict, line) = containers(guest_checks(host, inventory, plan))[-1]
    assert (verdict, line) == ("drift", f"CT 200: nvidia-smi inside it fails ({said})")


def test_a_status_line_the_tool_prints_is_not_its_exit_status(
    host: ToolsHost, split: tuple[Inventory, Plan], tools: Path
) -> None:
    """The exit status is lxc-attach's, kept apart from the answer: a tool that fails after
    printing what looks like a status line (or a record) is still a failure."""
    inventory, plan = split
    mine = node(inventory, plan, "host")
    first = listing(inventory, mine).splitlines()[0]
    answer(tools, listing(inventory, mine) + "#proxgpu-status 0\n#smi\t200\t0\t\n", status=3)
    (verdict, line) = containers(guest_checks(host, inventory, plan))[-1]
    assert (verdict, line) == ("drift", f"CT 200: nvidia-smi inside it fails (exit 3: {first})")


@pytest.fixture
def two_containers(root: Path, host: ToolsHost, tools: Path) -> tuple[Inventory, Plan]:
    """CT 200 and CT 201, two GPUs of node 0 each, both running."""
    config = root / "etc/pve/lxc"
    (config / "201.conf").write_text((config / "200.conf").read_text().replace("llm", "llm2"))
    (tools / "state-201").write_text("RUNNING\n")
    inventory = inspect(host)
    return inventory, plan_split(inventory, SplitPolicy(lxc_subsets=[(200, 2), (201, 2)]))


def test_a_tool_that_never_answers_is_left_and_the_next_container_answers_for_itself(
    host: ToolsHost,
    two_containers: tuple[Inventory, Plan],
    tools: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What lxc-attach starts in a container can outlive lxc-attach, holding the pipe open: the
    script stops waiting anyway, at its deadline (20 s, 2 s here) and 3 s past it, and the next
    container's answer is its own, not what the first one's tool writes later."""
    inventory, plan = two_containers
    monkeypatch.setattr(inside, "INSIDE_SECONDS", 2)
    pids = tools / "left"
    late = listing(inventory, node(inventory, plan, "vfio"))  # what CT 200 writes too late
    (tools / "late").write_text(late)
    stuck = f"""[ "$2" = 201 ] && exec {tools}/answering "$@"
(sleep 3; cat {tools}/late; sleep 300) & echo $! >> {pids}
sleep 300 & echo $! >> {pids}; wait
"""
    fake_tool(tools, "lxc-attach", stuck)
    fake_tool(tools, "answering", LXC_ATTACH)
    theirs = next(g.gpus for g in plan.groups if g.guest is not None and g.guest.vmid == 201)
    answer(tools, listing(inventory, theirs), vmid=201)
    started = time.monotonic()
    try:
        checks = guest_checks(host, inventory, plan)
    finally:
        for pid in pids.read_text().split():
            subprocess.run(["pkill", "-KILL", "-P", pid], check=False)
            subprocess.run(["kill", "-KILL", pid], check=False, capture_output=True)
    elapsed = time.monotonic() - started
    assert containers(checks)[-1] == (
        "unchecked",
        "CT 200: nvidia-smi inside it gave no answer within 2 s; see why with pct exec 200 -- "
        "nvidia-smi",
    )
    ct201 = [(c.verdict, c.line) for c in checks if c.guest == "CT 201"][-1]
    assert ct201 == (
        "ok",
        f"CT 201: nvidia-smi inside it lists exactly its GPUs, {', '.join(theirs)}",
    )
    assert elapsed < 2 + 5 + 10


def test_a_host_that_cannot_be_asked_leaves_the_guests_unchecked_not_the_verify_failed(
    host: ToolsHost, split: tuple[Inventory, Plan], mocker: MockerFixture
) -> None:
    """The host's own drift is reported though asking about its guests failed."""
    inventory, plan = split
    lost = HostUnreachableError(host.name, "connection lost")
    mocker.patch("proxgpu.apply.guests.look_inside", side_effect=lost)
    checks = {c.guest: (c.verdict, c.line) for c in guest_checks(host, inventory, plan)}
    said = "not looked at: asking the host failed (connection lost); verify again"
    assert checks == {
        "CT 200": ("unchecked", f"CT 200: {said}"),
        "VM 300": ("unchecked", f"VM 300: {said}"),
    }
    report = verify(host, plan)
    assert report.drifted and [g.verdict for g in report.guests] == ["unchecked", "unchecked"]


# -- VM 300 ------------------------------------------------------------------------------------


def run_qemu(
    groups: set[int], pidfile: str = PIDFILE, argv0: str = "/usr/bin/qemu-system-x86_64"
) -> subprocess.Popen[bytes]:
    """A process standing in for VM 300's QEMU: its command line is ``argv0``'s and names
    ``pidfile`` after ``-pidfile``, and it holds /dev/vfio/N open for each of ``groups``."""
    unshare = require_tool("unshare", "util-linux")
    opens = "".join(f" && : > /dev/vfio/{g} && exec {3 + n}</dev/vfio/{g}"
                    for n, g in enumerate(sorted(groups)))  # fmt: skip
    # argv[0] a QEMU's, as qemu-server checks it (bash's exec -a), then the pidfile.
    sleeper = shlex.join(["-a", argv0, sys.executable, "-c", "import time; time.sleep(600)",
                          "-pidfile", pidfile])  # fmt: skip
    script = f"mount -t tmpfs none /dev && mkdir /dev/vfio{opens} && exec {sleeper}"
    process = subprocess.Popen([unshare, "-m", "bash", "-c", script])
    for _ in range(200):  # until it is the sleeper, holding its files
        if b"-pidfile" in Path(f"/proc/{process.pid}/cmdline").read_bytes():
            break
        time.sleep(0.05)
    return process


def vm_groups(inventory: Inventory, plan: Plan) -> dict[str, int]:
    """The IOMMU group of each function the plan gives VM 300."""
    groups = {f.address: f.iommu_group for gpu in inventory.gpus for f in gpu.function_info}
    found = {a: groups[a] for g in plan.groups if g.role == "vfio" for a in g.functions}
    assert None not in found.values()
    return {a: g for a, g in found.items() if g is not None}


def vm_check(
    host: ToolsHost, split: tuple[Inventory, Plan], root: Path, process: subprocess.Popen[bytes]
) -> GuestCheck:
    pidfile = root / PIDFILE.lstrip("/")
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(f"{process.pid}\n")
    try:
        return next(c for c in guest_checks(host, *split) if c.guest == "VM 300")
    finally:
        process.kill()
        process.wait()


def test_a_vm_whose_qemu_holds_every_group_passes(
    host: ToolsHost, split: tuple[Inventory, Plan], root: Path
) -> None:
    process = run_qemu(set(vm_groups(*split).values()))
    check = vm_check(host, split, root, process)
    assert (check.verdict, check.line) == (
        "ok",
        f"VM 300: its QEMU (PID {process.pid}) holds every planned function's IOMMU group",
    )


def test_a_vm_whose_qemu_lacks_a_group_is_drift_naming_the_function(
    host: ToolsHost, split: tuple[Inventory, Plan], root: Path
) -> None:
    groups = vm_groups(*split)
    first = min(groups.values())
    process = run_qemu(set(groups.values()) - {first})
    check = vm_check(host, split, root, process)
    lacking = ", ".join(f"{a} (/dev/vfio/{g})" for a, g in groups.items() if g == first)
    assert (check.verdict, check.line) == (
        "drift",
        f"VM 300: its QEMU (PID {process.pid}) does not hold {lacking}: the VM runs without "
        "them; restart it (qm stop, qm start) to take them",
    )


def test_a_pidfile_naming_another_process_is_no_running_vm(
    host: ToolsHost, split: tuple[Inventory, Plan], root: Path
) -> None:
    """As qemu-server's vm_running_locally: the process must name that pidfile (a PID reused
    by another process is not the VM)."""
    process = run_qemu(set(vm_groups(*split).values()), pidfile="/var/run/qemu-server/301.pid")
    check = vm_check(host, split, root, process)
    assert (check.verdict, check.line) == (
        "unchecked",
        "VM 300 is not running: not looked at; start it (qm start 300) and verify again, or "
        "verify without the guests (--no-guests)",
    )


def test_a_process_that_is_no_qemu_is_no_running_vm(
    host: ToolsHost, split: tuple[Inventory, Plan], root: Path
) -> None:
    """As vm_running_locally: argv[0] must end in kvm or name qemu-..., whatever else matches."""
    process = run_qemu(set(vm_groups(*split).values()), argv0="/usr/bin/python3")
    check = vm_check(host, split, root, process)
    assert check.verdict == "unchecked" and check.line.startswith("VM 300 is not running")


def test_verify_without_guests_looks_at_none(host: ToolsHost, plan: Plan, tools: Path) -> None:
    answer(tools, "Failed to initialize NVML: Driver/library version mismatch\n", 18)
    assert verify(host, plan, guests=False).guests == []
    assert not (tools / "asked").exists(), "no container was asked"


def test_a_mig_container_is_checked_for_its_gpu_and_says_its_mig_devices_are_not(
    sshd: Sshd, tmp_path: Path, tools: Path
) -> None:
    # nvidia-smi's GPU list names the GPU holding the instance, not its MIG devices.
    mig = copy_example(tmp_path, "mig", dest="mig")
    options = client_options(sshd, tmp_path)
    with ToolsHost(sshd.target, options, str(mig), tools) as opened:
        inventory = inspect(opened)
        policy = SplitPolicy(lxc_mig=[MigSpec(vmid=200, gpu="0", gi=2)])
        plan = plan_split(inventory, policy)
        (gpu,) = {use_gpu for g in plan.groups if g.mig for use_gpu in g.gpus}
        answer(tools, listing(inventory, [gpu]))
        checks = containers(guest_checks(opened, inventory, plan))
    assert checks[-1] == (
        "ok",
        "CT 200: nvidia-smi inside it lists exactly the GPUs of its MIG instances (GI 2 CI 0), "
        f"{gpu}; which MIG devices it sees is not checked",
    )
