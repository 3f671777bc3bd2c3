#!/bin/bash
# bench/gpu_uuid.sh [build]: GPUs named by UUID end to end (issue 27, point 1), on a machine with two
# GPUs or more. Builds nothing: build/ made by `make`, and gmlake._C importable (bench/gpu.sh ext
# builds it in python/, or pip install --no-build-isolation ./python). PASS/FAIL lines, exit 1 on a FAIL.
#   - gmlaked --backend cuda --device 0 and --device 1 on their default endpoints: gmlake-<UUID>.sock
#     and .ctl named by nvidia-smi's UUIDs of GPUs 0 and 1, gmlake-0/1 links to them, the serving line
#     naming the UUID (an index is nvidia-smi's: the daemon sets CUDA_DEVICE_ORDER=PCI_BUS_ID);
#   - CUDA_VISIBLE_DEVICES=1 python3 (gmlake.enable, GMLAKE_MODE=daemon, torch.ones on "cuda"): its
#     device 0 is GPU 1, and the allocation is in GPU 1's daemon, none in GPU 0's (gmlakectl --json);
#     the same for device "cuda:1" without CUDA_VISIBLE_DEVICES;
#   - forced to GPU 0's daemon (GMLAKE_SOCKET), that job is refused, both UUIDs named;
#   - gmlakectl --device 0 / 1 / UUID stats name each GPU, metrics label gpu_uuid;
#   - gmlaked --device UUID and --device PCI-bus-id serve the GPU nvidia-smi names so;
#   - the links go with their daemons.
# Endpoints: as root the defaults are /run/gmlake's (made if absent, removed after if it was; a live
# daemon there of GPU 0 or 1 stops the run); otherwise a private XDG_RUNTIME_DIR.
set -u
cd "$(dirname "$0")/.." || exit 1
B=${1:-${BUILD:-build}}
case $B in /*) ;; *) B="$(pwd)/$B";; esac
OUTDIR=${OUT:-/tmp/gmlake-gpu-out}; mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu_uuid"; mkdir -p "$LOG"
fails=0
pass() { echo "PASS gpu_uuid: $*"; }
fail() { echo "FAIL gpu_uuid: $*"; fails=$((fails + 1)); }
for f in gmlaked gmlakectl; do [ -x "$B/$f" ] || { echo "FAIL gpu_uuid: no $B/$f (make first)"; exit 1; }; done
PYTHONPATH="$(pwd)/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH GMLAKE_LIB="$B/libgmlake-client.so" PYTHONUNBUFFERED=1
unset GMLAKE_SOCKET GMLAKE_CONTROL GMLAKE_MODE CUDA_VISIBLE_DEVICES
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -lt 2 ]; then echo "SKIP gpu_uuid: fewer than two GPUs"; exit 0; fi
U0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
U1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 1 | tr -d ' ')
P1=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 1 | tr -d ' ')
echo "gpu_uuid: nvidia-smi's GPU 0 is $U0, GPU 1 is $U1 ($P1)"
python3 -c 'import torch, gmlake._C' 2>/dev/null || { echo "FAIL gpu_uuid: gmlake._C does not import (bench/gpu.sh ext, or pip install ./python)"; exit 1; }

made_run=
if [ "$(id -u)" = 0 ]; then
  DIR=/run/gmlake
  [ -d $DIR ] || { mkdir -m 755 $DIR && made_run=1; }
  for u in "$U0" "$U1"; do
    if [ -S "$DIR/gmlake-$u.sock" ] && "$B/gmlakectl" --device "$u" stats >/dev/null 2>&1; then
      echo "FAIL gpu_uuid: a daemon of $u already serves $DIR: stop it first"; exit 1
    fi
  done
  unset XDG_RUNTIME_DIR
else
  DIR=$(mktemp -d); chmod 700 "$DIR"; export XDG_RUNTIME_DIR="$DIR"
fi
pids=
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ "$DIR" != /run/gmlake ] && rm -rf "$DIR"
  [ -n "$made_run" ] && rmdir "$DIR" 2>/dev/null
  [ -e "$LOG/in" ] && rm -f "$LOG/in"
}
trap cleanup EXIT

"$B/gmlaked" --backend cuda --device 0 --limit 4GiB --prefetch 0 --log-level info 2>"$LOG/d0.log" & d0=$!
"$B/gmlaked" --backend cuda --device 1 --limit 4GiB --prefetch 0 --log-level info 2>"$LOG/d1.log" & d1=$!
pids="$d0 $d1"
for _ in $(seq 600); do [ -L "$DIR/gmlake-0.ctl" ] && [ -L "$DIR/gmlake-1.ctl" ] && break; sleep 0.05; done
ok=1
for n in 0 1; do
  u=$([ $n = 0 ] && echo "$U0" || echo "$U1")
  [ -S "$DIR/gmlake-$u.sock" ] && [ -S "$DIR/gmlake-$u.ctl" ] &&
    [ "$(readlink "$DIR/gmlake-$n.sock")" = "gmlake-$u.sock" ] && [ "$(readlink "$DIR/gmlake-$n.ctl")" = "gmlake-$u.ctl" ] &&
    grep -q "serving device $n ($u) on $DIR/gmlake-$u.sock" "$LOG/d$n.log" ||
    { ok=0; fail "--device $n: not gmlake-$u.sock/.ctl with gmlake-$n links: $(ls -l "$DIR" | tr '\n' ' '); $(tail -3 "$LOG/d$n.log")"; }
done
[ $ok = 1 ] && pass "--device 0 and 1 serve nvidia-smi's GPUs 0 and 1 on gmlake-<UUID>.sock/.ctl, gmlake-0/1 links to them"

stats() { "$B/gmlakectl" --device "$1" --json stats 2>&1; }
num() { local v; v=$(sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p" <<<"$1"); echo "${v:-0}"; }
# the job given GPU 1: its device 0 (CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA_VISIBLE_DEVICES counts as nvidia-smi does)
rm -f "$LOG/in"; mkfifo "$LOG/in"
CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 GMLAKE_LOG=info python3 -c '
import gmlake, torch, sys
gmlake.enable(mode="daemon")
x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
p = torch.cuda.get_device_properties(0)
print("READY", getattr(p, "uuid", "?"), float(x.sum()), flush=True)
sys.stdin.read()
' <"$LOG/in" >"$LOG/job.out" 2>"$LOG/job.err" & job=$!
pids="$pids $job"
exec 3>"$LOG/in"
for _ in $(seq 1200); do grep -q '^READY' "$LOG/job.out" && break; kill -0 $job 2>/dev/null || break; sleep 0.05; done
if grep -q '^READY' "$LOG/job.out"; then
  s0=$(stats 0); s1=$(stats "$U1")
  if [ "$(num "$s1" clients)" = 1 ] && [ "$(num "$s1" chunks_leased)" -ge 1 ] && [ "$(num "$s0" clients)" = 0 ] &&
     [ "$(num "$s0" chunks_leased)" = 0 ]; then
    pass "CUDA_VISIBLE_DEVICES=1: torch.ones on cuda:0 is in GPU 1's daemon ($(num "$s1" chunks_leased) chunk(s)), none in GPU 0's; torch says $(cut -d' ' -f2 "$LOG/job.out")"
  else
    fail "CUDA_VISIBLE_DEVICES=1: GPU 0's daemon: $s0; GPU 1's: $s1"
  fi
  grep -q "connected to the daemon of $U1 at $DIR/gmlake-$U1.sock" "$LOG/job.err" && pass "the job's log names $U1's daemon" ||
    fail "the job's log does not name $U1's daemon: $(grep -m2 gmlake "$LOG/job.err")"
else
  fail "CUDA_VISIBLE_DEVICES=1 job did not start: $(tail -5 "$LOG/job.err")"
fi
h0=$("$B/gmlakectl" --device 0 stats 2>&1 | head -1); h1=$("$B/gmlakectl" --device 1 stats 2>&1 | head -1)
hu=$("$B/gmlakectl" --device "$U1" stats 2>&1 | head -1)
case "$h0|$h1" in
"device 0 ($U0, cuda backend),"*"|device 1 ($U1, cuda backend),"*)
  [ "$hu" = "$h1" ] && pass "gmlakectl --device 0 / 1 / $U1 stats: '$h0' / '$h1'" || fail "gmlakectl --device $U1 stats: '$hu'";;
*) fail "gmlakectl stats: '$h0' / '$h1'";;
esac
"$B/gmlakectl" --device 1 metrics 2>&1 | grep -q "gmlake_lake_bytes{device=\"1\",gpu_uuid=\"$U1\"" &&
  pass "metrics of GPU 1 labelled gpu_uuid=\"$U1\"" || fail "metrics of GPU 1: $("$B/gmlakectl" --device 1 metrics 2>&1 | grep -m1 lake_bytes)"
exec 3>&-
wait $job 2>/dev/null

# the same job forced to GPU 0's daemon: refused, both GPUs named
CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 GMLAKE_SOCKET="$DIR/gmlake-0.sock" python3 -c '
import gmlake, torch
gmlake.enable()
torch.ones(1 << 20, device="cuda")
print("ALLOCATED")
' >"$LOG/forced.out" 2>&1
if grep -q ALLOCATED "$LOG/forced.out"; then fail "a job of GPU 1 allocated through GPU 0's daemon: $(tail -3 "$LOG/forced.out")"
elif grep -qF "this daemon serves $U0 (device 0); the client's device 0 is $U1: set GMLAKE_SOCKET to $U1's daemon or unset it" "$LOG/forced.out"; then
  pass "GMLAKE_SOCKET=GPU 0's daemon for a job of GPU 1: refused, both named"
else fail "the refusal does not name both GPUs: $(grep -m3 -i 'daemon\|error' "$LOG/forced.out")"; fi
grep -qF "refused: this daemon serves $U0" "$LOG/d0.log" && pass "GPU 0's daemon logs the refusal" || fail "GPU 0's daemon did not log a refusal"

# device cuda:1 without CUDA_VISIBLE_DEVICES: GPU 1's daemon too (CUDA's order may not be nvidia-smi's: compared by UUID)
CUDA_DEVICE_ORDER=PCI_BUS_ID GMLAKE_LOG=info python3 -c '
import gmlake, torch
gmlake.enable(mode="daemon")
x = torch.ones(1 << 20, device="cuda:1")
torch.cuda.synchronize()
print("DONE", float(x.sum()))
' >"$LOG/dev1.out" 2>&1
grep -q "^DONE" "$LOG/dev1.out" && grep -q "connected to the daemon of $U1" "$LOG/dev1.out" &&
  pass "cuda:1 without CUDA_VISIBLE_DEVICES: GPU 1's daemon" || fail "cuda:1: $(grep -m3 'gmlake\|Error' "$LOG/dev1.out")"

kill $d0 $d1; wait $d0 $d1 2>/dev/null
left=
for n in 0 1 "$U0" "$U1"; do for e in sock ctl; do [ -e "$DIR/gmlake-$n.$e" ] || [ -L "$DIR/gmlake-$n.$e" ] && left="$left gmlake-$n.$e"; done; done
[ -z "$left" ] && pass "stopped: sockets and links gone" || fail "left behind in $DIR: $left"

# the other names of a GPU: its UUID, its PCI bus id (explicit endpoints, one at a time)
for spec in "$U1" "$P1"; do
  "$B/gmlaked" --backend cuda --device "$spec" --socket "$LOG/s.sock" --control "ipc://$LOG/s.ctl" --limit 1GiB --prefetch 0 \
    --log-level info 2>"$LOG/spec.log" & d=$!
  for _ in $(seq 600); do grep -q "serving device" "$LOG/spec.log" && break; kill -0 $d 2>/dev/null || break; sleep 0.05; done
  grep -q "serving device 1 ($U1)" "$LOG/spec.log" && pass "--device $spec: nvidia-smi's GPU 1" ||
    fail "--device $spec: $(grep -m2 'serving\|error\|no GPU' "$LOG/spec.log")"
  kill $d 2>/dev/null; wait $d 2>/dev/null
done
echo "gpu_uuid: $fails failure(s); logs in $LOG"
[ $fails = 0 ]
