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
apart (bench/results/history.md, session 12) and these steps are bound by Python's kernel launches; taking
turns gives every step of a config a neighbour of the default's run under the same conditions,
so ms/step compares like with like. The rotation starts at a random place each call
(GMLAKE_BENCH_LOCKSTEP_OFFSET=K: at K), so no config always takes a fresh round's one-off costs.
Results: $OUT/$BENCH_JSON (one row per config and round, torch_bench's fields, "lockstep": true),
then the table of --pool and its two subsets (`--pool [--fast-us N] FILE...`).
"""
import json, os, random, statistics as S, subprocess, sys, tempfile, threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench as tb


STEP_LIMIT_S = 600  # a child silent this long (a hung step, a wedged daemon) is killed, the round goes on


def read_until(p, prefix, limit_s=STEP_LIMIT_S):
    """The child's next stdout line starting with prefix (other lines, e.g. library warnings,
    are skipped), or None when the child's stdout ended (it died, or was killed after limit_s)."""
    watchdog = threading.Timer(limit_s, p.kill)
    watchdog.start()
    try:
        while True:
            line = p.stdout.readline()
            if not line:
                return None
            if line.startswith(prefix):
                return line.rstrip("\n")
    finally:
        watchdog.cancel()


def one_round(w, configs, rep, offset):
    env_common = {"GMLAKE_BENCH_LOCKSTEP": "1"}
    pinned = tb.pin_now()  # for every config of the round alike
    if pinned:
        env_common["GMLAKE_BENCH_CPUS"] = os.environ["GMLAKE_BENCH_PIN"]
    procs, daemons, errs = {}, {}, {}
    for c in configs:
        d = tb.daemon_for(c)
        env = dict(env_common)
        if d:
            env["GMLAKE_SOCKET"] = d.sock
            daemons[c] = d
        errs[c] = tempfile.TemporaryFile("w+")  # a file: a pipe left unread could fill and stop the child
        procs[c] = tb.spawn(w, c, env, stdin=subprocess.PIPE, stderr=errs[c])
    steps, live = {}, []
    for c in configs:
        line = read_until(procs[c], "READY ")
        if line:
            steps[c] = int(line.split()[1]); live.append(c)
    n = min(steps.values()) if steps else 0
    for i in range(n):
        k = (i + offset) % len(live) if live else 0
        for c in live[k:] + live[:k]:
            p = procs[c]
            try:
                p.stdin.write("go\n"); p.stdin.flush()
            except BrokenPipeError:
                pass
            line = read_until(p, "STEP ")
            if line is None or int(line.split()[1]) != i:  # dead, or out of step with the others
                live.remove(c)
                if line:
                    p.kill()
    for c in configs:  # a child told to take more steps than the others ends its loop here
        try:
            procs[c].stdin.close()
        except BrokenPipeError:
            pass
    rows = []
    for c in configs:
        p = procs[c]
        line = read_until(p, "RESULT ") if c in live else None
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
            tb.daemon_done(daemons[c], r)
        r.update(workload=w, config=c, repeat=rep, lockstep=True, order_offset=offset)
        if pinned:
            r["pinned"] = pinned
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


def step_ms(r):
    """A run's per-step milliseconds (torch_bench keeps a tuple per step for gmlake configs)."""
    return [x[0] if isinstance(x, list) else x for x in r["steps"]]


def sum_ratio(runs):
    """runs: lists of (config ms, default ms) steps -> the config's summed ms over the default's."""
    return sum(a for p in runs for a, _ in p) / sum(b for p in runs for _, b in p)


def step_median(runs):
    return S.median(a / b for p in runs for a, b in p)


def intervals(runs, stats, n=2000):
    """90% interval of each stat (a function of a list of runs) over n resamplings of whole runs
    (steps of one run share its conditions), one resampling serving every stat."""
    rnd, vals = random.Random(1), [[] for _ in stats]
    for _ in range(n):
        pick = [runs[rnd.randrange(len(runs))] for _ in runs]
        for v, f in zip(vals, stats):
            v.append(f(pick))
    return [(sorted(v)[n // 20], sorted(v)[n * 19 // 20]) for v in vals]


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
        runs_c = [[(a, b) for a, b in zip(step_ms(rr[key])[2:], step_ms(base[key])[2:])] for key in keys]
        if not any(runs_c):
            continue
        (slo, shi), (mlo, mhi) = intervals(runs_c, (sum_ratio, step_median))
        med = S.median(r["ms_per_step"] for r in rr.values())
        resv = max(r["peak_reserved"] / r["peak_allocated"] for r in rr.values())
        same = all(rr[key]["losses"] == base[key]["losses"] for key in keys)
        print("%-22s %4d %9.1f %7.3fx %8.3fx %.3f-%.3f %8.3fx %.3f-%.3f %8.3f %8s %s" % (
            c, len(rr), med, med / bmed, sum_ratio(runs_c), slo, shi, step_median(runs_c), mlo, mhi, resv,
            "same" if same else "DIFF", " ".join("%.3f" % sum_ratio([p]) for p in runs_c if p)))


def sensitivity(rows_by_file, fast_us):
    """The paired sum ratio again on two subsets, with its 90% interval over rounds: leaving out
    each call's first round (one-off costs of a fresh machine that a fixed rotation put on one
    config), and only the steps both of whose CPU probes were fast (< fast_us: the host's cores
    flip between ~1 ms and ~1.7 ms on the probe from one step to the next)."""
    rounds = []
    for rows in rows_by_file:
        by = {}
        for r in rows:
            if "error" not in r and "ms_per_step" in r:
                by.setdefault(r["repeat"], {})[r["config"]] = r
        rounds += [(rep, by[rep]) for rep in sorted(by) if "default" in by[rep]]
    configs = [c for c in (rounds[0][1] if rounds else {}) if c != "default"]
    for c in configs:
        out = []
        for name, keep in (("first round of each call left out", lambda rep, i, pa, pb: rep > 0),
                           ("steps with both probes < %d us" % fast_us, lambda rep, i, pa, pb: pa < fast_us and pb < fast_us)):
            per = []
            for rep, rd in rounds:
                if c not in rd:
                    continue
                a, b, pa, pb = step_ms(rd[c]), step_ms(rd["default"]), rd[c].get("probe_us"), rd["default"].get("probe_us")
                if pa is None or pb is None:
                    continue
                p = [(a[i], b[i]) for i in range(2, min(len(a), len(b))) if keep(rep, i, pa[i], pb[i])]
                if p:
                    per.append(p)
            if not per:
                continue
            (lo, hi), = intervals(per, (sum_ratio,))
            out.append("%s: %.3fx (%.3f-%.3f, %d steps)" % (name, sum_ratio(per), lo, hi, sum(map(len, per))))
        print("%-22s sum_ratio, %s" % (c, "; ".join(out)))


def main():
    if sys.argv[1] == "--pool":  # --pool [--fast-us N] FILE...
        args, fast = sys.argv[2:], 1300
        if args[:1] == ["--fast-us"]:
            fast, args = int(args[1]), args[2:]
        data = [json.load(open(f)) for f in args]
        pool(data)
        sensitivity(data, fast)
        return
    w = sys.argv[1]
    configs = os.environ.get("GMLAKE_BENCH_CONFIGS", "default,gmlake_embedded,gmlake_daemon").split(",")
    if configs[0] != "default" and "default" in configs:
        configs.remove("default"); configs.insert(0, "default")
    rows = []
    # the order's rotation starts at a random offset each call (GMLAKE_BENCH_LOCKSTEP_OFFSET=K: at K):
    # with a fixed start, each call's first round had the daemon step first at step 2, and a one-off
    # cost of the call's first round at that step (2.7-3.0x the default's step in run83, run85, run87)
    # fell on the daemon every time
    start = int(os.environ.get("GMLAKE_BENCH_LOCKSTEP_OFFSET", random.randrange(len(configs))))
    for rep in range(int(os.environ.get("GMLAKE_BENCH_REPEATS", "1"))):
        rows += one_round(w, configs, rep, start + rep)
        tb.save(rows)  # after every round: a call stopped at its limit keeps what it measured
    print()
    pool([rows])
    sensitivity([rows], 1300)


if __name__ == "__main__":
    main()
