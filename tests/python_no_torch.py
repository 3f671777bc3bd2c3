"""python/gmlake installed without torch (run by tests/run.sh, from the
folder pip installed it into, argv[1]): the ctypes parts work (stats() with
no device is device 0's, growable ranges, trim and the bytes it gave back, pause/resume), and what needs
PyTorch raises GMLakeError saying so, never a bare ModuleNotFoundError;
stats() and trim() with no client open raise GMLakeError (trim returned -3)
naming gmlake.open(), which opens device 0's client without torch (there was
no public way: GrowableRange wanted a raw gml_client*), and says what to do
where the backend would be host memory and a GPU's is needed."""
import ctypes
import glob
import os
import subprocess
import sys

site = sys.argv[1]
try:
    import torch  # noqa: F401
    sys.exit("python_no_torch.py: torch is importable here; the check means nothing")
except ImportError:
    pass
import gmlake
from gmlake import grow

assert os.path.dirname(os.path.abspath(gmlake.__file__)) == os.path.join(site, "gmlake"), gmlake.__file__
assert not glob.glob(os.path.join(site, "gmlake", "_C*")), "an extension was installed without torch"


def needs_torch(call, what):
    try:
        call()
    except gmlake.GMLakeError as e:
        assert str(e).startswith("%s needs PyTorch (import torch failed: " % what), e
        return str(e)
    raise AssertionError("%s worked without torch" % what)


print("  " + needs_torch(gmlake.enable, "gmlake.enable()"))
assert gmlake.enabled() is False
needs_torch(gmlake.pool, "gmlake.pool()")
needs_torch(lambda: gmlake.growable((4, 8), "float16", device="cpu"), "gmlake.growable()")
needs_torch(lambda: gmlake.share([], "k"), "gmlake.share()")
needs_torch(lambda: gmlake.attach([], "k"), "gmlake.attach()")
needs_torch(lambda: gmlake.dedup([]), "gmlake.dedup()")

# stats() with no device: device 0 (CUDA's current device when none was chosen)
try:
    gmlake.stats()
    raise AssertionError("stats() before any client")
except gmlake.GMLakeError as e:
    assert "no GMLake client is open on device 0" in str(e) and "gmlake.open(0) opens it" in str(e), e
try:  # it returned the bare code, -3
    gmlake.trim()
    raise AssertionError("trim() before any client")
except gmlake.GMLakeError as e:
    assert "no GMLake client is open on device 0" in str(e), e
# no GPU and GMLAKE_BACKEND unset: the lake would be host memory; a device's client refuses it, saying how
env = dict(os.environ, GMLAKE_LIBCUDA="/nonexistent/libcuda.so.1", GMLAKE_LOG="error")
env.pop("GMLAKE_BACKEND", None)
p = subprocess.run([sys.executable, "-c", "import gmlake\ntry:\n  gmlake.open(0)\nexcept gmlake.GMLakeError as e:\n  print(e)"],
                   env=env, capture_output=True, text=True)
assert p.returncode == 0 and "cannot open the lake of device 0" in p.stdout and "GMLAKE_BACKEND=host" in p.stdout, (p.stdout, p.stderr)
# options through the C API (gml_set_option, as enable() passes socket and mode), not the environment: the
# same process opens the host lake embedded, its environment (and so its children's) unchanged
p = subprocess.run([sys.executable, "-c", "import gmlake, os\ngmlake._set_option('GMLAKE_BACKEND', 'host')\n"
                    "gmlake._set_option('GMLAKE_MODE', 'embedded')\nassert gmlake.open(0)\n"
                    "assert gmlake.stats()['backend'] == 'host' and 'GMLAKE_BACKEND' not in os.environ\n"
                    "try:\n  gmlake._set_option('CUDA_VISIBLE_DEVICES', '1')\n"
                    "except gmlake.GMLakeError as e:\n  print(e)"],
                   env=env, capture_output=True, text=True)
assert p.returncode == 0 and "gml_set_option(CUDA_VISIBLE_DEVICES): invalid argument" in p.stdout, (p.stdout, p.stderr)
# a device index out of range: the error points at the log, which says why (it said nothing)
p = subprocess.run([sys.executable, "-c", "import gmlake\ntry:\n  gmlake.open(64)\nexcept gmlake.GMLakeError as e:\n  print(e)"],
                   env=dict(os.environ, GMLAKE_LOG="error"), capture_output=True, text=True)
assert "the log above says why" in p.stdout and "device 64: not a device index (0 to 63)" in p.stderr, (p.stdout, p.stderr)
# the ctypes mirror of gml_open_opts has every member of the header's (it lacked guard, guard_grain and
# borrow: gml_open read them from past the struct, and refused the stray values)
import re  # noqa: E402
hdr = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include", "gmlake.h")).read()
body = re.search(r"typedef struct gml_open_opts \{(.*?)\} gml_open_opts;", hdr, re.S).group(1)
members = [re.search(r"(\w+);", line).group(1) for line in body.splitlines() if ";" in line.split("/*")[0]]
assert [f[0] for f in grow._OpenOpts._fields_] == members, (grow._OpenOpts._fields_, members)
c = gmlake.open()  # device 0's client, as the PyTorch layer would open it (GMLAKE_BACKEND=host)
assert c and gmlake.open(0) == c == grow.client_for(0)
assert gmlake.stats()["allocated"] == 0  # a client now, before anything is allocated
r = gmlake.GrowableRange(c, 1000, 4096)
assert r.ensure(600) >= 600
st = gmlake.stats()
assert st["backend"] == "host" and st["growable_mapped"] == r.mapped_bytes > 0, st
# trim() returns the bytes it gave back (it returned gmlake_torch_trim's 0 whatever went back)
lib = gmlake._load()
lib.gml_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.gml_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
p = ctypes.c_void_p()
assert lib.gml_alloc(c, 8 << 20, None, ctypes.byref(p)) == 0 and lib.gml_free(c, p) == 0
before = gmlake.stats()["reserved"]
n = gmlake.trim()
assert n == before - gmlake.stats()["reserved"] >= 8 << 20, (n, before, gmlake.stats()["reserved"])
assert gmlake.trim() == 0  # nothing idle left
gmlake.pause()
gmlake.resume()
with gmlake.tagged(3):
    pass
# a refusal names what was wrong (is_mapped said only "invalid argument"), and a released range says so
# (ensure() after release() raised the message of the client's last error, here the one below)
try:
    r.is_mapped(1 << 40)
    raise AssertionError("is_mapped past the end")
except gmlake.GMLakeError as e:
    assert "is past the end of the range" in str(e), e
r.release()
assert gmlake.stats(0)["growable_mapped"] == 0
for call in (lambda: r.ensure(1), lambda: r.shrink(0), lambda: r.is_mapped(0), lambda: r.map_bytes(0, r.chunk_size)):
    try:
        call()
        raise AssertionError("a released range was used")
    except gmlake.GMLakeError as e:
        assert str(e) == "growable range already released", e
print("  without torch: gmlake.open(), stats() of device 0, growable ranges, trim, pause/resume work")
