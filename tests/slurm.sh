#!/bin/sh
# tests/slurm.sh BUILD: GMLake's SPANK plugin (slurm/gmlake_spank.c) on a real single-node Slurm that
# this test starts on localhost and stops after it: munged, slurmctld and slurmd with a generated
# slurm.conf in a temporary directory, two fake GPUs (gres gpu over /dev/null device nodes, so Slurm
# sets CUDA_VISIBLE_DEVICES as it does for GPUs) and two host-backend daemons, one per "GPU": the host
# backend names CUDA_VISIBLE_DEVICES=N's device host-N, so a job's client finds its GPU's lake by
# UUID, as on a GPU node. Jobs are tracked by cgroup (proctrack/cgroup: v1's freezer where it is
# mounted, else cgroup v2), which is what the quota binds.
#   - an over-quota allocation fails, naming the job's quota (srun, --gmlake-mem per GPU);
#     the job's peak is said on its stderr and put in its AdminComment; the quota is gone after it
#   - two jobs share one lake, each under its own quota
#   - a cancelled job's quota and chunks come back
#   - a job without --gmlake-mem gets the site's default (the plugin's default= argument)
#   - slurmd restarted while a job runs: its quota stays, the new slurmd's epilog removes it
# Everything started here is stopped by pid at exit.
set -eu
BUILD=${1:-build}
. tests/lib.sh
NAME="tests/slurm.sh"
[ "$(id -u)" = 0 ] || { not_run "$NAME" "needs root (slurmd runs jobs as their users, munged and cgroups)"; exit 0; }
for p in munged mungekey slurmctld slurmd srun sbatch scancel scontrol; do
  command -v "$p" >/dev/null || { skip "$NAME" "no $p (scripts/deps.sh installs slurmctld, slurmd, slurm-client, munge)"; exit 0; }
done
[ -e "$BUILD/gmlake_spank.so" ] || { skip "$NAME" "no $BUILD/gmlake_spank.so (libslurm-dev's spank.h was missing at build)"; exit 0; }
top=$(pwd)
T=$(mktemp -d /tmp/gmlslurm.XXXXXX)
chmod 700 "$T"
mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/log" "$T/run" "$T/dev"
chmod 700 "$T/run"
pids="" cgroots=""
cleanup() {
  rc=$?
  SLURM_CONF="$T/slurm.conf" scancel --quiet --user=root 2>/dev/null || true
  for f in "$T/slurmd.pid" "$T/slurmctld.pid" "$T/munge/pid"; do [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  for p in $pids; do kill "$p" 2>/dev/null || true; done
  for f in "$T/slurmd.pid" "$T/slurmctld.pid" "$T/munge/pid"; do
    [ -s "$f" ] && wait_for 20 sh -c "! kill -0 $(cat "$f") 2>/dev/null" || true
  done
  for p in $pids; do wait "$p" 2>/dev/null || true; done
  if [ $rc != 0 ]; then
    echo "--- slurmd.log"; tail -n 30 "$T/log/slurmd.log" 2>/dev/null || true
    echo "--- slurmctld.log"; tail -n 15 "$T/log/slurmctld.log" 2>/dev/null || true
    for d in 0 1; do echo "--- gmlaked $d"; tail -n 15 "$T/gmlaked$d.log" 2>/dev/null || true; done
  fi
  rm -rf "$T"
  for r in $cgroots; do rmdir "$r" 2>/dev/null || true; done # Slurm's v1 root, when this test made it (empty once its jobs are gone)
  exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

# munge: a key of its own, its socket in $T
mungekey --create --keyfile="$T/munge/munge.key" 2>/dev/null || dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 600 "$T/munge/munge.key"
munged --force --key-file="$T/munge/munge.key" --socket="$T/munge/sock" --pid-file="$T/munge/pid" \
  --log-file="$T/munge/log" --seed-file="$T/munge/seed" 2>/dev/null || fail "munged did not start: $(tail -3 "$T/munge/log")"

# cgroups: Slurm's proctrack/cgroup makes the job's cgroup (what the quota binds)
if [ -w /sys/fs/cgroup/freezer ]; then cgplugin=cgroup/v1
elif [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] && [ -w /sys/fs/cgroup ]; then cgplugin=cgroup/v2
else not_run "$NAME" "no writable cgroup hierarchy (v1 freezer or v2) for Slurm's proctrack/cgroup"; exit 0; fi
echo "CgroupPlugin=$cgplugin" > "$T/cgroup.conf"

# two fake GPUs: character devices Slurm accepts (they are /dev/null's)
for i in 0 1; do mknod "$T/dev/nvidia$i" c 1 3; done
node=$(hostname -s)
cgroots=""
for r in /sys/fs/cgroup/freezer/slurm /sys/fs/cgroup/freezer/slurm_$node; do [ -e "$r" ] || cgroots="$cgroots $r"; done
port=$((20000 + $$ % 20000))
first=$((100000 + ($$ % 5000) * 100)) # job ids of their own: Slurm's cgroups are named by them
cat > "$T/slurm.conf" <<EOF
ClusterName=gmltest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$T/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
SlurmdDebug=info
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
FirstJobId=$first
MinJobAge=600
KillWait=2
PlugStackConfig=$T/plugstack.conf
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
echo "NodeName=$node Name=gpu File=$T/dev/nvidia[0-1]" > "$T/gres.conf"
# the site's default 6 MiB a GPU; a job with no GPU gets a quota on lake 0 (nogpu=0)
echo "required $top/$BUILD/gmlake_spank.so default=6MiB dir=$T/run ctl=$top/$BUILD/gmlakectl nogpu=0" > "$T/plugstack.conf"
export SLURM_CONF="$T/slurm.conf"

# one host-backend daemon per fake GPU; clients find gmlake-host-N.sock in $XDG_RUNTIME_DIR (srun and sbatch
# pass the environment on), the plugin the control endpoints gmlake-N.ctl (dir=)
for i in 0 1; do
  "$BUILD/gmlaked" --device "$i" --backend host --socket "$T/run/gmlake-host-$i.sock" --control "ipc://$T/run/gmlake-$i.ctl" \
    --limit 64MiB --log-level info > "$T/gmlaked$i.log" 2>&1 &
  pids="$pids $!"
done
export XDG_RUNTIME_DIR="$T/run" GMLAKE_MODE=daemon GMLAKE_BACKEND=host
ctl() { d=$1; shift; "$BUILD/gmlakectl" --control "ipc://$T/run/gmlake-$d.ctl" "$@"; }
for i in 0 1; do wait_for 30 ctl "$i" stats >/dev/null || fail "gmlaked $i did not start"; done

slurmctld || fail "slurmctld did not start"
if ! slurmd; then
  # Slurm 22.05's cgroup/v2 makes the steps' scope through systemd (dbus): where systemd is not running (a
  # container, a chroot) slurmd cannot track jobs by cgroup, and nothing else identifies them reliably
  [ "$cgplugin" = cgroup/v2 ] && ! [ -d /run/systemd/system ] &&
    { not_run "$NAME" "slurmd with cgroup/v2 wants systemd, not running here: $(tail -n 2 "$T/log/slurmd.log" | tr '\n' ' ')"; exit 0; }
  fail "slurmd did not start (with $cgplugin)"
fi
node_idle() { sinfo -h -o %T 2>/dev/null | grep -q idle; }
t0=$(date +%s); wait_for 60 node_idle || fail "the node did not come up idle: $(sinfo 2>&1)"
echo "  slurm up: $node, $cgplugin, ports $port-$((port + 1)), node idle after $(($(date +%s) - t0)) s"

client="$top/$BUILD/gml-testclient"
quota_row() { ctl "$1" quotas | grep "^slurm-job-$2 " || true; } # lake, job
no_quota() { [ -z "$(quota_row "$1" "$2")" ]; }
chunks_leased() { ctl "$1" stats --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["chunks_leased"])'; }

# 1. srun, one GPU, --gmlake-mem=8MiB: 4 + 4 MiB fit, a third 4 MiB is refused naming the job's quota
out=$(srun --gres=gpu:1 --gmlake-mem=8MiB sh -c 'echo job $SLURM_JOB_ID gpu $CUDA_VISIBLE_DEVICES;
  printf "alloc 4194304\nalloc 4194304\nalloc 4194304\nexit\n" | '"$client"' default' 2>&1) || fail "srun: $out"
echo "$out" | sed 's/^/  | /'
job=$(echo "$out" | sed -n 's/^job \([0-9]*\) gpu \([0-9]\).*/\1/p')
gpu=$(echo "$out" | sed -n 's/^job \([0-9]*\) gpu \([0-9]\).*/\2/p')
[ -n "$job" ] && [ -n "$gpu" ] || fail "no job id / GPU in the job's output"
echo "$out" | grep -q "^ok 1" || fail "the job could not allocate 8 MiB under its 8 MiB quota"
echo "$out" | grep -q "^err .*quota of 8.00 MiB reached (slurm-job-$job of cgroup " \
  || fail "the third 4 MiB was not refused naming the job's quota (slurm-job-$job)"
echo "$out" | grep -q "gmlake: job $job: lake usage host-$gpu: peak 8.00 MiB of 8.00 MiB" \
  || fail "the job's stderr does not say its peak on host-$gpu"
wait_for 30 no_quota "$gpu" "$job" || fail "job $job's quota is still on lake $gpu after it ended: $(quota_row "$gpu" "$job")"
scontrol show job "$job" | grep -q "AdminComment=gmlake host-$gpu: peak 8.00 MiB of 8.00 MiB" \
  || fail "job $job's AdminComment: $(scontrol show job "$job" | grep -i comment)"
echo "  quota enforced and named, peak on stderr and in AdminComment, quota removed at the end (job $job, lake $gpu)"

# 2. two jobs without GPUs share lake 0 (nogpu=0), each under its own quota, holding memory at once
hold_job() { # hold_job NAME MEM BYTES: a batch job that allocates BYTES and holds them until $T/go.NAME exists
  sbatch --parsable -o "$T/out.$1" ${2:+--gmlake-mem=$2} --wrap "( printf 'alloc $3\nstats\n'; \
    while [ ! -e $T/go.$1 ]; do sleep 0.1; done; echo exit ) | $client default"
}
ja=$(hold_job a 12MiB 4194304)
jb=$(hold_job b 10MiB 6291456)
holds() { quota_row 0 "$1" | grep -q " $2 "; } # job, held as gmlakectl prints it ("4.00 MiB" -> " 4.00 ")
wait_for 60 holds "$ja" "4.00" || fail "job $ja holds no 4 MiB on lake 0: $(ctl 0 quotas)"
wait_for 60 holds "$jb" "6.00" || fail "job $jb holds no 6 MiB on lake 0: $(ctl 0 quotas)"
ctl 0 quotas | sed 's/^/  | /'
quota_row 0 "$ja" | grep -q "^slurm-job-$ja  *12.00 MiB" || fail "job $ja's quota is not its 12 MiB"
quota_row 0 "$jb" | grep -q "^slurm-job-$jb  *10.00 MiB" || fail "job $jb's quota is not its 10 MiB"
touch "$T/go.a" "$T/go.b"
wait_for 60 no_quota 0 "$ja" && wait_for 60 no_quota 0 "$jb" || fail "the two jobs' quotas stay after them: $(ctl 0 quotas)"
grep -q "gmlake: job $ja: lake usage host-0: peak 4.00 MiB of 12.00 MiB" "$T/out.a" \
  || fail "job $ja's output does not say its peak: $(cat "$T/out.a")"
echo "  two jobs on one lake, each under its own quota (jobs $ja and $jb)"

# 3. a cancelled job: its quota and its chunks come back
jc=$(hold_job c 16MiB 8388608)
wait_for 60 holds "$jc" "8.00" || fail "job $jc holds no 8 MiB on lake 0: $(ctl 0 quotas)"
scancel "$jc"
wait_for 60 no_quota 0 "$jc" || fail "cancelled job $jc's quota is still there: $(quota_row 0 "$jc")"
leased_none() { [ "$(chunks_leased 0)" = 0 ]; }
wait_for 60 leased_none || fail "lake 0 still leases $(chunks_leased 0) chunk(s) after job $jc was cancelled"
echo "  cancelled job $jc: quota removed, its chunks back in the lake"

# 4. no --gmlake-mem: the site's default (6 MiB a GPU), enforced
jd=$(sbatch --parsable --wait -o "$T/out.d" --gres=gpu:1 --wrap "echo gpu \$CUDA_VISIBLE_DEVICES; \
  printf 'alloc 4194304\nalloc 4194304\nexit\n' | $client default") || true
sed 's/^/  | /' "$T/out.d"
grep -q "^err .*quota of 6.00 MiB reached (slurm-job-$jd of cgroup " "$T/out.d" \
  || fail "job $jd (no --gmlake-mem) was not held to the site's 6 MiB default"
echo "  job $jd without --gmlake-mem: the site's default 6 MiB held"
# 5. slurmd restarted while a job runs: the job goes on under its quota, the new slurmd's epilog removes it
je=$(hold_job e 8MiB 4194304)
wait_for 60 holds "$je" "4.00" || fail "job $je holds no 4 MiB on lake 0: $(ctl 0 quotas)"
sdpid=$(cat "$T/slurmd.pid")
kill "$sdpid"
slurmd_gone() { ! kill -0 "$sdpid" 2>/dev/null; }
wait_for 30 slurmd_gone || fail "slurmd did not stop"
slurmd || fail "slurmd did not start again"
node_up() { sinfo -h -o %T 2>/dev/null | grep -q "mixed\|allocated\|idle"; }
wait_for 60 node_up || fail "the node did not come back: $(sinfo 2>&1)"
quota_row 0 "$je" | grep -q "^slurm-job-$je  *8.00 MiB  *4.00 MiB" || fail "job $je's quota after slurmd's restart: $(ctl 0 quotas)"
touch "$T/go.e"
wait_for 60 no_quota 0 "$je" || fail "job $je's quota stays after it ended under the restarted slurmd: $(quota_row 0 "$je")"
echo "  slurmd restarted under job $je: its quota held on, removed by the new slurmd's epilog at its end"

# the daemons stop cleanly (under the sanitizers: no report, no leak)
for p in $pids; do kill "$p"; done
for p in $pids; do wait "$p" || fail "a gmlaked exited $? when stopped: $(tail -n 20 "$T"/gmlaked*.log)"; done
pids=""
! grep -l "Sanitizer\|runtime error" "$T"/gmlaked*.log || fail "a sanitizer report in the daemons' logs"
echo "PASS: tests/slurm.sh ($cgplugin)"
