#!/bin/sh
# scripts/demo.sh [--verbose]: the main job, and what it proved. Starts a gmlaked (backend picked
# automatically: cuda when a GPU is usable, else host), has two client processes share the lake,
# replays a recorded PyTorch training trace through it, then reads the lake back with gmlakectl.
# It ends with one PASS or FAIL line per claim, each computed from what happened; exit 1 when any
# failed. --verbose (make demo V=1) also shows the clients' protocol lines, the replay's table and
# gmlakectl stats.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
verbose=0
case ${1:-} in -v|--verbose) verbose=1;; '') ;; *) echo "usage: scripts/demo.sh [--verbose]" >&2; exit 2;; esac
d=$(mktemp -d)
dpid=
trap '[ -z "$dpid" ] || kill $dpid 2>/dev/null; [ -z "$dpid" ] || wait $dpid 2>/dev/null; rm -rf "$d"' EXIT
fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
show() { [ $verbose = 0 ] || sed 's/^/  | /' "$@"; }
ctl() { "$BUILD/gmlakectl" --control "ipc://$d/lake.ctl" "$@"; }

"$BUILD/gmlaked" --backend auto --socket "$d/lake.sock" --control "ipc://$d/lake.ctl" --limit 24GiB --log-level info \
  2> "$d/daemon.log" &
dpid=$!
for _ in $(seq 600); do [ -S "$d/lake.sock" ] && break; kill -0 $dpid 2>/dev/null || break; sleep 0.05; done
if [ ! -S "$d/lake.sock" ]; then
  cat "$d/daemon.log"
  fail "gmlaked did not start (its log above)"
  exit 1
fi
# what it runs on, from the daemon itself (auto logs why only when it passed a backend over)
stats=$(ctl stats --json 2>/dev/null | tr ',' '\n')
backend=$(echo "$stats" | sed -n 's/^"backend":"\([a-z]*\)"$/\1/p')
chunk=$(echo "$stats" | sed -n 's/^"chunk_size":\([0-9]*\)$/\1/p')
why=$(grep -m1 'backend auto' "$d/daemon.log" | sed 's/^.*gmlaked\[[a-z]*\] //')
echo "gmlaked started on the ${backend:-?} backend, chunks of $((${chunk:-0} >> 20)) MiB${why:+: $why}"
[ -n "$chunk" ] && [ "$chunk" -gt 0 ] || { cat "$d/daemon.log"; fail "gmlakectl stats --json named no chunk size"; exit 1; }

echo "== two processes share the lake: the first writes a tag through every chunk of its stitched range and exits;"
echo "   the second leases chunks from the lake and reads what is in them"
# three chunks of the lake's size (2 MiB on the host backend, 6 MiB on cuda), tagged 7000, 7001, 7002
printf 'alloc %d\ntag 0 7\nreadtags 0\nclose\n' $((3 * chunk)) | "$BUILD/gml-testclient" "$d/lake.sock" > "$d/first.out" 2>&1 || true
show "$d/first.out"
printf 'alloc %d\nreadtags 0\nclose\n' $((3 * chunk)) | "$BUILD/gml-testclient" "$d/lake.sock" > "$d/second.out" 2>&1 || true
show "$d/second.out"
# "ready PID CHUNK BACKEND MODE", then "tags T..." (one a chunk of the block)
mode1=$(awk '/^ready /{print $5; exit}' "$d/first.out")
mode2=$(awk '/^ready /{print $5; exit}' "$d/second.out")
wrote=$(sed -n 's/^tags //p' "$d/first.out" | head -1 | tr ' ' '\n' | sort | tr '\n' ' ')
read2=$(sed -n 's/^tags //p' "$d/second.out" | head -1 | tr ' ' '\n' | sort | tr '\n' ' ')
nchunks=$(echo "$wrote" | wc -w)
pid1=$(awk '/^ready /{print $2; exit}' "$d/first.out")
pid2=$(awk '/^ready /{print $2; exit}' "$d/second.out")
if [ "$mode1" = daemon ] && [ "$mode2" = daemon ] && [ "$nchunks" -ge 2 ] && [ "$wrote" = "$read2" ] &&
   [ "$wrote" = "7000 7001 7002 " ] && grep -q "client [0-9]* connected: pid $pid2 " "$d/daemon.log"; then
  pass "a second process (pid $pid2) read the bytes the first (pid $pid1) wrote: the $nchunks chunks of $((chunk >> 20)) MiB" \
    "it leased from the lake, stitched into one range, held tags ${wrote% }"
else
  fail "two processes through the lake: first ${mode1:-no client} wrote '${wrote% }', second ${mode2:-no client}" \
    "read '${read2% }' (want both 'daemon', the same 7000 7001 7002; --verbose shows their lines)"
fi

echo "== a recorded PyTorch training trace (ViT, one H100, PyTorch 2.11) replayed through the daemon"
trace=tests/traces/vit_train.trace.gz
if "$BUILD/gmlake-replay" --json --daemon "$d/lake.sock" "$trace" > "$d/replay.json" 2> "$d/replay.err"; then
  [ $verbose = 0 ] || "$BUILD/gmlake-replay" --daemon "$d/lake.sock" "$trace" | sed 's/^/  | /'
  # ours at peak beside PyTorch's default allocator on the same program (the trace's header: peak allocated, reserved)
  if python3 - "$trace" "$d/replay.json" > "$d/replay.verdict" <<'PY'
import gzip, json, re, sys
hdr = {}
with gzip.open(sys.argv[1], "rt") as f:
    for line in f:
        if not line.startswith("#"):
            break
        m = re.match(r"# (torch_\w+) peak_allocated=(\d+) peak_reserved=(\d+)", line)
        if m:
            hdr[m.group(1)] = (int(m.group(2)), int(m.group(3)))
r = json.load(open(sys.argv[2]))
a, res = hdr["torch_default"]
torch_frag, ours = 1 - a / res, r["frag"]
ok = r["mode"] == "daemon" and r["allocs"] > 0 and ours < torch_frag
print("fragmentation %.1f%% where PyTorch's allocator had %.1f%% (%.2f GiB reserved for %.2f GiB at peak, PyTorch %.2f GiB),"
      " %d allocations through the daemon" % (100 * ours, 100 * torch_frag, r["peak_reserved"] / 2**30,
                                                r["peak_allocated"] / 2**30, res / 2**30, r["allocs"]))
sys.exit(0 if ok else 1)
PY
  then pass "$(cat "$d/replay.verdict")"
  else fail "replay: $(cat "$d/replay.verdict" 2>/dev/null) (not below PyTorch's, or not through the daemon)"
  fi
else
  cat "$d/replay.err"
  fail "gmlake-replay --daemon $trace failed (above)"
fi

echo "== the lake once every process has left (gmlakectl stats --json)"
# a process's exit reaches the daemon as its socket's hangup: wait (10 s at most) until it has seen every one
for _ in $(seq 200); do ctl --json stats 2>/dev/null | grep -q '"clients":0,' && break; sleep 0.05; done
[ $verbose = 0 ] || ctl stats | sed 's/^/  | /'
if ctl --json stats > "$d/stats.json" 2> "$d/stats.err" &&
   python3 - "$d/stats.json" > "$d/stats.verdict" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
ok = s["clients"] == 0 and s["chunks_leased"] == 0 and s["lease_count"] > 0 and s["chunks_free"] == s["chunks_total"]
print("every chunk came back to the lake when its process exited: %d leases served, now 0 leased, %d of %d chunks free,"
      " 0 clients (%s, %s)" % (s["lease_count"], s["chunks_free"], s["chunks_total"], s["backend"], s["gpu_uuid"]))
sys.exit(0 if ok else 1)
PY
then pass "$(cat "$d/stats.verdict")"
else fail "the lake after the clients left: $(cat "$d/stats.verdict" "$d/stats.err" 2>/dev/null)"
fi

kill -TERM $dpid
if wait $dpid; then
  pass "gmlaked stopped cleanly on SIGTERM"
else
  fail "gmlaked exited $? on SIGTERM: $(tail -3 "$d/daemon.log")"
fi
dpid=
if [ $fails -gt 0 ]; then
  echo "demo: $fails claim(s) FAILED (scripts/demo.sh --verbose shows every line)"
  exit 1
fi
