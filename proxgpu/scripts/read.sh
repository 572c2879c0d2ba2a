# shellcheck shell=sh
# proxgpu read: the bytes of each regular file, as base64.
# Usage: read.sh PATH...  Records: text I B64(content) | text I - (absent, or not a file) | end
i=0
for p; do
    if [ -f "$p" ] && [ ! -L "$p" ]; then
        printf '#text\t%s\t' "$i"  # streamed: a config can be megabytes
        base64 -w0 < "$p"
        echo
    else
        rec text "$i" -
    fi
    i=$((i + 1))
done
rec end
