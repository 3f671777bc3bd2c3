#!/bin/bash
# bench/gpu_cluster.sh [build]: issue 31's GPU acceptance on a machine with two GPUs or more, as root: a
# job-like run of two processes, each given one GPU through CUDA_VISIBLE_DEVICES and each in a cgroup of
# its own (as Slurm's proctrack/cgroup or the kubelet puts a job or a pod), with a named quota per GPU
# set on that cgroup the way the Slurm plugin and the Kubernetes controller set it
# (gmlakectl --device UUID quota cgroup:PATH BYTES --group NAME):
#   - each process reaches its own GPU's lake (found by UUID, nothing named), none of the other's;
#   - each quota holds: what fits is served, the next allocation is refused naming the job's quota;
#   - gmlakectl quotas and the metrics carry each job's name, its peak; clearing returns the peak.
# CLUSTER_BACKEND=host: the same on the host backend (host-0, host-1), without GPUs: a dry run of the script.
# PASS/FAIL lines, exit 1 on a FAIL. Builds nothing: build/ made by `make` (gmlaked, gmlakectl, gml-testclient).
set -u
cd "$(dirname "$0")/.." || exit 1
B=${1:-${BUILD:-build}}
case $B in /*) ;; *) B="$(pwd)/$B";; esac
OUTDIR=${OUT:-/tmp/gmlake-gpu-out}; mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu_cluster"; mkdir -p "$LOG"
fails=0
pass() { echo "PASS cluster: $*"; }
fail() { echo "FAIL cluster: $*"; fails=$((fails + 1)); }
for f in gmlaked gmlakectl gml-testclient; do [ -x "$B/$f" ] || { echo "FAIL cluster: no $B/$f (make first)"; exit 1; }; done
[ "$(id -u)" = 0 ] || { echo "SKIP cluster: needs root (cgroups, /run/gmlake)"; exit 0; }
unset GMLAKE_SOCKET GMLAKE_CONTROL CUDA_VISIBLE_DEVICES XDG_RUNTIME_DIR
export CUDA_DEVICE_ORDER=PCI_BUS_ID # CUDA_VISIBLE_DEVICES counts as nvidia-smi (and Slurm's gres) do
if [ "${CLUSTER_BACKEND:-cuda}" = host ]; then # a dry run of this script without GPUs: host-0 and host-1
  U0=host-0 U1=host-1
  export GMLAKE_BACKEND=host
else
  if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -lt 2 ]; then echo "SKIP cluster: fewer than two GPUs"; exit 0; fi
  U0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
  U1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 1 | tr -d ' ')
fi
DIR=/run/gmlake made_run=
[ -d $DIR ] || { mkdir -m 755 $DIR && made_run=1; }
for u in "$U0" "$U1"; do
  [ -S "$DIR/gmlake-$u.sock" ] && "$B/gmlakectl" --device "$u" stats >/dev/null 2>&1 &&
    { echo "FAIL cluster: a daemon of $u already serves $DIR: stop it first"; exit 1; }
done
# a cgroup per job: v2 where /sys/fs/cgroup is cgroup2, else v1's freezer (what Slurm's cgroup/v1 tracks by)
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then CGFS=/sys/fs/cgroup CGQ=""
elif [ -d /sys/fs/cgroup/freezer ]; then CGFS=/sys/fs/cgroup/freezer CGQ="freezer:"
else echo "FAIL cluster: no cgroup v2 nor v1 freezer hierarchy"; exit 1; fi
pids= cgs=
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  for c in $cgs; do rmdir "$CGFS$c" 2>/dev/null; done
  [ -n "$made_run" ] && rmdir "$DIR" 2>/dev/null
  rm -f "$LOG"/in.*
}
trap cleanup EXIT
for n in 0 1; do
  "$B/gmlaked" --backend "${CLUSTER_BACKEND:-cuda}" --device $n --limit 4GiB --prefetch 0 --log-level info 2>"$LOG/d$n.log" &
  pids="$pids $!"
done
for _ in $(seq 600); do [ -L "$DIR/gmlake-0.ctl" ] && [ -L "$DIR/gmlake-1.ctl" ] && break; sleep 0.05; done
ctl() { "$B/gmlakectl" --device "$@"; }
cs=$(ctl 0 --json stats | sed -n 's/.*"chunk_size":\([0-9]*\).*/\1/p')
[ -n "$cs" ] || { echo "FAIL cluster: no daemon answers on GPU 0: $(tail -3 "$LOG/d0.log")"; exit 1; }
echo "cluster: GPU 0 $U0, GPU 1 $U1, chunks of $cs bytes, cgroups in $CGFS"

# job a: GPU 0, 10 chunks; job b: GPU 1, 20 chunks
start_job() { # NAME GPU CHUNKS: its cgroup, its quota on its GPU's lake, its client waiting for commands
  local name=$1 gpu=$2 u; u=$([ "$2" = 0 ] && echo "$U0" || echo "$U1")
  local cg="/gmlake-cluster-$name-$$"
  mkdir "$CGFS$cg" && cgs="$cgs $cg"
  ctl "$u" quota "cgroup:$CGQ$cg" $(($3 * cs)) --group "job-$name" > "$LOG/quota.$name" 2>&1 ||
    fail "quota of job $name on $u: $(cat "$LOG/quota.$name")"
  rm -f "$LOG/in.$name"; mkfifo "$LOG/in.$name"
  # the job's process: into its cgroup, then the client (nothing names a daemon: it finds its GPU's by UUID)
  sh -c "echo \$\$ > $CGFS$cg/cgroup.procs && CUDA_VISIBLE_DEVICES=$gpu GMLAKE_MODE=daemon exec $B/gml-testclient default" \
    < "$LOG/in.$name" > "$LOG/out.$name" 2> "$LOG/err.$name" &
  pids="$pids $!"
}
start_job a 0 10
start_job b 1 20
exec 3>"$LOG/in.a" 4>"$LOG/in.b"
echo "alloc $((8 * cs))" >&3; echo "alloc $((16 * cs))" >&4
wait_line() { for _ in $(seq 1200); do [ "$(grep -c "$2" "$1")" -ge "${3:-1}" ] && return 0; sleep 0.05; done; return 1; }
wait_line "$LOG/out.a" '^ok 0' && wait_line "$LOG/out.b" '^ok 0' &&
  pass "job a allocated 8 chunks under its 10, job b 16 under its 20" ||
  fail "the allocations under quota: a: $(cat "$LOG/out.a" "$LOG/err.a" | tail -3); b: $(cat "$LOG/out.b" "$LOG/err.b" | tail -3)"
leased() { ctl "$1" --json stats | sed -n 's/.*"chunks_leased":\([0-9]*\).*/\1/p'; }
l0=$(leased "$U0"); l1=$(leased "$U1")
[ "${l0:-0}" -ge 8 ] && [ "${l0:-0}" -le 10 ] && [ "${l1:-0}" -ge 16 ] && [ "${l1:-0}" -le 20 ] &&
  pass "each job is in its own GPU's lake: GPU 0 leases $l0 chunk(s) (job a), GPU 1 $l1 (job b)" ||
  fail "chunks leased: GPU 0 $l0 (job a's 8 wanted), GPU 1 $l1 (job b's 16)"
echo "alloc $((4 * cs))" >&3; echo "alloc $((8 * cs))" >&4
wait_line "$LOG/out.a" '^err\|^ok 1' && wait_line "$LOG/out.b" '^err\|^ok 1'
grep -q "^err .*quota of .* reached (job-a of cgroup " "$LOG/out.a" &&
  pass "job a's next 4 chunks refused, naming job-a's quota" || fail "job a past its quota: $(tail -2 "$LOG/out.a")"
grep -q "^err .*quota of .* reached (job-b of cgroup " "$LOG/out.b" &&
  pass "job b's next 8 chunks refused, naming job-b's quota" || fail "job b past its quota: $(tail -2 "$LOG/out.b")"
ctl "$U0" quotas | tee "$LOG/quotas.0" | sed 's/^/  /'; ctl "$U1" quotas | tee "$LOG/quotas.1" | sed 's/^/  /'
ctl 1 metrics | grep -q "gmlake_quota_bytes{device=\"1\",gpu_uuid=\"$U1\",group=\"job-b\",kind=\"peak\"}" &&
  pass "GPU 1's metrics carry job-b's quota" || fail "no gmlake_quota_bytes of job-b in GPU 1's metrics"
echo exit >&3; echo exit >&4; exec 3>&- 4>&-
c=$(ctl "$U0" quota group:job-a 0 2>&1)
echo "$c" | grep -q "cleared on $U0: quota .*, peak " && pass "job a's quota cleared: $c" || fail "clearing job a's quota: $c"
c=$(ctl "$U1" quota group:job-b 0 2>&1)
echo "$c" | grep -q "cleared on $U1: quota .*, peak " && pass "job b's quota cleared: $c" || fail "clearing job b's quota: $c"
[ $fails = 0 ] && echo "PASS cluster: all" || { echo "FAIL cluster: $fails failure(s) (logs in $LOG)"; exit 1; }
