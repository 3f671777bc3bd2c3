"""python/gmlake's argument checks, without torch (run by tests/run.sh; host backend, embedded).

ctypes converts a Python int to c_size_t / c_int / c_uint32 by keeping the low bits, without a
word: GrowableRange(c, 2**64 + 1, 4096) made a 4 KiB range that claimed 2**64 + 1 rows,
map_bytes(2**64, ...) mapped offset 0, is_mapped(2**64) answered for offset 0, stats(2**32) /
trim(2**32) / open(2**32) were device 0's, pause(tag=2**32) paused every allocation (tag 0: all)
and set_tag(2**32) set no tag. Each is now a ValueError naming the value, and nothing happens."""
import ctypes
import gmlake

c = gmlake.open()  # device 0's client (GMLAKE_BACKEND=host)
lib = gmlake._load()
lib.gml_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.gml_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]


def refused(call, what):
    try:
        got = call()
    except ValueError as e:
        assert str(e), what
        return
    raise AssertionError("%s was accepted (%r): ctypes kept the low bits" % (what, got))


def ranges():
    return gmlake.stats(0)["growable_ranges"]


refused(lambda: gmlake.GrowableRange(c, 2**64 + 1, 4096), "GrowableRange of 2**64 + 1 rows")
refused(lambda: gmlake.GrowableRange(c, 2**64 + 4096, 1), "GrowableRange of 2**64 + 4096 bytes")
refused(lambda: gmlake.GrowableRange(c, 0.5, 4096), "GrowableRange of 0.5 rows (0 rows)")
assert ranges() == 0, "a range was created for a refused size"
r = gmlake.GrowableRange(c, 1000, 4096)
cs = r.chunk_size
refused(lambda: r.map_bytes(2**64, cs), "map_bytes at offset 2**64")
refused(lambda: r.map_bytes(0, 2**64 + cs), "map_bytes of 2**64 + chunk bytes")
refused(lambda: r.unmap_bytes(2**64, cs), "unmap_bytes at offset 2**64")
refused(lambda: r.map_bytes(-cs, cs), "map_bytes at a negative offset")
assert r.mapped_bytes == 0, "a refused map_bytes mapped something"
refused(lambda: r.is_mapped(2**64), "is_mapped(2**64)")
refused(lambda: r.is_mapped(-1), "is_mapped(-1)")
r.release()

for dev in (2**32, 2**40, -2**32):
    refused(lambda: gmlake.stats(dev), "stats(%d)" % dev)
    refused(lambda: gmlake.trim(dev), "trim(%d)" % dev)
    refused(lambda: gmlake.open(dev), "open(%d)" % dev)
    refused(lambda: gmlake.block_of(0, dev), "block_of(0, %d)" % dev)
    refused(lambda: gmlake.pause(device=dev), "pause(device=%d)" % dev)

p = ctypes.c_void_p()
assert lib.gml_alloc(c, 4 << 20, None, ctypes.byref(p)) == 0  # untagged
for tag in (2**32, -1, 2**64):
    refused(lambda: gmlake.pause(tag=tag), "pause(tag=%d)" % tag)
    assert gmlake.stats(0)["paused_bytes"] == 0, "pause(tag=%d) paused the untagged allocation" % tag
    refused(lambda: gmlake.set_tag(tag), "set_tag(%d)" % tag)
ctypes.memset(p.value, 1, 4 << 20)  # still mapped
assert lib.gml_free(c, p) == 0
print("  sizes, offsets, devices and tags past what C takes: ValueError, nothing done (ctypes kept the low bits)")
