#!/usr/bin/env python3
"""The lake benchmark (issue 12): N >= 3 processes with staggered peaks share
one gmlaked, and the lake should hold little more than the most they ever
allocate together.

    bench/lake_bench.py [--backend host|cuda] [--unit BYTES] [--seconds S] [--torch] [--json]

Processes (sizes in units, a multiple of the lake's chunk; --unit 4MiB on the host in make test, 1536MiB
on a GPU, whose 6 MiB chunks do not divide 1 GiB):
  notebook   allocates 8 units, frees them at 0.5 s, then sits idle to the end
             (its cache is reclaimed by the daemon while it makes no call)
  trainer    from 0.6 s: 4 units of weights kept, then steps every 50 ms, each
             allocating 6 units of activations and freeing them at step end
  inference  from 1.0 s: a burst every 300 ms: 5 units for 100 ms, then idle

The daemon's limit is 1.05 x the most they allocate together by the schedule
(15 units), so nothing succeeds unless idle caches move between processes: the
notebook's cache goes to the trainer, the trainer's and the server's between
steps and bursts go back and forth. Every process logs (time, allocated,
reserved) at each change and every 10 ms; the bench prints
  max total allocated   max over time of the sum of the processes' allocated
  lake peak             the most chunks the lake held (the daemon's chunks_total,
                        never trimmed here)
  sum of peaks          what separate caches would have held (each process's own
                        peak reserved: PyTorch's default allocator keeps its peak)
and PASS when every allocation succeeded and lake peak <= 1.05 x max total allocated.

--torch: the processes are PyTorch programs on the lake (gmlake.enable(); tensors
of uint8 on cuda; the numbers from gmlake.stats()): the GPU run (bench/gpu.sh lake).
"""
import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

SCHEDULE_MAX_UNITS = 15  # trainer 4 + 6, inference 5 (the notebook's 8 is over before)


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().replace("iB", "").replace("B", "")
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


# ---------- one process of the lake ----------

class CLake:
    """A daemon-mode client through ctypes (no torch)."""

    class Opts(ctypes.Structure):
        _fields_ = [("device", ctypes.c_int), ("backend", ctypes.c_char_p), ("socket_path", ctypes.c_char_p),
                    ("mode", ctypes.c_int), ("limit_bytes", ctypes.c_size_t),
                    ("guard", ctypes.c_int), ("guard_grain", ctypes.c_size_t), ("borrow", ctypes.c_int)]  # all of gml_open_opts

    def __init__(self, socket, backend):
        import gmlake
        self.gmlake = gmlake
        lib = self.lib = gmlake._load()
        lib.gml_open.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.gml_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.gml_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.gml_stats_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.gml_close.argtypes = [ctypes.c_void_p]
        lib.gml_flush.argtypes = [ctypes.c_void_p]
        lib.gml_last_error.argtypes = [ctypes.c_void_p]
        lib.gml_last_error.restype = ctypes.c_char_p
        self.c = ctypes.c_void_p()
        rc = lib.gml_open(ctypes.byref(self.Opts(0, backend.encode(), socket.encode(), 1, 0)), ctypes.byref(self.c))
        if rc:
            raise SystemExit("gml_open: %d" % rc)

    def alloc(self, n):
        p = ctypes.c_void_p()
        rc = self.lib.gml_alloc(self.c, n, None, ctypes.byref(p))
        if rc:
            raise RuntimeError(self.lib.gml_last_error(self.c).decode())
        return p.value

    def free(self, p):
        self.lib.gml_free(self.c, p)

    def numbers(self):
        st = self.gmlake._Stats()
        self.lib.gml_stats_get(self.c, ctypes.byref(st))
        return st.allocated, st.reserved

    def flush(self):
        self.lib.gml_flush(self.c)

    def close(self):
        self.lib.gml_close(self.c)


class TorchLake:
    """A PyTorch program on the lake (gmlake.enable())."""

    def __init__(self, socket, backend):
        os.environ["GMLAKE_SOCKET"] = socket
        import gmlake
        import torch
        gmlake.enable(mode="daemon")
        self.torch, self.gmlake = torch, gmlake
        self.live = {}
        self.first = torch.empty(1, device="cuda")  # opens the device's client: stats() needs one

    def alloc(self, n):
        t = self.torch.empty(n, dtype=self.torch.uint8, device="cuda")
        t.fill_(1)
        self.live[id(t)] = t
        return id(t)

    def free(self, key):
        del self.live[key]

    def numbers(self):
        self.torch.cuda.synchronize()
        s = self.gmlake.stats()
        return s["allocated"], s["reserved"]

    def flush(self):
        pass

    def close(self):
        self.live.clear()


def worker(role, socket, backend, unit, seconds, log_path, use_torch):
    lake = (TorchLake if use_torch else CLake)(socket, backend)
    print("ready", flush=True)  # the driver starts every schedule at one instant once all are up
    t0 = float(sys.stdin.readline())
    log = open(log_path, "w")
    errors = 0
    lock = threading.Lock()

    def note():
        with lock:
            a, r = lake.numbers()
            log.write("%.6f %d %d\n" % (time.monotonic() - t0, a, r))

    # an idle process's cache leaves it on the daemon's request, with no call of
    # its own: sample its numbers every 10 ms too
    done = threading.Event()

    def sampler():
        while not done.wait(0.01):
            note()
    threading.Thread(target=sampler, daemon=True).start()

    def until(t):
        d = t0 + t - time.monotonic()
        if d > 0:
            time.sleep(d)

    def alloc(n):
        nonlocal errors
        try:
            p = lake.alloc(n)
        except RuntimeError as e:
            errors += 1
            sys.stderr.write("%s: allocation of %d failed: %s\n" % (role, n, e))
            return None
        note()
        return p

    def free(p):
        if p is not None:
            lake.free(p)
            note()

    note()
    if role == "notebook":
        ps = [alloc(unit) for _ in range(8)]
        until(0.5)
        for p in ps:
            free(p)
        lake.flush()  # the daemon learns it caches 8 units; then no call at all
        until(seconds)
    elif role == "trainer":
        until(0.6)
        weights = [alloc(unit) for _ in range(4)]
        t = 0.6
        while t + 0.05 < seconds:
            acts = [alloc(unit) for _ in range(6)]
            t += 0.05
            until(t - 0.01)
            for p in acts:
                free(p)
            until(t)
        for p in weights:
            free(p)
    elif role == "inference":
        t = 1.0
        while t + 0.1 < seconds:
            until(t)
            burst = [alloc(unit) for _ in range(5)]
            until(t + 0.1)
            for p in burst:
                free(p)
            t += 0.3
    done.set()
    note()
    log.write("errors %d\n" % errors)
    log.close()
    lake.close()


# ---------- the driver ----------

def ctl(build, url, *args):
    out = subprocess.run([os.path.join(build, "gmlakectl"), "--control", url] + list(args) + ["--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="host")
    ap.add_argument("--unit", default="4MiB")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--build", default=os.environ.get("BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    unit = parse_size(a.unit)
    if a.worker:
        role, socket, log_path, seconds, u = a.worker
        worker(role, socket, a.backend, int(u), float(seconds), log_path, a.torch)
        return 0

    tmp = tempfile.mkdtemp(prefix="gmlake-lake-bench.")
    socket, url = os.path.join(tmp, "lake.sock"), "ipc://%s/lake.ctl" % tmp
    limit = int(1.05 * SCHEDULE_MAX_UNITS * unit)
    env = dict(os.environ)
    env.setdefault("GMLAKE_LIB", os.path.join(a.build, "libgmlake-client.so"))
    dlog = open(os.path.join(tmp, "daemon.log"), "w")
    daemon = subprocess.Popen([os.path.join(a.build, "gmlaked"), "--backend", a.backend, "--socket", socket, "--control", url,
                               "--limit", str(limit), "--prefetch", "0", "--lease-wait", "2000", "--log-level", "warn"],
                              stderr=dlog, env=env)
    try:
        for _ in range(200):
            try:
                st = ctl(a.build, url, "stats")
                break
            except (subprocess.CalledProcessError, ValueError):
                time.sleep(0.025)
        else:
            raise SystemExit("daemon did not come up: %s" % open(os.path.join(tmp, "daemon.log")).read())
        cs = st["chunk_size"]
        if unit % cs:
            raise SystemExit("--unit must be a multiple of the lake's chunk (%d bytes)" % cs)
        roles = ["notebook", "trainer", "inference"]
        procs = []
        for r in roles:
            cmd = [sys.executable, os.path.abspath(__file__), "--backend", a.backend, "--worker", r, socket,
                   os.path.join(tmp, r + ".log"), str(a.seconds), str(unit)] + (["--torch"] if a.torch else [])
            procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("a bench process did not start")
        t0 = time.monotonic() + 0.1  # every schedule starts at this instant
        for p in procs:
            p.stdin.write(repr(t0) + "\n")
            p.stdin.flush()
        rcs = [p.wait() for p in procs]
        end = ctl(a.build, url, "stats")
        # merge the logs: the sums over time
        events, errors, peaks = [], 0, {}
        for r in roles:
            peak, path = 0, os.path.join(tmp, r + ".log")
            if not os.path.exists(path):
                errors += 1  # the worker died before logging
                continue
            for line in open(path):
                f = line.split()
                if f[0] == "errors":
                    errors += int(f[1])
                    continue
                t, al, rs = float(f[0]), int(f[1]), int(f[2])
                events.append((t, r, al, rs))
                peak = max(peak, rs)
            peaks[r] = peak
        events.sort()
        cur_a, max_a = {}, 0
        for t, r, al, rs in events:
            cur_a[r] = al
            max_a = max(max_a, sum(cur_a.values()))
        lake_peak = end["chunks_total"] * cs
        res = {"unit": unit, "limit": limit, "max_total_allocated": max_a, "lake_peak": lake_peak,
               "sum_of_peaks": sum(peaks.values()), "peaks": peaks,
               "failed_allocations": errors, "exit_codes": rcs, "leases_refused": end["leases_refused"],
               "ratio": lake_peak / max_a if max_a else 0.0}
        ok = errors == 0 and not any(rcs) and max_a > 0 and lake_peak <= 1.05 * max_a
        res["pass"] = ok
        if a.json:
            print(json.dumps(res))
        else:
            u = unit / (1 << 20)
            print("lake bench (%s backend, unit %.0f MiB, 3 processes, %.1f s): max total allocated %.1f units, "
                  "lake peak %.1f units (%.3f x), sum of each process's peak %.1f units (separate caches); "
                  "%d failed allocations: %s" % (a.backend, u, a.seconds, max_a / unit, lake_peak / unit, res["ratio"],
                                                 res["sum_of_peaks"] / unit, errors, "PASS" if ok else "FAIL"))
        return 0 if ok else 1
    finally:
        daemon.terminate()
        daemon.wait()
        dlog.close()
        if os.environ.get("GMLAKE_BENCH_KEEP"):
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
