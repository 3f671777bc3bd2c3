"""PyTorch on the lake vs PyTorch's own allocator, on real training workloads.

  python3 bench/torch_bench.py run WORKLOAD CONFIG     one run, prints one JSON line
  python3 bench/torch_bench.py table [WORKLOAD...]     every config of every workload, each
                                                       in its own process; prints a table
  python3 bench/torch_bench.py shared                  two trainings through one daemon
                                                       whose limit is below their summed peaks
CONFIG: default | expandable | gmlake_embedded | gmlake_daemon
        | trace (PyTorch default, and its allocations written to $OUT/WORKLOAD.trace.gz)
gmlake_daemon needs a daemon: `table` starts one (GMLAKED=path to gmlaked).
"""
import json, os, random, statistics, subprocess, sys, tempfile, time

T0 = time.time()  # the process's start: setup_s in a run's result is the time to its first step

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
CONFIGS = ["default", "expandable", "gmlake_embedded", "gmlake_daemon", "gmlake_daemon_cold"]
WORKLOADS = ["gpt2_ckpt", "llama_lora", "vit_train"]


def run_one(workload, config, steps=None):
    for kv in config.split("+")[1:]:  # e.g. gmlake_embedded+GMLAKE_CHUNK_SIZE=8388608: a variant
        k, v = kv.split("=", 1)
        os.environ[k] = v
    cpus = parse_cpus(os.environ.get("GMLAKE_BENCH_CPUS", ""))  # e.g. 4-7 or 1,3,8-9: these cores only
    if cpus:
        os.sched_setaffinity(0, cpus)
    if config == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if config.endswith("_8m"):
        os.environ["GMLAKE_CHUNK_SIZE"] = str(8 << 20)
    if config.startswith("gmlake"):
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gmlake
        gmlake.enable(mode="daemon" if config.startswith("gmlake_daemon") else "embedded")
    import torch
    if config == "trace":  # PyTorch default, recording every allocation (see write_trace)
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=8_000_000)
    rng = random.Random(1234)
    if os.environ.get("GMLAKE_BENCH_FIXED") == "1":  # every step the same shapes (the middle of each choice)
        class Fixed(random.Random):
            def choice(self, seq):
                return seq[len(seq) // 2]

            def randrange(self, start, stop=None, step=1):
                return start + ((stop - start) // step // 2) * step
        rng = Fixed(1234)
    torch.manual_seed(1234)
    dev = "cuda"
    total_mem = torch.cuda.mem_get_info()[1]
    free0 = torch.cuda.mem_get_info()[0]
    min_free = [free0]

    def gpt2_ckpt():
        from transformers import GPT2Config, GPT2LMHeadModel
        m = GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024)).to(dev)
        m.gradient_checkpointing_enable(); m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        def step(i):
            b, s = rng.choice([4, 6, 8]), rng.randrange(128, 1025, 64)
            x = torch.randint(0, 50257, (b, s), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(input_ids=x, labels=x).loss
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
            return loss.item()
        return step, 24

    def llama_lora():
        from transformers import LlamaConfig, LlamaForCausalLM
        from peft import LoraConfig, get_peft_model
        cfg = LlamaConfig(hidden_size=2048, intermediate_size=5504, num_hidden_layers=16, num_attention_heads=16,
                          num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
        m = LlamaForCausalLM(cfg).to(dev, dtype=torch.bfloat16)
        m.gradient_checkpointing_enable(); m.enable_input_require_grads()
        m = get_peft_model(m, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
        def step(i):
            b, s = rng.choice([2, 4, 6]), rng.randrange(256, 2049, 128)
            x = torch.randint(0, 32000, (b, s), device=dev)
            loss = m(input_ids=x, labels=x).loss
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
            return loss.item()
        return step, 16

    def vit_train():
        import timm
        m = timm.create_model("vit_base_patch16_224", pretrained=False).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        def step(i):
            b = rng.choice([32, 48, 64, 96, 128])
            x = torch.randn(b, 3, 224, 224, device=dev); y = torch.randint(0, 1000, (b,), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
            return loss.item()
        return step, 30

    def alloc_micro():
        # the allocator's CPU cost as PyTorch sees it: 20,000 torch.empty per step, sizes as in
        # training (512 B .. 64 MiB), 256 live at a time; no kernels
        sizes = [rng.choice([512, 4096, 65536, 1 << 20, 3 << 20, 8 << 20, 24 << 20, 64 << 20]) for _ in range(4096)]
        live = [None] * 256
        def step(i):
            for k in range(20000):
                live[(k * 7919) % 256] = torch.empty(sizes[(k + i) % 4096], dtype=torch.uint8, device=dev)
            return 0.0
        return step, 12

    def alloc_steady():
        # the per-call cost once the cache holds every layout: 20,000 torch.empty + free per step
        # of sizes that repeat (512 B .. 8 MiB), 64 live; after the first step nothing is mapped,
        # so ms/step / 20 is the microseconds one allocate + free takes, PyTorch's own share included
        sizes = [rng.choice([512, 4096, 65536, 262144, 1 << 20, 2 << 20, 4 << 20, 8 << 20]) for _ in range(64)]
        live = [None] * 64
        def step(i):
            for k in range(20000):
                live[k % 64] = torch.empty(sizes[(k + k // 64) % 64], dtype=torch.uint8, device=dev)
            return 0.0
        return step, 12

    step, n = {"gpt2_ckpt": gpt2_ckpt, "llama_lora": llama_lora, "vit_train": vit_train,
               "alloc_micro": alloc_micro, "alloc_steady": alloc_steady}[workload]()
    # GMLAKE_BENCH_STEPS=N: N steps instead of the workload's default (the same shapes first,
    # then more drawn from the same generator: a longer run of the same training)
    n = steps or int(os.environ.get("GMLAKE_BENCH_STEPS", "0")) or n
    barrier = os.environ.get("GMLAKE_BENCH_BARRIER")  # "DIR:N": start stepping when N processes are ready
    if barrier:
        bdir, bn = barrier.rsplit(":", 1)
        open(os.path.join(bdir, "ready.%d" % os.getpid()), "w").close()
        while len([f for f in os.listdir(bdir) if f.startswith("ready.")]) < int(bn):
            time.sleep(0.05)
    # GMLAKE_BENCH_LOCKSTEP=1 (bench/lockstep.py): each step waits for a line on stdin and says
    # "STEP i ms" when done, so several configs' processes take turns step by step on one GPU
    lockstep = os.environ.get("GMLAKE_BENCH_LOCKSTEP") == "1"
    if lockstep:
        print("READY %d" % n, flush=True)
    times, losses, trace = [], [], []
    t_start = time.time()
    gm = None
    if config.startswith("gmlake"):
        import gmlake as gm
    step_us = []
    # the CPU's speed beside each step (these steps are bound by Python's kernel launches, and one
    # process's CPU runs up to ~15% slower than the next one's here): a fixed pure-Python loop, timed
    probe = []
    # GMLAKE_BENCH_RESET_PEAK_AT=K: the peaks again from step K on (after warm-up and a plan taken:
    # peak_*_steady; torch.cuda.reset_peak_memory_stats, which every config's allocator serves)
    reset_at = int(os.environ.get("GMLAKE_BENCH_RESET_PEAK_AT", "-1"))
    for i in range(n):
        if i == reset_at:
            torch.cuda.reset_peak_memory_stats()
        step_us.append(time.time_ns() // 1000)
        s0 = gm.stats() if gm and i else None
        prof = None
        if os.environ.get("GMLAKE_BENCH_PROFILE_STEP") == str(i):  # where a step's time goes
            from torch.profiler import profile, ProfilerActivity
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.__enter__()
        if lockstep and sys.stdin.readline().strip() != "go":
            break
        torch.cuda.synchronize()
        probe.append(cpu_probe())
        t = time.perf_counter()
        losses.append(step(i))
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3
        if lockstep:
            print("STEP %d %.3f" % (i, ms), flush=True)
        if prof:
            prof.__exit__(None, None, None)
            ka = prof.key_averages()
            for key in ("self_cpu_time_total", "self_cuda_time_total"):
                print("PROFILE step %d %s, by %s:\n%s" % (i, config, key, ka.table(sort_by=key, row_limit=12)),
                      file=sys.stderr, flush=True)
        if i >= 2:
            times.append(ms)
        if s0:
            s1 = gm.stats()
            trace.append((round(ms, 1), s1["maps"] - s0["maps"], s1["unmaps"] - s0["unmaps"], s1["syncs"] - s0["syncs"],
                          s1["lease_calls"] - s0["lease_calls"], s1["access_calls"] - s0["access_calls"],
                          s1["alloc_count"] - s0["alloc_count"], s1["mapped_allocs"] - s0["mapped_allocs"],
                          s1["headroom_leased"] - s0["headroom_leased"],
                          round((s1["map_ns"] - s0["map_ns"]) / 1e6, 2), round((s1["malloc_ns"] - s0["malloc_ns"]) / 1e6, 2)))
        else:
            trace.append(round(ms, 1))
        min_free[0] = min(min_free[0], torch.cuda.mem_get_info()[0])
    res = dict(workload=workload, config=config, ms_per_step=round(statistics.median(times), 2),
               ms_mean=round(statistics.mean(times), 2),
               losses=[round(x, 6) for x in losses[:4]], seconds=round(time.time() - t_start, 1), setup_s=round(t_start - T0, 1),
               driver_used_peak=free0 - min_free[0] if config.startswith("gmlake") and not lockstep else None,
               steps=trace, cpu_probe_us=round(statistics.median(probe[2:] or probe), 1),
               probe_us=[round(x, 1) for x in probe])  # each step's probe, for a per-step CPU adjustment
    if config.startswith("gmlake"):
        import gmlake
        st = gmlake.stats()
        if os.environ.get("GMLAKE_TIMING"):  # time inside our malloc, median over steps >= 2 (ms)
            res["malloc_ms"] = statistics.median(x[10] for x in trace[2:] if isinstance(x, tuple))
        res.update(peak_allocated=st["peak_allocated"], peak_reserved=st["peak_reserved"], mode=st["mode"],
                   maps=st["maps"], unmaps=st["unmaps"], syncs=st["syncs"], chunks_leased=st["chunks_leased"],
                   access_calls=st["access_calls"])
    else:
        st = torch.cuda.memory_stats()
        res.update(peak_allocated=st["allocated_bytes.all.peak"], peak_reserved=st["reserved_bytes.all.peak"])
    if 0 <= reset_at < n:
        res["peak_allocated_steady"] = torch.cuda.max_memory_allocated()
        res["peak_reserved_steady"] = torch.cuda.max_memory_reserved()
        res["steady_from"] = reset_at
    if config.startswith("gmlake"):
        res["plan"] = {k: v for k, v in gmlake.stats().items() if k.startswith("plan")}
    res["allocs"] = torch.cuda.memory_stats().get("allocation.all.allocated")  # allocations in the run
    res["threads"] = thread_cpu()
    res["frag"] = round(1 - res["peak_allocated"] / res["peak_reserved"], 4)
    res["ratio"] = round(res["peak_reserved"] / res["peak_allocated"], 4)
    if config == "trace":
        res["trace"] = write_trace(torch, workload, res, step_us)
    print("RESULT " + json.dumps(res), flush=True)


def thread_cpu(pid="self"):
    """The process's threads that used CPU (name, seconds user+system, involuntary switches),
    busiest first, and how many CPUs the process may run on: where a run's CPU went."""
    out, hz = [], os.sysconf("SC_CLK_TCK")
    main = os.getpid() if pid == "self" else pid
    for tid in os.listdir("/proc/%s/task" % pid):
        try:
            st = open("/proc/%s/task/%s/stat" % (pid, tid)).read()
            name, rest = st[st.index("(") + 1:st.rindex(")")], st[st.rindex(")") + 2:].split()
            sw = [l for l in open("/proc/%s/task/%s/status" % (pid, tid)) if l.startswith("nonvoluntary_ctxt_switches")]
            out.append((name, round((int(rest[11]) + int(rest[12])) / hz, 2), int(sw[0].split()[1]) if sw else -1,
                        int(tid) == main))
        except (OSError, ValueError, IndexError):
            pass
    out.sort(key=lambda t: -t[1])
    return dict(cpus=len(os.sched_getaffinity(0 if pid == "self" else pid)), n=len(out), busiest=out[:6],
                total_s=round(sum(t[1] for t in out), 2))


def parse_cpus(text):
    """'4-7' or '1,3,8-9' -> [cores]; '' or 'auto...' -> [] (auto is chosen per run by table)"""
    if not text or text.startswith("auto"):
        return []
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def fastest_cores(k):
    """The k cores running the CPU probe fastest now, pinned to each in turn (bench/cpu_cores.py
    found cores of the H100 host 1.2-1.9x slower than the others, the same ones call after call:
    a run's Python thread landing on one made its steps that much slower, whatever the allocator).
    Every configuration is pinned the same way, so the comparison stays fair."""
    speed = core_speeds(25)
    best = sorted(speed, key=lambda c: speed[c])[:k]
    return sorted(best), [round(speed[c], 1) for c in sorted(best)], round(max(speed.values()), 1)


def core_speeds(n, skip=0):
    """{core: median of the CPU probe's n runs (the first skip left out), pinned to that core},
    over the cores this process may use; its affinity as it was after."""
    cores = sorted(os.sched_getaffinity(0))
    speed = {}
    for c in cores:
        os.sched_setaffinity(0, [c])
        speed[c] = statistics.median([cpu_probe() for _ in range(n)][skip:])
    os.sched_setaffinity(0, cores)
    return speed


def cpu_probe():
    t = time.perf_counter()
    x = 0
    for i in range(20000):
        x += i * i
    return (time.perf_counter() - t) * 1e6


def parse_size(s):
    """'16GiB', '512MiB', '1.5G' or bytes -> bytes (the daemon's size syntax)."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().replace("iB", "").replace("B", "")
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def lake_created(st, preallocate_bytes):
    """Has the daemon whose stats are st created its --preallocate? It creates whole chunks, as
    many as fit (preallocate_bytes // chunk_size): 16 GiB of 6 MiB chunks is 2730 of them, 16380
    MiB, so waiting for the bytes themselves waited out its whole time (lake_warmup_s 60.x, run70)."""
    return bool(st) and st["chunks_total"] >= preallocate_bytes // st["chunk_size"]


class Daemon:
    def __init__(self, limit=None, preallocate=None):
        self.dir = tempfile.mkdtemp(prefix="gmlake-bench.")
        self.sock = os.path.join(self.dir, "lake.sock")
        self.ctl = "ipc://" + os.path.join(self.dir, "lake.ctl")
        backend = os.environ.get("GMLAKE_BENCH_BACKEND", "cuda")  # host: tests/run.sh checks the class without a GPU
        args = [os.path.join(BUILD, "gmlaked"), "--backend", backend, "--socket", self.sock, "--control", self.ctl,
                "--log-level", "warn", "--prefetch", os.environ.get("GMLAKE_BENCH_PREFETCH", "1GiB")]
        if limit:
            args += ["--limit", str(limit)]
        if preallocate:
            args += ["--preallocate", preallocate]
        self.log = open(os.path.join(self.dir, "daemon.log"), "w")
        # the daemon runs where the system puts it (a service beside the training), unless told:
        # GMLAKE_BENCH_DAEMON_CPUS=same (the training's cores) or a list
        dc = os.environ.get("GMLAKE_BENCH_DAEMON_CPUS", "")
        pin = parse_cpus(os.environ.get("GMLAKE_BENCH_PIN", "") or os.environ.get("GMLAKE_BENCH_CPUS", "") if dc == "same" else dc)
        self.p = subprocess.Popen(args, stderr=self.log, preexec_fn=(lambda: os.sched_setaffinity(0, pin)) if pin else None)
        for _ in range(200):
            if os.path.exists(self.sock):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("gmlaked did not start: " + open(self.log.name).read())
        if preallocate:  # a warm lake: wait until the daemon created it
            want = parse_size(preallocate)
            t0 = time.time()
            self.warm = False
            while time.time() - t0 < 60 and not self.warm:
                out = self.ctl_cmd("stats", "--json")
                self.warm = lake_created(json.loads(out) if out else None, want)
                if not self.warm:
                    time.sleep(0.2)
            self.warm_s = round(time.time() - t0, 1)
            if not self.warm:
                print("torch_bench: the daemon did not create --preallocate %s within 60 s" % preallocate, file=sys.stderr)
        self.cpu0 = thread_cpu(self.p.pid)["total_s"]  # what the start and the lake's creation cost

    def ctl_cmd(self, *args):
        return subprocess.run([os.path.join(BUILD, "gmlakectl"), "--control", self.ctl, *args],
                              capture_output=True, text=True).stdout

    def stop(self):
        try:  # the daemon's own CPU over its life (a run's lake warm-up included): what serving cost
            self.cpu = thread_cpu(self.p.pid)
            self.cpu["during_run_s"] = round(self.cpu["total_s"] - self.cpu0, 2)
        except OSError:
            self.cpu = None
        self.p.terminate(); rc = self.p.wait(30); self.log.close()
        return rc


def write_trace(torch, workload, res, step_us):
    """$OUT/WORKLOAD.trace.gz in the format of tests/traces/README.md, with a line 's' where
    each step begins (from the events' times), for gmlake-replay --steps."""
    snap = torch.cuda.memory._snapshot()
    tr = snap["device_traces"][torch.cuda.current_device()]
    path = os.path.join(os.environ.get("OUT", "."), workload + ".trace.gz")
    live, nxt, k = {}, 0, 0
    import gzip
    with gzip.open(path, "wt", compresslevel=9) as f:
        f.write("# workload=%s steps=%d torch=%s (bench/torch_bench.py run %s trace: alloc and free_completed of "
                "torch's caching allocator)\n" % (workload, len(step_us), torch.__version__, workload))
        f.write("# torch_default    peak_allocated=%d peak_reserved=%d ms_per_step=%.2f\n" % (
            res["peak_allocated"], res["peak_reserved"], res["ms_per_step"]))
        for e in tr:
            while k < len(step_us) and e.get("time_us", 0) >= step_us[k]:
                f.write("s\n"); k += 1
            a = e["action"]
            if a == "alloc":
                live[e["addr"]] = nxt; f.write("a %d %d %d\n" % (nxt, e["size"], e["stream"])); nxt += 1
            elif a == "free_completed":
                i = live.pop(e["addr"], None)
                if i is not None: f.write("f %d\n" % i)
    return dict(path=path, allocs=nxt, events=len(tr), steps_marked=k)


def spawn(workload, config, env_extra=None, steps=None, stdin=None, stderr=subprocess.PIPE):
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_extra or {}))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    args = [sys.executable, os.path.abspath(__file__), "run", workload, config] + ([str(steps)] if steps else [])
    return subprocess.Popen(args, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, text=True)


def pin_now():
    """GMLAKE_BENCH_CPUS=auto or auto:K: the K fastest cores now (default 4) into GMLAKE_BENCH_PIN,
    and their record for a result's "pinned"; None when not auto."""
    pin = os.environ.get("GMLAKE_BENCH_CPUS", "")
    if not pin.startswith("auto"):
        return None
    cores, speeds, slowest = fastest_cores(int(pin.partition(":")[2] or 4))
    os.environ["GMLAKE_BENCH_PIN"] = ",".join(map(str, cores))
    return dict(cores=cores, probe_us=speeds, slowest_core_us=slowest)


def daemon_for(config):
    """The daemon a config runs through: a warm lake (--preallocate) for gmlake_daemon, a cold one
    for gmlake_daemon_cold, else None."""
    base = config.split("+")[0]
    return (Daemon(preallocate=os.environ.get("GMLAKE_BENCH_PREALLOC", "16GiB")) if base == "gmlake_daemon"
            else Daemon() if base == "gmlake_daemon_cold" else None)


def daemon_done(d, r):
    """Stops d; what it cost goes into the run's result r."""
    r["daemon_exit"] = d.stop()
    r["daemon_cpu"] = d.cpu
    r["lake_warmup_s"] = getattr(d, "warm_s", None)


def collect(p):
    out, err = p.communicate()
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (err or out)[-1500:]}


def save(rows):
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, os.environ.get("BENCH_JSON", "torch_bench.json")), "w") as f:
            json.dump(rows, f, indent=1)


def table(workloads):
    rows = []
    repeats = int(os.environ.get("GMLAKE_BENCH_REPEATS", "1"))
    configs = [c for c in os.environ.get("GMLAKE_BENCH_CONFIGS", ",".join(CONFIGS)).split(",")]
    for w in workloads:
        # runs of one workload interleaved, the order rotated each repeat (ABC BCA CAB): the GPU's
        # speed drifts between processes, and no config should always run in the same place
        order = [(r, configs[(r + j) % len(configs)]) for r in range(repeats) for j in range(len(configs))]
        if os.environ.get("GMLAKE_BENCH_ROTATE", "1") == "0":
            order = [(r, c) for r in range(repeats) for c in configs]
        for rep, c in order:
            pinned = pin_now()  # for this run
            d = daemon_for(c)
            env = {"GMLAKE_SOCKET": d.sock} if d else {}
            if pinned:
                env["GMLAKE_BENCH_CPUS"] = os.environ["GMLAKE_BENCH_PIN"]
            r = collect(spawn(w, c, env))
            if pinned:
                r["pinned"] = pinned
            if d:
                daemon_done(d, r)
            r.setdefault("workload", w); r.setdefault("config", c); r["repeat"] = rep
            rows.append(r)
            print(json.dumps(r), flush=True)
            save(rows)  # after every run: a stage stopped at its time limit keeps what it measured
    print()
    hdr = "%-11s %-18s %10s %10s %7s %7s %9s %8s %8s %9s %8s %s" % (
        "workload", "allocator", "peak_alloc", "peak_resv", "resv/al", "frag", "ms/step", "vs_def", "by_rep", "mean_ms",
        "vs_def", "losses (vs default)")
    print(hdr); print("-" * len(hdr))
    # one row per (workload, config): the median over repeats of each run's median ms/step
    merged = {}
    for r in rows:
        if "error" in r:
            merged.setdefault((r["workload"], r["config"]), r)
            continue
        m = merged.setdefault((r["workload"], r["config"]), dict(r, runs_ms=[], runs_mean=[]))
        m["runs_ms"].append(r["ms_per_step"])
        m["runs_mean"].append(r.get("ms_mean"))
        m["peak_reserved"] = max(m["peak_reserved"], r["peak_reserved"])
        m["ratio"] = round(m["peak_reserved"] / m["peak_allocated"], 4)
        m["frag"] = round(1 - m["peak_allocated"] / m["peak_reserved"], 4)
    for m in merged.values():
        if "runs_ms" in m:
            m["ms_per_step"] = round(statistics.median(m["runs_ms"]), 2)
            m["ms_mean"] = round(statistics.median(m["runs_mean"]), 2)
    base = {k[0]: m for k, m in merged.items() if k[1] == "default" and "error" not in m}
    # by_rep: each run against the default run of the same repeat (run minutes apart, so
    # drift of the machine cancels), the median of those ratios
    by_rep = {}
    for r in rows:
        d = [x for x in rows if x["workload"] == r["workload"] and x["config"] == "default" and x["repeat"] == r["repeat"]]
        if "error" not in r and d and "error" not in d[0]:
            by_rep.setdefault((r["workload"], r["config"]), []).append(r["ms_per_step"] / d[0]["ms_per_step"])
    for k, v in by_rep.items():
        if k in merged and "error" not in merged[k]:
            merged[k]["by_repeat"] = [round(x, 3) for x in v]
    for r in merged.values():
        if "error" in r:
            print("%-11s %-16s ERROR %s" % (r["workload"], r["config"], r["error"][-300:].replace("\n", " | ")))
            continue
        b = base.get(r["workload"])
        rel = r["ms_per_step"] / b["ms_per_step"] if b else float("nan")
        relm = r["ms_mean"] / b["ms_mean"] if b else float("nan")
        same = "same" if b and r["losses"] == b["losses"] else "DIFF"
        rep = statistics.median(r["by_repeat"]) if r.get("by_repeat") else float("nan")
        print("%-11s %-18s %9.2fG %9.2fG %7.3f %6.1f%% %9.1f %7.3fx %7.3fx %9.1f %7.3fx %-5s runs %s by_rep %s" % (
            r["workload"], r["config"], r["peak_allocated"] / 2**30, r["peak_reserved"] / 2**30, r["ratio"],
            100 * r["frag"], r["ms_per_step"], rel, rep, r["ms_mean"], relm, same, r["runs_ms"], r.get("by_repeat")))
    return rows


def shared():
    """Two trainings through one daemon, lake limited below the sum of their separate peaks."""
    sep = {}
    for w in ("gpt2_ckpt", "vit_train"):
        d = Daemon()
        sep[w] = collect(spawn(w, "gmlake_daemon", {"GMLAKE_SOCKET": d.sock}, steps=8)); d.stop()
    need = sum(r["peak_reserved"] for r in sep.values())
    limit = int(need * 0.9) // (2 << 20) * (2 << 20)
    d = Daemon(limit=limit)
    env = {"GMLAKE_SOCKET": d.sock, "GMLAKE_BENCH_BARRIER": d.dir + ":2"}
    ps = [spawn("gpt2_ckpt", "gmlake_daemon", env, steps=8), spawn("vit_train", "gmlake_daemon", env, steps=8)]
    seen, most = "", 0
    while any(p.poll() is None for p in ps):
        out = d.ctl_cmd("clients")
        rows = len([l for l in out.splitlines() if l[:1].isdigit()])
        if rows > most:
            seen, most = out, rows
        time.sleep(0.1)
    res = [collect(p) for p in ps]
    stats = d.ctl_cmd("stats")
    d.stop()
    print("separate peaks (reserved): %s; sum %.2f GiB; lake limit %.2f GiB (90%%)" % (
        {k: round(v.get("peak_reserved", 0) / 2**30, 2) for k, v in sep.items()}, need / 2**30, limit / 2**30))
    for r in res:
        print("together: %s" % json.dumps(r))
    print("gmlakectl clients while both ran:\n" + seen)
    print("gmlakectl stats at the end:\n" + stats)
    ok = all("error" not in r for r in res) and most == 2
    print("SHARED %s" % ("PASS: both finished, both listed by gmlakectl clients at once" if ok else
                         "FAIL (clients seen at once: %d)" % most))
    return ok


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run_one(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else None)
    elif sys.argv[1] == "table":
        save(table(sys.argv[2:] or WORKLOADS))
    elif sys.argv[1] == "shared":
        sys.exit(0 if shared() else 1)
