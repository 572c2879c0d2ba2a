"""MIG specs and instances: ``--lxc VMID:mig=GPU/GI[/CI]`` parsing, reading the instances out
of NVIDIA's capability files, and the planned instance's own texts."""

from __future__ import annotations

import pytest

from proxgpu.ansible.request import split_request
from proxgpu.errors import UsageError
from proxgpu.inspection.inventory import NvidiaCap
from proxgpu.inspection.mig import mig_instances
from proxgpu.planning import MigSpec, MigUse, SplitPolicy, parse_lxc_mig_spec, parse_lxc_specs

BASE = "/proc/driver/nvidia/capabilities"


def cap(path: str, minor: int, mode: int = 0o444) -> NvidiaCap:
    return NvidiaCap(proc_path=f"{BASE}/{path}", minor=minor, mode=mode)


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("200:mig=0/2", MigSpec(vmid=200, gpu="0", gi=2)),
        ("200:mig=1/3/1", MigSpec(vmid=200, gpu="1", gi=3, ci=1)),
        ("201:mig=0000:81:00.0/9/0", MigSpec(vmid=201, gpu="0000:81:00.0", gi=9, ci=0)),
        ("201:mig=81:00/9", MigSpec(vmid=201, gpu="81:00", gi=9)),
    ],
)
def test_a_mig_spec_names_the_gpu_and_the_instance(spec: str, parsed: MigSpec) -> None:
    assert parse_lxc_mig_spec(spec) == parsed


@pytest.mark.parametrize(
    "spec",
    [
        "200:mig=",
        "200:mig=0",
        "200:mig=0/",
        "200:mig=0/a",
        "200:mig=/2",
        "x:mig=0/2",
        "200:mig=0/1/2/3",
        "200:mig=0/-1",
    ],
)
def test_a_mig_spec_that_is_not_gpu_gi_or_gpu_gi_ci_is_a_usage_error(spec: str) -> None:
    with pytest.raises(UsageError, match="expected VMID:mig=GPU/GI or VMID:mig=GPU/GI/CI"):
        parse_lxc_specs([spec])


def test_lxc_specs_sort_mig_containers_apart_and_the_policy_counts_them_as_targets() -> None:
    policy = SplitPolicy(requests=parse_lxc_specs(["200", "201:mig=0/2", "202:2"]))
    assert (policy.shared, policy.lxc_subsets, policy.lxc_mig) == (
        [200],
        [(202, 2)],
        [MigSpec(vmid=201, gpu="0", gi=2)],
    )
    assert policy.containers == [200, 202, 201]


def test_ansible_lxc_takes_the_same_mig_spelling() -> None:
    params = {
        "vms": [],
        "lxc": ["200:mig=0/2/0"],
        "host_nodes": [],
        "vfio_nodes": [],
        "host_gpus": [],
        "vfio_gpus": [],
        "enable_iommu": False,
        "bind_method": "modprobe",
        "mapping": None,
        "include_bmc": False,
        "include_audio": True,
    }
    request = split_request(params)
    assert request.policy.lxc_mig == [MigSpec(vmid=200, gpu="0", gi=2, ci=0)]


def test_instances_pair_each_compute_instance_with_its_gpu_instance_of_that_gpu_only() -> None:
    caps = [
        cap("mig/config", 1, 0o400),
        cap("mig/monitor", 2),
        cap("gpu1/mig/gi3/ci1/access", 168),
        cap("gpu1/mig/gi3/access", 166),
        cap("gpu1/mig/gi3/ci0/access", 167),
        cap("gpu0/mig/gi2/access", 21),
        cap("gpu0/mig/gi2/ci0/access", 22),
        cap("gpu1/mig/gi5/access", 183),  # a GPU instance without a compute instance
        cap("gpu1/mig/gi7/ci0/access", 202),  # its GPU instance's file went first
    ]
    found = [(i.gi, i.ci, i.gi_cap.minor, i.ci_cap.minor) for i in mig_instances(caps, 1)]
    assert found == [(3, 0, 166, 167), (3, 1, 166, 168)]
    assert [(i.gi, i.ci) for i in mig_instances(caps, 0)] == [(2, 0)]
    assert mig_instances(caps, None) == []
    assert mig_instances(caps, 2) == []


def test_a_planned_instance_knows_its_nodes_proc_files_and_cuda_value() -> None:
    use = MigUse(vmid=200, gpu_minor=1, gi=3, ci=1, gi_minor=166, ci_minor=168)
    assert use.cap_nodes == ["/dev/nvidia-caps/nvidia-cap166", "/dev/nvidia-caps/nvidia-cap168"]
    assert use.proc_files == [f"{BASE}/gpu1/mig/gi3/access", f"{BASE}/gpu1/mig/gi3/ci1/access"]
    assert use.cuda_visible_devices is None
    uuid = "MIG-8f3b2c1d-4e5f-5a6b-9c7d-0e1f2a3b4c5d"
    assert use.model_copy(update={"uuid": uuid}).cuda_visible_devices == uuid
