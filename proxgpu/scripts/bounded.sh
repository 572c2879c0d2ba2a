# shellcheck shell=sh
# proxgpu bounded: run one command with one deadline for the whole of it, keeping at most LIMIT
# bytes of each of its stdout and stderr, so that a host answering without end costs the
# connection that carries the answer no more than that (see proxgpu/host/command.py).
# Usage: sh -c BOUNDED bounded LIMIT SECONDS ARGV...
# Exit: the command's status; 124 or 137 (timeout's) when it ran past SECONDS, it and every
# process of its group then killed; a writer past LIMIT dies of SIGPIPE (head stops reading).
limit=$1 seconds=$2
shift 2
exec 3>&1 4>&2
# fd 5 carries the command's status out of the pipelines (a pipeline's status is its last
# command's); the command itself holds none of 3, 4 or 5, so nothing it leaves behind keeps the
# answer open.
status=$(
    {
        {
            {
                timeout -k 2 "$seconds" "$@" 5>&-
                echo "$?" >&5
            } 3>&- 4>&- | head -c "$limit" >&3
        } 2>&1 | head -c "$limit" >&4
    } 5>&1
)
exit "${status:-1}"
