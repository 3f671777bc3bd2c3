"""Cross-stream borrowing on the GPU, two workloads, each config in its own process:

  replicas  two model replicas training on two streams in one process (GLake's Wavelet test):
            replica k's step on stream k, enqueued one after the other, a synchronize per step
  side      compute plus a side stream with bursts: a 24-layer MLP whose weights are kept packed
            (bf16) and unpacked (fp32, 64 MiB a layer) on a side stream just before their layer, as
            FSDP gathers parameters; the compute stream waits for the side stream, uses the weights
            (record_stream) and frees them at once, keeping each layer's output until the step's
            end (as a forward keeps activations for its backward). The CPU runs a whole step ahead
            of the GPU, so every layer's free waits for the compute stream when the side stream
            asks again (tests/test_borrow.c's side-stream test is this workload on the host)

  python3 bench/borrow.py run WORKLOAD CONFIG MODE   one run (MODE: two = on two streams as above;
                                                     single = the same work on one stream)
  python3 bench/borrow.py table [WORKLOAD...]        every config and mode (default: both workloads)

CONFIG: default (PyTorch's allocator) | gmlake (GMLAKE_BORROW as set) | gmlake_borrow_off |
gmlake_borrow_on. With borrowing off, a free that waits for another stream (record_stream) holds
its memory until that stream passes it, so the side stream leases more for every layer (as
PyTorch's allocator does); with borrowing on, the lake makes the side stream wait for the compute
stream on the device instead and reuses the memory. Between the replicas, the lake without
borrowing already reuses the other stream's chunks after a fence or a device synchronize;
borrowing replaces those synchronizes by waits on the device. Deterministic algorithms, so the
outputs (losses, checksums) must be identical, bit for bit, in every config and mode: memory
handed to a stream before the other stream finished with it would corrupt them.
Prints 'BORROW {json}' per run, a table per workload and a BORROW_SUMMARY line per workload.
"""
import json, os, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIGS = ["default", "gmlake_borrow_off", "gmlake_borrow_on"]
STEPS = int(os.environ.get("GMLAKE_BORROW_STEPS", "24"))
SIDE_STEPS = int(os.environ.get("GMLAKE_BORROW_SIDE_STEPS", "12"))
WORKLOADS = ["replicas", "side"]


def setup(config):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if config.startswith("gmlake"):
        if config.endswith("_off"):
            os.environ["GMLAKE_BORROW"] = "0"
        elif config.endswith("_on"):
            os.environ["GMLAKE_BORROW"] = "1"
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gmlake
        gmlake.enable(mode="embedded")
    import torch
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.enable_flash_sdp(False)  # the math attention: deterministic forward and backward
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def memory(config, torch):
    if config.startswith("gmlake"):
        import gmlake
        st = gmlake.stats()
        return {k: st.get(k) for k in ("peak_reserved", "peak_allocated", "borrows", "borrow_waits", "syncs", "maps",
                                       "unmaps", "mapped_allocs")}
    st = torch.cuda.memory_stats()
    return dict(peak_reserved=st["reserved_bytes.all.peak"], peak_allocated=st["allocated_bytes.all.peak"])


def run_replicas(config, mode):
    torch = setup(config)
    dev = "cuda"

    def replica(seed):
        torch.manual_seed(seed)
        layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, dropout=0.0,
                                                 batch_first=True)
        m = torch.nn.TransformerEncoder(layer, num_layers=8, enable_nested_tensor=False).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        return m, opt

    reps = [replica(1), replica(2)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()] if mode == "two" else [torch.cuda.current_stream()] * 2
    torch.cuda.synchronize()
    big, small = (48, 512), (8, 256)

    def step(k, i):
        m, opt = reps[k]
        b, s = big if (i + k) % 2 == 0 else small  # the replicas take turns at the large batch
        g = torch.Generator(device=dev).manual_seed(1000 * k + i)
        x = torch.randn(b, s, 1024, device=dev, generator=g)
        loss = m(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    losses = [[], []]
    times = []
    for i in range(STEPS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = []
        for k in (0, 1):  # enqueued alternately: on two streams they overlap on the device
            with torch.cuda.stream(streams[k]):
                out.append(step(k, i))
        torch.cuda.synchronize()
        if i >= 2:
            times.append((time.perf_counter() - t) * 1e3)
        for k in (0, 1):
            losses[k].append(out[k].item())
    checksum = [float(sum(p.double().sum().item() for p in m.parameters())) for m, _ in reps]
    res = dict(workload="replicas", config=config, mode=mode, steps=STEPS,
               ms_per_step=round(sorted(times)[len(times) // 2], 2),
               losses=[[float.hex(x) for x in l[-3:]] for l in losses], checksum=[float.hex(c) for c in checksum])
    res.update(memory(config, torch))
    print("BORROW " + json.dumps(res), flush=True)


def run_side(config, mode):
    torch = setup(config)
    dev = "cuda"
    layers, width, batch = 24, 4096, 4096
    g = torch.Generator(device=dev).manual_seed(7)
    packed = [(torch.randn(width, width, device=dev, generator=g) / width ** 0.5).to(torch.bfloat16) for _ in range(layers)]
    compute = torch.cuda.current_stream()
    side = torch.cuda.Stream() if mode == "two" else compute
    torch.cuda.synchronize()
    outs, times = [], []
    for i in range(SIDE_STEPS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        x = torch.randn(batch, width, device=dev, generator=torch.Generator(device=dev).manual_seed(100 + i))
        acts = []  # every layer's output, kept as a training forward keeps them for its backward
        for l in range(layers):
            with torch.cuda.stream(side):  # the burst: this layer's weights, unpacked
                w = packed[l].to(torch.float32)
            compute.wait_stream(side)
            if side is not compute:
                w.record_stream(compute)
            x = (x @ w).tanh_()  # in place: the compute stream frees nothing before the step's end
            acts.append(x)
            del w  # freed at once: on two streams the free waits for the compute stream
        outs.append(x.double().sum().item())  # the step's only synchronization: the CPU ran a step ahead
        del acts, x
        if i >= 2:
            times.append((time.perf_counter() - t) * 1e3)
    res = dict(workload="side", config=config, mode=mode, steps=SIDE_STEPS,
               ms_per_step=round(sorted(times)[len(times) // 2], 2), losses=[float.hex(o) for o in outs[-3:]],
               checksum=[float.hex(sum(outs))])
    res.update(memory(config, torch))
    print("BORROW " + json.dumps(res), flush=True)


def table(workloads):
    for wl in workloads:
        rows = []
        for mode in ("single", "two"):
            for c in CONFIGS:
                env = dict(os.environ, PYTHONUNBUFFERED="1")
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "run", wl, c, mode], env=env,
                                   capture_output=True, text=True)
                r = next((json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("BORROW ")), None)
                if not r:
                    r = dict(workload=wl, config=c, mode=mode, error=(p.stderr or p.stdout)[-800:])
                print(json.dumps(r), flush=True)
                rows.append(r)
        print_table(wl, rows)


def print_table(wl, rows):
    ok = [r for r in rows if "error" not in r]
    ref = next((r for r in ok if r["config"] == "default" and r["mode"] == "single"), None)
    same = lambda r: ref is not None and r["losses"] == ref["losses"] and r["checksum"] == ref["checksum"]
    print("\n%-9s %-18s %-6s %10s %10s %9s %8s %6s %6s %6s  %s" % (
        "workload", "config", "mode", "peak_resv", "peak_alloc", "ms/step", "borrows", "waits", "syncs", "maps",
        "results vs single-stream default"))
    for r in rows:
        if "error" in r:
            print("%-9s %-18s %-6s ERROR %s" % (wl, r["config"], r["mode"], r["error"][-300:].replace("\n", " | ")))
            continue
        print("%-9s %-18s %-6s %9.2fG %9.2fG %9.1f %8s %6s %6s %6s  %s" % (
            wl, r["config"], r["mode"], r["peak_reserved"] / 2**30, r["peak_allocated"] / 2**30, r["ms_per_step"],
            r.get("borrows", "-"), r.get("borrow_waits", "-"), r.get("syncs", "-"), r.get("maps", "-"),
            "identical" if same(r) else "DIFFERENT"))
    two = {r["config"]: r for r in ok if r["mode"] == "two"}
    if all(c in two for c in CONFIGS):
        on, off, d = (two[c] for c in ("gmlake_borrow_on", "gmlake_borrow_off", "default"))
        print("BORROW_SUMMARY %s, two streams: peak reserved on %.2f GiB, off %.2f GiB, PyTorch default %.2f GiB; "
              "on < off: %s, on < default: %s; ms/step on %.1f, off %.1f, default %.1f; "
              "all results identical to single-stream: %s" % (
                  wl, on["peak_reserved"] / 2**30, off["peak_reserved"] / 2**30, d["peak_reserved"] / 2**30,
                  on["peak_reserved"] < off["peak_reserved"], on["peak_reserved"] < d["peak_reserved"],
                  on["ms_per_step"], off["ms_per_step"], d["ms_per_step"],
                  len(ok) == len(rows) and all(same(r) for r in ok)), flush=True)
    else:
        print("BORROW_SUMMARY %s: incomplete (a run failed)" % wl, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        {"replicas": run_replicas, "side": run_side}[sys.argv[2]](sys.argv[3], sys.argv[4])
    else:
        table(sys.argv[2:] or WORKLOADS)
