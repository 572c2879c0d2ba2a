"""What proxgpu writes, checked by Proxmox's own parsers (``tests/proxmox/harness/pve-check``).

VM configs proxgpu wrote go through ``qemu-start`` (qemu-server's config-to-command generation,
where NUMA, hotplug and mapping mistakes show); container configs through ``lxc`` (pve-container's
parser, its schema and ``parse_device``); ``pci.cfg`` through the ``pci-mapping`` section parser.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from proxgpu.apply import ApplyOptions
from proxgpu.errors import PlanRefusedError, RenderError
from proxgpu.host.local import DirectoryHost
from proxgpu.inspection import inspect
from proxgpu.inspection.inventory import Inventory
from proxgpu.paths import guest_config
from proxgpu.pipeline import split_host
from proxgpu.planning import MigSpec, SplitPolicy, plan_split
from proxgpu.rendering import RenderOptions, render
from tests.support.pvevalidate import (
    REPO,
    STORAGE_CFG,
    Mode,
    Verdict,
    assert_all_ok,
    corpus_files,
    files_in_tree,
    proxmox_sources,
    validate,
    validate_tree,
    write_tree,
)
from tests.support.scenarios import SCENARIOS, scenario
from tests.support.strategies import random_hosts

UVM = {"nvidia-uvm": 511}

EXAMPLES = REPO / "examples" / "hosts"

#: A split for every example host: what its README row says it is for.
EXAMPLE_SPLITS: dict[str, list[tuple[SplitPolicy, RenderOptions]]] = {
    "ct200": [
        (SplitPolicy(lxc=200, vms=[(300, None)]), RenderOptions()),
        (SplitPolicy(lxc=200, vms=[(300, None)]), RenderOptions(mapping="gpu-node1")),
        (SplitPolicy(lxc=200, vms=[(300, 2)]), RenderOptions(bind_method="driverctl")),
    ],
    "single-socket": [(SplitPolicy(vfio_gpus=["0000:0b:00.0"], lxc=101), RenderOptions())],
    "uneven-5-3": [(SplitPolicy(enable_iommu=True, lxc=150), RenderOptions())],
    "shared-iommu-group": [(SplitPolicy(), RenderOptions())],
    "h200-vm": [(SplitPolicy(host_gpus=["0000:00:06.0"]), RenderOptions())],
    "vgpu": [(SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1155")]), RenderOptions())],
    "vgpu-sriov": [(SplitPolicy(lxc=200, vgpus=[(400, "nvidia-1155")]), RenderOptions())],
    "mig": [
        (
            SplitPolicy(
                lxc_mig=[MigSpec(vmid=200, gpu="0", gi=2), MigSpec(vmid=201, gpu="0", gi=9)],
                vms=[(300, None)],
            ),
            RenderOptions(),
        )
    ],
}
CASES = [
    pytest.param(host, policy, options, id=f"{host}-{i}")
    for host, splits in sorted(EXAMPLE_SPLITS.items())
    for i, (policy, options) in enumerate(splits)
]


def test_every_example_host_has_a_split() -> None:
    single_hosts = [p.name for p in EXAMPLES.iterdir() if (p / "proc").is_dir()]  # no cluster
    assert sorted(EXAMPLE_SPLITS) == sorted(single_hosts)


@pytest.mark.parametrize(("host", "policy", "options"), CASES)
def test_an_apply_on_each_example_host_leaves_configs_proxmox_accepts(
    tmp_path: Path, host: str, policy: SplitPolicy, options: RenderOptions
) -> None:
    root = tmp_path / host
    shutil.copytree(EXAMPLES / host, root, symlinks=True)
    result = split_host(DirectoryHost(str(root)), policy, options, how=ApplyOptions())
    # qemu-start's lspci answers from the host's own sysfs: which functions offer vGPU types.
    verdicts = validate_tree(root, result.inventory.node_name, pci_root=root)
    written = {
        (root / f.path.lstrip("/")).resolve()
        for f in result.changes.changed_files()
        if f.after is not None and f.path.startswith("/etc/pve/")
    }
    assert written <= set(verdicts), "every guest config and pci.cfg the apply wrote is checked"
    if verdicts:
        assert_all_ok(verdicts)


def _vm_300(root: Path) -> Path:
    return root / "etc" / "pve" / "qemu-server" / "300.conf"


def _second_vm(root: Path) -> None:
    text = _vm_300(root).read_text().replace("name: train", "name: train2")
    (root / "etc" / "pve" / "qemu-server" / "301.conf").write_text(text)


def _memory_hotplug(root: Path) -> None:
    text = _vm_300(root).read_text().replace("memory: 262144", "memory: 32768")
    _vm_300(root).write_text(text + "hotplug: network,disk,usb,memory\n")


def _bare_dev_entries(root: Path) -> None:
    ct = root / "etc" / "pve" / "lxc" / "200.conf"
    kept = [line for line in ct.read_text().splitlines() if not line.startswith("lxc.")]
    ct.write_text("\n".join([*kept, "dev0: /dev/nvidia0", "dev1: /dev/nvidiactl,gid=44"]) + "\n")


def _second_container(root: Path) -> None:
    ct = root / "etc" / "pve" / "lxc"
    kept = [line for line in (ct / "200.conf").read_text().splitlines() if "lxc." not in line]
    (ct / "201.conf").write_text("\n".join(kept).replace("hostname: llm", "hostname: nb") + "\n")


@pytest.mark.parametrize(
    ("edit", "policy", "options"),
    [
        (_second_vm, SplitPolicy(lxc=200, vms=[(300, 2), (301, 2)]), RenderOptions(mapping="gpus")),
        (_memory_hotplug, SplitPolicy(lxc=200, vms=[(300, None)]), RenderOptions()),
        (_bare_dev_entries, SplitPolicy(lxc=200, vms=[(300, None)]), RenderOptions()),
        (_second_container, SplitPolicy(lxc=200, shared_lxc=[201]), RenderOptions()),
        (
            _second_container,
            SplitPolicy(lxc_subsets=[(200, 4), (201, 4)], host_nodes=[0, 1]),
            RenderOptions(),
        ),
        (
            _second_container,
            SplitPolicy(lxc_nodes=[(200, 0, None), (201, 1, 2)], host_nodes=[0, 1]),
            RenderOptions(),
        ),
    ],
    ids=[
        "two-vms-one-mapping",
        "memory-hotplug",
        "dev-entries",
        "two-containers",
        "a-node-per-container",
        "containers-bound-to-nodes",
    ],
)
def test_guests_proxgpu_wrote_start_on_proxmox(
    tmp_path: Path, edit: Callable[[Path], None], policy: SplitPolicy, options: RenderOptions
) -> None:
    root = tmp_path / "ct200"
    shutil.copytree(EXAMPLES / "ct200", root, symlinks=True)
    edit(root)
    result = split_host(DirectoryHost(str(root)), policy, options, how=ApplyOptions())
    assert result.changed
    assert_all_ok(validate_tree(root, result.inventory.node_name))


# --- the golden scenarios and generated hosts ---------------------------------------------------


def _validate_rendered(trees: list[tuple[Path, str]]) -> dict[Path, Verdict]:
    """Every guest config and pci.cfg in ``trees`` (root, Proxmox node name), one pve-validate
    process per distinct PCI mapping and node (qemu-start takes one of each)."""
    storage = trees[0][0].parent / "storage.cfg"
    storage.write_text(STORAGE_CFG)
    runs: dict[tuple[str | None, str], list[tuple[Mode, Path]]] = defaultdict(list)
    for root, node in trees:
        mapping = root / "etc" / "pve" / "mapping" / "pci.cfg"
        key = (str(mapping) if mapping.is_file() else None, node)
        runs[key] += files_in_tree(root)
    verdicts: dict[Path, Verdict] = {}
    for (mapping_path, node), checks in runs.items():
        pci_cfg = None if mapping_path is None else Path(mapping_path)
        verdicts |= validate(checks, pci_mapping=pci_cfg, node=node, storage_cfg=storage)
    return verdicts


def test_every_golden_scenario_writes_configs_proxmox_accepts(tmp_path: Path) -> None:
    trees: list[tuple[Path, str]] = []
    for name in sorted(SCENARIOS):
        inventory, changes = scenario(name)
        pve = {f.path: f.after for f in changes.files if f.path.startswith("/etc/pve/")}
        trees.append((write_tree(tmp_path / name, pve), inventory.node_name))
    verdicts = _validate_rendered(trees)
    written = sum(1 for name in SCENARIOS for _ in (tmp_path / name).rglob("*.c*"))
    assert len(verdicts) == written >= 6, "every written guest config and pci.cfg is checked"
    assert_all_ok(verdicts)


#: The ct200 example's guests, given to every generated host (a second VM like the first).
CT_TEXT = (EXAMPLES / "ct200/etc/pve/lxc/200.conf").read_text()
VM_TEXT = (EXAMPLES / "ct200/etc/pve/qemu-server/300.conf").read_text()
HOTPLUG = "hotplug: network,disk,usb,memory\n"


def _guests(hotplug: bool) -> dict[str, str]:
    vm = VM_TEXT.replace("memory: 262144", "memory: 32768") + HOTPLUG if hotplug else VM_TEXT
    return {
        "/etc/pve/lxc/200.conf": CT_TEXT,
        "/etc/pve/qemu-server/300.conf": vm,
        "/etc/pve/qemu-server/301.conf": vm.replace("name: train", "name: train2"),
    }


def _policy(inventory: Inventory, vm_count: int, mapped: bool) -> SplitPolicy:
    """CT 200 and, where a second node holds GPUs, one or two VMs, by mapping or by address."""
    if len({gpu.numa_node for gpu in inventory.gpus}) < 2:
        return SplitPolicy(lxc=200)
    vms: list[tuple[int, int | None]] = [(300, None)] if vm_count == 1 else [(300, 1), (301, None)]
    return SplitPolicy(lxc=200, vms=vms, mapping="gpus" if mapped else None)


def test_generated_hosts_get_configs_proxmox_accepts(tmp_path: Path) -> None:
    trees: list[tuple[Path, str]] = []

    # The same examples every run (derandomize): one pve-validate process checks them all, and
    # a run drawing too few VMs by chance would fail the count below without a finding.
    @settings(max_examples=40, deadline=None, database=None, derandomize=True)
    @given(random_hosts(), st.integers(1, 2), st.booleans(), st.booleans())
    def render_one(inventory: Inventory, vm_count: int, mapped: bool, hotplug: bool) -> None:
        inventory = replace(
            inventory, guest_configs=_guests(hotplug), pve_version="8.4.1", char_majors=UVM
        )
        policy = _policy(inventory, vm_count, mapped)
        try:
            plan = plan_split(inventory, policy)
        except PlanRefusedError:
            assume(False)  # a VM left without GPUs, or a mapping pooling two nodes
        changes = render(inventory, plan, RenderOptions(mapping=policy.mapping))
        pve = {f.path: f.after for f in changes.files if f.path.startswith("/etc/pve/")}
        trees.append((write_tree(tmp_path / str(len(trees)), pve), inventory.node_name))

    render_one()
    verdicts = _validate_rendered(trees)
    assert sum(v.file.name == "300.conf" for v in verdicts.values()) >= 5, "VMs were generated"
    assert_all_ok(verdicts)


# --- the upstream corpus ---------------------------------------------------------------------


@cache
def _ct200() -> Inventory:
    return inspect(DirectoryHost(str(EXAMPLES / "ct200")))


def _split_edit(kind: str, text: str) -> str | None:
    """``text`` as the container (``lxc``) or VM of a ct200 split after proxgpu edits it, or
    ``None`` when rendering refuses the config (a malformed entry proxgpu will not guess at)."""
    inventory = _ct200()
    path = guest_config("lxc" if kind == "lxc" else "vm", 200 if kind == "lxc" else 300)
    configs = {**inventory.guest_configs, path: text}
    inventory = replace(inventory, guest_configs=configs)
    plan = plan_split(inventory, SplitPolicy(lxc=200, vms=[(300, None)]))
    try:
        changes = render(inventory, plan)
    except RenderError:
        return None
    return next(f.after for f in changes.files if f.path == path)


def test_a_split_never_turns_an_accepted_corpus_config_into_a_rejected_one(
    tmp_path: Path,
) -> None:
    proxmox_sources()
    originals: list[tuple[Mode, Path]] = []
    edited: list[tuple[Mode, Path]] = []
    kinds: tuple[Literal["qemu", "lxc"], ...] = ("qemu", "lxc")
    for kind in kinds:
        for source in corpus_files(kind):
            after = _split_edit(kind, source.read_text())
            if after is None:
                continue
            # Upstream's folders reuse names (each snapshot test has its 101.conf); the name,
            # which gives the parser its VMID, is kept.
            target = tmp_path / kind / str(len(edited)) / source.name
            target.parent.mkdir(parents=True)
            target.write_text(after)
            originals.append((kind, source))
            edited.append((kind, target))
    assert len(originals) >= 330, "nearly every corpus config gets the split's edit"
    verdicts = validate([*originals, *edited], parser_only=True)
    broken = [
        f"{source}: {'; '.join(verdicts[target].failures)}"
        for (_, source), (_, target) in zip(originals, edited, strict=True)
        if verdicts[source].ok and not verdicts[target].ok
    ]
    assert not broken, "proxgpu's edit made Proxmox reject:\n" + "\n".join(broken)
    accepted = sum(verdicts[source].ok for _, source in originals)
    assert accepted >= 330, "the corpus is mostly valid input (upstream says 340 of 346)"
