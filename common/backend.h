/* backend.h: the physical memory layer. One small interface, two
 * implementations (cuda: CUDA VMM; host: memfd + mmap), chosen at run time
 * by name from the table in backend.c, each declaring what it can do in its
 * capabilities: a caller asks for a capability, never for a backend by name.
 * Everything above it (lake, allocator) is policy and never calls the driver. */
#ifndef GML_BACKEND_H
#define GML_BACKEND_H
#include <stddef.h>
#include <stdint.h>

typedef uint64_t gml_phys; /* host: the chunk's memfd; cuda: CUmemGenericAllocationHandle */
typedef struct gml_backend gml_backend;

struct gml_backend_ops {
  /* Create one chunk of chunk_size bytes and export it: *fd is a shareable
   * handle the caller owns (close it when done), independent of *phys. */
  int (*chunk_create)(gml_backend *be, gml_phys *phys, int *fd); /* fd NULL: no export */
  /* Import a chunk from a shareable fd; takes ownership of fd. */
  int (*chunk_import)(gml_backend *be, int fd, gml_phys *phys);
  void (*chunk_release)(gml_backend *be, gml_phys phys);
  /* A new shareable fd of a chunk this process holds (created or imported):
   * how another process gets it (gml_ipc_export; a restarted daemon adopting it). The caller closes it. */
  int (*chunk_export)(gml_backend *be, gml_phys phys, int *fd);
  /* Whether fd is a chunk a process of this uid made with this backend
   * (GML_EPROTO if not: another file, read-only, another size), and a key
   * equal for every fd of the same chunk. The daemon asks it of the fds a
   * client hands over after a restart. NULL: the backend cannot tell (cuda). */
  int (*chunk_ident)(gml_backend *be, int fd, uint64_t *ident);
  /* Whether fd (any access mode) is the same chunk as phys, held here: 1
   * yes, 0 no. NULL: the backend cannot tell (cuda). */
  int (*chunk_same)(gml_backend *be, gml_phys phys, int fd);
  /* Reserve/free a virtual range (size a multiple of chunk_size), aligned to
   * the largest power of two dividing chunk_size, not to chunk_size (the
   * driver takes only powers of two): 6 MiB chunks start on 2 MiB. The host
   * backend never returns a chunk-aligned range for such a chunk, so nothing
   * may count on one. */
  int (*va_reserve)(gml_backend *be, size_t size, uintptr_t *va);
  void (*va_free)(gml_backend *be, uintptr_t va, size_t size);
  /* Map one chunk at va; set_access makes a mapped range usable (batched:
   * it is the expensive step on cuda), readable and writable, or only
   * readable with GML_ACCESS_READ_ONLY (cuda: CU_MEM_ACCESS_FLAGS_PROT_READ;
   * host: PROT_READ; a chunk imported from a read-only fd maps read-only
   * whatever is asked); unmap leaves the range reserved. */
  int (*map)(gml_backend *be, uintptr_t va, gml_phys phys);
  int (*set_access)(gml_backend *be, uintptr_t va, size_t size, int flags);
  int (*unmap)(gml_backend *be, uintptr_t va, size_t size);
  /* Stream ordering: an event recorded on a stream is done once the stream
   * has passed it. Host: no asynchronous work, events are done at once. */
  int (*event_record)(gml_backend *be, uintptr_t stream, uintptr_t *event);
  int (*event_done)(gml_backend *be, uintptr_t event); /* 1 done, 0 not yet, <0 error */
  void (*event_destroy)(gml_backend *be, uintptr_t event);
  /* Order `stream`'s later work after `event` (recorded on another stream)
   * without waiting on the host: cross-stream borrowing. Host: a no-op, its
   * events are done at once (the tests' fake events: recorded). */
  int (*stream_wait_event)(gml_backend *be, uintptr_t stream, uintptr_t event);
  /* Guard mode: make [va, va + size) of a mapped range inaccessible
   * (accessible = 0) or usable again; va and size are multiples of
   * guard_granularity. NULL where only whole chunks can be guarded (cuda):
   * a guard is then a slot that no chunk is mapped into. */
  int (*protect)(gml_backend *be, uintptr_t va, size_t size, int accessible);
  int (*synchronize)(gml_backend *be); /* wait for all work on the device */
  /* Copy between host memory and mapped device memory (tests, replay). */
  int (*write)(gml_backend *be, uintptr_t va, const void *src, size_t n);
  int (*read)(gml_backend *be, uintptr_t va, void *dst, size_t n);
  int (*mem_info)(gml_backend *be, uint64_t *free_bytes, uint64_t *total_bytes);
  void (*destroy)(gml_backend *be);
  /* Host memory that read/write copy to and from fast (pause's saved
   * content): page-locked on cuda (cuMemAllocHost), plain on host. */
  int (*host_alloc)(gml_backend *be, size_t size, void **p);
  void (*host_free)(gml_backend *be, void *p);
  /* The transfer engine's (client/copy.c). copy_async: n bytes from src to
   * dst, enqueued on stream after its work; either may be host memory or
   * device memory this process maps (cuda: cuMemcpyAsync under unified
   * addressing; a pageable host side makes it synchronous, which is why the
   * engine stages those). Host: memcpy, done at return. */
  int (*copy_async)(gml_backend *be, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream);
  /* count copies in one driver call, their sources read in stream order:
   * only where be->caps has GML_BACKEND_COPY_BATCH (cuda:
   * cuMemcpyBatchAsync_v2, CUDA >= 13; never on the legacy stream 0). */
  int (*copy_batch)(gml_backend *be, uintptr_t *dst, uintptr_t *src, size_t *n, size_t count, uintptr_t stream);
  /* 1 when [p, p + n) is page-locked host memory (a copy from or to it runs
   * at the link's speed), 0 when not (pageable, or not host memory). Host:
   * what host_alloc gave. */
  int (*host_pinned)(gml_backend *be, const void *p, size_t n);
  /* Wait on the host until event is done (cuEventSynchronize). */
  int (*event_wait)(gml_backend *be, uintptr_t event);
  /* Multi-path copies (client/mpath.c): only where be->caps has
   * GML_BACKEND_PEER_COPY. peer_count: the devices this process sees (this
   * one included; 1: no peer). peer_access: 1 when device `peer` and this
   * one reach each other's memory (P2P over NVLink or PCIe), 0 when not.
   * peer_alloc: size bytes (a multiple of granularity) of `peer`'s memory,
   * mapped readable and writable from both devices (cuda: cuMemCreate on
   * the peer, cuMemSetAccess for both); peer == be->device: this device's.
   * peer_stream: a stream of `peer`'s own (its copies ride its link and copy
   * engines; stream_wait_event and the events work across devices);
   * peer_copy_async / peer_event_record: copy_async / event_record on such
   * a stream (cuda: under the peer's context). Host: plain memory, memmove. */
  int (*peer_count)(gml_backend *be);
  int (*peer_access)(gml_backend *be, int peer);
  int (*peer_alloc)(gml_backend *be, int peer, size_t size, uintptr_t *va);
  void (*peer_free)(gml_backend *be, int peer, uintptr_t va, size_t size);
  int (*peer_stream)(gml_backend *be, int peer, uintptr_t *stream);
  void (*peer_stream_destroy)(gml_backend *be, int peer, uintptr_t stream);
  int (*peer_copy_async)(gml_backend *be, int peer, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream);
  int (*peer_event_record)(gml_backend *be, int peer, uintptr_t stream, uintptr_t *event);
};

#define GML_ACCESS_READ_ONLY 1 /* set_access flag */

/* Capabilities (gml_backend.caps, from the backend's line in backend.c's
 * table): properties a caller tests where what it may do depends on the
 * memory under it, so that a new backend needs no caller changed. */
enum {
  /* The device's own memory: what a framework hands its kernels. A
   * framework's default client refuses a backend without it (PyTorch would
   * take host memory for device memory) unless the user named that backend. */
  GML_BACKEND_DEVICE_MEMORY = 1u << 0,
  /* A stray access to a guard (an unmapped or protected address) raises
   * SIGSEGV in the process, so guard mode's handler can report it (a cuda
   * kernel's fault raises no signal). */
  GML_BACKEND_FAULT_SIGNALS = 1u << 1,
  /* A chunk's fd is a file that reopens read-only through /proc/self/fd:
   * a share's attachers get fds that cannot map it writable, read-only
   * enforced and not only asked for in set_access. */
  GML_BACKEND_REOPEN_READ_ONLY = 1u << 2,
  /* A stream is the driver's handle: a made-up stream number (a trace's)
   * must never reach it. */
  GML_BACKEND_DRIVER_STREAMS = 1u << 3,
  /* resolve names a device without loading a driver, so a daemon's
   * --check-config can check --device. */
  GML_BACKEND_RESOLVES_OFFLINE = 1u << 4,
  /* ops->copy_batch works: many copies in one driver call. Set by the
   * backend at open where its driver has the call (cuda: CUDA >= 13), kept
   * beside its entry's. */
  GML_BACKEND_COPY_BATCH = 1u << 5,
  /* The peer_* ops work: a copy can cross a peer GPU's link and a P2P hop
   * (client/mpath.c). */
  GML_BACKEND_PEER_COPY = 1u << 6,
  /* A copy takes the link's time, so timing copies measures the links
   * (cuda); without it (host: memmove) the multi-path probe models them. */
  GML_BACKEND_COPY_TIMING = 1u << 7,
};

struct gml_backend {
  const char *name; /* "cuda" or "host": for messages and the hello, never for a decision (caps) */
  unsigned caps;    /* GML_BACKEND_* capabilities */
  int device;
  size_t granularity;       /* the smallest chunk the device allows: 2 MiB on the H100 */
  size_t chunk_size;        /* the chunk this backend creates and maps: a multiple of granularity */
  size_t guard_granularity; /* the finest guard ops->protect can make (host: a page); 0: a whole chunk */
  char uuid[48];  /* the device's UUID (cuda: "GPU-xxxxxxxx-xxxx-..."; host: "host-N"): its name (gpuname.h) */
  char model[96]; /* what the device is, for people (cuda: the driver's "NVIDIA H100 80GB HBM3"; "" if unknown) */
  const struct gml_backend_ops *ops;
  void *priv;
};

/* The cuda backend's chunk unless GMLAKE_CHUNK_SIZE says otherwise. */
#define GML_CUDA_DEFAULT_CHUNK (6u << 20)

/* What the caller's options (options.h: GMLAKE_CHUNK_SIZE, GMLAKE_LIBCUDA)
 * say to the backends; NULL opts or members keep the defaults. */
typedef struct gml_backend_opts {
  const char *chunk_size; /* another chunk than the backend's default (a size) */
  const char *libcuda;    /* the CUDA driver library to dlopen (libcuda.so.1) */
} gml_backend_opts;

/* How a backend opens, and names a device without opening it (gpuname.h
 * says which name means what). resolve: the device a daemon's --device names
 * (an index; a UUID or PCI bus id of a GPU; host: N or host-N), as the index
 * to open, or GML_ENODEV with why in msg. uuid: the UUID of this process's
 * device `device` (an ordinal as CUDA_VISIBLE_DEVICES leaves them), into uuid
 * (GML_UUID_MAX bytes). */
typedef int (*gml_backend_open_fn)(int device, const gml_backend_opts *opts, gml_backend **out, char *msg,
                                   size_t msglen);
typedef int (*gml_backend_resolve_fn)(const char *spec, const gml_backend_opts *opts, int *device, char *msg,
                                      size_t msglen);
typedef int (*gml_backend_uuid_fn)(int device, const gml_backend_opts *opts, char *uuid, char *msg, size_t msglen);

/* One backend: a line of backend.c's table (a new backend is its file and
 * that line), or one registered. */
typedef struct gml_backend_entry {
  const char *name;
  gml_backend_open_fn open;
  const char *skipped;       /* what auto says when it passes over it */
  const char *default_limit; /* a daemon's limit on it when none is configured */
  gml_backend_resolve_fn resolve;
  gml_backend_uuid_fn uuid;
  unsigned caps; /* GML_BACKEND_*: every backend it opens has them */
} gml_backend_entry;

/* The backend called name (never "auto"), NULL when there is none. */
const gml_backend_entry *gmli_backend_find(const char *name);
/* The seam for backends outside the table (the tests' dummy and costed
 * ones): e is copied, after the table's backends, or in place of the one of
 * its name. Before any backend opens, from one thread; GML_ENOMEM when 8
 * are registered, GML_EINVAL without a name or open function. */
int gmli_backend_register(const gml_backend_entry *e);
/* Capabilities of the backend called name (0: none known). For a caller
 * that has the name only (gml_stats.backend), not the backend. */
unsigned gmli_backend_caps_named(const char *name);

/* name: "auto" or a backend of the table. auto takes the first of the table
 * that opens (cuda when a GPU is usable, else host) and says which. Asking
 * for cuda without one is GML_ENODEV with the reason in msg. The backend
 * gets its entry's capabilities. */
int gmli_backend_open(const char *name, int device, const gml_backend_opts *opts, gml_backend **out, char *msg,
                      size_t msglen);
/* The device spec names under backend name; auto: the first backend of the
 * table that has it, in *picked (named: name itself), with msg saying why the
 * ones before did not ("" when there were none). gmlaked opens *picked. */
int gmli_backend_resolve(const char *name, const char *spec, const gml_backend_opts *opts, const char **picked,
                         int *device, char *msg, size_t msglen);
/* This process's device `device` under backend name (auto: the first that
 * has it): its UUID into uuid (GML_UUID_MAX bytes); GML_ENODEV when none has
 * it (uuid ""). What the client dials and says in its hello. */
int gmli_backend_device_uuid(const char *name, int device, const gml_backend_opts *opts, char *uuid);
/* 1 when name is "auto" or a backend of the table. */
int gmli_backend_known(const char *name);
/* "auto, cuda, host": for usage and error messages. */
const char *gmli_backend_names(void);
/* The limit a daemon on this backend applies when none is configured
 * ("90%" of the device for cuda, "50%" of RAM for host). */
const char *gmli_backend_default_limit(const gml_backend *be);
/* Use chunks of cs bytes (before any is created): GML_EINVAL unless cs is a
 * multiple of the granularity (at most 1 GiB). */
int gmli_backend_set_chunk_size(gml_backend *be, uint64_t cs);
void gmli_backend_close(gml_backend *be);

/* The finest guard this backend can make: guard_granularity, else a chunk. */
static inline size_t gmli_backend_guard_grain(const gml_backend *be) {
  return be->ops->protect && be->guard_granularity ? be->guard_granularity : be->chunk_size;
}

#endif
