# shellcheck shell=sh
# proxgpu follow: run a follow-up action with its output in a log file, so that a second
# command can read the log's last lines while it runs (see proxgpu/apply/actions.py).
# Usage: follow.sh run LOG N CMD...  runs CMD with stdout and stderr in LOG (a new file in a
#   directory made if missing, never through a link), then answers as `tail` does, puts the
#   log's last 64 KiB on stderr (for the error message), removes LOG and exits with CMD's code;
#   125 when LOG cannot be made.
# Usage: follow.sh tail LOG N  Records: seen COUNT (the log's whole lines so far) | partial (its
#   last line has no newline yet) | line TEXT (the last N lines, each cut to 300 characters, tabs
#   made spaces) | end
fo_tail() {
    [ -f "$1" ] || { rec end; return; }
    rec seen "$(wc -l < "$1")"
    # Its last line has no newline yet: not counted by wc, but one of tail's.
    [ -z "$(tail -c 1 -- "$1")" ] || rec partial
    tail -n "$2" -- "$1" | cut -c1-300 | tr '\t\r' '  ' |
        while IFS= read -r fo_line || [ -n "$fo_line" ]; do rec line "$fo_line"; done
    rec end
}
fo_mode=$1 fo_log=$2 fo_n=$3 fo_cwd=$PWD
shift 3
if [ "$fo_mode" = tail ]; then
    enter "${fo_log%/*}" 2>/dev/null || { rec end; exit 0; }
    fo_tail "./${fo_log##*/}" "$fo_n"
    exit 0
fi
enter "${fo_log%/*}" make || { echo "cannot make the directory of $fo_log" >&2; exit 125; }
fo_here=./${fo_log##*/}
on_signal
trap 'rm -f -- "$fo_here"' EXIT
(umask 077 && set -C && : > "$fo_here") || { echo "cannot create $fo_log" >&2; exit 125; }
# Opened here, in the log's directory; the action itself runs where a command would.
(cd -- "$fo_cwd" && exec "$@") > "$fo_here" 2>&1 < /dev/null
fo_rc=$?
fo_tail "$fo_here" "$fo_n"
tail -c 65536 -- "$fo_here" >&2
exit "$fo_rc"
