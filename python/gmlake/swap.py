"""Swapping (AutoSwap, issue 29): tensors saved for backward go to host memory and come back before backward reads
them, as the library plans it from a recorded iteration, so that a training fits a memory cap it does not fit
otherwise, with results bit-identical to no swapping.

    gmlake.enable(swap=True)         # or GMLAKE_SWAP=1: the cap is torch's memory fraction (GMLAKE_LIMIT), else
    torch.cuda.set_per_process_memory_fraction(0.5)   # the device; swap="40GiB" / "50%": that cap instead
    for x, y in data:                # an ordinary loop: nothing else changes
        loss = model(x).loss; loss.backward(); opt.step(); opt.zero_grad()

How. torch.autograd.graph.saved_tensors_hooks, installed for the thread that enabled it, see every tensor saved for
backward (pack) and every read of one (unpack): each is an event. An iteration ends at an optimizer's step (torch's
global step post hook; several optimizers in one iteration end it once) or at gmlake.swap.step() for loops without
one. The first iteration is recorded: per event its time on the device (CUDA events) and the most bytes allocated
since the event before; per saved storage its bytes, when saved, when first read back. The library plans it
(gml_swap_plan_build: which to move, when each copy back starts; nothing when it fits the cap, gml_swap_target) and
later iterations follow the plan: a moved tensor is copied to pinned host memory on a copy stream right after it is
saved (its device memory is freed at once, reused once the copy is done: record_stream), and copied back on another
stream at the event the plan says, the compute stream waiting for that copy where backward reads it. Copies read and
write whole storages, so views come back as views. An iteration that departs from the recording (another shape) goes
on without the plan and is recorded afresh, and the next is planned from it. Leaves (weights, a Linear saves
weight.t(); inputs: their owners hold them anyway), tensors not on the GPU and storages under 1 MiB are never moved.
A safety net runs at every event: when the bytes allocated pass the cap (while recording or departed: 95% of it, as
the peaks ahead are not known), the saved tensors read last are moved out until they do not; the recording counts
them back as if they had stayed.

Costs: a Python call per saved tensor and per read; while recording, an event and a peak reset per event
(torch.cuda.max_memory_allocated() counts from the end of the recording). gmlake.stats() shows swap_out_bytes,
swap_in_bytes, swap_copy_ns, swap_host_bytes; gmlakectl clients shows swapped and swap_host per process;
gmlake.swap.info() says what the plan is."""
import ctypes
import threading
import weakref

__all__ = ["install", "uninstall", "installed", "step", "reset", "info", "target", "plan", "MIN_BYTES"]

MIN_BYTES = 1 << 20   # smaller storages stay: their copies cost more than they free
RECORD_HEADROOM = 0.05  # while recording, the safety net keeps this share of the cap for what is not known yet
NEVER = 0xFFFFFFFF    # gmlake.h GML_SWAP_NEVER


class _Tensor(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("bytes", ctypes.c_uint64), ("saved_at", ctypes.c_uint32),
                ("used_at", ctypes.c_uint32)]


class _Input(ctypes.Structure):
    _fields_ = [("nevents", ctypes.c_uint32), ("time_ns", ctypes.POINTER(ctypes.c_uint64)),
                ("live", ctypes.POINTER(ctypes.c_uint64)), ("ntensors", ctypes.c_uint32),
                ("tensors", ctypes.POINTER(_Tensor)), ("cap", ctypes.c_uint64), ("out_bps", ctypes.c_double),
                ("in_bps", ctypes.c_double), ("max_nodes", ctypes.c_int64)]


class _Move(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("bytes", ctypes.c_uint64), ("tensor", ctypes.c_uint32),
                ("out_at", ctypes.c_uint32), ("gone_at", ctypes.c_uint32), ("in_at", ctypes.c_uint32),
                ("used_at", ctypes.c_uint32), ("out_ns", ctypes.c_uint64), ("in_ns", ctypes.c_uint64),
                ("late_ns", ctypes.c_uint64)]


class _Plan(ctypes.Structure):
    _fields_ = [("feasible", ctypes.c_int), ("optimal", ctypes.c_int), ("cap", ctypes.c_uint64),
                ("peak_before", ctypes.c_uint64), ("peak_after", ctypes.c_uint64), ("peak_event", ctypes.c_uint32),
                ("bytes_moved", ctypes.c_uint64), ("late_ns", ctypes.c_uint64), ("nodes", ctypes.c_uint64),
                ("nmoves", ctypes.c_uint32), ("moves", ctypes.POINTER(_Move))]


def _lib():
    from . import _load
    lib = _load()
    if not getattr(lib, "_swap_declared", False):
        lib.gml_swap_plan_build.argtypes = [ctypes.POINTER(_Input), ctypes.POINTER(ctypes.POINTER(_Plan))]
        lib.gml_swap_plan_build.restype = ctypes.c_int
        lib.gml_swap_plan_free.argtypes = [ctypes.POINTER(_Plan)]
        lib.gml_swap_plan_free.restype = None
        lib.gml_swap_target.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.gml_swap_target.restype = ctypes.c_int
        lib.gml_swap_note.argtypes = [ctypes.c_void_p] + [ctypes.c_uint64] * 4
        lib.gml_swap_note.restype = ctypes.c_int
        lib.gml_device_client_if_open.argtypes = [ctypes.c_int]
        lib.gml_device_client_if_open.restype = ctypes.c_void_p
        lib._swap_declared = True
    return lib


def target(device=None):
    """(on, cap_bytes) as the library says (gml_swap_target): GMLAKE_SWAP, and the cap a plan must fit (0: not
    known yet: no client is open on the device)."""
    lib = _lib()
    c = lib.gml_device_client_if_open(int(device or 0)) if device is not None else None
    cap = ctypes.c_uint64(0)
    rc = lib.gml_swap_target(c, ctypes.byref(cap))
    if rc < 0:
        from . import GMLakeError
        raise GMLakeError("GMLAKE_SWAP: not 0, 1, a size in bytes or a share of the device (N%)")
    return bool(rc), cap.value


def plan(time_ns, live, tensors, cap, bps=0.0, in_bps=None, max_nodes=0):
    """The library's plan (gml_swap_plan_build) of one iteration: time_ns and live per event, tensors as
    (id, bytes, saved_at, used_at or None), copy bandwidth out (bps) and in (in_bps; None: bps), bytes/s (0: the
    library's default); a dict with the plan's numbers and its moves (dicts), by out_at."""
    lib = _lib()
    n = len(time_ns)
    T = (ctypes.c_uint64 * n)(*time_ns)
    L = (ctypes.c_uint64 * n)(*live)
    ts = (_Tensor * max(1, len(tensors)))(*[_Tensor(i, b, s, NEVER if u is None else u) for i, b, s, u in tensors])
    inp = _Input(n, T, L, len(tensors), ts, int(cap), float(bps), float(bps if in_bps is None else in_bps),
                 int(max_nodes))
    out = ctypes.POINTER(_Plan)()
    rc = lib.gml_swap_plan_build(ctypes.byref(inp), ctypes.byref(out))
    if rc:
        raise ValueError("gml_swap_plan_build: %s" % lib.gml_strerror(rc).decode())
    try:
        p = out.contents
        d = {k: getattr(p, k) for k, _ in _Plan._fields_ if k != "moves"}
        d["moves"] = [{k: getattr(p.moves[j], k) for k, _ in _Move._fields_} for j in range(p.nmoves)]
    finally:
        lib.gml_swap_plan_free(out)
    return d


def _ustorage(t):
    f = getattr(t, "untyped_storage", None)
    return f() if f else t.storage().untyped()


class _Entry:
    """One saved storage of the iteration: on the device (gpu), on the host (host), or on its way back (back)."""
    __slots__ = ("k", "nbytes", "gpu", "host", "back", "ev_in", "saved_at", "used_at", "evicted_at", "packs",
                 "unpacks", "copies", "__weakref__")

    def __init__(self, k, nbytes, gpu, saved_at):
        self.k, self.nbytes, self.gpu, self.saved_at = k, nbytes, gpu, saved_at
        self.host = self.back = self.ev_in = None
        self.used_at = self.evicted_at = None
        self.packs, self.unpacks, self.copies = 1, 0, []


class _Packed:
    """What autograd keeps in place of a saved tensor: its entry and how to view the storage."""
    __slots__ = ("entry", "dtype", "size", "stride", "offset")

    def __init__(self, entry, t):
        self.entry, self.dtype, self.size = entry, t.dtype, t.size()
        self.stride, self.offset = t.stride(), t.storage_offset()


class _Swapper:
    def __init__(self, torch, cuda=None):
        self.torch = torch
        self.cuda = cuda or torch.cuda  # tests/python_swap.py, on a machine without a GPU, gives a stand-in
        self.on_device = cuda.on_device if cuda is not None else (lambda t: t.is_cuda)
        self.record_stream = cuda.record_stream if cuda is not None else (lambda t, s: t.record_stream(s))
        self.pin = cuda is None
        self.allocated = cuda.memory_allocated if cuda is not None else self._allocated
        self._st = None
        self.device = None  # the first saved tensor's; its streams are made then
        self.pool = {}      # nbytes -> pinned host buffers, kept across iterations
        self.plan = None    # the plan being followed (dict), None: recording
        self.rec = None     # the recording (per event: kind, bytes) of the plan
        self.cap = 0
        self.warned = False
        self.totals = {"iterations": 0, "plans": 0, "departures": 0, "out_bytes": 0, "in_bytes": 0,
                       "safety_bytes": 0, "copy_ns": 0}
        self.pending = []   # (start, end, bytes, direction) copy timings not yet read
        self.bps = [0.0, 0.0]  # measured bandwidth out and in (bytes/s); 0: not yet (the library's default)
        self._begin()

    # ---- an iteration ----
    def _begin(self):
        self.e = 0
        self.entries = []
        self.by_ptr = {}
        self.kinds = []     # per event: (kind, bytes): what a later iteration must repeat
        self.recording = self.plan is None
        self.departed = False
        self.ent_at = {}    # pack event -> the entry it made (a move's id is its save's event)
        self.held = []      # planned entries not copied out yet (_flush)
        self.moves_at = {}  # event -> moves to bring back there
        self.out_at = set() # events whose new entry goes out
        self.idle = not self.recording and not self.plan["moves"] and self.plan["feasible"]  # fits: nothing to do
        if not self.recording:
            for m in self.plan["moves"]:
                self.moves_at.setdefault(m["in_at"], []).append(m)
                self.out_at.add(m["out_at"])
        self.times, self.live, self.stalls = [], [], []
        self.out_bytes = self.in_bytes = 0

    def _allocated(self, device):
        """Bytes allocated now, from the library (gmlake_torch_stats: torch.cuda.memory_allocated builds the whole
        memory_stats dict, ~50 us, at every saved tensor)."""
        from . import _Stats
        if self._st is None:
            self._st = _Stats()
        if _lib().gmlake_torch_stats(int(device or 0), ctypes.byref(self._st)):
            return 0
        return self._st.allocated

    def _cap(self):
        if not self.cap:  # known once the device has a client; read again each iteration (a new memory fraction)
            self.cap = target(self.device)[1]
        return self.cap

    def _event(self, kind, nbytes):
        e = self.e
        self.e += 1
        key = (kind, nbytes)
        if self.recording:
            self.kinds.append(key)
            self.live.append(self.cuda.max_memory_allocated(self.device))
            self.cuda.reset_peak_memory_stats(self.device)
            ev = self.cuda.Event(enable_timing=True)
            ev.record()
            self.times.append(ev)
        elif not self.departed and (e >= len(self.rec) or self.rec[e] != key):
            self.departed = True  # another shape: no plan for the rest, the next iteration is recorded
            self.totals["departures"] += 1
        return e

    def _safety(self, e):
        """Move out the saved tensors read last while the bytes allocated are over the cap."""
        cap = self._cap()
        if not cap:
            return
        limit = cap * (1 - RECORD_HEADROOM) if self.recording or self.departed else cap
        over = self.allocated(self.device) - limit
        if over <= 0:
            return
        for en in sorted((x for x in self.entries if x.gpu is not None and not x.unpacks), key=lambda x: x.saved_at):
            if over <= 0:
                break
            self._out(en, e)
            over -= en.nbytes
            self.totals["safety_bytes"] += en.nbytes

    # ---- copies ----
    def _timed(self, stream):
        s, t = self.cuda.Event(enable_timing=True), self.cuda.Event(enable_timing=True)
        s.record(stream)
        return s, t

    def _streams(self, t):
        if self.device is None:
            self.device = t.device.index if t.device.index is not None else 0
            self.dev = t.device
            self.out_s = self.cuda.Stream(device=self.device)
            self.in_s = self.cuda.Stream(device=self.device)

    def pool_bytes(self):
        """The pinned host buffers kept for the next iteration, in bytes."""
        return sum(b.numel() for bufs in self.pool.values() for b in bufs)

    def _out(self, en, e):
        torch, cur = self.torch, self.cuda.current_stream(self.device)
        free = self.pool.get(en.nbytes)
        host = free.pop() if free else None
        if host is None:
            host = torch.empty(en.nbytes, dtype=torch.uint8, pin_memory=self.pin)
        src = torch.empty(0, dtype=torch.uint8, device=en.gpu.device).set_(_ustorage(en.gpu))
        self.out_s.wait_stream(cur)
        s, t = self._timed(self.out_s)
        with self.cuda.stream(self.out_s):
            host.copy_(src, non_blocking=True)
        t.record(self.out_s)
        self.pending.append((s, t, en.nbytes, 0))
        self.record_stream(src, self.out_s)  # its memory is reused once the copy is done
        del src
        self.by_ptr.pop(_ustorage(en.gpu).data_ptr(), None)
        en.gpu, en.host, en.evicted_at = None, host, e
        self.out_bytes += en.nbytes

    def _in(self, en):
        torch, cur = self.torch, self.cuda.current_stream(self.device)
        buf = torch.empty(en.nbytes, dtype=torch.uint8, device=self.dev)  # on the compute stream: in its order
        self.in_s.wait_stream(cur)
        s, t = self._timed(self.in_s)
        with self.cuda.stream(self.in_s):
            buf.copy_(en.host, non_blocking=True)
        t.record(self.in_s)
        self.pending.append((s, t, en.nbytes, 1))
        self.record_stream(buf, self.in_s)
        en.back, en.ev_in = buf, t
        self.in_bytes += en.nbytes

    # ---- the hooks ----
    def pack(self, t):
        torch = self.torch
        base = t._base if t._base is not None else t
        if not self.on_device(t) or base.is_leaf:  # weights (a Linear saves weight.t()), inputs: held anyway
            self._event("p", 0)
            return t
        st = _ustorage(t)
        nbytes = st.nbytes() if callable(getattr(st, "nbytes", None)) else st.size()
        if nbytes < MIN_BYTES:
            self._event("p", 0)
            return t
        e = self._event("p", nbytes)
        if self.idle and not self.departed:
            return t  # a plan that moves nothing: the iteration is only counted
        self._streams(t)
        en = self.by_ptr.get(st.data_ptr())
        self._flush(keep=en)
        if en is not None and en.nbytes == nbytes and en.gpu is not None:
            en.packs += 1  # held, so the address is still this storage's
        else:
            en = _Entry(len(self.entries), nbytes, torch.empty(0, dtype=t.dtype, device=t.device).set_(
                st, t.storage_offset(), t.size(), t.stride()), e)
            self.entries.append(en)
            self.by_ptr[st.data_ptr()] = en
            self.ent_at[e] = en
            if e in self.out_at and not self.departed:
                self.held.append(en)  # out once the packs of the same storage that follow it are in
        self._bring_back(e)
        self._safety(e)
        return _Packed(en, t)

    def unpack(self, p):
        self._flush()
        e = self._event("u", 0)  # the saves say the shapes; a read is one whatever it reads
        if not isinstance(p, _Packed):
            return p
        en = p.entry
        if en.used_at is None:
            en.used_at = e
        en.unpacks += 1
        self._bring_back(e)
        if en.gpu is None:
            if en.back is None:
                self._in(en)  # not brought back ahead (the safety net moved it, or no plan): now
            cur = self.cuda.current_stream(self.device)
            if self.recording:
                a = self.cuda.Event(enable_timing=True)
                a.record(cur)
            cur.wait_event(en.ev_in)
            if self.recording:
                b = self.cuda.Event(enable_timing=True)
                b.record(cur)
                self.stalls.append((e, a, b))
            en.gpu, en.back = en.back, None
        g = en.gpu
        out = self.torch.empty(0, dtype=p.dtype, device=g.device).set_(_ustorage(g), p.offset, p.size, p.stride)
        if en.unpacks >= en.packs:
            en.gpu = None  # autograd holds what it read for as long as it needs it, as without swapping
            self.by_ptr.pop(_ustorage(g).data_ptr(), None)
        self._safety(e)
        return out

    def _flush(self, keep=None):
        """Copy out the planned entries held since their save, but keep (at the save of another storage of the
        size that moves, a read, the iteration's end): a storage is often saved by several ops in a row (an op's
        output and the next op's input, with its weight and small numbers between; q, k, v of one projection), and
        while its entry holds it on the device its address names it, so those saves find the same entry, as in the
        recording."""
        if self.held and (len(self.held) > 1 or self.held[0] is not keep):
            held, self.held = self.held, []
            for en in held:
                if en is keep:
                    self.held.append(en)
                elif en.gpu is not None and not en.unpacks:
                    self._out(en, self.e)

    def _bring_back(self, e):
        if self.departed:
            return
        for m in self.moves_at.get(e, ()):
            en = self.ent_at.get(m["id"])
            if en is not None and en.gpu is None and en.back is None and en.host is not None:
                self._in(en)

    # ---- the iteration's end ----
    def step(self):
        if self.e == 0:
            return  # a second optimizer in the same iteration
        self.held = []
        self.totals["iterations"] += 1
        ns = self._read_copies(block=self.recording)
        if self.recording:
            self._take_plan()
        elif self.departed or self.e != len(self.rec):
            if not self.departed:
                self.totals["departures"] += 1
            self.plan = None  # record the next one
        used = {}
        for en in self.entries:  # host buffers back to the pool: every copy of this iteration is ordered before
            if en.host is not None:  # the next iteration's copies into them (the out stream waits for compute)
                self.pool.setdefault(en.nbytes, []).append(en.host)
                used[en.nbytes] = used.get(en.nbytes, 0) + 1
                en.host = None
        # the pool keeps what this iteration moved, no more: buffers of sizes it did not use (other shapes,
        # another batch in the same process) go back to torch's pinned cache. Kept whole, they added up to
        # more host memory than the machine has (a batch search on the H200 was killed: SIGKILL, run101)
        dropped = False
        for nbytes in list(self.pool):
            dropped |= len(self.pool[nbytes]) > used.get(nbytes, 0)
            del self.pool[nbytes][used.get(nbytes, 0):]
            if not self.pool[nbytes]:
                del self.pool[nbytes]
        empty = getattr(self.torch._C, "_host_emptyCache", None)
        if dropped and self.pin and empty is not None:  # and out of torch's pinned cache, which never shrinks itself
            empty()
        self.totals["out_bytes"] += self.out_bytes
        self.totals["in_bytes"] += self.in_bytes
        try:
            lib = _lib()
            c = lib.gml_device_client_if_open(self.device) if self.device is not None else None
            if c:
                lib.gml_swap_note(c, self.out_bytes, self.in_bytes, ns,
                                  self.pool_bytes())
        except OSError:
            pass
        self.cap = 0
        self._begin()

    def _read_copies(self, block):
        ns, left, dir_b, dir_ns = 0, [], [0, 0], [0, 0]
        for c in self.pending:
            s, t, nbytes, d = c
            if block:
                t.synchronize()
            if block or t.query():
                x = max(1, int(s.elapsed_time(t) * 1e6))
                ns += x
                dir_b[d] += nbytes
                dir_ns[d] += x
            else:
                left.append(c)
        for d in (0, 1):  # enough copied to say (a few copies of a MiB say little)
            if dir_b[d] >= 64 << 20:
                self.bps[d] = dir_b[d] / dir_ns[d] * 1e9
        self.pending = left
        self.totals["copy_ns"] += ns
        return ns

    def _take_plan(self):
        if not self.times:
            return
        self.times[-1].synchronize()
        t0 = self.times[0]
        stall_at, stall = {}, 0
        for e, a, b in self.stalls:  # the compute stream waited for a copy back the plan will have hidden
            stall_at[e] = stall_at.get(e, 0) + max(0, int(a.elapsed_time(b) * 1e6))
        times, last = [], 0
        for e, ev in enumerate(self.times):  # event e's time was taken before its own wait
            ns = max(last, int(t0.elapsed_time(ev) * 1e6) - stall)
            times.append(ns)
            last = ns
            stall += stall_at.get(e, 0)
        live = list(self.live)
        for en in self.entries:  # what the safety net moved counts as if it had stayed
            if en.evicted_at is not None:
                end = en.used_at + 1 if en.used_at is not None else len(live)  # read at used_at: there too
                for x in range(en.evicted_at + 1, end):
                    live[x] += en.nbytes
        tensors = [(en.saved_at, en.nbytes, en.saved_at, en.used_at) for en in self.entries]
        cap = self._cap()
        if not cap:
            return  # no cap known (no client): record the next one
        self.plan = plan(times, live, tensors, cap, bps=self.bps[0], in_bps=self.bps[1])
        self.rec = self.kinds
        self.totals["plans"] += 1
        if not self.plan["feasible"] and not self.warned:
            import warnings
            warnings.warn("gmlake swap: the recorded iteration's peak %.2f GiB does not fit the cap %.2f GiB even with "
                          "every saved tensor moved (%.2f GiB at best): the plan lowers it as far as it goes"
                          % (self.plan["peak_before"] / 2**30, self.plan["cap"] / 2**30,
                             self.plan["peak_after"] / 2**30))
            self.warned = True


_state = {"swapper": None, "hooks": None, "step_hook": None, "thread": None}
_lock = threading.Lock()


def install(cuda=None):
    """Install the hooks (gmlake.enable(swap=...) calls it): the saved-tensor hooks for this thread, the
    optimizer step hook for the process. The device: the first saved tensor's. cuda: a stand-in for torch.cuda
    (tests without a GPU)."""
    import torch
    with _lock:
        if _state["hooks"] is not None:
            return
        sw = _Swapper(torch, cuda)
        hooks = torch.autograd.graph.saved_tensors_hooks(sw.pack, sw.unpack)
        hooks.__enter__()
        _state.update(swapper=sw, hooks=hooks, thread=threading.get_ident())
        try:  # a submodule torch.optim does not always bind as an attribute (torch 2.11 does not)
            import importlib
            reg = getattr(importlib.import_module("torch.optim.optimizer"), "register_optimizer_step_post_hook", None)
        except ImportError:
            reg = None
        if reg is not None:
            ref = weakref.ref(sw)

            def on_step(opt, args, kwargs):
                s = ref()
                if s is not None and s is _state["swapper"]:
                    s.step()
            _state["step_hook"] = reg(on_step)


def uninstall():
    """Remove the hooks (from the thread that installed them); saved tensors already moved still come back."""
    with _lock:
        if _state["hooks"] is None:
            return
        _state["hooks"].__exit__(None, None, None)
        if _state["step_hook"] is not None:
            _state["step_hook"].remove()
        _state.update(swapper=None, hooks=None, step_hook=None, thread=None)


def installed():
    return _state["hooks"] is not None


def step():
    """An iteration ends here (a loop without a torch optimizer; with one, its step says so)."""
    sw = _state["swapper"]
    if sw is not None:
        sw.step()


def reset():
    """Forget the iteration under way and the plan (after an out-of-memory error mid-iteration, say): the next
    iteration is recorded afresh."""
    sw = _state["swapper"]
    if sw is not None:
        sw.plan = None
        sw.pending = []
        sw._begin()


def info():
    """What swapping did and plans: totals (iterations, plans, departures, bytes out and in, bytes the safety net
    moved, copy time), the pinned host buffers kept for the next iteration (pool_bytes) and the plan followed (None while recording): its cap, peaks, moves."""
    sw = _state["swapper"]
    if sw is None:
        return None
    p = sw.plan
    return dict(sw.totals, cap=sw.cap, recording=sw.plan is None, bps_out=sw.bps[0], bps_in=sw.bps[1],
                pool_bytes=sw.pool_bytes(),
                plan=None if p is None else {k: v for k, v in p.items() if k != "moves"},
                moves=0 if p is None else len(p["moves"]))
