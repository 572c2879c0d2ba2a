"""What the capture says of NVIDIA's driver: each GPU's ``information`` file (its Device
Minor, UUID), the driver's ``params`` and version, the capabilities its /proc files describe,
and the character devices' majors (``/proc/devices``: nvidia-uvm's and nvidia-caps' are
dynamic)."""

from __future__ import annotations

import re

from proxgpu.inspection.capture import Capture, key_number, key_value
from proxgpu.inspection.inventory import NvidiaCap
from proxgpu.paths import NVIDIA_GPUS


def nvidia_info(capture: Capture) -> dict[str, dict[str, str]]:
    """Each GPU's ``information`` file as fields, by the GPU's address (lower case)."""
    info: dict[str, dict[str, str]] = {}
    for path, lines in capture.lines.items():
        if path.startswith(NVIDIA_GPUS) and path.endswith("/information"):
            fields = dict(key_value(line) for line in lines if ":" in line)
            address = fields.get("Bus Location") or path[len(NVIDIA_GPUS) :].split("/")[0]
            info[address.lower()] = fields
    return info


def char_majors(capture: Capture) -> dict[str, int]:
    """Each character device's major, by name, from ``/proc/devices``."""
    majors: dict[str, int] = {}
    in_char = False
    for line in capture.lines.get("/proc/devices", []):
        if line.strip().endswith("devices:"):
            in_char = line.strip() == "Character devices:"
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def nvidia_param(capture: Capture, name: str) -> int | None:
    """A number from the nvidia driver's ``params`` file (``DeviceFileMode: 438``, decimal, as
    nv-procfs.c prints them)."""
    return key_number(capture.lines.get("/proc/driver/nvidia/params", []), name)


def nvidia_version(capture: Capture) -> str | None:
    """The loaded kernel module's version, from ``/proc/driver/nvidia/version``."""
    line = capture.first_line("/proc/driver/nvidia/version") or ""
    match = re.search(r"Kernel Module(?: for [\w.]+)?\s+([\d.]+)", line)
    return match.group(1) if match else None


def nvidia_caps(capture: Capture) -> list[NvidiaCap]:
    """The capabilities whose /proc file gives a minor and a mode (both in decimal)."""
    caps = []
    for path, lines in capture.lines.items():
        if path.startswith(("/proc/driver/nvidia/capabilities/", "/proc/driver/nvidia-nvlink/")):
            fields = dict(key_value(line) for line in lines if ":" in line)
            minor, mode = fields.get("DeviceFileMinor", ""), fields.get("DeviceFileMode", "")
            if minor.isdigit() and mode.isdigit():
                caps.append(NvidiaCap(proc_path=path, minor=int(minor), mode=int(mode)))
    return sorted(caps, key=lambda cap: cap.minor)
