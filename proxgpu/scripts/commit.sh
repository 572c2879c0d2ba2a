# shellcheck shell=sh
# proxgpu commit: replace each target by its staged temp file, checking it once more first.
# Usage: commit.sh [PATH TMP WANT_SHA GUEST_LOCK]...   (TMP "-": remove; TMP "=": written through
# the Proxmox API, only report its hash; WANT_SHA "-": must be absent; GUEST_LOCK "-": none).
# Each file is checked and renamed under Proxmox's own config lock, so a concurrent `qm set`
# cannot slip in between. Records:
#   api I SHA256|- | done I | changed I | guestlocked I | failed I RC ERROR | end
replace() {  # PATH TMP WANT_SHA: 3 unless PATH is still WANT_SHA, else TMP goes over it
    [ "$2" = - ] || [ "${2%/*}" = "${1%/*}" ] || return 4  # the temp file is beside its target
    enter "${1%/*}" || return
    rp_leaf=./${1##*/}
    if [ "$3" = - ]; then
        if [ -e "$rp_leaf" ] || [ -L "$rp_leaf" ]; then return 3; fi
    else
        if [ -L "$rp_leaf" ] || [ ! -f "$rp_leaf" ]; then return 3; fi
        got=$(nofollow_cat "$rp_leaf" | sha256sum) || return 1
        [ "${got%% *}" = "$3" ] || return 3
    fi
    if [ "$2" = - ]; then rm -f -- "$rp_leaf" && sync .; else durable_mv "./${2##*/}" "$rp_leaf"; fi
}
api_sum() {  # PATH: the hash of the file the API wrote, "-" when it is not a file in the root
    (
        enter "${1%/*}" 2>/dev/null || exit
        [ -f "./${1##*/}" ] && [ ! -L "./${1##*/}" ] && nofollow_cat "./${1##*/}" | sha256sum
    ) || echo -
}
i=0
while [ $# -ge 4 ]; do
    p=$1 tmp=$2 want=$3 lock=$4
    shift 4
    if [ "$tmp" = = ]; then
        sum=$(api_sum "$p")
        rec api "$i" "${sum%% *}"
        i=$((i + 1))
        continue
    fi
    # stderr is kept in a variable, not a temp file: nothing is left behind by a kill.
    if err=$(under_lock "$lock" replace "$p" "$tmp" "$want" 2>&1); then rc=0; else rc=$?; fi
    case $rc in
    0) rec "done" "$i" ;;
    3) rec changed "$i"; exit 0 ;;
    75) rec guestlocked "$i"; exit 0 ;;
    *) rec failed "$i" "$rc" "$(printf %s "$err" | head -c 300 | tr '\n\t' '  ')"; exit 0 ;;
    esac
    i=$((i + 1))
done
true  # done: the EXIT trap writes the end record with status 0
