"""examples/split_host.py on every example host: a dry run that writes nothing, then an apply on
a copy, then a second run that finds nothing left to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.trees import EXAMPLE_HOSTS, EXAMPLES, REPO, copy_example, tree_bytes

SCRIPT = REPO / "examples" / "split_host.py"

# The options each example host needs, as the script's docstring shows them. ct200 takes the
# defaults (CT 200, VM 300); the others have other guests, no NUMA node (by address), the IOMMU
# off (turn it on), or no guests at all.
OPTIONS: dict[str, list[str]] = {
    "ct200": [],
    "single-socket": ["--lxc", "101", "--vm", "none", "--vfio-gpus", "0000:0b:00.0"],
    "uneven-5-3": ["--lxc", "150", "--vm", "none", "--enable-iommu"],
    "shared-iommu-group": ["--lxc", "none", "--vm", "none"],
    "h200-vm": ["--lxc", "none", "--vm", "none", "--host-gpus", "0000:00:06.0"],
    "vgpu": ["--lxc", "200", "--vm", "none"],
    "vgpu-sriov": ["--lxc", "200", "--vm", "none"],
    "mig": ["--lxc", "none", "--vm", "300"],
    # The nodes of the cluster snapshot, each one host with the guests it holds.
    "cluster-3/pve1": [],
    "cluster-3/pve2": ["--lxc", "none", "--vm", "310"],
    "cluster-3/pve3": ["--lxc", "150", "--vm", "320"],
}
#: The node trees of the example cluster snapshots (``DIR/NODE``).
NODE_TREES = sorted(
    f"{p.parent.name}/{p.name}" for p in EXAMPLES.glob("*/*") if (p / "proc").is_dir()
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_every_example_host_has_options() -> None:
    assert NODE_TREES and sorted(OPTIONS) == sorted(EXAMPLE_HOSTS + NODE_TREES)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_split_host_plans_applies_and_is_idempotent(name: str, tmp_path: Path) -> None:
    root = copy_example(tmp_path, name)
    before = tree_bytes(root)
    checked = run(str(root), *OPTIONS[name])
    assert checked.returncode == 0, checked.stderr
    assert tree_bytes(root) == before, "without --apply nothing is written"
    would_change = checked.stdout.splitlines()[-1].startswith("changed: True")

    applied = run(str(root), *OPTIONS[name], "--apply")
    assert applied.returncode == 0, applied.stderr
    assert (tree_bytes(root) != before) == would_change, "--apply writes what the check showed"
    again = run(str(root), *OPTIONS[name])
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1].startswith("changed: False")


def test_default_is_the_ct200_example_and_a_refusal_keeps_proxgpus_exit_code() -> None:
    default = run()
    assert default.returncode == 0, default.stderr
    assert default.stdout == run(str(EXAMPLES / "ct200")).stdout
    assert "hostpci0:" in default.stdout
    # single-socket's GPUs have no NUMA node: the NUMA split is refused (exit 9, as proxgpu's).
    refused = run(str(EXAMPLES / "single-socket"), "--lxc", "101", "--vm", "none")
    assert refused.returncode == 9 and "NUMA node" in refused.stderr


def test_the_diff_it_prints_redacts_secrets_as_the_cli_does(tmp_path: Path) -> None:
    root = copy_example(tmp_path)
    vm = root / "etc/pve/qemu-server/300.conf"
    vm.write_text(vm.read_text() + "cipassword: $5$salt$hash\n")
    done = run(str(root))
    assert done.returncode == 0, done.stderr
    assert "qemu-server/300.conf" in done.stdout, "the VM's diff is printed"
    assert "$5$salt$hash" not in done.stdout and "<redacted by proxgpu>" in done.stdout
