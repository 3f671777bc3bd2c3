"""GMLake for PyTorch: put a program's CUDA memory on the lake.

    import gmlake
    gmlake.enable()          # before the first CUDA allocation

enable() makes gmlake._C (a C++ extension: a c10 CUDAAllocator over
libgmlake-client) PyTorch's CUDA allocator, the way
torch.cuda.memory.change_current_allocator installs one. The library talks
to the device's gmlaked when one runs, else runs embedded. PyTorch's own
memory APIs then report the lake: memory_stats()/memory_allocated()/
memory_summary()/reset_peak_memory_stats(), _record_memory_history() and
_snapshot(), empty_cache(), record_stream, OutOfMemoryError, CUDA graph
pools, torch.multiprocessing, set_per_process_memory_fraction. gmlake.stats()
gives the lake's own numbers (stitched bytes, chunks, maps); memory_stats()
also carries them under gmlake.* keys once enabled.
gmlake.growable(max_shape, dtype) gives a tensor whose rows are backed by
memory only as far as asked, growing in place (gmlake/grow.py); gmlake.block_of(addr)
names the allocation an address falls in (guard mode).
gmlake.share(model, key) / gmlake.attach(model, key) / gmlake.dedup(model) keep
one read-only copy of the same weights for many processes (gmlake/share.py).
gmlake.enable(plan=True) turns planned placement on (GMLAKE_PLAN): every
optimizer step marks an iteration's end (a process-wide step hook), and once
an iteration repeats, later ones that follow it are served at planned
offsets; gmlake.step() marks an iteration where no optimizer steps.

Install: pip install --no-build-isolation ./python (builds the extension
against the installed torch; python/setup.py says where it looks for
libgmlake-client and gmlake.h). Without torch it installs without the
extension: gmlake.open(device) opens a device's client, then stats() (device
0 unless told), trim(), the growable ranges (GrowableRange(gmlake.open(), ...)),
pause/resume and block_of work through ctypes; what
needs PyTorch (enable(), pool(), growable(...) tensors, share/attach/dedup)
raises GMLakeError saying so.
"""
import ctypes
import os

# The library's version (include/gmlake.h's GML_VERSION_*; tests/run.sh checks they agree): pip's too.
__version__ = "0.1.0"

__all__ = ["enable", "enabled", "open", "stats", "trim", "pool", "library_path", "GMLakeError", "growable", "GrowableRange",
           "block_of", "dump_blocks", "share", "attach", "dedup", "pause", "resume", "paused", "set_tag", "tagged",
           "mem_info", "copy", "copy_", "copy_info", "step"]


class GMLakeError(RuntimeError):
    pass


class _Stats(ctypes.Structure):
    # mirrors struct gml_stats in include/gmlake.h (tests/run.sh checks it)
    _fields_ = [("version", ctypes.c_uint32)] + [(n, ctypes.c_uint64) for n in (
        "allocated", "reserved", "cached", "stitched", "largest_free", "peak_allocated",
        "peak_reserved", "alloc_count", "free_count", "chunks_leased", "chunks_returned",
        "maps", "unmaps", "ooms", "syncs", "lease_calls", "lease_p50_ns", "lease_p99_ns")] + [
        ("fragmentation", ctypes.c_double), ("chunk_size", ctypes.c_size_t),
        ("mode", ctypes.c_int), ("backend", ctypes.c_char_p), ("access_calls", ctypes.c_uint64),
        ("mapped_allocs", ctypes.c_uint64), ("headroom_leased", ctypes.c_uint64),
        ("map_ns", ctypes.c_uint64), ("malloc_ns", ctypes.c_uint64),
        ("growable_ranges", ctypes.c_uint64), ("growable_mapped", ctypes.c_uint64),
        ("growable_unmapped", ctypes.c_uint64),
        ("paused_bytes", ctypes.c_uint64), ("paused_saved", ctypes.c_uint64),
        ("borrows", ctypes.c_uint64), ("borrow_waits", ctypes.c_uint64), ("shared_mapped", ctypes.c_uint64),
        ("lease_wait_ns", ctypes.c_uint64), ("import_ns", ctypes.c_uint64), ("map_call_ns", ctypes.c_uint64),
        ("access_ns", ctypes.c_uint64), ("chunks_streamed", ctypes.c_uint64),
        ("swap_out_bytes", ctypes.c_uint64), ("swap_in_bytes", ctypes.c_uint64), ("swap_copy_ns", ctypes.c_uint64),
        ("swap_host_bytes", ctypes.c_uint64),
        ("plan_steps", ctypes.c_uint64), ("plan_hits", ctypes.c_uint64), ("plan_misses", ctypes.c_uint64),
        ("plans_taken", ctypes.c_uint64), ("plan_range", ctypes.c_uint64)]


class _BlockInfo(ctypes.Structure):
    # mirrors struct gml_block_info in include/gmlake.h
    _fields_ = [("ptr", ctypes.c_uint64), ("size", ctypes.c_size_t), ("usable", ctypes.c_size_t),
                ("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("offset", ctypes.c_int64),
                ("where", ctypes.c_int), ("guarded", ctypes.c_int), ("seq", ctypes.c_uint64),
                ("alloc_ns", ctypes.c_uint64), ("stream", ctypes.c_uint64)]


_WHERE = {0: "inside", 1: "past the end, within the 512-byte alignment (no guard there)",
          2: "in the guard after the block", 3: "before the block", 4: "past the end (no guard: free memory)"}


def _info_dict(b):
    out = {n: getattr(b, n) for n, _ in _BlockInfo._fields_}
    out["past_end"] = b.offset - b.size
    out["where_name"] = _WHERE.get(b.where, "?")
    out["alloc_time"] = b.alloc_ns / 1e9
    return out


_lib = None


def library_path():
    """Which libgmlake-client to load: $GMLAKE_LIB (which must exist); the repository's build/ when this package
    runs from its source tree; else the dynamic loader's own search (ctypes.util.find_library: the ld.so cache,
    LD_LIBRARY_PATH, the multiarch directories a Debian package installs to), returned as the soname it found;
    else the install prefix's lib/ (make install copies python/ to PREFIX/share/gmlake/python) and the usual
    directories."""
    env = os.environ.get("GMLAKE_LIB")
    if env and not os.path.exists(env):  # another library was loaded in its place, without a word
        raise GMLakeError("GMLAKE_LIB=%s: no such file (the path of libgmlake-client.so; unset it to search "
                          "the repository's build/ and the install prefix)" % env)
    if env:
        return os.path.abspath(env)
    here = os.path.dirname(os.path.abspath(__file__))
    tree = os.path.join(here, "..", "..", "build", "libgmlake-client.so")
    if os.path.exists(os.path.join(here, "..", "..", "include", "gmlake.h")) and os.path.exists(tree):
        return os.path.abspath(tree)
    import ctypes.util
    found = ctypes.util.find_library("gmlake-client")
    if found:
        return found
    import sysconfig
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    candidates = [os.path.join(here, "..", "..", "..", "..", "lib", "libgmlake-client.so.1")]
    for d in ("/usr/local/lib", "/usr/lib"):
        candidates += [os.path.join(d, multiarch, "libgmlake-client.so.1")] if multiarch else []
        candidates += [os.path.join(d, "libgmlake-client.so.1"), os.path.join(d, "libgmlake-client.so")]
    for c in candidates:
        if os.path.exists(c):
            return os.path.abspath(c)
    raise GMLakeError("libgmlake-client.so not found by the dynamic loader (ldconfig -p) nor in %s: install it "
                      "(make install, or the libgmlake-client1 package), build it with `make`, or set GMLAKE_LIB"
                      % ", ".join(sorted(set(os.path.dirname(os.path.abspath(c)) for c in candidates))))


def _load():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(library_path())
        _lib.gmlake_torch_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
        _lib.gmlake_torch_stats.restype = ctypes.c_int
        _lib.gml_device_client_if_open.argtypes = [ctypes.c_int]
        _lib.gml_device_client_if_open.restype = ctypes.c_void_p
        _lib.gml_trim.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        _lib.gml_trim.restype = ctypes.c_int
        if hasattr(_lib, "gmlake_torch_block_of"):
            _lib.gmlake_torch_block_of.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(_BlockInfo)]
            _lib.gmlake_torch_block_of.restype = ctypes.c_int
            _lib.gmlake_torch_block_list.argtypes = [ctypes.c_int, ctypes.POINTER(_BlockInfo), ctypes.c_size_t]
            _lib.gmlake_torch_block_list.restype = ctypes.c_ssize_t
    return _lib


def _torch(what):
    """torch, or GMLakeError saying that `what` needs it (the ctypes parts do not)."""
    try:
        import torch
    except ImportError as e:
        raise GMLakeError("%s needs PyTorch (import torch failed: %s)" % (what, e)) from None
    return torch


def _ext(what="gmlake's PyTorch extension"):
    _torch(what)  # the extension needs torch's libraries loaded first
    try:
        from . import _C
    except ImportError as e:
        raise GMLakeError(
            "gmlake's PyTorch extension gmlake._C is not built (%s): this gmlake was installed where torch could "
            "not be imported, or where the extension did not build against it (a CPU-only or pre-2.0 PyTorch; "
            "pip install -v ./python says which), so only its ctypes parts work. With a CUDA build of PyTorch 2.x "
            "installed, pip install ./python again (it builds against that torch; needs libgmlake-client and "
            "gmlake.h too)" % e) from None
    return _C


def _set_option(name, value):
    """The library's option `name` (its GMLAKE_* variable's name) for the clients opened from now on, through
    gml_set_option: this process's environment, which its children inherit, is left as it is."""
    lib = _load()
    lib.gml_set_option.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.gml_set_option.restype = ctypes.c_int
    rc = lib.gml_set_option(name.encode(), None if value is None else str(value).encode())
    if rc:
        raise GMLakeError("gml_set_option(%s): %s" % (name, lib.gml_strerror(rc).decode()))


def _plan_value(plan):
    """GMLAKE_PLAN's value for enable(plan=...): True "1", False "0", "at:N" as it is."""
    if plan is True or plan is False:
        return "1" if plan else "0"
    if isinstance(plan, str) and (plan in ("0", "1") or (plan.startswith("at:") and plan[3:].isdigit())):
        return plan
    raise ValueError("plan must be True, False or 'at:N' (N: an iteration number), got %r" % (plan,))


def enable(socket=None, mode=None, swap=None, plan=None):
    """Make GMLake PyTorch's CUDA allocator. Call before the first CUDA allocation.

    socket: the daemon's socket (default: $GMLAKE_SOCKET, else the device's default path).
    mode: None (daemon if one runs, else embedded), "daemon" or "embedded".
    swap: None (as GMLAKE_SWAP says: off unless set), True/False, or a cap ("40GiB", "50%", bytes): tensors saved
    for backward go to host memory and back where an iteration would not fit the cap (gmlake/swap.py).
    plan: planned placement (GMLAKE_PLAN; None: as the environment says, off by default): True plans
      an iteration once it repeats (one plan per repeating pattern) and serves later iterations that
      follow it at their planned offsets; "at:N" plans iteration N only. Iterations end at
      every optimizer step (a process-wide hook, installed here) or at gmlake.step().
    """
    torch = _torch("gmlake.enable()")
    if mode and mode not in ("daemon", "embedded"):
        raise ValueError("mode must be 'daemon' or 'embedded'")
    plan_value = None if plan is None else _plan_value(plan)
    if socket:
        _set_option("GMLAKE_SOCKET", socket)
    if mode:
        _set_option("GMLAKE_MODE", mode)
    if swap is not None:
        _set_option("GMLAKE_SWAP", "1" if swap is True else "0" if swap is False else swap)
    if plan_value is not None:
        _set_option("GMLAKE_PLAN", plan_value)
    C = _ext("gmlake.enable()")
    e = C.install()
    if e:
        raise GMLakeError(
            "gmlake.enable() came too late: PyTorch's CUDA allocator is already in use "
            "(call it before anything is allocated on the GPU, e.g. first thing in the script); "
            "torch said: %s" % e)
    _add_stats_keys(torch)
    _add_mem_get_info(torch)
    from . import swap as _swap
    if _swap.target()[0]:  # GMLAKE_SWAP (or swap=) on; a bad value raises GMLakeError
        _swap.install()
    _add_step_hook(torch)


_step_hook = None


def _add_step_hook(torch):
    # every optimizer's step ends an iteration (torch.optim's global post hook: no change to the training
    # loop); gml_step does nothing where planned placement is off, so the hook is always there
    global _step_hook
    if _step_hook is not None:
        return
    try:  # a submodule: torch.optim does not always bind it as an attribute (torch 2.11 does not)
        import importlib
        reg = importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook
    except (ImportError, AttributeError):  # torch before 2.0: no global hook; gmlake.step() marks iterations
        return
    _step_hook = reg(lambda opt, args, kwargs: step())


def step(device=None):
    """An iteration ends here (gml_step): with planned placement on, the library records each iteration's
    allocations between two marks and serves repeating ones from a plan. enable() marks every optimizer
    step by itself; call this in loops without an optimizer (inference, custom updates). device: the
    device whose client marks it (default: every device with a client open). Nothing happens where
    planned placement is off or no client is open."""
    lib = _load()
    if not hasattr(lib, "_gml_step_typed"):
        lib.gml_step.argtypes = [ctypes.c_void_p]
        lib.gml_step.restype = ctypes.c_int
        lib.gml_strerror.restype = ctypes.c_char_p
        lib._gml_step_typed = True
    if device is None:
        n = 1
        try:
            import torch
            n = max(torch.cuda.device_count(), 1) if torch.cuda.is_available() else 1
        except ImportError:
            pass
        devices = range(n)
    else:
        devices = [_device(device)]
    for d in devices:
        c = lib.gml_device_client_if_open(int(d))
        if c:
            rc = lib.gml_step(c)
            if rc:
                raise GMLakeError("gmlake.step(device=%d): %s" % (d, lib.gml_strerror(rc).decode()))


def enabled():
    """True once enable() made the lake PyTorch's CUDA allocator."""
    try:
        return bool(_ext().installed())
    except GMLakeError:
        return False


def _add_stats_keys(torch):
    # torch.cuda.memory_stats() is built from PyTorch's DeviceStats, which has
    # no room for ours: add gmlake.* keys beside them (memory_summary and
    # every caller of memory_stats see them; PyTorch's keys are untouched).
    mem = torch.cuda.memory
    if getattr(mem.memory_stats, "_gmlake", False):
        return
    orig = mem.memory_stats

    def memory_stats(device=None):
        out = orig(device=device)
        try:
            idx = torch.cuda._utils._get_device_index(device, optional=True)
            for k, v in stats(idx).items():
                if isinstance(v, (int, float)):  # loggers sum and plot these: numbers only
                    out["gmlake." + k] = v
        except (GMLakeError, RuntimeError):
            pass
        return out

    memory_stats._gmlake = True
    memory_stats.__doc__ = orig.__doc__
    mem.memory_stats = memory_stats
    torch.cuda.memory_stats = memory_stats


def _add_mem_get_info(torch):
    # torch.cuda.mem_get_info calls cudaMemGetInfo, not the allocator: the device's free memory, which
    # counts every other process's loading as this one's and a lake's free chunks as used. Under
    # enable() it answers as the lake sees it for this process (gmlake.mem_info). Callers that bound
    # the original before enable() (from torch.cuda import mem_get_info), torch.cuda.cudart()
    # .cudaMemGetInfo, NVML (nvidia-smi, torch.cuda.list_gpu_processes, memory_usage) and C++ code
    # calling cudaMemGetInfo still see the device's numbers.
    mem = torch.cuda.memory
    if getattr(mem.mem_get_info, "_gmlake", False):
        return
    orig = mem.mem_get_info

    def mem_get_info(device=None):
        idx = torch.cuda._utils._get_device_index(device, optional=True)
        try:
            return mem_info(idx)
        except GMLakeError as e:  # the daemon gone (its keeper reconnects): the device's numbers, said once
            if not getattr(mem_get_info, "_said", False):
                mem_get_info._said = True
                import warnings
                warnings.warn("gmlake: torch.cuda.mem_get_info answers with the device's numbers, not the lake's: %s"
                              % e)
            return orig(device)

    mem_get_info._gmlake = True
    mem_get_info._gmlake_orig = orig
    mem_get_info.__doc__ = ("As the lake sees it for this process (gmlake.mem_info): (free, total). "
                            "PyTorch's own, the device's: mem_get_info._gmlake_orig.\n\n" + (orig.__doc__ or ""))
    mem.mem_get_info = mem_get_info
    torch.cuda.mem_get_info = mem_get_info


def mem_info(device=None):
    """(free, total) bytes as the lake sees it for this process, what torch.cuda.mem_get_info answers
    under enable() (gml_mem_info): total is the most it may hold (the least of the device, the lake's
    limit, its quota, its own limit or memory fraction), free what it could allocate now (its cache's
    free bytes, the lake's free chunks and what the limit still lets it make, idle clients of its
    user's idle cache), within its quota and limits. Opens the device's client if none is open."""
    from . import grow
    device = _device(device)
    lib = _load()
    lib.gml_mem_info.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    lib.gml_mem_info.restype = ctypes.c_int
    c = grow.client_for(device)
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    grow._check(lib.gml_mem_info(c, ctypes.byref(free), ctypes.byref(total)), "gmlake.mem_info(device=%d)" % device, c)
    return free.value, total.value


def open(device=0):
    """Open device's client now and return it (a gml_client pointer, as an int): the one the
    PyTorch layer uses (the device's daemon if one runs, else embedded), so that without torch
    stats(), trim(), pause()/resume(), block_of() and GrowableRange(gmlake.open(), rows, row_bytes)
    have a client before anything was allocated. Opened once per device and never closed (as
    the PyTorch layer's); again, the same client. Where no GPU is usable the backend would be
    host memory, which a device's client takes only with GMLAKE_BACKEND=host: GMLakeError says so."""
    from . import grow
    return grow.client_for(int(device))


def stats(device=None):
    """The lake's numbers for a device (default: the current CUDA device; without torch, 0): allocated,
    reserved, cached, stitched, fragmentation, peaks, chunks..."""
    device = _device(device)
    if enabled():
        d = _ext().stats(int(device))
        if d is None:
            raise GMLakeError("no GMLake client is open on device %d (nothing allocated there yet; "
                              "gmlake.open(%d) opens it)" % (device, device))
        return dict(d)
    s = _Stats()
    rc = _load().gmlake_torch_stats(int(device), ctypes.byref(s))
    if rc != 0:
        raise GMLakeError("no GMLake client is open on device %d (nothing allocated yet? gmlake.open(%d) "
                          "opens it)" % (device, device))
    out = {name: getattr(s, name) for name, _ in _Stats._fields_}
    out["backend"] = s.backend.decode() if s.backend else None
    out["mode"] = {1: "daemon", 2: "embedded"}.get(s.mode, "?")
    return out


def trim(device=None):
    """Give idle cached chunks back (to the daemon, or to the driver when embedded); returns the bytes
    given back (0 when nothing was idle). GMLakeError when no client is open on the device."""
    device = _device(device)
    if enabled():
        n = _ext().trim(int(device))
    else:  # gml_trim itself: gmlake_torch_trim says only 0 or an error, so this returned 0 whatever went back
        lib = _load()
        c = lib.gml_device_client_if_open(int(device))
        n = None
        if c:
            released = ctypes.c_size_t(0)
            from . import grow
            grow._check(lib.gml_trim(c, ctypes.byref(released)), "gmlake.trim(device=%d)" % device, c)
            n = released.value
    if n is None:
        raise GMLakeError("no GMLake client is open on device %d (nothing allocated yet? gmlake.open(%d) "
                          "opens it)" % (device, device))
    return n


def pool():
    """A torch.cuda.MemPool on the lake: with enable(), every MemPool is one (a private pool of the lake)."""
    torch = _torch("gmlake.pool()")
    if not enabled():
        raise GMLakeError("gmlake.pool() needs gmlake.enable() first")
    return torch.cuda.MemPool()


def _int_in(value, lo, hi, what):
    """int(value), or ValueError when C's type cannot hold it (ctypes would keep the low bits without
    a word: device 2**32 was device 0, tag 2**32 tag 0, a size of 2**64 + 4096 bytes 4096)."""
    n = int(value)
    if not lo <= n <= hi:
        raise ValueError("%s %d out of range (%d to %d)" % (what, n, lo, hi))
    return n


_INT_MIN, _INT_MAX = -2**(8 * ctypes.sizeof(ctypes.c_int) - 1), 2**(8 * ctypes.sizeof(ctypes.c_int) - 1) - 1
_SIZE_MAX = 2**(8 * ctypes.sizeof(ctypes.c_size_t)) - 1


def _device(device):
    """device, else the current CUDA device; without torch (or a CUDA build of it), device 0,
    CUDA's current device in a process that chose none."""
    if device is not None:
        return _int_in(device, _INT_MIN, _INT_MAX, "device")
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def block_of(addr, device=None):
    """The allocation an address falls in (or just past, or in the guard of), as a dict, or None.

    Works from what the library recorded, with no CUDA call, so it answers after a fault killed
    the CUDA context: 'ptr', 'size' (asked), 'usable' (rounded to 512 B), 'start'/'end' (its
    range, guards included), 'offset' (addr - ptr), 'past_end' (addr - (ptr + size)), 'where',
    'seq' (allocation number), 'alloc_time' (seconds since the epoch), 'stream', 'guarded'."""
    b = _BlockInfo()
    if _load().gmlake_torch_block_of(_device(device), int(addr), ctypes.byref(b)) != 0:
        return None
    return _info_dict(b)


def dump_blocks(path, device=None):
    """Write every live block to path as JSON (for tools/gmlake-sanitizer-blocks); returns the count."""
    import builtins
    import json
    lib, dev = _load(), _device(device)
    n = lib.gmlake_torch_block_list(dev, None, 0)
    if n < 0:
        raise GMLakeError("no GMLake client is open on device %d" % dev)
    arr = (_BlockInfo * (n + 64))()
    n = lib.gmlake_torch_block_list(dev, arr, n + 64)
    blocks = [_info_dict(arr[i]) for i in range(min(n, len(arr)))]
    with builtins.open(path, "w") as f:  # open is gmlake.open here
        json.dump({"device": dev, "blocks": blocks}, f)
    return len(blocks)


from .grow import GrowableRange, growable  # noqa: E402 (needs _load and GMLakeError above)
from .pause import pause, resume, paused, set_tag, tagged  # noqa: E402,F401 (torch-free: gml_pause/gml_resume)
from .share import attach, dedup, share  # noqa: E402
from .transfer import copy, copy_, copy_info, COPY_H2D, COPY_D2H, COPY_D2D  # noqa: E402,F401 (gml_copy*)
