"""Pool bench/torch_bench.py runs of one workload from several calls (each call's
runs interleaved default / gmlake configs; repeats pair by call and repeat index).

  python3 bench/pool.py bench/results/runA/torch_W.json bench/results/runB/torch_W.json ...

Per config: every run's median ms/step; the median of those ("ms/step"), its ratio
to default's; the median of the per-repeat ratios to the default run of the same
repeat ("by_rep", drift between calls cancels); mean ms/step likewise; and the
share of repeats in which the config was within 3% of default or faster.
"""
import json, statistics as S, sys

runs = {}
for k, f in enumerate(sys.argv[1:]):
    for r in json.load(open(f)):
        if "error" in r or "ms_per_step" not in r:
            continue
        runs.setdefault(r["config"], {})[(k, r.get("repeat", 0))] = r
base = runs.get("default", {})
bm = S.median(r["ms_per_step"] for r in base.values())
bmean = S.median(r["ms_mean"] for r in base.values())
for c, rr in runs.items():
    med = S.median(r["ms_per_step"] for r in rr.values())
    mean = S.median(r["ms_mean"] for r in rr.values())
    rep = [r["ms_per_step"] / base[key]["ms_per_step"] for key, r in rr.items() if key in base]
    within = sum(x <= 1.03 for x in rep)
    ratio = max(r["peak_reserved"] / r["peak_allocated"] for r in rr.values())
    same = all(r["losses"] == base[key]["losses"] for key, r in rr.items() if key in base)
    print("%-16s runs %2d  ms/step %6.1f  vs default %.3fx  by_rep median %.3fx (%d of %d <= 1.03)  mean %.3fx  "
          "resv/alloc max %.3f  losses %s" % (c, len(rr), med, med / bm, S.median(rep), within, len(rep),
                                             mean / bmean, ratio, "same" if same else "DIFF"))
    # per CPU speed: ms/step over the run's cpu probe (runs that recorded one), against default's
    norm = lambda rs: [r["ms_per_step"] / r["cpu_probe_us"] for r in rs if r.get("cpu_probe_us")]
    n, nb = norm(rr.values()), norm(base.values())
    if n and nb:
        print("%-16s runs %2d  per CPU speed (ms/step / probe) vs default %.3fx  (each run: %s)" % (
            "", len(n), S.median(n) / S.median(nb), ", ".join("%.3f" % (x / S.median(nb)) for x in n)))

# CPU-adjusted: these steps are bound by Python's kernel launches, and a run's CPU probe
# (a fixed pure-Python loop timed before each step, outside the allocator) spreads 0.85-1.75 ms
# between runs of one config. A common-slope fit log(ms/step) = a_config + b*log(probe) over
# every run takes that out; exp(a_config - a_default) is the config's ratio at equal CPU speed,
# with a 90% interval from 2,000 resamplings of the runs within each config.
import math, random


def fit(groups):
    """groups: {config: [(log probe, log ms)]} -> (slope, {config: intercept})"""
    sxy = sxx = 0.0
    for pts in groups.values():
        mx = S.mean(p[0] for p in pts); my = S.mean(p[1] for p in pts)
        sxy += sum((x - mx) * (y - my) for x, y in pts); sxx += sum((x - mx) ** 2 for x, _ in pts)
    b = sxy / sxx if sxx else 0.0
    return b, {c: S.mean(p[1] for p in pts) - b * S.mean(p[0] for p in pts) for c, pts in groups.items()}


groups = {c: [(math.log(r["cpu_probe_us"]), math.log(r["ms_per_step"])) for r in rr.values() if r.get("cpu_probe_us")]
          for c, rr in runs.items()}
groups = {c: p for c, p in groups.items() if len(p) >= 2}  # a config with fewer probed runs is left out of the fit
if len(groups.get("default", [])) >= 2 and len(groups) > 1:
    b, a = fit(groups)
    rnd = random.Random(1)
    boot = {c: [] for c in groups}
    for _ in range(2000):
        _, ab = fit({c: [rnd.choice(p) for _ in p] for c, p in groups.items()})
        for c in groups:
            boot[c].append(math.exp(ab[c] - ab["default"]))
    print("CPU-adjusted (log ms/step = a_config + %.2f log probe, all runs):" % b)
    for c in groups:
        v = sorted(boot[c])
        print("  %-16s %.3fx at equal CPU speed  (90%%: %.3f-%.3f)" % (c, math.exp(a[c] - a["default"]),
                                                                   v[len(v) // 20], v[len(v) * 19 // 20]))
