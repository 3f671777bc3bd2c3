"""python/gmlake's growable ranges on the host backend (run by tests/run.sh).

Without torch: GrowableRange's row arithmetic, in-place growth (bytes kept,
base fixed), shrink, the stats, and a fault on an unmapped row (in a child
process). With torch importable (a CPU build is enough): gmlake.growable(...,
device="cpu") is an ordinary tensor over the range."""
import ctypes
import os
import subprocess
import sys

import gmlake
from gmlake import grow as G

c = G.client_for("cpu")
lib = gmlake._load()
lib.gml_stats_get.argtypes = [ctypes.c_void_p, ctypes.POINTER(gmlake._Stats)]


def stats():
    st = gmlake._Stats()
    assert lib.gml_stats_get(c, ctypes.byref(st)) == 0
    return st


row = 3000                                   # rows straddle chunk borders
r = G.GrowableRange(c, 5000, row)
cs = r.chunk_size
assert r.reserved == -(-5000 * row // cs) * cs, (r.reserved, cs)
assert r.mapped_rows == 0 and r.mapped_bytes == 0
n = r.ensure(10)
assert n == cs // row and r.mapped_bytes == cs, (n, r.mapped_bytes)   # one chunk holds 699 rows of 3000 B
base = r.base
for i in range(n):
    ctypes.memset(base + i * row, i % 251, row)
n2 = r.ensure(2000)                          # 6 MB: 3 chunks
assert r.base == base and n2 == 3 * cs // row and r.mapped_bytes == 3 * cs, (n2, r.mapped_bytes)
buf = (ctypes.c_uint8 * row)()
for i in range(n):
    ctypes.memmove(buf, base + i * row, row)
    assert bytes(buf) == bytes([i % 251]) * row, "row %d moved or changed when the range grew" % i
st = stats()
assert (st.growable_ranges, st.growable_mapped, st.growable_unmapped) == (1, 3 * cs, r.reserved - 3 * cs), \
    (st.growable_ranges, st.growable_mapped, st.growable_unmapped)
assert r.shrink(700) == 2 * cs // row        # row 699 lies in chunk 1: chunks 0 and 1 stay
assert r.mapped_bytes == 2 * cs and not r.is_mapped(2 * cs) and r.is_mapped(cs)
try:
    r.ensure(5001)
    raise AssertionError("ensure past the end accepted")
except ValueError:
    pass
# a row that is not mapped faults (in a child, which the parent watches)
child = subprocess.run([sys.executable, "-c",
                        "import ctypes; ctypes.string_at(%d, 1); print('read')" % (base + 2 * cs + 5)],
                       capture_output=True)
assert child.returncode == -11 and b"read" not in child.stdout, (child.returncode, child.stdout)
r.release()
st = stats()
assert (st.growable_ranges, st.growable_mapped, st.growable_unmapped) == (0, 0, 0)
print("  GrowableRange: grows in place, shrinks, counts, faults past the mapped rows: ok")

try:
    import torch
except ImportError:
    torch = None
if torch is None:
    print("  (torch not importable here: gmlake.growable's tensor is checked where torch is)")
    sys.exit(0)
t = gmlake.growable((4096, 12, 64), torch.float16, device="cpu")
assert type(t) is torch.Tensor and t.shape == (4096, 12, 64) and t.dtype == torch.float16
p0 = t.data_ptr()
assert p0 == t.gmlake.base
rows_per_chunk = t.gmlake.chunk_size // (12 * 64 * 2)
assert t.mapped_rows() == rows_per_chunk      # the first chunk is mapped at creation
t[:10] = torch.arange(10, dtype=torch.float16).view(10, 1, 1)
assert t.ensure(3000) >= 3000 and t.data_ptr() == p0
assert torch.equal(t[:10, 5, 7], torch.arange(10, dtype=torch.float16))
t[:3000] = 1.5
v = t[:3000].sum(dtype=torch.float32).item()
assert v == 1.5 * 3000 * 12 * 64, v
assert t.shrink(100) == rows_per_chunk and t[:100].float().mean().item() == 1.5
del t
import gc
gc.collect()
st = stats()
assert st.growable_ranges == 0 and st.growable_mapped == 0, (st.growable_ranges, st.growable_mapped)
print("  gmlake.growable (torch %s, cpu): a plain tensor over the range, grows in place, freed with it: ok" % torch.__version__)
