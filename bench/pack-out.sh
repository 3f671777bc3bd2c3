#!/bin/sh
# bench/pack-out.sh [DIR]: pack everything in DIR (default $OUT) but summary.txt and earlier
# packs into one results[-N].tgz, removing what it packed. The device tool brings back 8 files
# of $OUT at most: end a GPU call with it (`bench/gpu.sh STAGES; bench/pack-out.sh`) and
# nothing is left behind.
set -u
d=${1:-${OUT:?no DIR and no OUT}}
cd "$d" || exit 1
list=$(mktemp)
ls -A | grep -v -e '^summary\.txt$' -e '^results\(-[0-9]*\)\?\.tgz$' > "$list"
if [ ! -s "$list" ]; then rm -f "$list"; exit 0; fi
name=results.tgz; i=1
while [ -e "$name" ]; do i=$((i + 1)); name=results-$i.tgz; done
tar czf "$name" -T "$list" && xargs -d '\n' rm -rf < "$list"
echo "pack-out: $(wc -l < "$list") entries of $d in $name"
rm -f "$list"
