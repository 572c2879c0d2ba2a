# shellcheck shell=sh
# proxgpu busy: who holds each function's device nodes, and nvidia persistence mode.
# Usage: busy.sh ROOT ADDRESS...   Records:
#   fn ADDR DRIVER | holder ADDR PID NODE COMM | nominor ADDR | nofuser ADDR NODE
#   fb ADDR FBNAME (a framebuffer sits on it) | fbcon (the console is bound to a framebuffer)
#   nvdrm MODESET FBDEV (nvidia_drm's parameters, when it is loaded)
#   mdev ADDR HOLDER UUID TYPE (a mediated device exists on ADDR, or on HOLDER, a VF of it)
#   vfvgpu ADDR VF TYPEID (its VF holds an NVIDIA vGPU: nvidia/current_vgpu_type is not 0)
#   smi RC, then smiline TEXT per line nvidia-smi printed
# In-kernel clients (the framebuffer console, nvidia_drm's fbdev) hold a GPU where fuser cannot
# see them, and nvidia's unbind waits for them forever: the fb, fbcon and nvdrm records tell.
root=$1; shift
command -v fuser >/dev/null 2>&1 && have_fuser=1 || have_fuser=0
holders() {  # ADDR NODE: who has the device node open
    [ -e "$2" ] || return 0
    if [ "$have_fuser" = 0 ]; then rec nofuser "$1" "$2"; return 0; fi
    for pid in $(fuser "$2" 2>/dev/null | tr -cs '0-9' ' '); do
        comm=$(cat "/proc/$pid/comm" 2>/dev/null || echo '?')
        rec holder "$1" "$pid" "$2" "$comm"
    done
}
# Each framebuffer's device, read once: "ADDR=fbN" words.
framebuffers=
for fb in "$root"/sys/class/graphics/fb*; do
    target=$(readlink "$fb/device" 2>/dev/null) || continue
    framebuffers="$framebuffers ${target##*/}=${fb##*/}"
done
# vgpus ADDR DIR: the vGPUs that exist on the function in DIR (ADDR's own, or a VF of it): its
# mediated devices, each a link in its type's devices/ (mdev sysfs ABI), and NVIDIA's vGPU type
# on a VF. The driver that made them holds the GPU while they exist.
vgpus() {
    for m in "$2"/mdev_supported_types/*/devices/*; do
        { [ -L "$m" ] || [ -e "$m" ]; } || continue
        # The kernel names a mediated device by its UUID, and its type in letters, digits and
        # _ + - (a name it cannot make would break the record).
        case ${m##*/} in *[!0-9a-fA-F-]*) continue ;; esac
        t=${m%/devices/*}
        t=${t##*/}
        case $t in *[!A-Za-z0-9_+-]*) t='?' ;; esac
        rec mdev "$1" "${2##*/}" "${m##*/}" "$t"
    done
    current=$2/nvidia/current_vgpu_type
    if [ -f "$current" ] && read -r type <"$current" 2>/dev/null && [ "$type" != 0 ]; then
        rec vfvgpu "$1" "${2##*/}" "$type"
    fi
}
nvidia=0
for F; do
    d=$root/sys/bus/pci/devices/$F
    link=$(readlink "$d/driver" 2>/dev/null) || link=
    drv=${link##*/}
    rec fn "$F" "${drv:--}"
    vgpus "$F" "$d"
    # Its SR-IOV virtual functions (virtfnN links to them, as the kernel makes them).
    for vf in "$d"/virtfn*; do
        target=$(readlink "$vf" 2>/dev/null) || continue
        case ${target##*/} in *[!0-9a-f:.]*) continue ;; esac
        vgpus "$F" "$root/sys/bus/pci/devices/${target##*/}"
    done
    for pair in $framebuffers; do
        [ "${pair%%=*}" = "$F" ] && rec fb "$F" "${pair#*=}"
    done
    case $drv in
    nvidia)
        nvidia=1
        # nvidia_drm's nodes (modeset=1): a compositor or Xorg holds the GPU through them.
        for node in "$d"/drm/card* "$d"/drm/renderD*; do
            [ -e "$node" ] && holders "$F" "$root/dev/dri/${node##*/}"
        done
        info=$root/proc/driver/nvidia/gpus/$F/information
        minor=$(sed -n 's/^Device Minor:[[:space:]]*//p' "$info" 2>/dev/null)
        if [ -n "$minor" ]; then holders "$F" "$root/dev/nvidia$minor"
        else rec nominor "$F"; fi ;;
    vfio-pci)
        group=$(readlink "$d/iommu_group" 2>/dev/null) || group=
        [ -n "$group" ] && holders "$F" "$root/dev/vfio/${group##*/}" ;;
    '') ;;
    *)
        holders "$F" "$root/dev/dri/by-path/pci-$F-card"
        holders "$F" "$root/dev/dri/by-path/pci-$F-render" ;;
    esac
done
for con in "$root"/sys/class/vtconsole/vtcon*; do
    { read -r name <"$con/name" && read -r bound <"$con/bind"; } 2>/dev/null || continue
    case $name in *"frame buffer"*) [ "$bound" = 1 ] && rec fbcon ;; esac
done
params=$root/sys/module/nvidia_drm/parameters
if [ -d "$params" ]; then
    rec nvdrm "$(cat "$params/modeset" 2>/dev/null || echo -)" "$(cat "$params/fbdev" 2>/dev/null || echo -)"
fi
if [ "$nvidia" = 1 ]; then
    out=$(timeout 30 nvidia-smi --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader 2>&1)
    rec smi "$?"
    printf '%s\n' "$out" | while IFS= read -r line; do rec smiline "$line"; done
fi
true  # done: the EXIT trap writes the end record with status 0
