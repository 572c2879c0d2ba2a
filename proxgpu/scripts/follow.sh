# shellcheck shell=sh
# proxgpu follow: run a follow-up action with its output in a log file, so that a second
# command can read the log's end while it runs (see proxgpu/apply/actions.py).
# Usage: follow.sh run LOG MAX CMD...  runs CMD with stdout and stderr in LOG (a new file in a
#   directory made if missing, never through a link), then answers as `tail LOG 0 MAX` does,
#   puts the log's last 64 KiB on stderr (for the error message), removes LOG and exits with
#   CMD's code; 125 when LOG cannot be made.
# Usage: follow.sh tail LOG FROM MAX  Records: chunk START B64 (the log's bytes from offset
#   START to its size as read, START being FROM, or later so that they are at most MAX)
fo_chunk() {
    # The log may go (its action ended) between any two looks: then there is nothing to say.
    fo_size=$(wc -c < "$1" 2>/dev/null) || return 0
    fo_start=$2
    [ $((fo_size - fo_start)) -le "$3" ] || fo_start=$((fo_size - $3))
    [ "$fo_start" -le "$fo_size" ] || fo_start=$fo_size
    printf '#chunk\t%s\t' "$fo_start"
    tail -c +$((fo_start + 1)) -- "$1" | head -c $((fo_size - fo_start)) | base64 -w0
    echo
}
fo_mode=$1 fo_log=$2 fo_cwd=$PWD
shift 2
if [ "$fo_mode" = tail ]; then
    enter "${fo_log%/*}" 2>/dev/null || exit 0
    fo_chunk "./${fo_log##*/}" "$1" "$2"
    exit 0
fi
fo_max=$1
shift
enter "${fo_log%/*}" make || { echo "cannot make the directory of $fo_log" >&2; exit 125; }
fo_here=./${fo_log##*/}
on_signal
# shellcheck disable=SC2317 # called by the prelude's EXIT trap (at_exit)
fo_remove() { rm -f -- "$fo_here"; }
at_exit fo_remove
(umask 077 && set -C && : > "$fo_here") || { echo "cannot create $fo_log" >&2; exit 125; }
# Opened here, in the log's directory; the action itself runs where a command would.
(cd -- "$fo_cwd" && exec "$@") > "$fo_here" 2>&1 < /dev/null
fo_rc=$?
fo_chunk "$fo_here" 0 "$fo_max"
tail -c 65536 -- "$fo_here" >&2
exit "$fo_rc"
