"""PyTorch's allocator settings under GMLake, without torch (run by tests/run.sh; host backend, embedded):
the PyTorch layer's clients (gml_device_client: gmlake.open) read PYTORCH_ALLOC_CONF, else
PYTORCH_CUDA_ALLOC_CONF, in the library (client/torchconf.c). Keys with a GMLake meaning change what
happens (per_process_memory_fraction: the limit mem_info says; garbage_collection_threshold: held
memory over that share of the limit goes back at a free); the others are warned about once a process
each, naming the key and why, however many clients open; PyTorch's own pinned_* keys say nothing.
Each case runs in a child of its own (the settings are read when a device's client opens)."""
import os
import subprocess
import sys

CHILD = r'''
import ctypes, sys, gmlake
lib = gmlake._load()
lib.gml_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.gml_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.gml_device_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
c = gmlake.open(0)
gmlake.open(1)  # a second device's client: the warnings are not said again
free, total = gmlake.mem_info(0)
f, t = ctypes.c_uint64(), ctypes.c_uint64()
assert lib.gml_device_memory(c, ctypes.byref(f), ctypes.byref(t)) == 0
p = ctypes.c_void_p()
assert lib.gml_alloc(c, 24 << 20, None, ctypes.byref(p)) == 0
assert lib.gml_free(c, p) == 0
print("total %d device %d reserved %d" % (total, t.value, gmlake.stats(0)["reserved"]))
'''


def run(conf=None, cuda_conf=None, limit=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_") and k != "GMLAKE_LIMIT"}
    env.update(GMLAKE_BACKEND="host", GMLAKE_MODE="embedded", GMLAKE_LOG="warn", GMLAKE_HEADROOM="0")
    if conf is not None:
        env["PYTORCH_ALLOC_CONF"] = conf
    if cuda_conf is not None:
        env["PYTORCH_CUDA_ALLOC_CONF"] = cuda_conf
    if limit:
        env["GMLAKE_LIMIT"] = limit
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (conf, cuda_conf, r.stdout, r.stderr)
    words = r.stdout.split()
    return {words[i]: int(words[i + 1]) for i in range(0, len(words), 2)}, r.stderr


def lines_with(err, text):
    return [ln for ln in err.splitlines() if text in ln]


# the others: warned once each (two clients opened), naming the key and why; a list value is one value
n, err = run(cuda_conf="max_split_size_mb:128,expandable_segments:True,roundup_power2_divisions:[256:1,512:2],"
                       "no_such_key:3,max_split_size_mb:64,pinned_use_cuda_host_register:True,backend:native")
for key, why in (("max_split_size_mb", "stitching"), ("roundup_power2_divisions", "512 bytes"), ("no_such_key", "no key")):
    got = lines_with(err, key)
    assert len(got) == 1, "%s: warned %d times, not once:\n%s" % (key, len(got), err)
    assert "PYTORCH_CUDA_ALLOC_CONF" in got[0] and why in got[0], got[0]
for quiet in ("expandable_segments", "pinned_use_cuda_host_register", "backend:", "512:2"):
    assert not lines_with(err, quiet), "%s was warned about:\n%s" % (quiet, err)
print("  warned once each, naming key and why:\n    " + "\n    ".join(ln.split("] ", 1)[-1] for ln in err.splitlines()))

# a value with no GMLake meaning is warned about too, naming it
n, err = run(conf="expandable_segments:False,garbage_collection_threshold:2")
assert len(lines_with(err, "expandable_segments:False does not apply")) == 1, err
assert len(lines_with(err, "garbage_collection_threshold:2 does not apply")) == 1, err

# per_process_memory_fraction: the limit (PYTORCH_ALLOC_CONF wins over the older name)
n, err = run(conf="per_process_memory_fraction:0.5", cuda_conf="per_process_memory_fraction:0.25")
assert n["total"] == n["device"] // 2, n
assert not err.strip(), err
n0, _ = run()
assert n0["total"] == n0["device"], n0
print("  per_process_memory_fraction:0.5: mem_info total %d of the device's %d" % (n["total"], n["device"]))

# garbage_collection_threshold: with a limit of 32 MiB, 24 MiB allocated and freed; 0.5 keeps 16 MiB at most
plain, _ = run(limit="32MiB")
gc, err = run(cuda_conf="garbage_collection_threshold:0.5", limit="32MiB")
assert plain["reserved"] >= 24 << 20, plain
assert gc["reserved"] <= 16 << 20, (gc, err)
print("  garbage_collection_threshold:0.5, limit 32 MiB, 24 MiB freed: %d MiB held (%d MiB without it)"
      % (gc["reserved"] >> 20, plain["reserved"] >> 20))
