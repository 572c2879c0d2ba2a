"""The inventory: what one host's inspection found, as a stable, JSON-serialisable model.

The field names documented in the JSON contract of docs/inspecting.md keep their names and
meaning across releases; new fields may be added. Everything here is plain data: building an
inventory is the job of :mod:`proxgpu.inspection`, using it is the job of the planner and
renderers. The classes are frozen dataclasses: ``dataclasses.replace`` copies one with changes,
``dataclasses.asdict`` dumps it (:func:`~proxgpu.inspection.document.inventory_document` is the
``inspect --json`` document), and reading and printing a host's inventory never loads pydantic.

>>> node = NumaNode(id=0, cpus="0-31", memory_kib=263678136)
>>> node.cpu_ids()[:3]
[0, 1, 2]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from proxgpu.cpulist import parse_cpulist
from proxgpu.pci import module_name, returning_driver

SCHEMA_VERSION = 1

BootLoader = Literal["grub", "systemd-boot", "unknown"]


@dataclass(frozen=True, kw_only=True)
class NumaNode:
    """One NUMA node: its id, CPUs (a kernel cpulist string) and memory."""

    id: int
    cpus: str
    memory_kib: int | None = None

    def cpu_ids(self) -> list[int]:
        """The node's CPUs as integers, ascending."""
        return parse_cpulist(self.cpus)


@dataclass(frozen=True, kw_only=True)
class MdevType:
    """A mediated device type a GPU offers (``mdev_supported_types/TYPE/``: NVIDIA vGPU on the
    host driver, Intel GVT-g): ``id`` is the directory's name, which a VM's ``hostpciN``
    ``mdev=`` names; ``available`` how many more instances the driver can create now;
    ``instances`` the UUIDs of those that exist (``devices/``), as qemu-server names a VM's
    (``00000000-0000-0000-0000-000000000310``: hostpci index, then VMID) while it runs.

    >>> MdevType(id="nvidia-1072", name="GRID RTX6000-4Q", available=6, device_api="vfio-pci").id
    'nvidia-1072'
    """

    id: str
    name: str | None = None
    available: int = 0
    device_api: str | None = None
    instances: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class VgpuType:
    """A vGPU type NVIDIA's driver can create on an SR-IOV virtual function now, as the VF's
    ``nvidia/creatable_vgpu_types`` lists it (``1155 : NVIDIA L40S-8Q``; vGPU 17 and later, Linux
    6.8 and later): a VM's ``hostpciN: VF,mdev=nvidia-ID`` names it, and qemu-server writes
    the id into the VF's ``nvidia/current_vgpu_type`` at the VM's start.

    >>> VgpuType(id=1155, name="NVIDIA L40S-8Q").mdev_type
    'nvidia-1155'
    """

    id: int
    name: str

    @property
    def mdev_type(self) -> str:
        """The type as a VM's ``mdev=`` names it (qemu-server's ``nvidia-ID``)."""
        return f"nvidia-{self.id}"


@dataclass(frozen=True, kw_only=True)
class VirtualFunction:
    """An SR-IOV virtual function of a GPU (its sysfs ``physfn`` link names the GPU): on
    Ampere and later NVIDIA's vGPU runs on these, one vGPU each, and they exist only while the
    GPU's own driver keeps SR-IOV on, so a VF is a part of its GPU, never a GPU of its own.

    A VF offers its vGPU types one of two ways: ``mdev_types``, its ``mdev_supported_types/``
    (NVIDIA vGPU before 17: a VM's ``mdev=`` makes a mediated device on the VF), or
    ``creatable_vgpu_types`` and ``current_vgpu_type`` from its ``nvidia/`` directory (vGPU 17
    and later: the type id written there makes the vGPU, 0 none; ``None`` when the VF has no
    such files).

    >>> vf = VirtualFunction(address="0000:81:01.2", current_vgpu_type=1155,
    ...                      creatable_vgpu_types=[])
    >>> vf.live_vgpus, vf.offers("nvidia-1155")
    (['nvidia-1155'], False)
    """

    address: str
    driver: str | None = None
    iommu_group: int | None = None
    mdev_types: list[MdevType] = field(default_factory=list)
    creatable_vgpu_types: list[VgpuType] | None = None
    current_vgpu_type: int | None = None

    @property
    def live_vgpus(self) -> list[str]:
        """The types of the vGPUs the VF holds now: its current vGPU type, or the types of its
        mediated devices that exist."""
        live = [f"nvidia-{self.current_vgpu_type}"] if self.current_vgpu_type else []
        return live + [t.id for t in self.mdev_types for _ in t.instances]

    @property
    def known_types(self) -> list[str]:
        """Every type the VF shows: creatable now, offered as an mdev type, or held now."""
        found = [t.mdev_type for t in self.creatable_vgpu_types or []]
        found += [t.id for t in self.mdev_types] + self.live_vgpus
        return sorted(set(found))

    def offers(self, mdev_type: str) -> bool:
        """Whether a vGPU of ``mdev_type`` can be made on the VF now: it holds none, and the
        driver lists the type as creatable (or has an mdev instance of it available)."""
        if self.live_vgpus:
            return False
        creatable = [t.mdev_type for t in self.creatable_vgpu_types or []]
        available = [t.id for t in self.mdev_types if t.available > 0]
        return mdev_type in creatable + available


@dataclass(frozen=True, kw_only=True)
class PciFunction:
    """One PCI function as sysfs describes it.

    IDs are four lower-case hex digits without ``0x`` (``10de``), the form Proxmox and
    ``lspci -n`` use; ``class_code`` keeps the kernel's six-digit form (``0x030000``).
    ``pci_path`` lists the bridges above the function, root port first (``[]``: on a root bus;
    ``None``: the capture did not record the device's sysfs path). ``reset_methods`` are the
    resets the kernel can do to it, as sysfs ``reset_method`` lists them (``flr``, ``pm``,
    ``bus``; ``[]``: none; ``None``: the capture did not read them). ``modalias`` is what udev
    asks kmod to load for it (``pci:v000010DEd...``; ``None``: not read, as for a function
    outside a GPU's slot).
    """

    address: str
    class_code: str
    vendor_id: str
    device_id: str
    subsystem_vendor_id: str | None = None
    subsystem_device_id: str | None = None
    name: str | None = None
    driver: str | None = None
    driver_override: str | None = None
    numa_node: int | None = None
    iommu_group: int | None = None
    is_bridge: bool = False
    pci_path: list[str] | None = None
    reset_methods: list[str] | None = None
    modalias: str | None = None

    @property
    def slot(self) -> str:
        """The address without its function number (``0000:81:00``)."""
        return self.address.rsplit(".", 1)[0]


#: Why inspection did not take a display controller or processing accelerator as a GPU (see
#: :class:`PassedOver`).
PassedOverReason = Literal["accelerator", "filtered"]


@dataclass(frozen=True, kw_only=True)
class PassedOver:
    """A display controller or processing accelerator that inspection saw and did not take as a
    GPU, with why: ``accelerator``, a processing accelerator of another kind than a GPU (an FPGA,
    Habana's Gaudi; see :func:`~proxgpu.pci.is_gpu_accelerator`), taken only when
    ``--gpu-vendor`` names its vendor; ``filtered``, left out by the ``--gpu-class`` or
    ``--gpu-vendor`` given.

    >>> fpga = PciFunction(address="0000:41:00.0", class_code="0x120000", vendor_id="10ee",
    ...                    device_id="903f")
    >>> PassedOver(function=fpga, reason="accelerator").function.slot
    '0000:41:00'
    """

    function: PciFunction
    reason: PassedOverReason


@dataclass(frozen=True, kw_only=True)
class ModuleAlias:
    """One alias of a module, as depmod lists it: the glob kmod matches a device's modalias
    against, and the module it names.

    >>> ModuleAlias(alias="pci:v000010DEd*sv*sd*bc03sc*i*", module="nouveau").module
    'nouveau'
    """

    alias: str
    module: str


@dataclass(frozen=True, kw_only=True)
class KernelModules:
    """What an installed kernel's module directory says of the GPUs' functions: the lines of its
    ``modules.alias`` that can find a module for one of their modaliases (``aliases``), and the
    same of the modules built into it (``builtin_aliases``, from ``modules.builtin.modinfo``;
    ``None`` when that was not read).

    >>> KernelModules(aliases=[]).builtin_aliases is None
    True
    """

    aliases: list[ModuleAlias]
    builtin_aliases: list[ModuleAlias] | None = None


@dataclass(frozen=True, kw_only=True)
class NvidiaCap:
    """One NVIDIA capability (MIG's ``config`` and ``monitor`` rights, a MIG instance's
    ``access``): the /proc file that describes it, and the minor and mode (``0o400``) that its
    ``/dev/nvidia-caps/nvidia-capN`` node takes, as that file's ``DeviceFileMinor`` and
    ``DeviceFileMode`` say (``nvidia-modprobe -f FILE`` makes the node from them)."""

    proc_path: str
    minor: int
    mode: int


@dataclass(frozen=True, kw_only=True)
class MigInstance:
    """One MIG compute instance of a GPU in MIG mode, as NVIDIA's driver describes it in /proc:
    ``gi`` is its GPU instance's id and ``ci`` the compute instance's id within it (the ids
    ``nvidia-smi mig -lgi``/``-lci`` print), ``gi_cap`` and ``ci_cap`` the two ``access``
    capabilities a process needs to run CUDA on it (the files
    ``/proc/driver/nvidia/capabilities/gpuN/mig/giG/access`` and ``.../giG/ciC/access``, N the
    GPU's nvidia minor). ``uuid`` is the MIG device's ``MIG-...`` UUID, known only to NVML
    (``nvidia-smi -L``): ``None`` when inspection could not read it.

    >>> cap = NvidiaCap(proc_path="/proc/driver/nvidia/capabilities/gpu0/mig/gi1/access",
    ...                 minor=12, mode=0o444)
    >>> MigInstance(gi=1, ci=0, gi_cap=cap, ci_cap=cap).label
    'GI 1 CI 0'
    """

    gi: int
    ci: int
    gi_cap: NvidiaCap
    ci_cap: NvidiaCap
    uuid: str | None = None

    @property
    def label(self) -> str:
        """``GI 1 CI 0``, as the plan text names the instance."""
        return f"GI {self.gi} CI {self.ci}"


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """A GPU: a display-class PCI function, or a processing accelerator that is a GPU (AMD
    Instinct), plus every function of its slot.

    ``functions`` lists the slot's addresses, the GPU's own first. ``iommu_group_peers`` lists
    every *other* device in the GPU's IOMMU group, bridges marked, since all of them must move
    together. ``pci_path`` is the GPU function's parent chain (see :class:`PciFunction`).
    ``bar_bytes`` lists the sizes of its memory BARs (empty: not read), ``drm_nodes`` its
    ``/dev/dri`` nodes (``card1``, ``renderD129``), and ``bmc_display`` marks a server's onboard
    display controller (its BMC's remote console; see :func:`~proxgpu.pci.is_bmc_display`), which
    is never planned unless named by address.
    ``bar64_bytes`` are the sizes of its 64-bit prefetchable BARs, the ones a VM's UEFI places
    above 4 GiB. ``mig_instances`` are its MIG compute instances (empty: not in MIG mode, or no
    instance made yet), by GPU instance then compute instance id; ``mig_mode`` says it is in MIG
    mode, as a GPU instance of it shows (one put in MIG mode before any instance is made shows
    none, see :mod:`~proxgpu.inspection.mig`): CUDA then runs only on its MIG devices.
    ``virtual_functions`` are its SR-IOV virtual functions (:class:`VirtualFunction`, by
    address): parts of it, not among ``functions``, which move with it.
    """

    address: str
    vendor_id: str
    device_id: str
    subsystem_vendor_id: str | None = None
    subsystem_device_id: str | None = None
    class_code: str
    model: str | None = None
    numa_node: int | None = None
    local_cpus: str | None = None
    iommu_group: int | None = None
    driver: str | None = None
    driver_override: str | None = None
    boot_vga: bool = False
    functions: list[str]
    function_info: list[PciFunction]
    iommu_group_peers: list[PciFunction] = field(default_factory=list)
    nvidia_minor: int | None = None
    nvidia_uuid: str | None = None
    pci_path: list[str] | None = None
    bar_bytes: list[int] = field(default_factory=list)
    drm_nodes: list[str] = field(default_factory=list)
    bmc_display: bool = False
    bar64_bytes: list[int] = field(default_factory=list)
    mdev_types: list[MdevType] = field(default_factory=list)
    mig_instances: list[MigInstance] = field(default_factory=list)
    mig_mode: bool = False
    virtual_functions: list[VirtualFunction] = field(default_factory=list)

    @property
    def label(self) -> str:
        """Its model (NVIDIA's driver's name for it, else pci.ids'), else its ``vendor:device``
        IDs: how the plan, the inventory's text and the picture name it."""
        return self.model or f"{self.vendor_id}:{self.device_id}"

    @property
    def host_driver(self) -> str | None:
        """The driver this GPU holds on the host after a split: its own, or, when it is unbound
        or on vfio-pci, the one it returns to (``None`` when proxgpu cannot tell)."""
        return returning_driver(self.driver, self.vendor_id, self.class_code)

    @property
    def slot(self) -> str:
        """The address without its function number (``0000:81:00``)."""
        return self.address.rsplit(".", 1)[0]

    @property
    def virtual_functions_said(self) -> str | None:
        """How many SR-IOV virtual functions it has and which carry a vGPU now, as ``inspect``'s
        text and tree say it (``None``: it has none).

        >>> vfs = [VirtualFunction(address="0000:81:00.4"),
        ...        VirtualFunction(address="0000:81:01.2", current_vgpu_type=1155)]
        >>> Gpu(address="0000:81:00.0", vendor_id="10de", device_id="26b9", class_code="0x030200",
        ...     functions=[], function_info=[], virtual_functions=vfs).virtual_functions_said
        '2 SR-IOV virtual functions, a vGPU on 0000:81:01.2 (nvidia-1155)'
        """
        count = len(self.virtual_functions)
        if not count:
            return None
        said = f"{count} SR-IOV virtual function{'s' * (count != 1)}"
        held = [
            f"{vf.address} ({', '.join(vf.live_vgpus)})"
            for vf in self.virtual_functions
            if vf.live_vgpus
        ]
        if not held:
            return f"{said}, no vGPU on them"
        return f"{said}, {'a vGPU' if len(held) == 1 else 'vGPUs'} on {', '.join(held)}"


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """Everything proxgpu knows about one host.

    ``guest_configs`` and ``host_files`` map absolute paths to the files' exact text so that later
    stages can diff against them and detect changes made since inspection. ``driver_modules`` maps
    a PCI driver's name to the module that provides it (``bochs-drm`` -> ``bochs``); built-in
    drivers have none. ``commands`` lists the tools found on the host (``driverctl``, ...), and
    ``device_nodes`` the nvidia device nodes present (empty when the capture did not look).
    ``nics`` are the network functions under the same root port as a GPU (behind one PCIe
    switch with it: the GPU's GPUDirect RDMA peers). ``nvswitches`` are NVIDIA's NVLink switches
    (HGX boards): the GPUs they join form one fabric that Fabric Manager manages as a whole.
    ``container`` is the file that shows inspection ran inside a container (LXC's
    ``/dev/.lxc-boot-id``, systemd's ``/run/systemd/container``), ``None`` on a host: there
    ``gpus`` are every GPU of the host, and ``device_nodes`` those the container was given.
    ``pve_container_version`` is the installed pve-container package's (it decides whether a
    container takes ``devN`` entries), and ``nvidia_caps`` the NVIDIA capabilities the driver
    describes in /proc, by minor.
    ``cpu_phys_bits`` and ``cpu_pdpe1gb`` are the first CPU's physical address bits and 1 GiB page
    flag (``/proc/cpuinfo``), ``secure_boot`` whether UEFI Secure Boot is on (``None``: not
    known), ``framebuffers`` the names ``/proc/fb`` lists (``EFI VGA``, ``simpledrmdrmfb``;
    ``None``: the file was not read, so whether the kernel made one is unknown).
    """

    schema_version: int = SCHEMA_VERSION
    source: str
    hostname: str
    kernel: str | None = None
    pve_version: str | None = None
    boot_loader: BootLoader = "unknown"
    kernel_cmdline: str | None = None
    iommu_enabled: bool = False
    numa_nodes: list[NumaNode] = field(default_factory=list)
    gpus: list[Gpu] = field(default_factory=list)
    #: The display controllers and processing accelerators that are not among ``gpus``, by
    #: address, each with why (an SR-IOV virtual function goes with its physical function).
    passed_over: list[PassedOver] = field(default_factory=list)
    nics: list[PciFunction] = field(default_factory=list)
    nvswitches: list[PciFunction] = field(default_factory=list)
    char_majors: dict[str, int] = field(default_factory=dict)
    cpu_vendor: str | None = None
    driver_modules: dict[str, str] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    device_nodes: list[str] = field(default_factory=list)
    nvidia_driver_version: str | None = None
    #: The mode and group the nvidia driver gives its device files (``DeviceFileMode`` and
    #: ``DeviceFileGID`` in ``/proc/driver/nvidia/params``; NVIDIA's defaults are 0666 and 0).
    nvidia_device_file_mode: int | None = None
    nvidia_device_file_gid: int | None = None
    #: Base names of the modules (``nvidia.ko.zst``) and proxgpu files in the running kernel's
    #: initramfs; ``None`` when it was not read (no ``lsinitramfs``, no initramfs).
    initramfs_files: list[str] | None = None
    is_root: bool = False
    guest_configs: dict[str, str] = field(default_factory=dict)
    host_files: dict[str, str] = field(default_factory=dict)
    #: The files of ``guest_configs`` and ``host_files`` that are not UTF-8, each with where it
    #: stops being so (``is not UTF-8 (byte 0xff at offset 32)``): their text there holds U+FFFD
    #: for those bytes, so a plan never changes them.
    not_utf8: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    container: str | None = None
    pve_container_version: str | None = None
    nvidia_caps: list[NvidiaCap] = field(default_factory=list)
    cpu_phys_bits: int | None = None
    cpu_pdpe1gb: bool | None = None
    secure_boot: bool | None = None
    framebuffers: list[str] | None = None
    #: By kernel release, each installed kernel's module aliases that can name a driver for a
    #: GPU's function (see :class:`KernelModules`); empty when none were read.
    kernel_modules: dict[str, KernelModules] = field(default_factory=dict)

    @property
    def node_name(self) -> str:
        """The host's name as a Proxmox VE cluster node: its short hostname.

        >>> Inventory(source="s", hostname="pve1.example.org").node_name
        'pve1'
        """
        return self.hostname.split(".")[0]

    @property
    def summary(self) -> str:
        """The host in one line, as ``inspect``'s text, its tree and its picture head it: name,
        Proxmox VE, kernel, boot loader, IOMMU, nvidia driver.

        >>> Inventory(source="s", hostname="pve1", pve_version="8.4.1", kernel="6.8.12-11-pve",
        ...           boot_loader="grub", iommu_enabled=True).summary
        'pve1: Proxmox VE 8.4.1, kernel 6.8.12-11-pve, grub, IOMMU on'
        """
        facts = [f"Proxmox VE {self.pve_version}" if self.pve_version else "not Proxmox VE"]
        facts += [f"kernel {self.kernel or '?'}", self.boot_loader]
        facts.append("IOMMU on" if self.iommu_enabled else "IOMMU off")
        if self.nvidia_driver_version:
            facts.append(f"nvidia {self.nvidia_driver_version}")
        return f"{self.hostname}: " + ", ".join(facts)

    @property
    def gpu_functions(self) -> dict[str, PciFunction]:
        """Every function of each GPU's slot and of its IOMMU group (bridges too), by address:
        what a split moves, or leaves beside what it moves.

        >>> Inventory(source="s", hostname="h").gpu_functions
        {}
        """
        return {f.address: f for g in self.gpus for f in (*g.function_info, *g.iommu_group_peers)}

    def driver_module(self, driver: str) -> str | None:
        """The module that provides ``driver``, a PCI driver loaded now (the name ``softdep`` and
        ``blacklist`` lines use), or ``None`` when it is built into the kernel: its sysfs
        directory has no ``module`` link. A capture that recorded no module link at all (one
        taken before proxgpu read them) cannot tell, and gets the name its module would have.

        >>> inventory = Inventory(source="s", hostname="h", driver_modules={"bochs-drm": "bochs"})
        >>> inventory.driver_module("bochs-drm"), inventory.driver_module("pcieport")
        ('bochs', None)
        """
        if driver in self.driver_modules:
            return self.driver_modules[driver]
        return None if self.driver_modules else module_name(driver)

    def host_module(self, function: PciFunction) -> str | None:
        """The module that drives ``function`` on the host: its driver's, or, unbound or on
        vfio-pci, the module of the driver it returns to; ``None`` for a built-in driver or one
        proxgpu cannot tell.

        >>> fn = PciFunction(address="0000:81:00.1", vendor_id="10de", device_id="22e8",
        ...                  class_code="0x040300", driver="vfio-pci")
        >>> Inventory(source="s", hostname="h", driver_modules={"nvidia": "nvidia"}).host_module(fn)
        'snd_hda_intel'
        """
        driver = returning_driver(function.driver, function.vendor_id, function.class_code)
        if driver is None:
            return None
        # Only a driver bound now is known to be loaded, and so whether it is built in.
        return self.driver_module(driver) if driver == function.driver else module_name(driver)

    def gpu(self, address: str) -> Gpu:
        """The GPU at ``address`` (any function of its slot).

        :raises KeyError: when no GPU sits at that address.
        """
        for gpu in self.gpus:
            if address in gpu.functions or gpu.slot == address:
                return gpu
        raise KeyError(address)

    def numa_node(self, node_id: int) -> NumaNode:
        """The NUMA node with this id.

        :raises KeyError: when the host has no such node.
        """
        for node in self.numa_nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)
