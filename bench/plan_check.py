"""Planned placement (issue 29) on a GPU training, against its acceptance: bench/gpu.sh's `plan` stage.

  python3 bench/plan_check.py OUTDIR WORKLOAD

reads what the stage wrote to OUTDIR for WORKLOAD: plan_W_static.json and plan_W_dynamic.json
(bench/torch_bench.py table: default, gmlake_embedded, gmlake_embedded+GMLAKE_PLAN=1; static: every
step the same shapes, GMLAKE_BENCH_FIXED=1; dynamic: the workload's own batch and sequence lengths,
drawn anew each step: dynamic padding), each run's peaks again from step K on
(GMLAKE_BENCH_RESET_PEAK_AT), and plan_lockstep_W_static.json / _dynamic.json (bench/lockstep.py:
the same three configs taking turns step by step). Prints a table and PASS/FAIL lines:

  static:  with the plan, reserved/allocated at the peak of steps >= K <= 1.005; no driver call
           (maps, unmaps, set-access, leases, synchronizes) in steps >= K; lockstep ms/step <= PyTorch
           default's
  dynamic: with the plan, peak reserved <= without it (over the whole run) and lockstep ms/step
           <= without it (1% for the noise of a shared host: lockstep's own spread says how much)
Exit status 1 when a line FAILs (0 also when files are missing: those lines say MISSING)."""
import json
import os
import statistics as S
import sys

PLAN = "gmlake_embedded+GMLAKE_PLAN=1"
NOPLAN = "gmlake_embedded"


def rows(path):
    try:
        with open(path) as f:
            return [r for r in json.load(f) if "error" not in r]
    except (OSError, ValueError):
        return None


def by_config(rs):
    out = {}
    for r in rs or []:
        out.setdefault(r["config"], []).append(r)
    return out


def med(rs, key):
    v = [r[key] for r in rs if r.get(key) is not None]
    return S.median(v) if v else None


def calls_after(r):
    """Driver calls in steps >= steady_from: maps, unmaps, syncs, leases, set-access (torch_bench's per-step
    tuples: ms, maps, unmaps, syncs, lease_calls, access_calls, ...; step 0 is a plain number)."""
    k = r.get("steady_from", 0)
    return sum(sum(t[1:6]) for i, t in enumerate(r.get("steps", [])) if i >= k and isinstance(t, list))


def main():
    out, w = sys.argv[1], sys.argv[2]
    failed, lines = 0, []

    def verdict(ok, what):
        nonlocal failed
        if ok is None:
            lines.append("MISSING %s plan %s" % (w, what))
            return
        failed |= not ok
        lines.append("%s %s plan %s" % ("PASS" if ok else "FAIL", w, what))

    for shape in ("static", "dynamic"):
        cfg = by_config(rows(os.path.join(out, "plan_%s_%s.json" % (w, shape))))
        lock = by_config(rows(os.path.join(out, "plan_lockstep_%s_%s.json" % (w, shape))))
        print("%s %s: config, peak alloc / reserved (GiB, whole run), reserved/allocated from step K, ms/step, "
              "lockstep ms/step, driver calls from step K, plan hits/misses/taken" % (w, shape))
        for c in ("default", NOPLAN, PLAN):
            rs = cfg.get(c, [])
            if not rs:
                print("  %-30s (no run)" % c)
                continue
            r = rs[0]
            steady = med(rs, "peak_reserved_steady"), med(rs, "peak_allocated_steady")
            plan = r.get("plan", {})
            print("  %-30s %6.2f / %6.2f  %7s  %8.2f  %8s  %6s  %s" % (
                c, med(rs, "peak_allocated") / 2**30, med(rs, "peak_reserved") / 2**30,
                "%.4f" % (steady[0] / steady[1]) if all(steady) else "-", med(rs, "ms_per_step"),
                "%.2f" % med(lock[c], "ms_per_step") if lock.get(c) else "-",
                calls_after(r) if c != "default" else "-",
                "%d/%d/%d" % (plan.get("plan_hits", 0), plan.get("plan_misses", 0), plan.get("plans_taken", 0))
                if plan else ""))
        p, n, d = cfg.get(PLAN), cfg.get(NOPLAN), cfg.get("default")
        lp, ln, ld = lock.get(PLAN), lock.get(NOPLAN), lock.get("default")
        if shape == "static":
            ok = None
            if p and med(p, "peak_allocated_steady"):
                ratio = med(p, "peak_reserved_steady") / med(p, "peak_allocated_steady")
                ok = ratio <= 1.005
            verdict(ok, "static: reserved/allocated at peak from step %s = %s <= 1.005" % (
                p[0].get("steady_from") if p else "?", "%.4f" % ratio if ok is not None else "?"))
            calls = [calls_after(r) for r in p] if p else None
            verdict(None if calls is None else max(calls) == 0 and p[0]["plan"].get("plans_taken", 0) >= 1,
                    "static: driver calls after the plan is taken (steps >= K) = %s (0 expected; plans taken %s)" % (
                        calls, p[0]["plan"].get("plans_taken") if p else "?"))
            verdict(None if not (lp and ld) else med(lp, "ms_per_step") <= med(ld, "ms_per_step"),
                    "static: lockstep ms/step %s <= PyTorch default's %s" % (
                        "%.2f" % med(lp, "ms_per_step") if lp else "?", "%.2f" % med(ld, "ms_per_step") if ld else "?"))
        else:
            verdict(None if not (p and n) else med(p, "peak_reserved") <= med(n, "peak_reserved"),
                    "dynamic: peak reserved %s <= without the plan %s (GiB)" % (
                        "%.3f" % (med(p, "peak_reserved") / 2**30) if p else "?",
                        "%.3f" % (med(n, "peak_reserved") / 2**30) if n else "?"))
            verdict(None if not (lp and ln) else med(lp, "ms_per_step") <= 1.01 * med(ln, "ms_per_step"),
                    "dynamic: lockstep ms/step %s <= without the plan %s (+1%%)" % (
                        "%.2f" % med(lp, "ms_per_step") if lp else "?", "%.2f" % med(ln, "ms_per_step") if ln else "?"))
        if d and p and [round(x, 3) for x in d[0].get("losses", [])] != [round(x, 3) for x in p[0].get("losses", [])]:
            lines.append("NOTE %s %s: the plan's first losses %s differ from default's %s (bf16 kernels may differ)" % (
                w, shape, p[0].get("losses"), d[0].get("losses")))
    print("\n".join(lines))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
