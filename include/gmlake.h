/* gmlake.h: the public C API of libgmlake-client.
 *
 * A process opens the lake of one device (through its daemon, or embedded
 * when no daemon runs), allocates and frees device memory with a stream, reads
 * its numbers and closes. Every function returns 0 or a negative GML_E* code;
 * gml_strerror() says what it means and gml_errname() names it. The library
 * exports exactly the functions marked GML_API below (`make test` checks it). */
#ifndef GMLAKE_H
#define GMLAKE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GML_API __attribute__((visibility("default")))
#else
#define GML_API
#endif

/* This header's version; gml_version() gives the library's. */
#define GML_VERSION_MAJOR 0
#define GML_VERSION_MINOR 1
#define GML_VERSION_PATCH 0
#define GML_VERSION ((GML_VERSION_MAJOR << 16) | (GML_VERSION_MINOR << 8) | GML_VERSION_PATCH)

/* Every error, once: (name, code, message). Codes are stable; a new error
 * takes the next free code. Errno detail (which system call, which driver
 * error) goes to the log and to gml_last_error(), never into the code. */
#define GML_ERRNO_MAP(X)                                                                                               \
  X(OK, 0, "success")                                                                                                  \
  X(ENOMEM, -1, "out of memory")                         /* the lake, the quota or the device is full */               \
  X(EDAEMON, -2, "daemon unreachable or gone")           /* or it refused the connection */                            \
  X(EINVAL, -3, "invalid argument")                      /* size 0, unknown option, ... */                             \
  X(EBADPTR, -4, "pointer not allocated by this client") /* or already freed */                                        \
  X(EBACKEND, -5, "physical backend (driver) error")                                                                   \
  X(ENODEV, -6, "backend not available") /* no GPU, no libcuda */                                                      \
  X(EPROTO, -7, "protocol error")        /* malformed or unexpected message */                                         \
  X(EQUOTA, -8, "quota exceeded")        /* this client's quota would be exceeded */                                   \
  X(ESYS, -9, "system call failed")      /* errno is in the log */                                                     \
  X(ECLOSED, -10, "client closed")       /* the handle is closed */                                                    \
  X(EAGAIN, -11, "try again")            /* a non-blocking call would block */                                         \
  X(EEXIST, -12, "a share of that name exists")                                                                        \
  X(ENOENT, -13, "no such share")                         /* no key, or no content with that hash */                   \
  X(EPERM, -14, "not allowed")                            /* a share of another user that does not allow us */         \
  X(EMISMATCH, -15, "content differs")                    /* equal hashes, different bytes: refused */                 \
  X(ESTALE, -16, "checkpoint no longer matches its pool") /* gml_pool_restore: its memory went back */

enum gml_error {
#define GML_ERROR_ENUM(name, code, msg) GML_##name = code,
  GML_ERRNO_MAP(GML_ERROR_ENUM)
#undef GML_ERROR_ENUM
};

typedef struct gml_client gml_client;
typedef uintptr_t gml_stream; /* a CUstream/cudaStream_t; 0 = the default stream */

enum gml_mode { GML_MODE_DAEMON = 1, GML_MODE_EMBEDDED = 2 };

typedef struct gml_open_opts {
  int device;              /* GPU index (default 0) */
  const char *backend;     /* "auto" (default), "cuda" or "host" */
  const char *socket_path; /* NULL: $GMLAKE_SOCKET, else the default for the device */
  int mode;                /* 0: daemon if reachable else embedded; or GML_MODE_* to insist */
  size_t limit_bytes;      /* embedded mode: the most this process may hold (0 = no limit) */
  int guard;               /* 0: as GMLAKE_GUARD says (default off); GML_GUARD_OFF/END/BOTH */
  size_t guard_grain;      /* 0: the finest the backend can guard (host: a page; cuda: a chunk) */
  int borrow;              /* 0: as GMLAKE_BORROW says; 1 on, -1 off (cross-stream borrowing) */
} gml_open_opts;

/* Guard mode: every allocation is placed so that its end (GML_GUARD_END),
 * or its end and the start of the grains it occupies (GML_GUARD_BOTH), abut
 * virtual memory that is never mapped (cuda: a chunk-sized slot) or is
 * protected (host: a page). An access at ptr + round_up(size, 512) or
 * beyond faults: "one element past" a tensor whose size is a multiple of
 * 512 bytes is the guard's first byte; for other sizes the bytes up to the
 * 512-byte alignment PyTorch needs are not caught. */
enum { GML_GUARD_OFF = -1, GML_GUARD_END = 1, GML_GUARD_BOTH = 2 };

/* version is the first member and stays first; new members are only ever
 * appended, so a reader can always tell which library filled the rest. */
typedef struct gml_stats {
  uint32_t version;      /* GML_VERSION of the library that filled it (gml_version()) */
  uint64_t allocated;    /* bytes in live blocks */
  uint64_t reserved;     /* bytes of physical chunks held */
  uint64_t cached;       /* reserved - allocated */
  uint64_t stitched;     /* bytes of live blocks whose chunks came from more than one place */
  uint64_t largest_free; /* largest request servable from what is held */
  uint64_t peak_allocated;
  uint64_t peak_reserved;
  uint64_t alloc_count, free_count;
  uint64_t chunks_leased, chunks_returned; /* over the client's life */
  uint64_t maps, unmaps;                   /* chunk map/unmap operations done (stitching work) */
  uint64_t ooms;
  uint64_t syncs;                      /* device synchronizations stitching needed (a fence was not yet past) */
  uint64_t lease_calls;                /* chunk requests to the daemon (or the driver when embedded) */
  uint64_t lease_p50_ns, lease_p99_ns; /* their latency, recent calls */
  double fragmentation;                /* 1 - allocated/reserved (0 when nothing is reserved) */
  size_t chunk_size;
  int mode;                 /* GML_MODE_* */
  const char *backend;      /* "cuda" or "host" */
  uint64_t access_calls;    /* set-access calls (one per run of newly mapped chunks) */
  uint64_t mapped_allocs;   /* allocations that had to map chunks (the slow path) */
  uint64_t headroom_leased; /* chunks leased beyond need (GMLAKE_HEADROOM), so remaps take fresh chunks */
  uint64_t map_ns;          /* time spent mapping (driver calls, fence waits) */
  uint64_t malloc_ns;       /* time in gml_alloc, all of it (only with GMLAKE_TIMING=1, else 0) */
  /* Growable ranges (gml_growable_*), not counted in the allocator's numbers above: */
  uint64_t growable_ranges;   /* live ranges */
  uint64_t growable_mapped;   /* bytes of chunks mapped into them (physical memory held) */
  uint64_t growable_unmapped; /* bytes reserved for them but not mapped (address space only) */
  /* Pause (gml_pause): */
  uint64_t paused_bytes;  /* bytes of paused blocks (not in allocated; their chunks are back in the lake) */
  uint64_t paused_saved;  /* bytes of their content saved in host memory or a file */
  uint64_t borrows;       /* allocations served by a block freed on another stream */
  uint64_t borrow_waits;  /* of those, the ones that made their stream wait for the other's event */
  uint64_t shared_mapped; /* bytes of shared read-only chunks mapped (gml_share/attach/dedup) */
  /* Where new chunks' time goes (the allocator's and the growable ranges'
   * leases): lease_wait_ns + import_ns is the time in chunk requests; map_ns
   * holds them and the mapping, of which map_call_ns and access_ns: */
  uint64_t lease_wait_ns;   /* waiting for the daemon's lease replies (daemon mode) */
  uint64_t import_ns;       /* importing the chunks they carried (the driver's import) */
  uint64_t map_call_ns;     /* the backend's map calls */
  uint64_t access_ns;       /* the backend's set-access calls */
  uint64_t chunks_streamed; /* chunks that came by streamed leases (one request, many replies) */
  /* Swapping (GMLAKE_SWAP), as the framework layer reported it (gml_swap_note): */
  uint64_t swap_out_bytes;  /* bytes of saved tensors copied to host memory */
  uint64_t swap_in_bytes;   /* bytes copied back */
  uint64_t swap_copy_ns;    /* the copies' time on the device's copy streams */
  uint64_t swap_host_bytes; /* host memory held for it now (a pinned pool kept across iterations) */
  /* Planned placement (GMLAKE_PLAN, gml_step): */
  uint64_t plan_steps;  /* iterations marked (gml_step) */
  uint64_t plan_hits;   /* allocations served at their planned offset (or lent a free part of the range) */
  uint64_t plan_misses; /* allocations a plan existed for that the stitching allocator served (departures) */
  uint64_t plans_taken; /* plans built: the first, and one per new pattern that repeated */
  uint64_t plan_range;  /* bytes of address space held for planned ranges (chunks are counted in reserved) */
} gml_stats;

/* What a GML_E* code means ("out of memory"), and its name ("GML_ENOMEM");
 * "unknown error" / "GML_EUNKNOWN" for a code not in GML_ERRNO_MAP. */
GML_API const char *gml_strerror(int err);
GML_API const char *gml_errname(int err);
/* The library's version, GML_VERSION as it was built (compare with the header's). */
GML_API uint32_t gml_version(void);

/* opts may be NULL. On success *out is a client; on failure a GML_E* code. */
GML_API int gml_open(const gml_open_opts *opts, gml_client **out);
/* A library option for the clients opened from now on, by the name of its
 * environment variable (a GMLAKE_* the library reads: docs/environment.md), in
 * place of the environment's value ("": unset; NULL: the environment's
 * again). How a program configures the library without changing the
 * environment (which its children inherit): the PyTorch layer's
 * gmlake.enable(socket, mode). Before the clients it is meant for, never
 * while a gml_open runs. GML_EINVAL: not an option of the library. */
GML_API int gml_set_option(const char *name, const char *value);
GML_API int gml_close(gml_client *c);
/* An iteration (a training step) ends here. With planned placement on
 * (GMLAKE_PLAN=1) the library records each iteration's allocations between
 * two marks (size, stream, order of allocations and frees); once one repeats
 * an earlier one it plans it (every allocation an offset in one range, blocks
 * whose lifetimes do not overlap sharing memory) and serves later iterations
 * that follow it from the plan: an index lookup, no search, no driver call.
 * What departs from it is served as without a plan. Off: does nothing. 0, or
 * GML_ENOMEM (no memory to record or plan: allocations are served as before).
 * The PyTorch layer calls it after every optimizer step (gmlake.step()). */
GML_API int gml_step(gml_client *c);

GML_API int gml_alloc(gml_client *c, size_t size, gml_stream stream, void **ptr);
GML_API int gml_free(gml_client *c, void *ptr);
GML_API int gml_stats_get(gml_client *c, gml_stats *out);
/* Give every idle cached chunk back (to the daemon, or to the driver when embedded);
 * *released_bytes (released_bytes may be NULL): how many bytes went back. */
GML_API int gml_trim(gml_client *c, size_t *released_bytes);
/* Copy between host memory and memory this client allocated (a plain
 * memcpy on the host backend, cuMemcpy on cuda): for tests and tools. */
GML_API int gml_write(gml_client *c, void *dst, const void *src, size_t n);
GML_API int gml_read(gml_client *c, void *dst, const void *src, size_t n);
/* Send this client's usage numbers to the daemon now (they also go every
 * 100 ms of activity); a no-op when embedded. */
GML_API int gml_flush(gml_client *c);
/* The message of the last error on this client (e.g. the numbers of an OOM):
 * every call on c that fails sets it, naming the call and what was wrong
 * (which argument, which bound). Not cleared by calls that succeed. */
GML_API const char *gml_last_error(gml_client *c);

/* Where an address lies relative to the allocation gml_block_of found. */
enum gml_addr_where {
  GML_AT_INSIDE = 0,      /* within [ptr, ptr + size) */
  GML_AT_SLACK_AFTER = 1, /* past size, within its 512-byte alignment (no guard can be there) */
  GML_AT_GUARD_AFTER = 2, /* in the guard after it */
  GML_AT_BEFORE = 3,      /* before ptr: the grain's slack, or its front guard */
  GML_AT_PAST_END = 4,    /* no guard mode: just past it, in free memory */
};
typedef struct gml_block_info {
  uintptr_t ptr;        /* what gml_alloc returned */
  size_t size;          /* bytes asked for */
  size_t usable;        /* bytes from ptr it may use: size rounded up to 512 */
  uintptr_t start, end; /* the virtual range it occupies, its guards included */
  int64_t offset;       /* the address asked about, minus ptr */
  int where;            /* enum gml_addr_where */
  int guarded;          /* 0, GML_GUARD_END or GML_GUARD_BOTH */
  uint64_t seq;         /* allocation number in this client: 1 = the first */
  uint64_t alloc_ns;    /* when it was allocated (guard mode; CLOCK_REALTIME, ns), else 0 */
  gml_stream stream;
} gml_block_info;
/* The live allocation an address falls in (or just past, or in the guard
 * of): 0, or GML_EBADPTR. Reads only what the allocator recorded, no driver
 * call, so it answers after a CUDA fault killed the context. */
GML_API int gml_block_of(gml_client *c, const void *addr, gml_block_info *info);
/* Up to max live blocks into out (address order); returns how many there
 * are (may exceed max), or a GML_E* code. out may be NULL with max 0. */
GML_API int gml_block_list(gml_client *c, gml_block_info *out, size_t max);

/* Growable ranges: a contiguous virtual range of a fixed maximum size whose
 * chunks are mapped and unmapped at given offsets, so memory grows in place
 * (a KV cache takes physical memory as its sequences grow, and nothing
 * already there moves or is copied). Chunks come from the same source as
 * the allocator's (leased from the daemon, or created by the backend when
 * embedded) and go back to it when unmapped. Offsets and lengths are
 * multiples of the chunk size (gml_growable_info's chunk_size), except in
 * ensure/shrink, which round. Accessing an unmapped part is an error, never
 * silent garbage: SIGSEGV on the host backend; on cuda the kernel fails with
 * CUDA_ERROR_ILLEGAL_ADDRESS (cudaErrorIllegalAddress), which poisons the
 * CUDA context of the process. Unmapping waits for the device to be idle
 * (a synchronize) so no pending kernel still reads a chunk handed back.
 * Thread-safe; a range belongs to the client that created it and is
 * destroyed with it at gml_close at the latest. */
typedef struct gml_growable gml_growable;
typedef struct gml_growable_info {
  void *base;           /* start of the range: it never moves */
  size_t reserved;      /* bytes of address space (max_bytes rounded up to chunks) */
  size_t mapped;        /* bytes mapped (anywhere in the range) */
  size_t mapped_prefix; /* bytes mapped from base on without a hole */
  size_t chunk_size;
} gml_growable_info;

/* Reserve max_bytes (rounded up to the chunk size) of address space; nothing is mapped. */
GML_API int gml_growable_create(gml_client *c, size_t max_bytes, gml_growable **out);
/* Map a chunk over every unmapped chunk of [offset, offset+len): all or
 * nothing (GML_ENOMEM when the lake or the limit cannot give them all). */
GML_API int gml_growable_map(gml_growable *g, size_t offset, size_t len);
/* Unmap the mapped chunks of [offset, offset+len) and give them back. */
GML_API int gml_growable_unmap(gml_growable *g, size_t offset, size_t len);
/* Map [0, bytes rounded up to chunks); what is already mapped stays. */
GML_API int gml_growable_ensure(gml_growable *g, size_t bytes);
/* Unmap every chunk from bytes (rounded up to chunks) to the end. */
GML_API int gml_growable_shrink(gml_growable *g, size_t bytes);
/* 1 when the chunk holding byte offset is mapped, 0 when not, GML_EINVAL past the end. */
GML_API int gml_growable_is_mapped(gml_growable *g, size_t offset);
GML_API int gml_growable_info_get(gml_growable *g, gml_growable_info *out);
/* Unmap everything, give the chunks back and free the address range. */
GML_API int gml_growable_destroy(gml_growable *g);

/* Pause and resume: give this process's memory back to the lake while every
 * pointer stays valid. gml_pause synchronizes the device, copies the content
 * of the live allocations (all of them, or with tag != 0 those allocated
 * while gml_set_tag(c, tag) was in force) to host memory (page-locked on
 * cuda) or, with gml_pause_file, to a file at path (at most 255 bytes; created new, 0600: a path
 * that exists, a symlink too, is GML_ESYS, as another user could have put it
 * there to read the content; removed at
 * resume), and returns their chunks, with all idle cache, to the lake; the
 * virtual ranges stay reserved. gml_resume leases chunks again, maps them at
 * the same addresses and copies the content back. GML_PAUSE_DISCARD saves
 * nothing: the content after resume is undefined (KV caches, activations);
 * with a path or GML_PAUSE_FILE it is GML_EINVAL, gml_last_error naming both.
 * While paused the client goes on: new allocations lease chunks as usual and
 * never land on a paused allocation's addresses; freeing a paused allocation
 * is allowed (it is not restored); the caller must not touch paused memory
 * (on the host backend it is unmapped: SIGSEGV). A second pause before resume
 * is GML_EINVAL, and so is a resume with nothing paused (gml_last_error: "not
 * paused"). A resume the lake cannot serve returns GML_ENOMEM (or
 * GML_EQUOTA) with the rest still paused: call it again. Growable ranges are
 * not paused. gml_stats' paused_bytes/paused_saved, and `gmlakectl clients`,
 * show it. */
#define GML_PAUSE_DISCARD 1u /* do not save content */
#define GML_PAUSE_FILE 2u    /* save it to a file, not host memory: gml_pause_file with a path implies it */
GML_API int gml_set_tag(gml_client *c, uint32_t tag); /* tag of later allocations (0: none) */
GML_API int gml_pause(gml_client *c, unsigned flags, uint32_t tag);
/* As gml_pause, saving to a new file at path (GML_PAUSE_FILE is implied: flags
 * may be 0; GML_PAUSE_DISCARD is GML_EINVAL); a NULL path is gml_pause. */
GML_API int gml_pause_file(gml_client *c, unsigned flags, uint32_t tag, const char *path);
GML_API int gml_resume(gml_client *c);
/* The copy engine: host<->device and device<->device copies at the link's
 * speed, from any host memory. Stream-ordered like cudaMemcpyAsync: the copy
 * runs after the stream's earlier work. A page-locked host side (cuMemAllocHost,
 * cuMemHostRegister, or the host backend's host memory) is copied straight; a
 * pageable one goes through the client's staging pool (GMLAKE_COPY_STAGING,
 * page-locked once, at the first copy that needs it, kept until gml_close),
 * in slots that the engine's threads (GMLAKE_COPY_THREADS) fill or empty
 * while the link moves the slot before: a pageable source is read before
 * gml_copy_async returns, a pageable destination is written when it returns
 * (as the driver does for pageable memory, at its own, slower, speed).
 * A copy that fails returns the error with gml_last_error naming the offset
 * reached: the destination's bytes from there are not written (those before
 * may be), never reported done. kind: GML_COPY_H2D, _D2H or _D2D; n 0 is a
 * no-op; a NULL pointer or another kind is GML_EINVAL. */
enum gml_copy_kind { GML_COPY_H2D = 1, GML_COPY_D2H = 2, GML_COPY_D2D = 3 };
GML_API int gml_copy_async(gml_client *c, void *dst, const void *src, size_t n, int kind, gml_stream stream);
/* gml_copy_async on the default stream, returning once the copy is done. */
GML_API int gml_copy(gml_client *c, void *dst, const void *src, size_t n, int kind);
/* Many copies as one: those with nothing to stage go to the driver in one
 * call where it has one (cuMemcpyBatchAsync, CUDA >= 13, on a stream other
 * than the legacy 0), else one by one; small pageable ones are packed into a
 * staging slot and moved together. Like the driver's batch, the copies of one
 * call are in no order among themselves (overlapping ones are undefined). */
typedef struct gml_copy_desc {
  void *dst;
  const void *src;
  size_t size;
  int kind; /* GML_COPY_* */
} gml_copy_desc;
GML_API int gml_copy_batch_async(gml_client *c, const gml_copy_desc *v, size_t count, gml_stream stream);
/* One path of multi-path copies (GMLAKE_COPY_PATHS): path 0 is the GPU's
 * own link, the others host -> a peer GPU's staging -> P2P -> the GPU. */
#define GML_COPY_PATHS_MAX 8
typedef struct gml_copy_path {
  int device;                  /* the GPU whose host link it crosses (path 0: the client's own) */
  int used;                    /* 1: large copies are split over it (the probe kept it, either way) */
  int failed;                  /* a copy over it failed: its part was redone on the own link; not used since */
  double h2d_gbps, d2h_gbps;   /* GB/s alone, as the probe measured them (host backend: modelled) */
  double h2d_share, d2h_share; /* the part of a split copy it takes (0: not used that way) */
  uint64_t bytes;              /* moved over it in split copies */
} gml_copy_path;
/* What the engine has and has done (since gml_open). */
typedef struct gml_copy_info {
  uint64_t staging_bytes;  /* the staging pool (0: not taken yet, or GMLAKE_COPY_STAGING=0) */
  uint32_t slots;          /* it is cut into */
  uint32_t threads;        /* copying beside the caller */
  int batch;               /* 1: the driver batches copies (GML_BACKEND_COPY_BATCH) */
  uint64_t bytes_direct;   /* copied straight (device or page-locked host side) */
  uint64_t bytes_staged;   /* copied through the staging pool */
  uint64_t driver_copies;  /* copies handed to the driver one by one */
  uint64_t driver_batches; /* driver calls that carried several copies */
  uint64_t batched_copies; /* copies they carried */
  /* multi-path: probed at the first page-locked copy of 64 MiB or more */
  uint32_t npaths;           /* paths probed (0: not yet, or GMLAKE_COPY_PATHS=1; 1: no peer with P2P access) */
  uint32_t paths_used;       /* of them, split over (either way); 1: single path */
  double h2d_gbps, d2h_gbps; /* the used paths together, as measured */
  uint64_t bytes_split;      /* copied over several paths at once */
  gml_copy_path paths[GML_COPY_PATHS_MAX];
} gml_copy_info;
GML_API int gml_copy_info_get(gml_client *c, gml_copy_info *out);
/* Probes the copy paths now, as the first page-locked copy of 64 MiB or
 * more would (once per client; GMLAKE_COPY_PATHS=1: nothing, npaths stays
 * 0): gml_copy_info_get then shows each path's measured bandwidth and share
 * (`gmlakectl paths`). 0, GML_EINVAL (c NULL) or GML_ENOMEM. */
GML_API int gml_copy_probe(gml_client *c);
/* Shared read-only memory (daemon mode only: GML_EDAEMON when embedded).
 * A whole growable range is the unit: gml_share publishes its chunks under
 * a key, gml_attach maps a share into a new range in another process,
 * gml_dedup replaces a range's chunks by published ones with the same bytes.
 * A shared range is read-only in every process that maps it, the publisher
 * included: on the host backend a write is SIGSEGV (attachers get read-only
 * fds, so even mprotect cannot make it writable); on cuda the chunks are
 * mapped with CU_MEM_ACCESS_FLAGS_PROT_READ and a write is an illegal-address
 * fault of the kernel (a same-uid process holding the fd could still map it
 * writable itself: on cuda the protection is against mistakes, not against
 * a hostile process of the same user). map/unmap/ensure/shrink of a shared
 * range are GML_EINVAL; gml_growable_destroy (or gml_close, or the process's
 * exit) detaches. The daemon counts a share's chunks once, keeps them while
 * any process maps them, and frees them after the last one detached or
 * exited (SIGKILL included). Who may attach: the publisher's uid, and the
 * uids it allows (allow_uids, allow_any_uid); others get GML_EPERM. */
typedef struct gml_share_opts {
  const void *hash; /* the caller's hash of the content (gml_dedup finds shares by it), <= 64 bytes */
  size_t hash_len;
  const void *meta; /* opaque bytes given to attachers (e.g. a layout), <= 1024 */
  size_t meta_len;
  const uint32_t *allow_uids; /* uids besides the publisher's that may attach */
  size_t n_allow_uids;
  int allow_any_uid;
} gml_share_opts;
/* Publish [0, size) of g: those chunks must be mapped; chunks past them are
 * unmapped and given back first. g becomes read-only. opts may be NULL.
 * key: 1 to 127 bytes of '!' to '~' (no space or control) and no '@' (NAME@UID
 * names user UID's share NAME); at most 64
 * allow_uids; else GML_EINVAL, gml_last_error saying which.
 * GML_EEXIST: this user has a share of that key (or hash) already. */
GML_API int gml_share(gml_growable *g, size_t size, const char *key, const gml_share_opts *opts);
/* Map the share `key` read-only into a new range (*out; its info's base).
 * Keys are per user: "NAME" is this user's share; "NAME@UID" is user UID's
 * (another user's share is never found by its plain name, so one who
 * published a name first cannot feed another user's attachers).
 * The key is checked here as gml_share's is (NAME@UID: NAME so), else
 * GML_EINVAL, gml_last_error saying what a key is; nothing is sent then.
 * *size: the published size; meta/meta_len (in: capacity, out: length) may be NULL.
 * GML_ENOENT: no such share; GML_EPERM: not allowed. */
GML_API int gml_attach(gml_client *c, const char *key, gml_growable **out, size_t *size, void *meta, size_t *meta_len);
/* Dedup [0, size) of g, whose content hashes to hash (the caller's hash):
 * if a share of the caller's own user with that hash exists (another user's
 * is never taken: its publisher keeps write access to its chunks) and its
 * bytes equal g's (compared, not
 * only the hash), g's chunks are replaced in place by the share's (the base
 * stays; g becomes read-only; its own chunks go back) and *deduped = 1;
 * if none exists, g is published under "dedup-<hex of hash>" (a hash of over
 * 60 bytes: "dedup-b64-<its base64url>", a key holds 127) and *deduped = 0.
 * GML_EMISMATCH: the published content with that hash differs (g unchanged). */
GML_API int gml_dedup(gml_growable *g, size_t size, const void *hash, size_t hash_len, int *deduped);

/* PyTorch CUDAPluggableAllocator entry points (one client per device, thread-safe). */
GML_API void *gmlake_torch_malloc(ssize_t size, int device, void *stream);
GML_API void gmlake_torch_free(void *ptr, ssize_t size, int device, void *stream);
/* Fill *out for that device's client; returns 0, or GML_EINVAL if none is open. */
GML_API int gmlake_torch_stats(int device, gml_stats *out);
/* gml_trim on that device's client: 0, or GML_EINVAL if none is open (the bytes: gml_trim's released_bytes). */
GML_API int gmlake_torch_trim(int device);
/* gml_block_of / gml_block_list on that device's client (python: gmlake.block_of). */
GML_API int gmlake_torch_block_of(int device, uintptr_t addr, gml_block_info *out);
GML_API ssize_t gmlake_torch_block_list(int device, gml_block_info *out, size_t max);

/* ---------- what a framework's allocator layer needs (python/gmlake/_C.cpp) ----------
 * Every function below takes the client's lock; all are safe from several
 * threads. Sizes of allocations are rounded up to 512 bytes. */

/* gml_alloc/gml_free with a caller's tag, kept with the allocation and in
 * its history entries (the torch layer keys its Python stacks by it). */
GML_API int gml_alloc_ex(gml_client *c, size_t size, gml_stream stream, uint64_t tag, void **ptr);
GML_API int gml_free_ex(gml_client *c, void *ptr, uint64_t tag);
/* 1 if ptr lies in this client's virtual range (any client memory does), else 0. */
GML_API int gml_contains(gml_client *c, const void *ptr);
/* Size asked for and size held (rounded) of the live allocation at ptr. */
GML_API int gml_size_of(gml_client *c, const void *ptr, size_t *requested, size_t *size);

/* Counters in PyTorch's DeviceStats notions. current/peak are levels, allocated/freed
 * sums since the last gml_reset_accumulated; peaks restart at the current level
 * with gml_reset_peak. allocated: live allocations; active: live or freed but
 * still in use on a recorded stream (gml_record_stream); reserved/segment: the
 * chunks held; inactive_split: held bytes of partly used chunks that no live
 * block uses (its counts are not tracked); requested: bytes asked for. */
typedef struct gml_stat {
  int64_t current, peak, allocated, freed;
} gml_stat;
typedef struct gml_mem_stats {
  gml_stat allocation, segment, active, inactive_split; /* counts */
  gml_stat allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries;    /* allocations that failed, released cache and tried again */
  int64_t num_ooms;             /* allocations that failed after that */
  int64_t num_sync_all_streams; /* device synchronizations (gml_stats.syncs + waits for recorded streams) */
  int64_t num_device_alloc, num_device_free; /* chunks leased / returned */
  int64_t limit_bytes;                       /* gml_set_limit, 0 = none */
} gml_mem_stats;
GML_API int gml_mem_stats_get(gml_client *c, gml_mem_stats *out);
GML_API int gml_reset_peak(gml_client *c);
GML_API int gml_reset_accumulated(gml_client *c);

/* The most bytes of chunks this process may hold (0 = no limit of its own;
 * the daemon's limits and quotas apply as well). */
GML_API int gml_set_limit(gml_client *c, size_t bytes);
/* Free and total memory of the device, as the backend sees it. */
GML_API int gml_device_memory(gml_client *c, uint64_t *free_bytes, uint64_t *total_bytes);
/* Free and total memory as the lake sees it, for this client (what
 * torch.cuda.mem_get_info answers under gmlake.enable()). *total_bytes: the
 * most it may hold: the least of the device's memory, the lake's limit, the
 * tightest daemon quota covering it (process, user or cgroup) and its own
 * limit (gml_set_limit: PyTorch's memory fraction; embedded: GMLAKE_LIMIT).
 * *free_bytes: what it could allocate now: its cache's free bytes, plus what
 * the lake would lease it without waiting on a process that allocates (free
 * chunks, chunks the limit still lets be made as far as the device has free
 * memory, the idle cache of its user's idle clients), less the chunks other
 * clients' leases still wait for, within quota and limits; at most
 * *total_bytes. Embedded: the cache plus the device's free memory, within
 * the limit. Daemon mode: an answer holds as a promise for up to 2 s: a
 * client of another process asking meanwhile waits (up to that long) until
 * this one has leased (or asks again, or closes), then is told what is left,
 * so processes that size themselves at once do not both count the same
 * memory. A daemon too old to answer: the device's free memory and the
 * cache (as embedded). */
GML_API int gml_mem_info(gml_client *c, size_t *free_bytes, size_t *total_bytes);

/* The live allocation at ptr is also used on `stream` (besides the stream it
 * was allocated on). When it is freed, an event is recorded on each such
 * stream and the memory is reused only once all have passed it. GML_EBADPTR
 * if ptr is not a live allocation. */
GML_API int gml_record_stream(gml_client *c, void *ptr, gml_stream stream);

/* Private pools (CUDA graphs). A pool is named by two numbers (PyTorch's
 * MempoolId_t). Between gml_pool_begin and gml_pool_end, allocations whose
 * stream the filter accepts (filter NULL: every stream) come from the pool: the
 * pool's own free blocks on that stream first, else new memory. Blocks freed
 * while the pool lives stay in the pool, reused only by its allocations; once
 * its use count falls to 0 (gml_pool_release), its free blocks go back to the
 * allocator, and each live one when it is freed. */
typedef struct gml_pool_id {
  uint64_t a, b;
} gml_pool_id;
typedef int (*gml_stream_filter)(void *ctx, gml_stream stream); /* nonzero: allocate in the pool */
GML_API int gml_pool_create(gml_client *c, gml_pool_id id);     /* creates, or adds a use */
GML_API int gml_pool_begin(gml_client *c, gml_pool_id id, gml_stream_filter filter, void *ctx); /* + a use */
GML_API int gml_pool_end(gml_client *c, gml_pool_id id);
GML_API int gml_pool_release(gml_client *c, gml_pool_id id);   /* - a use */
GML_API int gml_pool_use_count(gml_client *c, gml_pool_id id); /* <0: GML_EINVAL, no such pool */
/* The pool's live allocations, up to cap of them into ptrs; *n is how many there are. */
GML_API int gml_pool_live(gml_client *c, gml_pool_id id, void **ptrs, size_t cap, size_t *n);

/* History: a bounded ring of what happened, oldest first. */
enum gml_trace_action {
  GML_TRACE_ALLOC = 0,
  GML_TRACE_FREE_REQUESTED = 1,
  GML_TRACE_FREE_COMPLETED = 2, /* later than the request when recorded streams had to pass it */
  GML_TRACE_SEGMENT_MAP = 3,    /* [addr, addr+size) starts showing chunks (gml_segments) */
  GML_TRACE_SEGMENT_UNMAP = 4,  /* [addr, addr+size) stops showing them */
  GML_TRACE_OOM = 5,            /* size: asked; addr: device free bytes */
};
typedef struct gml_trace_entry {
  uint64_t seq, time_ns, tag;
  int action;
  uintptr_t addr;
  size_t size;
  gml_stream stream;
  gml_pool_id pool;
} gml_trace_entry;
/* Start recording the last `capacity` events (0: stop and forget them). */
GML_API int gml_trace_enable(gml_client *c, size_t capacity);
/* Copy up to cap entries, oldest first, into out; *n is how many were copied. */
GML_API int gml_trace_read(gml_client *c, gml_trace_entry *out, size_t cap, size_t *n);

/* The allocations the client tracks, for snapshots: live ones and those whose
 * free waits for recorded streams, and free blocks held by private pools. */
enum gml_block_state { GML_BLOCK_FREE = 0, GML_BLOCK_ALLOCATED = 1, GML_BLOCK_PENDING_FREE = 2 };
typedef struct gml_alloc_info {
  uintptr_t addr;
  size_t size, requested;
  int state;
  gml_stream stream;
  gml_pool_id pool; /* {0, 0}: none */
  uint64_t tag;
} gml_alloc_info;
/* Up to cap of them into out, sorted by address; *n is how many there are. */
GML_API int gml_allocations(gml_client *c, gml_alloc_info *out, size_t cap, size_t *n);

/* Segments, for snapshots (PyTorch's memory_viz). Each physical chunk the
 * client holds is shown once, at one chunk-sized slot of the virtual range:
 * the slot whose live blocks use it, else (a free chunk) a slot that maps it;
 * a chunk mapped nowhere (leased ahead, or every mapping dropped) is shown
 * nowhere. A segment is a run of adjacent slots that show their chunks (one
 * region: small or large blocks), so the segments' sizes add up to the held
 * memory (gml_mem_stats reserved_bytes) less the chunks mapped nowhere. Its
 * blocks cover it in address order: the tracked allocations of
 * gml_allocations (allocated, free pending, a private pool's free block; one
 * crossing the segment's end is cut there) and free space between them
 * (GML_BLOCK_FREE, pool {0, 0}, requested 0, stream 0). Blocks of paused
 * allocations (gml_pause) lie in no segment and are left out.
 * The history (gml_trace_enable) records where the shown slots change:
 * GML_TRACE_SEGMENT_MAP / _UNMAP of the range (runs of adjacent slots joined),
 * recorded before the allocation that needed them; replayed backwards from
 * these segments they never leave an event's block outside a segment.
 * Up to seg_cap segments into segs and block_cap blocks into blocks; *nsegs
 * and *nblocks are how many there are (larger than the caps: call again with
 * more room). *trace_seq (may be NULL): the seq of the last history entry
 * these segments include; later entries of gml_trace_read happened after. */
typedef struct gml_segment_info {
  uintptr_t addr;
  size_t size;
  int large;      /* in the large-block region (requests of 1 MiB and more) */
  size_t nblocks; /* its blocks: the next nblocks of the block array */
} gml_segment_info;
GML_API int gml_segments(gml_client *c, gml_segment_info *segs, size_t seg_cap, size_t *nsegs, gml_alloc_info *blocks,
                         size_t block_cap, size_t *nblocks, uint64_t *trace_seq);

/* Checkpoints of a pool (PyTorch's cudagraph trees: getCheckpointState /
 * setCheckpointPoolState). gml_pool_checkpoint records which allocations of
 * the pool are live (address, size, size asked, stream, tag); the pool must
 * have a use (GML_EINVAL otherwise, or if there is no such pool).
 * gml_pool_restore makes the pool's live set that of the checkpoint again:
 * every allocation of the pool live now but not in the checkpoint is freed
 * (as gml_free does: its memory stays the pool's; recorded streams delay it),
 * and every one live in the checkpoint but not now is made live again at the
 * same address and size (gml_free frees it as usual afterwards). That works
 * because a pool keeps a freed block whole while it has a use; when that is
 * no longer so for some block (the pool was released and its memory went
 * back, or the address now belongs to something else) it fails with
 * GML_ESTALE, gml_last_error saying which block, and changes nothing. The
 * pointers freed go to freed[] (*nfreed of them), those made live to allocd[]
 * (*nallocd); allocations live in both stay as they are and are in neither.
 * Enough room is the pool's live count (gml_pool_live) and the checkpoint's
 * (gml_pool_checkpoint_blocks): with less, nothing changes, the call returns
 * GML_EINVAL and *nfreed, *nallocd say how many there would be. Not while the
 * pool captures (GML_EINVAL). A checkpoint outlives its pool and is freed
 * with gml_pool_checkpoint_free (NULL: nothing). */
typedef struct gml_pool_ckpt gml_pool_ckpt;
GML_API int gml_pool_checkpoint(gml_client *c, gml_pool_id id, gml_pool_ckpt **out);
/* The checkpoint's live allocations (state GML_BLOCK_ALLOCATED), up to cap into out, by address; *n: all. */
GML_API int gml_pool_checkpoint_blocks(const gml_pool_ckpt *k, gml_alloc_info *out, size_t cap, size_t *n);
GML_API int gml_pool_restore(gml_client *c, const gml_pool_ckpt *k, void **freed, size_t freed_cap, size_t *nfreed,
                             void **allocd, size_t allocd_cap, size_t *nallocd);
GML_API void gml_pool_checkpoint_free(gml_pool_ckpt *k);

/* Sharing an allocation with another process of the same user (what CUDA
 * IPC handles do for cudaMalloc'd memory). The exporting process answers on a
 * socket of its own with the fds of the chunks behind the allocation (only to
 * a peer of its uid); the receiver maps them into a range of its own, and its
 * mapping keeps the memory alive after the exporter frees it or exits. The
 * exporter keeps the allocation live as long as receivers use it (PyTorch
 * does: its CudaIPCSentData). A handle works until the allocation is freed. */
#define GML_IPC_HANDLE_SIZE 64
typedef struct gml_ipc_handle {
  unsigned char bytes[GML_IPC_HANDLE_SIZE];
} gml_ipc_handle;
/* ptr: the start of a live allocation of c. */
GML_API int gml_ipc_export(gml_client *c, void *ptr, gml_ipc_handle *out);
/* The device a handle's memory is on, or GML_EINVAL if it is no handle. */
GML_API int gml_ipc_device(const gml_ipc_handle *h);
/* Map the exported allocation into this process: *ptr and *size (rounded).
 * GML_EPERM: what answers for the exporter runs as another user (the exporter
 * gone, its socket's name taken by another process): nothing is mapped. */
GML_API int gml_ipc_open(gml_client *c, const gml_ipc_handle *h, void **ptr, size_t *size);
/* The same allocation as fds of this process's chunks, for a receiver that
 * takes them itself with pidfd_getfd(2) from this pid: what PyTorch's
 * expandable segments share (the PyTorch layer's handle carries them, so a
 * process using PyTorch's own allocator opens a lake tensor). fds[0..) gets
 * the chunks behind ptr in address order (at most max; *n: how many there
 * are), *offset is ptr's offset in the first, *chunk_size their size (each
 * chunk is one). The library keeps the fds open until the allocation is
 * freed or the client closed (the same ones for every call on ptr): a
 * receiver must fetch them while the sender keeps the allocation, as
 * PyTorch's senders do. Under Yama's ptrace_scope 1 the first call lets this
 * user's processes take them (prctl PR_SET_PTRACER_ANY; said at info level);
 * with scope 2 or 3, another user, or another PID namespace, pidfd_getfd is
 * refused and the receiver must use gml_ipc_open. */
GML_API int gml_ipc_export_fds(gml_client *c, void *ptr, int *fds, size_t max, size_t *n, size_t *offset,
                               size_t *chunk_size);
/* Unmap what gml_ipc_open mapped at ptr. */
GML_API int gml_ipc_close(gml_client *c, void *ptr);

/* Swapping (AutoSwap, issue 29): which tensors saved for backward go to host
 * memory, and when, so that an iteration's peak fits a cap. The framework
 * layer records one iteration as events (each save and each read of a saved
 * tensor, in the order they happened) with, per event, its time on the
 * device and the most bytes allocated since the event before; this plans;
 * the layer carries the plan out in later iterations (python/gmlake/swap.py).
 * A moved tensor's copy out starts when it is saved (a copy stream); its
 * memory counts as gone from the event after the one by whose time the copy
 * is done (gone_at), and as back from the event that starts its copy back
 * (in_at), which is the latest that lets the copy land before the tensor is
 * read, given the bandwidths and the copies queued ahead of it (each
 * direction one queue). Chosen: the fewest bytes that fit the cap. A greedy
 * pass by AutoSwap's priorities (the event that needs the most relief first;
 * a tensor that covers it without overshooting, the largest, the longest
 * idle) gives a first plan and redundant moves are dropped; an exact search
 * (branch and bound: a plan moves at least the largest excess of one event)
 * then proves it the fewest or finds fewer, within max_nodes. */
#define GML_SWAP_NEVER UINT32_MAX /* used_at of a tensor backward never reads */
#define GML_SWAP_DEFAULT_BPS 20e9 /* bandwidth assumed when none is given: pinned PCIe, conservative */
typedef struct gml_swap_tensor {
  uint64_t id;       /* the caller's name for it: its moves carry it */
  uint64_t bytes;    /* device memory it frees when moved */
  uint32_t saved_at; /* the event that saved it (forward) */
  uint32_t used_at;  /* the first event that reads it back (backward), > saved_at; GML_SWAP_NEVER: none */
} gml_swap_tensor;
typedef struct gml_swap_input {
  uint32_t nevents;
  const uint64_t *time_ns; /* per event: device time from the iteration's start, non-decreasing */
  const uint64_t *live;    /* per event: the most bytes allocated from the event before to this one */
  uint32_t ntensors;
  const gml_swap_tensor *tensors;
  uint64_t cap;           /* the most bytes that may be allocated at once */
  double out_bps, in_bps; /* copy bandwidth device to host and back, bytes/s (0: GML_SWAP_DEFAULT_BPS) */
  int64_t max_nodes;      /* the exact search's budget (0: about 0.3 s; < 0: the greedy plan) */
} gml_swap_input;
typedef struct gml_swap_move {
  uint64_t id;
  uint64_t bytes;
  uint32_t tensor;  /* its index in the input */
  uint32_t out_at;  /* copy it out at this event (its save) */
  uint32_t gone_at; /* its memory is counted gone after this event */
  uint32_t in_at;   /* start copying it back at this event (< used_at) */
  uint32_t used_at;
  uint64_t out_ns, in_ns; /* each copy's modelled time */
  uint64_t late_ns;       /* how long after used_at's time its copy back lands by the model (0: hidden) */
} gml_swap_move;
typedef struct gml_swap_plan {
  int feasible; /* peak_after <= cap (else the moves lower the peak as far as they can) */
  int optimal;  /* the search finished: no plan that fits moves fewer bytes */
  uint64_t cap, peak_before, peak_after;
  uint32_t peak_event;  /* where peak_before is */
  uint64_t bytes_moved; /* the moves' bytes (each goes out and comes back) */
  uint64_t late_ns;     /* the moves' late_ns summed: copy time the model cannot hide */
  uint64_t nodes;       /* search nodes visited */
  uint32_t nmoves;
  gml_swap_move *moves; /* by out_at */
} gml_swap_plan;
/* Plans in into *out (gml_swap_plan_free frees it): 0, GML_EINVAL (in
 * inconsistent: an event past nevents, used_at not after saved_at, times
 * going back; gml_last_error is not set, there is no client), GML_ENOMEM.
 * A job that fits moves nothing. */
GML_API int gml_swap_plan_build(const gml_swap_input *in, gml_swap_plan **out);
GML_API void gml_swap_plan_free(gml_swap_plan *p);
/* Whether swapping is on (GMLAKE_SWAP, or gml_set_option's value for it):
 * 1 on, 0 off, GML_EINVAL for a value that is neither. *cap_bytes: the
 * allocated bytes a plan must fit: GMLAKE_SWAP's size or share of the device
 * where it gives one, else c's limit (gml_set_limit: torch's memory fraction;
 * GMLAKE_LIMIT), else the device's memory; less 3% for what the allocator
 * holds beyond its allocations. The daemon's quota and lake limit are not
 * known to a client: give GMLAKE_SWAP the bytes where they are the cap. c may
 * be NULL (whether it is on; *cap_bytes then only a size GMLAKE_SWAP gives). */
GML_API int gml_swap_target(gml_client *c, uint64_t *cap_bytes);
/* What the framework layer copied since its last note: bytes to host and
 * back, the copies' time on the device, and the host memory it holds for
 * swapping now; into
 * gml_stats (swap_*) and the usage report (`gmlakectl clients`: swapped,
 * swap_host). */
GML_API int gml_swap_note(gml_client *c, uint64_t out_bytes, uint64_t in_bytes, uint64_t copy_ns, uint64_t host_bytes);

/* One client per device for a process's framework layer, opened on first use
 * (daemon of that device if one runs, else embedded); NULL on failure (the
 * reason is logged). Never closed: tensors may be freed until the end. */
GML_API gml_client *gml_device_client(int device);
/* That device's client if it is open, else NULL (never opens one). */
GML_API gml_client *gml_device_client_if_open(int device);

#ifdef __cplusplus
}
#endif
#endif
