// _torch_ipc.h (included by _C.cpp only): CUDA IPC with processes that never
// enabled GMLake, in PyTorch's own handle format.
//
// PyTorch's CUDACachingAllocator::shareIpcHandle writes a version byte (2),
// then a type: 'c', a cudaIpcMemHandle_t of the cudaMalloc'd segment (the
// default allocator); 'e', an expandable segment: a header {pid_t pid;
// size_t segment_size; size_t num_handles} and num_handles ints, the POSIX
// fds of its cuMemCreate handles in the sender, which the receiver takes
// with pidfd_getfd(2) and maps in order. (Numbers go into messages as
// std::to_string: _C.cpp says why.) A lake tensor goes out as an 'e'
// handle of its chunks (gml_ipc_export_fds: the chunk size is the segment
// size), so any PyTorch process's own allocator opens it; after the fds
// comes a trailer that PyTorch's reader never reads: "GMLK", the
// allocation's offset in its first chunk, and gml_ipc_export's handle, which
// a GMLake receiver opens through the exporter's socket (no ptrace rights
// needed) before it falls back to the fds. What a receiver cannot open says
// why and what to do.
#pragma once
#include <cuda.h>
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmlake.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace gmlake_ipc {

constexpr char kHandleVersion = 2; // PyTorch's SHAREABLE_HANDLE_VERSION
constexpr char kCudaMalloc = 'c', kExpandable = 'e';
constexpr char kTrailer[4] = {'G', 'M', 'L', 'K'};

struct ShareHeader { // PyTorch's ExpandableSegment::ShareHeader
  pid_t pid;
  size_t segment_size;
  size_t num_handles;
};

// The driver's VMM calls, from the libcuda PyTorch already loaded (no link-time dependency).
struct Cu {
  CUresult (*import_)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType) = nullptr;
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*addr_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*error_string)(CUresult, const char **) = nullptr;
  bool ok = false;
};

inline const Cu &cu() {
  static const Cu c = [] {
    Cu v;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return v;
#define GMLAKE_SYM(field, name) v.field = reinterpret_cast<decltype(v.field)>(dlsym(h, name))
    GMLAKE_SYM(import_, "cuMemImportFromShareableHandle");
    GMLAKE_SYM(reserve, "cuMemAddressReserve");
    GMLAKE_SYM(map, "cuMemMap");
    GMLAKE_SYM(set_access, "cuMemSetAccess");
    GMLAKE_SYM(unmap, "cuMemUnmap");
    GMLAKE_SYM(release, "cuMemRelease");
    GMLAKE_SYM(addr_free, "cuMemAddressFree");
    GMLAKE_SYM(error_string, "cuGetErrorString");
#undef GMLAKE_SYM
    v.ok = v.import_ && v.reserve && v.map && v.set_access && v.unmap && v.release && v.addr_free;
    return v;
  }();
  return c;
}

inline std::string cu_error(CUresult r) {
  const char *s = nullptr;
  if (cu().error_string) cu().error_string(r, &s);
  return s ? s : ("CUDA driver error " + std::to_string(static_cast<int>(r)));
}

inline int ptrace_scope() {
  FILE *f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  int s = -1;
  if (f) {
    if (std::fscanf(f, "%d", &s) != 1) s = -1;
    std::fclose(f);
  }
  return s;
}

// Why the sender's fds cannot be taken, and what to do (errno of pidfd_open / pidfd_getfd).
inline std::string fetch_refused(int err, pid_t pid, int fd) {
  std::string who = "the sending process (pid " + std::to_string(pid) + ")";
  switch (err) {
  case ENOSYS:
    return "this kernel has no pidfd_open/pidfd_getfd (Linux 5.6 and later have them), which PyTorch's expandable-"
           "segment handles need: run gmlake.enable() in the sender too (the lake shares through its own socket), or "
           "send from PyTorch's default allocator (expandable_segments:False)";
  case ESRCH:
    return who +
           " is not running in this process's PID namespace: it exited before this one opened the tensor (keep "
           "the sender's tensor alive until receivers have it), or it runs in another container (there, run both with "
           "gmlake.enable() in one network namespace, or share PID namespaces)";
  case EPERM:
  case EACCES:
    return who + " does not let this one take its memory's file descriptors (pidfd_getfd: " + std::strerror(err) +
           "): it runs as another user, or kernel.yama.ptrace_scope (" +
           (ptrace_scope() < 0 ? std::string("not in this kernel") : std::to_string(ptrace_scope())) +
           ") forbids it. Run both as one user; with ptrace_scope 1 the sender must allow it (a GMLake sender does; "
           "a plain PyTorch sender: prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)), scope 2 or 3 allow only root; or run "
           "gmlake.enable() in the sender too (the lake shares through its own socket)";
  case EBADF:
    return "fd " + std::to_string(fd) + " is not open in " + who +
           ": the sender freed the tensor (its memory went back) before this process opened it; keep it alive until "
           "the receivers have it (torch.multiprocessing does while the sender's process lives)";
  default: return "pidfd_getfd from " + who + ": " + std::strerror(err);
  }
}

// An expandable segment of another process: its handles taken with pidfd_getfd, mapped in order on `device`.
inline std::shared_ptr<void> open_fds(pid_t pid, size_t seg, const std::vector<int> &rfds, int device) {
  const Cu &d = cu();
  TORCH_CHECK(d.ok, "gmlake: cannot open another process's expandable-segment memory: the CUDA driver's VMM calls "
                    "were not found in libcuda.so.1");
  TORCH_CHECK(seg > 0 && !rfds.empty(), "gmlake: an expandable-segment IPC handle of no memory");
  std::vector<CUmemGenericAllocationHandle> hs;
  auto release_all = [&] {
    for (auto h : hs) d.release(h);
  };
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  TORCH_CHECK(pidfd >= 0, "gmlake: cannot open the shared tensor: ", fetch_refused(errno, pid, -1));
  for (int rfd : rfds) {
    int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, rfd, 0));
    if (fd < 0) {
      int err = errno;
      close(pidfd);
      release_all();
      TORCH_CHECK(false, "gmlake: cannot open the shared tensor: ", fetch_refused(err, pid, rfd));
    }
    CUmemGenericAllocationHandle h = 0;
    CUresult r =
        d.import_(&h, reinterpret_cast<void *>(static_cast<uintptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    if (r != CUDA_SUCCESS) {
      close(pidfd);
      release_all();
      TORCH_CHECK(false, "gmlake: cannot import the shared tensor's memory (fd ", std::to_string(rfd), " of pid ",
                  std::to_string(pid), ", cuMemImportFromShareableHandle): ", cu_error(r),
                  ": the sender's GPU must be one this process sees, and its fd a CUDA memory handle");
    }
    hs.push_back(h);
  }
  close(pidfd);
  size_t n = hs.size(), total = n * seg;
  CUdeviceptr va = 0;
  CUresult r = d.reserve(&va, total, 0, 0, 0);
  size_t mapped = 0;
  for (; r == CUDA_SUCCESS && mapped < n; mapped++) r = d.map(va + mapped * seg, seg, 0, hs[mapped], 0);
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc a;
    std::memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = device;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.set_access(va, total, &a, 1);
  }
  if (r != CUDA_SUCCESS) {
    for (size_t i = 0; i < mapped; i++) d.unmap(va + i * seg, seg);
    if (va) d.addr_free(va, total);
    release_all();
    TORCH_CHECK(false, "gmlake: cannot map the shared tensor's ", std::to_string(n), " segment(s) of ",
                std::to_string(seg), " bytes: ", cu_error(r));
  }
  return std::shared_ptr<void>(reinterpret_cast<void *>(va), [hs, seg, total](void *p) {
    CUdeviceptr v = reinterpret_cast<CUdeviceptr>(p);
    cudaDeviceSynchronize(); // no kernel of ours still reads it (PyTorch's own unmap does the same)
    for (size_t i = 0; i < hs.size(); i++) cu().unmap(v + i * seg, seg);
    for (auto h : hs) cu().release(h);
    cu().addr_free(v, total);
  });
}

// A cudaMalloc'd segment of PyTorch's default allocator in another process.
inline std::shared_ptr<void> open_cuda_malloc(const std::string &handle) {
  TORCH_CHECK(handle.size() >= 2 + CUDA_IPC_HANDLE_SIZE, "gmlake: a cudaMalloc IPC handle of ",
              std::to_string(handle.size()), " bytes (", std::to_string(2 + CUDA_IPC_HANDLE_SIZE), " expected)");
  cudaIpcMemHandle_t mh;
  std::memcpy(&mh, handle.data() + 2, sizeof mh);
  void *p = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_CHECK(false,
                "gmlake: cannot open memory another process's own PyTorch allocator shared "
                "(cudaIpcOpenMemHandle: ",
                cudaGetErrorString(e),
                "): the sender must still hold it and see the same "
                "GPU, and a process cannot open its own handle");
  }
  return std::shared_ptr<void>(p, [](void *q) { cudaIpcCloseMemHandle(q); });
}

// The 'e' handle of a lake allocation (its chunks' fds and the trailer), and its offset in the first chunk.
inline std::string lake_handle(gml_client *c, void *ptr, size_t *offset) {
  gml_ipc_handle h;
  int rc = gml_ipc_export(c, ptr, &h);
  size_t n = 0, off = 0, cs = 0;
  if (rc == 0) rc = gml_ipc_export_fds(c, ptr, nullptr, 0, &n, &off, &cs);
  std::vector<int> fds(n);
  if (rc == 0) rc = gml_ipc_export_fds(c, ptr, fds.data(), n, &n, &off, &cs);
  TORCH_CHECK(rc == 0, "gmlake: cannot share ", std::to_string(reinterpret_cast<uintptr_t>(ptr)),
              " with another process: ", gml_strerror(rc), ": ", gml_last_error(c));
  ShareHeader hd;
  std::memset(&hd, 0, sizeof hd); // padding too: the handle is a key of the receivers' caches
  hd.pid = getpid();
  hd.segment_size = cs;
  hd.num_handles = n;
  uint64_t off64 = off;
  std::string s;
  s.push_back(kHandleVersion);
  s.push_back(kExpandable);
  s.append(reinterpret_cast<const char *>(&hd), sizeof hd);
  s.append(reinterpret_cast<const char *>(fds.data()), n * sizeof(int));
  s.append(kTrailer, sizeof kTrailer);
  s.append(reinterpret_cast<const char *>(&off64), sizeof off64);
  s.append(reinterpret_cast<const char *>(h.bytes), GML_IPC_HANDLE_SIZE);
  *offset = off;
  return s;
}

// What an 'e' handle says: the header, the fds, and the lake's trailer when there is one.
struct Expandable {
  ShareHeader hd;
  std::vector<int> fds;
  bool lake = false;
  uint64_t offset = 0;
  gml_ipc_handle h;
};

inline Expandable parse_expandable(const std::string &s) {
  Expandable e;
  TORCH_CHECK(s.size() >= 2 + sizeof(ShareHeader), "gmlake: an expandable-segment IPC handle of ",
              std::to_string(s.size()), " bytes");
  std::memcpy(&e.hd, s.data() + 2, sizeof e.hd);
  size_t at = 2 + sizeof(ShareHeader);
  TORCH_CHECK(e.hd.num_handles <= (s.size() - at) / sizeof(int), "gmlake: an expandable-segment IPC handle of ",
              std::to_string(s.size()), " bytes for ", std::to_string(e.hd.num_handles),
              " segments (a fabric handle? only POSIX fds are opened)");
  e.fds.resize(e.hd.num_handles);
  std::memcpy(e.fds.data(), s.data() + at, e.fds.size() * sizeof(int));
  at += e.fds.size() * sizeof(int);
  if (s.size() == at + sizeof kTrailer + 8 + GML_IPC_HANDLE_SIZE &&
      !std::memcmp(s.data() + at, kTrailer, sizeof kTrailer)) {
    e.lake = true;
    std::memcpy(&e.offset, s.data() + at + sizeof kTrailer, 8);
    std::memcpy(e.h.bytes, s.data() + at + sizeof kTrailer + 8, GML_IPC_HANDLE_SIZE);
  }
  return e;
}

} // namespace gmlake_ipc
