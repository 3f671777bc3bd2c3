"""Four processes serving the same ~1B-parameter model (a Llama-style config,
random weights from one seed: nothing is downloaded), with one copy of the
weights in the lake instead of four.

    python3 bench/share_weights.py [--procs 4] [--small]     (BUILD=build: gmlaked, gmlakectl)

It starts a gmlaked (cuda backend, or --backend host on the CPU) and runs, in turn:
  unshared  the processes each hold their own weights (PyTorch's allocator): the baseline
  attach    process 0 builds the model and gmlake.share()s it; the others build it
            and gmlake.attach() it (their own copy is freed)
  dedup     every process builds it and calls gmlake.dedup(): the first publishes,
            the others find the same bytes and map them
Each process computes the logits of a fixed prompt and 8 greedy tokens; they must
equal the unshared processes' bit for bit. Printed per mode: the weight memory of
all processes together (the lake's shared bytes once, plus parameter and buffer
bytes each process still holds privately) against one copy, and the device's used
memory with every process up (CUDA contexts included, so only the differences
between modes mean something).

PASS/FAIL lines:
  outputs    every process of every mode: logits and tokens equal to the unshared ones
  memory     attach and dedup: weights of all processes <= 1.1 x one copy
  freed      after the processes exit, the lake holds no shared chunk
Results also go to $OUT/share_weights.json when OUT is set.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
KEY = "bench-llama"


# ---------- one serving process ----------

def _on(device):
    """Build modules directly on device where torch can (2.0+), else on the CPU first."""
    import contextlib
    import torch
    return torch.device(device) if hasattr(torch.device(device), "__enter__") else contextlib.nullcontext()


def build_model(small, device):
    import torch
    torch.manual_seed(1234)
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        if small:
            cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)
        else:  # TinyLlama-1.1B's shape
            cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
        with _on(device):
            m = LlamaForCausalLM(cfg)
        vocab = cfg.vocab_size
        hf = True
    except ImportError:
        width, layers, vocab = (256, 2, 1000) if small else (2048, 30, 32000)
        with _on(device):
            blocks = [torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
                      for _ in range(layers)]
            m = torch.nn.Sequential(torch.nn.Embedding(vocab, width), *blocks, torch.nn.Linear(width, vocab))
        hf = False
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return m.to(device=device, dtype=dtype).eval(), vocab, hf


def outputs(m, vocab, hf, device):
    import torch
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (2, 16), generator=g).to(device)
    logits_fn = (lambda x: m(input_ids=x).logits) if hf else (lambda x: m(x))
    with torch.no_grad():
        logits = logits_fn(ids).float()
        h = hashlib.sha256(logits.cpu().contiguous().view(torch.int32).numpy().tobytes()).hexdigest()[:16]
        toks = []
        for _ in range(8):
            nxt = logits_fn(ids)[:, -1].argmax(-1, keepdim=True)
            toks.append(nxt)
            ids = torch.cat([ids, nxt], 1)
    return h, torch.cat(toks, 1).cpu().tolist()


def worker(mode, rank, small):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import gmlake
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    m, vocab, hf = build_model(small, device)
    params = list(m.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    buffer_bytes = sum(b.numel() * b.element_size() for b in m.buffers())
    rng, deduped = None, None
    t0 = time.perf_counter()
    if mode == "attach":
        rng = gmlake.share(m, KEY) if rank == 0 else gmlake.attach(m, KEY)
    elif mode == "dedup":
        rng = gmlake.dedup(m, return_range=True)
        deduped = rng.deduped
    secs = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the old parameters' memory back to the driver
    h, toks = outputs(m, vocab, hf, device)
    # parameters outside the lake's shared range are private copies (all of them when unshared)
    base, size = (rng.base, rng.nbytes) if rng is not None else (0, 0)
    private = sum(p.numel() * p.element_size() for p in params if not base <= p.data_ptr() < base + size)
    print("ready " + json.dumps({"rank": rank, "params": sum(p.numel() for p in params), "out": h, "tokens": toks, "param_bytes": param_bytes,
                                 "buffer_bytes": buffer_bytes, "private_param_bytes": private, "setup_s": secs,
                                 "deduped": deduped, "hf": hf}), flush=True)
    sys.stdin.readline()  # every process is up: measure the device
    free, total = torch.cuda.mem_get_info() if device.type == "cuda" else (0, 0)
    alloc = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    print("mem " + json.dumps({"rank": rank, "device_used": total - free, "torch_allocated": alloc}), flush=True)
    sys.stdin.readline()


# ---------- the orchestrator ----------

def ctl(url, *args):
    out = subprocess.run([os.path.join(BUILD, "gmlakectl"), "--control", url, *args, "--json"], capture_output=True,
                         text=True).stdout
    return json.loads(out) if out.strip() else None


def run_mode(mode, n, small, env):
    def start(rank):
        return subprocess.Popen([sys.executable, __file__, "--worker", mode, str(rank)] + (["--small"] if small else []),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ready(p):
        line = p.stdout.readline()
        if not line.startswith("ready "):
            raise RuntimeError("a %s process said %r (exit %s)" % (mode, line, p.poll()))
        return json.loads(line[6:])

    procs, infos = [start(0)], []
    infos.append(ready(procs[0]))  # the publisher first: attachers need its share
    procs += [start(r) for r in range(1, n)]
    infos += [ready(p) for p in procs[1:]]
    ctl(env["GMLAKE_CONTROL"], "trim")  # chunks given back (dedup) or pre-created go to the driver: device used is then real
    lake = (ctl(env["GMLAKE_CONTROL"], "stats"), ctl(env["GMLAKE_CONTROL"], "shares"))
    mems = []
    for p in procs:
        p.stdin.write("\n")
        p.stdin.flush()
        mems.append(json.loads(p.stdout.readline()[4:]))
    for p in procs:
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait()
    return infos, mems, lake, [p.returncode for p in procs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=2)
    ap.add_argument("--small", action="store_true", help="a 2-layer model (a smoke test)")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--backend", default="cuda")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker[0], int(a.worker[1]), a.small)
    d = tempfile.mkdtemp(prefix="gmlake-share.")
    sock, url = os.path.join(d, "s"), "ipc://" + os.path.join(d, "c")
    daemon = subprocess.Popen([os.path.join(BUILD, "gmlaked"), "--backend", a.backend, "--socket", sock, "--control", url,
                               "--log-level", "warn"], stderr=open(os.path.join(d, "log"), "w"))
    env = dict(os.environ, GMLAKE_SOCKET=sock, GMLAKE_MODE="daemon", GMLAKE_CONTROL=url,
               PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("GMLAKE_BACKEND", a.backend)
    try:
        for _ in range(200):
            if ctl(url, "stats"):
                break
            time.sleep(0.05)
        res, checks = {}, []
        for mode in ("unshared", "attach", "dedup"):
            infos, mems, (st, shares), rcs = run_mode(mode, a.procs, a.small, env)
            one = infos[0]["param_bytes"] + infos[0]["buffer_bytes"]
            shared = sum(s["chunks"] for s in shares or []) * (st["chunk_size"] if st else 0)  # physical, chunk-rounded
            weights = shared + sum(i["private_param_bytes"] + i["buffer_bytes"] for i in infos)
            time.sleep(0.3)
            after = ctl(url, "stats")
            res[mode] = {"infos": infos, "mems": mems, "one_copy": one, "shared_bytes": shared, "weights": weights,
                         "device_used": max(m["device_used"] for m in mems), "exit": rcs,
                         "shared_after_exit": after["chunks_shared"] if after else None,
                         "shares": shares, "chunks_shared": st["chunks_shared"] if st else None}
        ref = res["unshared"]["infos"][0]
        print("\nmodel: %s, %.2f B parameters, %.2f GiB a copy; %d processes" % (
            "Llama (HF, TinyLlama-1.1B shape)" if ref["hf"] else "MLP stack (no transformers)",
            ref["params"] / 1e9,
            res["unshared"]["one_copy"] / 2**30, a.procs))
        print("%-9s %14s %14s %8s %16s %10s %9s" % ("mode", "weights (all)", "one copy", "ratio", "device used", "outputs",
                                                     "setup s"))
        for mode, r in res.items():
            same = sum(i["out"] == ref["out"] and i["tokens"] == ref["tokens"] for i in r["infos"])
            r["same_outputs"] = same
            print("%-9s %11.2f GiB %11.2f GiB %8.3f %13.2f GiB %7d/%d %9.1f" % (
                mode, r["weights"] / 2**30, r["one_copy"] / 2**30, r["weights"] / r["one_copy"], r["device_used"] / 2**30,
                same, len(r["infos"]), max(i["setup_s"] for i in r["infos"])))
        print("(weights: the lake's shared bytes once + what each process holds privately; device used: with every "
              "process up, contexts included)")
        checks.append(("outputs", all(r["same_outputs"] == len(r["infos"]) for r in res.values()) and
                       all(rc == 0 for r in res.values() for rc in r["exit"]),
                       ", ".join("%s %d/%d" % (m, r["same_outputs"], len(r["infos"])) for m, r in res.items())))
        for mode in ("attach", "dedup"):
            r = res[mode]
            checks.append(("memory " + mode, r["weights"] <= 1.1 * r["one_copy"],
                           "%.2f GiB for %d processes = %.3fx one copy; device used %.2f GiB less than unshared" % (
                               r["weights"] / 2**30, a.procs, r["weights"] / r["one_copy"],
                               (res["unshared"]["device_used"] - r["device_used"]) / 2**30)))
        if res["dedup"]["infos"]:
            dd = [i["deduped"] for i in res["dedup"]["infos"]]
            checks.append(("dedup", dd.count(False) == 1 and dd.count(True) == a.procs - 1,
                           "published once, mapped by the others: %s" % dd))
        checks.append(("freed", all(r["shared_after_exit"] == 0 for r in res.values()),
                       "shared chunks after each mode's processes exited: %s" % [r["shared_after_exit"] for r in res.values()]))
        for name, ok, what in checks:
            print("%s shareweights %s: %s" % ("PASS" if ok else "FAIL", name, what))
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "share_weights.json"), "w") as f:
                json.dump({"results": res, "checks": {n: ok for n, ok, _ in checks}}, f, indent=1)
        return 0 if all(ok for _, ok, _ in checks) else 1
    finally:
        daemon.terminate()
        daemon.wait()
        subprocess.run(["rm", "-rf", d])


if __name__ == "__main__":
    sys.exit(main() or 0)
