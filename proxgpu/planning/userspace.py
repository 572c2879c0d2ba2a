"""What each container given NVIDIA GPUs must hold: NVIDIA's user-space libraries (libcuda,
libnvidia-ml, nvidia-smi) of exactly the version of the host's kernel module.

A container shares the host's kernel, so it runs the host's nvidia module, but its libraries
are its own; NVML refuses to start when the two versions differ ("Failed to initialize NVML:
Driver/library version mismatch"), and the kernel logs "NVRM: API mismatch". A container holds
the libraries without the module: NVIDIA's ``.run`` installer with ``--no-kernel-module``, or
the distribution's packages of that exact version. Every host driver upgrade asks it again.

>>> from proxgpu.host import DirectoryHost
>>> from proxgpu.inspection import inspect
>>> from proxgpu.planning import SplitPolicy, plan_split
>>> inventory = inspect(DirectoryHost("examples/hosts/ct200"))
>>> [(need.vmid, need.version) for need in plan_split(inventory, SplitPolicy(lxc=200)).userspace]
[(200, '575.57.08')]
"""

from __future__ import annotations

from proxgpu.model import FrozenModel


class UserSpace(FrozenModel):
    """A container given NVIDIA GPUs, and the NVIDIA user-space version it must hold: the
    host's loaded kernel module's (``None``: no nvidia module is loaded now, so its version is
    known only once the host loads one). ``installer`` is NVIDIA's installer file of that
    version for the host's machine.

    >>> run = "NVIDIA-Linux-x86_64-570.124.06.run"
    >>> need = UserSpace(vmid=200, version="570.124.06", installer=run)
    >>> need.step()
    "CT 200 needs NVIDIA's user space (libcuda, libnvidia-ml, nvidia-smi) of 570.124.06, \
the host's nvidia module, without a kernel module: in CT 200, \
sh NVIDIA-Linux-x86_64-570.124.06.run --no-kernel-module, or the distribution's NVIDIA \
packages of exactly 570.124.06; again after every host driver upgrade (else NVML fails: \
Driver/library version mismatch)"
    """

    vmid: int
    version: str | None
    installer: str | None = None

    def step(self) -> str:
        """What to do, as the plan's next step says it."""
        what = "NVIDIA's user space (libcuda, libnvidia-ml, nvidia-smi)"
        if self.version is None:
            return (
                f"CT {self.vmid} needs {what} of the version of the nvidia module the host "
                "loads, without a kernel module; none is loaded now: once it is, "
                "/proc/driver/nvidia/version on the host names the version to install in "
                f"CT {self.vmid}"
            )
        return (
            f"CT {self.vmid} needs {what} of {self.version}, the host's nvidia module, without "
            f"a kernel module: in CT {self.vmid}, sh {self.installer} --no-kernel-module, or "
            f"the distribution's NVIDIA packages of exactly {self.version}; again after every "
            "host driver upgrade (else NVML fails: Driver/library version mismatch)"
        )
