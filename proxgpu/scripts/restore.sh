# shellcheck shell=sh
# proxgpu restore: put back the files of a journal entry from its backups.
# Usage: restore.sh N [PATH TMP BACKUP BACKUP_SHA MODE UMASK OWNER ONLY_IF GUEST_LOCK]xN DIR...
#   MODE, UMASK and OWNER as put_tmp takes them; DIR: directories the apply created, deepest
#   first, removed when empty. ONLY_IF: the hash the file must have now to be put back ("-":
#   absent; "any": whatever it is; "keep": never, the file was not written). BACKUP "-" means
#   the file did not exist, so it is removed. Leftover temp files go first.
# Records: rc I RC (0 restored, 10 already as before, 11 changed by someone else, 12 backup
#   damaged, 13 failed, 75 guest config locked) | end
restore() {  # PATH TMP BACKUP BACKUP_SHA MODE UMASK OWNER ONLY_IF
    rm -f "$2"
    [ "$8" = keep ] && return 10
    cur=-
    if [ -L "$1" ] || { [ -e "$1" ] && [ ! -f "$1" ]; }; then return 11; fi
    if [ -f "$1" ]; then cur=$(sha256sum < "$1") || return 13; cur=${cur%% *}; fi
    [ "$cur" = "$4" ] && return 10
    [ "$8" = any ] || [ "$8" = "$cur" ] || return 11
    if [ "$3" = - ]; then rm -f "$1" || return 13; return 0; fi
    got=$(sha256sum < "$3") || return 12
    [ "${got%% *}" = "$4" ] || return 12
    mkdir -p "${1%/*}" && put_tmp "$2" "$5" "$6" "$7" cat "$3" && mv -f "$2" "$1" || return 13
}
n=$1
shift
i=0
while [ "$i" -lt "$n" ]; do
    under_lock "$9" restore "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8"
    rec rc "$i" "$?"
    shift 9
    i=$((i + 1))
done
for d; do rmdir "$d" 2>/dev/null; done
rec end
