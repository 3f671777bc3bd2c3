/* backend_host.c: the host backend. A chunk is a memfd, a virtual range is a
 * PROT_NONE reservation, and mapping is mmap(MAP_FIXED|MAP_SHARED) of the
 * memfd into it: real virtual-memory stitching, shared across processes by
 * passing the fd. There is no asynchronous work, so events are done at once
 * (the tests' fake events, tests/backends.c, drive them by hand). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "backend.h"
#include "gmlake.h"
#include "gpuname.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int host_chunk_create(gml_backend *be, gml_phys *phys, int *fd) {
  int mfd = memfd_create("gmlake-chunk", MFD_CLOEXEC);
  if (mfd < 0) return GML_ESYS;
  /* A memfd is made mode 0777: anyone handed a read-only fd of it (a share's
   * attacher) could open /proc/self/fd/N again read-write. Only its owner
   * (the daemon, or this process when embedded) may open it anew. */
  if (fchmod(mfd, 0600) != 0) {
    close(mfd);
    return GML_ESYS;
  }
  if (ftruncate(mfd, (off_t)be->chunk_size) != 0) {
    close(mfd);
    return errno == ENOSPC ? GML_ENOMEM : GML_ESYS;
  }
  if (fd) {
    int dup_fd = fcntl(mfd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) {
      close(mfd);
      return GML_ESYS;
    }
    *fd = dup_fd;
  }
  *phys = (gml_phys)mfd;
  return 0;
}

static int host_chunk_import(gml_backend *be, int fd, gml_phys *phys) {
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size != be->chunk_size) {
    close(fd);
    return GML_EPROTO;
  }
  *phys = (gml_phys)fd;
  return 0;
}

/* A chunk is a memfd named gmlake-chunk (its /proc link "/memfd:gmlake-chunk
 * (deleted)": no file in a directory has that path), owned by this uid, of
 * the chunk size, open read-write; its inode number names it (all memfds
 * live on one internal mount). */
static int host_chunk_ident(gml_backend *be, int fd, uint64_t *ident) {
  static const char want[] = "/memfd:gmlake-chunk (deleted)";
  char path[64], link[sizeof want + 1];
  struct stat st;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link);
  int flags = fcntl(fd, F_GETFL);
  if (n != (ssize_t)sizeof want - 1 || memcmp(link, want, sizeof want - 1) || fstat(fd, &st) != 0 ||
      !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (size_t)st.st_size != be->chunk_size || flags < 0 ||
      (flags & O_ACCMODE) != O_RDWR)
    return GML_EPROTO;
  *ident = (uint64_t)st.st_ino;
  return 0;
}

static int host_chunk_same(gml_backend *be, gml_phys phys, int fd) {
  (void)be;
  struct stat a, b;
  return fstat((int)phys, &a) == 0 && fstat(fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int host_chunk_export(gml_backend *be, gml_phys phys, int *fd) {
  (void)be;
  int d = fcntl((int)phys, F_DUPFD_CLOEXEC, 0);
  if (d < 0) return GML_ESYS;
  *fd = d;
  return 0;
}

static void host_chunk_release(gml_backend *be, gml_phys phys) {
  (void)be;
  close((int)phys);
}

static int host_va_reserve(gml_backend *be, size_t size, uintptr_t *va) {
  /* Aligned as cuda_va_reserve aligns (the largest power of two dividing the
   * chunk: 2 MiB for 6 MiB chunks), and for a chunk that is no power of two
   * never chunk-aligned, as the driver may well give: code that takes a
   * range for chunk-aligned breaks here, on the host, not on the GPU only.
   * Over-reserve by two alignments, then trim. */
  size_t cs = be->chunk_size, align = cs & (~cs + 1), extra = 2 * align;
  void *p = mmap(NULL, size + extra, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return GML_ENOMEM;
  uintptr_t start = (uintptr_t)p, end = start + size + extra, aligned = (start + align - 1) / align * align;
  if (align != cs && aligned % cs == 0) aligned += align;
  if (aligned > start) munmap(p, aligned - start);
  if (aligned + size < end) munmap((void *)(aligned + size), end - aligned - size);
  *va = aligned;
  return 0;
}

static void host_va_free(gml_backend *be, uintptr_t va, size_t size) {
  (void)be;
  munmap((void *)va, size);
}

static int host_map(gml_backend *be, uintptr_t va, gml_phys phys) {
  void *p = mmap((void *)va, be->chunk_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, (int)phys, 0);
  if (p == MAP_FAILED && errno == EACCES) /* a read-only fd (a share attached): read-only it is */
    p = mmap((void *)va, be->chunk_size, PROT_READ, MAP_SHARED | MAP_FIXED, (int)phys, 0);
  if (p == MAP_FAILED) {
    GML_ERR("host map at %#lx: %s", (unsigned long)va, strerror(errno));
    return GML_EBACKEND;
  }
  return 0;
}

static int host_set_access(gml_backend *be, uintptr_t va, size_t size, int flags) {
  (void)be;
  /* mapped read-write already (read-only from a read-only fd); only narrowing is asked for */
  if ((flags & GML_ACCESS_READ_ONLY) && mprotect((void *)va, size, PROT_READ) != 0) {
    GML_ERR("host set_access read-only at %#lx: %s", (unsigned long)va, strerror(errno));
    return GML_EBACKEND;
  }
  return 0;
}

static int host_unmap(gml_backend *be, uintptr_t va, size_t size) {
  (void)be;
  /* Replace with a fresh PROT_NONE reservation: the range stays ours. */
  void *p = mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? GML_EBACKEND : 0;
}

static int host_event_record(gml_backend *be, uintptr_t stream, uintptr_t *event) {
  (void)be, (void)stream;
  *event = 0;
  return 0;
}
static int host_event_done(gml_backend *be, uintptr_t event) {
  (void)be, (void)event;
  return 1;
}
static void host_event_destroy(gml_backend *be, uintptr_t event) { (void)be, (void)event; }
static int host_stream_wait_event(gml_backend *be, uintptr_t stream, uintptr_t event) {
  (void)be, (void)stream, (void)event;
  return 0;
}
static int host_protect(gml_backend *be, uintptr_t va, size_t size, int accessible) {
  (void)be;
  return mprotect((void *)va, size, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) ? GML_EBACKEND : 0;
}
static int host_synchronize(gml_backend *be) {
  (void)be;
  return 0;
}
static int host_write(gml_backend *be, uintptr_t va, const void *src, size_t n) {
  (void)be;
  memcpy((void *)va, src, n);
  return 0;
}
static int host_read(gml_backend *be, uintptr_t va, void *dst, size_t n) {
  (void)be;
  memcpy(dst, (const void *)va, n);
  return 0;
}
static int host_mem_info(gml_backend *be, uint64_t *free_bytes, uint64_t *total_bytes) {
  (void)be;
  long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
  *total_bytes = (uint64_t)pages * (uint64_t)ps;
  *free_bytes = (uint64_t)avail * (uint64_t)ps;
  return 0;
}
static void host_destroy(gml_backend *be) { free(be); }

/* What host_alloc gave and is not freed yet: the host backend's "page-locked"
 * memory, so that the copy engine takes the same decisions here as on cuda
 * (straight copies from it, staging for other memory). The process's, as
 * pinned memory is (the tests' backends over this one have their own priv). */
typedef struct host_range {
  uintptr_t start;
  size_t size;
} host_range;
static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;
static host_range *pinned;
static size_t npinned, cap_pinned;

static int host_host_alloc(gml_backend *be, size_t size, void **p) {
  (void)be;
  *p = malloc(size ? size : 1);
  if (!*p) return GML_ENOMEM;
  pthread_mutex_lock(&pinned_lock);
  if (npinned == cap_pinned) {
    host_range *n = realloc(pinned, (cap_pinned * 2 + 16) * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&pinned_lock);
      free(*p);
      return GML_ENOMEM;
    }
    pinned = n, cap_pinned = cap_pinned * 2 + 16;
  }
  pinned[npinned++] = (host_range){(uintptr_t)*p, size ? size : 1};
  pthread_mutex_unlock(&pinned_lock);
  return 0;
}

static void host_host_free(gml_backend *be, void *p) {
  (void)be;
  pthread_mutex_lock(&pinned_lock);
  for (size_t i = 0; i < npinned; i++)
    if (pinned[i].start == (uintptr_t)p) {
      pinned[i] = pinned[--npinned];
      break;
    }
  if (!npinned) free(pinned), pinned = NULL, cap_pinned = 0;
  pthread_mutex_unlock(&pinned_lock);
  free(p);
}

static int host_host_pinned(gml_backend *be, const void *p, size_t n) {
  (void)be;
  uintptr_t a = (uintptr_t)p;
  int in = 0;
  pthread_mutex_lock(&pinned_lock);
  for (size_t i = 0; i < npinned && !in; i++) in = a >= pinned[i].start && a + n <= pinned[i].start + pinned[i].size;
  pthread_mutex_unlock(&pinned_lock);
  return in;
}

static int host_copy_async(gml_backend *be, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) {
  (void)be, (void)stream;
  memmove((void *)dst, (const void *)src, n);
  return 0;
}

static int host_copy_batch(gml_backend *be, uintptr_t *dst, uintptr_t *src, size_t *n, size_t count, uintptr_t stream) {
  for (size_t i = 0; i < count; i++) host_copy_async(be, dst[i], src[i], n[i], stream);
  return 0;
}

static int host_event_wait(gml_backend *be, uintptr_t event) {
  (void)be, (void)event;
  return 0; /* done at once */
}

/* Peers (multi-path copies): the host stands in for a node of HOST_PEERS devices that all reach each
 * other, staging being plain memory and a peer's stream a number no caller's stream is. */
#define HOST_PEERS 2
static int host_peer_count(gml_backend *be) {
  (void)be;
  return HOST_PEERS;
}
static int host_peer_access(gml_backend *be, int peer) {
  (void)be;
  return peer >= 0 && peer < HOST_PEERS;
}
static int host_peer_alloc(gml_backend *be, int peer, size_t size, uintptr_t *va) {
  void *p = NULL;
  if (!host_peer_access(be, peer)) return GML_EINVAL;
  if (posix_memalign(&p, 4096, size ? size : 1)) return GML_ENOMEM;
  *va = (uintptr_t)p;
  return 0;
}
static void host_peer_free(gml_backend *be, int peer, uintptr_t va, size_t size) {
  (void)be, (void)peer, (void)size;
  free((void *)va);
}
static int host_peer_stream(gml_backend *be, int peer, uintptr_t *stream) {
  static unsigned next;
  (void)be;
  *stream = ((uintptr_t)1 << 40) + ((uintptr_t)peer << 20) + __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED);
  return 0;
}
static void host_peer_stream_destroy(gml_backend *be, int peer, uintptr_t stream) {
  (void)be, (void)peer, (void)stream;
}
static int host_peer_copy_async(gml_backend *be, int peer, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) {
  (void)peer;
  return host_copy_async(be, dst, src, n, stream);
}
static int host_peer_event_record(gml_backend *be, int peer, uintptr_t stream, uintptr_t *event) {
  (void)peer;
  return host_event_record(be, stream, event);
}

static const struct gml_backend_ops host_ops = {
    .chunk_create = host_chunk_create,
    .chunk_import = host_chunk_import,
    .chunk_release = host_chunk_release,
    .chunk_export = host_chunk_export,
    .chunk_ident = host_chunk_ident,
    .chunk_same = host_chunk_same,
    .va_reserve = host_va_reserve,
    .va_free = host_va_free,
    .map = host_map,
    .set_access = host_set_access,
    .unmap = host_unmap,
    .event_record = host_event_record,
    .event_done = host_event_done,
    .event_destroy = host_event_destroy,
    .synchronize = host_synchronize,
    .write = host_write,
    .read = host_read,
    .mem_info = host_mem_info,
    .destroy = host_destroy,
    .host_alloc = host_host_alloc,
    .host_free = host_host_free,
    .stream_wait_event = host_stream_wait_event,
    .protect = host_protect,
    .copy_async = host_copy_async,
    .copy_batch = host_copy_batch,
    .host_pinned = host_host_pinned,
    .event_wait = host_event_wait,
    .peer_count = host_peer_count,
    .peer_access = host_peer_access,
    .peer_alloc = host_peer_alloc,
    .peer_free = host_peer_free,
    .peer_stream = host_peer_stream,
    .peer_stream_destroy = host_peer_stream_destroy,
    .peer_copy_async = host_peer_copy_async,
    .peer_event_record = host_peer_event_record,
};

/* Which host device this process's ordinal `device` is: as CUDA maps a
 * visible ordinal to a GPU, CUDA_VISIBLE_DEVICES=3,1 makes ordinal 0 host-3
 * and 1 host-1 (an entry may say host-M too), so the tests of discovery by
 * UUID take the path a GPU's client takes. An entry that names no host
 * device (a GPU's UUID), or none for the ordinal: host-<ordinal>, as before. */
static int host_physical(int device) {
  const char *p = device >= 0 ? gmli_env(GML_ENV_CUDA_VISIBLE_DEVICES) : NULL;
  for (int i = 0; p && i < device; i++)
    if ((p = strchr(p, ','))) p++;
  if (!p) return device;
  char e[32];
  size_t n = strcspn(p, ",");
  snprintf(e, sizeof e, "%.*s", (int)(n < sizeof e ? n : sizeof e - 1), p);
  int m = gmli_device_spec_index(e);
  if (m < 0) m = gmli_host_device_of_name(e);
  return m >= 0 ? m : device;
}

int gmli_backend_host_uuid(int device, const gml_backend_opts *opts, char *uuid, char *msg, size_t msglen) {
  (void)opts, (void)msg, (void)msglen; /* every ordinal is one */
  snprintf(uuid, GML_UUID_MAX, "host-%d", host_physical(device));
  return 0;
}

/* gmlaked --device N or host-N: host-N (the daemon clears CUDA_VISIBLE_DEVICES first). */
int gmli_backend_host_resolve(const char *spec, const gml_backend_opts *opts, int *device, char *msg, size_t msglen) {
  (void)opts;
  int n = gmli_device_spec_index(spec);
  if (n < 0) n = gmli_host_device_of_name(spec);
  if (n < 0) {
    snprintf(msg, msglen, "the host backend's devices are host-N or N (N from 0 to %d), not %s", GML_DEVICE_INDEX_MAX,
             spec);
    return GML_ENODEV;
  }
  *device = n;
  return 0;
}

int gmli_backend_host_open(int device, const gml_backend_opts *opts, gml_backend **out, char *msg, size_t msglen) {
  char uuid[GML_UUID_MAX];
  int rc = gmli_backend_host_uuid(device, opts, uuid, msg,
                                  msglen); /* nothing else to choose: chunk sizes are gmli_backend_open's */
  if (rc) return rc;
  gml_backend *be = calloc(1, sizeof *be);
  if (!be) return GML_ENOMEM;
  be->name = "host";
  be->device = device;
  be->granularity = be->chunk_size = 2 * 1024 * 1024;
  be->guard_granularity = (size_t)sysconf(_SC_PAGESIZE);
  snprintf(be->uuid, sizeof be->uuid, "%s", uuid);
  snprintf(be->model, sizeof be->model, "host memory (memfd)");
  be->ops = &host_ops;
  snprintf(msg, msglen, "host backend (memfd chunks of %zu bytes)", be->chunk_size);
  *out = be;
  return 0;
}
