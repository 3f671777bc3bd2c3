"""gmlake.step() and planned placement through the ctypes layer (run by tests/run.sh: host backend,
embedded, no torch needed): GMLAKE_PLAN set through gml_set_option (gmlake._set_option, as
enable(plan=True) sets it; the environment is left alone), iterations marked by gmlake.step(), and
gmlake.stats() showing the plan taken and its hits; an iteration that departs is counted as misses."""
import ctypes
import os

import gmlake

assert "GMLAKE_PLAN" not in os.environ
assert gmlake._plan_value(True) == "1" and gmlake._plan_value("at:3") == "at:3"
for bad in (2, "at:", "yes"):
    try:
        gmlake._plan_value(bad)
        raise SystemExit("enable(plan=%r) was taken" % (bad,))
    except ValueError:
        pass
gmlake.step()  # no client open: nothing happens
gmlake._set_option("GMLAKE_PLAN", "1")
c = gmlake.open(0)
assert "GMLAKE_PLAN" not in os.environ, "gmlake set the environment"
lib = gmlake._load()
lib.gml_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
lib.gml_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
MiB = 1 << 20


def iteration(sizes):
    ptrs = []
    for n in sizes:
        p = ctypes.c_void_p()
        assert lib.gml_alloc(c, n, 0, ctypes.byref(p)) == 0
        ptrs.append(p)
    for p in reversed(ptrs):
        assert lib.gml_free(c, p) == 0
    gmlake.step()


sizes = [3 * MiB, 5 * MiB + 512, 1 * MiB, 7 * MiB, 2048]
for _ in range(6):
    iteration(sizes)
st = gmlake.stats(0)
assert st["plan_steps"] == 6, st
assert st["plans_taken"] >= 1, st
# planned after the second iteration repeated the first: the last three served whole
assert st["plan_hits"] >= 3 * len(sizes), st
assert st["plan_misses"] == 0, st
iteration([4 * MiB, 6 * MiB, 1 * MiB])  # another shape: departs from the plan
st2 = gmlake.stats(0)
assert st2["plan_misses"] > 0 and st2["plan_steps"] == 7, st2
print("  gmlake.step(): %d steps marked, %d plan(s) taken, %d hits, %d misses after a departing step; range %d MiB"
      % (st2["plan_steps"], st2["plans_taken"], st2["plan_hits"], st2["plan_misses"], st2["plan_range"] >> 20))
