# shellcheck shell=sh
# proxgpu blocks: run a script whose answer is read whole, its stdout written on in blocks of up
# to 1 MiB (see run_script's bulk in proxgpu/host/scripts.py). Over SSH each write a script makes
# leaves as a packet of its own, and the client decrypts and handles each one: the gather's
# hundreds of small writes become a handful of packets. stderr and stdin pass as they are.
# Usage: sh -c BLOCKS blocks SCRIPT ARG...    (runs SCRIPT with ARG... in a subshell of this one:
# the same as sh -c SCRIPT sh ARG..., less a shell's start)
# Exit: the script's status (1 when it left none: its shell was killed).
script=$1
shift
exec 3>&1
# fd 4 carries the script's status out of the pipeline (a pipeline's status is its last
# command's); the script holds neither 3 nor 4, so nothing it leaves running keeps them open.
# dd copies its input into 1 MiB output blocks when ibs and obs differ (POSIX); its record
# counts on stderr are not the script's.
status=$(
    {
        {
            (eval "$script") 3>&- 4>&-
            echo "$?" >&4
        } | dd ibs=65536 obs=1048576 2>/dev/null >&3
    } 4>&1
)
exit "${status:-1}"
