#!/usr/bin/env python3
"""The elastic lake on the GPU (issue 12), with real PyTorch processes on one gmlaked:

  idle-hog  A allocates --hog (40 GiB), frees it and sits idle (no call at all);
            B then asks --hog of a lake limited to --limit (60 GiB): B must get it
            within a second, from the cache A's library gives back on the daemon's
            request. Prints the time B waited and where it went (B's gml_stats:
            waiting for the daemon's replies, importing, map calls, set-access),
            and the daemon's lines about it; --hog-runs times, a fresh daemon each, then
            --stream-map-runs times with GMLAKE_STREAM_MAP=1 (B maps a batch of chunks
            while its reader thread imports the next; printed beside, not in the verdict).
  pause     a small training run twice: once plainly, once with gmlake.pause()
            / gmlake.resume() between every step (while paused the process holds
            no chunk: checked); the losses must be identical, bit for bit.

    bench/elastic.py [--hog 40GiB] [--limit 60GiB] [--hog-runs 3] [--stream-map-runs 2] [--steps 20]
                     [--build build] [--hog-only]

Needs torch with CUDA and gmlake's PyTorch layer (gmlake.enable()). PASS/FAIL lines.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(1, HERE)
from torch_bench import cpu_probe  # noqa: E402  (torch_bench's CPU probe: ~900 us on a fast core of the H100 host)
GiB = 1 << 30


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().replace("iB", "").replace("B", "")
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def hog_main(nbytes):
    """A: allocate, free, then idle until told to stop (stdin closes)."""
    import gmlake
    import torch
    gmlake.enable(mode="daemon")
    t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    t.fill_(1)
    torch.cuda.synchronize()
    del t
    torch.cuda.synchronize()
    s = gmlake.stats()
    print(json.dumps({"allocated": s["allocated"], "reserved": s["reserved"]}), flush=True)
    sys.stdin.read()  # idle: no allocator call until the driver is done
    s = gmlake.stats()
    print(json.dumps({"allocated": s["allocated"], "reserved": s["reserved"]}), flush=True)


def taker_main(nbytes):
    """B: ask for nbytes at once; print how long it took."""
    import gmlake
    import torch
    gmlake.enable(mode="daemon")
    torch.empty(1 << 20, device="cuda")  # open the client first: the time below is the lease's
    torch.cuda.synchronize()
    probe = sorted(cpu_probe() for _ in range(30))[15]  # this core's speed (bench/cpu_cores.py)
    cpu = last_cpu()
    s0 = gmlake.stats()
    t0 = time.monotonic()
    try:
        t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        t.fill_(2)
        torch.cuda.synchronize()
        ok = True
        err = ""
    except torch.cuda.OutOfMemoryError as e:
        ok, err = False, str(e)[:2000]
    secs = time.monotonic() - t0
    s = gmlake.stats()  # where the time went, this allocation's part (a library without these numbers: 0)
    counts = ("lease_calls", "chunks_streamed", "chunks_leased", "map_ns", "lease_wait_ns", "import_ns", "map_call_ns",
              "access_ns")
    g = lambda k: s.get(k, 0) - (s0.get(k, 0) if k in counts else 0)
    print(json.dumps({"ok": ok, "seconds": secs, "error": err,
                      "lease_calls": g("lease_calls"), "lease_p50_ms": g("lease_p50_ns") / 1e6,
                      "lease_p99_ms": g("lease_p99_ns") / 1e6, "map_s": g("map_ns") / 1e9,
                      "wait_s": g("lease_wait_ns") / 1e9, "import_s": g("import_ns") / 1e9,
                      "mapcall_s": g("map_call_ns") / 1e9, "access_s": g("access_ns") / 1e9,
                      "streamed": g("chunks_streamed"), "chunks": g("chunks_leased"),
                      "cpu_probe_us": round(probe, 1), "cpu": cpu, "cpu_after": last_cpu()}), flush=True)


def last_cpu():
    try:
        return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return -1


def train_main(steps, pause):
    """Losses of a small deterministic training, with or without pause/resume between steps."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import gmlake
    import torch
    gmlake.enable(mode="daemon")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(1)
    losses, paused_reserved = [], []
    for _ in range(steps):
        x = torch.randn(256, 1024, device="cuda", generator=g)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if pause:
            torch.cuda.synchronize()
            gmlake.pause()
            paused_reserved.append(gmlake.stats()["reserved"])
            gmlake.resume()
    print(json.dumps({"losses": losses, "paused_reserved": paused_reserved}), flush=True)


def run(cmd, env, **kw):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__)] + cmd, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, **kw)


def start_daemon(a, tmp):
    sock, url = os.path.join(tmp, "lake.sock"), "ipc://%s/lake.ctl" % tmp
    log = open(os.path.join(tmp, "daemon.log"), "w")
    daemon = subprocess.Popen([os.path.join(a.build, "gmlaked"), "--backend", "cuda", "--socket", sock, "--control", url,
                               "--limit", a.limit, "--log-level", "info"] +
                              (["--preallocate", a.preallocate] if a.preallocate else []), stderr=log)
    for _ in range(400):
        if subprocess.run([os.path.join(a.build, "gmlakectl"), "--control", url, "stats"], capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    return daemon, log, sock


def stop_daemon(daemon, log):
    daemon.terminate()
    daemon.wait()
    log.close()


def idle_hog(a, env, hog, run_no, variant=""):
    """One idle-hog run on a fresh daemon; returns True when B got it within a second."""
    tmp = tempfile.mkdtemp(prefix="gmlake-elastic.")
    daemon, log, sock = start_daemon(a, tmp)
    env = dict(env, GMLAKE_SOCKET=sock)
    try:
        A = run(["--role", "hog", str(hog)], env)
        before = json.loads(A.stdout.readline())
        B = run(["--role", "taker", str(hog)], env)
        got = json.loads(B.stdout.readline())
        B.wait()
        A.stdin.close()
        after = json.loads(A.stdout.readline())
        A.wait()
    finally:
        stop_daemon(daemon, log)
    tag = "elastic idle-hog run %d%s" % (run_no, " (%s)" % variant if variant else "")
    # GMLAKE_STREAM_MAP=1: the reader thread imports while B's thread waits or maps: its wait holds the imports
    known = got.get("wait_s", 0) + (0 if variant else got.get("import_s", 0)) + got.get("mapcall_s", 0) + got.get("access_s", 0)
    print("%s: B's %.3f s: waiting for the daemon%s %.3f s, importing %.3f s%s, map calls %.3f s, set-access %.3f s, "
          "other %.3f s; %d chunks, %d lease call(s) (p50 %.2f ms), %d chunks streamed; B on core %s..%s, CPU probe %s us" % (
              tag, got["seconds"], " and the reader's imports" if variant else "", got.get("wait_s", 0),
              got.get("import_s", 0), " (on the reader thread)" if variant else "", got.get("mapcall_s", 0),
              got.get("access_s", 0), got["seconds"] - known, got.get("chunks", 0), got.get("lease_calls", 0),
              got.get("lease_p50_ms", 0), got.get("streamed", 0), got.get("cpu"), got.get("cpu_after"),
              got.get("cpu_probe_us")))
    lines = open(os.path.join(tmp, "daemon.log")).read().splitlines()
    for l in lines:
        if "idle cache" in l or "streamed lease" in l or "refused" in l:
            print("%s: daemon: %s" % (tag, l))
    ok = got["ok"] and got["seconds"] <= 1.0
    print("%s: A cached %.1f GiB and sat idle; B asked %.1f GiB of a %s lake%s: %s in %.3f s; A holds %.1f GiB "
          "after: %s%s" % (tag, (before["reserved"] - before["allocated"]) / GiB, hog / GiB, a.limit,
                           " (%s created at start)" % a.preallocate if a.preallocate else "", "got it" if got["ok"] else "refused", got["seconds"], after["reserved"] / GiB,
                           "PASS" if ok else "FAIL", "" if got["ok"] else " (" + got["error"] + ")"))
    if not ok:
        print("\n".join(lines[-40:]))
    shutil.rmtree(tmp, ignore_errors=True)
    return ok, got["seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hog", default="40GiB")
    ap.add_argument("--limit", default="60GiB")
    ap.add_argument("--preallocate", default="", help="the daemon creates this much at start (gmlaked --preallocate)")
    ap.add_argument("--hog-runs", type=int, default=3, help="idle-hog runs, a fresh daemon each")
    ap.add_argument("--stream-map-runs", type=int, default=2, help="then idle-hog runs with GMLAKE_STREAM_MAP=1")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hog-only", action="store_true", help="the idle-hog case only")
    ap.add_argument("--build", default=os.environ.get("BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--role", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role:
        role, arg = a.role
        if role == "hog":
            hog_main(int(arg))
        elif role == "taker":
            taker_main(int(arg))
        else:
            train_main(a.steps, arg == "1")
        return 0

    env = dict(os.environ, GMLAKE_MODE="daemon")
    env.setdefault("GMLAKE_LIB", os.path.join(a.build, "libgmlake-client.so"))
    hog = parse_size(a.hog)
    def summary(results, variant):
        nbad = sum(not ok for ok, _ in results)
        secs = sorted(t for _, t in results)
        if secs:
            print("elastic idle-hog%s: %d run(s), B's time min %.3f s, median %.3f s, max %.3f s: %s" % (
                " (%s)" % variant if variant else "", len(secs), secs[0], secs[len(secs) // 2], secs[-1],
                "PASS" if not nbad else "FAIL (%d over 1 s or refused)" % nbad))
        return nbad
    bad = summary([idle_hog(a, env, hog, i + 1) for i in range(a.hog_runs)], "")
    sm = "GMLAKE_STREAM_MAP=1"
    summary([idle_hog(a, dict(env, GMLAKE_STREAM_MAP="1"), hog, i + 1, sm) for i in range(a.stream_map_runs)], sm)
    if a.hog_only:
        return 1 if bad else 0
    # pause/resume between steps
    tmp = tempfile.mkdtemp(prefix="gmlake-elastic.")
    daemon, log, sock = start_daemon(a, tmp)
    env["GMLAKE_SOCKET"] = sock
    try:
        def train(pause):
            line = run(["--role", "train", pause, "--steps", str(a.steps)], env).stdout.readline()
            if not line:  # its traceback went to stderr; gmlake.pause() needs the torch layer's device client
                raise SystemExit("elastic pause: the training child (pause=%s) printed nothing: FAIL" % pause)
            return json.loads(line)
        plain, paused = train("0"), train("1")
        same = plain["losses"] == paused["losses"]
        empty = all(r == 0 for r in paused["paused_reserved"])
        bad += not (same and empty)
        print("elastic pause: %d steps, losses %s with pause/resume between every step (first %.6f, last %.6f); "
              "reserved while paused %s: %s" % (a.steps, "identical" if same else "DIFFER", plain["losses"][0],
                                                plain["losses"][-1], "0" if empty else paused["paused_reserved"][:4],
                                                "PASS" if same and empty else "FAIL"))
    finally:
        stop_daemon(daemon, log)
        if bad:
            print(open(os.path.join(tmp, "daemon.log")).read()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
