"""gmlake.pause/resume/paused/tagged (python/gmlake/pause.py) on an embedded
client opened through ctypes (host backend, no torch): bytes kept at the same
addresses, memory given back while paused, tags, the context manager, a
resume() with nothing paused refused."""
import ctypes
import gmlake

lib = gmlake._load()
lib.gml_open.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.gml_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.gml_stats_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.gml_close.argtypes = [ctypes.c_void_p]


class Opts(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("backend", ctypes.c_char_p), ("socket_path", ctypes.c_char_p),
                ("mode", ctypes.c_int), ("limit_bytes", ctypes.c_size_t),
                ("guard", ctypes.c_int), ("guard_grain", ctypes.c_size_t), ("borrow", ctypes.c_int)]  # all of gml_open_opts


c = ctypes.c_void_p()
assert lib.gml_open(ctypes.byref(Opts(0, b"host", None, 2, 0)), ctypes.byref(c)) == 0
MiB = 1 << 20


def alloc(n):
    p = ctypes.c_void_p()
    assert lib.gml_alloc(c, n, None, ctypes.byref(p)) == 0
    return p.value


def reserved():
    st = gmlake._Stats()
    lib.gml_stats_get(c, ctypes.byref(st))
    return st.reserved


a = alloc(3 * MiB)
with gmlake.tagged(4, client=c):
    b = alloc(6 * MiB)
ctypes.memset(a, 0x11, 3 * MiB)
ctypes.memset(b, 0x22, 6 * MiB)
before = reserved()
with gmlake.paused(tag=4, client=c):
    assert reserved() < before, (reserved(), before)
    assert ctypes.string_at(a, 16) == b"\x11" * 16  # untagged: still there
assert ctypes.string_at(b, 6 * MiB) == b"\x22" * (6 * MiB)
gmlake.pause(client=c)
assert reserved() == 0
gmlake.resume(client=c)
assert ctypes.string_at(a, 3 * MiB) == b"\x11" * (3 * MiB) and ctypes.string_at(b, 16) == b"\x22" * 16
gmlake.pause(client=c)
try:
    gmlake.pause(client=c)
    raise SystemExit("a second pause should fail")
except gmlake.GMLakeError as e:
    assert "already paused" in str(e), e
gmlake.resume(client=c)
try:  # nothing paused: refused, saying so (gml_resume returned 0 and resume() passed silently)
    gmlake.resume(client=c)
    raise SystemExit("resume() with nothing paused should fail")
except gmlake.GMLakeError as e:
    assert "not paused (gml_pause first)" in str(e), e
try:  # discard saves nothing: a path with it is refused (it was ignored: nothing saved, no error)
    gmlake.pause(discard=True, path="/tmp/gmlake-python-pause-discard", client=c)
    raise SystemExit("pause(discard=True, path=...) should fail")
except gmlake.GMLakeError as e:
    assert "GML_PAUSE_DISCARD saves nothing, a path saves the content" in str(e), e
assert reserved() > 0  # nothing was paused
import os, tempfile  # noqa: E402
d = tempfile.mkdtemp(prefix="gmlake-python-pause-")
gmlake.pause(path=os.path.join(d, "b.bin").encode(), client=c)  # bytes, as open() takes them
assert os.path.exists(os.path.join(d, "b.bin")), os.listdir(d)  # not a file named "b'...'"
gmlake.resume(client=c)
assert os.listdir(d) == [], os.listdir(d)
try:
    gmlake.pause(path=os.path.join(d, "x\0y"), client=c)
    raise SystemExit("a path with a NUL should be refused")
except ValueError as e:
    assert "null byte" in str(e), e
os.rmdir(d)
lib.gml_close(c)
print("  pause/resume/paused/tagged: bytes and addresses kept, memory back while paused")
