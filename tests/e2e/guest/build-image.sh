#!/bin/bash
# Build the e2e test host's guest image into OUT (an empty, new directory):
#   base.qcow2                 compressed ext4 root filesystem (the backing file of each overlay)
#   vmlinuz, initrd.img        the kernel and initramfs for QEMU's -kernel/-initrd at first boot
#   cmdline                    the kernel command line (the image's /etc/kernel/cmdline)
#   id_ed25519{,.pub}          throwaway key that root in the guest accepts
#   ssh_host_ed25519_key.pub   the guest's only SSH host key, to pin in known_hosts
#
# Needs root (debootstrap, chroot), debootstrap, mkfs.ext4 (e2fsprogs), qemu-img, ssh-keygen and
# the Debian mirror. No loop device or mount is used: mkfs.ext4 -d fills the filesystem from the
# directory tree. The harness runs this on a temporary directory and renames it into the cache
# when it succeeds; every file in this directory feeds the cache key, so any edit here rebuilds.
set -euo pipefail

OUT=${1:?usage: build-image.sh OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
MIRROR=${PROXGPU_TESTHOST_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
ROOT=$OUT/rootfs

# The tool's inspection is a POSIX sh script using grep -Z, find -printf, base64 and awk, so
# the providers of those are named even though minbase would pull most of them in anyway.
# nvidia-modprobe (contrib) is NVIDIA's own tool that makes the /dev/nvidia* nodes. grub2-common
# (update-grub) for a test that makes the host boot with GRUB; no boot loader is installed (QEMU
# boots the kernel itself, see testhost.py).
PACKAGES=(
  linux-image-amd64 initramfs-tools zstd kmod udev systemd-sysv dbus
  openssh-server openssh-sftp-server
  pciutils driverctl psmisc procps iproute2
  coreutils grep findutils mawk
  nvidia-modprobe
  grub2-common
)
# The guests' own tools, as a Proxmox VE host starts its guests with them: LXC for CT 200 (its
# root file system is busybox-static's one binary) and QEMU for VM 300's vfio-pci devices. Not
# their Recommends: no firmware beyond SeaBIOS, no GUI, no templates or lxcfs. busybox-static is
# CT 200's, unpacked into its root file system only: installed on the host, initramfs-tools would
# put busybox into every initramfs (BUSYBOX=auto), which a host without it does not get, and its
# hundreds of applet links cost each rebuild about 10 s under TCG.
GUEST_TOOLS=(lxc qemu-system-x86)
# What builds the stand-in NVIDIA driver; removed from the image once it is built.
TOOLCHAIN=(gcc make)

step() { printf '\n=== %s: %s\n' "$(date +%T)" "$*"; }

step "debootstrap $SUITE from $MIRROR"
mkdir -p "$ROOT"
debootstrap --variant=minbase --components=main,contrib \
  --include="$(IFS=,; echo "${PACKAGES[*]}")" "$SUITE" "$ROOT" "$MIRROR"
KVER=$(ls "$ROOT/usr/lib/modules")
[ "$(wc -w <<<"$KVER")" = 1 ] || { echo "expected one kernel, found: $KVER" >&2; exit 1; }

step "stand-in NVIDIA driver for $KVER"
# Built in the guest against its own kernel's headers, installed where DKMS puts NVIDIA's
# modules; the headers and compiler then leave the image again.
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
chroot "$ROOT" apt-get -qq update
step "guest tools: ${GUEST_TOOLS[*]}"
chroot "$ROOT" apt-get -qq install -y --no-install-recommends "${GUEST_TOOLS[@]}"
chroot "$ROOT" sh -c 'cd /tmp && apt-get -qq download busybox-static'
dpkg-deb -x "$ROOT"/tmp/busybox-static_*.deb "$OUT/busybox"
rm -f "$ROOT"/tmp/busybox-static_*.deb
# shellcheck disable=SC2016 # dpkg-query's own ${Package}
chroot "$ROOT" dpkg-query -W -f '${Package}\n' | sort >"$OUT/packages-before"
chroot "$ROOT" apt-get -qq install -y --no-install-recommends "linux-headers-$KVER" "${TOOLCHAIN[@]}"
mkdir -p "$ROOT/usr/src/nvidia-standin"
cp "$HERE"/nvidia-standin/* "$ROOT/usr/src/nvidia-standin/"
chroot "$ROOT" make -s -C "/usr/lib/modules/$KVER/build" M=/usr/src/nvidia-standin modules
install -d "$ROOT/usr/lib/modules/$KVER/updates/dkms"
install -m 644 "$ROOT"/usr/src/nvidia-standin/*.ko "$ROOT/usr/lib/modules/$KVER/updates/dkms/"
rm -rf "$ROOT/usr/src/nvidia-standin"
# shellcheck disable=SC2016 # dpkg-query's own ${Package}
chroot "$ROOT" dpkg-query -W -f '${Package}\n' | sort | comm -13 "$OUT/packages-before" - \
  >"$OUT/packages-toolchain"
# shellcheck disable=SC2046 # one package name per word
chroot "$ROOT" dpkg --purge $(cat "$OUT/packages-toolchain")
rm -f "$OUT/packages-before" "$OUT/packages-toolchain"

step "configuration files"
# Copy the overlay's contents, not its (git-checkout) ownership or directory modes.
cp -r --no-preserve=mode,ownership "$HERE/overlay/." "$ROOT/"
chmod 755 "$ROOT/usr/local/bin/nvidia-smi"
# The host's resolver configuration means nothing inside the isolated guest.
: > "$ROOT/etc/resolv.conf"
chroot "$ROOT" systemctl enable systemd-networkd.service pve-guests.service
# Nothing in the guest needs "network online"; waiting for it only stretches every boot, as do
# the periodic maintenance timers.
chroot "$ROOT" systemctl mask systemd-networkd-wait-online.service apt-daily.timer \
  apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer
# The tests start CT 200 themselves; LXC's own units (autostart, its NAT bridge) are not a
# Proxmox host's and only cost boot time.
chroot "$ROOT" systemctl mask lxc.service lxc-net.service lxc-monitord.service
chroot "$ROOT" systemctl set-default multi-user.target

step "CT 200's root file system"
# Where pve-container mounts a container's root volume (lxc.rootfs.path, src/PVE/LXC.pm): here a
# directory with busybox-static as every command, and an unprivileged user (uid 1000) to open
# the GPUs as. A few hundred KiB instead of a debootstrapped tree.
CT=$ROOT/var/lib/lxc/200/rootfs
install -d "$CT"/{bin,dev,etc,proc,sys,tmp,root}
chmod 1777 "$CT/tmp"
install -m 755 "$OUT/busybox/bin/busybox" "$CT/bin/busybox"
rm -rf "$OUT/busybox"
for applet in sh ls cat stat mknod id sleep true; do ln -s busybox "$CT/bin/$applet"; done
printf 'root:x:0:0:root:/root:/bin/sh\ngpu:x:1000:1000:gpu:/tmp:/bin/sh\n' >"$CT/etc/passwd"
printf 'root:x:0:\ngpu:x:1000:\n' >"$CT/etc/group"

step "ssh keys"
# The client key and the host key are made here, once per image, so that the harness never has
# to trust a key it first sees over the network.
ssh-keygen -q -t ed25519 -N '' -C proxgpu-testhost-client -f "$OUT/id_ed25519"
install -d -m 700 "$ROOT/root/.ssh"
install -m 600 "$OUT/id_ed25519.pub" "$ROOT/root/.ssh/authorized_keys"
rm -f "$ROOT"/etc/ssh/ssh_host_*
ssh-keygen -q -t ed25519 -N '' -C proxgpu-testhost -f "$ROOT/etc/ssh/ssh_host_ed25519_key"
cp "$ROOT/etc/ssh/ssh_host_ed25519_key.pub" "$OUT/ssh_host_ed25519_key.pub"

step "slimming"
# Package caches, documentation and foreign locales are dead weight in a test image.
rm -rf "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb \
  "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* \
  "$ROOT"/usr/share/info/*
find "$ROOT/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'en*' -exec rm -rf {} +
# Kernel module trees for hardware and filesystems the emulated machine never has. Kept on
# purpose: drm (bochs), sound/pci (snd_hda_intel), vfio, virtio, block, net core. scsi goes
# together with ata because libata needs scsi symbols.
KMOD=$ROOT/usr/lib/modules/$KVER/kernel
for tree in drivers/net/wireless drivers/net/ethernet drivers/media drivers/infiniband \
  drivers/staging drivers/iio drivers/comedi drivers/usb drivers/hid drivers/scsi drivers/ata \
  drivers/md drivers/isdn drivers/bluetooth drivers/hwmon drivers/input/touchscreen drivers/mtd \
  drivers/gpu/drm/amd drivers/gpu/drm/nouveau drivers/gpu/drm/i915 drivers/gpu/drm/radeon \
  net/wireless net/mac80211 net/bluetooth sound/usb sound/soc sound/firewire sound/isa \
  fs/btrfs fs/xfs fs/ocfs2 fs/nfs fs/nfsd fs/ceph fs/cifs fs/smb fs/gfs2 fs/f2fs fs/ubifs \
  fs/jfs fs/reiserfs fs/nilfs2; do
  rm -rf "${KMOD:?}/$tree"
done
chroot "$ROOT" depmod -a "$KVER"

step "initramfs"
# Regenerate with the overlay's MODULES=list configuration (the kernel's postinst built one
# with the stock MODULES=most).
chroot "$ROOT" update-initramfs -u -k "$KVER"
cp "$ROOT/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
cp "$ROOT/boot/initrd.img-$KVER" "$OUT/initrd.img"
cp "$ROOT/etc/kernel/cmdline" "$OUT/cmdline"

step "filesystem image"
# 512 MiB of headroom for what the tests write (regenerated initrds, logs, config files).
SIZE_MB=$(( $(du -sm "$ROOT" | cut -f1) + 512 ))
mkfs.ext4 -q -F -L root -d "$ROOT" "$OUT/rootfs.raw" "${SIZE_MB}M"
qemu-img convert -c -O qcow2 "$OUT/rootfs.raw" "$OUT/base.qcow2"
rm -f "$OUT/rootfs.raw"
# The tree has served its purpose; the cache keeps only the artefacts listed above.
rm -rf --one-file-system "$ROOT"
ls -l "$OUT"
step "done ($KVER)"
