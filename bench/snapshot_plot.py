"""Draws a memory snapshot (torch.cuda.memory._dump_snapshot's pickle) offline:
the picture memory_viz's "Active Memory Timeline" shows (each allocation a
band, stacked in allocation order, the ones above sliding down when one below
is freed), with the memory held from the device (segment_map - segment_unmap)
as a line over it. memory_viz itself is a web page that loads its script from
pytorch.org; this needs only matplotlib.
    python3 bench/snapshot_plot.py SNAPSHOT.pickle OUT.png [--device N] [--title T]"""
import argparse
import pickle
import sys


def timeline(trace):
    """Per event: time (s from the first), live allocations [(addr, size)] in order, held bytes."""
    live, held, out, t0 = [], 0, [], None
    for e in trace:
        a = e["action"]
        t = e.get("time_us", 0) / 1e6
        t0 = t if t0 is None else t0
        if a == "alloc":
            live.append((e["addr"], e["size"]))
        elif a == "free_completed":
            for i, (addr, size) in enumerate(live):
                if addr == e["addr"]:
                    del live[i]
                    break
        elif a == "segment_map":
            held += e["size"]
        elif a == "segment_unmap":
            held -= e["size"]
        else:
            continue
        out.append((t - t0, list(live), held))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("png")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(args.snapshot, "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][args.device]
    tl = timeline(trace)
    if not tl:
        sys.exit("no alloc/free events in the snapshot (was _record_memory_history on?)")
    # each allocation's band: (x, bottom, top) points while it lives
    bands = {}
    for i, (_, live, _) in enumerate(tl):
        base = 0
        for addr, size in live:
            bands.setdefault((addr, size, _first_seen(bands, addr, size, i)), []).append((i, base, base + size))
            base += size
    fig, ax = plt.subplots(figsize=(12, 5))
    cmap = plt.get_cmap("tab20")
    gib = float(1 << 30)
    for k, (key, pts) in enumerate(bands.items()):
        xs = [p[0] for p in pts]
        ax.fill_between(xs, [p[1] / gib for p in pts], [p[2] / gib for p in pts], step="post", color=cmap(k % 20), linewidth=0)
    ax.step(range(len(tl)), [h / gib for _, _, h in tl], where="post", color="black", linewidth=1.2,
            label="held from the device (chunks mapped)")
    ax.set_xlabel("allocator event (alloc / free / map / unmap), %.1f s in all" % tl[-1][0])
    ax.set_ylabel("GiB")
    ax.set_title(args.title or "Active memory timeline (each band one allocation)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    segs = snap.get("segments", [])
    print("%d events, %d allocations drawn, peak active %.2f GiB, peak held %.2f GiB; snapshot: %d segments, %.2f GiB in blocks"
          % (len(tl), len(bands), max(sum(s for _, s in live) for _, live, _ in tl) / gib,
             max(h for _, _, h in tl) / gib, len(segs), sum(s["total_size"] for s in segs) / gib))


_seen = {}


def _first_seen(bands, addr, size, i):
    # an address is reused by later allocations: the key tells them apart by when they began
    key = (addr, size)
    prev = _seen.get(key)
    if prev is not None and bands.get((addr, size, prev)) and bands[(addr, size, prev)][-1][0] == i - 1:
        return prev
    _seen[key] = i
    return i


if __name__ == "__main__":
    main()
