"""What moving GPUs to vfio-pci does to the host, for the first day: the console's framebuffer,
legacy VGA routing, Secure Boot and the kept GPUs' driver, resets, qemu-server's ``new_id``, and
the MIG instances of a GPU in MIG mode."""

from __future__ import annotations

import re

from proxgpu.inspection.inventory import Gpu, PciFunction
from proxgpu.pci import NVIDIA_DRIVER
from proxgpu.planning import wording
from proxgpu.planning.context import Context
from proxgpu.planning.model import PlanGroup
from proxgpu.pve.claims import nvidia_cap_users
from proxgpu.pve.versions import version_before

#: The kernel whose vfio-pci removes firmware framebuffers on the VGA devices it binds
#: (commit d17378062079 "vfio/pci: Remove console drivers", Linux 6.0).
_REMOVES_FRAMEBUFFERS = (6, 0)
#: The names firmware framebuffers register in /proc/fb: efifb, vesafb, simplefb, simpledrm.
_FIRMWARE_FB = re.compile(r"^(EFI VGA|VESA VGA|simple.*)$")
#: The command-line word that keeps the kernel from making any firmware framebuffer at boot.
_NO_SYSFB = re.compile(r"^initcall_blacklist=(.*,)?sysfb_init(,.*)?$")
#: What turns off the firmware framebuffer of each kind /proc/fb may name: efifb and vesafb
#: have their own switch, and the simple framebuffers come only from sysfb_init.
_FB_OFF = {"EFI VGA": "video=efifb:off", "VESA VGA": "video=vesafb:off"}
#: The reset methods that reset a function's whole bus, not the function alone.
_BUS_RESETS = {"bus", "cxl_bus"}


def advise_host(ctx: Context, groups: list[PlanGroup]) -> None:
    """Warnings about the host's side of the split."""
    moved = [ctx.index.get(a) for g in groups if g.role.moves_to_vfio for a in g.gpus]
    kept = [ctx.index.get(a) for g in groups if not g.role.moves_to_vfio for a in g.gpus]
    _boot_framebuffer(ctx, moved)
    _legacy_vga(ctx, moved)
    _secure_boot(ctx, kept)
    for group in groups:
        if group.role.moves_to_vfio:
            _resets(ctx, group)
    _new_id(ctx, moved, kept)
    _mig_instances(ctx, moved)


def _boot_framebuffer(ctx: Context, moved: list[Gpu]) -> None:
    """The boot GPU carries the firmware's framebuffer (the kernel's vga default device is the
    one whose memory holds it). From Linux 6.0 vfio-pci removes such a framebuffer when it
    binds a VGA device; before, the framebuffer keeps that memory busy, so QEMU cannot map the
    BAR (the commit's own account).

    Today's ``/proc/fb`` is not the whole story: a DRM driver (nvidia-drm with ``fbdev=1``,
    amdgpu) replaces the firmware's framebuffer with its own once it binds the GPU, so the list
    then shows only the driver's. After the move that driver no longer binds the GPU, and the
    firmware's framebuffer, made again at every boot by the kernel's ``sysfb_init``, stays on
    it until vfio-pci binds. Only ``initcall_blacklist=sysfb_init`` keeps every kind of it from
    being made (``video=efifb:off`` stops efifb alone, not simplefb or simpledrm). An empty
    list says the host makes no framebuffer at all; no list (``/proc/fb`` not read) says
    nothing, so the warning says what to look at."""
    for gpu in (gpu for gpu in moved if gpu.boot_vga):
        if ctx.inventory.framebuffers is None and not _no_sysfb(ctx):
            ctx.warnings.append(_unknown_framebuffer_warning(ctx, gpu))
            continue
        found = _framebuffer_on(ctx, gpu)
        if found:
            ctx.warnings.append(_framebuffer_warning(ctx, *found))


def _no_sysfb(ctx: Context) -> bool:
    """Whether the kernel command line keeps the kernel from making a firmware framebuffer."""
    return any(_NO_SYSFB.match(word) for word in (ctx.inventory.kernel_cmdline or "").split())


def _framebuffer_on(ctx: Context, gpu: Gpu) -> tuple[str, str | None] | None:
    """Where the warning says the boot GPU's framebuffer comes from, and its name in /proc/fb
    when it is listed now; ``None`` when the GPU has none at the next boot."""
    listed = ctx.inventory.framebuffers or []
    firmware = [n for n in listed if _FIRMWARE_FB.match(n)]
    if firmware:
        name = firmware[0]
        return f"{gpu.address} holds the host's boot framebuffer ({name} in /proc/fb)", name
    if not listed or _no_sysfb(ctx):
        return None
    where = (
        f"{gpu.address} is the host's boot GPU: /proc/fb lists no firmware framebuffer now "
        f"(only {', '.join(listed)}: a DRM driver replaced it), but the kernel makes it again "
        "at every boot, on this GPU"
    )
    return where, None


def _framebuffer_warning(ctx: Context, where: str, name: str | None) -> str:
    release = ctx.inventory.kernel or "unknown"
    if not version_before(ctx.inventory.kernel, _REMOVES_FRAMEBUFFERS):
        return (
            f"{where}: vfio-pci removes that framebuffer when it binds the GPU (Linux 6.0 "
            f"and later; the kernel is {release}), so the host's console there freezes: "
            "keep another way in (serial console, the BMC, SSH)"
        )
    return (
        f"{where}: kernel {release} (before 6.0) keeps it on the GPU's memory after "
        "vfio-pci binds the GPU, so QEMU cannot map that BAR and the VM fails to start: "
        f"boot the host with {_FB_OFF.get(name or '', 'initcall_blacklist=sysfb_init')}"
    )


def _unknown_framebuffer_warning(ctx: Context, gpu: Gpu) -> str:
    """The boot GPU moves and ``/proc/fb`` was not read: what to look for, and what follows."""
    if not version_before(ctx.inventory.kernel, _REMOVES_FRAMEBUFFERS):
        follows = (
            "vfio-pci removes it when it binds the GPU, so the host's console there freezes: "
            "keep another way in (serial console, the BMC, SSH)"
        )
    else:
        follows = (
            f"kernel {ctx.inventory.kernel} (before 6.0) keeps it on the GPU's memory, so QEMU "
            "cannot map that BAR and the VM fails to start: boot the host with "
            "initcall_blacklist=sysfb_init"
        )
    return (
        f"{gpu.address} is the host's boot GPU, and whether the kernel puts its boot framebuffer "
        "on it is unknown (/proc/fb was not read: a snapshot taken without it, or a file this "
        "user cannot read): check with "
        "`cat /proc/fb` on the host; if it lists EFI VGA, VESA VGA or a simple framebuffer "
        f"(or only a DRM driver's, which the firmware's returns after the move), {follows}"
    )


def _legacy_vga(ctx: Context, moved: list[Gpu]) -> None:
    """vfio-pci's ``disable_vga=1``: its ``vfio_pci_set_decode`` then reports a VGA device that
    is the only one on its bus (and not on a root bus) as decoding no legacy VGA, since the
    guest cannot reach it; without it vfio-pci reports the legacy ranges decoded. nvidia
    reports its own GPUs as decoding none (``vga_set_legacy_decoding`` in nv-pci.c), so this
    matters when the host keeps a VGA device on another driver (a BMC's display, a boot
    console): the arbiter then has more than one legacy decoder to route between. It takes
    away the legacy VGA access that ``x-vga=1`` needs (qemu-server passes ``x-vga=on`` with
    SeaBIOS only)."""
    moved_ids = {gpu.address for gpu in moved}
    vga = [gpu for gpu in ctx.inventory.gpus if gpu.class_code.startswith("0x0300")]
    kept = [gpu for gpu in vga if gpu.address not in moved_ids and gpu.driver != NVIDIA_DRIVER]
    alone = [
        gpu
        for gpu in vga
        if gpu.address in moved_ids
        and gpu.pci_path
        and not any(o is not gpu and o.address[:7] == gpu.address[:7] for o in vga)
    ]
    configured = any(
        "disable_vga" in text
        for path, text in ctx.inventory.host_files.items()
        if path.startswith("/etc/modprobe.d/")
    )
    if alone and kept and not configured:
        ctx.warnings.append(
            f"{wording.join(wording.addresses(alone))} go to vfio-pci as VGA controllers while "
            f"the host keeps {wording.join(wording.addresses(kept))} for legacy VGA: `options "
            "vfio-pci disable_vga=1` in /etc/modprobe.d makes vfio-pci report them to the VGA "
            "arbiter as decoding no legacy VGA (as nvidia does for its own GPUs), so it never "
            "has to route legacy VGA away from them; leave it off if a VM uses hostpci x-vga=1 "
            "with SeaBIOS, which needs it"
        )


def _secure_boot(ctx: Context, kept: list[Gpu]) -> None:
    """Under Secure Boot Proxmox VE's kernel loads only modules signed by a key it trusts (the
    admin guide's Secure Boot section: DKMS modules need DKMS's MOK enrolled). A loaded nvidia
    passed that check; one that is not loaded may be failing it."""
    if ctx.inventory.secure_boot is not True or ctx.inventory.nvidia_driver_version:
        return
    nvidia = [gpu for gpu in kept if gpu.host_driver == NVIDIA_DRIVER]
    if nvidia:
        ctx.warnings.append(
            f"Secure Boot is on and the nvidia module is not loaded, so "
            f"{wording.join(wording.addresses(nvidia))} (kept on nvidia) get no driver until "
            "nvidia is signed with a key the kernel trusts: build it with DKMS and enroll DKMS's "
            "key (`mokutil --import /var/lib/dkms/mok.pub`, confirmed at the next boot)"
        )


def _resets(ctx: Context, group: PlanGroup) -> None:
    """A function with a reset of its own (``flr``, ``pm``, ...) is reset alone. Without one it
    is reset only with its whole bus: the kernel lists ``bus`` for a function alone on its bus;
    for one sharing it (a GPU and its audio function) vfio-pci resets the bus when every device
    on it is bound to vfio-pci and unused, and QEMU at the VM's reset when the VM has them all
    (VFIO_DEVICE_PCI_HOT_RESET). No bus reset reaches a device on a root bus, nor one whose bus
    holds devices the VM does not get."""
    who = f"VM {group.guest.vmid}" if group.guest and group.guest.type == "vm" else "vfio-pci"
    ours = set(group.functions)
    for function in _functions(ctx, ours):
        methods = function.reset_methods
        if methods is None or set(methods) - _BUS_RESETS:
            continue
        listed = f"reset_method: {' '.join(methods)}" if methods else "no reset_method"
        others = sorted(a for a in _known(ctx) if a[:7] == function.address[:7] and a not in ours)
        if function.pci_path == []:
            ctx.warnings.append(
                f"{function.address} (for {who}) has no reset of its own ({listed}) and sits on "
                "a root bus, where no bus reset reaches it: nothing resets it between VM runs, "
                "so a guest finds it as the last one left it, and a hung one takes a host reboot"
            )
        elif others:
            ctx.warnings.append(
                f"{function.address} (for {who}) has no reset of its own ({listed}), so only a "
                f"reset of its bus cleans it, which also resets {wording.join(others)}: the "
                "kernel and QEMU do that only when every device there goes to the same VM, so "
                "give them to it too or expect its state to carry from one VM run to the next"
            )


def _functions(ctx: Context, addresses: set[str]) -> list[PciFunction]:
    found = {
        f.address: f for gpu in ctx.index.gpus for f in gpu.function_info if f.address in addresses
    }
    return [found[a] for a in sorted(found)]


def _known(ctx: Context) -> set[str]:
    """Every PCI function the inventory describes."""
    inventory = ctx.inventory
    others = [*inventory.nics, *inventory.nvswitches]
    return {*inventory.gpu_functions, *(f.address for f in others)}


def _new_id(ctx: Context, moved: list[Gpu], kept: list[Gpu]) -> None:
    """qemu-server binds a passed-through device that is not on vfio-pci yet by writing its
    ``vendor device`` to vfio-pci's ``new_id`` (``pci_dev_bind_to_vfio`` in pve-common's
    PVE/SysFSTools.pm). The kernel then offers vfio-pci every device of that ID without a
    driver, and only a device whose ``driver_override`` names another driver escapes
    (``pci_match_device``): kept GPUs of the same ID, left driverless when their driver fails to
    load, go to vfio-pci then. proxgpu's bind script writes each kept function's driver into its
    ``driver_override`` at every boot; until a boot has done so, proxgpu warns while they are
    driverless."""
    ids = {(gpu.vendor_id, gpu.device_id) for gpu in moved}
    twins = [gpu for gpu in kept if (gpu.vendor_id, gpu.device_id) in ids]
    loose = [
        gpu
        for gpu in twins
        if gpu.driver is None
        and (gpu.host_driver is None or gpu.driver_override != gpu.host_driver)
    ]
    if not loose:
        return
    named = "/".join(sorted({f"{gpu.vendor_id}:{gpu.device_id}" for gpu in loose}))
    driver = loose[0].host_driver or "their driver"
    ctx.warnings.append(
        f"{wording.join(wording.addresses(loose))} "
        f"{'stays on the host but has' if len(loose) == 1 else 'stay on the host but have'} "
        "no driver now "
        f"({driver} is not loaded or not bound, as after a kernel upgrade without a matching "
        f"module): a VM start that finds a {named} device off vfio-pci writes that ID to "
        "vfio-pci's new_id (qemu-server's pci_dev_bind_to_vfio), and vfio-pci then takes every "
        f"driverless device of that ID, these too: get {driver} loaded (dkms status, modprobe "
        f"{driver}) before starting VMs; from the next boot with the modprobe binding, proxgpu's "
        f"bind script sets their driver_override to {driver}, so new_id cannot take them"
    )


def _mig_instances(ctx: Context, moved: list[Gpu]) -> None:
    """A GPU in MIG mode keeps its MIG instances only while nvidia drives it: they are the
    driver's, gone when it lets the GPU go, and NVIDIA's MIG user guide says they do not outlive
    a reboot either (the admin makes them again, ``nvidia-smi mig -cgi ... -C``). Whatever runs
    on them stops, and a container given one (its capability nodes in its config) loses it."""
    users = nvidia_cap_users(ctx.inventory.guest_configs)
    for gpu in (gpu for gpu in moved if gpu.mig_instances):
        instances = wording.join(i.label for i in gpu.mig_instances)
        used = [
            f"{guest.label} ({instance.label})"
            for instance in gpu.mig_instances
            for guest in users.get(instance.ci_cap.minor, [])
        ]
        who = (
            f"{wording.join(used)} {'uses' if len(used) == 1 else 'use'} them and lose"
            f"{'s' if len(used) == 1 else ''} {'it' if len(used) == 1 else 'them'}"
            if used
            else "no container's config names them, but any process on them stops"
        )
        ctx.warnings.append(
            f"{gpu.address} goes to vfio-pci in MIG mode with "
            f"{wording.count(len(gpu.mig_instances), 'MIG instance')} ({instances}): they are "
            f"nvidia's and go when it lets the GPU go; {who} (nvidia-smi -L lists what runs "
            "there): move that work first, or keep the GPU on nvidia "
            f"(--host-gpus {gpu.address})"
        )
