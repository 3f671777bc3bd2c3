/* alloc.h: the stitching caching allocator (policy). It decides which
 * virtual range serves a request and which physical chunk backs which slot;
 * the mechanism (map/unmap, events) is a gml_backend and chunks come from a
 * gml_chunk_source (the daemon, or the backend directly when embedded).
 *
 * Layout: one large virtual reservation, split into a small-block region
 * (requests < GML_SMALL_LIMIT, packed 512 B apart into shared chunks) and a
 * large-block region. Each region is cut into blocks (address-ordered,
 * coalescing); free blocks sit in best-fit trees keyed (size, address), one
 * per stream. The region is divided into chunk-sized slots; a slot is backed
 * by a physical chunk only while some block needs it. A slot that no live
 * block touches is "idle": its chunk can be unmapped and mapped into another
 * slot that a request needs. That is stitching: a new contiguous range built
 * from chunks freed anywhere, leasing new chunks only when no idle chunk is
 * left. A chunk is mapped in one place at a time, so a stitched range never
 * aliases cached views and nothing is counted twice. */
#ifndef GML_ALLOC_H
#define GML_ALLOC_H
#include "backend.h"
#include "gmlake.h"
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define GML_ALIGN 512
#define GML_SMALL_LIMIT (1u << 20)
#define GML_MAX_STREAMS 32

typedef struct gml_chunk_source {
  void *ctx;
  /* Obtain up to n chunks; returns how many (>0) or a GML_E* code. */
  int (*acquire)(void *ctx, size_t n, gml_phys *phys, uint64_t *ids);
  /* Give chunks back (already unmapped). */
  void (*release)(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids);
} gml_chunk_source;

typedef struct gml_block gml_block;
typedef struct gml_pool {
  gml_stream stream;
  int used;
  gml_block *root; /* treap of free blocks keyed (size, addr) */
  size_t count;
} gml_pool;

typedef struct gml_region {
  uintptr_t base;
  size_t size;
  uint32_t first_slot;
  gml_block *first; /* the block at base: never merged away */
  gml_pool pools[GML_MAX_STREAMS + 1]; /* [0] = any stream (no pending work) */
} gml_region;

typedef struct gml_pchunk {
  gml_phys phys;
  uint64_t id;
  int32_t slot; /* -1: unmapped, in the idle pool */
} gml_pchunk;

typedef struct gml_ptrmap {
  uintptr_t *keys;
  gml_block **vals;
  size_t cap, count;
} gml_ptrmap;

typedef struct gml_allocator {
  pthread_mutex_t lock;
  gml_backend *be;
  gml_chunk_source src;
  size_t cs;           /* chunk size */
  uintptr_t va_base;
  size_t va_size;
  gml_region regions[2]; /* 0 small, 1 large */
  uint32_t nslots;
  int32_t *slot_chunk;   /* index into chunks, -1 if unmapped */
  uint32_t *slot_use;    /* live blocks touching the slot */
  int32_t *idle_prev, *idle_next; /* LRU list of mapped slots with use == 0 */
  int32_t idle_head, idle_tail;
  uint64_t *slot_idle_tick; /* a->tick when the slot went idle */
  uint64_t tick;            /* counts operations */
  /* Fence: events recorded on every stream seen at fence_tick; once all are
   * done, slots idle since before fence_tick are unused by the device and
   * can be unmapped without a full synchronize. */
  uint64_t safe_tick, fence_tick;
  int fence_n;
  uintptr_t fence_ev[GML_MAX_STREAMS];
  size_t idle_count;
  gml_pchunk *chunks;
  size_t nchunks, chunks_cap;
  int32_t *unmapped;     /* stack of chunk indices not mapped anywhere */
  size_t nunmapped;
  gml_ptrmap live;
  gml_block *spare;      /* free list of block structs */
  uint64_t rng;
  int nstreams_seen;
  gml_stream streams_seen[GML_MAX_STREAMS];
  /* numbers */
  uint64_t allocated, peak_allocated, peak_reserved, stitched;
  uint64_t alloc_count, free_count, maps, unmaps, syncs, ooms, chunks_acquired, chunks_released;
  size_t limit_bytes;  /* 0 = none; the most chunk bytes held */
  uint64_t lease_ns[1024]; /* recent calls to src.acquire (a daemon round trip + imports) */
  uint64_t lease_calls;
  char last_error[256];
} gml_allocator;

int gml_alloc_init(gml_allocator *a, gml_backend *be, gml_chunk_source src, size_t va_size);
void gml_alloc_destroy(gml_allocator *a); /* unmaps and releases everything */
int gml_alloc_malloc(gml_allocator *a, size_t size, gml_stream stream, void **ptr);
int gml_alloc_free(gml_allocator *a, void *ptr);
/* Size of a live block (0 if ptr is not one). */
size_t gml_alloc_size_of(gml_allocator *a, void *ptr);
void gml_alloc_stats(gml_allocator *a, gml_stats *st);
/* Unmap idle chunks and give up to max_bytes (0 = all) back to the source. */
size_t gml_alloc_release_idle(gml_allocator *a, size_t max_bytes);
/* Consistency check for tests: 0 when every invariant holds, else a GML_E*
 * code with the broken invariant in a->last_error. */
int gml_alloc_check(gml_allocator *a);
#endif
