#!/bin/bash
# GPU run, in one call on the lent machine (or any CUDA machine):
#   bench/gpu.sh [build] [vmm] [stall] [test] [lease] [replay] [torch[:w]]... [trace:w]... [accept:w]... [shared]
#                [kvcache] [shareweights] [guard] [guardcost:w]... [borrow] [torchtest] [lake] [elastic] [ext]
#                [overlap] [cpus] [copy] [swap] [plan[:w]] [cluster]
#                (default: build vmm test lease replay torch shared)
# ext:    builds gmlake._C against the installed torch (done by itself for every stage that needs it)
# build:  unpacks carried Debian packages (.deb/, see docs/benchmarks.md) into .gpu/root when the
#         machine lacks the -dev packages, and builds with the carried generated protobuf code
# vmm:    what cuMemMap / cuMemSetAccess / cuMemUnmap cost here, idle and busy (bench/vmm_cost.c)
# overlap: whether one thread's imports and another's map + set-access run at once (bench/vmm_overlap.c:
#         what a client could gain by mapping a streamed lease's chunks while it imports the next)
# stall:  whether VMM calls slow the GPU work running beside them (bench/vmm_stall.py)
# test:   the multi-process integration tests with the daemon on the cuda backend
# lease:  chunk lease latency through the daemon, chunks pre-created (cuda and host)
# replay: the recorded traces through the real allocator on the cuda backend
# torch:  bench/torch_bench.py table (PyTorch default / expandable / GMLake embedded / daemon)
# trace:W  records W's allocations under PyTorch default, as accept:W runs it, to $OUT/W.trace.gz
#           (replay it here: build/gmlake-replay --steps W.trace.gz)
# lockstep:W  accept:W's comparison with default / embedded / daemon started together and taking turns
#           step by step on one GPU, the same cores (bench/lockstep.py): the host's CPU drift shared
# accept:W  the speed table of issue 4 for workload W (long runs, repeats, per-step ratios)
# shared: two trainings through one daemon limited below their summed peaks
# kvcache: bench/kv_cache.py: a GPT-2 generate loop with its K/V cache on growable tensors vs
#          concatenation (DynamicCache) and preallocation (StaticCache), embedded, then the same
#          through a daemon; PASS/FAIL lines (KV_MODES="daemon": one of them; KV_REPEATS: passes, 3)
# guard:  guard mode (issue 16): a kernel writes one element past a tensor's end (bench/guard_oob.py)
#         with the guard, without it, and under compute-sanitizer memcheck; the faulting address
#         named with gmlake.block_of and with tools/gmlake-sanitizer-blocks
# guardcost:W  guard mode's cost on training W: peak reserved and ms/step, default /
#         gmlake_embedded / gmlake_embedded+GMLAKE_GUARD=1 interleaved
# borrow: cross-stream borrowing (issue 16), bench/borrow.py: two replicas training on two streams,
#         and compute plus a side stream unpacking each layer's weights (record_stream); peak reserved
#         and ms/step with borrowing on / off / PyTorch default, results against one stream
#         (GMLAKE_BORROW_WORKLOADS=side or =replicas: one of them)
# shareweights: bench/share_weights.py: four processes serving one 1.1B Llama-shaped model with
#          its weights unshared, shared by name (gmlake.share/attach) and deduplicated (gmlake.dedup)
# torchtest: builds gmlake._C against the installed torch, runs tests/torch (issue 11's points,
#         embedded and daemon, and a Hugging Face Trainer with memory metrics) and prints their table;
#         then a short training's memory_viz snapshot and memory_summary into $OUT
#         (TORCHTEST="test_two_devices test_ddp": only those checks, no snapshot)
# lake:   bench/lake_bench.py: three PyTorch processes with staggered peaks (a notebook that goes
#         idle, a training, bursty inference; units of 1536 MiB, a multiple of the 6 MiB chunk) on
#         one daemon limited to 1.05x the most they allocate together: lake peak against max total
#         allocated; PASS/FAIL
# cluster: issue 31's acceptance (two GPUs, root): two processes each given one GPU by CUDA_VISIBLE_DEVICES, each
#         in a cgroup with a named quota on its GPU's lake (as the Slurm plugin sets it): each reaches its own
#         GPU's lake, its quota holds and is named when refused, metrics carry the name (bench/gpu_cluster.sh)
# cpus:   the host's CPU topology (lscpu, NUMA, the GPU's affinity) and each core's speed at
#         torch_bench's CPU probe (bench/cpu_cores.py): which cores GMLAKE_BENCH_CPUS should pin
# elastic: bench/elastic.py: the idle hog (A caches 40 GiB and idles, B gets 40 GiB of a 60 GiB
#         lake within a second; 3 runs, where B's time went) and a training paused/resumed between
#         steps (same losses); PASS/FAIL. ELASTIC_ARGS: more arguments (e.g. --hog-only --hog-runs 5)
# copy:   bench/copy_bench.py (issue 30): host<->GPU GB/s of a plain pinned cudaMemcpyAsync (baseline),
#         torch's pageable copy, the copy engine from pinned and from pageable memory, 256 MiB-8 GiB,
#         content checked; each GPU's link alone; nvidia-smi topo -m; pause/resume of 40 GiB in 256 MiB
#         tensors (pageable, pinned); on 2+ GPUs multi-path (each path alone, the engine's split H2D/D2H
#         of 1/4/8 GiB to GPU 0 against 90% of their sum, the probe's paths); first, make
#         cuda-header-check where a cuda.h is. PASS/FAIL lines (COPY_ARGS: more arguments, e.g.
#         --no-pause, or --mpath-only: the 256 MiB single-path row, the links and multi-path alone)
# swap:   issue 29 item 3: tests/python_swap.py (the hooks on the CPU), then bench/swap.py: ViT-B/16 without
#         activation checkpointing under a memory fraction of SWAP_CAP_GIB (24) GiB: the largest batch with
#         expandable_segments, GMLake and GMLake + swap, checkpointing at swap's batch, losses against no swap,
#         swap's cost at a batch that fits; a table and PASS/FAIL lines (SWAP_ARGS: more arguments)
# plan[:W]: planned placement (issue 29) on W (default: vit_train gpt2_ckpt llama_lora): default /
#         gmlake_embedded / gmlake_embedded+GMLAKE_PLAN=1, with every step's shapes the same (static,
#         GMLAKE_BENCH_FIXED=1) and the workload's own (dynamic padding), each as torch_bench's table
#         (peaks again from step PLAN_STEADY_AT, 10) and as bench/lockstep.py's comparison; PASS/FAIL lines
#         of bench/plan_check.py (PLAN_STEPS 30, PLAN_REPEATS 1, PLAN_LOCKSTEP_REPEATS 2)
# adopt:  issue 33 on a GPU: make demo's PASS lines on the cuda backend; the node view (gmlakectl, one cuda daemon
#         a GPU: model and memory from the driver); pip install ./python with torch installed, build isolation on
#         and off, offline (--no-index): the extension built against that torch, said without -v; PASS/FAIL
set -u
cd "$(dirname "$0")/.."
STAGES=${*:-build vmm test lease replay torch shared}
OUTDIR=${OUT:-/tmp/gmlake-gpu-out}; mkdir -p "$OUTDIR"
SUMMARY="$OUTDIR/summary.txt"; touch "$SUMMARY"  # appended to: several calls in one command add up
say() { echo "$*" | tee -a "$SUMMARY"; }
has() { case " $STAGES " in *" $1"*) return 0;; esac; return 1; }
export BUILD=${BUILD:-build}

if [ -d .deb ] && ls .deb/*.deb >/dev/null 2>&1; then
  mkdir -p .gpu/root
  for f in .deb/*.deb; do dpkg -x "$f" .gpu/root; done
  R=$(pwd)/.gpu/root
  export EXTRA_CFLAGS="-I$R/usr/include" EXTRA_LDFLAGS="-L$R/usr/lib/x86_64-linux-gnu -Wl,-rpath,$R/usr/lib/x86_64-linux-gnu"
  export LD_LIBRARY_PATH="$R/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  export CHECK_LIBS="-lcheck_pic -lrt -lm -lsubunit"
  # a carried python3-prometheus-client (the suites parse /metrics with it)
  [ -d "$R/usr/lib/python3/dist-packages/prometheus_client" ] && export PYTHONPATH="$R/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -d .gpu/gen ]; then mkdir -p "$BUILD/gen" && cp .gpu/gen/* "$BUILD/gen/" && touch "$BUILD"/gen/*; fi

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
if has build; then
  if make -j"$(nproc)" BUILD="$BUILD" all > "$OUTDIR/build.log" 2>&1; then say "build: ok"; else say "build: FAILED"; tail -30 "$OUTDIR/build.log"; exit 1; fi
fi

if has vmm; then
  if cc -std=gnu11 -O2 -I/usr/local/cuda/include bench/vmm_cost.c -o "$BUILD/vmm_cost" -ldl > "$OUTDIR/vmm.txt" 2>&1; then
    "$BUILD/vmm_cost" >> "$OUTDIR/vmm.txt" 2>&1
  fi
  cat "$OUTDIR/vmm.txt" | tee -a "$SUMMARY"
fi

if has stall; then
  PYTHONUNBUFFERED=1 python3 bench/vmm_stall.py 2>&1 | tee -a "$SUMMARY"
fi

if has overlap; then
  if cc -std=gnu11 -O2 -Icommon bench/vmm_overlap.c -o "$BUILD/vmm_overlap" -ldl -pthread > "$OUTDIR/overlap.txt" 2>&1; then
    "$BUILD/vmm_overlap" >> "$OUTDIR/overlap.txt" 2>&1
  fi
  cat "$OUTDIR/overlap.txt" | tee -a "$SUMMARY"
fi

if has cpus; then
  { lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA|L3|CPU max MHz)';
    nvidia-smi topo -m 2>/dev/null | head -4; cat /sys/fs/cgroup/cpu.max 2>/dev/null | sed 's/^/cgroup cpu.max: /';
    grep -E '^(cpu  )' /proc/stat | sed 's/^/stat: /';
    python3 bench/cpu_cores.py 3; } 2>&1 | tee "$OUTDIR/cpus.txt" | tee -a "$SUMMARY"
fi

if has test; then
  if GMLAKE_TEST_BACKEND=cuda GMLAKE_TEST_NO_PROMETHEUS=1 "$BUILD/test_integration" > "$OUTDIR/test_cuda.log" 2>&1; then
    say "integration tests, cuda backend: $(grep -o '[0-9]*%: Checks.*' "$OUTDIR/test_cuda.log")"
  else
    say "integration tests, cuda backend: FAILED: $(grep -E 'Checks|:F:|:E:' "$OUTDIR/test_cuda.log" | head -8)"
    tail -40 "$OUTDIR/test_cuda.log"
  fi
fi

if has lease; then
  for be in cuda host; do
    d=$(mktemp -d)
    "$BUILD/gmlaked" --backend $be --socket $d/s --control ipc://$d/c --prefetch 2GiB --limit 8GiB --log-level warn 2>$d/log &
    dp=$!
    for i in $(seq 100); do # until the prefetch is made: 2 GiB of whole chunks (1000 and more were 2 MiB ones only)
      st=$("$BUILD/gmlakectl" --control ipc://$d/c stats --json 2>/dev/null)
      n=$(echo "$st" | sed -n 's/.*"chunks_free":\([0-9]*\).*/\1/p'); cs=$(echo "$st" | sed -n 's/.*"chunk_size":\([0-9]*\).*/\1/p')
      [ "${cs:-0}" -gt 0 ] && [ "${n:-0}" -ge $(((2 << 30) / cs)) ] && break; sleep 0.1
    done
    r=$(printf 'leasebench 500\nclose\n' | "$BUILD/gml-testclient" $d/s | grep 'lease calls')
    say "lease latency, $be backend (daemon round trip + import, 1 chunk, $n pre-created): $r"
    kill $dp; wait $dp; rm -rf $d
  done
fi

if has replay; then
  "$BUILD/gmlake-replay" --backend cuda --steps tests/traces/*.trace.gz 2>&1 | tee "$OUTDIR/replay_cuda.txt"
  "$BUILD/gmlake-replay" --backend cuda --json tests/traces/*.trace.gz > "$OUTDIR/replay_cuda.json" 2>&1
  sed 's/^/replay cuda: /' "$OUTDIR/replay_cuda.txt" >> "$SUMMARY"
fi

ext_built=
need_ext() { # gmlake._C against the installed torch, once per call (every stage that runs PyTorch on the lake)
  [ -n "$ext_built" ] && return 0
  # setup.py says a failed extension build and installs without it (pip's users get the ctypes parts): here the
  # extension itself must be there, so its file is what counts
  ext_ok() { (cd python && "$@") > "$OUTDIR/$LOGNAME_EXT" 2>&1 && ls python/gmlake/_C*.so > /dev/null 2>&1; }
  rm -f python/gmlake/_C*.so
  if LOGNAME_EXT=torchext_build.log ext_ok env MAX_JOBS=8 python3 setup.py build_ext --inplace ||
     { say "gmlake._C: build FAILED, trying without IPC:"; grep -E "error" "$OUTDIR/torchext_build.log" | head -20 | tee -a "$SUMMARY"
       LOGNAME_EXT=torchext_build2.log ext_ok env GMLAKE_EXT_DEFINES=-DGMLAKE_NO_IPC MAX_JOBS=8 python3 setup.py build_ext --inplace; }; then
    say "gmlake._C: built against torch $(python3 -c 'import torch; print(torch.__version__)')"; ext_built=1
  else
    say "gmlake._C: build FAILED"; grep -E "error|Error" "$OUTDIR/torchext_build.log" | head -40; return 1
  fi
}
case " $STAGES " in *" torch"*|*" plan"*|*" accept:"*|*" guardcost:"*|*" trace:"*|*" lockstep:"*|*" shared "*|*" kvcache "*|*" lake "*|*" elastic "*|*" borrow "*|*" shareweights "*|*" ext "*|*" uuid "*|*" copy "*|*" swap "*)
  need_ext;; esac

torch_table() { # workload ('' = all), then the environment it runs with
  local w=$1; shift
  env "$@" PYTHONUNBUFFERED=1 OUT="$OUTDIR" BENCH_JSON="torch_${w:-all}.json" python3 bench/torch_bench.py table $w 2>&1 |
    tee "$OUTDIR/torch_${w:-all}.txt" | grep -v '^{'
  sed -n '/^workload/,$p' "$OUTDIR/torch_${w:-all}.txt" >> "$SUMMARY"
}
accept_steps() { case $1 in gpt2_ckpt) echo 60;; llama_lora) echo 40;; vit_train) echo 100;; *) return 1;; esac; }
for st in $STAGES; do
  case $st in
  torchtest) ;;
  torch*) w=${st#torch}; torch_table "${w#:}";;
  trace:*) w=${st#trace:}
    s=$(accept_steps "$w") || { echo "trace: unknown workload $w"; exit 2; }
    PYTHONUNBUFFERED=1 OUT="$OUTDIR" BENCH_JSON="trace_$w.json" python3 bench/torch_bench.py run "$w" trace "$s" 2>&1 |
      grep '^RESULT ' | cut -c8- | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("trace %s: %s, %s ms/step, peak reserved/allocated %.3f" % (r["workload"], r.get("trace"), r.get("ms_per_step"), r["peak_reserved"] / r["peak_allocated"]))' | tee -a "$SUMMARY";;
  guardcost:*) w=${st#guardcost:}
    s=$(accept_steps "$w") || { echo "guardcost: unknown workload $w"; exit 2; }
    torch_table "$w" GMLAKE_BENCH_STEPS=${GMLAKE_BENCH_STEPS:-$((s / 2))} GMLAKE_BENCH_REPEATS=${GMLAKE_BENCH_REPEATS:-2} \
      GMLAKE_BENCH_CONFIGS=${GMLAKE_BENCH_CONFIGS:-default,gmlake_embedded,gmlake_embedded+GMLAKE_GUARD=1};;
  lockstep:*) # the same speed comparison with the configs taking turns step by step (bench/lockstep.py)
    w=${st#lockstep:}
    s=$(accept_steps "$w") || { echo "lockstep: unknown workload $w"; exit 2; }
    env GMLAKE_BENCH_STEPS=${GMLAKE_BENCH_STEPS:-$s} GMLAKE_BENCH_REPEATS=${GMLAKE_BENCH_REPEATS:-3} PYTHONUNBUFFERED=1 \
      OUT="$OUTDIR" BENCH_JSON="lockstep_$w.json" python3 bench/lockstep.py "$w" 2>&1 | tee "$OUTDIR/lockstep_$w.txt" | grep -v '^{'
    sed -n '/^config /,$p' "$OUTDIR/lockstep_$w.txt" | sed "s/^/lockstep $w: /" >> "$SUMMARY";;
  plan|plan:*) # planned placement: static and dynamic shapes, table and lockstep, then the verdicts
    ws=${st#plan}; ws=${ws#:}; [ -n "$ws" ] || ws="vit_train gpt2_ckpt llama_lora"
    for w in $ws; do
      accept_steps "$w" > /dev/null || { echo "plan: unknown workload $w"; exit 2; }
      for shape in static dynamic; do
        fixed=0; [ $shape = static ] && fixed=1
        common=(GMLAKE_BENCH_FIXED=$fixed GMLAKE_BENCH_STEPS=${PLAN_STEPS:-30} PYTHONUNBUFFERED=1 OUT="$OUTDIR"
                GMLAKE_BENCH_CONFIGS=default,gmlake_embedded,gmlake_embedded+GMLAKE_PLAN=1)
        env "${common[@]}" GMLAKE_BENCH_REPEATS=${PLAN_REPEATS:-1} GMLAKE_BENCH_RESET_PEAK_AT=${PLAN_STEADY_AT:-10} \
          BENCH_JSON="plan_${w}_$shape.json" python3 bench/torch_bench.py table "$w" > "$OUTDIR/plan_${w}_$shape.txt" 2>&1
        env "${common[@]}" GMLAKE_BENCH_REPEATS=${PLAN_LOCKSTEP_REPEATS:-2} BENCH_JSON="plan_lockstep_${w}_$shape.json" \
          python3 bench/lockstep.py "$w" > "$OUTDIR/plan_lockstep_${w}_$shape.txt" 2>&1
      done
      python3 bench/plan_check.py "$OUTDIR" "$w" | tee -a "$SUMMARY"
    done;;
  accept:*) # issue 4's speed table for one workload, sized to fit one 10-minute call:
    # runs long enough to leave the first-time shapes behind, default / embedded / daemon interleaved
    w=${st#accept:}
    s=$(accept_steps "$w") || { echo "accept: unknown workload $w"; exit 2; }
    case $w in vit_train) r=5;; *) r=3;; esac
    torch_table "$w" GMLAKE_TIMING=1 GMLAKE_BENCH_STEPS=${GMLAKE_BENCH_STEPS:-$s} GMLAKE_BENCH_REPEATS=${GMLAKE_BENCH_REPEATS:-$r} \
      GMLAKE_BENCH_CONFIGS=${GMLAKE_BENCH_CONFIGS:-default,gmlake_embedded,gmlake_daemon}
    python3 bench/paired.py "$OUTDIR/torch_$w.json" | tee -a "$SUMMARY";;
  esac
done

if has torchtest; then
  if [ -n "$ext_built" ]; then
    if [ -z "${TORCHTEST:-}" ]; then
      PYTHONUNBUFFERED=1 OUT="$OUTDIR" GMLAKE_MODE=embedded python3 bench/torch_snapshot.py > "$OUTDIR/torch_snapshot.txt" 2>&1 &&
        say "memory_viz snapshot of a training: train_snapshot.pickle, memory_summary.txt" ||
        { say "torch_snapshot: FAILED"; tail -20 "$OUTDIR/torch_snapshot.txt"; }
    fi
    # TORCHTEST="test_two_devices test_ddp": those checks only (names or parts of names), no snapshot
    PYTHONUNBUFFERED=1 timeout 1500 python3 tests/torch/run.py ${TORCHTEST:-} 2>&1 | tee "$OUTDIR/torchtest.txt"
    sed -n '/==== torch on the lake/,$p' "$OUTDIR/torchtest.txt" >> "$SUMMARY"
  fi
fi

if has shared; then
  PYTHONUNBUFFERED=1 python3 bench/torch_bench.py shared 2>&1 | tee "$OUTDIR/shared.txt"
  grep -E '^SHARED|separate peaks' "$OUTDIR/shared.txt" >> "$SUMMARY"
fi
KV_MODES=${KV_MODES:-embedded daemon} KV_REPEATS=${KV_REPEATS:-3} KV_ARGS=${KV_ARGS:-}  # KV_ARGS=--diagnose: issue 32's info lines
if has kvcache && case " $KV_MODES " in *" embedded "*) true;; *) false;; esac; then
  PYTHONUNBUFFERED=1 OUT="$OUTDIR" python3 bench/kv_cache.py --repeats "$KV_REPEATS" $KV_ARGS 2>&1 | tee "$OUTDIR/kv_cache.txt"
  sed -n '/^model:/p; /^cache /,$p' "$OUTDIR/kv_cache.txt" | sed 's/^/kvcache embedded: /' >> "$SUMMARY"
fi
if has kvcache && case " $KV_MODES " in *" daemon "*) true;; *) false;; esac; then
  d=$(mktemp -d)
  "$BUILD/gmlaked" --backend cuda --socket $d/s --control ipc://$d/c --log-level warn 2>$d/log &
  dp=$!
  for i in $(seq 100); do "$BUILD/gmlakectl" --control ipc://$d/c stats >/dev/null 2>&1 && break; sleep 0.1; done
  PYTHONUNBUFFERED=1 GMLAKE_SOCKET=$d/s GMLAKE_MODE=daemon python3 bench/kv_cache.py --repeats "$KV_REPEATS" $KV_ARGS 2>&1 |
    tee "$OUTDIR/kv_cache_daemon.txt" | grep -E '^(model|PASS|FAIL|SKIP|info)' | sed 's/^/kvcache daemon: /' | tee -a "$SUMMARY"
  say "kvcache daemon: lake after the run: $("$BUILD/gmlakectl" --control ipc://$d/c stats | grep -E 'chunks ')"
  kill $dp; wait $dp; rm -rf $d
fi
if has lake; then
  PYTHONUNBUFFERED=1 GMLAKE_LIB="$BUILD/libgmlake-client.so" python3 bench/lake_bench.py --backend cuda --torch \
    --unit 1536MiB --seconds 8 --build "$BUILD" 2>&1 | tee "$OUTDIR/lake_bench.txt" | grep -E '^lake bench' | tee -a "$SUMMARY"
fi
if has copy; then
  # the driver entry points and layouts the engine added (cuMemcpyAsync, cuMemcpyBatchAsync_v2, CUmemcpyAttributes...)
  if [ -f "${CUDA_INC:-/usr/local/cuda/include}/cuda.h" ]; then
    if make BUILD="$BUILD" cuda-header-check CUDA_INC="${CUDA_INC:-/usr/local/cuda/include}" > "$OUTDIR/cuda_header_check.txt" 2>&1; then
      say "copy: cuda-header-check: PASS"
    else say "copy: cuda-header-check: FAIL"; tail -20 "$OUTDIR/cuda_header_check.txt" | tee -a "$SUMMARY"; fi
  else say "copy: cuda-header-check: no cuda.h at ${CUDA_INC:-/usr/local/cuda/include} (not run)"; fi
  PYTHONUNBUFFERED=1 GMLAKE_MODE=embedded GMLAKE_LIB="$BUILD/libgmlake-client.so" python3 bench/copy_bench.py ${COPY_ARGS:-} 2>&1 |
    tee "$OUTDIR/copy.txt" | grep -E '^copy' | tee -a "$SUMMARY"
  "$BUILD/gmlakectl" paths 2>&1 | sed 's/^/copy: gmlakectl paths: /' | tee -a "$SUMMARY" # the probe's view, each GPU's own
fi

if has elastic; then
  PYTHONUNBUFFERED=1 GMLAKE_LIB="$BUILD/libgmlake-client.so" python3 bench/elastic.py --build "$BUILD" ${ELASTIC_ARGS:-} 2>&1 |
    tee "$OUTDIR/elastic.txt" | grep -E '^elastic' | tee -a "$SUMMARY"
fi

if has swap; then
  GMLAKE_LIB="$BUILD/libgmlake-client.so" GMLAKE_LOG=error PYTHONPATH=python python3 tests/python_swap.py > "$OUTDIR/python_swap.txt" 2>&1
  say "swap: tests/python_swap.py: $(tail -1 "$OUTDIR/python_swap.txt")"
  PYTHONUNBUFFERED=1 GMLAKE_LIB="$BUILD/libgmlake-client.so" timeout 900 python3 bench/swap.py --cap-gib "${SWAP_CAP_GIB:-24}" ${SWAP_ARGS:-} 2>&1 |
    tee "$OUTDIR/swap.txt" | grep -E '^(PASS|FAIL) swap|^swap (bench|at)' | tee -a "$SUMMARY"
fi

if case " $STAGES " in *" guard "*) true;; *) false;; esac; then
  for g in 1 0; do  # with the guard, and the same write without it (control)
    GMLAKE_GUARD=$g OUT="$OUTDIR" PYTHONUNBUFFERED=1 timeout 300 python3 bench/guard_oob.py > "$OUTDIR/guard_oob_$g.txt" 2>&1
    say "guard GMLAKE_GUARD=$g: $(grep -E '^(GUARD_OOB|gmlake: the fault)' "$OUTDIR/guard_oob_$g.txt" | tr '\n' ' ')"
  done
  if command -v compute-sanitizer >/dev/null || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    rm -f "$OUTDIR/sanitizer.log"
    GMLAKE_GUARD=1 GMLAKE_SANITIZER_LOG="$OUTDIR/sanitizer.log" OUT="$OUTDIR" PYTHONUNBUFFERED=1 timeout 500 \
      "$CS" --tool memcheck --log-file "$OUTDIR/sanitizer.log" python3 bench/guard_oob.py > "$OUTDIR/guard_oob_sanitizer.txt" 2>&1
    say "guard under compute-sanitizer: $(grep -E '^(GUARD_OOB|gmlake: the fault)' "$OUTDIR/guard_oob_sanitizer.txt" | tr '\n' ' ')"
    grep -m3 -E 'Invalid|Address' "$OUTDIR/sanitizer.log" | tee -a "$SUMMARY"
    python3 tools/gmlake-sanitizer-blocks "$OUTDIR/sanitizer.log" "$OUTDIR/guard_oob_blocks.json" 2>&1 | tee -a "$SUMMARY"
  else
    say "guard: no compute-sanitizer on this machine"
  fi
fi

if has borrow; then
  PYTHONUNBUFFERED=1 timeout 580 python3 bench/borrow.py table ${GMLAKE_BORROW_WORKLOADS:-} 2>&1 | tee "$OUTDIR/borrow.txt"
  grep -E '^(workload |replicas |side |BORROW_SUMMARY)' "$OUTDIR/borrow.txt" >> "$SUMMARY"
fi

if has shareweights; then
  PYTHONUNBUFFERED=1 OUT="$OUTDIR" BUILD="$BUILD" python3 bench/share_weights.py 2>&1 | tee "$OUTDIR/share_weights.txt"
  sed -n '/^model:/,$p' "$OUTDIR/share_weights.txt" | sed 's/^/shareweights: /' >> "$SUMMARY"
fi

if has uuid; then # issue 27: GPUs named by UUID (bench/gpu_uuid.sh; two GPUs or more)
  nvidia-smi topo -m 2>&1 | head -5 | tee -a "$SUMMARY"
  timeout 300 bench/gpu_uuid.sh "$BUILD" > "$OUTDIR/gpu_uuid.txt" 2>&1
  grep -E '^(PASS|FAIL|SKIP|gpu_uuid:)' "$OUTDIR/gpu_uuid.txt" | tee -a "$SUMMARY"
fi

if has cluster; then # issue 31: two job-like processes, one GPU each (CUDA_VISIBLE_DEVICES), a named quota per GPU on
  # each one's cgroup (bench/gpu_cluster.sh; two GPUs or more, root)
  timeout 300 bench/gpu_cluster.sh "$BUILD" > "$OUTDIR/gpu_cluster.txt" 2>&1
  grep -E '^(PASS|FAIL|SKIP|cluster:)' "$OUTDIR/gpu_cluster.txt" | tee -a "$SUMMARY"
fi

if has unpriv; then # issue 27: the cuda daemon as the unit runs it (an unprivileged user, no capability)
  d=$(mktemp -d); chmod 755 "$d"; cp "$BUILD/gmlaked" "$BUILD/gml-testclient" "$d/"; chmod 755 "$d"/*
  mkdir -m 755 "$d/run" && chown 65534 "$d/run" # its own directory: a client of its uid trusts it
  setpriv --reuid=65534 --regid=65534 --clear-groups --bounding-set=-all --inh-caps=-all --no-new-privs \
    "$d/gmlaked" --backend cuda --device 0 --limit 4GiB --prefetch 0 --socket "$d/run/s" --control "ipc://$d/run/c" \
    --socket-mode 0666 2> "$d/log" &
  dp=$!
  for _ in $(seq 200); do [ -S "$d/run/s" ] && break; sleep 0.05; done
  r=$(printf 'alloc 67108864\nclose\n' | setpriv --reuid=65534 --regid=65534 --clear-groups "$d/gml-testclient" "$d/run/s" 2>&1 | sed -n 2p)
  say "cuda daemon as uid 65534, no capability: $(grep -m1 serving "$d/log" | sed 's/.*serving/serving/' | cut -c1-120); a 64 MiB allocation through it: $r; CapEff $(grep CapEff /proc/$dp/status 2>/dev/null | awk '{print $2}')"
  kill $dp; wait $dp; rm -rf "$d"
fi

if has sanstress; then # issue 26: tests/stress.sh on the sanitizer build, each stream pinned to 2 cores with its 2 busy loops
  if [ -d .gpu/gen ]; then mkdir -p build-san/gen && cp .gpu/gen/* build-san/gen/ && touch build-san/gen/*; fi
  make -j"$(nproc)" BUILD=build-san SAN=1 all > "$OUTDIR/build-san.log" 2>&1 || { say "sanstress: build FAILED"; tail -20 "$OUTDIR/build-san.log"; }
  n=0; pids= # SANSTRESS: BINARY:RUNS:STREAMS ... (20 runs of each binary, in streams side by side)
  for spec in ${SANSTRESS:-test_elastic:4:5 test_security:5:4 test_integration:10:2}; do
    t=${spec%%:*}; r=${spec#*:}; runs=${r%%:*}; streams=${r#*:}
    for _ in $(seq "$streams"); do
      c=$((2 * n)); n=$((n + 1))
      ( STRESS_LOGS="$OUTDIR/stress$n" taskset -c $c,$((c + 1)) tests/stress.sh -n "$runs" build-san "$t" > "$OUTDIR/sanstress.$n.txt" 2>&1 ) &
      pids="$pids $!"
    done
  done
  wait $pids
  cat "$OUTDIR"/sanstress.*.txt | grep -E 'runs passed|FAILED' | tee -a "$SUMMARY"
  lscpu | grep -E '^(Model name|CPU\(s\))' | tee -a "$SUMMARY"
fi

if has adopt; then
  make -s BUILD="$BUILD" all > "$OUTDIR/adopt-build.log" 2>&1 || say "adopt: build FAILED (see adopt-build.log)"
  BUILD="$BUILD" timeout 300 scripts/demo.sh > "$OUTDIR/demo.txt" 2>&1; rc=$?
  say "adopt demo (exit $rc; want 0 and 4 PASS lines, cuda backend):"; grep -E '^(PASS|FAIL|gmlaked started)' "$OUTDIR/demo.txt" | tee -a "$SUMMARY"
  d=$(mktemp -d); pids=
  for i in $(nvidia-smi --query-gpu=index --format=csv,noheader); do
    "$BUILD/gmlaked" --backend cuda --device "$i" --socket "$d/gmlake-$i.sock" --limit 8GiB --log-level error 2> "$d/d$i.log" &
    pids="$pids $!"
  done
  for _ in $(seq 200); do [ "$(ls "$d"/*.sock 2>/dev/null | wc -l)" = "$(echo $pids | wc -w)" ] && break; sleep 0.1; done
  GMLAKE_SOCKET="$d/gmlake-%d.sock" "$BUILD/gmlakectl" | tee "$OUTDIR/nodeview.txt" | tee -a "$SUMMARY"
  GMLAKE_SOCKET="$d/gmlake-%d.sock" "$BUILD/gmlakectl" --json > "$OUTDIR/nodeview.json"
  python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); ok=all(l["state"]=="up" and l["stats"]["device_model"].startswith("NVIDIA") for l in v); print("%s: node view: %d lakes up, models %s" % ("PASS" if ok and v else "FAIL", len(v), sorted(set(l["stats"].get("device_model") for l in v))))' "$OUTDIR/nodeview.json" | tee -a "$SUMMARY"
  for p in $pids; do kill "$p"; done; wait $pids 2>/dev/null; rm -rf "$d"
  if python3 -c 'import torch' 2>/dev/null; then
    for iso in "" --no-build-isolation; do
      d=$(mktemp -d); mkdir "$d/src"; for f in $(cd python && ls pyproject.toml setup.py gmlake/*.py gmlake/*.cpp gmlake/*.h build_backend/*.py); do install -D -m 644 "python/$f" "$d/src/$f"; done
      # the library and header from this tree (GMLAKE_PREFIX's layout)
      # (the soname's link too: the extension loads libgmlake-client.so.1, as make install lays it out)
      mkdir -p "$d/prefix/lib" && ln -s "$(pwd)/include" "$d/prefix/include" &&
        ln -s "$(pwd)/$BUILD/libgmlake-client.so" "$(pwd)/$BUILD/libgmlake-client.so.1" "$d/prefix/lib/"
      GMLAKE_PREFIX="$d/prefix" script -qec "python3 -m pip install $iso --no-index --no-cache-dir --target $d/site $d/src" /dev/null > "$OUTDIR/pip$iso.txt" 2>&1; rc=$?
      ok=$( (lib="$(pwd)/$BUILD/libgmlake-client.so"; cd "$d" && PYTHONPATH="$d/site" GMLAKE_LIB="$lib" python3 -c 'import torch, gmlake, gmlake._C; print(gmlake.__version__)') 2>&1 | tail -1)
      said=$(grep -o 'gmlake: building the PyTorch extension gmlake._C against torch [^ ]*' "$OUTDIR/pip$iso.txt" | head -1)
      [ $rc = 0 ] && [ -n "$said" ] && [ "$ok" = "$(sed -n 's/^#define GML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' include/gmlake.h | paste -sd.)" ] &&
        say "PASS: pip install ${iso:-(isolated)} --no-index ./python: $said; import gmlake._C, __version__ $ok" ||
        { say "FAIL: pip install ${iso:-(isolated)} --no-index ./python: exit $rc, said '$said', import: $ok (pip$iso.txt)"; }
      rm -rf "$d"
    done
  else
    say "adopt: no torch in python3: pip install with torch not checked"
  fi
fi

echo; echo "==== summary"; cat "$SUMMARY"
