# shellcheck shell=sh
# proxgpu journal: every journal entry, each as base64 of its JSON.
# Usage: journal.sh DIR. Records: entry ID B64(json) | end. A DIR outside the root: exit 4.
(
    enter "$1"
    case $? in 0) ;; 1) exit 0 ;; *) exit 4 ;; esac
    for j in ./*.json; do
        [ -f "$j" ] && [ ! -L "$j" ] || continue
        n=${j##*/}
        # Streamed, not passed as an argument: an entry holds whole configs (megabytes).
        printf '#entry\t%s\t' "${n%.json}"
        nofollow_cat "$j" | base64 -w0
        echo
    done
) || exit
rec end
