"""Cross-stream borrowing on the GPU: two model replicas training on two streams in one process.

  python3 bench/borrow.py run CONFIG MODE     one run (MODE: two = the replicas' steps on two
                                              streams, enqueued alternately; single = the same
                                              steps one after the other on one stream)
  python3 bench/borrow.py table               every config, each in its own process

CONFIG: default (PyTorch's allocator) | gmlake (GMLAKE_BORROW as set) | gmlake_borrow_off |
        gmlake_borrow_on. The replicas take turns at large and small batches, so one frees
memory while the other grows: with borrowing a stream takes the other's freed blocks (with an
event wait when the other has not passed the free yet) instead of syncing the device or
mapping chunks; PyTorch keeps each stream's blocks to itself. Deterministic algorithms, so
the losses and a parameter checksum must be identical, bit for bit, in every config and mode:
a block handed to a stream before the other stream finished with it would corrupt them.
Prints 'BORROW {json}' per run and a table.
"""
import json, os, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIGS = ["default", "gmlake_borrow_off", "gmlake_borrow_on"]
STEPS = int(os.environ.get("GMLAKE_BORROW_STEPS", "24"))


def run(config, mode):
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
    res = dict(config=config, mode=mode, steps=STEPS, ms_per_step=round(sorted(times)[len(times) // 2], 2),
               losses=[[float.hex(x) for x in l[-3:]] for l in losses], checksum=[float.hex(c) for c in checksum])
    if config.startswith("gmlake"):
        import gmlake
        st = gmlake.stats()
        res.update({k: st.get(k) for k in ("peak_reserved", "peak_allocated", "borrows", "borrow_waits", "syncs", "maps",
                                           "unmaps", "mapped_allocs")})
    else:
        st = torch.cuda.memory_stats()
        res.update(peak_reserved=st["reserved_bytes.all.peak"], peak_allocated=st["allocated_bytes.all.peak"])
    print("BORROW " + json.dumps(res), flush=True)


def table():
    rows = []
    for mode in ("single", "two"):
        for c in CONFIGS:
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "run", c, mode], env=env,
                               capture_output=True, text=True)
            r = next((json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("BORROW ")), None)
            if not r:
                r = dict(config=c, mode=mode, error=(p.stderr or p.stdout)[-800:])
            print(json.dumps(r), flush=True)
            rows.append(r)
    ref = next((r for r in rows if r["config"] == "default" and r["mode"] == "single" and "error" not in r), None)
    print("\n%-18s %-6s %10s %10s %9s %8s %6s %6s %6s  %s" % ("config", "mode", "peak_resv", "peak_alloc", "ms/step",
                                                             "borrows", "waits", "syncs", "maps", "results vs single-stream default"))
    for r in rows:
        if "error" in r:
            print("%-18s %-6s ERROR %s" % (r["config"], r["mode"], r["error"][-300:].replace("\n", " | ")))
            continue
        same = ref and r["losses"] == ref["losses"] and r["checksum"] == ref["checksum"]
        print("%-18s %-6s %9.2fG %9.2fG %9.1f %8s %6s %6s %6s  %s" % (
            r["config"], r["mode"], r["peak_reserved"] / 2**30, r["peak_allocated"] / 2**30, r["ms_per_step"],
            r.get("borrows", "-"), r.get("borrow_waits", "-"), r.get("syncs", "-"), r.get("maps", "-"),
            "identical" if same else "DIFFERENT"))
    two = {r["config"]: r for r in rows if r["mode"] == "two" and "error" not in r}
    if all(c in two for c in CONFIGS):
        on, off, d = (two[c]["peak_reserved"] for c in ("gmlake_borrow_on", "gmlake_borrow_off", "default"))
        print("BORROW_SUMMARY two streams: peak reserved on %.2f GiB, off %.2f GiB, PyTorch default %.2f GiB; "
              "on < off: %s, on < default: %s; all results identical to single-stream: %s" % (
                  on / 2**30, off / 2**30, d / 2**30, on < off, on < d,
                  all(r["losses"] == ref["losses"] and r["checksum"] == ref["checksum"] for r in rows if "error" not in r)
                  if ref else "no reference"))


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3])
    else:
        table()
