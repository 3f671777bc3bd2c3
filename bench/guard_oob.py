"""Guard mode on the GPU: a kernel writes one element past a tensor's end.

  GMLAKE_GUARD=1 python3 bench/guard_oob.py            the write faults; we catch the CUDA
                                                        error and name the tensor's allocation
  GMLAKE_GUARD=0 python3 bench/guard_oob.py            control: the same write, no guard
  compute-sanitizer --tool memcheck --log-file L python3 bench/guard_oob.py
        with GMLAKE_SANITIZER_LOG=L: the faulting address comes from the sanitizer's report

The tensor is 5 MiB + 1536 bytes of float32 (a multiple of PyTorch's 512-byte alignment, so
its last element ends exactly where guard mode puts the unmapped guard: "one element past"
is then the first byte of the guard). The kernel is hand-written PTX launched through the
driver API (no compiler needed); triton is the fallback. A CUDA fault kills the context, so
everything after it uses only what the library recorded: gmlake.block_of(addr) makes no
CUDA call. Prints one line 'GUARD_OOB {json}' for bench/gpu.sh.
"""
import ctypes, json, os, re, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

PTX = r"""
.version 7.0
.target sm_80
.address_size 64
.visible .entry write_one(.param .u64 p, .param .u64 off)
{
  .reg .b64 %rd<4>;
  .reg .f32 %f1;
  ld.param.u64 %rd1, [p];
  ld.param.u64 %rd2, [off];
  cvta.to.global.u64 %rd1, %rd1;
  add.s64 %rd3, %rd1, %rd2;
  mov.f32 %f1, 0f3F800000;
  st.global.f32 [%rd3], %f1;
  ret;
}
"""


def launch_ptx(ptr, off, stream):
    cu = ctypes.CDLL("libcuda.so.1")
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    src = ctypes.create_string_buffer(PTX.encode())
    r = cu.cuModuleLoadData(ctypes.byref(mod), src)
    if r:
        raise RuntimeError("cuModuleLoadData: %d" % r)
    r = cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"write_one")
    if r:
        raise RuntimeError("cuModuleGetFunction: %d" % r)
    a, b = ctypes.c_uint64(ptr), ctypes.c_uint64(off)
    params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(a), ctypes.c_void_p), ctypes.cast(ctypes.byref(b), ctypes.c_void_p))
    r = cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, ctypes.c_void_p(stream), params, None)
    if r:
        raise RuntimeError("cuLaunchKernel: %d" % r)


def launch_triton(t, n):
    import triton, triton.language as tl

    @triton.jit
    def write_one(p, off):
        tl.store(p + off, 1.0)
    write_one[(1,)](t, n)


def sanitizer_addresses(path):
    """Addresses compute-sanitizer's memcheck reported (Invalid ... at ADDR / Address ADDR)."""
    try:
        text = open(path).read()
    except OSError:
        return []
    return sorted({int(a, 16) for a in re.findall(r"Address (0x[0-9a-fA-F]+)", text)})


def main():
    import gmlake
    gmlake.enable(mode=os.environ.get("GMLAKE_MODE", "embedded"))
    import torch
    guard = os.environ.get("GMLAKE_GUARD", "0")
    nbytes = (5 << 20) + 1536
    n = nbytes // 4
    keep = [torch.zeros(1 << 20, device="cuda") for _ in range(3)]  # neighbours
    x = torch.zeros(n, device="cuda")
    after = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    dev = torch.cuda.current_device()  # asked now: after the fault the CUDA runtime answers nothing
    base, past = x.data_ptr(), x.data_ptr() + nbytes
    out = dict(guard=guard, tensor_ptr=hex(base), tensor_bytes=nbytes, write_at=hex(past),
               block_of_write=gmlake.block_of(past, device=dev))
    how = "ptx"
    try:
        try:
            launch_ptx(base, nbytes, torch.cuda.current_stream().cuda_stream)
        except (OSError, RuntimeError, AttributeError) as e:
            how = "triton (ptx failed: %s)" % e
            launch_triton(x, n)
        torch.cuda.synchronize()
        out.update(faulted=False, note="the write past the end went unnoticed")
        out["after_first"] = float(after[0].item())
    except Exception as e:  # torch.AcceleratorError / RuntimeError: the context is gone now
        out.update(faulted=True, cuda_error=str(e).splitlines()[0])
        log = os.environ.get("GMLAKE_SANITIZER_LOG")
        addrs = sanitizer_addresses(log) if log else []
        out["sanitizer_addresses"] = [hex(a) for a in addrs]
        # the faulting address: the sanitizer's if it gave one, else the one we wrote to
        # (a plain CUDA fault does not say where)
        addr = addrs[0] if addrs else past
        out["fault_address_from"] = "compute-sanitizer" if addrs else "the program (CUDA does not report it)"
        out["block"] = gmlake.block_of(addr, device=dev)
    out["kernel"] = how
    try:
        gmlake.dump_blocks(os.path.join(os.environ.get("OUT", "/tmp"), "guard_oob_blocks.json"), device=dev)
    except Exception as e:
        out["dump_error"] = str(e)
    print("GUARD_OOB " + json.dumps(out), flush=True)
    b = out.get("block")
    if out.get("faulted") and b:
        print("gmlake: the fault at %s is %d bytes past the end of a %d-byte allocation at %s (#%d)"
              % (hex(addr), b["past_end"], b["size"], hex(b["ptr"]), b["seq"]), flush=True)
    os._exit(0)  # the CUDA context is dead: skip teardown


if __name__ == "__main__":
    main()
