// The lake's IPC handle in PyTorch's expandable-segment format (python/gmlake/_torch_ipc.h), checked
// without torch or a GPU (host backend, embedded; run by tests/run.sh where a CUDA toolkit's headers
// are, which the header includes): the bytes are what PyTorch's reader takes (version 2, 'e', a
// header {pid, segment_size, num_handles} with zeroed padding, the fds), a second share of the same
// allocation is the same string (receivers cache by it), the trailer gives the offset and the lake's
// handle, a child process takes the fds with pidfd_getfd and reads the tensor's bytes at that offset,
// and handles too short for what they claim are refused with a message.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <sstream>
#include <stdexcept>
#include <string>

template <typename... A> std::string cat(const A &...a) {
  std::ostringstream o;
  (o << ... << a);
  return o.str();
}
#define TORCH_CHECK(cond, ...)                                                                                         \
  do {                                                                                                                 \
    if (!(cond)) throw std::runtime_error(cat(__VA_ARGS__));                                                           \
  } while (0)
#include "../python/gmlake/_torch_ipc.h"

#define EXPECT(cond)                                                                                                   \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      std::fprintf(stderr, "ipc_format: %s failed (line %d)\n", #cond, __LINE__);                                      \
      return 1;                                                                                                        \
    }                                                                                                                  \
  } while (0)

static bool refused(const std::string &handle, const char *words) {
  try {
    gmlake_ipc::parse_expandable(handle);
  } catch (const std::exception &x) {
    std::printf("  refused: %s\n", x.what());
    return std::strstr(x.what(), words) != nullptr;
  }
  return false;
}

int main() {
  gml_open_opts o{};
  o.backend = "host";
  o.mode = GML_MODE_EMBEDDED;
  gml_client *c;
  EXPECT(gml_open(&o, &c) == 0);
  void *pad, *p;
  size_t n = (5 << 20) + 4096;
  EXPECT(gml_alloc(c, 3 << 20, 0, &pad) == 0 && gml_alloc(c, n, 0, &p) == 0); // p starts inside a chunk
  std::vector<unsigned char> pat(n);
  for (size_t i = 0; i < n; i++) pat[i] = static_cast<unsigned char>(i * 7 + 3);
  EXPECT(gml_write(c, p, pat.data(), n) == 0);
  size_t off = 0, off2 = 0;
  std::string s = gmlake_ipc::lake_handle(c, p, &off);
  EXPECT(s[0] == 2 && s[1] == 'e');
  int pid;
  uint32_t padding;
  size_t seg, nh;
  std::memcpy(&pid, s.data() + 2, 4);
  std::memcpy(&padding, s.data() + 6, 4);
  std::memcpy(&seg, s.data() + 10, 8);
  std::memcpy(&nh, s.data() + 18, 8);
  EXPECT(pid == getpid() && padding == 0 && seg == (2u << 20) && nh == (off + n + seg - 1) / seg && off == (1u << 20));
  EXPECT(s.size() == 2 + 24 + nh * 4 + 4 + 8 + GML_IPC_HANDLE_SIZE);
  EXPECT(s == gmlake_ipc::lake_handle(c, p, &off2) && off2 == off);
  gmlake_ipc::Expandable e = gmlake_ipc::parse_expandable(s);
  EXPECT(e.lake && e.offset == off && e.fds.size() == nh && gml_ipc_device(&e.h) == 0);
  std::printf("  handle of %zu bytes: pid %d, %zu segments of %zu bytes, the tensor at %zu in the first\n", s.size(),
              pid, nh, seg, off);
  pid_t ch = fork();
  if (ch == 0) { // a receiver as PyTorch's own allocator is one: pidfd_getfd, the segments mapped in order
    int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) _exit(errno == ENOSYS ? 77 : 5);
    char *va = static_cast<char *>(mmap(nullptr, nh * seg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (size_t i = 0; i < nh; i++) {
      int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, e.fds[i], 0));
      if (fd < 0) {
        std::fprintf(stderr, "  %s\n", gmlake_ipc::fetch_refused(errno, pid, e.fds[i]).c_str());
        _exit(6);
      }
      if (mmap(va + i * seg, seg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) _exit(7);
      close(fd);
    }
    _exit(std::memcmp(va + e.offset, pat.data(), n) ? 8 : 0);
  }
  int st = 0;
  EXPECT(waitpid(ch, &st, 0) == ch && WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) {
    std::printf("  (no pidfd_open in this kernel: the fetch is not checked)\n");
  } else {
    EXPECT(WEXITSTATUS(st) == 0);
    std::printf("  a child took the %zu fds with pidfd_getfd and read the tensor's bytes at the offset\n", nh);
  }
  EXPECT(refused(std::string("\x02"
                             "e"
                             "short",
                             7),
                 "handle of 7 bytes"));
  EXPECT(refused(s.substr(0, 2 + 24), "segments (a fabric handle?"));
  gmlake_ipc::Expandable plain =
      gmlake_ipc::parse_expandable(s.substr(0, 2 + 24 + nh * 4)); // PyTorch's own: no trailer
  EXPECT(!plain.lake && plain.fds.size() == nh);
  EXPECT(gml_free(c, p) == 0 && gml_free(c, pad) == 0);
  gml_close(c);
  std::printf("  PyTorch's expandable-segment format: as PyTorch reads it\n");
  return 0;
}
