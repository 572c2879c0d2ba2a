# shellcheck shell=sh
# proxgpu gather: print, in one pass, every file inspection reads.
# Usage: gather.sh ROOT [check|modes]   (ROOT is the prefix the host's absolute paths live under,
# "/" for a live host; check: then say where each file read is, see the check below; modes:
# and each one's mode, for a snapshot)
#
# Plain POSIX sh plus coreutils, grep, find, awk and GNU tar, so it runs unchanged on a Proxmox VE
# host, over SSH, and against a snapshot directory. Forks stay constant in the number of devices
# and guests: one grep reads every small text file, one find reads every symlink, one awk picks
# the few lines it needs out of pci.ids, the kernels' module aliases and dpkg's status, one tar
# (per seven directories) reads the configs. The file names
# reach grep and find through xargs (batches under the kernel's argument limit, however many SR-IOV
# functions the host has), and a batch that could not run is said (#failed WHAT STATUS), never
# taken for files that are empty. Only regular files are opened: a FIFO or device where a sysfs
# file should be is skipped, not waited on.
#
# Output: marker records ("#proxgpu-gather", "#uid", "#section", "#end", written by the prelude's
# rec), each followed by data lines "PATH\0DATA" (relative paths, no leading slash):
#   #section lines   one record per line of a text file
#   #section links   TYPE\0PATH\0TARGET   (TYPE l = symlink; d, f = a directory or file that
#                                          only needs to exist; sys/bus/pci/devices/ADDR links
#                                          give each device's sysfs path, its parent chain)
#   #section raw     PATH\0BASE64 of the exact bytes, PATH\0!unreadable, or PATH\0@MEMBER and
#                    after those lines "#archive<tab>BASE64 of GNU tar archives" (see below)
# With check or modes, in the same run: "#outside\tPATH\tTARGET" for each file read (or refused)
# that is reached only through a link out of the root, with modes "#mode\tOCTAL\tPATH" for each
# other one (a snapshot copies none wider than its source), then "#checked" once every file was
# looked at.
LC_ALL=C
export LC_ALL
# A root that cannot be entered: why, in the words the command line uses for a local --root.
if ! cd "$1" 2>/dev/null; then
    if [ -d "$1" ]; then
        rec error "cannot enter it"
    elif [ -e "$1" ]; then
        rec error "not a directory"
    else
        rec error "no such directory"
    fi
    exit 3
fi

rec proxgpu-gather 1
# The effective user id, from the kernel's own status of this shell (read by a built-in, where
# id -u would be one more process), or from id when /proc cannot say.
uid=
while read -r key _ effective _; do
    [ "$key" = Uid: ] && { uid=$effective; break; }
done 2>/dev/null </proc/self/status
rec uid "${uid:-$(id -u)}"

# regular PATH...: each regular file among PATH..., NUL-terminated (printf is built in, so no
# argument list is made however many paths the globs give).
regular() {
    for f; do [ -f "$f" ] && printf '%s\0' "$f"; done
    return 0
}
# directories PATH...: the same for directories.
directories() {
    for f; do [ -d "$f" ] && printf '%s\0' "$f"; done
    return 0
}
# The file names reach a command through `xargs -0 -r CMD...` (as many at a time as fit), the last
# command of its pipeline, so that the shell runs it without a subshell around it and $? is its
# status. batched STATUS WHAT: says that WHAT failed unless xargs' STATUS is 0 or 123 (a batch's
# grep found nothing or could not read a file, -s: as a missing one); anything else is a batch
# that could not run at all.
batched() {
    case $1 in 0 | 123) ;; *) rec failed "$2" "$1" ;; esac
}

pciids=
for f in usr/share/misc/pci.ids usr/share/hwdata/pci.ids; do
    if [ -f "$f" ]; then pciids=$f; break; fi
done

# is_function NAME: whether NAME is a PCI function as sysfs names it (DDDD:BB:DD.F).
is_function() {
    case $1 in
    [0-9a-f][0-9a-f][0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f].[0-7]) return 0 ;;
    esac
    return 1
}

pairs='' resources='' slots=''
for d in sys/bus/pci/devices/*; do
    { [ -f "$d/vendor" ] && [ -f "$d/device" ]; } || continue
    { read -r v <"$d/vendor" && read -r p <"$d/device"; } 2>/dev/null || continue
    # Once per ID pair: the VFs of one card share theirs.
    case $pairs in *" ${v#0x}${p#0x}"*) ;; *) pairs="$pairs ${v#0x}${p#0x}" ;; esac
    # BAR sizes of display (03) and processing-accelerator (12) functions only: a host's other
    # hundreds of functions would add their 17 lines each to every inspection.
    [ -f "$d/class" ] || continue
    { read -r c <"$d/class"; } 2>/dev/null || continue
    case $c in 0x03* | 0x12*) resources="$resources $d/resource" ;; *) continue ;; esac
    # Their slots, once each, when named as the kernel names a function (so that no word of a
    # name can reach outside the devices' directory).
    is_function "${d##*/}" || continue
    case $slots in *" ${d%.*} "*) ;; *) slots="$slots ${d%.*} " ;; esac
done
# The modalias of each function in those slots: what udev asks kmod to load for it. The files
# are read with the others below; the values also pick the module aliases read after them (only
# those in the kernel's form, pci: and upper-case hex).
modalias_files='' modaliases='' near=''
# shellcheck disable=SC2086 # $slots: one word per slot, checked above
for s in $slots; do
    for d in "$s".*; do
        { is_function "${d##*/}" && [ -f "$d/modalias" ]; } || continue
        modalias_files="$modalias_files $d/modalias"
        { read -r m <"$d/modalias"; } 2>/dev/null || continue
        case $m in pci:v*) ;; *) continue ;; esac
        case $m in *[!A-Za-z0-9:]*) continue ;; esac
        # Once each: the VFs of one card share theirs.
        case "$modaliases " in *" $m "*) continue ;; esac
        modaliases="$modaliases $m"
        v=${m#pci:v}
        near="${near:+$near|}${v%%d*}"
    done
done

# The files each step reads, listed once: for the reading, and for the check after it.
# shellcheck disable=SC2086 # $resources: one word per file, no spaces in sysfs device names
line_files() {
    regular proc/sys/kernel/hostname proc/sys/kernel/osrelease proc/cmdline proc/devices \
        proc/driver/nvidia/version proc/driver/nvidia/params proc/driver/nvidia/gpus/*/information \
        sys/devices/system/node/node*/cpulist sys/devices/system/node/node*/meminfo \
        sys/bus/pci/devices/*/class sys/bus/pci/devices/*/vendor sys/bus/pci/devices/*/device \
        sys/bus/pci/devices/*/subsystem_vendor sys/bus/pci/devices/*/subsystem_device \
        sys/bus/pci/devices/*/numa_node sys/bus/pci/devices/*/local_cpulist \
        sys/bus/pci/devices/*/driver_override sys/bus/pci/devices/*/boot_vga \
        sys/bus/pci/devices/*/mdev_supported_types/*/name \
        sys/bus/pci/devices/*/mdev_supported_types/*/available_instances \
        sys/bus/pci/devices/*/mdev_supported_types/*/device_api \
        sys/bus/pci/devices/*/nvidia/creatable_vgpu_types \
        sys/bus/pci/devices/*/nvidia/current_vgpu_type \
        $resources $modalias_files usr/share/perl5/PVE/pvecfg.pm $caps \
        dev/.lxc-boot-id run/systemd/container
    # Passthrough advice: the framebuffers the kernel registered, and every function's reset
    # methods (sysfs hides the file when there is none).
    regular proc/fb sys/bus/pci/devices/*/reset_method
}
caps='proc/driver/nvidia/capabilities/mig/config proc/driver/nvidia/capabilities/mig/monitor
    proc/driver/nvidia/capabilities/fabric-imex-mgmt
    proc/driver/nvidia/capabilities/gpu*/mig/gi*/access
    proc/driver/nvidia/capabilities/gpu*/mig/gi*/ci*/access
    proc/driver/nvidia-nvlink/capabilities/fabric-mgmt'
configs='etc/pve/lxc/*.conf etc/pve/qemu-server/*.conf etc/pve/mapping/pci.cfg etc/pve/storage.cfg
    etc/modprobe.d/* run/modprobe.d/* usr/local/lib/modprobe.d/* usr/lib/modprobe.d/*
    lib/modprobe.d/* lib/modules/*/modules.softdep
    etc/modules etc/modules-load.d/* etc/initramfs-tools/modules
    etc/default/grub etc/default/grub.d/*.cfg etc/kernel/cmdline etc/kernel/proxmox-boot-uuids
    etc/driverctl.d/* etc/proxgpu/* etc/initramfs-tools/hooks/proxgpu* usr/local/sbin/proxgpu-*
    etc/systemd/system/proxgpu-* etc/systemd/system/pve-guests.service.d/proxgpu*
    etc/systemd/system/pve-ha-lrm.service.d/proxgpu*'
secure_boot=sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c

rec section lines
line_files | xargs -0 -r grep -H -s -Z -D skip ''
batched $? "reading the sysfs and procfs files"

# One awk reads four kinds of files, each for a few of its lines, so that the forks do not grow
# with what the host holds:
# - pci.ids (over a megabyte): only the vendor and device lines of devices present, whose ID
#   pairs come first on its standard input, one a line (as one argument they could pass the
#   kernel's limit), then an empty line;
# - each installed kernel's modules.alias lines that find a module for one of those modaliases
#   (the file is over a megabyte), and the same of its built-in modules' aliases, the
#   "MODULE.alias=GLOB" strings of its NUL-separated modules.builtin.modinfo, one a line. The
#   modaliases come next on the standard input, then an empty line, then grep's lines of every
#   modules.alias (PATH NUL LINE); the modules.builtin.modinfo files are named one a line in
#   proxgpu_builtins. Each list starts with a line saying so, written only for a file that can be
#   read: a snapshot's copy is that list, which reads back the same. A glob is kept when its
#   start before any * ? [ ] or backslash begins a modalias and, made of letters, digits,
#   : _ - * ? only, it matches one; any other is kept on its start alone, so nothing that could
#   match is left out (proxgpu matches them all as kmod does);
# - dpkg's status: pve-container's version decides whether a container takes devN entries, so
#   only its paragraph's Package, Status and Version lines are read;
# - /proc/cpuinfo: the first CPU's vendor, flags (pdpe1gb, for the passthrough advice) and
#   address bits, three lines of its block, which come in that order.
# Each file is read with getline: one awk cannot open (gone since the look) gives nothing, and
# the others are still read (a file operand awk cannot open would end the run).
# shellcheck disable=SC2016 # the awk program's $ are awk's
few_lines='
    function keep(glob,   start, re, m) {
        # Most lines are of other buses, or of other vendors: told apart without a regex.
        if (substr(glob, 1, 5) == "pci:v") {
            if (index(substr(glob, 6, 8), "*") == 0 && !(substr(glob, 6, 8) in vendors) &&
                substr(glob, 6, 8) !~ /[][?\\]/) return 0
        } else if (glob !~ /^(p(c(i:?)?)?)?[][*?\\]/) return 0
        start = glob
        sub(/[][*?\\].*/, "", start)
        if (length(start) >= 13 && !(substr(start, 6, 8) in vendors)) return 0
        re = ""
        if (glob ~ /^[A-Za-z0-9_:*?-]+$/) {
            re = glob
            gsub(/[*]/, ".*", re)
            gsub(/[?]/, ".", re)
            re = "^" re "$"
        }
        for (m in want)
            if ((start == "" || index(m, start) == 1) && (re == "" || m ~ re)) return 1
        return 0
    }
    function line(path, text) { printf "%s%c%s\n", path, 0, text }
    function names(path,   text, v, kept) {
        while ((getline text < path) > 0) {
            if (text ~ /^C /) break
            if (text ~ /^[0-9a-f][0-9a-f][0-9a-f][0-9a-f]  /) {
                v = substr(text, 1, 4)
                if (kept = (v in pair_vendors)) line(path, text)
            } else if (kept && text ~ /^\t[0-9a-f][0-9a-f][0-9a-f][0-9a-f]  / &&
                       (v substr(text, 2, 4)) in pairs) line(path, text)
        }
        close(path)
    }
    function container(path,   text, word, kept) {
        while ((getline text < path) > 0) {
            if (text ~ /^Package: /) { split(text, word); kept = (word[2] == "pve-container") }
            if (kept && text ~ /^(Package|Status|Version): /) line(path, text)
            if (kept && text == "") break
        }
        close(path)
    }
    function first_cpu(path,   text, found) {
        while (found < 3 && (getline text < path) > 0)
            if (text ~ /^(vendor_id|flags|address sizes)[[:space:]]*:/) { line(path, text); found++ }
        close(path)
    }
    function builtin(path,   text, at) {
        while ((getline text < path) > 0)
            if ((at = index(text, ".alias=")) > 1 && text !~ /[ \t\n]/ &&
                keep(substr(text, at + 7))) line(path, text)
        close(path)
    }
    BEGIN {
        while ((getline) > 0 && $0 != "") { pairs[$1] = 1; pair_vendors[substr($1, 1, 4)] = 1 }
        while ((getline) > 0 && $0 != "") { want[$0] = 1; vendors[substr($0, 6, 8)] = 1 }
    }
    (at = index($0, "\0")) > 1 {
        if (split(substr($0, at + 1), word) == 3 && word[1] == "alias" && keep(word[2]))
            line(substr($0, 1, at - 1), "alias " word[2] " " word[3])
    }
    END {
        if (pciids != "") names(pciids)
        if (dpkg != "") container(dpkg)
        if (cpuinfo != "") first_cpu(cpuinfo)
        # From the environment: a -v value would have its backslashes taken as escapes.
        if (ENVIRON["proxgpu_builtins"] == "") exit
        RS = "\0"
        n = split(ENVIRON["proxgpu_builtins"], file, "\n")
        for (i = 1; i <= n; i++) builtin(file[i])
    }
'
aliased='#proxgpu: the lines that can find a module for a function of a GPU'
# readable_lists FILE...: the list line of each of FILE... that can be read, and those names in
# lists (one a line: a name with a newline cannot be carried by a record, and the kernel never
# makes one).
readable_lists() {
    lists=''
    for f; do
        { [ -f "$f" ] && [ -r "$f" ]; } || continue
        case $f in *"
"*) continue ;; esac
        printf '%s\0%s\n' "$f" "$aliased"
        lists="${lists:+$lists
}$f"
    done
}
readable_lists lib/modules/*/modules.builtin.modinfo
builtins=$lists
readable_lists lib/modules/*/modules.alias
[ -n "$modaliases" ] || lists='' builtins=''
dpkg=var/lib/dpkg/status cpuinfo=proc/cpuinfo
[ -f "$dpkg" ] || dpkg=''
[ -f "$cpuinfo" ] || cpuinfo=''
# grep's quicker first cut keeps more than the filter, never less: a glob of one of those
# vendors, or with * ? [ ] or a backslash in its first 13 characters.
near="(pci:v($near)|[^ ]{0,12}[][*?\\])"
# A pipeline's part is a subshell of its own: what it sets (set -f: the words are IDs and names,
# never patterns; IFS: one name a line) stays there.
# shellcheck disable=SC2086 # $pairs, $modaliases: one word each; $lists: one name a line
{
    set -f
    printf '%s\n' $pairs '' $modaliases ''
    IFS='
'
    [ -z "$lists" ] || grep -H -Z -E -s -e "^alias $near" -- $lists
} | proxgpu_builtins=$builtins awk -v pciids="$pciids" -v dpkg="$dpkg" -v cpuinfo="$cpuinfo" \
    "$few_lines"

# The running kernel's initramfs: which modules it loads before the root file system, and whether
# it carries proxgpu's binding (base names only). A snapshot keeps that list as the file's text,
# after a first line that says so.
kernel=
[ -f proc/sys/kernel/osrelease ] && { read -r kernel <proc/sys/kernel/osrelease; } 2>/dev/null
initrd=boot/initrd.img-$kernel
listed='#proxgpu: the files in this initramfs, by base name'
if [ -n "$kernel" ] && [ -f "$initrd" ] && [ -r "$initrd" ]; then
    { read -r first <"$initrd"; } 2>/dev/null || first=
    if [ "$first" = "$listed" ]; then
        grep -H -Z -D skip '' "$initrd"
    elif command -v lsinitramfs >/dev/null 2>&1; then
        printf '%s\0%s\n' "$initrd" "$listed"
        # Bounded: a damaged or hostile image must not hold the inspection (timeout kills
        # lsinitramfs' whole process group); a list cut short ends with a line that says so.
        { timeout 60 lsinitramfs "$initrd" 2>/dev/null; echo "#proxgpu-exit $?"; } |
            awk -v path="$initrd" '
            /^#proxgpu-exit / { if ($2 != 0) printf "%s%c#proxgpu: lsinitramfs failed (%s)\n", path, 0, $2; next }
            { sub(/.*\//, "") } /\.ko/ || /proxgpu/ { printf "%s%c%s\n", path, 0, $0 }'
    fi
fi

rec section links
# One find (per batch) looks in every directory that holds links inspection reads, each kind
# picked by where it is (find's -path matches "/" with "*"; each batch of paths goes in front of
# the options):
# - each device entry, a link into /sys/devices/pci0000:00/...: its target is the parent chain
#   (root port, switch ports) the picture draws;
# - a device's driver, IOMMU group and bus (its own entries, not those of folders below it),
#   and an SR-IOV virtual function's physfn, its parent (NVIDIA vGPU runs on a GPU's VFs);
# - a function's DRM nodes (drm/card1, drm/renderD129: /dev/dri/card1 and renderD129 are its own);
# - the mediated devices that exist now, each a link in its type's devices/ (mdev sysfs ABI): a
#   running VM's vGPU; a stopped VM's mdev= entry takes an instance only at its start;
# - each driver's module link: driver names are not module names (bochs-drm lives in bochs.ko).
# find's status 1 (a directory gone or unreadable meanwhile) makes xargs' 123, no failure.
# shellcheck disable=SC2016 # $@ is the inner shell's
directories sys/bus/pci/devices/ sys/bus/pci/devices/*/ sys/bus/pci/devices/*/drm/ \
    sys/bus/pci/devices/*/mdev_supported_types/*/devices/ sys/bus/pci/drivers/*/ |
    xargs -0 -r sh -c 'exec find "$@" -mindepth 1 -maxdepth 1 \( \
    \( -path "sys/bus/pci/devices/*" ! -path "sys/bus/pci/devices/*/*" -type l \) -o \
    \( -path "sys/bus/pci/devices/*" ! -path "sys/bus/pci/devices/*/*/*" \
        \( -name driver -o -name iommu_group -o -name pci_bus -o -name physfn \) \) -o \
    \( -path "sys/bus/pci/devices/*/drm/*" \( -name "card*" -o -name "renderD*" \) \) -o \
    -path "sys/bus/pci/devices/*/mdev_supported_types/*/devices/*" -o \
    \( -path "sys/bus/pci/drivers/*" -name module \) \
    \) -printf "%y\0%p\0%l\n" 2>/dev/null' sh
batched $? "reading the devices' links"
for d in sys/firmware/efi etc/pve; do
    [ -d "$d" ] && printf 'd\0%s\0\n' "$d"
done
for f in usr/sbin/driverctl usr/sbin/update-initramfs usr/sbin/proxmox-boot-tool \
    usr/sbin/update-grub usr/bin/pvesh bin/fuser usr/bin/fuser usr/bin/nvidia-modprobe; do
    [ -e "$f" ] && printf 'f\0%s\0\n' "$f"
done
# /proc/fb was read even when it lists no framebuffer (its lines then say nothing): "none", not
# "not read". A file this user cannot read (grep -s says nothing of it) is "not read", unknown.
[ -f proc/fb ] && [ -r proc/fb ] && printf 'f\0%s\0\n' proc/fb
# The nvidia and amdkfd device nodes a container can be given (a snapshot holds them as empty
# files).
for f in dev/nvidia* dev/nvidia-caps/* dev/kfd; do
    { [ -c "$f" ] || [ -f "$f" ]; } && printf 'f\0%s\0\n' "$f"
done

rec section raw
# The files' bytes come in GNU tar archives, all in one "#archive" record (base64): a constant
# number of commands however many files there are (a node holds a config per guest). Each
# directory is entered inside the root (the prelude's enter) and held open as a descriptor, and
# tar reads its files through that descriptor (/proc/self/fd/N/NAME), never through the path
# again: a directory swapped for a link after it was entered changes nothing. In a tree tar opens
# every file as it always does, never through a link at its end (O_NOFOLLOW) and never blocking
# (O_NONBLOCK): a link or FIFO swapped in after the look is archived as what it is, never
# followed or read, so what lies outside the root is never read. (On a live host, whose root /
# nothing lies outside, tar follows a link itself; a FIFO is still archived, never read.) A line
# "PATH\0@AT" says that PATH's bytes are the member AT: the file itself, or where a link inside
# the root leads (N/NAME, N numbering its directory); "PATH\0!unreadable" that they cannot be read.
#
# inside FILE: set in_at to where FILE's bytes are, relative to the root, when it is a symlink
# resolving inside the root or not a symlink; fails for a link out of it (a variable, not
# output: a command substitution would cost a process per file).
inside() {
    in_at=$1
    # A live host's root is /, which no link leads out of: there tar follows the links itself
    # (follow, below), one process less for each config that is a link.
    { [ -n "$proxgpu_real" ] && [ -L "$1" ]; } || return 0
    in_at=$(realpath -e -- "$1") || return 1
    # shellcheck disable=SC2154 # proxgpu_real: the prelude's
    case $in_at in "$proxgpu_real"/*) in_at=${in_at#"$proxgpu_real"/} ;; *) return 1 ;; esac
}
# archives: the archive of the files in lines "N<tab>DIR<tab>NAME" on stdin, those of one
# directory together (DIR relative to the root, "." for the root itself; a NAME is a path under
# DIR), each member named N/NAME, in records of one block (-b 1: not padded to tar's usual 10
# KiB). The shell names descriptors 3 to 9 only, so a tar takes seven directories at most; a
# directory that cannot be entered inside the root is left out (its files are then unreadable).
# Run in a pipeline, a subshell of its own: its working directory and descriptors change.
# shellcheck disable=SC2154 # proxgpu_prefix: the prelude's
archives() {
    as_n='' as_fd=2 as_map='' as_open=''
    set --
    while IFS=$tab read -r r_n r_dir r_name; do
        if [ "$r_n" != "$as_n" ]; then
            if [ "$as_fd" -eq 9 ]; then
                [ $# -eq 0 ] || tar_files "$as_map" "$@"
                set --
                as_fd=2 as_map=''
            fi
            as_n=$r_n as_fd=$((as_fd + 1)) as_at=$proxgpu_prefix/$r_dir
            [ "$r_dir" = . ] && as_at=$proxgpu_prefix
            as_open=''
            # command: a descriptor that cannot be opened must not end the shell, as a special
            # built-in's failed redirection would.
            if enter "$as_at" 2>/dev/null && [ -r . ] && eval "command exec $as_fd<."; then
                as_open=1 as_map="${as_map}s,^proc/self/fd/$as_fd/,$as_n/,S;"
            fi
        fi
        [ -z "$as_open" ] || set -- "$@" "/proc/self/fd/$as_fd/$r_name"
    done
    [ $# -eq 0 ] || tar_files "$as_map" "$@"
}
# tar_files TRANSFORM FILE...: the archive of FILE..., their names made members by TRANSFORM.
tar_files() {
    tf_map=$1
    shift
    # shellcheck disable=SC2086 # $follow: one option or none
    tar -cf - -b 1 --no-recursion --numeric-owner --hard-dereference $follow \
        --transform "$tf_map" -- "$@" 2>/dev/null
}
follow=
[ -z "$proxgpu_real" ] && follow=--dereference
nl='
'
tab='	'
archived='' n=0 last=''
# shellcheck disable=SC2086 # $configs: globs, one word each
for f in $configs; do
    [ -f "$f" ] || continue
    case $f in
    *"$nl"* | *"$tab"*) rec badname "$(printf '%s' "$f" | base64 -w0)"; continue ;;
    esac
    if [ -r "$f" ] && inside "$f"; then
        case $in_at in *"$nl"* | *"$tab"*) printf '%s\0!unreadable\n' "$f"; continue ;; esac
        # A live host's root is /, which nothing lies outside: one archive, made from the root,
        # holds every file there.
        if [ -z "$proxgpu_real" ]; then
            d=. name=$in_at
        else
            case $in_at in */*) d=${in_at%/*} ;; *) d=. ;; esac
            name=${in_at##*/}
        fi
        [ "$d" = "$last" ] || { n=$((n + 1)) last=$d; }
        printf '%s\0@%s/%s\n' "$f" "$n" "$name"
        archived="$archived$n$tab$d$tab$name$nl"
    else
        printf '%s\0!unreadable\n' "$f"
    fi
done
if [ -n "$archived" ]; then
    printf '#archive\t'
    printf '%s' "$archived" | archives | base64 -w0
    echo
fi
# Secure Boot's UEFI variable: four attribute bytes, then 1 while it is on.
f=$secure_boot
if [ -f "$f" ] && [ -r "$f" ]; then
    printf '%s\0' "$f"
    base64 -w0 <"$f"
    echo
fi

# The check: where each file named on stdin is (NUL-terminated names, then "#listed" once the
# list is whole): "#outside" when it is reached through a link out of the root (a directory on
# its way, or itself, resolves outside it: the first such one is named, by where it leads); with
# modes, each other one's "#mode"; then "#checked". One awk and a constant number of commands
# however many files and directories a tree holds: every directory on the way and every file are
# resolved by one realpath per batch (its arguments in one sh -c string, under the kernel's limit
# on one argument), in the order given, and the files inside by one stat per batch. A name with a
# tab or a newline cannot be carried by a record: proxgpu drops such a file from what it read.
# shellcheck disable=SC2016 # the awk program's $ are awk's
check_program='
    BEGIN { RS = "\0" }
    $0 == "#listed" { listed = 1; exit }
    index($0, tab) || index($0, "\n") || $0 == "" || ($0 in named) { next }
    # Each name (once), after every directory on its way (each once).
    { named[$0]; names[++names_n] = $0; n = split($0, part, "/"); at = part[1]
      for (i = 1; i <= n; i++) {
          if (i > 1) at = at "/" part[i]
          if (!(at in seen)) { seen[at]; path[++paths] = at }
      } }
    # A word the shell takes as it is: in single quotes, each quote in it as '"'"'.
    function quoted(s) { gsub(q, q "\"" q "\"" q, s); return q s q }
    # What realpath -m makes of the paths in the command CMD, NUL after each (a target with a
    # newline cannot shift the count), whatever is missing or loops: answer N resolves path N.
    function resolve(cmd,   line) {
        while ((cmd | getline line) > 0) resolved[path[++got]] = line
        close(cmd)
    }
    END {
        if (!listed) exit 1
        cmd = ""
        for (i = 1; i <= paths; i++) {
            cmd = cmd " " quoted(path[i])
            if (length(cmd) > 100000 || i == paths) { resolve("exec realpath -m -z --" cmd); cmd = "" }
        }
        # A count that differs is no check at all.
        if (got != paths) exit 1
        for (i = 1; i <= names_n; i++) {
            n = split(names[i], part, "/"); at = ""; out = ""
            for (j = 1; j <= n && out == ""; j++) {
                at = (j == 1) ? part[1] : at "/" part[j]
                if (index(resolved[at] "/", real "/") != 1) out = resolved[at]
            }
            if (out != "") printf "#outside%s%s%s%s\n", tab, names[i], tab, out
            else inside[i] = 1
        }
        if (modes == "modes") {
            # The names inside get their modes from stat (which follows a last link: it
            # resolves inside, or the name was said to be outside), once every outside one
            # was said.
            fflush()
            for (i = 1; i <= names_n; i++) if (i in inside) printf "%s%c", names[i], 0 | stat
            close(stat)
        }
        print "#checked"
    }'
case ${2-} in check | modes)
    # The same lists the steps above read, looked at again after the reading: the names are the
    # files the reading found (a file it refused is among them).
    # shellcheck disable=SC2086 # globs, one word each
    {
        line_files
        regular proc/cpuinfo $pciids \
            ${kernel:+"$initrd"} var/lib/dpkg/status $configs $secure_boot \
            lib/modules/*/modules.alias lib/modules/*/modules.builtin.modinfo
        printf '#listed\0'
    } | awk -v tab="$tab" -v q="'" -v real="$proxgpu_real" -v modes="$2" \
        -v stat="exec xargs -0 -r stat -L -c '#mode$tab%a$tab%n' -- 2>/dev/null" "$check_program"
    ;;
esac
true  # done: the EXIT trap writes the end record with status 0
