"""The copy engine on a GPU (issue 30): host<->device bandwidth, in one run, of
  baseline   a plain cudaMemcpyAsync from/to pinned memory (torch's copy_(non_blocking=True))
  torch-pg   the same from/to pageable memory (the driver's own staging), for reference
  eng-pin    gmlake.copy from/to pinned memory (the engine: straight to the driver)
  eng-pg     gmlake.copy from/to pageable memory (the engine's staging pool and threads)
at each size (--sizes, default 256MiB 1GiB 4GiB 8GiB), best of --repeats after a warm-up,
content checked; PASS/FAIL against the issue's bounds (eng-pin >= 90% of baseline,
eng-pg >= 80%). Then each GPU's own link alone (baseline at 1 GiB: what a multi-path copy
would add up), `nvidia-smi topo -m`, and pause/resume of a process holding --pause-gib GiB in
256 MiB tensors (content checked), pageable and pinned (GMLAKE_PAUSE_HOST), with GB/s
against the engine's (>= 90%). The single-path table runs with GMLAKE_COPY_PATHS=1 (unless set).
Multi-path (2+ GPUs; --no-mpath leaves it out): each path alone, timed with torch (GPU 0's own link;
host -> GPU 1 -> GPU 0, at most the slower of GPU 1's link and the P2P hop), then the engine with
GMLAKE_COPY_PATHS=auto, H2D and D2H of --mp-sizes (1GiB 4GiB 8GiB) to GPU 0, content checked, against
>= 90% of the sum of the paths alone, and what the engine's probe measured and kept.
--mpath-only: the single-path table at 256MiB, the links, multi-path; no pause (about a minute).

    python3 bench/copy_bench.py [--sizes 256MiB 1GiB] [--repeats 3] [--pause-gib 40] [--no-pause]
    python3 bench/copy_bench.py --mpath-only [--mp-sizes 1GiB 4GiB 8GiB]
Needs torch with CUDA; GMLAKE_LIB names libgmlake-client.so (bench/gpu.sh copy sets it).
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def parse_size(s):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = s.lower().rstrip("ib").rstrip("b")
    return int(float(t[:-1]) * units[t[-1]]) if t[-1] in units else int(t)


def timed(fn, repeats):
    import torch
    fn()  # warm-up: page-locks the staging pool, faults pages in
    torch.cuda.synchronize()
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        best = dt if best is None or dt < best else best
    return best


def table(a):
    import torch
    import gmlake
    c = gmlake.open(0)
    dev0 = torch.device("cuda", 0)
    rows, ok = [], True
    print("copy: %s, %s" % (torch.cuda.get_device_name(0), json.dumps(gmlake.copy_info(client=c))))
    print("copy: %-8s %-4s %9s %9s %9s %9s  %6s %6s" % ("size", "dir", "baseline", "torch-pg", "eng-pin", "eng-pg",
                                                        "pin%", "pg%"))
    for n in [parse_size(s) for s in a.sizes]:
        ref = torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev0)
        pageable = ref.cpu()                       # pageable, content known, pages touched
        back = torch.zeros(n, dtype=torch.uint8)   # pageable, touched
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        pinned.copy_(pageable)
        dev = torch.empty(n, dtype=torch.uint8, device=dev0)
        s = torch.cuda.current_stream(dev0).cuda_stream
        res = {}
        for d in ("H2D", "D2H"):
            h2d = d == "H2D"
            k = gmlake.COPY_H2D if h2d else gmlake.COPY_D2H
            res[d] = {
                "baseline": timed(lambda: dev.copy_(pinned, non_blocking=True) if h2d else pinned.copy_(dev, non_blocking=True), a.repeats),
                "torch-pg": timed(lambda: dev.copy_(pageable) if h2d else back.copy_(dev), a.repeats),
                "eng-pin": timed(lambda: gmlake.copy(dev.data_ptr(), pinned.data_ptr(), n, k, client=c, stream=s) if h2d else
                                 gmlake.copy(pinned.data_ptr(), dev.data_ptr(), n, k, client=c, stream=s), a.repeats),
                "eng-pg": timed(lambda: gmlake.copy(dev.data_ptr(), pageable.data_ptr(), n, k, client=c, stream=s) if h2d else
                                gmlake.copy(back.data_ptr(), dev.data_ptr(), n, k, client=c, stream=s), a.repeats),
            }
        # what the host's memory allows: pageable -> page-locked by torch's CPU threads, no link involved
        hc = timed(lambda: pinned.copy_(pageable), a.repeats)
        print("copy: host memcpy %dMiB pageable -> page-locked: %.1f GB/s (torch, %d threads; GMLAKE_COPY_THREADS=%s)" % (
            n >> 20, n / hc / 1e9, torch.get_num_threads(), os.environ.get("GMLAKE_COPY_THREADS", "default")))
        # content: the engine's pageable copies, each way
        dev.zero_()
        gmlake.copy(dev.data_ptr(), pageable.data_ptr(), n, gmlake.COPY_H2D, client=c, stream=s)
        torch.cuda.synchronize()
        same_in = bool(torch.equal(dev, ref))
        back.zero_()
        gmlake.copy(back.data_ptr(), dev.data_ptr(), n, gmlake.COPY_D2H, client=c)
        same_out = bool(torch.equal(back, pageable))
        for d in ("H2D", "D2H"):
            gbs = {key: n / t / 1e9 for key, t in res[d].items()}
            pin, pg = gbs["eng-pin"] / gbs["baseline"], gbs["eng-pg"] / gbs["baseline"]
            good = pin >= 0.9 and pg >= 0.8 and same_in and same_out
            ok &= good
            print("copy: %-8s %-4s %9.1f %9.1f %9.1f %9.1f  %5.0f%% %5.0f%%  %s%s" % (
                "%dMiB" % (n >> 20), d, gbs["baseline"], gbs["torch-pg"], gbs["eng-pin"], gbs["eng-pg"], 100 * pin,
                100 * pg, "PASS" if good else "FAIL", "" if same_in and same_out else " (content differs)"))
            rows.append({"size": n, "dir": d, **gbs})
        del ref, pageable, back, pinned, dev
        torch.cuda.empty_cache()
    print("copy: GB/s, best of %d; bounds: eng-pin >= 90%% of baseline, eng-pg >= 80%%: %s" % (a.repeats, "PASS" if ok else "FAIL"))
    print("copy: engine %s" % json.dumps(gmlake.copy_info(client=c)))
    return rows


def links(a):
    """Each GPU's link alone (baseline, pinned, 1 GiB): the paths a multi-path copy would add up."""
    import torch
    n = 1 << 30
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    for i in range(torch.cuda.device_count()):
        dev = torch.empty(n, dtype=torch.uint8, device=torch.device("cuda", i))
        with torch.cuda.device(i):
            h = timed(lambda: dev.copy_(pinned, non_blocking=True), a.repeats)
            d = timed(lambda: pinned.copy_(dev, non_blocking=True), a.repeats)
        print("copy: path GPU %d alone (its own link, pinned, 1 GiB): H2D %.1f GB/s, D2H %.1f GB/s" % (i, n / h / 1e9, n / d / 1e9))
        del dev
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        topo = "nvidia-smi topo -m: %s\n" % e
    for line in topo.splitlines():
        print("copy: topo: %s" % line)


def mpath(a):
    """Multi-path (GMLAKE_COPY_PATHS=auto) to GPU 0 on a node of 2+ GPUs: each path alone, then the engine's
    split H2D and D2H of --mp-sizes, content checked, against >= 90% of the sum of the paths alone."""
    import torch
    import gmlake
    if torch.cuda.device_count() < 2:
        print("copy: multi-path: %d GPU: needs two (not run)" % torch.cuda.device_count())
        return True
    n1 = 1 << 30
    pinned = torch.empty(n1, dtype=torch.uint8, pin_memory=True)
    d0 = torch.empty(n1, dtype=torch.uint8, device="cuda:0")
    d1 = torch.empty(n1, dtype=torch.uint8, device="cuda:1")
    alone = {}
    with torch.cuda.device(0):
        alone["own", "H2D"] = n1 / timed(lambda: d0.copy_(pinned, non_blocking=True), a.repeats) / 1e9
        alone["own", "D2H"] = n1 / timed(lambda: pinned.copy_(d0, non_blocking=True), a.repeats) / 1e9
        p2p_in = n1 / timed(lambda: d0.copy_(d1, non_blocking=True), a.repeats) / 1e9   # GPU 1 -> 0, on 0's stream
        p2p_out = n1 / timed(lambda: d1.copy_(d0, non_blocking=True), a.repeats) / 1e9  # GPU 0 -> 1
    with torch.cuda.device(1):
        l1_in = n1 / timed(lambda: d1.copy_(pinned, non_blocking=True), a.repeats) / 1e9
        l1_out = n1 / timed(lambda: pinned.copy_(d1, non_blocking=True), a.repeats) / 1e9
    # host -> GPU 1 -> GPU 0 pipelined moves at most the slower of its hops
    alone["peer", "H2D"], alone["peer", "D2H"] = min(l1_in, p2p_in), min(l1_out, p2p_out)
    print("copy: multi-path: paths alone (torch, pinned, 1 GiB): GPU 0's own link H2D %.1f / D2H %.1f GB/s; "
          "GPU 1's link H2D %.1f / D2H %.1f, P2P 1->0 %.1f, 0->1 %.1f: host->GPU1->GPU0 at most H2D %.1f / D2H %.1f" % (
              alone["own", "H2D"], alone["own", "D2H"], l1_in, l1_out, p2p_in, p2p_out, alone["peer", "H2D"],
              alone["peer", "D2H"]))
    del pinned, d0, d1
    torch.cuda.empty_cache()
    os.environ["GMLAKE_COPY_PATHS"] = "auto"  # read at the probe: the first large page-locked copy
    c = gmlake.open(0)
    dev0 = torch.device("cuda", 0)
    ok = True
    for n in [parse_size(x) for x in a.mp_sizes]:
        ref = torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev0)
        src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        src.copy_(ref)
        back = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device=dev0)
        s = torch.cuda.current_stream(dev0).cuda_stream
        t_in = timed(lambda: gmlake.copy(dev.data_ptr(), src.data_ptr(), n, gmlake.COPY_H2D, client=c, stream=s), a.repeats)
        same_in = bool(torch.equal(dev, ref))
        back.zero_()
        t_out = timed(lambda: gmlake.copy(back.data_ptr(), dev.data_ptr(), n, gmlake.COPY_D2H, client=c, stream=s), a.repeats)
        same_out = bool(torch.equal(back, src))
        info = gmlake.copy_info(client=c)
        for d, t, same in (("H2D", t_in, same_in), ("D2H", t_out, same_out)):
            gbs = n / t / 1e9
            bound = alone["own", d] + alone["peer", d]
            used = [p for p in info["paths"] if p["used"] and p[d.lower() + "_share"] > 0]
            good = gbs >= 0.9 * bound and same
            ok &= good
            print("copy: multi-path %-6s %s to GPU 0: %6.1f GB/s over %d path(s) (%s), sum of paths alone %.1f: %3.0f%% %s%s" % (
                "%dGiB" % (n >> 30) if n >= 1 << 30 else "%dMiB" % (n >> 20), d, gbs, len(used),
                ", ".join("GPU %d %.0f%%" % (p["device"], 100 * p[d.lower() + "_share"]) for p in used), bound,
                100 * gbs / bound, "PASS" if good else "FAIL", "" if same else " (content differs)"))
        del ref, src, back, dev
        torch.cuda.empty_cache()
    info = gmlake.copy_info(client=c)
    for p in info["paths"]:
        print("copy: multi-path probe: path over GPU %d%s: H2D %.1f GB/s alone (share %.2f), D2H %.1f (share %.2f)%s%s" % (
            p["device"], " (own link)" if p is info["paths"][0] else " (+P2P)", p["h2d_gbps"], p["h2d_share"],
            p["d2h_gbps"], p["d2h_share"], "" if p["used"] else ", not used", ", FAILED" if p["failed"] else ""))
    print("copy: multi-path probe: together H2D %.1f GB/s, D2H %.1f; %d of %d paths used; %.1f GiB split" % (
        info["h2d_gbps"], info["d2h_gbps"], info["paths_used"], info["npaths"], info["bytes_split"] / (1 << 30)))
    print("copy: multi-path >= 90%% of the sum of the paths alone: %s" % ("PASS" if ok else "FAIL"))
    return ok


def pause_child(a):
    """A process holding pause_gib GiB in 256 MiB tensors: pause and resume timed, content checked."""
    import torch
    import gmlake
    gmlake.enable(mode="embedded")
    dev = torch.device("cuda", 0)
    unit = 256 << 20
    ts, sums = [], []
    for i in range(a.pause_gib * 4):
        g = torch.Generator(device=dev).manual_seed(i)
        t = torch.randint(-(1 << 62), 1 << 62, (unit // 8,), dtype=torch.int64, device=dev, generator=g)
        ts.append(t)
        sums.append(int(t.sum()))
    heads = [t[:4096].cpu() for t in ts[:: max(1, len(ts) // 8)]]
    total = len(ts) * unit
    out = []
    for r in range(a.rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        gmlake.pause()
        t1 = time.perf_counter()
        reserved = gmlake.stats()["reserved"]
        gmlake.resume()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        same = [int(t.sum()) for t in ts] == sums and all(torch.equal(h, t[:4096].cpu()) for h, t in zip(heads, ts[:: max(1, len(ts) // 8)]))
        out.append({"round": r, "pause_s": t1 - t0, "resume_s": t2 - t1, "bytes": total, "reserved_paused": reserved,
                    "same": same})
    print(json.dumps({"rounds": out, "info": gmlake.copy_info()}), flush=True)


def pause_table(a, rows):
    eng = {d: max((r["eng-pg"] for r in rows if r["dir"] == d), default=0) for d in ("H2D", "D2H")}
    pin = {d: max((r["eng-pin"] for r in rows if r["dir"] == d), default=0) for d in ("H2D", "D2H")}
    ok = True
    # GMLAKE_PAUSE_OVERLAP=1 (the default) judged; =0 (every copy, then every give-back or map) for reference
    for how, rounds, overlap in (("pageable", 1, "1"), ("pinned", 2, "1"), ("pinned", 2, "0")):
        env = dict(os.environ, GMLAKE_PAUSE_HOST=how, GMLAKE_PAUSE_OVERLAP=overlap,
                   GMLAKE_LOG=os.environ.get("GMLAKE_LOG", "info"))
        p = subprocess.run([sys.executable, __file__, "--role", "pause", "--pause-gib", str(a.pause_gib),
                            "--rounds", str(rounds)], env=env, capture_output=True, text=True)
        for line in p.stderr.splitlines():
            if "pause" in line or "resume" in line or "copy engine" in line or "Error" in line:
                print("copy: pause (%s, overlap %s) log: %s" % (how, overlap, line))
        last = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode or not last:
            print("copy: pause (%s): the child failed (exit %d): FAIL\n%s" % (how, p.returncode, p.stderr[-3000:]))
            ok = False
            continue
        res = json.loads(last[-1])
        for r in res["rounds"]:
            g = r["bytes"] / 1e9
            po, re_ = g / r["pause_s"], g / r["resume_s"]
            ref = pin if how == "pinned" else eng
            good = r["same"] and r["reserved_paused"] == 0 and po >= 0.9 * ref["D2H"] and re_ >= 0.9 * ref["H2D"]
            # a pinned pause's first round page-locks its memory: reported, judged on the second
            judged = not (how == "pinned" and r["round"] == 0) and overlap == "1"
            ok &= good or not judged
            print("copy: pause/resume %d GiB (%s host, overlap %s, round %d): pause %.2f s (%.1f GB/s), resume %.2f s (%.1f GB/s); "
                  "engine %s D2H %.1f / H2D %.1f GB/s; content %s, reserved while paused %d: %s" % (
                      a.pause_gib, how, overlap, r["round"], r["pause_s"], po, r["resume_s"], re_, "pinned" if how == "pinned" else
                      "pageable", ref["D2H"], ref["H2D"], "same" if r["same"] else "DIFFERS", r["reserved_paused"],
                      ("PASS" if good else "FAIL") if judged else
                      "(reference, not judged)" if overlap == "0" else "(first: page-locks, not judged)"))
    print("copy: pause/resume at >= 90%% of the engine: %s" % ("PASS" if ok else "FAIL"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["256MiB", "1GiB", "4GiB", "8GiB"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pause-gib", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-pause", action="store_true")
    ap.add_argument("--mp-sizes", nargs="+", default=["1GiB", "4GiB", "8GiB"])
    ap.add_argument("--no-mpath", action="store_true")
    ap.add_argument("--mpath-only", action="store_true", help="the single-path table at 256MiB only, then multi-path")
    ap.add_argument("--role", default="main")
    a = ap.parse_args()
    if a.role == "pause":
        return pause_child(a)
    os.environ.setdefault("GMLAKE_COPY_PATHS", "1")  # the single-path table: one link; mpath() then sets auto
    if a.mpath_only:
        a.sizes, a.no_pause = ["256MiB"], True
    rows = table(a)
    links(a)
    if not a.no_mpath:
        mpath(a)
    if a.mpath_only:
        return
    if not a.no_pause:
        pause_table(a, rows)


if __name__ == "__main__":
    main()
