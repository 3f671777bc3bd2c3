#!/usr/bin/env python3
"""Checks a memory snapshot the way pytorch.org/memory_viz reads it.

    tools/memviz_check.py SNAPSHOT.pickle[.gz] [--quiet]

SNAPSHOT is what torch.cuda.memory._dump_snapshot() writes (a pickled dict:
segments, device_traces). Two checks, per device:

1. The segments: each one's blocks cover it, in address order, their sizes
   adding up to total_size (memory_viz places block i at the segment's
   address plus the sizes before it); allocated_size / active_size agree with
   the blocks' states; segments do not overlap. memory_viz's "reserved" is the
   sum of total_size, printed.
2. The Allocator State History replay: memory_viz shows the state at trace
   event i by starting from the segments and undoing every later event
   (MemoryViz.js annotate_snapshot + simulate_memory: free_requested followed
   at once by free_completed of the same address is one 'free'; undoing a
   free or free_completed brings the block back, an alloc removes it, a
   segment_map carves its range out of the segment holding it, a
   segment_unmap puts it back, joined to touching segments, segment_alloc /
   segment_free add / remove a whole segment). This walks back from the last
   event to before event 0 and reports every step where memory_viz would fail
   or draw nonsense: a block that comes back in no segment (MemoryViz.js
   'Cannot read properties of null (reading 'occupied')'), a segment_map in
   no segment ('... (reading 'addr')'), a carved range that still holds a
   block, a free_requested undone for a block that does not exist, a
   segment_free of an address no segment starts at, overlapping segments.
   (memory_viz locates a block by its address only; this checks its whole
   extent.)

Exit status 0 when both hold, 1 with the problems listed (the first 20, and
"latest failing event": the newest event memory_viz cannot show), 2 on
usage errors. Importable: check(snapshot_dict) returns the list of problems.
Needs no torch: the pickle holds only dicts, lists, strings and numbers.
"""
import bisect
import gzip
import pickle
import sys


def _segments_of(snapshot, device, problems):
    segs, blocks = [], {}
    for g in snapshot.get("segments", []):
        if g.get("device", 0) != device:
            continue
        addr, total = g["address"], g["total_size"]
        pos, alloc, active = addr, 0, 0
        for b in g.get("blocks", []):
            if "address" in b and b["address"] != pos:
                problems.append("segment %#x: block at %#x, expected %#x (blocks must be in address order, "
                                "without holes)" % (addr, b["address"], pos))
            if b["size"] <= 0:
                problems.append("segment %#x: block at %#x of size %d" % (addr, pos, b["size"]))
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[pos] = (b["size"], b["state"])
                active += b["size"]
                alloc += b["size"] if b["state"] == "active_allocated" else 0
            elif b["state"] != "inactive":
                problems.append("segment %#x: block at %#x in state %r" % (addr, pos, b["state"]))
            pos += b["size"]
        if pos != addr + total:
            problems.append("segment %#x: blocks add up to %d bytes, total_size %d" % (addr, pos - addr, total))
        for key, want in (("allocated_size", alloc), ("active_size", active)):
            if key in g and g[key] != want:
                problems.append("segment %#x: %s %d, its blocks say %d" % (addr, key, g[key], want))
        segs.append([addr, total])
    segs.sort()
    for (a0, n0), (a1, _) in zip(segs, segs[1:]):
        if a0 + n0 > a1:
            problems.append("segments %#x (+%d) and %#x overlap" % (a0, n0, a1))
    return segs, blocks


def _elide(trace):
    out = []
    for t in trace:
        if (t["action"] == "free_completed" and out and out[-1]["action"] == "free_requested"
                and out[-1]["addr"] == t["addr"]):
            out[-1] = dict(out[-1], action="free")
            continue
        out.append(t)
    return out


class _Segs:
    """Sorted, non-overlapping [addr, addr+size) ranges, as memory_viz keeps them."""

    def __init__(self, segs):
        self.a = [s[0] for s in segs]
        self.n = [s[1] for s in segs]

    def holding(self, lo, hi):
        i = bisect.bisect_right(self.a, lo) - 1
        return i if i >= 0 and hi <= self.a[i] + self.n[i] else -1

    def carve(self, lo, hi):
        i = self.holding(lo, hi)
        if i < 0:
            return False
        a, n = self.a[i], self.n[i]
        del self.a[i], self.n[i]
        if hi < a + n:
            self.a.insert(i, hi), self.n.insert(i, a + n - hi)
        if a < lo:
            self.a.insert(i, a), self.n.insert(i, lo - a)
        return True

    def add(self, lo, hi, join):
        i = bisect.bisect_left(self.a, lo)
        if (i < len(self.a) and self.a[i] < hi) or (i > 0 and self.a[i - 1] + self.n[i - 1] > lo):
            return False
        self.a.insert(i, lo), self.n.insert(i, hi - lo)
        if join and i + 1 < len(self.a) and self.a[i + 1] == hi:
            self.n[i] += self.n[i + 1]
            del self.a[i + 1], self.n[i + 1]
        if join and i > 0 and self.a[i - 1] + self.n[i - 1] == lo:
            self.n[i - 1] += self.n[i]
            del self.a[i], self.n[i]
        return True

    def remove(self, lo):
        i = bisect.bisect_left(self.a, lo)
        if i == len(self.a) or self.a[i] != lo:
            return False
        del self.a[i], self.n[i]
        return True


def check(snapshot, device=None, stats=None):
    """The problems memory_viz would meet showing this snapshot (a list of strings)."""
    problems = []
    traces = snapshot.get("device_traces", [])
    devices = sorted({g.get("device", 0) for g in snapshot.get("segments", [])} | set(range(len(traces))))
    for d in devices if device is None else [device]:
        segs, blocks = _segments_of(snapshot, d, problems)
        trace = _elide(traces[d] if d < len(traces) else [])
        live = {a: s for a, (s, _) in blocks.items()}
        S = _Segs(segs)
        for a, s in live.items():
            if S.holding(a, a + s) < 0:
                problems.append("device %d: snapshot block %#x (+%d) in no segment" % (d, a, s))
        latest = None
        for i in range(len(trace) - 1, -1, -1):
            e, bad = trace[i], None
            act, a, n = e["action"], e.get("addr", 0), e.get("size", 0)
            if act in ("free", "free_completed"):
                live[a] = n
                if S.holding(a, a + n) < 0:
                    bad = "block %#x (+%d) comes back in no segment" % (a, n)
            elif act == "free_requested":
                if a not in live:
                    bad = "free_requested of %#x undone, no such block" % a
            elif act == "alloc":
                live.pop(a, None)
            elif act in ("segment_map", "segment_alloc"):
                if not a:
                    bad = "%s at address 0" % act
                elif act == "segment_alloc" and not S.remove(a):
                    bad = "segment_alloc %#x undone, no segment starts there" % a
                elif act == "segment_map" and not S.carve(a, a + n):
                    bad = "segment_map %#x (+%d) in no segment" % (a, n)
                else:
                    inside = [b for b, s in live.items() if b < a + n and a < b + s]
                    if inside:
                        bad = "%s %#x (+%d) undone while block %#x lies in it" % (act, a, n, inside[0])
            elif act in ("segment_unmap", "segment_free"):
                if not a:
                    bad = "%s at address 0" % act
                elif not S.add(a, a + n, act == "segment_unmap"):
                    bad = "%s %#x (+%d) undone over a segment" % (act, a, n)
            if bad:
                # the state at event i-1 is the one memory_viz cannot draw
                problems.append("device %d: event %d (%s): %s" % (d, i, act, bad))
                if latest is None:
                    latest = i - 1
        if latest is not None:
            problems.append("device %d: latest failing event %d of %d (memory_viz's Allocator State History "
                            "fails there and, mostly, before)" % (d, latest, len(trace)))
        if stats is not None:
            stats[d] = {"segments": len(segs), "reserved": sum(n for _, n in segs),
                        "blocks": len(blocks), "allocated": sum(s for s, st in blocks.values() if st == "active_allocated"),
                        "events": len(trace)}
    return problems


def load(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        return pickle.load(f)


def main(argv):
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    stats = {}
    problems = check(load(argv[1]), stats=stats)
    for d, s in sorted(stats.items()):
        print("device %d: %d segments, reserved (memory_viz) %d bytes = %.1f MiB, %d active blocks, allocated %d, "
              "%d events (after eliding free pairs)" % (d, s["segments"], s["reserved"], s["reserved"] / 2**20,
                                                         s["blocks"], s["allocated"], s["events"]))
    if "--quiet" not in argv:
        for p in problems[:20] + [p for p in problems[20:] if "latest failing" in p]:
            print("  " + p)
    print("%s: %d problem(s)" % ("FAIL" if problems else "OK", len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
