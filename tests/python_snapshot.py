"""A memory_viz snapshot built from the C API through ctypes, on the host
backend, checked by tools/memviz_check.py (run by tests/run.sh; no torch).

The dict is the one python/gmlake/_C.cpp makes PyTorch's _snapshot() return:
segments from gml_segments (each with its blocks: allocated, free pending,
free space 'inactive'), device_traces from gml_trace_read up to the
segments' trace_seq. A random run of allocations (small and large), frees
and trims; then the checker must find nothing, and must find the two faults
of the old format (only live blocks in the segments; segment events at
address 0) when they are put back. SNAPSHOT_OUT=FILE: also write the
snapshot of the random run there (a pickle, as _dump_snapshot writes)."""
import ctypes
import os
import pickle
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import memviz_check  # noqa: E402

import gmlake  # noqa: E402
from gmlake import grow as G  # noqa: E402

u64, sz, vp = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p


class PoolId(ctypes.Structure):
    _fields_ = [("a", u64), ("b", u64)]


class SegmentInfo(ctypes.Structure):  # mirrors gml_segment_info
    _fields_ = [("addr", ctypes.c_size_t), ("size", sz), ("large", ctypes.c_int), ("nblocks", sz)]


class AllocInfo(ctypes.Structure):  # mirrors gml_alloc_info
    _fields_ = [("addr", ctypes.c_size_t), ("size", sz), ("requested", sz), ("state", ctypes.c_int),
                ("stream", ctypes.c_size_t), ("pool", PoolId), ("tag", u64)]


class TraceEntry(ctypes.Structure):  # mirrors gml_trace_entry
    _fields_ = [("seq", u64), ("time_ns", u64), ("tag", u64), ("action", ctypes.c_int), ("addr", ctypes.c_size_t),
                ("size", sz), ("stream", ctypes.c_size_t), ("pool", PoolId)]


lib = gmlake._load()
for name, args in (("gml_alloc", [vp, sz, ctypes.c_size_t, ctypes.POINTER(vp)]), ("gml_free", [vp, vp]),
                   ("gml_trim", [vp, ctypes.POINTER(sz)]), ("gml_trace_enable", [vp, sz]),
                   ("gml_trace_read", [vp, ctypes.POINTER(TraceEntry), sz, ctypes.POINTER(sz)]),
                   ("gml_segments", [vp, ctypes.POINTER(SegmentInfo), sz, ctypes.POINTER(sz), ctypes.POINTER(AllocInfo), sz,
                                     ctypes.POINTER(sz), ctypes.POINTER(u64)])):
    getattr(lib, name).argtypes, getattr(lib, name).restype = args, ctypes.c_int

STATES = {0: "inactive", 1: "active_allocated", 2: "active_pending_free"}
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_map", "segment_unmap", "oom"]


def snapshot(c):
    """PyTorch's snapshot dict, as _C.cpp assembles it."""
    ns, nb, seq = sz(), sz(), u64()
    assert lib.gml_segments(c, None, 0, ctypes.byref(ns), None, 0, ctypes.byref(nb), None) == 0
    segs, blocks = (SegmentInfo * (ns.value + 8))(), (AllocInfo * (nb.value + 64))()
    assert lib.gml_segments(c, segs, len(segs), ctypes.byref(ns), blocks, len(blocks), ctypes.byref(nb), ctypes.byref(seq)) == 0
    assert ns.value <= len(segs) and nb.value <= len(blocks)
    out, k = [], 0
    for g in segs[:ns.value]:
        bl = []
        for b in blocks[k:k + g.nblocks]:
            bl.append({"address": b.addr, "size": b.size, "requested_size": b.requested, "state": STATES[b.state],
                       "frames": []})
        k += g.nblocks
        out.append({"device": 0, "address": g.addr, "total_size": g.size, "stream": 0,
                    "segment_type": "large" if g.large else "small", "segment_pool_id": (0, 0), "is_expandable": False,
                    "allocated_size": sum(b["size"] for b in bl if b["state"] == "active_allocated"),
                    "active_size": sum(b["size"] for b in bl if b["state"] != "inactive"),
                    "requested_size": sum(b["requested_size"] for b in bl if b["state"] == "active_allocated"),
                    "blocks": bl})
    t, n = (TraceEntry * (1 << 16))(), sz()
    assert lib.gml_trace_read(c, t, len(t), ctypes.byref(n)) == 0 and n.value < len(t)
    trace = [{"action": ACTIONS[e.action], "addr": e.addr, "size": e.size, "stream": e.stream,
              "time_us": e.time_ns // 1000, "frames": []} for e in t[:n.value] if e.seq <= seq.value]
    return {"segments": out, "device_traces": [trace]}


c = G.client_for("cpu")
assert lib.gml_trace_enable(c, 1 << 15) == 0
rnd = random.Random(7)
live = [None] * 48
for step in range(1200):
    i = rnd.randrange(len(live))
    if live[i]:
        assert lib.gml_free(c, live[i]) == 0
        live[i] = None
    else:
        size = rnd.randrange(1, 900 << 10) if rnd.random() < 0.6 else rnd.randrange(1 << 20, 6 << 20)
        p = vp()
        assert lib.gml_alloc(c, size, rnd.randrange(2), ctypes.byref(p)) == 0, size
        live[i] = p.value
    if step % 301 == 300:
        assert lib.gml_trim(c, None) == 0
s = snapshot(c)
if os.environ.get("SNAPSHOT_OUT"):  # to open it in memory_viz (bench/memviz_render.sh)
    with open(os.environ["SNAPSHOT_OUT"], "wb") as f:
        pickle.dump(s, f)
stats = {}
problems = memviz_check.check(s, stats=stats)
assert not problems, problems[:10]
st = stats[0]
kinds = {b["state"] for g in s["segments"] for b in g["blocks"]}
assert "inactive" in kinds and "active_allocated" in kinds, kinds
acts = {e["action"] for e in s["device_traces"][0]}
assert {"segment_map", "segment_unmap", "alloc", "free_completed"} <= acts, acts
print("  random run: %d segments, reserved (memory_viz) %.1f MiB, %d blocks live, %d events: no problem"
      % (st["segments"], st["reserved"] / 2**20, st["blocks"], st["events"]))

# after a trim every held chunk is mapped, so memory_viz's reserved is the held memory
assert lib.gml_trim(c, None) == 0
s = snapshot(c)
reserved = G.client_stats(c)["reserved"]
stats = {}
assert not memviz_check.check(s, stats=stats)
assert stats[0]["reserved"] == reserved, (stats[0]["reserved"], reserved)
print("  after a trim: reserved (memory_viz) = gml_stats reserved = %.1f MiB" % (reserved / 2**20))

# the same file through the command line
with tempfile.NamedTemporaryFile(suffix=".pickle") as f:
    pickle.dump(s, f)
    f.flush()
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(memviz_check.__file__), "memviz_check.py"), f.name],
                       stdout=subprocess.PIPE, universal_newlines=True)
    assert r.returncode == 0 and "OK: 0 problem(s)" in r.stdout, r.stdout

# the checker finds the old format's faults
old = {"segments": [dict(g, address=b["address"], total_size=b["size"], allocated_size=b["size"], active_size=b["size"],
                        blocks=[b]) for g in s["segments"] for b in g["blocks"] if b["state"] != "inactive"],
       "device_traces": s["device_traces"]}
assert any("in no segment" in p for p in memviz_check.check(old)), "checker missed segments of live blocks only"
zero = {"segments": s["segments"],
        "device_traces": [[dict(e, addr=0) if e["action"].startswith("segment") else e for e in s["device_traces"][0]]]}
assert any("address 0" in p for p in memviz_check.check(zero)), "checker missed segment events at address 0"
print("  the checker fails the old format (segments of live blocks only; segment events at address 0)")
for p in live:
    if p:
        lib.gml_free(c, p)
