# shellcheck shell=sh
# proxgpu restore: put back the files of a journal entry.
# Usage: restore.sh N [PATH STAGED TMP SOURCE SOURCE_SHA MODE UMASK OWNER ONLY_IF GUEST_LOCK SIZE]xN
#        DIR...
#   STAGED: the apply's own temp file, removed if it was left behind; TMP: this step's temp file
#   (a name of its own, so a restore never renames a file the apply may still be writing).
#   SOURCE: the backup to copy back; "-": the file did not exist, so it is removed; "=": the next
#   SIZE bytes of stdin are the content (a guest config with only the apply's entries undone).
#   SOURCE_SHA: the hash the result must have. MODE, UMASK and OWNER as put_tmp takes them.
#   ONLY_IF: the hash the file must have now to be written ("-": absent; "any": whatever it is;
#   "keep": never, the file was not written). DIR: directories the apply created, deepest
#   first, removed when empty.
# Records: rc I RC (0 restored, 10 already as wanted, 11 changed by someone else, 12 backup
#   damaged, 13 failed, 75 guest config locked) | end
restore() {  # PATH STAGED TMP SOURCE SOURCE_SHA MODE UMASK OWNER ONLY_IF SIZE
    rm -f "$2"
    [ "$9" = keep ] && return 10
    cur=-
    if [ -L "$1" ] || { [ -e "$1" ] && [ ! -f "$1" ]; }; then return 11; fi
    if [ -f "$1" ]; then cur=$(sha256sum < "$1") || return 13; cur=${cur%% *}; fi
    [ "$cur" = "$5" ] && return 10
    [ "$9" = any ] || [ "$9" = "$cur" ] || return 11
    if [ "$4" = - ]; then rm -f "$1" && sync "${1%/*}" || return 13; return 0; fi
    mkdir -p "${1%/*}" || return 13
    if [ "$4" = = ]; then
        put_tmp "$3" "$6" "$7" "$8" cat "$content" || return 13
    else
        got=$(sha256sum < "$4") || return 12
        [ "${got%% *}" = "$5" ] || return 12
        put_tmp "$3" "$6" "$7" "$8" cat "$4" || return 13
    fi
    durable_mv "$3" "$1" || return 13
}
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
n=$1
shift
i=0
while [ "$i" -lt "$n" ]; do
    content=$work/content
    if [ "$4" = = ]; then
        head -c "${11}" > "$content" || exit 1
    fi
    under_lock "${10}" restore "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" "$9" "${11}"
    rec rc "$i" "$?"
    shift 11
    i=$((i + 1))
done
for d; do rmdir "$d" 2>/dev/null; done
rec end
