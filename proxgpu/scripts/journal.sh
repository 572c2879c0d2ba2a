# shellcheck shell=sh
# proxgpu journal: list the journal's entries, or read the ones asked for.
# Usage: journal.sh DIR        list: the machine, every entry and what retention removed
#        journal.sh DIR ID...  read those entries (nothing else: a listing reads every entry
#                              file's head, which a read of a few named ones need not repeat)
# A DIR outside the root: exit 4.
# Records: machine ID NAME (the host's: the prelude's rec_machine) | id ID SIZE STATUS CHAINED
#   (every entry file, oldest first: its size in bytes, the status on its own top-level "status"
#   line, "-" where it has none, and 1 where it has a top-level "previous" line, else 0; a hint
#   for choosing what to read, which the entry itself is checked against once read) | pruned ID
#   (each entry the journal's retention removed, from its "pruned" file) | entry ID B64(json)
#   (each ID asked for that is there)
[ $# -gt 1 ] || rec_machine
(
    enter "$1"
    case $? in 0) ;; 1) exit 0 ;; *) exit 4 ;; esac
    shift
    if [ $# -eq 0 ]; then
        for j in ./*.json; do
            [ -f "$j" ] && [ ! -L "$j" ] || continue
            n=${j##*/}
            size=$(nofollow_cat "$j" | wc -c)
            # proxgpu writes an entry with two spaces of indent, "status" second: the head
            # holds it.
            status=$(nofollow_cat "$j" | head -c 4096 |
                sed -n 's/^  "status": "\([a-z-]*\)",$/\1/p' | head -n 1)
            chained=0
            if nofollow_cat "$j" | grep -q '^  "previous": "'; then chained=1; fi
            rec id "${n%.json}" "$size" "${status:--}" "$chained"
        done
        if [ -f ./pruned ] && [ ! -L ./pruned ]; then
            nofollow_cat ./pruned | while IFS= read -r old; do rec pruned "$old"; done
        fi
    fi
    for id; do
        case $id in */* | .* | "") continue ;; esac
        [ -f "./$id.json" ] && [ ! -L "./$id.json" ] || continue
        # Streamed, not passed as an argument: an entry holds whole configs (megabytes).
        printf '#entry\t%s\t' "$id"
        nofollow_cat "./$id.json" | base64 -w0
        echo
    done
) || exit
true  # done: the EXIT trap writes the end record with status 0
