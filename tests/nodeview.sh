#!/bin/sh
# tests/nodeview.sh BUILD: gmlakectl's node view (tools/ctl_node.c): every lake of the node on one screen.
# Three host-backend daemons stand for three GPUs of a node, their endpoints in one directory (found, as
# gmlakectl finds one lake, from GMLAKE_SOCKET): lake 0 with a client holding memory; lake 1 under its UUID's
# name with an index link beside it, as gmlaked names its default endpoints (one lake, one row); lake 2
# killed, its endpoint's file left behind (down: a row that says so, not a failure of the view); a dangling
# link (a lake that is gone) is no row. Then `gmlakectl` with no command, `--device all`, `--json`.
set -e
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
CTL="$(pwd)/$BUILD/gmlakectl"
d=$(mktemp -d)
pids=
cleanup() { exec 3>&- 2>/dev/null || true; for x in $pids; do kill "$x" 2>/dev/null || true; done; rm -rf "$d"; }
trap cleanup EXIT
fail() { echo "node view test FAILED: $*" >&2; exit 1; }
unset GMLAKE_CONTROL
lake() { # lake N SOCKET CONTROL: a host daemon of device N; waits for its socket
  "$BUILD/gmlaked" --backend host --device "$1" --socket "$2" --control "$3" --limit 64MiB --prefetch 0 \
    --log-level error 2> "$d/lake$1.log" &
  pids="$pids $!"
  last=$!
  for _ in $(seq 600); do [ -S "$2" ] && return 0; kill -0 $last 2>/dev/null || break; sleep 0.05; done
  fail "gmlaked --device $1 did not start: $(cat "$d/lake$1.log")"
}
lake 0 "$d/gmlake-0.sock" "ipc://$d/gmlake-0.ctl"
lake 1 "$d/gmlake-host-1.sock" "ipc://$d/gmlake-host-1.ctl"
ln -s gmlake-host-1.ctl "$d/gmlake-1.ctl" # as gmlaked links its index to its UUID's endpoint
lake 2 "$d/gmlake-2.sock" "ipc://$d/gmlake-2.ctl"
kill -KILL $last && wait $last 2>/dev/null || true # the file of its endpoint stays: a lake that died
[ -S "$d/gmlake-2.ctl" ] || fail "a killed gmlaked left no endpoint file (the test's premise)"
ln -s gmlake-host-9.ctl "$d/gmlake-9.ctl" # a link to nothing: no lake
export GMLAKE_SOCKET="$d/gmlake-%d.sock"

# a client of lake 0 holding 3 chunks (6 MiB), kept alive on a pipe
mkfifo "$d/in"
"$BUILD/gml-testclient" "$d/gmlake-0.sock" < "$d/in" > "$d/client.out" 2>&1 &
cpid=$!
pids="$pids $cpid"
exec 3> "$d/in"
echo "alloc 6291456" >&3
for _ in $(seq 400); do grep -q "^ok 0" "$d/client.out" && break; sleep 0.05; done
grep -q "^ok 0" "$d/client.out" || fail "the client did not allocate: $(cat "$d/client.out")"
echo "flush" >&3 # its report of what it allocated, which the daemon takes in its own time: wait for it
for _ in $(seq 400); do
  "$CTL" --control "ipc://$d/gmlake-0.ctl" --json clients | grep -q '"allocated":6291456' && break; sleep 0.05
done

"$CTL" > "$d/view" 2> "$d/err" || fail "gmlakectl (no command) exited $?: $(cat "$d/err")"
sed 's/^/  | /' "$d/view"
grep -q "^GMLake lakes of this node: 2 up, 1 down$" "$d/view" || fail "not '2 up, 1 down'"
grep -Eq "^0 +host-0 +host memory \(memfd\) .* 64.00 MiB +[0-9.]+ [KMG]?i?B +1 " "$d/view" || fail "no row for lake 0 with its client"
grep -Eq "^ +pid $cpid +uid [0-9]+ +gml-testclient +holds 6.00 MiB \(allocated 6.00 MiB\)$" "$d/view" ||
  fail "lake 0's top process (pid $cpid, 6 MiB) not shown"
grep -Eq "^1 +host-1 +host memory" "$d/view" || fail "no row for lake 1"
[ "$(grep -c 'host-1 ' "$d/view")" = 1 ] || fail "lake 1 shown twice (its UUID's endpoint and its index link)"
grep -Eq "^- +2 +DOWN: nothing answers at its endpoint .*gmlake-2.ctl" "$d/view" || fail "the killed lake not shown down"
! grep -q "host-9" "$d/view" || fail "a dangling link shown as a lake"
[ "$(grep -Ec '^(0|1|-) ' "$d/view")" = 3 ] || fail "not 3 rows"
echo "  gmlakectl (no command): 2 lakes up, one row each (a UUID's endpoint and its index link: one), a killed one down"

"$CTL" --device all stats > "$d/view2" 2> "$d/err" || fail "gmlakectl --device all stats exited $?: $(cat "$d/err")"
diff "$d/view" "$d/view2" > /dev/null || fail "--device all stats differs from the view: $(diff "$d/view" "$d/view2")"
"$CTL" --json --device all > "$d/json" || fail "gmlakectl --json --device all exited $?"
python3 - "$d/json" "$cpid" <<'PY' || fail "--json: $(cat "$d/json")"
import json, sys
v, cpid = json.load(open(sys.argv[1])), int(sys.argv[2])
assert [l["state"] for l in v] == ["up", "up", "down"], v
assert [l["stats"]["gpu_uuid"] for l in v[:2]] == ["host-0", "host-1"], v
assert v[0]["stats"]["clients"] == 1 and v[0]["top"][0]["pid"] == cpid and v[0]["top"][0]["leased_bytes"] == 6 << 20, v[0]
assert v[0]["stats"]["device_model"] == "host memory (memfd)" and v[0]["stats"]["limit_bytes"] == 64 << 20, v[0]
assert v[1]["top"] == [] and v[2]["name"] == "2" and "nothing answers" in v[2]["error"], v
print("  --json: [up host-0 (top: pid %d, %d bytes), up host-1, down %s]" % (cpid, v[0]["top"][0]["leased_bytes"], v[2]["endpoint"]))
PY
# a command of one lake with --device all: refused, exit 2; no lake at all: exit 1, said
set +e
"$CTL" --device all clients > /dev/null 2> "$d/err"; rc=$?
set -e
[ $rc = 2 ] && grep -q "device all shows every lake" "$d/err" || fail "--device all clients: exit $rc, $(cat "$d/err")"
mkdir "$d/none"
set +e
GMLAKE_SOCKET="$d/none/gmlake-%d.sock" "$CTL" > /dev/null 2> "$d/err"; rc=$?
set -e
[ $rc = 1 ] && grep -q "no GMLake daemon on this node: no control endpoint (gmlake-\*.ctl) in $d/none" "$d/err" ||
  fail "no lake: exit $rc, $(cat "$d/err")"
echo "  --device all stats = the view; --device all clients: exit 2; no lake: exit 1, the directory named"
exec 3>&-
wait $cpid || true
