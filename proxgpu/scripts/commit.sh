# shellcheck shell=sh
# proxgpu commit: replace each target by its staged temp file, checking it once more first.
# Usage: commit.sh [PATH TMP WANT_SHA GUEST_LOCK]...   (TMP "-": remove; TMP "=": written through
# the Proxmox API, only report its hash; WANT_SHA "-": must be absent; GUEST_LOCK "-": none).
# Each file is checked and renamed under Proxmox's own config lock, so a concurrent `qm set`
# cannot slip in between. Records:
#   api I SHA256|- | done I | changed I | guestlocked I | failed I RC ERROR | end
replace() {  # PATH TMP WANT_SHA: 3 unless PATH is still WANT_SHA, else TMP goes over it
    if [ "$3" = - ]; then
        if [ -e "$1" ] || [ -L "$1" ]; then return 3; fi
    else
        if [ -L "$1" ] || [ ! -f "$1" ]; then return 3; fi
        got=$(sha256sum < "$1") || return 1
        [ "${got%% *}" = "$3" ] || return 3
    fi
    if [ "$2" = - ]; then rm -f "$1" && sync "${1%/*}"; else durable_mv "$2" "$1"; fi
}
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
i=0
while [ $# -ge 4 ]; do
    p=$1 tmp=$2 want=$3 lock=$4
    shift 4
    if [ "$tmp" = = ]; then
        sum=-
        if [ -f "$p" ] && [ ! -L "$p" ]; then sum=$(sha256sum < "$p") || sum=-; fi
        rec api "$i" "${sum%% *}"
        i=$((i + 1))
        continue
    fi
    under_lock "$lock" replace "$p" "$tmp" "$want" 2>"$work/err"
    rc=$?
    case $rc in
    0) rec "done" "$i" ;;
    3) rec changed "$i"; exit 0 ;;
    75) rec guestlocked "$i"; exit 0 ;;
    *) rec failed "$i" "$rc" "$(head -c 300 "$work/err" | tr '\n\t' '  ')"; exit 0 ;;
    esac
    i=$((i + 1))
done
rec end
