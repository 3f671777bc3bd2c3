"""gmlake.copy / copy_info (python/gmlake/transfer.py) on an embedded client opened through ctypes
(host backend, no torch): pageable bytes to the device and back through the staging pool, a bad
kind refused, a failed copy raised with the library's words."""
import ctypes
import gmlake

lib = gmlake._load()
lib.gml_open.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.gml_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.gml_close.argtypes = [ctypes.c_void_p]


class Opts(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("backend", ctypes.c_char_p), ("socket_path", ctypes.c_char_p),
                ("mode", ctypes.c_int), ("limit_bytes", ctypes.c_size_t),
                ("guard", ctypes.c_int), ("guard_grain", ctypes.c_size_t), ("borrow", ctypes.c_int)]  # all of gml_open_opts


c = ctypes.c_void_p()
assert lib.gml_open(ctypes.byref(Opts(0, b"host", None, 2, 0)), ctypes.byref(c)) == 0
n = 40 << 20  # more than a slot (the default pool of 256 MiB: 64 MiB slots): packed, then pipelined below
d = ctypes.c_void_p()
assert lib.gml_alloc(c, n, None, ctypes.byref(d)) == 0
src = (ctypes.c_ubyte * n).from_buffer_copy(bytes(range(251)) * (n // 251) + bytes(n % 251))
back = (ctypes.c_ubyte * n)()
gmlake.copy(d.value, ctypes.addressof(src), n, gmlake.COPY_H2D, client=c)
gmlake.copy(ctypes.addressof(back), d.value, n, gmlake.COPY_D2H, client=c.value)
assert bytes(back) == bytes(src)
info = gmlake.copy_info(client=c)
assert info["bytes_staged"] == 2 * n and info["staging_bytes"] > 0 and info["slots"] == 4, info
# multi-path: pageable copies take one path, so no probe yet (the layout of gml_copy_info read to its end)
assert info["npaths"] == 0 and info["paths_used"] == 0 and info["bytes_split"] == 0 and info["paths"] == [], info
try:
    gmlake.copy(d.value, ctypes.addressof(src), n, 7, client=c)
    raise AssertionError("kind 7 taken")
except gmlake.GMLakeError as e:
    assert "kind 7" in str(e), e
try:
    gmlake.copy(None, ctypes.addressof(src), n, gmlake.COPY_H2D, client=c)
    raise AssertionError("NULL dst taken")
except gmlake.GMLakeError as e:
    assert "invalid argument" in str(e) and "dst is NULL" in str(e), e
try:
    import torch  # noqa: F401
except ImportError:  # what needs torch says so
    try:
        gmlake.copy_(None, None)
        raise AssertionError("copy_ without torch")
    except gmlake.GMLakeError as e:
        assert str(e).startswith("gmlake.copy_() needs PyTorch (import torch failed: "), e
lib.gml_close(c)
print("  gmlake.copy: %d MiB of pageable memory to the device and back through the staging pool (%d MiB, %d threads); "
      "a bad kind and a NULL pointer refused" % (n >> 20, info["staging_bytes"] >> 20, info["threads"]))
