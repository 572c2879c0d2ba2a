# shellcheck shell=sh
# proxgpu inside: which of these files can be read only through a link out of the host's root,
# and the mode of each of the others (a snapshot copies none wider than its source).
# Usage: inside.sh [DIR N NAME...]...  (each DIR under the root, with N file names in it). A file
# is outside when its directory resolves outside the root (the prelude's enter) or it is itself
# a symlink whose target does. One subshell per directory, not per file: a tree holds thousands.
# Records: outside DIR NAME TARGET | mode DIR OCTAL NAME | end
while [ $# -ge 2 ]; do
    dir=$1 n=$2
    shift 2
    [ "$n" -le $# ] || exit 2
    (
        enter "$dir" 2>/dev/null
        rc=$?
        i=0
        # shellcheck disable=SC2154 # en_now and proxgpu_real: the prelude's
        for name; do
            [ "$i" -lt "$n" ] || break
            i=$((i + 1))
            if [ "$rc" = 4 ]; then
                rec outside "$dir" "$name" "$en_now"
            elif [ "$rc" = 0 ] && [ -L "./$name" ]; then
                target=$(realpath -m -- "./$name") || target='?'
                case $target/ in "$proxgpu_real"/*) ;; *) rec outside "$dir" "$name" "$target" ;; esac
            fi
        done
        [ "$rc" = 0 ] || exit 0
        # The positional list becomes this directory's names alone, each as ./NAME.
        all=$# i=0
        for name; do
            [ "$i" -lt "$n" ] || break
            i=$((i + 1))
            set -- "$@" "./$name"
        done
        shift "$all"
        stat -L -c '%a %n' -- "$@" 2>/dev/null | while read -r mode name; do
            rec mode "$dir" "$mode" "${name#./}"
        done
    )
    shift "$n"
done
rec end
