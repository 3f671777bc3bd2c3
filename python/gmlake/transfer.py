"""The copy engine (libgmlake-client's gml_copy*): host<->GPU copies at the link's
speed from any host memory, pageable included (staged through a page-locked pool
the library keeps), stream-ordered like tensor.copy_(non_blocking=True).

    gmlake.copy_(gpu_tensor, cpu_tensor)     # H2D on the current stream
    gmlake.copy_(cpu_tensor, gpu_tensor)     # D2H: the CPU tensor is written when it returns
                                             # (or, page-locked, when the stream gets there)
    gmlake.copy(dst_addr, src_addr, nbytes, gmlake.COPY_H2D, client=c)   # no torch: addresses
    gmlake.copy_info()                       # staging pool, threads, bytes direct/staged, batches, paths

This file only names the direction; every decision (staging, slots, batching) is
the C library's.
"""
import ctypes

from . import GMLakeError, _device, _load, _torch
from .pause import _check


def _client(device, client):
    """The client given, else the device's (opened here if nothing has opened it: any client of the
    device can copy, unlike pause, which needs the one the allocator uses)."""
    if client is not None:
        return client
    from . import grow
    return grow.client_for(_device(device))

__all__ = ["copy_", "copy", "copy_info", "COPY_H2D", "COPY_D2H", "COPY_D2D"]

COPY_H2D, COPY_D2H, COPY_D2D = 1, 2, 3  # gmlake.h enum gml_copy_kind


class _Path(ctypes.Structure):  # gmlake.h gml_copy_path
    _fields_ = [("device", ctypes.c_int), ("used", ctypes.c_int), ("failed", ctypes.c_int),
                ("h2d_gbps", ctypes.c_double), ("d2h_gbps", ctypes.c_double), ("h2d_share", ctypes.c_double),
                ("d2h_share", ctypes.c_double), ("bytes", ctypes.c_uint64)]


_PATHS_MAX = 8  # GML_COPY_PATHS_MAX


class _Info(ctypes.Structure):  # gmlake.h gml_copy_info
    _fields_ = [("staging_bytes", ctypes.c_uint64), ("slots", ctypes.c_uint32), ("threads", ctypes.c_uint32),
                ("batch", ctypes.c_int), ("bytes_direct", ctypes.c_uint64), ("bytes_staged", ctypes.c_uint64),
                ("driver_copies", ctypes.c_uint64), ("driver_batches", ctypes.c_uint64),
                ("batched_copies", ctypes.c_uint64), ("npaths", ctypes.c_uint32), ("paths_used", ctypes.c_uint32),
                ("h2d_gbps", ctypes.c_double), ("d2h_gbps", ctypes.c_double), ("bytes_split", ctypes.c_uint64),
                ("paths", _Path * _PATHS_MAX)]


_declared = False


def _lib():
    global _declared
    lib = _load()
    if not _declared:
        lib.gml_copy_async.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_void_p]
        lib.gml_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.gml_copy_info_get.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Info)]
        _declared = True
    return lib


def copy(dst, src, nbytes, kind, device=None, client=None, stream=None):
    """nbytes from address src to address dst (kind: COPY_H2D, COPY_D2H or COPY_D2D) on stream (a
    CUstream as an int; None: synchronous, returns when done)."""
    if kind not in (COPY_H2D, COPY_D2H, COPY_D2D):
        raise GMLakeError("copy: kind %r (gmlake.COPY_H2D, COPY_D2H or COPY_D2D)" % (kind,))
    c = _client(device, client)
    lib = _lib()
    if stream is None:
        rc = lib.gml_copy(c, dst, src, int(nbytes), kind)
    else:
        rc = lib.gml_copy_async(c, dst, src, int(nbytes), kind, int(stream) or None)
    _check(rc, "copy", c)


def copy_(dst, src, non_blocking=True):
    """dst.copy_(src) through the engine, for two contiguous tensors of the same size in bytes, one or
    both on a CUDA device, on that device's current stream; non_blocking=False waits for the copy."""
    torch = _torch("gmlake.copy_()")
    if not (dst.is_contiguous() and src.is_contiguous()):
        raise GMLakeError("copy_: contiguous tensors only")
    n = dst.numel() * dst.element_size()
    if n != src.numel() * src.element_size():
        raise GMLakeError("copy_: %d bytes into %d" % (src.numel() * src.element_size(), n))
    dc, sc = dst.device.type == "cuda", src.device.type == "cuda"
    if not (dc or sc):
        raise GMLakeError("copy_: one of the tensors must be on a CUDA device")
    kind = COPY_D2D if dc and sc else COPY_H2D if dc else COPY_D2H
    dev = (dst if dc else src).device
    stream = torch.cuda.current_stream(dev).cuda_stream
    copy(dst.data_ptr(), src.data_ptr(), n, kind, device=dev.index, stream=stream)
    if not non_blocking:
        torch.cuda.current_stream(dev).synchronize()
    return dst


def copy_info(device=None, client=None):
    """The engine's numbers: staging_bytes, slots, threads, batch, bytes_direct, bytes_staged,
    driver_copies, driver_batches, batched_copies; multi-path (GMLAKE_COPY_PATHS): npaths (probed; 0:
    not yet), paths_used, h2d_gbps and d2h_gbps (the used paths together), bytes_split, and paths: one
    dict a probed path (device, used, failed, h2d_gbps, d2h_gbps alone, h2d_share, d2h_share, bytes)."""
    c = _client(device, client)
    info = _Info()
    _check(_lib().gml_copy_info_get(c, ctypes.byref(info)), "copy_info", c)
    out = {k: getattr(info, k) for k, _ in _Info._fields_ if k != "paths"}
    out["paths"] = [{k: getattr(info.paths[i], k) for k, _ in _Path._fields_} for i in range(min(info.npaths, _PATHS_MAX))]
    return out
