#!/bin/sh
# The main job: start a gmlaked (backend picked automatically: cuda when a GPU
# is usable, else host), run real clients against it, and show the lake.
set -e
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
d=$(mktemp -d)
trap 'kill $dpid 2>/dev/null; wait $dpid 2>/dev/null; rm -rf "$d"' EXIT
"$BUILD/gmlaked" --backend auto --socket "$d/lake.sock" --control "ipc://$d/lake.ctl" --limit 24GiB --log-level info 2>"$d/daemon.log" &
dpid=$!
for i in $(seq 50); do [ -S "$d/lake.sock" ] && break; sleep 0.1; done
grep -m1 "backend" "$d/daemon.log" || true
echo "== two clients share the lake: one writes through its stitched range, the other reads it back"
printf 'alloc 6291456\ntag 0 7\nreadtags 0\nclose\n' | "$BUILD/gml-testclient" "$d/lake.sock"
printf 'alloc 6291456\nreadtags 0\nclose\n' | "$BUILD/gml-testclient" "$d/lake.sock"
echo "== a recorded PyTorch training trace replayed through the daemon"
"$BUILD/gmlake-replay" --daemon "$d/lake.sock" tests/traces/vit_train.trace.gz
echo "== gmlakectl stats"
"$BUILD/gmlakectl" --control "ipc://$d/lake.ctl" stats
