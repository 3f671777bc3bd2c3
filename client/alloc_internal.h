/* alloc_internal.h: what the allocator's files share (not for client.c).
 * alloc.h has the types and the design; this header has the block struct,
 * the small helpers every file uses (static inline: they sit on the fast
 * path), and the functions one file offers another:
 *   blocks.c       block structs, best-fit treaps, pools, the pointer map
 *   slots.c        chunk free lists, slot mappings (map/unmap/rollback),
 *                  leases, stream fences and harvest
 *   policy.c       every decision, as a plan (policy.h), and the queries
 *                  the mechanism shares with it: is a chunk ready, does a
 *                  window need driver calls
 *   alloc.c        the entry points: fast path, slow paths, init, stats
 *   alloc_check.c  the invariant checker
 *   guard.c        guard mode's setting and fault report, gml_block_of
 * Functions shared between files are gml_-prefixed and hidden, so they
 * never clash with, or get interposed by, a symbol of the program. */
#ifndef GML_ALLOC_INTERNAL_H
#define GML_ALLOC_INTERNAL_H
#include "alloc.h"
#include "util.h"

#define GML_HIDDEN __attribute__((visibility("hidden")))

struct gml_block {
  uintptr_t addr;
  size_t size;
  gml_block *prev, *next;   /* address order within the region */
  gml_block *kid[2];        /* free blocks: treap children, left and right */
  uint32_t prio;
  uint8_t is_free;
  uint8_t region;
  uint8_t pool;             /* index into region->pools while free */
  uint8_t stitched;         /* live block mapped with chunks taken from elsewhere */
  gml_stream stream;        /* stream allocated on (live) / freed on (free) */
  uintptr_t event;          /* free: recorded on `stream` when has_event */
  uint8_t has_event;
  uint8_t paused;           /* live block whose slots were let go (pause.c): GML_PAUSED_* */
  uint32_t pause_tag;       /* a->tag when it was allocated (gml_set_tag) */
  uint8_t lent;             /* free: moved from another stream's pool (harvest, borrowing) */
  gml_stream lender;        /* ... from which stream's (GML_STREAM_MIXED: several) */
  uint64_t free_tick;       /* free: a->tick of its (latest) free */
  uintptr_t ptr;            /* live: what malloc returned (guard mode: past the block's start) */
  size_t req, usable;       /* live: bytes asked for; bytes from ptr it may use */
  uint64_t seq, alloc_ns;   /* live: allocation number; when (guard mode only) */
  void **bt;                /* live, guard mode with backtraces: where it was allocated */
};
enum { GML_PAUSED_NO = 0, GML_PAUSED = 1, GML_PAUSED_FREED = 2 /* freed while paused: becomes free at resume */ };

/* ---------- layout ---------- */

static inline uint32_t slot_of(const gml_allocator *a, uintptr_t addr) { return (uint32_t)((addr - a->va_base) / a->cs); }
static inline uintptr_t slot_addr(const gml_allocator *a, uint32_t s) { return a->va_base + (uintptr_t)s * a->cs; }
static inline uint64_t reserved_bytes(const gml_allocator *a) { return (uint64_t)a->held * a->cs; }
static inline size_t free_chunks(const gml_allocator *a) { return a->lists[GML_CL_FRESH].count + a->lists[GML_CL_CACHED].count; }
static inline gml_region *region_for(gml_allocator *a, size_t size) { return &a->regions[size < GML_SMALL_LIMIT ? 0 : 1]; }

/* Guard mode: a block is [front guard][slack][usable][back guard] in whole
 * grains (policy.c places the pointer); guards that are whole slots are
 * never mapped, so a block uses only the slots of its grains in between. */
static inline uintptr_t guard_data_start(const gml_allocator *a, uintptr_t addr) {
  return addr + (a->guard == GML_GUARD_BOTH ? a->guard_grain : 0);
}
static inline int guard_slots_unmapped(const gml_allocator *a) { return a->guard && a->guard_grain == a->cs; }
/* The bytes whose slots a block at addr of bsize bytes (rsize usable) uses. */
static inline void claim_window(const gml_allocator *a, uintptr_t addr, size_t bsize, size_t rsize, uintptr_t *lo, uintptr_t *hi) {
  *lo = addr, *hi = addr + bsize;
  if (guard_slots_unmapped(a)) *lo = guard_data_start(a, addr), *hi = *lo + gml_round_up(rsize, a->cs);
}
/* The slots [first, last] live block b uses. */
static inline void block_slots(const gml_allocator *a, const gml_block *b, uint32_t *first, uint32_t *last) {
  uintptr_t lo = b->addr, hi = b->addr + b->size;
  if (guard_slots_unmapped(a)) hi = b->ptr + b->usable, lo = hi - gml_round_up(b->usable, a->cs);
  *first = slot_of(a, lo), *last = slot_of(a, hi - 1);
}

/* ---------- blocks.c: block structs, treaps, pools, pointer map ---------- */

GML_HIDDEN gml_block *gml_block_new(gml_allocator *a);
GML_HIDDEN void gml_block_put(gml_allocator *a, gml_block *b);
/* Cut free block b (in no tree) at offset `at`: b keeps the front, the
 * returned free block (in no tree yet) the rest; NULL if out of memory. */
GML_HIDDEN gml_block *gml_block_split(gml_allocator *a, gml_block *b, size_t at);
/* Merge b with free neighbours of the same pool; b is not in any tree. */
GML_HIDDEN gml_block *gml_block_coalesce(gml_allocator *a, gml_region *r, gml_block *b);
GML_HIDDEN void gml_region_free_blocks(gml_allocator *a, gml_region *r);

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
GML_HIDDEN void gml_treap_collect_ge(gml_block *n, size_t want, gml_block **out, int *k, int max);

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
GML_HIDDEN void gml_pool_add(gml_region *r, int pi, gml_block *b);
GML_HIDDEN void gml_pool_del(gml_region *r, gml_block *b);

GML_HIDDEN int gml_ptrmap_put(gml_ptrmap *m, uintptr_t k, gml_block *v);
/* The block at k (NULL if none), taken out of the map if `remove`. */
GML_HIDDEN gml_block *gml_ptrmap_take(gml_ptrmap *m, uintptr_t k, int remove);

/* ---------- chunk free lists and slot ownership (fast-path part) ---------- */

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
 * (borrowing) after the free? (policy.c) */
GML_HIDDEN int gml_chunk_ordered_slow(const gml_allocator *a, const gml_pchunk *c, gml_stream stream);

/* Chunk ci (mapped there, or mapped nowhere: s = -1) is shown at slot s in
 * snapshots from now on (gml_pchunk.shown_at; slots.c). */
GML_HIDDEN void gml_chunk_show(gml_allocator *a, int32_t ci, int32_t s);

/* Free chunk ci becomes owned by slot s (which maps it). */
static inline void chunk_own(gml_allocator *a, int32_t ci, uint32_t s) {
  clist_unlink(a, ci);
  a->chunks[ci].owner = (int32_t)s;
  if (a->chunks[ci].shown_at != (int32_t)s) gml_chunk_show(a, ci, (int32_t)s);
}

/* Slot s goes untouched: its chunk becomes free (and stays mapped there). */
static inline void slot_release(gml_allocator *a, uint32_t s) {
  int32_t ci = a->slot_chunk[s];
  gml_pchunk *c = &a->chunks[ci];
  c->owner = -1;
  c->free_tick = a->tick;
  c->free_stream = a->slot_stream[s];
  a->slot_idle_tick[s] = a->tick;
  clist_push(a, GML_CL_CACHED, ci);
}

/* May a block on `stream` use chunk ci now without waiting? Work queued on
 * the stream that freed it runs first anyway; other streams need the fence. */
static inline int chunk_ready_for(const gml_allocator *a, int32_t ci, gml_stream stream) {
  const gml_pchunk *c = &a->chunks[ci];
  return c->free_stream == stream || c->free_tick < a->safe_tick || /* MIXED matches no stream */
         (a->any_ordered && gml_chunk_ordered_slow(a, c, stream));
}

/* Slot s becomes touched by a block on `stream`: take its mapped chunk if
 * that is free and ready. Returns 1 if the slot still needs a chunk. */
static inline int slot_claim(gml_allocator *a, uint32_t s, gml_stream stream) {
  if (a->slot_use[s]++) {
    if (a->slot_stream[s] == stream) return 0;
    a->slot_stream[s] = GML_STREAM_MIXED;
    /* its chunk was taken for another stream's block, maybe while the stream
     * that freed it still had work on it: then ours must wait too (map) */
    return !chunk_ready_for(a, a->slot_chunk[s], stream);
  }
  a->slot_stream[s] = stream;
  int32_t ci = a->slot_chunk[s];
  if (ci >= 0 && a->chunks[ci].owner < 0 && chunk_ready_for(a, ci, stream)) {
    chunk_own(a, ci, s);
    return 0;
  }
  return 1;
}

/* ---------- slots.c: mapping, leases, fences, harvest ---------- */

/* Undo slot_claim for slots [first, last] after a failed request. */
GML_HIDDEN void gml_slots_unclaim(gml_allocator *a, uint32_t first, uint32_t last);
/* Unmap slot s (no live block touches it, nor will the device again). */
GML_HIDDEN int gml_slot_unmap(gml_allocator *a, uint32_t s);
/* New chunks from the source onto the fresh list (optional: headroom), up
 * to GML_LEASE_MAX in one call (the source may give fewer). */
GML_HIDDEN int gml_lease_chunks_slow(gml_allocator *a, size_t want, int optional);
/* Back every slot of [first, last] that has no chunk of its own (policy.h
 * picks which); on failure every slot is consistent, the caller unclaims. */
GML_HIDDEN int gml_map_slots_slow(gml_allocator *a, uint32_t first, uint32_t last, gml_stream stream, int *stole);
/* Unmap free chunk ci from every slot and give it back to the source;
 * nonzero (and the chunk kept) if the backend refused an unmap. */
GML_HIDDEN int gml_chunk_give_back(gml_allocator *a, int32_t ci);
/* Poll the fence; arm a new one when none is pending. */
GML_HIDDEN void gml_fence_update(gml_allocator *a);
/* Move free blocks whose stream has passed them into the shared pool;
 * returns how many moved. */
GML_HIDDEN int gml_harvest_streams_slow(gml_allocator *a, gml_region *r);
/* Borrowing: the free blocks of other streams' pools in region r that
 * `stream` is ordered after (freed before a wait made it wait for their
 * stream) join its pool pi; returns how many moved. */
GML_HIDDEN int gml_take_ordered_slow(gml_allocator *a, gml_region *r, int pi, gml_stream stream);
/* Make `stream` wait for everything stream index j enqueued so far (an
 * event on j, a wait on `stream`); 0, or nonzero if the backend cannot
 * (a stream being captured): the caller does not borrow. */
GML_HIDDEN int gml_order_after_slow(gml_allocator *a, gml_stream stream, int j);
/* Borrows still waiting on their lender's event (done ones are forgotten). */
GML_HIDDEN int gml_borrows_pending(gml_allocator *a);
/* Guard mode: make block b's guards inaccessible (on) or usable again. */
GML_HIDDEN int gml_guards_set(gml_allocator *a, gml_block *b, int on);
#endif
