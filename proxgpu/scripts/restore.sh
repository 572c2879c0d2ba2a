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
#   first, removed when empty. STAGED and TMP are beside PATH; every path is opened inside the
#   root (the prelude's enter), no file is read through a link, and what is written back is
#   hashed after it is copied, so a backup swapped meanwhile is refused, not restored.
# Records: rc I RC (0 restored, 10 already as wanted, 11 changed by someone else, 12 backup
#   damaged, 13 failed, 14 outside the root, 75 guest config locked) | end
restore() {  # PATH STAGED TMP SOURCE SOURCE_SHA MODE UMASK OWNER ONLY_IF
    rs_dir=${1%/*} rs_leaf=./${1##*/} rs_tmp=./${3##*/}
    [ "${2%/*}" = "$rs_dir" ] && [ "${3%/*}" = "$rs_dir" ] || return 14
    enter "$rs_dir"
    case $? in 0) rs_in=1 ;; 1) rs_in=0 ;; *) return 14 ;; esac
    [ "$rs_in" = 1 ] && rm -f -- "./${2##*/}"
    [ "$9" = keep ] && return 10
    cur=-
    if [ "$rs_in" = 1 ]; then
        if [ -L "$rs_leaf" ] || { [ -e "$rs_leaf" ] && [ ! -f "$rs_leaf" ]; }; then return 11; fi
        if [ -f "$rs_leaf" ]; then
            cur=$(nofollow_cat "$rs_leaf" | sha256sum) || return 13
            cur=${cur%% *}
        fi
    fi
    [ "$cur" = "$5" ] && return 10
    [ "$9" = any ] || [ "$9" = "$cur" ] || return 11
    if [ "$4" = - ]; then
        [ "$rs_in" = 1 ] || return 0
        rm -f -- "$rs_leaf" && sync . || return 13
        return 0
    fi
    if [ "$4" != = ]; then
        [ "$rs_in" = 1 ] || { (umask 022 && enter "$rs_dir" make) && enter "$rs_dir"; } || return 13
        (
            enter "${4%/*}" || exit 1
            [ -f "./${4##*/}" ] && [ ! -L "./${4##*/}" ] && nofollow_cat "./${4##*/}"
        ) | put_tmp "$rs_tmp" "$6" "$7" "$8" cat || return 13
    fi
    got=$(nofollow_cat "$rs_tmp" | sha256sum) || return 13
    [ "${got%% *}" = "$5" ] || return 12
    durable_mv "$rs_tmp" "$rs_leaf" || return 13
}
drop() {  # TMP: a restore's own temp file, removed once its file is done (or the script killed)
    [ -z "$1" ] || (enter "${1%/*}" 2>/dev/null && rm -f -- "./${1##*/}")
}
content() {  # PATH TMP MODE UMASK OWNER SIZE: the next SIZE bytes of stdin into TMP, beside PATH
    if (enter "${1%/*}" 2>/dev/null); then
        (enter "${1%/*}" && put_stdin "./${2##*/}" "$3" "$4" "$5" "$6")
    else
        head -c "$6" > /dev/null  # its bytes are skipped; the restore then reports the failure
    fi
}
pending=
drop_pending() { drop "$pending"; }
at_exit drop_pending
on_signal
n=$1
shift
i=0
while [ "$i" -lt "$n" ]; do
    pending=$3
    if [ "$4" = = ]; then
        content "$1" "$3" "$6" "$7" "$8" "${11}" || :
    fi
    under_lock "${10}" restore "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" "$9"
    rec rc "$i" "$?"
    drop "$pending"
    pending=
    shift 11
    i=$((i + 1))
done
for d; do (enter "${d%/*}" 2>/dev/null && rmdir -- "./${d##*/}" 2>/dev/null); done
true  # done: the EXIT trap writes the end record with status 0
