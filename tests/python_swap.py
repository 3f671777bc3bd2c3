"""python/gmlake/swap.py on the CPU: torch without a GPU, a stand-in for torch.cuda whose memory is the bytes of
the saved storages on the "device" (what swapping changes) plus a base. A small MLP trains with swapping under a
cap its saved tensors do not fit: the first iteration is recorded (the safety net keeps it under the cap), the
library plans, later iterations follow the plan (the safety net moves nothing more, the memory never passes the
cap, bytes go out and come back), a change of batch is a departure that is recorded afresh and planned again,
and every loss and weight is bit-identical to the same training without swapping. With a cap it fits, nothing
moves. Needs torch (any build); GMLAKE_LIB names the library.
Run: GMLAKE_LIB=build/libgmlake-client.so PYTHONPATH=python python3 tests/python_swap.py"""
import contextlib
import os
import sys
import time

try:
    import torch
except ImportError:
    log = os.environ.get("GMLAKE_SKIP_LOG")
    if log:
        with open(log, "a") as f:
            f.write("not-run python_swap.py: no torch for %s\n" % sys.executable)
    print("  not run: no torch for %s" % sys.executable)
    sys.exit(0)

import gmlake
from gmlake import swap

MiB = 1 << 20
BASE = 4 * MiB
swap.MIN_BYTES = 64 << 10  # small tensors: the CPU is slow


class FakeCuda:
    """torch.cuda as swap.py uses it; memory: BASE + the saved storages on the device (from the op that made one:
before its pack hook, as a GPU's allocator counts it, to its last read or its copy out)."""

    def __init__(self):
        self.peak = self.highest = 0
        self.packing = None  # (address, bytes, entries then) of the tensor being saved

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, s):
            pass

        def wait_event(self, e):
            assert e.t is not None, "waited for an event never recorded"

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self, stream=None):
            self.t = time.perf_counter_ns()

        def elapsed_time(self, other):
            return (other.t - self.t) / 1e6

        def synchronize(self):
            pass

        def query(self):
            return True

    def current_stream(self, device=None):
        return FakeCuda.Stream()

    def stream(self, s):
        return contextlib.nullcontext()

    def mem(self):
        sw = swap._state["swapper"]
        n = BASE + sum(e.nbytes for e in sw.entries if e.gpu is not None or e.back is not None)
        if self.packing and len(sw.entries) == self.packing[2] and self.packing[0] not in sw.by_ptr:
            n += self.packing[1]  # the tensor being saved: made by its op before the hook sees it
        self.highest = max(self.highest, n)
        return n

    def memory_allocated(self, device=None):
        return self.mem()

    def max_memory_allocated(self, device=None):
        return max(self.peak, self.mem())

    def reset_peak_memory_stats(self, device=None):
        self.peak = self.mem()

    def on_device(self, t):
        base = t._base if t._base is not None else t
        st = swap._ustorage(t)
        sw = swap._state["swapper"]
        self.packing = None if base.is_leaf else (st.data_ptr(), st.nbytes(), len(sw.entries))
        return True

    def record_stream(self, t, s):
        pass


def train(batches, hooks):
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    losses, infos = [], []
    for b in batches:
        x = torch.randn(b, 256, generator=g)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if hooks:
            swap.step()  # torch 2's optimizer hook ended it already: then a no-op
            infos.append(dict(swap.info(), highest=hooks.highest))
            hooks.highest = 0
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()], infos


def run(batches, cap):
    gmlake._set_option("GMLAKE_SWAP", str(cap))
    fake = FakeCuda()
    swap.install(cuda=fake)
    try:
        return train(batches, fake)
    finally:
        swap.uninstall()


batches = [256] * 4 + [192] * 3
ref_losses, ref_params, _ = train(batches, None)
# what the saved tensors come to: a recording with a cap they fit
_, _, infos = run([256, 256], 1 << 40)
peak = infos[0]["plan"]["peak_before"]
assert peak > BASE + 1 * MiB, infos[0]
assert infos[1]["out_bytes"] == 0 and infos[1]["safety_bytes"] == 0 and infos[1]["moves"] == 0, infos
print("  fits (cap 1 TiB): the plan moves nothing, 0 bytes out in %d iterations; peak %.2f MiB"
      % (len(infos), peak / MiB))

target = BASE + (peak - BASE) // 2
cap = target * 100 // 97 + 1  # gml_swap_target takes 3% off
losses, params, infos = run(batches, cap)
for i, inf in enumerate(infos):
    print("  iteration %d (batch %d): %s, out %.2f MiB, in %.2f MiB, safety net %.2f MiB, highest %.2f MiB of %.2f"
          % (i + 1, batches[i], ["recording", "plan", "plan", "plan", "departs", "recording", "plan"][i],
             inf["out_bytes"] / MiB, inf["in_bytes"] / MiB,
             inf["safety_bytes"] / MiB, inf["highest"] / MiB, target / MiB))
assert losses == ref_losses, (losses, ref_losses)
assert all(torch.equal(a, b) for a, b in zip(params, ref_params)), "weights differ from the training without swapping"
print("  losses and weights bit-identical to no swapping: %s" % ["%.6f" % v for v in losses[:3]])
p = infos[0]["plan"]
assert p is not None and p["feasible"] and p["bytes_moved"] > 0, infos[0]
# iterations 2-4 follow the plan: no safety-net move after the recording, under the cap, copies both ways
rec_safety = infos[0]["safety_bytes"]
assert rec_safety > 0, "the recording iteration passed 95% of the cap without the safety net moving anything"
for i in (1, 2, 3):
    assert infos[i]["safety_bytes"] == rec_safety, (
        "iteration %d needed the safety net: the plan did not fit" % (i + 1), infos)
    assert infos[i]["highest"] <= target, ("iteration %d passed the cap" % (i + 1), infos[i])
assert infos[1]["out_bytes"] - infos[0]["out_bytes"] == p["bytes_moved"], (infos[1], p)
assert infos[1]["in_bytes"] - infos[0]["in_bytes"] == p["bytes_moved"], (infos[1], p)
# batch 192 from iteration 5: it departs (the safety net carries it under the cap), the next is recorded, the one
# after follows a new plan without the safety net
assert infos[4]["departures"] == 1 and infos[4]["plans"] == 1 and infos[4]["recording"], infos[4]
assert infos[5]["plans"] == 2 and not infos[5]["recording"], infos[5]
assert all(infos[i]["highest"] <= target for i in (4, 5, 6)), infos
assert infos[6]["safety_bytes"] == infos[5]["safety_bytes"], infos
assert infos[6]["out_bytes"] - infos[5]["out_bytes"] == infos[6]["plan"]["bytes_moved"] > 0, infos[6]
# the pinned buffers kept for the next iteration: at most what the iteration just ended moved out (kept whole,
# every batch's buffers added up: a batch search on the H200 was killed for host memory, run101)
for i in range(1, len(infos)):
    moved = infos[i]["out_bytes"] - infos[i - 1]["out_bytes"]
    assert infos[i]["pool_bytes"] <= moved, ("iteration %d keeps %d bytes of pinned buffers, moved %d"
                                             % (i + 1, infos[i]["pool_bytes"], moved), infos)
print("  pinned buffers kept: at most what the iteration moved (%s bytes)" % [inf["pool_bytes"] for inf in infos])
print("  plan: %d moves, %.2f MiB of %.2f MiB peak to fit %.2f MiB; followed in iterations 2-4 without the safety "
      "net; the batch change departs, is recorded and planned again (iteration 7 follows it)"
      % (infos[0]["moves"], p["bytes_moved"] / MiB, p["peak_before"] / MiB, p["cap"] / MiB))
print("python_swap: PASS")
