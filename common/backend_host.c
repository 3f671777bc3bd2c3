/* backend_host.c: the host backend. A chunk is a memfd, a virtual range is a
 * PROT_NONE reservation, and mapping is mmap(MAP_FIXED|MAP_SHARED) of the
 * memfd into it: real virtual-memory stitching, shared across processes by
 * passing the fd. There is no asynchronous work, so events are done at once. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "backend.h"
#include "gmlake.h"
#include "log.h"
#include <errno.h>
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

static void host_chunk_release(gml_backend *be, gml_phys phys) {
  (void)be;
  close((int)phys);
}

static int host_va_reserve(gml_backend *be, size_t size, uintptr_t *va) {
  /* Over-reserve by one chunk, then trim, to get a chunk-aligned start. */
  size_t cs = be->chunk_size;
  void *p = mmap(NULL, size + cs, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return GML_ENOMEM;
  uintptr_t start = (uintptr_t)p, aligned = (start + cs - 1) / cs * cs;
  if (aligned > start) munmap(p, aligned - start);
  if (aligned + size < start + size + cs) munmap((void *)(aligned + size), start + size + cs - aligned - size);
  *va = aligned;
  return 0;
}

static void host_va_free(gml_backend *be, uintptr_t va, size_t size) {
  (void)be;
  munmap((void *)va, size);
}

static int host_map(gml_backend *be, uintptr_t va, gml_phys phys) {
  void *p = mmap((void *)va, be->chunk_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, (int)phys, 0);
  if (p == MAP_FAILED) {
    GML_ERR("host map at %#lx: %s", (unsigned long)va, strerror(errno));
    return GML_EBACKEND;
  }
  return 0;
}

static int host_set_access(gml_backend *be, uintptr_t va, size_t size) {
  (void)be, (void)va, (void)size;
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

static int host_host_alloc(gml_backend *be, size_t size, void **p) {
  (void)be;
  *p = malloc(size ? size : 1);
  return *p ? 0 : GML_ENOMEM;
}

static void host_host_free(gml_backend *be, void *p) {
  (void)be;
  free(p);
}

static const struct gml_backend_ops host_ops = {
    .chunk_create = host_chunk_create, .chunk_import = host_chunk_import, .chunk_release = host_chunk_release,
    .va_reserve = host_va_reserve,     .va_free = host_va_free,           .map = host_map,
    .set_access = host_set_access,     .unmap = host_unmap,               .event_record = host_event_record,
    .event_done = host_event_done,     .event_destroy = host_event_destroy, .synchronize = host_synchronize,
    .write = host_write,               .read = host_read,                 .mem_info = host_mem_info,
    .destroy = host_destroy,           .host_alloc = host_host_alloc,     .host_free = host_host_free,
};

int gml_backend_host_open(int device, const gml_backend_opts *opts, gml_backend **out, char *msg, size_t msglen) {
  (void)opts; /* nothing to choose: chunk sizes are applied by gml_backend_open */
  gml_backend *be = calloc(1, sizeof *be);
  if (!be) return GML_ENOMEM;
  be->name = "host";
  be->device = device;
  be->granularity = be->chunk_size = 2 * 1024 * 1024;
  be->ops = &host_ops;
  snprintf(msg, msglen, "host backend (memfd chunks of %zu bytes)", be->chunk_size);
  *out = be;
  return 0;
}
