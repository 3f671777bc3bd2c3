"""PyTorch's allocator and GMLake's taking turns, step by step, on one GPU.

  python3 bench/lockstep.py WORKLOAD                 GMLAKE_BENCH_REPEATS rounds of every config
  python3 bench/lockstep.py --pool FILE.json...      the pooled table of earlier runs

Each config (GMLAKE_BENCH_CONFIGS, default: default,gmlake_embedded,gmlake_daemon) trains in a
process of its own, as `torch_bench.py table` runs it, but all of them are started together, and
once they are set up this process lets one of them take one step at a time: step 0 of each, in
turn, then step 1 of each, the order rotated every step (ABC, BCA, CAB, ...). Every config's step
i has the same shapes (one seed), runs within a second of the others' step i, on the same cores
(GMLAKE_BENCH_CPUS=auto: the fastest now, chosen once for the round), while the others wait on
their stdin with the GPU idle. The host's CPU speed drifts by up to 1.9x between runs a minute
apart (BENCHMARKS.md, session 12) and these steps are bound by Python's kernel launches; taking
turns gives every step of a config a neighbour of the default's run under the same conditions,
so ms/step compares like with like. Results: $OUT/$BENCH_JSON (one row per config and round,
torch_bench's fields, "lockstep": true), then the table of --pool.
"""
import json, math, os, random, statistics as S, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench as tb


def read_until(p, prefix):
    """The child's next stdout line starting with prefix (other lines, e.g. library warnings,
    are skipped), or None when the child's stdout ended (it died)."""
    while True:
        line = p.stdout.readline()
        if not line:
            return None
        if line.startswith(prefix):
            return line.rstrip("\n")


def one_round(w, configs, rep):
    env_common = {"GMLAKE_BENCH_LOCKSTEP": "1"}
    pin = os.environ.get("GMLAKE_BENCH_CPUS", "")
    pinned = None
    if pin.startswith("auto"):  # the K fastest cores now, for every config of the round alike
        cores, speeds, slowest = tb.fastest_cores(int(pin.partition(":")[2] or 4))
        os.environ["GMLAKE_BENCH_PIN"] = env_common["GMLAKE_BENCH_CPUS"] = ",".join(map(str, cores))
        pinned = dict(cores=cores, probe_us=speeds, slowest_core_us=slowest)
    procs, daemons, errs = {}, {}, {}
    for c in configs:
        base = c.split("+")[0]
        d = (tb.Daemon(preallocate=os.environ.get("GMLAKE_BENCH_PREALLOC", "16GiB")) if base == "gmlake_daemon"
             else tb.Daemon() if base == "gmlake_daemon_cold" else None)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **env_common)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if d:
            env["GMLAKE_SOCKET"] = d.sock
            daemons[c] = d
        errs[c] = tempfile.TemporaryFile("w+")
        procs[c] = subprocess.Popen([sys.executable, tb.__file__, "run", w, c], env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=errs[c], text=True)
    steps, live = {}, []
    for c in configs:
        line = read_until(procs[c], "READY ")
        if line:
            steps[c] = int(line.split()[1]); live.append(c)
    n = min(steps.values()) if steps else 0
    for i in range(n):
        k = (i + rep) % len(live) if live else 0
        for c in live[k:] + live[:k]:
            p = procs[c]
            try:
                p.stdin.write("go\n"); p.stdin.flush()
            except BrokenPipeError:
                pass
            if read_until(p, "STEP ") is None:
                live.remove(c)
    rows = []
    for c in configs:
        p = procs[c]
        line = read_until(p, "RESULT ") if c in live else None
        try:
            p.stdin.close()
        except BrokenPipeError:
            pass
        try:
            p.wait(120)
        except subprocess.TimeoutExpired:
            p.kill(); p.wait()
        if line is None:
            errs[c].seek(0)
            r = {"error": errs[c].read()[-1500:] or "exit %s" % p.returncode}
        else:
            r = json.loads(line[7:])
        errs[c].close()
        if c in daemons:
            d = daemons[c]
            r["daemon_exit"] = d.stop(); r["daemon_cpu"] = d.cpu; r["lake_warmup_s"] = getattr(d, "warm_s", None)
        r.update(workload=w, config=c, repeat=rep, lockstep=True, order_offset=rep)
        if pinned:
            r["pinned"] = pinned
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


def step_ms(r):
    """A run's per-step milliseconds (torch_bench keeps a tuple per step for gmlake configs)."""
    return [x[0] if isinstance(x, list) else x for x in r["steps"]]


def pool(rows_by_file):
    """The table: per config, the median of its runs' median ms/step (torch_bench's ms/step)
    against default's; then over every step from the third on, paired with the default's step
    of the same round: the sum of the config's ms over the default's (sum_ratio: a mean, moved by
    a step the host slowed 2x) and the median of the per-step ratios (step_med), each with a 90%
    interval from 2,000 resamplings of whole runs (steps of one run share its conditions, so
    runs, not steps, are the unit resampled)."""
    runs = {}
    for k, rows in enumerate(rows_by_file):
        for r in rows:
            if "error" in r or "ms_per_step" not in r:
                print("%-18s repeat %s ERROR %s" % (r.get("config"), r.get("repeat"), str(r.get("error", ""))[-200:].replace("\n", " | ")))
                continue
            runs.setdefault(r["config"], {})[(k, r["repeat"])] = r
    base = runs.get("default", {})
    if not base:
        print("no default runs"); return
    bmed = S.median(r["ms_per_step"] for r in base.values())
    print("%-22s %4s %9s %8s %9s %-11s %9s %-11s %8s %8s %s" % ("config", "runs", "ms/step", "vs_def", "sum_ratio", "(90%)",
                                                                "step_med", "(90%)", "resv/al", "losses", "per run (sum ratio)"))
    for c, rr in runs.items():
        keys = [key for key in rr if key in base]
        pairs = {key: [(a, b) for a, b in zip(step_ms(rr[key])[2:], step_ms(base[key])[2:])] for key in keys}
        per_run = {key: sum(a for a, _ in p) / sum(b for _, b in p) for key, p in pairs.items() if p}
        allp = [x for p in pairs.values() for x in p]
        if not allp:
            continue
        tot = sum(a for a, _ in allp) / sum(b for _, b in allp)
        med_step = S.median(a / b for a, b in allp)
        rnd, boot, bmedian = random.Random(1), [], []
        for _ in range(2000):
            pick = [pairs[rnd.choice(keys)] for _ in keys]
            boot.append(sum(a for p in pick for a, _ in p) / sum(b for p in pick for _, b in p))
            bmedian.append(S.median(a / b for p in pick for a, b in p))
        boot.sort(); bmedian.sort()
        med = S.median(r["ms_per_step"] for r in rr.values())
        resv = max(r["peak_reserved"] / r["peak_allocated"] for r in rr.values())
        same = all(rr[key]["losses"] == base[key]["losses"] for key in keys)
        print("%-22s %4d %9.1f %7.3fx %8.3fx %.3f-%.3f %8.3fx %.3f-%.3f %8.3f %8s %s" % (
            c, len(rr), med, med / bmed, tot, boot[len(boot) // 20], boot[len(boot) * 19 // 20], med_step,
            bmedian[len(bmedian) // 20], bmedian[len(bmedian) * 19 // 20], resv,
            "same" if same else "DIFF", " ".join("%.3f" % v for v in per_run.values())))


def main():
    if sys.argv[1] == "--pool":
        pool([json.load(open(f)) for f in sys.argv[2:]])
        return
    w = sys.argv[1]
    configs = os.environ.get("GMLAKE_BENCH_CONFIGS", "default,gmlake_embedded,gmlake_daemon").split(",")
    if configs[0] != "default" and "default" in configs:
        configs.remove("default"); configs.insert(0, "default")
    rows = []
    for rep in range(int(os.environ.get("GMLAKE_BENCH_REPEATS", "1"))):
        rows += one_round(w, configs, rep)
        tb.save(rows)  # after every round: a call stopped at its limit keeps what it measured
    print()
    pool([rows])


if __name__ == "__main__":
    main()
