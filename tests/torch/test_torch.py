"""PyTorch on the lake (issue 11): each check runs gmlake.enable() in a child
process, embedded and through a gmlaked, and asserts that PyTorch's own
memory APIs behave as under its native allocator. Skipped without torch or a
GPU. Run with pytest, or `python3 tests/torch/run.py` (a table per point)."""
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lake  # noqa: E402

MiB = 1 << 20


# 1. stats
def test_stats(mode):
    r = lake.run(mode, """
        x = torch.empty(10 << 20, dtype=torch.uint8, device="cuda")
        y = torch.empty(3000, dtype=torch.float32, device="cuda")
        a1 = torch.cuda.memory_allocated()
        acc = getattr(getattr(torch, "accelerator", None), "memory_allocated", None)  # device-generic API
        a_acc = acc() if acc else None
        s = torch.cuda.memory_stats()
        keys = [k for k in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
                "allocated_bytes.all.freed", "reserved_bytes.all.current", "active_bytes.all.current",
                "inactive_split_bytes.all.current", "requested_bytes.all.current", "num_alloc_retries", "num_ooms",
                "num_device_alloc", "num_device_free", "gmlake.stitched", "gmlake.chunk_size") if k not in s]
        del x
        peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        summary = torch.cuda.memory_summary()
        print(summary)
        result(a1=a1, a_acc=a_acc, missing=keys, requested=s["requested_bytes.all.current"], reserved=torch.cuda.memory_reserved(),
               peak=peak, after_reset=torch.cuda.max_memory_allocated(), now=torch.cuda.memory_allocated(),
               summary_ok="Allocated memory" in summary and "GPU reserved memory" in summary, gmlake=gmlake.stats()["mode"])
    """)
    assert r["missing"] == []
    assert r["a1"] == (10 << 20) + 12288  # 3000 floats rounded to 512
    assert r["a_acc"] in (None, r["a1"]), r  # torch.accelerator asks c10::GetAllocator(kCUDA)
    assert r["requested"] == (10 << 20) + 12000
    assert r["reserved"] >= r["a1"]
    assert r["peak"] == r["a1"]
    assert r["now"] == 12288 and r["after_reset"] == 12288
    assert r["summary_ok"]
    assert r["gmlake"] == mode


# 2. snapshots
def test_snapshot(mode):
    d = tempfile.mkdtemp()
    path = os.path.join(d, "snap.pickle")
    r = lake.run(mode, """
        torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
        def make():  # 64 MiB: chunks of up to 32 MiB lie wholly in x, unmapped once it is freed (of 6 MiB: 9 or
            # more; x's ends may share a chunk with a neighbour, as a 4 MiB x shared its only one with y)
            return torch.randn(4096, 4096, device="cuda")
        x = make(); y = x * 2; del x
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        s = torch.cuda.memory._snapshot()
        torch.cuda.memory._dump_snapshot(sys.argv[1])
        tr = s["device_traces"][torch.cuda.current_device()]
        alloc_frames = [f["name"] for e in tr if e["action"] == "alloc" for f in e.get("frames", [])]
        live = sum(b["size"] for seg in s["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")
        result(actions=sorted({e["action"] for e in tr}), make_in_stack="make" in alloc_frames, live=live,
               allocated=torch.cuda.memory_allocated(), nseg=len(s["segments"]),
               shown=sum(seg["total_size"] for seg in s["segments"]), reserved=torch.cuda.memory_reserved())
    """, args=[path])
    for a in ("alloc", "free_requested", "free_completed", "segment_map", "segment_unmap"):
        assert a in r["actions"], r["actions"]
    assert r["make_in_stack"]
    assert r["live"] == r["allocated"] and r["nseg"] >= 1
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert "segments" in snap and "device_traces" in snap
    # memory_viz's reserved: after empty_cache every held chunk is mapped, each shown once
    assert r["shown"] == r["reserved"], r
    # memory_viz's Allocator State History replays back to event 0 (tools/memviz_check.py)
    sys.path.insert(0, os.path.join(lake.REPO, "tools"))
    import memviz_check
    problems = memviz_check.check(snap)
    assert not problems, problems[:10]


# 3. streams: record_stream is honoured
def test_record_stream_race(mode):
    # Both streams are created streams: PyTorch's default stream is the legacy
    # NULL stream, which waits for every other blocking stream and would hide a race.
    # y is allocated before the side stream's sleep is queued and every kernel
    # is loaded first: anything that waits for the device would close the
    # window before the free. The window is checked open at the free; an allocator that hands x's memory out again at once (as the old
    # pluggable path did) lets main's fill_ run while the side stream still has
    # to read x: y then holds 10s instead of 2s.
    r = lake.run(mode, RACE)
    assert r["side_busy_at_free"], "the side stream was done before the free: the check saw no race window: %r" % r
    assert r["bad"] == 0, "the side stream read memory that was handed out again: %r" % r


def test_record_stream_race_control(mode):
    # The check above can fail: PyTorch's own allocator, told nothing
    # (record_stream left out), hands x's block to z at once and the side
    # stream reads 5s. A lake allocator that ignored record_stream would do the same.
    if mode != "embedded":
        return
    r = lake.run("torch", RACE.replace("x.record_stream(side)", "pass"))
    assert r["side_busy_at_free"] and r["reused"] and r["bad"] > 0, "the race was not seen: %r" % r


RACE = """
        # every kernel once first: CUDA loads a kernel's module at its first
        # launch (lazy loading), and that load waits for the device: it would
        # end the side stream's sleep before the free
        w = torch.ones(4, device="cuda"); torch.cuda._sleep(1000); v = torch.empty(4, device="cuda")
        torch.mul(w, 2, out=v); v.fill_(5.0); int((v != 2).sum().item()); del w, v
        torch.cuda.synchronize()
        n = 64 << 20  # floats: 256 MiB
        main, side = torch.cuda.Stream(), torch.cuda.Stream()
        with torch.cuda.stream(main):
            x = torch.ones(n, device="cuda")
            with torch.cuda.stream(side):
                y = torch.empty(n, device="cuda")
            torch.cuda.synchronize()
            xp = x.data_ptr()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                torch.cuda._sleep(2_000_000_000)   # keeps the side stream busy (a second or so)
                torch.mul(x, 2, out=y)             # reads x after the sleep
            x.record_stream(side)
            del x
            side_busy_at_free = not side.query()
            z = torch.empty(n, device="cuda")      # same size, main stream, at once
            z.fill_(5.0)
        torch.cuda.synchronize()
        result(bad=int((y != 2).sum().item()), reused=z.data_ptr() == xp, side_busy_at_free=side_busy_at_free,
               active=torch.cuda.memory_stats()["active_bytes.all.current"])
"""


# 4. out of memory
def test_oom(mode):
    daemon = lake.Daemon("--limit", "1GiB") if mode == "daemon" else None
    try:
        r = lake.run(mode, """
            seen = []
            torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.append(a))  # no torch.cuda.memory wrapper in 2.11
            x = torch.empty(600 << 20, dtype=torch.uint8, device="cuda")
            msg = None
            try:
                y = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as e:
                msg = str(e)
            ooms = torch.cuda.memory_stats()["num_ooms"]
            del x
            z = torch.empty(600 << 20, dtype=torch.uint8, device="cuda")   # goes on
            result(msg=msg, observer=len(seen), ooms=ooms, ok=z.numel())
        """, daemon=daemon, env={} if daemon else {"GMLAKE_LIMIT": "1GiB"})
    finally:
        if daemon:
            daemon.stop()
    m = r["msg"]
    assert m and "tried to allocate 2.00 GiB" in m and "allocated" in m and "reserved" in m, m
    if mode == "daemon":
        assert "the lake" in m and "lake holds" in m, m
    assert r["observer"] == 1 and r["ooms"] == 1 and r["ok"] == 600 << 20


# 5. empty_cache
def test_empty_cache(mode):
    r = lake.run(mode, """
        x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        del x
        before = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        result(before=before, after=torch.cuda.memory_reserved(), returned=gmlake.stats()["chunks_returned"])
    """)
    assert r["before"] >= 256 << 20
    assert r["after"] < 8 << 20
    assert r["returned"] > 0


# issue 29: planned placement (GMLAKE_PLAN=1), iterations marked by the optimizer step hook
def test_plan_training(mode):
    code = """
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        x = torch.randn(256, 1024, device="cuda")
        losses, maps = [], []
        for i in range(12):
            loss = m(x).square().mean()
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
            losses.append(loss.item()); maps.append(gmlake.stats()["maps"])
        st = gmlake.stats()
        del loss
        result(losses=losses, maps=maps, steps=st["plan_steps"], taken=st["plans_taken"], hits=st["plan_hits"],
               misses=st["plan_misses"], allocated=torch.cuda.memory_allocated(), gm_allocated=gmlake.stats()["allocated"])
    """
    r = lake.run(mode, code, env={"GMLAKE_PLAN": "1"})
    off = lake.run(mode, code, env={"GMLAKE_PLAN": "0"})
    assert r["steps"] == 12 and off["steps"] == 0, (r, off)  # every optimizer step marked, nothing when off
    assert r["taken"] >= 1 and r["hits"] > 0, r
    assert r["maps"][-1] == r["maps"][6], r  # served from the plan: no map in the last steps
    assert r["losses"] == off["losses"], (r["losses"], off["losses"])  # placement changes no result
    assert r["allocated"] == off["allocated"], (r, off)  # memory_stats count the same live tensors


# 6. CUDA graphs
def test_cuda_graph(mode):
    r = lake.run(mode, """
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)).cuda()
        inp = torch.randn(32, 256, device="cuda")
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3): model(inp)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = model(inp)
        errs = []
        for i in range(3):
            new = torch.randn(32, 256, device="cuda")
            inp.copy_(new); g.replay(); torch.cuda.synchronize()
            errs.append((out - model(new)).abs().max().item())
        gm = torch.cuda.make_graphed_callables(model, (torch.randn(32, 256, device="cuda"),))
        new = torch.randn(32, 256, device="cuda")
        errs.append((gm(new) - model(new)).abs().max().item())
        del g, out
        result(errs=errs)
    """)
    assert max(r["errs"]) < 1e-5, r


def test_compile_reduce_overhead(mode):
    r = lake.run(mode, """
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 32)).cuda().eval()
        f = torch.compile(model, mode="reduce-overhead")
        errs = []
        with torch.no_grad():
            for i in range(5):
                x = torch.randn(16, 128, device="cuda")
                errs.append((f(x) - model(x)).abs().max().item())
        result(errs=errs)
    """, timeout=600)
    assert max(r["errs"]) < 1e-4, r


def test_compile_checkpoint(mode):
    """cudagraph trees restore a pool checkpoint (setCheckpointPoolState) when they must record
    a new graph from a node that is not the tail of their tree: first PyTorch's own
    test_live_outputs_multiple_graphs (test/inductor/test_cudagraph_trees.py), where the
    branch after a graph break changes with the data, then a training step (forward and
    backward) whose branch changes from step to step. With PyTorch's slow-path asserts on,
    the trees check after each restore that the pool's live blocks are exactly the live
    tensors and carry the allocator's deleter. Results must equal eager."""
    r = lake.run(mode, """
        import copy
        import torch._inductor.config as icfg
        from torch._inductor import cudagraph_trees
        icfg.triton.slow_path_cudagraph_asserts = True
        dev = torch.cuda.current_device()
        def checkpoints():
            m = cudagraph_trees.get_container(dev).tree_manager
            return m.debug_checkpointing_counter if m is not None else 0

        def foo(x):
            x = x + x + x
            y = x + 1
            torch._dynamo.graph_break()
            z = x * x
            if z.sum() > 0:
                return y + 1
            return y
        foo_opt = torch.compile(foo, mode="reduce-overhead")
        errs = []
        for v in (0.0, 0.0, 1.0, 1.0, 0.0, 2.0, 0.0, 3.0):
            x = torch.full([5], v, device="cuda")
            errs.append((foo_opt(x) - foo(x)).abs().max().item())
        inference_ckpts = checkpoints()

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b, self.c = (torch.nn.Linear(64, 64) for _ in range(3))
            def forward(self, x):
                h = torch.relu(self.a(x))
                torch._dynamo.graph_break()
                if x.sum() > 0:
                    return (self.b(h) ** 2).mean()
                return (self.c(h) ** 2).mean()
        torch.manual_seed(0)
        ref = M().cuda()
        mod = copy.deepcopy(ref)
        f = torch.compile(mod, mode="reduce-overhead")
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
        opt = torch.optim.SGD(mod.parameters(), lr=0.05)
        losses, loss_errs = [], []
        for step, sign in enumerate((1, 1, 1, -1, -1, 1, -1, 1, -1, -1, 1, 1)):
            x = torch.randn(32, 64, device="cuda").abs() * sign
            loss = f(x)
            loss.backward()
            opt.step(); opt.zero_grad(set_to_none=True)
            l_ref = ref(x)
            l_ref.backward()
            opt_ref.step(); opt_ref.zero_grad(set_to_none=True)
            losses.append(l_ref.item())
            loss_errs.append(abs(loss.item() - l_ref.item()))
        w_err = max((p - q).abs().max().item() for p, q in zip(mod.parameters(), ref.parameters()))
        result(errs=errs, inference_ckpts=inference_ckpts, training_ckpts=checkpoints() - inference_ckpts,
               loss_errs=loss_errs, losses=losses, w_err=w_err)
    """, timeout=600)
    assert r["inference_ckpts"] >= 1, r  # PyTorch's own test expects 2 here
    assert max(r["errs"]) < 1e-6, r
    assert max(r["loss_errs"]) < 1e-4 and r["w_err"] < 1e-4, r


# 7. IPC through torch.multiprocessing
def test_multiprocessing_ipc(mode):
    r = lake.run(mode, """
        import torch.multiprocessing as mp
        def child(q, out):
            t = q.get()
            out.put(float(t.sum().item()))
            q.get()            # the sender has dropped its reference by now
            out.put(float(t.sum().item()))
        if __name__ == "__main__":
            mp.set_start_method("spawn")
            q, out = mp.SimpleQueue(), mp.Queue()   # SimpleQueue pickles here: a failure raises here
            p = mp.Process(target=child, args=(q, out)); p.start()
            try:
                t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
                want = float(t.sum().item())
                q.put(t)
                first = out.get(timeout=120)
                del t
                torch.cuda.empty_cache()
                q.put("go")
                second = out.get(timeout=120)
                p.join(60)
                result(want=want, first=first, second=second, rc=p.exitcode)
            finally:
                if p.is_alive():
                    p.kill()
    """)
    assert r["first"] == r["want"] and r["second"] == r["want"] and r["rc"] == 0, r


# 8. set_per_process_memory_fraction
def test_memory_fraction(mode):
    r = lake.run(mode, """
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(0.02)
        a = torch.empty(int(total * 0.01), dtype=torch.uint8, device="cuda")
        over = False
        try:
            b = torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            over = True
        torch.cuda.set_per_process_memory_fraction(1.0)
        c = torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")
        result(over=over, frac=torch.cuda.get_per_process_memory_fraction() if hasattr(torch.cuda, "get_per_process_memory_fraction") else None)
    """)
    assert r["over"]


# Hugging Face Trainer with memory metrics
def test_hf_trainer(mode):
    r = lake.run(mode, """
        import tempfile
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=64))
        data = [{"input_ids": torch.randint(0, 512, (32,)), "labels": torch.randint(0, 512, (32,))} for _ in range(64)]
        args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=8, per_device_train_batch_size=8,
                                 skip_memory_metrics=False, report_to=[], save_strategy="no", logging_steps=4)
        out = Trainer(model=model, args=args, train_dataset=data).train()
        mem = {k: v for k, v in out.metrics.items() if "mem" in k}
        result(mem=mem, loss=out.training_loss)
    """, timeout=600)
    assert any(k.startswith("train_mem_gpu") for k in r["mem"]), r
    assert r["loss"] == r["loss"]  # not NaN


# 8. several GPUs: two devices in one process, and DDP with one process per GPU
def _gpus(mode):
    """Daemons for every GPU in daemon mode (GMLAKE_SOCKET holds %d), else None."""
    n = lake.gpu_count()
    if n < 2:
        lake.skip("needs two GPUs (this machine has %d)" % n)
    return lake.Daemons(2) if mode == "daemon" else None


def test_two_devices(mode):
    daemons = _gpus(mode)
    try:
        r = lake.run(mode, """
            free0, free1 = torch.cuda.mem_get_info(0)[0], torch.cuda.mem_get_info(1)[0]
            a = torch.randn(1 << 28, device="cuda:0")          # 1 GiB on GPU 0
            b = torch.randn(1 << 28, device="cuda:1")          # 1 GiB on GPU 1
            c = (a.to("cuda:1") + b).to("cuda:0")               # across devices and back
            ok = bool(torch.equal(c.cpu(), a.cpu() + b.cpu()))
            torch.cuda.synchronize(0); torch.cuda.synchronize(1)
            used0 = free0 - torch.cuda.mem_get_info(0)[0]
            used1 = free1 - torch.cuda.mem_get_info(1)[0]
            s0, s1 = gmlake.stats(0), gmlake.stats(1)
            result(ok=ok, alloc=[torch.cuda.memory_allocated(0), torch.cuda.memory_allocated(1)],
                   used=[used0, used1], modes=[s0["mode"], s1["mode"]], backend=[s0["backend"], s1["backend"]])
        """, daemon=daemons)
    finally:
        if daemons:
            daemons.stop()
    GiB = 1 << 30
    assert r["ok"], r
    assert r["modes"] == [mode, mode] and r["backend"] == ["cuda", "cuda"], r
    assert r["alloc"][0] >= 2 * GiB and GiB <= r["alloc"][1] < 2 * GiB, r  # a, c on 0; b (and the copy, freed) on 1
    # each tensor's memory is on its own GPU: the device's free memory fell by (most of) what it holds
    # (a daemon created up to its prefetch, 256 MiB, before the process measured)
    assert r["used"][0] >= 1.5 * GiB and r["used"][1] >= 0.7 * GiB, r


DDP = """
    import tempfile
    import torch.distributed as dist
    import torch.multiprocessing as mp
    def rank_main(rank, init, out):
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=2)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        g = torch.Generator(device="cuda").manual_seed(100 + rank)
        losses = []
        for _ in range(12):
            x = torch.randn(512, 1024, device="cuda", generator=g)
            loss = (ddp(x) - x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        csum = float(sum(p.double().sum().item() for p in model.parameters()))
        lake_mode = gmlake.stats(rank)["mode"] if gmlake.enabled() else "torch"
        out.put((rank, losses, csum, lake_mode, torch.cuda.max_memory_allocated(rank)))
        dist.destroy_process_group()
    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        out = ctx.SimpleQueue()
        init = "file://" + tempfile.mktemp(prefix="gmlake-ddp-")
        ps = [ctx.Process(target=rank_main, args=(r, init, out)) for r in range(2)]
        for p in ps: p.start()
        got = sorted(out.get() for _ in ps)
        for p in ps: p.join(120)
        result(losses=[g[1] for g in got], csum=[g[2] for g in got], modes=[g[3] for g in got],
               peak=[g[4] for g in got], rc=[p.exitcode for p in ps])
"""


def test_ddp(mode):
    daemons = _gpus(mode)
    try:
        r = lake.run(mode, DDP, daemon=daemons, timeout=600)
    finally:
        if daemons:
            daemons.stop()
    ref = lake.run("torch", DDP, timeout=600)  # the same run on PyTorch's own allocator
    assert r["rc"] == [0, 0] and r["modes"] == [mode, mode], r
    assert r["losses"] == ref["losses"] and r["csum"] == ref["csum"], (r, ref)


# issue 32: IPC with processes that never enabled GMLake, in both directions. The sender shares a
# 16 MiB tensor; the receiver reads it, the sender drops its reference and allocates over the freed
# memory (torch.multiprocessing keeps the block alive while a receiver holds it), the receiver reads
# it again. sys.argv: start method, the receiver's mode ("torch": PyTorch's own allocator), and
# "die": the first receiver exits at once without letting go, and a second one gets a new tensor.
# Every wait is bounded and says what it waited for: a reply the receiver never sent ends the wait as
# soon as the receiver is gone, with its exit status, not after the full timeout.
IPC_INTEROP = """
    import queue
    import time
    import torch.multiprocessing as mp
    def child(q, out, die):
        try:
            t = q.get()
            out.put(["first", float(t.sum().item()), gmlake.enabled()])
            if die:
                # Queue.put only hands the reply to the queue's feeder thread, which os._exit kills
                # before it writes (lost in 10 of 10 tries on the host, spawn and forkserver: the
                # sender's get(timeout=180) ran out in each mode, the run that seemed to hang, and
                # PyTorch warned at its exit of the tensor still shared): flush it, then die holding t
                out.close()
                out.join_thread()
                os._exit(9)
            q.get()
            out.put(["second", float(t.sum().item()), None])
        except Exception as e:  # noqa: BLE001
            out.put(["error", repr(e)[-3000:], gmlake.enabled()])
    def reply(out, p, what, timeout=120):
        t0, gone = time.time(), None
        while True:
            try:
                return out.get(timeout=1)
            except queue.Empty:
                pass
            if p.exitcode is not None and gone is None:
                gone = time.time()
            if gone is not None and time.time() - gone > 3:  # what it wrote before it exited has arrived
                raise RuntimeError("the receiver (pid %d) exited with status %s without sending its %r reply "
                                   "(%.0f s after the sender shared the tensor)" % (p.pid, p.exitcode, what, time.time() - t0))
            if time.time() - t0 > timeout:
                raise RuntimeError("the receiver (pid %d) sent no %r reply in %d s and is still running: it is stuck "
                                   "opening or reading the tensor" % (p.pid, what, timeout))
    def share(ctx, die):
        q, out = ctx.SimpleQueue(), ctx.Queue()
        p = ctx.Process(target=child, args=(q, out, die)); p.start()
        try:
            t = torch.arange(1 << 22, dtype=torch.float32, device="cuda")
            want = float(t.sum().item())
            q.put(t)
            first = reply(out, p, "first")
            del t
            junk = [torch.full((1 << 22,), 7.0, device="cuda") for _ in range(4)]  # reuse of what was freed
            torch.cuda.synchronize()
            second = None
            if not die and first[0] != "error":
                q.put("go")
                second = reply(out, p, "second")
            p.join(30)
            return dict(want=want, first=first, second=second, rc=p.exitcode)
        finally:
            if p.is_alive():
                p.kill()
                p.join(10)
    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        os.environ["GMLAKE_TEST_MODE"] = sys.argv[2]   # what the children run
        die = len(sys.argv) > 3 and sys.argv[3] == "die"
        r = share(ctx, die)
        if die:
            r["after"] = share(ctx, False)   # the sender goes on sharing after a receiver died holding one
        result(sender=gmlake.enabled(), **r)
"""


def _ptrace_scope():
    try:
        return int(open("/proc/sys/kernel/yama/ptrace_scope").read())
    except (OSError, ValueError):
        return -1


def _ipc_check(r, what, rc=0):
    """Both reads equal the sender's sum; an error the kernel's ptrace rules cause is a skip (PyTorch's own
    receiver meets the same refusal), naming it."""
    for got in (r["first"], r["second"]):
        if got and got[0] == "error":
            if "pidfd_getfd" in got[1] and "ptrace_scope" in got[1] and _ptrace_scope() >= 1:
                lake.skip("%s: the kernel refused pidfd_getfd (ptrace_scope %d): %s" % (what, _ptrace_scope(), got[1][:300]))
            raise AssertionError("%s: the receiver failed: %s" % (what, got[1]))
    assert r["first"][1] == r["want"], (what, r)
    if r["second"] is not None:
        assert r["second"][1] == r["want"], (what, "the sender's reuse reached the receiver's tensor", r)
    assert r["rc"] == rc, (what, r)


def _ipc(mode, method, sender_lake, env=None, die=False):
    """sender_lake: the parent runs on the lake (mode) and the child on PyTorch's own allocator; else the
    reverse. The receiver's and sender's allocators are checked as they ran."""
    e = dict(env or {})
    if sender_lake:
        r = lake.run(mode, IPC_INTEROP, args=(method, "torch") + (("die",) if die else ()), env=e)
        assert r["sender"] and r["first"][2] is False, r
    else:
        if mode == "daemon":
            e["GMLAKE_SOCKET"] = lake.shared_daemon().sock
        r = lake.run("torch", IPC_INTEROP, args=(method, mode), env=e)
        assert not r["sender"] and (r["first"][2] is True or r["first"][0] == "error"), r
    what = "%s %s -> %s (%s)" % (method, "lake" if sender_lake else "PyTorch", "PyTorch" if sender_lake else "lake", mode)
    _ipc_check(r, what, 9 if die else 0)
    if die:
        _ipc_check(r["after"], what + ", after a receiver died")
    return r


def test_ipc_lake_to_torch_spawn(mode):
    _ipc(mode, "spawn", True)


def test_ipc_lake_to_torch_forkserver(mode):
    _ipc(mode, "forkserver", True)


def test_ipc_torch_to_lake_spawn(mode):
    _ipc(mode, "spawn", False)  # PyTorch's default allocator: a cudaIpcMemHandle


def test_ipc_torch_to_lake_forkserver(mode):
    _ipc(mode, "forkserver", False)


def test_ipc_torch_expandable_to_lake(mode):
    _ipc(mode, "spawn", False, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})


def test_ipc_receiver_dies(mode):
    _ipc(mode, "spawn", True, die=True)


def test_ipc_lake_to_lake_forkserver(mode):
    r = lake.run(mode, IPC_INTEROP, args=("forkserver", mode))
    assert r["sender"] and r["first"][2] is True, r
    _ipc_check(r, "forkserver lake -> lake (%s)" % mode)


# issue 32: torch.cuda.mem_get_info as the lake sees it. Embedded: total is the device's, or the
# memory fraction's share; 90% of free can be taken. Daemon: two processes start at once on a lake of
# 4 GiB, each takes 90% of what mem_get_info says is free, both succeed, and while both hold it the
# lake's leased chunks stay within its limit.
MEMINFO = """
    import time
    free, total = torch.cuda.mem_get_info()
    dev_total = torch.cuda.get_device_properties(0).total_memory
    frac = float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "-" else None
    if frac:
        torch.cuda.set_per_process_memory_fraction(frac)
        free, total = torch.cuda.mem_get_info()
    x = torch.empty(int(free * 0.9), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    d = sys.argv[2] if len(sys.argv) > 2 else None
    if d:  # hold it until the test has looked at the lake
        open(os.path.join(d, "held-%d" % os.getpid()), "w").close()
        t0 = time.time()
        while not os.path.exists(os.path.join(d, "done")) and time.time() - t0 < 300:
            time.sleep(0.05)
    result(free=free, total=total, dev_total=dev_total, took=x.numel(), orig=torch.cuda.mem_get_info._gmlake_orig()[1])
"""


def test_mem_get_info(mode):
    if mode == "embedded":
        r = lake.run(mode, MEMINFO)
        assert r["total"] == r["orig"] and 0 < r["free"] <= r["total"], r  # the device's (cudaMemGetInfo's) total
        r = lake.run(mode, MEMINFO, args=("0.25",))
        assert abs(r["total"] - 0.25 * r["orig"]) <= 1 << 20 and r["free"] <= r["total"], r
        return
    import concurrent.futures
    import tempfile
    limit = 4 << 30
    d = lake.Daemon("--limit", "4GiB", "--prefetch", "0")
    hold = tempfile.mkdtemp(prefix="gmlake-meminfo-")
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            futs = [ex.submit(lake.run, mode, MEMINFO, d, None, 300, ("-", hold)) for _ in range(2)]
            t0 = time.time()
            while len([f for f in os.listdir(hold) if f.startswith("held-")]) < 2 and time.time() - t0 < 300:
                if any(f.done() for f in futs):
                    break  # one failed: its exception below
                time.sleep(0.05)
            s = d.ctlstats()
            open(os.path.join(hold, "done"), "w").close()
            rs = [f.result() for f in futs]
        leased = s["chunks_leased"] * s["chunk_size"]
        print("  mem_get_info at once on a 4 GiB lake: told %s free, took %s; the lake leased %d MiB" % (
            [r["free"] >> 20 for r in rs], [r["took"] >> 20 for r in rs], leased >> 20))
        for r in rs:  # the lake's limit in whole chunks (4092 MiB of 6 MiB chunks); PyTorch's own: the device's
            assert limit - s["chunk_size"] < r["total"] <= limit and r["orig"] > limit, r
        assert sum(r["took"] for r in rs) <= limit and leased <= limit, (rs, s)
    finally:
        d.stop()
        shutil.rmtree(hold, ignore_errors=True)
