"""The UUIDs of a host's MIG devices, as ``nvidia-smi`` tells them.

A MIG device's UUID (``MIG-<UUID>``, the value ``CUDA_VISIBLE_DEVICES`` selects it by) is known
only to NVIDIA's library, NVML: no /proc or /sys file holds it. ``nvidia-smi`` prints it, in two
outputs that NVIDIA's MIG user guide shows ("Getting Started with MIG": creating GPU instances,
running CUDA applications on bare metal; "CUDA Device Enumeration"):

- ``nvidia-smi -L`` lists each GPU as ``GPU N: NAME (UUID: GPU-...)``, N its nvidia-smi index,
  and under it each of its MIG devices as ``MIG PROFILE Device M: (UUID: MIG-...)``, M counting
  from 0 on each GPU (drivers before R470 print ``MIG-GPU-<GPU UUID>/GI/CI`` there instead, the
  form ``CUDA_VISIBLE_DEVICES`` took from them);
- a plain ``nvidia-smi`` ends with a "MIG devices" table whose rows start with the GPU's index,
  the GPU instance id, the compute instance id and M (the "MIG Dev" column).

So (GPU index, M) joins the two, and the GPU's UUID, which ``/proc/driver/nvidia/gpus/ADDR/
information`` also prints, says which GPU it is: no index is trusted to mean an address. The
host script ``scripts/smi.sh`` runs both on a live host (each under its own deadline), only when
/proc shows compute instances; a snapshot keeps their outputs under
:data:`~proxgpu.paths.CAPTURED_DIR`, which the same script reads in a tree.

What the host prints is hostile data: a UUID must be ``MIG-`` or ``GPU-`` and a UUID's hex form
(or the legacy form above), a GPU or MIG device listed twice is refused, all naming the output.

>>> listing = ("GPU 0: NVIDIA H200 (UUID: GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0)\\n"
...            "  MIG 3g.71gb     Device  0: (UUID: MIG-c7384736-a75d-5afc-978f-d2f1294409fd)\\n")
>>> table = "| MIG devices:  |\\n|  0    2   0   0  |  11MiB / 71040MiB  |\\n"
>>> mig_uuids(listing, table, "pve1")
{('GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0', 2, 0): 'MIG-c7384736-a75d-5afc-978f-d2f1294409fd'}
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

from proxgpu.errors import SysfsError
from proxgpu.host.scripts import run_script
from proxgpu.paths import NVIDIA_SMI_LIST, NVIDIA_SMI_TABLE

if TYPE_CHECKING:
    from proxgpu.host.base import Host

#: Seconds each nvidia-smi run may take (it can wait on a GPU that is being reset).
SMI_SECONDS = 20
#: Bytes of each output kept: a few KiB on a host of 8 GPUs.
SMI_LIMIT = 1 << 20

_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
GPU_UUID = re.compile(f"GPU-{_HEX_UUID}")
MIG_UUID = re.compile(f"MIG-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/[0-9]{{1,3}}/[0-9]{{1,3}}")
_GPU_LINE = re.compile(r"GPU ([0-9]{1,3}): .* \(UUID: (.*)\)")
_MIG_LINE = re.compile(r"\s*MIG \S.*\s+Device\s+([0-9]{1,3}): \(UUID: (.*)\)")
_ROW = re.compile(r"\|\s*([0-9]{1,3})\s+([0-9]{1,3})\s+([0-9]{1,3})\s+([0-9]{1,3})\s*\|.*")
_COMMANDS = {"list": ("nvidia-smi -L", NVIDIA_SMI_LIST), "table": ("nvidia-smi", NVIDIA_SMI_TABLE)}


def has_compute_instances(paths: Iterable[str]) -> bool:
    """Whether /proc, as captured (``paths``, the files read), shows a MIG compute instance:
    only then is nvidia-smi run.

    >>> has_compute_instances(["/proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access"])
    True
    """
    return any(
        path.startswith("/proc/driver/nvidia/capabilities/gpu") and "/ci" in path for path in paths
    )


def read_smi(host: Host) -> tuple[dict[str, bytes], list[str]]:
    """nvidia-smi's two outputs, by the paths a capture keeps them at (:data:`NVIDIA_SMI_LIST`,
    :data:`NVIDIA_SMI_TABLE`), and notes: run on a live host, read from a tree where a snapshot
    kept them. An output that cannot be had (no nvidia-smi, a run past its deadline, a snapshot
    without it) is left out, with a note saying why where it matters.

    :raises SysfsError: when the host's answer is not what the script writes.
    """
    live = not host.root.rstrip("/")
    output = run_script(
        host,
        "smi",
        "live" if live else "tree",
        str(SMI_SECONDS),
        str(SMI_LIMIT),
        timeout=2 * SMI_SECONDS + 15,
        check=False,
    )
    if output.returncode != 0:
        failed = (
            f"the MIG devices' UUIDs are unknown: reading nvidia-smi failed (exit "
            f"{output.returncode}); nvidia-smi -L on the host lists them"
        )
        return {}, [failed]
    outputs: dict[str, bytes] = {}
    notes: list[str] = []
    for record in output.of("output"):
        if len(record.fields) == 2 and record[0] in _COMMANDS:
            kept = _kept(host.name, record[0], record[1])
            if isinstance(kept, bytes):
                outputs[_COMMANDS[record[0]][1]] = kept
            else:
                notes.append(kept)
    return outputs, notes


def _kept(source: str, name: str, encoded: str) -> bytes | str:
    """One output as nvidia-smi printed it, or the note that says why it is unknown."""
    command, path = _COMMANDS[name]
    try:
        answer = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise SysfsError(
            source, path, f"{command}: not the smi step's answer; refusing it"
        ) from None
    text, marked, status = answer.rpartition(b"\n#proxgpu-status ")
    status = status.rstrip(b"\n")
    if not marked or not status.isdigit():
        why = f"more than {SMI_LIMIT} bytes, cut short"
    elif status == b"0":
        return text
    elif status == b"127":
        why = "no nvidia-smi on the host"
    elif status in {b"124", b"137"}:
        why = f"it did not finish within {SMI_SECONDS} s"
    else:
        why = f"it exited {status.decode()}"
    return f"{command}: {why}, so the MIG devices' UUIDs are unknown"


def mig_uuids(listing: str, table: str, source: str) -> dict[tuple[str, int, int], str]:
    """``(GPU UUID, GI, CI) -> MIG UUID`` from ``nvidia-smi -L``'s ``listing`` and the plain
    ``table``; a MIG device either leaves out is not in it.

    :raises SysfsError: for a UUID of no UUID's form, a GPU or MIG device listed twice, or a
        MIG device before any GPU, naming the output.
    """
    devices = _devices(listing, source)
    found: dict[tuple[str, int, int], str] = {}
    for gpu, gi, ci, device in _rows(table, source):
        if (gpu, device) in devices:
            gpu_uuid, mig_uuid = devices[gpu, device]
            found[gpu_uuid, gi, ci] = mig_uuid
    return found


def _devices(listing: str, source: str) -> dict[tuple[int, int], tuple[str, str]]:
    """``(GPU index, MIG device number) -> (GPU UUID, MIG UUID)`` from ``nvidia-smi -L``."""
    gpus: dict[int, str] = {}
    devices: dict[tuple[int, int], tuple[str, str]] = {}
    gpu: int | None = None
    for line in listing.splitlines():
        if match := _GPU_LINE.fullmatch(line.rstrip()):
            gpu = int(match[1])
            _refuse_if(gpu in gpus, source, NVIDIA_SMI_LIST, f"GPU {gpu} is listed twice")
            gpus[gpu] = _checked(match[2], GPU_UUID, source, NVIDIA_SMI_LIST)
        elif match := _MIG_LINE.fullmatch(line.rstrip()):
            if gpu is None:
                _refuse(source, NVIDIA_SMI_LIST, "a MIG device before any GPU")
            key = (gpu, int(match[1]))
            twice = f"GPU {gpu}'s MIG device {key[1]} is listed twice"
            _refuse_if(key in devices, source, NVIDIA_SMI_LIST, twice)
            devices[key] = (gpus[gpu], _checked(match[2], MIG_UUID, source, NVIDIA_SMI_LIST))
    return devices


def _rows(table: str, source: str) -> list[tuple[int, int, int, int]]:
    """The "MIG devices" table's rows: GPU index, GPU instance, compute instance, MIG device."""
    rows: list[tuple[int, int, int, int]] = []
    inside = False
    for line in table.splitlines():
        if "MIG devices:" in line or "Processes:" in line:
            inside = "MIG devices:" in line
        elif inside and (match := _ROW.fullmatch(line.rstrip())):
            gpu, gi, ci, device = (int(n) for n in match.groups())
            twice = any((r[0], r[3]) == (gpu, device) or r[:3] == (gpu, gi, ci) for r in rows)
            _refuse_if(
                twice,
                source,
                NVIDIA_SMI_TABLE,
                f"GPU {gpu}'s MIG device {device} (GI {gi} CI {ci}) is listed twice",
            )
            rows.append((gpu, gi, ci, device))
    return rows


def _checked(uuid: str, form: re.Pattern[str], source: str, path: str) -> str:
    _refuse_if(
        form.fullmatch(uuid) is None,
        source,
        path,
        f"UUID {uuid!r} is not one NVIDIA makes ({form.pattern[:4]} and a UUID's hex form)",
    )
    return uuid


def _refuse_if(bad: bool, source: str, path: str, what: str) -> None:
    if bad:
        _refuse(source, path, what)


def _refuse(source: str, path: str, what: str) -> NoReturn:
    raise SysfsError(source, path, f"{what}; refusing the host's data")
