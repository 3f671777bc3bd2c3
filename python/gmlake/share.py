"""One copy of the same weights for many processes (needs a daemon: the lake's).

    gmlake.share(model, "llama-1b")     # process 1: the parameters move into a range published
                                        # under that name, read-only from now on
    gmlake.attach(model, "llama-1b")    # processes 2..n (same architecture): each parameter's
                                        # storage becomes the shared memory, mapped read-only
    gmlake.dedup(model)                 # or, with no names: hash the parameters on the device,
                                        # and where a process already published the same bytes
                                        # (compared, not only hashed) map those instead of ours

The parameters are packed into one growable range in the order module.parameters()
gives them (tied parameters once), each 256-byte aligned; `param.data` is pointed
at its place in the range, so the module, tied weights and references to the
Parameter objects keep working. The memory is read-only in every process, the
publisher too: an in-place write to a parameter is a fault (an illegal memory
access on CUDA, which ends the process's CUDA context; SIGSEGV on the host
backend), so this is for inference. The daemon counts the chunks once and keeps
them while any process maps them (`gmlakectl shares` lists who); they go back
after the last process detached or exited. Only processes of the publisher's uid
may attach unless share(..., allow_uids=[...]) or allow_any_uid=True says
otherwise. Keys are per user: attach(model, "llama-1b") finds only this user's
share; another user's is named "llama-1b@UID" (the publisher's uid). The old parameter memory is freed as far as PyTorch lets go of it
(torch.cuda.empty_cache() returns its cache).
"""
import ctypes
import hashlib
import struct

from . import GMLakeError, _torch
from . import grow as _g

__all__ = ["share", "attach", "dedup", "content_hash"]

ALIGN = 256


class _ShareOpts(ctypes.Structure):
    # mirrors gml_share_opts in gmlake.h
    _fields_ = [("hash", ctypes.c_void_p), ("hash_len", ctypes.c_size_t), ("meta", ctypes.c_void_p),
                ("meta_len", ctypes.c_size_t), ("allow_uids", ctypes.POINTER(ctypes.c_uint32)),
                ("n_allow_uids", ctypes.c_size_t), ("allow_any_uid", ctypes.c_int)]


def _bind():
    lib = _g._lib()
    if not getattr(lib.gml_share, "argtypes", None):
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        lib.gml_share.argtypes, lib.gml_share.restype = [vp, sz, ctypes.c_char_p, ctypes.POINTER(_ShareOpts)], i
        lib.gml_attach.argtypes = [vp, ctypes.c_char_p, ctypes.POINTER(vp), ctypes.POINTER(sz), vp, ctypes.POINTER(sz)]
        lib.gml_attach.restype = i
        lib.gml_dedup.argtypes, lib.gml_dedup.restype = [vp, sz, vp, sz, ctypes.POINTER(i)], i
    return lib


def _tensors(module_or_tensors):
    """The distinct tensors to pack, in a fixed order: a module's parameters
    (tied ones once), or the tensors given (a list, or a dict's values)."""
    if hasattr(module_or_tensors, "parameters"):
        ts = list(module_or_tensors.parameters())  # already without duplicates (tied weights)
    elif isinstance(module_or_tensors, dict):
        ts = list(module_or_tensors.values())
    else:
        ts = list(module_or_tensors)
    seen, out = set(), []
    for t in ts:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    if not out:
        raise ValueError("nothing to share: no parameters or tensors")
    dev = out[0].device
    if any(t.device != dev for t in out):
        raise ValueError("all tensors must be on one device")
    return out, dev


def _layout(ts):
    """(offsets, total bytes, a digest of names-free shapes and dtypes)."""
    offs, off, h = [], 0, hashlib.sha256()
    for t in ts:
        off = (off + ALIGN - 1) // ALIGN * ALIGN
        offs.append(off)
        nb = t.numel() * t.element_size()
        h.update(("%s:%s:%d;" % (tuple(t.shape), t.dtype, off)).encode())
        off += nb
    return offs, max(off, 1), h.digest()


def _views(base, ts, offs):
    for t, off in zip(ts, offs):
        nb = t.numel() * t.element_size()
        yield t, base[off:off + nb].view(t.dtype).view(t.shape)


def _pack(ts, dev, offs, total):
    """A growable range holding copies of ts, each tensor's .data pointed at its copy."""
    import torch
    rng = _g.GrowableRange(_g.client_for(dev), total, 1)
    rng.ensure(total)
    base = _g._byte_tensor(rng, dev)
    with torch.no_grad():
        for t, v in _views(base, ts, offs):
            v.copy_(t)
    for t, v in _views(base, ts, offs):
        t.data = v
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return rng


def content_hash(u8):
    """A 32-byte fingerprint of a uint8 tensor, computed where it lives (the
    GPU): sums of its 64-bit words under four position-dependent weightings,
    in blocks, with wrapping arithmetic. Not cryptographic: gml_dedup compares
    the bytes before it maps anything."""
    import torch
    n = u8.numel()
    words = n // 8
    acc = [0, 0, 0, 0]

    def add(x, start):
        i = torch.arange(start, start + x.numel(), device=x.device, dtype=torch.int64)
        ys = (x * (2 * i + 1), x * (i * 0x5851F42D4C957F2D + 0x14057B7EF767814F),
              x * ((i ^ (i >> 7)) * 0x2545F4914F6CDD1D | 1), x ^ (x >> 31))
        for k, y in enumerate(ys):
            acc[k] = (acc[k] + int(y.sum().item())) & (2**64 - 1)

    block = 1 << 24  # words a block: bounded temporaries
    with torch.no_grad():
        for start in range(0, words, block):
            add(u8[start * 8:min(words, start + block) * 8].view(torch.int64), start)
        if n % 8:  # the tail, padded with zeros
            tail = torch.zeros(8, dtype=torch.uint8, device=u8.device)
            tail[:n - words * 8] = u8[words * 8:]
            add(tail.view(torch.int64), words)
    acc[3] = (acc[3] + n) & (2**64 - 1)
    return struct.pack("<4Q", *acc)


def share(module_or_tensors, key, allow_uids=(), allow_any_uid=False):
    """Publish the parameters (or tensors) under key, with their content hash
    (so dedup() elsewhere finds them too); they become read-only views of the
    shared range. Returns the GrowableRange (kept alive by the parameters)."""
    _torch("gmlake.share()")
    lib = _bind()
    ts, dev = _tensors(module_or_tensors)
    offs, total, digest = _layout(ts)
    rng = _pack(ts, dev, offs, total)
    uids = (ctypes.c_uint32 * max(1, len(allow_uids)))(*allow_uids)
    meta = struct.pack("<Q", total) + digest
    h = content_hash(_g._byte_tensor(rng, dev)[:total])  # so that dedup() in other processes finds it too
    o = _ShareOpts(ctypes.cast(ctypes.c_char_p(h), ctypes.c_void_p), len(h),
                   ctypes.cast(ctypes.c_char_p(meta), ctypes.c_void_p), len(meta), uids, len(allow_uids),
                   1 if allow_any_uid else 0)
    _g._check(lib.gml_share(rng._h, total, key.encode(), ctypes.byref(o)), "share %r" % key, rng._client)
    rng.shared_key = key
    return rng


def attach(module_or_tensors, key):
    """Point every parameter (or tensor) at the shared copy published under
    key: the same architecture, so the same layout (checked). Returns the range."""
    torch = _torch("gmlake.attach()")
    lib = _bind()
    ts, dev = _tensors(module_or_tensors)
    offs, total, digest = _layout(ts)
    client = _g.client_for(dev)
    h, size = ctypes.c_void_p(), ctypes.c_size_t()
    meta = ctypes.create_string_buffer(1024)
    mlen = ctypes.c_size_t(len(meta))
    _g._check(lib.gml_attach(client, key.encode(), ctypes.byref(h), ctypes.byref(size), meta, ctypes.byref(mlen)),
              "attach %r" % key, client)
    rng = _g.GrowableRange._adopt(client, h.value, total)
    want = struct.pack("<Q", total) + digest
    if size.value != total or meta.raw[:mlen.value] != want:
        rng.release()
        raise GMLakeError("share %r was published from another layout (%d bytes, this module needs %d): "
                          "not the same architecture or dtype" % (key, size.value, total))
    base = _g._byte_tensor(rng, dev)
    for t, v in _views(base, ts, offs):
        t.data = v
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    rng.shared_key = key
    return rng


def dedup(module_or_tensors, return_range=False):
    """Pack the parameters into a range, hash it on the device, and if the
    lake has a published range with that hash and the same bytes, map that
    one instead (read-only) and give ours back; else publish ours for the
    next process. Returns True when deduplicated, False when published (with
    return_range, the range, whose .deduped says which).
    Equal hashes with different bytes raise GMLakeError (code GML_EMISMATCH);
    the parameters then stay in their own (writable) range."""
    _torch("gmlake.dedup()")
    lib = _bind()
    ts, dev = _tensors(module_or_tensors)
    offs, total, _ = _layout(ts)
    rng = _pack(ts, dev, offs, total)
    h = content_hash(_g._byte_tensor(rng, dev)[:total])
    done = ctypes.c_int(0)
    _g._check(lib.gml_dedup(rng._h, total, h, len(h), ctypes.byref(done)), "dedup", rng._client)
    rng.deduped = bool(done.value)
    return rng if return_range else rng.deduped
