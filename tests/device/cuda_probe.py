"""What CUDA itself sees in this process: the devices its driver API numbers, by PCI address.

Run by the device tier as the command of ``proxgpu run``: libcuda (the driver's own library,
present wherever NVIDIA's driver is) honours ``CUDA_VISIBLE_DEVICES`` as every CUDA program does,
which ``nvidia-smi`` (NVML) does not. Prints one JSON document: ``{"devices": ["0000:01:00.0"]}``.
"""

from __future__ import annotations

import ctypes
import json

#: CUresult's success; every other value is an error.
CUDA_SUCCESS = 0
#: cuDeviceGetPCIBusId's "domain:bus:device.function", with room to spare.
BUS_ID_LENGTH = 32


def _check(result: int, call: str) -> None:
    if result != CUDA_SUCCESS:
        raise SystemExit(f"cuda_probe: {call} failed with CUresult {result}")


def visible_devices() -> list[str]:
    """Each CUDA device's PCI address, lower case with a 4-digit domain, in CUDA's order."""
    cuda = ctypes.CDLL("libcuda.so.1")
    _check(cuda.cuInit(0), "cuInit")
    count = ctypes.c_int()
    _check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    addresses = []
    for ordinal in range(count.value):
        device = ctypes.c_int()
        _check(cuda.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        bus_id = ctypes.create_string_buffer(BUS_ID_LENGTH)
        _check(cuda.cuDeviceGetPCIBusId(bus_id, BUS_ID_LENGTH, device), "cuDeviceGetPCIBusId")
        domain, rest = bus_id.value.decode().split(":", 1)
        addresses.append(f"{int(domain, 16):04x}:{rest.lower()}")
    return addresses


if __name__ == "__main__":
    print(json.dumps({"devices": visible_devices()}))
