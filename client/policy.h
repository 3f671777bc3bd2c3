/* policy.h: every decision the allocator makes, in one file (policy.c),
 * apart from the mechanism that carries it out (alloc.c, slots.c), so a
 * policy can be changed and measured with gmlake-replay alone (same peak
 * reserved? fewer maps, unmaps, syncs per step?) and tested without an
 * allocator (tests/test_policy.c). As daemon/broker.h does for leases, a
 * policy only reads: it takes the allocator's state const and answers with
 * a plan, a value the mechanism carries out. The mechanism asks at four
 * points (placement inline here, the rest in policy.c):
 *
 *   placement  gmli_policy_place           a gml_place_plan: which free block
 *              gmli_policy_place_next      serves a request (every malloc:
 *                                         keep it cheap), or first a step
 *                                         that changes the pools (harvest,
 *                                         take ordered, borrow)
 *              gmli_policy_place_at       planned placement: serve at the
 *                                         plan's offset (GML_PLACE_AT) or not
 *              gmli_policy_block_size,     guard mode: how large a block, and
 *              gmli_policy_guard_ptr       where its pointer goes
 *   leasing    gmli_policy_lease           a gml_lease_plan: how many chunks
 *                                         a request leases, needed or as
 *                                         headroom beyond need
 *   remap      gmli_policy_chunk_for_slot  which free chunk backs a slot
 *                                         that has none of its own
 *   trim       gmli_policy_trim_next       which free chunk goes back first
 *
 * Fixed in the mechanism, not choices: a slot whose own mapped chunk is
 * free takes it back (waiting for the device if another stream freed it);
 * a slot mapping a chunk that another slot owns is unmapped before it is
 * mapped again; new mappings get their access set in runs; a fence is
 * armed every 256 frees.
 *
 * Plugging in a new policy: a new way to serve a request is a new
 * gml_place_kind, with the fields it needs in gml_place_plan, and its case
 * in alloc.c's place_slow, the one place that carries the stitching
 * allocator's placement plans out (the planned placement's GML_PLACE_AT,
 * from gmli_policy_place_at, is carried out by planned.c, in a range the
 * best-fit search never sees);
 * the policy that chooses it is a function of the same shape as
 * gmli_policy_place_next, reached from gmli_policy_place_slow before the
 * best-fit sequence, reading only what it is given const, with its state
 * (the recorded plan) a field of the allocator that only the mechanism
 * writes. Nothing it decides may call slots.c or alloc.c: it answers, the
 * mechanism acts, and a test builds the state it reads by hand. Decisions
 * on chunks (how many to lease, which one a slot gets, which goes back)
 * plug in the same way, as a field of their plan. */
#ifndef GML_POLICY_H
#define GML_POLICY_H
#include "blocks.h"

#define GML_PICK_SCAN 1024        /* free chunks looked at to pick one for a slot */
#define GML_HEADROOM_BACKOFF 4096 /* operations without asking for headroom after a no */

/* ---------- placement ---------- */

/* What the mechanism does next to place a request. Every kind but
 * GML_PLACE_FIT changes the pools; the mechanism then hands the plan back
 * to gmli_policy_place_next with how many blocks moved, and carries out
 * what comes next, until a fit. */
typedef enum gml_place_kind {
  GML_PLACE_FIT = 0,      /* serve from free block `block` (NULL: the virtual range is exhausted) */
  GML_PLACE_HARVEST,      /* other streams' free blocks whose work is done join the shared pool */
  GML_PLACE_TAKE_ORDERED, /* the free blocks `stream` is ordered after (borrowing's waits) join its pool */
  GML_PLACE_BORROW,       /* if fewer than max_pending borrows wait on a lender: `stream` waits
                           * for stream index `lender`'s work so far, then TAKE_ORDERED */
  GML_PLACE_AT,           /* planned placement: serve the request at address `at` of the planned range
                           * (planned.c carries it out; a FIT with no block there: the stitching allocator's) */
} gml_place_kind;

typedef struct gml_place_plan {
  gml_place_kind kind;
  int stage;        /* the policy's own: where its sequence stands (handed back unchanged) */
  gml_block *block; /* FIT: the block; any other kind: what serves if the step moves nothing */
  int lender;       /* BORROW: the index in streams_seen of the stream waited for */
  int max_pending;  /* BORROW: borrow only while fewer waits than this are pending */
  uintptr_t at;     /* AT: the address */
} gml_place_plan;

/* Placement is on every malloc's fast path, so it is here, inline (one
 * stream, a fit found: done); the rest is in policy.c.
 *
 * The free block of region r that serves a request of size bytes on the
 * stream whose own pool is r->pools[pi]: the best fit of that pool and the
 * shared one. */
static inline gml_block *find_fit(const gml_region *r, int pi, size_t size) {
  gml_block *b = pi > 0 ? treap_best_fit(r->pools[pi].root, size) : NULL;
  gml_block *c = treap_best_fit(r->pools[0].root, size);
  if (!b || (c && c->size < b->size)) b = c;
  return b;
}

/* The block a request of rsize usable bytes takes (more in guard mode). */
static inline size_t gmli_policy_block_size(const gml_allocator *a, size_t rsize) {
  if (!a->guard) return rsize;
  return gmli_round_up(rsize, a->guard_grain) + a->guard_grain * (a->guard == GML_GUARD_BOTH ? 2 : 1);
}
/* Guard mode: the pointer of a request of rsize bytes in a block at addr:
 * its usable bytes end where the back guard begins (PyTorch's 512-byte
 * alignment allowing), so one element past the end is in the guard. */
static inline uintptr_t gmli_policy_guard_ptr(const gml_allocator *a, uintptr_t addr, size_t rsize) {
  return guard_data_start(a, addr) + gmli_round_up(rsize, a->guard_grain) - rsize;
}

/* Several streams, or no fit: the first step of harvest, then borrowing
 * (policy.c); b is the fit found so far. */
GML_HIDDEN gml_place_plan gmli_policy_place_slow(const gml_allocator *a, const gml_region *r, int pi, size_t rsize,
                                                 gml_stream stream, gml_block *b);
/* The step after plan `done` was carried out and moved `moved` blocks. */
GML_HIDDEN gml_place_plan gmli_policy_place_next(const gml_allocator *a, const gml_region *r, int pi, size_t rsize,
                                                 gml_stream stream, const gml_place_plan *done, int moved);

/* The plan for a request of rsize bytes (a multiple of GML_ALIGN) on
 * `stream`, whose own pool is r->pools[pi]. A FIT's block stays in its
 * pool; the caller takes it out and splits off the rest.
 *
 * Always the best fit (smallest, then lowest address) of the stream's own
 * pool and the shared one, whatever its slots map: placement that depends
 * only on sizes and order lays a repeated step out as before, so its slots
 * find their chunks again (bench/results/history.md, session 4). */
static inline gml_place_plan gmli_policy_place(const gml_allocator *a, const gml_region *r, int pi, size_t rsize,
                                               gml_stream stream) {
  gml_block *b = find_fit(r, pi, gmli_policy_block_size(a, rsize));
  if (b && a->nstreams_seen < 2) return (gml_place_plan){.kind = GML_PLACE_FIT, .block = b};
  return gmli_policy_place_slow(a, r, pi, rsize, stream, b);
}

/* Planned placement (planned.h): where the plan keeper's answer (verdict, grant g) puts a request of
 * rsize bytes on `stream`, the plan served in range rg (NULL: none held): GML_PLACE_AT rg's base plus
 * the planned (or lent) offset; else a GML_PLACE_FIT with no block, the stitching allocator's (a miss,
 * an offset past the range held, or bytes last freed on another stream that no fence has passed). */
struct gmli_range;
GML_HIDDEN gml_place_plan gmli_policy_place_at(const gml_allocator *a, const struct gmli_range *rg, int verdict,
                                               const gml_plan_grant *g, size_t rsize, gml_stream stream);

/* Would a block at [addr, addr + rsize) on `stream` need a driver call or a wait? */
GML_HIDDEN int gmli_window_needs_calls(const gml_allocator *a, uintptr_t addr, size_t rsize, gml_stream stream);
/* ... or would it find every slot's chunk in place, usable once `stream`
 * waits for stream index j (borrowing)? */
GML_HIDDEN int gmli_window_ready_after_wait(const gml_allocator *a, uintptr_t addr, size_t size, gml_stream stream,
                                            int j);

/* ---------- chunks: leases, remap, trim ---------- */

typedef struct gml_lease_plan {
  size_t chunks;       /* lease this many (0: none) */
  int optional;        /* headroom: the source may say no, and the request goes on without */
  uint64_t retry_tick; /* optional and refused: ask no more before this tick */
} gml_lease_plan;

/* A request must map `need` slots: while fewer chunks than that are free,
 * the needed lease; once enough are, an optional one beyond need if
 * headroom is wanted (chunks 0 if not). */
GML_HIDDEN gml_lease_plan gmli_policy_lease(const gml_allocator *a, size_t need);

/* The free chunk (on the fresh or the cached list; not both empty) that
 * slot s gets for a block on `stream`. A cached chunk that `stream` may
 * not use yet is waited for by the caller. */
GML_HIDDEN int32_t gmli_policy_chunk_for_slot(const gml_allocator *a, uint32_t s, gml_stream stream);

/* Trimming: the free chunk to give back next (-1: none), and whether
 * giving back max_chunks reaches chunks still mapped (the caller then
 * synchronizes the device once, first). */
GML_HIDDEN int32_t gmli_policy_trim_next(const gml_allocator *a);
GML_HIDDEN int gmli_policy_trim_reaches_mapped(const gml_allocator *a, size_t max_chunks);
#endif
