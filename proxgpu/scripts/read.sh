# shellcheck shell=sh
# proxgpu read: the bytes of each regular file, as base64.
# Usage: read.sh PATH...  Records: text I B64(content) | text I - (absent, not a file, or
# reached only through a link out of the root) | end
i=0
for p; do
    (
        enter "${p%/*}" 2>/dev/null || exit
        l=./${p##*/}
        [ -f "$l" ] && [ ! -L "$l" ] || exit 1
        printf '#text\t%s\t' "$i"  # streamed: a config can be megabytes
        nofollow_cat "$l" | base64 -w0
        echo
    ) || rec text "$i" -
    i=$((i + 1))
done
true  # done: the EXIT trap writes the end record with status 0
