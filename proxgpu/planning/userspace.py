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

from proxgpu.inspection.containerlibs import ContainerLibs
from proxgpu.model import FrozenModel


class UserSpace(FrozenModel):
    """A container given NVIDIA GPUs, and the NVIDIA user-space version it must hold: the
    host's loaded kernel module's (``None``: no nvidia module is loaded now, so its version is
    known only once the host loads one). ``installer`` is NVIDIA's installer file of that
    version for the host's machine. ``holds``: what the container was found to hold, where
    the plan was made with its host (``None``: not read).

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
    holds: ContainerLibs | None = None

    @property
    def met(self) -> bool:
        """Whether the container was found to hold exactly the host's version: nothing to do.

        >>> found = ContainerLibs(vmid=200, state="running", seen="init root", nvml="550.100")
        >>> UserSpace(vmid=200, version="550.100", holds=found).met
        True
        """
        held = self.holds
        if held is None or self.version is None:
            return False
        # NVIDIA's LXC hook mounts the host's own libraries in at each start: a stopped
        # container holds none of its own, and needs none.
        return held.nvml == self.version or (held.hook and held.known and held.nvml is None)

    def step(self) -> str:
        """What to do, as the plan's next step says it: what the container must hold, and
        what it holds where that was read.

        >>> run = "NVIDIA-Linux-x86_64-575.57.08.run"
        >>> found = ContainerLibs(vmid=200, state="stopped", seen="storage", nvml="550.100")
        >>> UserSpace(vmid=200, version="575.57.08", installer=run, holds=found).step()
        "CT 200 holds NVIDIA's user space 550.100 (read from its storage, stopped), but the \
host's nvidia module is 575.57.08: NVML fails there (Driver/library version mismatch); in \
CT 200, sh NVIDIA-Linux-x86_64-575.57.08.run --no-kernel-module, or the distribution's NVIDIA \
packages of exactly 575.57.08"
        """
        held = self.holds
        if held is None or self.version is None:
            return self._needs()
        if self.met and held.nvml is None:
            return (
                f"CT {self.vmid} gets the host's NVIDIA user space from NVIDIA's LXC hook at "
                "each start: nothing to do"
            )
        if self.met:
            return (
                f"CT {self.vmid} holds NVIDIA's user space {self.version}, the host's: "
                "nothing to do"
            )
        how = (
            f"in CT {self.vmid}, sh {self.installer} --no-kernel-module, or the distribution's "
            f"NVIDIA packages of exactly {self.version}"
        )
        if held.nvml is not None:
            seen = (
                "through its init's root"
                if held.seen == "init root"
                else "from its storage, stopped"
            )
            return (
                f"CT {self.vmid} holds NVIDIA's user space {held.nvml} (read {seen}), but the "
                f"host's nvidia module is {self.version}: NVML fails there (Driver/library "
                f"version mismatch); {how}"
            )
        if not held.known:
            return (
                f"{self._needs()}; what CT {self.vmid} holds now is unknown ({held.why}); "
                f"on the host, this tells: {held.ask}"
            )
        if held.versions:
            return (
                f"{self._needs()}; CT {self.vmid} holds NVIDIA libraries of "
                f"{', '.join(held.versions)} in {held.where}, none of them as libnvidia-ml.so.1"
            )
        return f"{self._needs()}; CT {self.vmid} holds none now"

    def _needs(self) -> str:
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


def next_steps(needs: list[UserSpace]) -> list[str]:
    """The next step of each need the container does not meet already: a container found to
    hold the host's version is quiet.

    >>> found = ContainerLibs(vmid=200, state="running", seen="init root", nvml="550.100")
    >>> next_steps([UserSpace(vmid=200, version="550.100", holds=found)])
    []
    """
    return [need.step() for need in needs if not need.met]


def holding(needs: list[UserSpace], found: list[ContainerLibs]) -> list[UserSpace]:
    """``needs``, each with what its container was found to hold."""
    by_vmid = {libs.vmid: libs for libs in found}
    return [need.model_copy(update={"holds": by_vmid.get(need.vmid)}) for need in needs]
