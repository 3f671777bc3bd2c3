"""Per-step comparison of torch_bench.py runs against PyTorch default.

  python3 bench/paired.py bench/results/runN/torch_WORKLOAD.json...

Every config runs the same shapes in the same order, so step i of one config
compares with step i of default. For each config: the per-step median over
its runs, then the median of the per-step ratios to default ("paired") and
the ratio of their sums; and per run, the median ratio over the steps on which
that config made no chunk mapping in any run (what the allocator costs when
it calls no driver function).
"""
import json, statistics as S, sys


def step_ms(x):
    return x[0] if isinstance(x, list) else x


for f in sys.argv[1:]:
    runs, maps = {}, {}
    for r in json.load(open(f)):
        if "steps" not in r:
            continue
        runs.setdefault(r["config"], []).append([step_ms(x) for x in r["steps"]])
        maps.setdefault(r["config"], []).append([x[1] if isinstance(x, list) else 0 for x in r["steps"]])
    base = runs.get("default")
    if not base:
        continue
    n = len(base[0])
    med = lambda rr: [S.median(run[i] for run in rr) for i in range(2, n)]
    b = med(base)
    for c, rr in runs.items():
        m = med(rr)
        print("%s %-44s runs %d  paired %.3f  sum %.3f" % (f, c, len(rr), S.median(x / y for x, y in zip(m, b)),
                                                         sum(m) / sum(b)))
        if c == "default":
            continue
        zero = [i for i in range(2, n) if all(mp[i] == 0 for mp in maps[c])]
        for k, run in enumerate(rr[:len(base)]):
            if zero:
                print("    run %d: %d steps without maps, median ratio %.3f" % (
                    k, len(zero), S.median(run[i] / base[k][i] for i in zero)))
