/* policy.h: every decision the allocator makes, in one file (policy.c),
 * apart from the mechanism that carries it out (blocks.c, slots.c), so a
 * policy can be changed and measured with gmlake-replay alone (same peak
 * reserved? fewer maps, unmaps, syncs per step?). The mechanism calls it
 * at four points (placement inline here, the rest in policy.c):
 *
 *   placement  gml_policy_place           which free block serves a request
 *                                         (every malloc: keep it cheap), and
 *                                         whether to borrow another stream's
 *              gml_policy_block_size,     guard mode: how large a block, and
 *              gml_policy_guard_ptr       where its pointer goes
 *   headroom   gml_policy_headroom        before a request maps chunks:
 *                                         lease fresh ones beyond need?
 *   remap      gml_policy_chunk_for_slot  which free chunk backs a slot
 *                                         that has none of its own
 *   trim       gml_policy_trim_next       which free chunk goes back first
 *
 * Fixed in the mechanism, not choices: a slot whose own mapped chunk is
 * free takes it back (waiting for the device if another stream freed it);
 * a slot mapping a chunk that another slot owns is unmapped before it is
 * mapped again; new mappings get their access set in runs; a fence is
 * armed every 256 frees. */
#ifndef GML_POLICY_H
#define GML_POLICY_H
#include "alloc_internal.h"

#define GML_PICK_SCAN 1024 /* free chunks looked at to pick one for a slot */
#define GML_HEADROOM_BACKOFF 4096 /* operations without asking for headroom after a no */

/* Placement is on every malloc's fast path, so it is here, inline (one
 * stream, a fit found: done); the rest is in policy.c.
 *
 * gml_policy_place: the free block of region r that serves a request of
 * rsize bytes (a multiple of GML_ALIGN) on `stream`, whose own pool is
 * r->pools[pi]; NULL if none (the virtual range is exhausted). The block
 * stays in its pool; the caller takes it out and splits off the rest. */
static inline gml_block *find_fit(gml_region *r, int pi, size_t size) {
  gml_block *b = pi > 0 ? treap_best_fit(r->pools[pi].root, size) : NULL;
  gml_block *c = treap_best_fit(r->pools[0].root, size);
  if (!b || (c && c->size < b->size)) b = c;
  return b;
}

/* The block a request of rsize usable bytes takes (more in guard mode). */
static inline size_t gml_policy_block_size(gml_allocator *a, size_t rsize) {
  if (!a->guard) return rsize;
  return gml_round_up(rsize, a->guard_grain) + a->guard_grain * (a->guard == GML_GUARD_BOTH ? 2 : 1);
}
/* Guard mode: the pointer of a request of rsize bytes in a block at addr:
 * its usable bytes end where the back guard begins (PyTorch's 512-byte
 * alignment allowing), so one element past the end is in the guard. */
static inline uintptr_t gml_policy_guard_ptr(gml_allocator *a, uintptr_t addr, size_t rsize) {
  return guard_data_start(a, addr) + gml_round_up(rsize, a->guard_grain) - rsize;
}

/* Several streams, or no fit: harvest, borrow (policy.c). */
GML_HIDDEN gml_block *gml_policy_place_slow(gml_allocator *a, gml_region *r, int pi, size_t rsize, gml_stream stream, gml_block *b);

/* Always the best fit (smallest, then lowest address) of the stream's own
 * pool and the shared one, whatever its slots map: placement that depends
 * only on sizes and order lays a repeated step out as before, so its slots
 * find their chunks again (BENCHMARKS.md, session 4). */
static inline gml_block *gml_policy_place(gml_allocator *a, gml_region *r, int pi, size_t rsize, gml_stream stream) {
  gml_block *b = find_fit(r, pi, gml_policy_block_size(a, rsize));
  if (b && a->nstreams_seen < 2) return b;
  return gml_policy_place_slow(a, r, pi, rsize, stream, b);
}

/* A request must map `need` slots and at least `need` chunks are free:
 * lease fresh chunks beyond need (optional leases) if that is wanted. */
GML_HIDDEN void gml_policy_headroom(gml_allocator *a, size_t need);

/* The free chunk (on the fresh or the cached list; not both empty) that
 * slot s gets for a block on `stream`. A cached chunk that `stream` may
 * not use yet is waited for by the caller. */
GML_HIDDEN int32_t gml_policy_chunk_for_slot(gml_allocator *a, uint32_t s, gml_stream stream);

/* Trimming: the free chunk to give back next (-1: none), and whether
 * giving back max_chunks reaches chunks still mapped (the caller then
 * synchronizes the device once, first). */
GML_HIDDEN int32_t gml_policy_trim_next(gml_allocator *a);
GML_HIDDEN int gml_policy_trim_reaches_mapped(gml_allocator *a, size_t max_chunks);
#endif
