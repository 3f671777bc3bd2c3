/* blocks.h: the allocator's state, below everything that reads or changes
 * it: its types (the allocator, blocks, stream pools, regions, chunks and
 * their free lists, the pointer map), the readers of its layout and of a
 * chunk's readiness (static inline: they sit on the fast path), and the
 * bookkeeping blocks.c does on it (block structs, best-fit treaps, pools,
 * the pointer map, the free-chunk lists). No driver call and no decision
 * here: policy.h reads this state and answers with plans, alloc.c and
 * slots.c carry them out. Functions shared between files are gml_-prefixed
 * and hidden, so they never clash with, or get interposed by, a symbol of
 * the program. */
#ifndef GML_BLOCKS_H
#define GML_BLOCKS_H
#include "backend.h"
#include "gmlake.h"
#include "plan.h"
#include "util.h"
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define GML_HIDDEN __attribute__((visibility("hidden")))

#define GML_ALIGN 512
#define GML_SMALL_LIMIT (1u << 20)
#define GML_MAX_STREAMS 32
#define GML_BORROW_MAX_CAP 64 /* the most borrows waiting on a lender at once */

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
  int (*acquire_stream)(void *ctx, size_t n,
                        void (*got)(void *arg, const gml_phys *phys, const uint64_t *ids, size_t k), void *arg);
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
  gml_block *first;                    /* the block at base: never merged away */
  gml_pool pools[GML_MAX_STREAMS + 1]; /* [0] = any stream (no pending work) */
} gml_region;

/* Free-chunk lists (gml_pchunk.list). */
enum {
  GML_CL_OWNED = 0,
  GML_CL_FRESH = 1 /* free, mapped nowhere */,
  GML_CL_CACHED = 2 /* free, mapped */,
  GML_CL_DEAD = 3
};
#define GML_STREAM_MIXED ((gml_stream)UINTPTR_MAX)

typedef struct gml_pchunk {
  gml_phys phys;
  uint64_t id;
  int32_t owner;     /* slot whose live blocks use it; -1 when free */
  int32_t maps_head; /* first slot mapping it (-1: none); linked by slot_anext/aprev */
  uint32_t nmaps;
  uint8_t list;           /* GML_CL_* */
  int32_t lprev, lnext;   /* links in its free list (or the dead stack) */
  gml_stream free_stream; /* stream that used it last (GML_STREAM_MIXED: several) */
  uint64_t free_tick;     /* a->tick when it became free */
  /* The slot that stands for it in snapshots (gml_segments), so each held
   * chunk is shown once, at one address: its owner; when free, the slot that
   * stood for it while it still maps it, else another slot mapping it; -1
   * when mapped nowhere. Every change is a segment event (gmli_chunk_show). */
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
  size_t cs; /* chunk size */
  uintptr_t va_base;
  size_t va_size;
  gml_region regions[2]; /* 0 small, 1 large */
  uint32_t nslots;
  int32_t *slot_chunk;              /* chunk mapped at the slot, -1 if none */
  uint32_t *slot_use;               /* live blocks touching the slot */
  int32_t *slot_anext, *slot_aprev; /* other slots mapping the same chunk */
  uint64_t *slot_idle_tick;         /* a->tick when the slot was last released */
  gml_stream *slot_stream;          /* stream of the blocks touching it (GML_STREAM_MIXED: several) */
  uint64_t tick;                    /* counts operations */
  /* Fence: events recorded on every stream seen at fence_tick; once all are
   * done, whatever was released before fence_tick is unused by the device
   * (may be unmapped, or reused from any stream) without a full synchronize. */
  uint64_t safe_tick, fence_tick;
  int fence_n;
  uintptr_t fence_ev[GML_MAX_STREAMS];
  gml_pchunk *chunks; /* indices stay put; released chunks go on the dead stack */
  size_t chunks_used, chunks_cap, held;
  int32_t dead;
  gml_clist lists[3]; /* [GML_CL_FRESH], [GML_CL_CACHED] (LRU: head freed longest ago) */
  gml_ptrmap live;
  gml_block *spare; /* free list of block structs */
  uint64_t rng;
  int nstreams_seen;
  gml_stream streams_seen[GML_MAX_STREAMS];
  /* numbers */
  uint64_t allocated, peak_allocated, peak_reserved, stitched;
  uint64_t alloc_count, free_count, maps, unmaps, access_calls, syncs, ooms, chunks_acquired, chunks_released;
  uint64_t mapped_allocs;       /* allocations that mapped a chunk (the slow path) */
  double headroom_pct;          /* config: fresh chunks leased past need, % of peak allocated */
  uint64_t headroom_leased;     /* chunks leased as headroom */
  uint64_t headroom_retry_tick; /* no headroom lease before this tick (the source said no) */
  uint64_t map_ns;              /* time in map_slots_slow (driver calls, fence waits) */
  int timing;                   /* config: also sum the time of every malloc in malloc_ns */
  uint64_t malloc_ns;
  size_t limit_bytes;    /* 0 = none; the most chunk bytes held */
  uint32_t tag;          /* given to new blocks (gml_set_tag); pause may take only one tag's blocks */
  uint64_t paused_bytes; /* bytes of paused blocks (pause.c): not in allocated */
  /* A CUDA graph is being captured (gml_pool_begin): no event may be
   * recorded or queried and the device may not be synchronized, so fences
   * and harvests wait, and what would need a wait fails instead. */
  int no_device_waits;
  uint64_t lease_ns[1024]; /* recent calls to src.acquire (a daemon round trip + imports) */
  uint64_t lease_calls;
  /* where the slow path's time goes (gml_stats): the source adds the first
   * two (atomically: the growable ranges lease under their own lock) */
  uint64_t lease_wait_ns;          /* waiting for the daemon's lease replies (not importing) */
  uint64_t import_ns;              /* importing leased chunks (the backend's chunk_import) */
  uint64_t map_call_ns, access_ns; /* of map_ns: the backend's map and set-access calls */
  uint64_t chunks_streamed;        /* chunks that came by streamed leases (the source adds them) */
  int stream_map;                  /* config: a large lease mapped as it comes (slots.c) */
  /* guard mode (guard.c) */
  int guard;          /* 0 off, GML_GUARD_END or GML_GUARD_BOTH */
  size_t guard_grain; /* bytes per guard: a page (backend protect) or the chunk (an unmapped slot) */
  int guard_bt;       /* record each allocation's backtrace */
  /* cross-stream borrowing (policy.c decides, slots.c orders the streams) */
  int borrow;          /* take blocks freed on other streams, with a wait if need be */
  double borrow_ratio; /* a stream waits for another for a block of at most this times the request */
  int borrow_max;      /* the most waits whose lender may not be done, at once */
  int borrow_nev;
  uintptr_t borrow_ev[GML_BORROW_MAX_CAP]; /* their lenders' events */
  uint64_t borrows, borrow_waits;
  /* ordered[i][j]: work enqueued on streams_seen[i] from now on runs after
   * everything streams_seen[j] enqueued up to that tick (a wait put it there) */
  uint64_t ordered[GML_MAX_STREAMS][GML_MAX_STREAMS];
  int any_ordered;
  int no_grow; /* this malloc fails with GML_EAGAIN rather than lease (gmli_alloc_malloc_ex) */
  /* snapshot segment events (gmli_chunk_show), while the client's history is
   * on: a slot's address, | 1 when it starts standing for a chunk
   * (segment_map), else it stops (segment_unmap); the client moves them into
   * its history (gmli_trace_segments) */
  int seg_log;
  uintptr_t *seg_ev;
  size_t seg_ev_n, seg_ev_cap;
  uint64_t seg_ev_lost;      /* no memory to record them: snapshots may not replay */
  struct gmli_planned *plan; /* planned placement (planned.h); NULL: off (GMLAKE_PLAN) */
  char last_error[256];
} gml_allocator;

struct gml_block {
  uintptr_t addr;
  size_t size;
  gml_block *prev, *next; /* address order within the region */
  gml_block *kid[2];      /* free blocks: treap children, left and right */
  uint32_t prio;
  uint8_t is_free;
  uint8_t region;
  uint8_t pool;      /* index into region->pools while free */
  uint8_t stitched;  /* live block mapped with chunks taken from elsewhere */
  gml_stream stream; /* stream allocated on (live) / freed on (free) */
  uintptr_t event;   /* free: recorded on `stream` when has_event */
  uint8_t has_event;
  uint8_t paused;         /* live block whose slots were let go (pause.c): GML_PAUSED_* */
  uint32_t pause_tag;     /* a->tag when it was allocated (gml_set_tag) */
  uint8_t lent;           /* free: moved from another stream's pool (harvest, borrowing) */
  gml_stream lender;      /* ... from which stream's (GML_STREAM_MIXED: several) */
  uint64_t free_tick;     /* free: a->tick of its (latest) free */
  uintptr_t ptr;          /* live: what malloc returned (guard mode: past the block's start) */
  size_t req, usable;     /* live: bytes asked for; bytes from ptr it may use */
  uint64_t seq, alloc_ns; /* live: allocation number; when (guard mode only) */
  void **bt;              /* live, guard mode with backtraces: where it was allocated */
  uint8_t planned;        /* GMLI_BLOCK_*: an ordinary block, one served in a planned range, a planned range */
  gml_plan_grant grant;   /* live, planned placement on: what the plan keeper said of it (planned.h) */
};
/* gml_block.planned: a planned range is a block of the large region held for the plan (its slots claimed
 * by the blocks served in it, not by it); a block served in one is in the pointer map, never in a
 * region's list (planned.h). */
enum { GMLI_BLOCK_ORDINARY = 0, GMLI_BLOCK_PLANNED = 1, GMLI_BLOCK_RANGE = 2 };
enum { GML_PAUSED_NO = 0, GML_PAUSED = 1, GML_PAUSED_FREED = 2 /* freed while paused: becomes free at resume */ };

/* ---------- layout ---------- */

static inline uint32_t slot_of(const gml_allocator *a, uintptr_t addr) {
  return (uint32_t)((addr - a->va_base) / a->cs);
}
static inline uintptr_t slot_addr(const gml_allocator *a, uint32_t s) { return a->va_base + (uintptr_t)s * a->cs; }
static inline uint64_t reserved_bytes(const gml_allocator *a) { return (uint64_t)a->held * a->cs; }
static inline size_t free_chunks(const gml_allocator *a) {
  return a->lists[GML_CL_FRESH].count + a->lists[GML_CL_CACHED].count;
}
static inline gml_region *region_for(gml_allocator *a, size_t size) {
  return &a->regions[size < GML_SMALL_LIMIT ? 0 : 1];
}

/* Guard mode: a block is [front guard][slack][usable][back guard] in whole
 * grains (policy.c places the pointer); guards that are whole slots are
 * never mapped, so a block uses only the slots of its grains in between. */
static inline uintptr_t guard_data_start(const gml_allocator *a, uintptr_t addr) {
  return addr + (a->guard == GML_GUARD_BOTH ? a->guard_grain : 0);
}
static inline int guard_slots_unmapped(const gml_allocator *a) { return a->guard && a->guard_grain == a->cs; }
/* The bytes whose slots a block at addr of bsize bytes (rsize usable) uses. */
static inline void claim_window(const gml_allocator *a, uintptr_t addr, size_t bsize, size_t rsize, uintptr_t *lo,
                                uintptr_t *hi) {
  *lo = addr, *hi = addr + bsize;
  if (guard_slots_unmapped(a)) *lo = guard_data_start(a, addr), *hi = *lo + gmli_round_up(rsize, a->cs);
}
/* The slots [first, last] live block b uses. */
static inline void block_slots(const gml_allocator *a, const gml_block *b, uint32_t *first, uint32_t *last) {
  uintptr_t lo = b->addr, hi = b->addr + b->size;
  if (guard_slots_unmapped(a)) hi = b->ptr + b->usable, lo = hi - gmli_round_up(b->usable, a->cs);
  *first = slot_of(a, lo), *last = slot_of(a, hi - 1);
}

/* ---------- blocks.c: block structs, treaps, pools, pointer map ---------- */

GML_HIDDEN gml_block *gmli_block_new(gml_allocator *a);
GML_HIDDEN void gmli_block_put(gml_allocator *a, gml_block *b);
/* Cut free block b (in no tree) at offset `at`: b keeps the front, the
 * returned free block (in no tree yet) the rest; NULL if out of memory. */
GML_HIDDEN gml_block *gmli_block_split(gml_allocator *a, gml_block *b, size_t at);
/* Merge b with free neighbours of the same pool; b is not in any tree. */
GML_HIDDEN gml_block *gmli_block_coalesce(gml_allocator *a, gml_region *r, gml_block *b);
GML_HIDDEN void gmli_region_free_blocks(gml_allocator *a, gml_region *r);

/* Smallest (size, addr) with size >= want. */
static inline gml_block *treap_best_fit(gml_block *root, size_t want) {
  gml_block *best = NULL;
  while (root) {
    if (root->size >= want) {
      best = root;
      root = root->kid[0];
    } else {
      root = root->kid[1];
    }
  }
  return best;
}
/* Up to max free blocks of size >= want, in (size, addr) order. */
GML_HIDDEN void gmli_treap_collect_ge(gml_block *n, size_t want, gml_block **out, int *k, int max);

/* Pool of stream s in region r ([0]: any stream), created if asked. */
static inline int pool_index(gml_allocator *a, gml_region *r, gml_stream s, int create) {
  for (int i = 1; i <= GML_MAX_STREAMS; i++)
    if (r->pools[i].used && r->pools[i].stream == s) return i;
  if (!create) return -1;
  for (int i = 1; i <= GML_MAX_STREAMS; i++) {
    if (!r->pools[i].used) {
      r->pools[i].used = 1;
      r->pools[i].stream = s;
      int seen = 0;
      for (int k = 0; k < a->nstreams_seen; k++) seen |= a->streams_seen[k] == s;
      if (!seen && a->nstreams_seen < GML_MAX_STREAMS) a->streams_seen[a->nstreams_seen++] = s;
      return i;
    }
  }
  return 0; /* too many streams: fall back to the shared pool after a full sync */
}
GML_HIDDEN void gmli_pool_add(gml_region *r, int pi, gml_block *b);
GML_HIDDEN void gmli_pool_del(gml_region *r, gml_block *b);

GML_HIDDEN int gmli_ptrmap_put(gml_ptrmap *m, uintptr_t k, gml_block *v);
/* The block at k (NULL if none), taken out of the map if `remove`. */
GML_HIDDEN gml_block *gmli_ptrmap_take(gml_ptrmap *m, uintptr_t k, int remove);

/* ---------- free-chunk lists and readiness ---------- */

static inline void clist_push(gml_allocator *a, int l, int32_t ci) {
  gml_clist *L = &a->lists[l];
  gml_pchunk *c = &a->chunks[ci];
  c->list = (uint8_t)l;
  c->lprev = L->tail;
  c->lnext = -1;
  if (L->tail >= 0) a->chunks[L->tail].lnext = ci;
  else L->head = ci;
  L->tail = ci;
  L->count++;
}

static inline void clist_unlink(gml_allocator *a, int32_t ci) {
  gml_pchunk *c = &a->chunks[ci];
  gml_clist *L = &a->lists[c->list];
  if (c->lprev >= 0) a->chunks[c->lprev].lnext = c->lnext;
  else L->head = c->lnext;
  if (c->lnext >= 0) a->chunks[c->lnext].lprev = c->lprev;
  else L->tail = c->lprev;
  c->lprev = c->lnext = -1;
  c->list = GML_CL_OWNED;
  L->count--;
}

/* Index of stream s in streams_seen, -1 if never seen. */
static inline int stream_index(const gml_allocator *a, gml_stream s) {
  for (int k = 0; k < a->nstreams_seen; k++)
    if (a->streams_seen[k] == s) return k;
  return -1;
}
/* Was chunk c freed on a stream that `stream` was made to wait for
 * (borrowing) after the free? (blocks.c) */
GML_HIDDEN int gmli_chunk_ordered_slow(const gml_allocator *a, const gml_pchunk *c, gml_stream stream);

/* May a block on `stream` use chunk ci now without waiting? Work queued on
 * the stream that freed it runs first anyway; other streams need the fence. */
static inline int chunk_ready_for(const gml_allocator *a, int32_t ci, gml_stream stream) {
  const gml_pchunk *c = &a->chunks[ci];
  return c->free_stream == stream || c->free_tick < a->safe_tick || /* MIXED matches no stream */
         (a->any_ordered && gmli_chunk_ordered_slow(a, c, stream));
}
/* Is addr in a's virtual range (the fault handler asks, guard.c: a reader of the state, so guard mode
 * sits above the state, not beside the allocator's entry points). */
static inline int gmli_alloc_owns(const gml_allocator *a, uintptr_t addr) {
  return addr >= a->va_base && addr - a->va_base < a->va_size;
}

#endif
