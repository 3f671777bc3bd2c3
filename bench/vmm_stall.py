"""Do VMM calls slow down the GPU work running beside them?

  python3 bench/vmm_stall.py

bench/vmm_cost.c measures what cuMemMap / cuMemSetAccess / cuMemUnmap cost the
calling thread. This measures what they cost the *GPU*: 40 bf16 matmuls
(8192^3) are queued, then, while they run, the thread does N map + set-access
or unmap calls on chunks no kernel touches; the GPU time of the matmuls (CUDA
events) is compared with the same matmuls and no VMM call. Also the same with
the calls interleaved with the launches (as an allocator stitching during a
step does). Prints one line per case: GPU ms, CPU ms of the VMM calls.
"""
import ctypes, statistics, time

import torch

cu = ctypes.CDLL("libcuda.so.1")
CS = 2 << 20


class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Flags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Loc),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", Flags)]


class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]


def ck(rc, what):
    if rc:
        raise RuntimeError("%s failed: %d" % (what, rc))


def main():
    torch.cuda.init()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    dev = torch.cuda.current_device()
    prop = Prop(1, 0, Loc(1, dev), None, Flags())
    acc = Access(Loc(1, dev), 3)
    n = 256
    handles = []
    for _ in range(n):
        h = ctypes.c_uint64()
        ck(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(CS), ctypes.byref(prop), ctypes.c_ulonglong(0)), "cuMemCreate")
        handles.append(h.value)
    base = ctypes.c_uint64()
    ck(cu.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(n * CS), ctypes.c_size_t(CS), ctypes.c_uint64(0),
                              ctypes.c_ulonglong(0)), "cuMemAddressReserve")
    mapped = [False] * n

    def vmap(i):
        addr = ctypes.c_uint64(base.value + i * CS)
        ck(cu.cuMemMap(addr, ctypes.c_size_t(CS), ctypes.c_size_t(0), ctypes.c_uint64(handles[i]), ctypes.c_ulonglong(0)), "map")
        ck(cu.cuMemSetAccess(addr, ctypes.c_size_t(CS), ctypes.byref(acc), ctypes.c_size_t(1)), "access")
        mapped[i] = True

    def vunmap(i):
        ck(cu.cuMemUnmap(ctypes.c_uint64(base.value + i * CS), ctypes.c_size_t(CS)), "unmap")
        mapped[i] = False

    def unmap_all():
        for i in range(n):
            if mapped[i]:
                vunmap(i)

    def run(case, calls):
        """40 matmuls; `calls` VMM operations of kind `case` meanwhile. Returns (gpu ms, cpu ms in calls)."""
        if case == "unmap":  # map first, unmap while the matmuls run
            for i in range(calls):
                vmap(i)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t = 0.0
        k = 0
        for j in range(40):
            torch.matmul(a, b)
            per = calls // 40 + (1 if j < calls % 40 else 0) if case.endswith("_interleaved") else (calls if j == 39 else 0)
            t0 = time.perf_counter()
            for _ in range(per):
                if case.startswith("map"):
                    vmap(k)
                else:
                    vunmap(k)
                k += 1
            t += time.perf_counter() - t0
        e1.record()
        torch.cuda.synchronize()
        if case.startswith("map"):
            unmap_all()
        return e0.elapsed_time(e1), t * 1e3

    for _ in range(3):
        run("none", 0)
    rows = []
    for case, calls in [("none", 0), ("map", 64), ("map", 256), ("unmap", 64), ("unmap", 256),
                        ("map_interleaved", 256), ("unmap_interleaved", 256), ("none", 0)]:
        g, c = zip(*[run(case, calls) for _ in range(5)])
        rows.append((case, calls, statistics.median(g), statistics.median(c)))
        print("vmm stall: %-18s calls %4d  matmuls' GPU time %8.2f ms  (runs %s)  calls' CPU time %7.2f ms" % (
            case, calls, statistics.median(g), ", ".join("%.1f" % x for x in g), statistics.median(c)), flush=True)


if __name__ == "__main__":
    main()
