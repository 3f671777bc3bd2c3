/* slots.h: the chunk mechanism's face (slots.c): the slot ownership steps
 * of the fast path (static inline: a request claims its slots, a free
 * releases them), and what slots.c carries out for alloc.c, pause.c and
 * reclaim.c: mapping slots, leases, give-back, fences, harvest, the waits
 * of borrowing, guards. It sees the allocator's state (blocks.h) and the
 * policy's plans (policy.h), never the entry points above it (alloc.h). */
#ifndef GML_SLOTS_H
#define GML_SLOTS_H
#include "blocks.h"

/* ---------- slot ownership (fast-path part) ---------- */

/* Chunk ci (mapped there, or mapped nowhere: s = -1) is shown at slot s in
 * snapshots from now on (gml_pchunk.shown_at; slots.c). */
GML_HIDDEN void gmli_chunk_show(gml_allocator *a, int32_t ci, int32_t s);

/* Free chunk ci becomes owned by slot s (which maps it). */
static inline void chunk_own(gml_allocator *a, int32_t ci, uint32_t s) {
  clist_unlink(a, ci);
  a->chunks[ci].owner = (int32_t)s;
  if (a->chunks[ci].shown_at != (int32_t)s) gmli_chunk_show(a, ci, (int32_t)s);
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
GML_HIDDEN void gmli_slots_unclaim(gml_allocator *a, uint32_t first, uint32_t last);
/* Unmap slot s (no live block touches it, nor will the device again). */
GML_HIDDEN int gmli_slot_unmap(gml_allocator *a, uint32_t s);
/* New chunks from the source onto the fresh list (optional: headroom), up
 * to GML_LEASE_MAX in one call (the source may give fewer). */
GML_HIDDEN int gmli_lease_chunks_slow(gml_allocator *a, size_t want, int optional);
/* Back every slot of [first, last] that has no chunk of its own (policy.h
 * picks which); on failure every slot is consistent, the caller unclaims. */
GML_HIDDEN int gmli_map_slots_slow(gml_allocator *a, uint32_t first, uint32_t last, gml_stream stream, int *stole);
/* Unmap free chunk ci from every slot and give it back to the source;
 * nonzero (and the chunk kept) if the backend refused an unmap. */
GML_HIDDEN int gmli_chunk_give_back(gml_allocator *a, int32_t ci);
/* Poll the fence; arm a new one when none is pending. */
GML_HIDDEN void gmli_fence_update(gml_allocator *a);
/* Move free blocks whose stream has passed them into the shared pool;
 * returns how many moved. */
GML_HIDDEN int gmli_harvest_streams_slow(gml_allocator *a, gml_region *r);
/* Borrowing: the free blocks of other streams' pools in region r that
 * `stream` is ordered after (freed before a wait made it wait for their
 * stream) join its pool pi; returns how many moved. */
GML_HIDDEN int gmli_take_ordered_slow(gml_allocator *a, gml_region *r, int pi, gml_stream stream);
/* Make `stream` wait for everything stream index j enqueued so far (an
 * event on j, a wait on `stream`); 0, or nonzero if the backend cannot
 * (a stream being captured): the caller does not borrow. */
GML_HIDDEN int gmli_order_after_slow(gml_allocator *a, gml_stream stream, int j);
/* Borrows still waiting on their lender's event (done ones are forgotten). */
GML_HIDDEN int gmli_borrows_pending(gml_allocator *a);
/* Guard mode: make block b's guards inaccessible (on) or usable again. */
GML_HIDDEN int gmli_guards_set(gml_allocator *a, gml_block *b, int on);
#endif
