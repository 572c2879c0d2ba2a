"""The device tier: proxgpu against the real NVIDIA host these tests run on.

Nothing here is a stand-in: the GPUs, NVIDIA's kernel module, ``nvidia-smi``, ``nvidia-modprobe``
and CUDA's driver library are the machine's own. The tests need root (the nodes test makes
device nodes in a private mount namespace, leaving the host's /dev alone) and a GPU on nvidia;
``pytest --device tests/device`` runs them (``tests/device/run`` is the prepared script), and
every other run of the suite deselects them, since CI has no GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from proxgpu.host.local import LocalHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inside import smi_listing
from proxgpu.inspection.inventory import Gpu, Inventory
from proxgpu.pci import normalize_pci_address
from proxgpu.planning.model import Plan
from proxgpu.rendering import nodes
from proxgpu.rendering.context import RenderContext, RenderOptions

pytestmark = pytest.mark.device

HERE = Path(__file__).parent
#: How long one nvidia-smi or proxgpu run may take before the test fails.
TIMEOUT = 120
#: A device node as ``stat`` prints it: path under /dev, kind, major and minor (hex), mode
#: (octal), owner and group.
STAT_FORMAT = "%n %F %t:%T %a %u:%g"
#: The container the nodes test renders the boot script for.
RULES_VMID = 200


def _output(*argv: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT, env=env, check=False
    )
    assert done.returncode == 0, f"{argv}: exit {done.returncode}: {done.stderr.strip()}"
    return done.stdout


def smi_gpus() -> dict[str, dict[str, object]]:
    """Each GPU nvidia-smi -q reports, by address: its UUID and minor number, and the NUMA node
    of ``nvidia-smi topo -m`` (``None`` where it says N/A: the firmware gave none)."""
    gpus: dict[str, dict[str, object]] = {}
    current: dict[str, object] = {}
    for line in _output("nvidia-smi", "-q").splitlines():
        if match := re.fullmatch(r"GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.\d)", line):
            current = gpus.setdefault(normalize_pci_address(match[1]), {})
        elif match := re.fullmatch(r"\s+GPU UUID\s+: (\S+)", line):
            current["uuid"] = match[1]
        elif match := re.fullmatch(r"\s+Minor Number\s+: (\S+)", line):
            current["minor"] = int(match[1]) if match[1].isdigit() else None
    order = _output("nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    rows = (row.split(",") for row in order.splitlines())
    by_index = {int(index): normalize_pci_address(bus) for index, bus in rows}
    for index, numa in _topo_numa().items():
        gpus[by_index[index]]["numa"] = numa
    return gpus


def _topo_numa() -> dict[int, int | None]:
    """The "NUMA Affinity" column of ``nvidia-smi topo -m``, by GPU index."""
    rows = [
        [cell.strip() for cell in line.split("\t")]
        for line in _output("nvidia-smi", "topo", "-m").splitlines()
    ]
    header = next(row for row in rows if "NUMA Affinity" in row)
    column = header.index("NUMA Affinity")
    numa: dict[int, int | None] = {}
    for row in rows:
        if row and (match := re.fullmatch(r"GPU(\d+)", row[0])) and len(row) > column:
            numa[int(match[1])] = int(row[column]) if row[column].isdigit() else None
    return numa


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    """This machine as proxgpu reads it (the local host, root /)."""
    return inspect(LocalHost())


def _nvidia_gpus(inventory: Inventory) -> list[Gpu]:
    found = [gpu for gpu in inventory.gpus if gpu.driver == "nvidia"]
    assert found, f"proxgpu found no GPU on nvidia here: {[g.address for g in inventory.gpus]}"
    return found


def test_inspection_reads_each_gpu_as_nvidia_smi_reports_it(inventory: Inventory) -> None:
    """Address, Device Minor, UUID and NUMA node of every GPU on nvidia, against NVIDIA's tool."""
    ours = {
        gpu.address: {"uuid": gpu.nvidia_uuid, "minor": gpu.nvidia_minor, "numa": gpu.numa_node}
        for gpu in _nvidia_gpus(inventory)
    }
    assert ours == smi_gpus()


def test_verify_reads_nvidia_smis_own_answer_as_each_gpu_by_its_uuid(inventory: Inventory) -> None:
    """The query verify runs inside each running container, run here on the host (which sees
    every GPU): NVIDIA's real answer reads as each GPU's UUID and address, as inspection has
    them."""
    answer = _output("nvidia-smi", "--query-gpu=uuid,pci.bus_id", "--format=csv,noheader")
    listed = {address: uuid for uuid, address in smi_listing(answer)}
    assert listed == {gpu.address: gpu.nvidia_uuid for gpu in _nvidia_gpus(inventory)}


def test_run_gives_the_job_the_gpu_it_names(inventory: Inventory) -> None:
    """``proxgpu run --tp 1``: nvidia-smi runs under it, and CUDA in the job sees exactly the
    GPU the summary line names (nvidia-smi itself lists every GPU whatever the job is given)."""
    proxgpu = [sys.executable, "-m", "proxgpu", "run", "--tp", "1", "--"]
    listed = subprocess.run(
        [*proxgpu, "nvidia-smi", "-L"], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert listed.returncode == 0, listed.stderr
    chosen = re.search(r"GPU \d+ \((\S+)\)", listed.stderr)
    assert chosen is not None, listed.stderr
    uuid = next(gpu.nvidia_uuid for gpu in inventory.gpus if gpu.address == chosen[1])
    assert f"(UUID: {uuid})" in listed.stdout
    seen = json.loads(_output(*proxgpu, sys.executable, str(HERE / "cuda_probe.py")))
    assert seen == {"devices": [chosen[1]]}


def _node_paths(inventory: Inventory) -> list[str]:
    """Every node a container given all this host's GPUs gets: the GPUs, the control nodes,
    nvidia-uvm's, MIG's config and monitor capabilities, and nvidia-modeset's where it is
    loaded."""
    paths = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    paths += [f"/dev/nvidia{gpu.nvidia_minor}" for gpu in _nvidia_gpus(inventory)]
    paths += ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    if Path("/sys/module/nvidia_modeset").exists():
        paths.append("/dev/nvidia-modeset")
    return paths


def _nodes_script(inventory: Inventory, paths: list[str], modprobe: str) -> str:
    """The boot script proxgpu writes for ``paths``, with ``modprobe`` as nvidia-modprobe's
    path (where this host has it, which may not be /usr/bin)."""
    plan = Plan(groups=[], warnings=[], tensor_parallel=[])
    ctx = RenderContext(inventory, plan, RenderOptions())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nodes, "NVIDIA_MODPROBE", modprobe)
        nodes.render_nodes_unit(ctx, [nodes.Given(nodes.rules_file(RULES_VMID), (*paths,), "CT")])
    return next(f.after for f in ctx.files if f.path == nodes.NODES_SCRIPT and f.after)


def _report(root: str) -> str:
    """A command printing the nodes under ``root``/dev (``stat``, one a line), then ``#include``
    and the cgroup rules the script wrote."""
    return (
        f"cd {root}/dev && find . -name 'nvidia*' ! -type d | sort | "
        f"xargs stat -c '{STAT_FORMAT}' && echo '#include' && "
        f"cat {root}{nodes.rules_file(RULES_VMID)}"
    )


def _made(output: str) -> tuple[list[str], str]:
    """The stat lines and the cgroup include a run of the nodes script printed."""
    stats, _, include = output.partition("#include\n")
    return sorted(stats.splitlines()), include


def test_the_nodes_script_makes_each_node_as_nvidia_modprobe_does(
    inventory: Inventory, tmp_path: Path
) -> None:
    """The script's mknod way (a host without nvidia-modprobe) and its nvidia-modprobe way give
    the same nodes (kind, major, minor, mode, owner) and the same cgroup rules. The
    nvidia-modprobe way runs in a private mount namespace on empty /dev and /run."""
    modprobe = shutil.which("nvidia-modprobe")
    assert modprobe, "the device tier needs NVIDIA's nvidia-modprobe on PATH"
    paths = _node_paths(inventory)
    script = tmp_path / "nodes.sh"
    script.write_text(_nodes_script(inventory, paths, modprobe))
    namespace = _output(
        "unshare", "--mount", "--propagation", "private", "sh", "-euc",
        "mount -t tmpfs -o mode=0755 proxgpu-dev /dev && mknod -m 666 /dev/null c 1 3 && "
        f"mount -t tmpfs -o mode=0755 proxgpu-run /run && sh {script} && {_report('')}",
    )  # fmt: skip
    tree = tmp_path / "root"
    (tree / "dev").mkdir(parents=True)
    (tree / "proc").symlink_to("/proc")
    environment = {**os.environ, "PROXGPU_ROOT": str(tree)}
    _output("sh", str(script), env=environment)
    by_mknod = _output("sh", "-euc", _report(str(tree)))
    made, rules = _made(namespace)
    assert _made(by_mknod) == (made, rules)
    assert {f"/dev/{line.split()[0].removeprefix('./')}" for line in made} >= set(paths)
    assert len(rules.splitlines()) == len(paths)
