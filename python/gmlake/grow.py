"""Growable tensors: a tensor over a fixed maximum shape whose memory is mapped
row by row as it is needed, in place (libgmlake-client's gml_growable_*).

    kv = gmlake.growable((max_tokens, heads, head_dim), torch.float16)
    kv.ensure(n)        # rows [0, n) are backed by memory (mapped from the lake)
    kv[:n] = ...        # an ordinary tensor: its storage is the whole reserved range
    kv.shrink(m)        # the chunks wholly past row m go back to the lake

Rows are along dim 0. Memory comes in chunks (2 MiB on the host, 6 MiB on cuda): ensure(n) maps the
chunks that rows [0, n) touch, shrink(m) unmaps only chunks no row < m touches,
so mapped_rows() may exceed n. Mapping more never moves or copies the rows already
there: kv.data_ptr() never changes.

Reading or writing a row that is not mapped is an error, not garbage: on the
host backend (device="cpu") the process gets SIGSEGV; on CUDA the kernel fails
with an illegal memory access (cudaErrorIllegalAddress), and the CUDA context
of the process is unusable from then on. So touch only kv[:kv.mapped_rows()]
(printing the whole tensor reads all of it). shrink() waits for the device to
finish its work first, so no queued kernel reads a chunk that goes back.

The memory is freed when the last tensor or view over it is gone. It is not
part of the caching allocator: gmlake.stats() counts it as growable_mapped
(backed) and growable_unmapped (reserved, not backed), and so does
`gmlakectl clients`.
"""
import ctypes
import math
import os

from . import _INT_MAX, _INT_MIN, _SIZE_MAX, GMLakeError, _int_in, _load, _torch

__all__ = ["GrowableRange", "growable", "client_for", "client_stats"]


class _Info(ctypes.Structure):
    # mirrors gml_growable_info in gmlake.h
    _fields_ = [("base", ctypes.c_void_p), ("reserved", ctypes.c_size_t), ("mapped", ctypes.c_size_t),
                ("mapped_prefix", ctypes.c_size_t), ("chunk_size", ctypes.c_size_t)]


class _OpenOpts(ctypes.Structure):
    # mirrors gml_open_opts in gmlake.h
    # mirrors gml_open_opts in gmlake.h, every member: the library reads guard, guard_grain and borrow
    # too (without them it read what lay past the struct: a stray guard or borrow setting, now GML_EINVAL)
    _fields_ = [("device", ctypes.c_int), ("backend", ctypes.c_char_p), ("socket_path", ctypes.c_char_p),
                ("mode", ctypes.c_int), ("limit_bytes", ctypes.c_size_t), ("guard", ctypes.c_int),
                ("guard_grain", ctypes.c_size_t), ("borrow", ctypes.c_int)]


_bound = None


def _lib():
    global _bound
    lib = _load()
    if _bound is not lib:
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        for name, args, res in (
                ("gml_growable_create", [vp, sz, ctypes.POINTER(vp)], i),
                ("gml_growable_map", [vp, sz, sz], i),
                ("gml_growable_unmap", [vp, sz, sz], i),
                ("gml_growable_ensure", [vp, sz], i),
                ("gml_growable_shrink", [vp, sz], i),
                ("gml_growable_is_mapped", [vp, sz], i),
                ("gml_growable_info_get", [vp, ctypes.POINTER(_Info)], i),
                ("gml_growable_destroy", [vp], i),
                ("gml_open", [ctypes.POINTER(_OpenOpts), ctypes.POINTER(vp)], i),
                ("gml_strerror", [i], ctypes.c_char_p),
                ("gml_last_error", [vp], ctypes.c_char_p)):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        if hasattr(lib, "gml_device_client"):
            lib.gml_device_client.argtypes, lib.gml_device_client.restype = [i], vp
        _bound = lib
    return lib


def _check(rc, what, client=None):
    if rc < 0:
        lib = _lib()
        detail = lib.gml_last_error(client).decode(errors="replace") if client else ""
        err = GMLakeError("%s: %s%s" % (what, lib.gml_strerror(rc).decode(), ": " + detail if detail else ""))
        err.code = rc
        raise err
    return rc


_own_clients = {}


def client_for(device):
    """The gml_client* (an int) that serves `device`: a torch.device, "cpu" or
    "cuda:N" / an int N. A GPU's is the one the PyTorch allocator layer uses
    (gml_device_client) where the library has it; "cpu" is a host-backend
    client (the daemon at $GMLAKE_SOCKET if one runs the host backend, else
    embedded). Clients opened here stay open for the process's life."""
    kind, index = _device_parts(device)
    lib = _lib()
    if kind == "cuda" and hasattr(lib, "gml_device_client"):
        c = lib.gml_device_client(index)
        if not c:
            hint = ""
            if os.environ.get("GMLAKE_BACKEND") != "host":
                hint = ("; where no GPU (or libcuda) is usable the lake would serve host memory, which a "
                        "device's client takes only when asked: GMLAKE_BACKEND=host uses it anyway (tests, "
                        "machines without a GPU), else check the driver and the device's daemon")
            raise GMLakeError("cannot open the lake of device %d (the log above says why)%s" % (index, hint))
        return c
    key = (kind, index)
    if key not in _own_clients:
        o = _OpenOpts()
        o.device = index
        o.backend = b"host" if kind == "cpu" else (os.environ.get("GMLAKE_BACKEND") or "cuda").encode()  # empty is unset
        c = ctypes.c_void_p()
        rc = lib.gml_open(ctypes.byref(o), ctypes.byref(c))
        if rc:
            raise GMLakeError("cannot open the lake for %s:%d: %s" % (kind, index, lib.gml_strerror(rc).decode()))
        _own_clients[key] = c.value
    return _own_clients[key]


def client_stats(client):
    """gml_stats of a client (an int from client_for) as a dict."""
    from . import _Stats
    lib = _lib()
    if not getattr(lib.gml_stats_get, "argtypes", None):
        lib.gml_stats_get.argtypes, lib.gml_stats_get.restype = [ctypes.c_void_p, ctypes.POINTER(_Stats)], ctypes.c_int
    st = _Stats()
    _check(lib.gml_stats_get(client, ctypes.byref(st)), "stats")
    out = {name: getattr(st, name) for name, _ in _Stats._fields_}
    out["backend"] = st.backend.decode() if st.backend else None
    return out


def _device_parts(device):
    if device is None:
        return "cuda", 0
    if isinstance(device, int):
        return "cuda", _int_in(device, _INT_MIN, _INT_MAX, "device")
    kind = getattr(device, "type", None)
    if kind is not None:  # a torch.device
        index = device.index or 0
    else:
        kind, _, idx = str(device).partition(":")
        index = int(idx or 0)
    index = _int_in(index, _INT_MIN, _INT_MAX, "device index")
    if kind not in ("cuda", "cpu"):
        raise ValueError("a growable tensor lives on cuda or on cpu (the host backend), not %r" % (device,))
    return kind, index


class GrowableRange:
    """A growable range of max_rows rows of row_bytes bytes each (no torch needed).

    base never changes; ensure(n) backs rows [0, n); shrink(m) gives back the
    chunks past row m; mapped_rows is how many rows from 0 on are backed."""

    def __init__(self, client, max_rows, row_bytes):
        max_rows, row_bytes = int(max_rows), int(row_bytes)  # 0.5 rows is 0 rows
        if max_rows <= 0 or row_bytes <= 0:
            raise ValueError("a growable range needs at least one row of at least one byte")
        if max_rows * row_bytes > _SIZE_MAX:  # size_t would keep the low bits: a small range claiming many rows
            raise ValueError("a growable range of %d rows of %d bytes is more than a size_t holds" % (max_rows, row_bytes))
        self._lib = _lib()
        self._client = client
        self.max_rows = max_rows
        self.row_bytes = row_bytes
        self.nbytes = self.max_rows * self.row_bytes
        h = ctypes.c_void_p()
        _check(self._lib.gml_growable_create(client, self.nbytes, ctypes.byref(h)), "growable range of %d bytes" % self.nbytes, client)
        self._h = h.value
        info = self.info()
        self.base = info.base
        self.chunk_size = info.chunk_size
        self.reserved = info.reserved

    @classmethod
    def _adopt(cls, client, handle, nbytes):
        """A range gml_attach (or another C call) made: nbytes of it, as bytes."""
        self = cls.__new__(cls)
        self._lib, self._client, self._h = _lib(), client, handle
        self.max_rows, self.row_bytes, self.nbytes = int(nbytes), 1, int(nbytes)
        info = self.info()
        self.base, self.chunk_size, self.reserved = info.base, info.chunk_size, info.reserved
        return self

    def _handle(self):
        if not self._h:  # gml_growable_*(NULL) is GML_EINVAL with another call's message
            raise GMLakeError("growable range already released")
        return self._h

    def info(self):
        h = self._handle()
        i = _Info()
        _check(self._lib.gml_growable_info_get(h, ctypes.byref(i)), "growable info", self._client)
        return i

    def _rows_bytes(self, n_rows):
        n = int(n_rows)
        if n < 0 or n > self.max_rows:
            raise ValueError("row count %d outside 0..%d" % (n, self.max_rows))
        return n * self.row_bytes

    def ensure(self, n_rows):
        """Back rows [0, n_rows) with memory (what is mapped stays where it is).
        Returns mapped_rows. Raises GMLakeError (code GML_ENOMEM) when the lake
        cannot give the chunks; then nothing new is mapped."""
        nb = self._rows_bytes(n_rows)
        if nb:
            _check(self._lib.gml_growable_ensure(self._handle(), nb), "growable ensure(%d rows)" % n_rows, self._client)
        return self.mapped_rows

    def shrink(self, n_rows):
        """Give back every chunk no row below n_rows touches. Returns mapped_rows."""
        nb = self._rows_bytes(n_rows)
        _check(self._lib.gml_growable_shrink(self._handle(), nb), "growable shrink(%d rows)" % n_rows, self._client)
        return self.mapped_rows

    def map_bytes(self, offset, length):
        offset, length = _int_in(offset, 0, _SIZE_MAX, "offset"), _int_in(length, 0, _SIZE_MAX, "length")
        _check(self._lib.gml_growable_map(self._handle(), offset, length), "growable map", self._client)

    def unmap_bytes(self, offset, length):
        offset, length = _int_in(offset, 0, _SIZE_MAX, "offset"), _int_in(length, 0, _SIZE_MAX, "length")
        _check(self._lib.gml_growable_unmap(self._handle(), offset, length), "growable unmap", self._client)

    def is_mapped(self, offset):
        offset = _int_in(offset, 0, _SIZE_MAX, "offset")
        return _check(self._lib.gml_growable_is_mapped(self._handle(), offset), "growable is_mapped", self._client) == 1

    @property
    def mapped_bytes(self):
        return self.info().mapped

    @property
    def mapped_rows(self):
        return min(self.max_rows, self.info().mapped_prefix // self.row_bytes)

    def release(self):
        """Unmap everything and free the range (also done when it is collected)."""
        if self._h:
            h, self._h = self._h, None
            _check(self._lib.gml_growable_destroy(h), "growable destroy")

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    def __repr__(self):
        return "GrowableRange(base=%#x, rows=%d/%d of %d bytes, chunk %d)" % (
            self.base, self.mapped_rows if self._h else 0, self.max_rows, self.row_bytes, self.chunk_size)


class _CudaArray:
    """What torch.as_tensor needs to view device memory in place (CUDA array
    interface v3); it keeps the range alive as long as the tensor's storage."""

    def __init__(self, rng):
        self._rng = rng
        self.__cuda_array_interface__ = {"shape": (rng.nbytes,), "typestr": "|u1", "data": (rng.base, False),
                                         "version": 3, "strides": None}


def _byte_tensor(rng, device):
    torch = _torch("a tensor over a growable range")
    if device.type == "cpu":
        buf = (ctypes.c_uint8 * rng.nbytes).from_address(rng.base)
        buf._gmlake_range = rng  # the tensor keeps buf alive, buf the range
        return torch.frombuffer(buf, dtype=torch.uint8)
    with torch.cuda.device(device):
        t = torch.as_tensor(_CudaArray(rng), device=device)
    if t.data_ptr() != rng.base or t.device != device:
        raise GMLakeError("torch copied the growable range instead of viewing it (%#x on %s)" % (t.data_ptr(), t.device))
    return t


def growable(max_shape, dtype, device=None, client=None):
    """A torch tensor of max_shape over a growable range: an ordinary tensor
    whose storage is the whole reserved range, with rows (dim 0) backed only
    as far as asked. It has these attributes:

        t.ensure(n)     back rows [0, n); returns mapped_rows
        t.shrink(m)     give back the chunks past row m; returns mapped_rows
        t.mapped_rows() rows backed from row 0 on
        t.gmlake        the GrowableRange (bytes, chunk size, mapped bytes)

    device: "cuda", "cuda:N" (default: the current CUDA device) or "cpu" (the
    host backend: memfd chunks, useful without a GPU). The first chunk is
    mapped at once (torch asks the driver which device a pointer is on).
    Views of t (t[:n], t.view(...)) share the memory and keep it alive, but
    only t has the methods. Without torch, GrowableRange gives the same range."""
    torch = _torch("gmlake.growable()")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    shape = tuple(int(s) for s in max_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError("max_shape must have positive sizes, got %r" % (max_shape,))
    itemsize = torch.empty((), dtype=dtype).element_size()
    row_bytes = math.prod(shape[1:]) * itemsize
    rng = GrowableRange(client if client is not None else client_for(device), shape[0], row_bytes)
    rng.map_bytes(0, rng.chunk_size)
    t = _byte_tensor(rng, device).view(dtype).view(shape)
    t.gmlake = rng
    t.ensure = rng.ensure
    t.shrink = rng.shrink
    t.mapped_rows = lambda: rng.mapped_rows
    return t
