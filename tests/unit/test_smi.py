"""The MIG devices' UUIDs as proxgpu reads them from nvidia-smi (proxgpu.inspection.smi): joined
by GPU index and MIG device number, keyed by the GPU's UUID, hostile output refused.

No NVIDIA GPU is here, so nvidia-smi's outputs are stand-ins written as NVIDIA's MIG user guide
shows them (:data:`tests.support.standins.MIG_LISTING` and ``MIG_TABLE``); none is captured from
a real host.
"""

from __future__ import annotations

import pytest

from proxgpu.errors import SysfsError
from proxgpu.inspection.smi import mig_uuids
from proxgpu.paths import NVIDIA_SMI_LIST, NVIDIA_SMI_TABLE
from tests.support.standins import MIG_CI as CI
from tests.support.standins import MIG_GPU0 as GPU0
from tests.support.standins import MIG_GPU1 as GPU1
from tests.support.standins import MIG_LISTING as LISTING
from tests.support.standins import MIG_TABLE as TABLE


def test_each_compute_instance_gets_the_uuid_nvidia_smi_lists_for_its_mig_device() -> None:
    assert mig_uuids(LISTING, TABLE, "pve1") == {
        (GPU0, 1, 0): CI[0],
        (GPU0, 1, 1): CI[1],
        (GPU0, 1, 2): CI[2],
    }


def test_the_join_is_by_gpu_index_and_device_number_whatever_order_the_rows_come_in() -> None:
    listing = f"GPU 0: A100-SXM4-40GB (UUID: {GPU0})\n" + LISTING.replace(GPU0, GPU1).replace(
        "GPU 0:", "GPU 1:"
    )
    rows = [
        "| MIG devices:  |",
        "|  1    1   2   2  |                      | 14      0 |",
        "|  1    1   0   0  |     11MiB / 20224MiB | 14      0 |",
        "|  1    1   1   1  |                      | 14      0 |",
    ]
    assert mig_uuids(listing, "\n".join(rows), "pve1") == {
        (GPU1, 1, 2): CI[2],
        (GPU1, 1, 0): CI[0],
        (GPU1, 1, 1): CI[1],
    }


def test_a_device_either_output_leaves_out_stays_unknown() -> None:
    table = TABLE.replace("|  0    1   2   2  |", "|  0    1   2   7  |")
    found = mig_uuids(LISTING, table, "pve1")
    assert (GPU0, 1, 2) not in found
    assert len(found) == 2


def test_drivers_before_r470_name_a_device_by_its_gpu_and_instances() -> None:
    legacy = LISTING.replace(CI[0], f"MIG-{GPU0}/1/0")
    assert mig_uuids(legacy, TABLE, "pve1")[GPU0, 1, 0] == f"MIG-{GPU0}/1/0"


@pytest.mark.parametrize(
    ("listing", "table", "path", "words"),
    [
        (
            LISTING.replace(CI[1], "MIG-$(touch /tmp/x)"),
            TABLE,
            NVIDIA_SMI_LIST,
            "UUID 'MIG-$(touch /tmp/x)' is not one NVIDIA makes",
        ),
        (
            LISTING.replace(GPU0, "GPU-e86cb44c 6756"),
            TABLE,
            NVIDIA_SMI_LIST,
            "UUID 'GPU-e86cb44c 6756' is not one NVIDIA makes",
        ),
        (LISTING + LISTING, TABLE, NVIDIA_SMI_LIST, "GPU 0 is listed twice"),
        (
            LISTING.replace("Device  2", "Device  1"),
            TABLE,
            NVIDIA_SMI_LIST,
            "GPU 0's MIG device 1 is listed twice",
        ),
        (LISTING.split("\n", 1)[1], TABLE, NVIDIA_SMI_LIST, "a MIG device before any GPU"),
        (
            LISTING,
            TABLE.replace("|  0    1   2   2  |", "|  0    1   1   2  |"),
            NVIDIA_SMI_TABLE,
            "GPU 0's MIG device 2 (GI 1 CI 1) is listed twice",
        ),
    ],
    ids=["shell-uuid", "gpu-uuid-space", "gpu-twice", "device-twice", "orphan", "row-twice"],
)
def test_hostile_output_is_refused_naming_it(
    listing: str, table: str, path: str, words: str
) -> None:
    with pytest.raises(SysfsError) as error:
        mig_uuids(listing, table, "pve1")
    assert error.value.path == path
    assert str(error.value).startswith(f"pve1: {path}: {words}")
    assert error.value.reason.endswith("refusing the host's data")
    fix = error.value.fix or ""
    assert "`nvidia-smi -L`" in fix and str(error.value).endswith(f"; {fix}")
