# shellcheck shell=sh
# proxgpu smi: what nvidia-smi says of the MIG devices, whose UUIDs only NVIDIA's library knows:
# `nvidia-smi -L` (each GPU with its UUID, and under it each "MIG ... Device N" with its MIG-UUID)
# and a plain `nvidia-smi` (its "MIG devices" table: GPU, GPU instance, compute instance and
# MIG device number). Inspection runs it only when /proc shows compute instances.
# Usage: smi.sh live SECONDS LIMIT   run the host's nvidia-smi (found in PATH) twice, each run
#                                    under its own deadline: timeout kills it and the processes
#                                    it started SECONDS in (KILL 2 s after TERM)
#        smi.sh tree SECONDS LIMIT   read what a snapshot kept of the two outputs instead, under
#                                    the host's root, never through a link (the prelude's enter
#                                    and nofollow_cat)
# Output: "#output\tNAME\tBASE64" for NAME list (-L) and table (plain): the output, an empty
# line and "#proxgpu-status STATUS" (the command's exit status: 124 or 137 past its deadline, 127
# without nvidia-smi; 0 for a snapshot's file), cut at LIMIT bytes (so a cut-short output lacks
# that line). "#missing\tNAME" where a snapshot kept none. Then "#end".
LC_ALL=C
export LC_ALL
mode=$1 seconds=$2 limit=$3
captured=var/lib/proxgpu/captured

# answer NAME CMD...: CMD's output and status as one #output record.
answer() {
    an_name=$1
    shift
    printf '#output\t%s\t' "$an_name"
    { "$@"; an_status=$?; echo; echo "#proxgpu-status $an_status"; } | head -c "$limit" |
        base64 -w0
    echo
}
smi() {
    # stdin from /dev/null: nothing of this script's input reaches it.
    timeout -k 2 "$seconds" nvidia-smi "$@" </dev/null 2>/dev/null
}
kept() {
    # shellcheck disable=SC2154 # proxgpu_prefix: the prelude's
    (enter "$proxgpu_prefix/$captured" 2>/dev/null && nofollow_cat "./$1")
}
present() {
    (enter "$proxgpu_prefix/$captured" 2>/dev/null && [ -f "./$1" ] && [ ! -L "./$1" ])
}

if [ "$mode" = live ]; then
    answer list smi -L
    answer table smi
else
    for name in list:nvidia-smi-L table:nvidia-smi; do
        if present "${name#*:}"; then
            answer "${name%%:*}" kept "${name#*:}"
        else
            rec missing "${name%%:*}"
        fi
    done
fi
true  # done: the EXIT trap writes the end record with status 0
