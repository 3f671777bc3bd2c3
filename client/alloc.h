/* alloc.h: the stitching caching allocator, its interface for client.c
 * and its design. It decides which virtual range serves a request and which
 * physical chunk backs which slot (every such decision: policy.c); the
 * driver calls (map/unmap, events) are a gml_backend's and chunks come from
 * a gml_chunk_source (the daemon, or the backend directly when embedded).
 * Its files: alloc_internal.h says which holds what.
 *
 * Layout: one large virtual reservation, split into a small-block region
 * (requests < GML_SMALL_LIMIT, packed 512 B apart into shared chunks) and a
 * large-block region. Each region is cut into blocks (address-ordered,
 * coalescing); free blocks sit in best-fit trees keyed (size, address), one
 * per stream. The region is divided into chunk-sized slots; a slot is backed
 * by a physical chunk while some live block touches it ("owned" by the
 * slot). When no live block touches a slot any more, its chunk becomes free
 * but stays mapped there, so a block placed on that slot again needs no
 * driver call. A free chunk may also be mapped into other slots that a
 * request needs: that is stitching, a new contiguous range built from chunks
 * freed anywhere, and the old mappings stay too. A chunk is therefore mapped
 * in several places (aliases) but owned by at most one slot at a time, so
 * nothing is counted twice and no two live blocks share memory; a slot whose
 * chunk is owned elsewhere gets remapped only when a block needs it. Repeated
 * layouts (the same step shapes again) find every mapping in place.
 *
 * Placement: always the best fit (smallest free block, then lowest address),
 * whatever its slots map. It depends only on the sizes and order of the
 * requests, so a repeated step lays out exactly as before and finds its
 * chunks where it left them; the conflicts left (a slot whose chunk another
 * slot of the same step holds) are remapped once and then stay settled.
 * Chunks for slots: the one mapped there if free; else a fresh chunk (mapped
 * nowhere, so no other layout loses it), leased while the held bytes stay
 * within the headroom (default 2%, GMLAKE_HEADROOM) of the peak allocated; else, of the
 * free chunks freed longest ago, the one mapped farthest from the slot.
 * (Placement that chased mapped chunks, tried in sessions 2-3, took chunks
 * other layouts needed and never settled.)
 *
 * Streams: a block freed on stream S serves S at once; other streams get it
 * once an event says S has passed the free (harvest). A chunk freed on S is
 * likewise ready for S, for any stream once a fence passed, for a stream
 * made to wait for S; else the device is synchronized. That holds for a
 * block joining a slot another stream's block holds, too. Borrowing (off by
 * default) replaces waiting on the CPU by waits on the device: a chunk freed
 * on S that T needs costs T a wait for S's event instead of a synchronize;
 * when T's best fit would need driver calls and S's pool holds a block of at
 * most borrow_ratio times the request that would not, T waits for S and
 * takes every block S freed so far into its own pool (split as usual); at
 * most borrow_max such waits pending. The client layer (streams.c) adds
 * frees that wait for recorded streams (record_stream): rather than lease
 * more, the block's stream is made to wait for those uses and the block is
 * freed at once.
 *
 * Guard mode (guard.c): every block is whole guard grains (host: a page;
 * cuda: a chunk), its pointer placed so its usable bytes end where a guard
 * begins: a page protected, or a slot never mapped. */
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
#define GML_DEFAULT_HEADROOM_PCT 2.0
#define GML_DEFAULT_BORROW 0         /* off until the GPU measures its time cost (README, cross-stream borrowing) */
#define GML_DEFAULT_BORROW_RATIO 1.5
#define GML_DEFAULT_BORROW_MAX 8
#define GML_BORROW_MAX_CAP 64        /* the most borrows waiting on a lender at once */

/* The allocator's settings. It reads no environment: client.c fills this
 * from the library's options (gml_alloc_config_from_options). */
typedef struct gml_alloc_config {
  double headroom_pct; /* fresh chunks leased past need, % of the peak allocated; 0: none */
  int timing;          /* the caller sums the time of every malloc in malloc_ns */
  int guard;           /* guard mode: 0 off, GML_GUARD_END or GML_GUARD_BOTH (gml_alloc_set_guard) */
  size_t guard_grain;  /* bytes per guard; 0: the finest the backend can make */
  int guard_bt;        /* guard mode: keep each allocation's backtrace for the fault report */
  int borrow;          /* cross-stream borrowing (gml_alloc_set_borrow) */
  double borrow_ratio; /* a stream waits for another for a block of at most this times the request */
  int borrow_max;      /* the most borrows waiting on a lender's event at once */
  int stream_map;      /* map a large lease's chunks as they come (src.acquire_stream), GMLAKE_STREAM_MAP */
} gml_alloc_config;
#define GML_ALLOC_CONFIG_DEFAULT \
  {GML_DEFAULT_HEADROOM_PCT, 0, 0, 0, 0, GML_DEFAULT_BORROW, GML_DEFAULT_BORROW_RATIO, GML_DEFAULT_BORROW_MAX, 0}

#define GML_LEASE_MAX 65536 /* the most chunks the allocator asks its source for in one call */
typedef struct gml_chunk_source {
  void *ctx;
  /* Obtain up to n chunks; returns how many (>0) or a GML_E* code.
   * optional: headroom, not need; take only what is free at once. */
  int (*acquire)(void *ctx, size_t n, int optional, gml_phys *phys, uint64_t *ids);
  /* Give chunks back (already unmapped). */
  void (*release)(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids);
  /* Optional (NULL: none): up to n needed chunks handed to got() batch by
   * batch as they come, the rest still on its way (the caller maps them
   * meanwhile); returns how many in all (>0) or a GML_E* code. */
  int (*acquire_stream)(void *ctx, size_t n, void (*got)(void *arg, const gml_phys *phys, const uint64_t *ids, size_t k),
                        void *arg);
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

/* Free-chunk lists (gml_pchunk.list). */
enum { GML_CL_OWNED = 0, GML_CL_FRESH = 1 /* free, mapped nowhere */, GML_CL_CACHED = 2 /* free, mapped */, GML_CL_DEAD = 3 };
#define GML_STREAM_MIXED ((gml_stream)UINTPTR_MAX)

typedef struct gml_pchunk {
  gml_phys phys;
  uint64_t id;
  int32_t owner;     /* slot whose live blocks use it; -1 when free */
  int32_t maps_head; /* first slot mapping it (-1: none); linked by slot_anext/aprev */
  uint32_t nmaps;
  uint8_t list;      /* GML_CL_* */
  int32_t lprev, lnext;  /* links in its free list (or the dead stack) */
  gml_stream free_stream; /* stream that used it last (GML_STREAM_MIXED: several) */
  uint64_t free_tick;     /* a->tick when it became free */
  /* The slot that stands for it in snapshots (gml_segments), so each held
   * chunk is shown once, at one address: its owner; when free, the slot that
   * stood for it while it still maps it, else another slot mapping it; -1
   * when mapped nowhere. Every change is a segment event (gml_chunk_show). */
  int32_t shown_at;
} gml_pchunk;

typedef struct gml_clist {
  int32_t head, tail;
  size_t count;
} gml_clist;

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
  int32_t *slot_chunk;   /* chunk mapped at the slot, -1 if none */
  uint32_t *slot_use;    /* live blocks touching the slot */
  int32_t *slot_anext, *slot_aprev; /* other slots mapping the same chunk */
  uint64_t *slot_idle_tick; /* a->tick when the slot was last released */
  gml_stream *slot_stream;  /* stream of the blocks touching it (GML_STREAM_MIXED: several) */
  uint64_t tick;            /* counts operations */
  /* Fence: events recorded on every stream seen at fence_tick; once all are
   * done, whatever was released before fence_tick is unused by the device
   * (may be unmapped, or reused from any stream) without a full synchronize. */
  uint64_t safe_tick, fence_tick;
  int fence_n;
  uintptr_t fence_ev[GML_MAX_STREAMS];
  gml_pchunk *chunks;    /* indices stay put; released chunks go on the dead stack */
  size_t chunks_used, chunks_cap, held;
  int32_t dead;
  gml_clist lists[3];    /* [GML_CL_FRESH], [GML_CL_CACHED] (LRU: head freed longest ago) */
  gml_ptrmap live;
  gml_block *spare;      /* free list of block structs */
  uint64_t rng;
  int nstreams_seen;
  gml_stream streams_seen[GML_MAX_STREAMS];
  /* numbers */
  uint64_t allocated, peak_allocated, peak_reserved, stitched;
  uint64_t alloc_count, free_count, maps, unmaps, access_calls, syncs, ooms, chunks_acquired, chunks_released;
  uint64_t mapped_allocs;   /* allocations that mapped a chunk (the slow path) */
  double headroom_pct;      /* config: fresh chunks leased past need, % of peak allocated */
  uint64_t headroom_leased; /* chunks leased as headroom */
  uint64_t headroom_retry_tick; /* no headroom lease before this tick (the source said no) */
  uint64_t map_ns;      /* time in map_slots_slow (driver calls, fence waits) */
  int timing;           /* config: also sum the time of every malloc in malloc_ns */
  uint64_t malloc_ns;
  size_t limit_bytes;  /* 0 = none; the most chunk bytes held */
  uint32_t tag;        /* given to new blocks (gml_set_tag); pause may take only one tag's blocks */
  uint64_t paused_bytes;  /* bytes of paused blocks (pause.c): not in allocated */
  /* A CUDA graph is being captured (gml_pool_begin): no event may be
   * recorded or queried and the device may not be synchronized, so fences
   * and harvests wait, and what would need a wait fails instead. */
  int no_device_waits;
  uint64_t lease_ns[1024]; /* recent calls to src.acquire (a daemon round trip + imports) */
  uint64_t lease_calls;
  /* where the slow path's time goes (gml_stats): the source adds the first
   * two (atomically: the growable ranges lease under their own lock) */
  uint64_t lease_wait_ns;  /* waiting for the daemon's lease replies (not importing) */
  uint64_t import_ns;      /* importing leased chunks (the backend's chunk_import) */
  uint64_t map_call_ns, access_ns; /* of map_ns: the backend's map and set-access calls */
  uint64_t chunks_streamed; /* chunks that came by streamed leases (the source adds them) */
  int stream_map;          /* config: a large lease mapped as it comes (slots.c) */
  /* guard mode (guard.c) */
  int guard;              /* 0 off, GML_GUARD_END or GML_GUARD_BOTH */
  size_t guard_grain;     /* bytes per guard: a page (backend protect) or the chunk (an unmapped slot) */
  int guard_bt;           /* record each allocation's backtrace */
  /* cross-stream borrowing (policy.c decides, slots.c orders the streams) */
  int borrow;             /* take blocks freed on other streams, with a wait if need be */
  double borrow_ratio;    /* a stream waits for another for a block of at most this times the request */
  int borrow_max;         /* the most waits whose lender may not be done, at once */
  int borrow_nev;
  uintptr_t borrow_ev[GML_BORROW_MAX_CAP]; /* their lenders' events */
  uint64_t borrows, borrow_waits;
  /* ordered[i][j]: work enqueued on streams_seen[i] from now on runs after
   * everything streams_seen[j] enqueued up to that tick (a wait put it there) */
  uint64_t ordered[GML_MAX_STREAMS][GML_MAX_STREAMS];
  int any_ordered;
  int no_grow;            /* this malloc fails with GML_EAGAIN rather than lease (gml_alloc_malloc_ex) */
  /* snapshot segment events (gml_chunk_show), while the client's history is
   * on: a slot's address, | 1 when it starts standing for a chunk
   * (segment_map), else it stops (segment_unmap); the client moves them into
   * its history (gml_trace_segments) */
  int seg_log;
  uintptr_t *seg_ev;
  size_t seg_ev_n, seg_ev_cap;
  uint64_t seg_ev_lost; /* no memory to record them: snapshots may not replay */
  char last_error[256];
} gml_allocator;

/* cfg NULL: GML_ALLOC_CONFIG_DEFAULT. */
int gml_alloc_init(gml_allocator *a, gml_backend *be, gml_chunk_source src, size_t va_size, const gml_alloc_config *cfg);
void gml_alloc_destroy(gml_allocator *a); /* unmaps and releases everything */
int gml_alloc_malloc(gml_allocator *a, size_t size, gml_stream stream, void **ptr);
/* With GML_ALLOC_NO_GROW: GML_EAGAIN (nothing changed) where the request
 * would need chunks leased from the source (borrowing, streams.c, first
 * frees memory that waits for other streams, then asks again). */
#define GML_ALLOC_NO_GROW 1
int gml_alloc_malloc_ex(gml_allocator *a, size_t size, gml_stream stream, int flags, void **ptr);
int gml_alloc_free(gml_allocator *a, void *ptr);
/* Size of a live block (0 if ptr is not one). */
size_t gml_alloc_size_of(gml_allocator *a, void *ptr);
void gml_alloc_stats(gml_allocator *a, gml_stats *st);
/* Unmap idle chunks and give up to max_bytes (0 = all) back to the source. */
size_t gml_alloc_release_idle(gml_allocator *a, size_t max_bytes);
/* Give up to max_bytes (0 = all) of free chunks back without waiting for the
 * device: those mapped nowhere, and mapped ones a fence says the streams are
 * done with (reclaim.c; for a thread other than the caller's). *free_left:
 * free chunks still held afterwards (a later call may give more once the
 * fence passes). */
size_t gml_alloc_release_ready(gml_allocator *a, size_t max_bytes, size_t *free_left);
/* The chunks behind the live block at ptr, in address order (at most max):
 * *n of them, the block's offset in the first and its size. */
int gml_alloc_block_phys(gml_allocator *a, void *ptr, gml_phys *phys, size_t max, size_t *n, size_t *offset, size_t *size);
/* Wait for the device once: everything released so far becomes usable
 * from any stream without a wait (before a graph capture). */
int gml_alloc_quiesce(gml_allocator *a);
/* Consistency check for tests: 0 when every invariant holds, else a GML_E*
 * code with the broken invariant in a->last_error. */
int gml_alloc_check(gml_allocator *a);

/* Guard mode (guard.c), before the first allocation: GML_GUARD_END or
 * GML_GUARD_BOTH (anything else: off); grain 0 = the finest the backend can
 * guard, else a multiple of it that divides the chunk size. */
int gml_alloc_set_guard(gml_allocator *a, int mode, size_t grain);
/* Cross-stream borrowing: on/off, the most a block waited for may exceed
 * the request (ratio >= 1), the most waits on a lender pending at once. */
void gml_alloc_set_borrow(gml_allocator *a, int on, double ratio, int max_waits);
/* gml_block_of / gml_block_list (gmlake.h) on the allocator (guard.c). */
int gml_alloc_block_of(gml_allocator *a, uintptr_t addr, gml_block_info *info);
int gml_alloc_block_list(gml_allocator *a, gml_block_info *out, size_t max);
/* For the fault handler: is addr in this allocator's virtual range; and
 * block_of without blocking on the lock (a crash path), with the block's
 * allocation backtrace if one was recorded (bt: GML_GUARD_BT entries). */
static inline int gml_alloc_owns(const gml_allocator *a, uintptr_t addr) {
  return addr >= a->va_base && addr - a->va_base < a->va_size;
}
int gml_alloc_block_of_crash(gml_allocator *a, uintptr_t addr, gml_block_info *info, void **bt, int *nbt);
/* The settings from the library's options (common/options.h: GMLAKE_HEADROOM,
 * a percentage, 0 turns it off, anything else warns and keeps the default;
 * GMLAKE_TIMING). Defined in client.c: the environment is read once, at
 * gml_open, never inside the allocator. */
struct gml_options;
void gml_alloc_config_from_options(const struct gml_options *opt, gml_alloc_config *cfg);
#endif
