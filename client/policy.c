/* policy.c: the allocator's decisions (policy.h lists them). Measured on
 * the recorded traces with gmlake-replay (BENCHMARKS.md, sessions 2-4):
 * best-fit placement plus headroom lets a repeated training step lay out
 * exactly as before and map nothing; placement that chased mapped chunks
 * took chunks other layouts needed and never settled. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "policy.h"
#include "util.h"

/* ---------- placement with several streams ---------- */

static int borrow_slow(gml_allocator *a, gml_region *r, int pi, size_t rsize, gml_stream stream);

static inline int fit_needs_calls(gml_allocator *a, gml_block *b, size_t bsize, size_t rsize, gml_stream stream) {
  uintptr_t lo, hi;
  claim_window(a, b->addr, bsize, rsize, &lo, &hi);
  return gml_window_needs_calls(a, lo, hi - lo, stream);
}

/* Other streams' free blocks whose work is done join the shared pool when
 * none fits, or when the fit would need driver calls; if it still would,
 * borrowing takes the blocks of streams this one already waits for, then
 * makes it wait for one more. */
gml_block *gml_policy_place_slow(gml_allocator *a, gml_region *r, int pi, size_t rsize, gml_stream stream, gml_block *b) {
  size_t bsize = gml_policy_block_size(a, rsize);
  int multi = a->nstreams_seen > 1;
  if ((!b || (multi && fit_needs_calls(a, b, bsize, rsize, stream))) && gml_harvest_streams_slow(a, r)) b = find_fit(r, pi, bsize);
  if (!multi || !a->borrow || a->guard || (b && !fit_needs_calls(a, b, bsize, rsize, stream))) return b;
  if (a->any_ordered && gml_take_ordered_slow(a, r, pi, stream)) {
    b = find_fit(r, pi, bsize);
    if (b && !fit_needs_calls(a, b, bsize, rsize, stream)) return b;
  }
  return borrow_slow(a, r, pi, rsize, stream) ? find_fit(r, pi, bsize) : b;
}

/* Cross-stream borrowing: nothing of this stream's, nor free of pending
 * work, fits without driver calls, and no other stream has passed a
 * fitting free yet (harvest). If another stream's pool holds a block of at
 * most borrow_ratio times the request whose slots hold their chunks,
 * `stream` waits for that stream's event (everything it enqueued so far,
 * its last use of every block it freed included, runs first), and every
 * block that stream freed so far joins this stream's pool: they are
 * ordered before its work now, and best fit (splitting as usual) picks
 * among them. At most borrow_max waits pending, because each one ties the
 * streams together; not in guard mode (its block sizes differ). With
 * borrowing off such a request maps or stitches chunks, waiting for the
 * device (a fence, or a synchronize) where another stream freed them. */
static int borrow_slow(gml_allocator *a, gml_region *r, int pi, size_t rsize, gml_stream stream) {
  if (pi <= 0 || gml_borrows_pending(a) >= a->borrow_max || stream_index(a, stream) < 0) return 0;
  double cap = (double)rsize * a->borrow_ratio;
  gml_block *best = NULL;
  int best_j = -1;
  for (int pj = 1; pj <= GML_MAX_STREAMS; pj++) {
    gml_pool *p = &r->pools[pj];
    int j, n = 0;
    if (pj == pi || !p->used || !p->count || (j = stream_index(a, p->stream)) < 0) continue;
    gml_block *cand[8];
    gml_treap_collect_ge(p->root, rsize, cand, &n, 8); /* smallest first */
    for (int i = 0; i < n && (double)cand[i]->size <= cap && (!best || cand[i]->size < best->size); i++) {
      if (gml_window_ready_after_wait(a, cand[i]->addr, rsize, stream, j)) {
        best = cand[i], best_j = j;
        break;
      }
    }
  }
  if (!best || gml_order_after_slow(a, stream, best_j)) return 0;
  return gml_take_ordered_slow(a, r, pi, stream);
}

/* ---------- headroom ---------- */

/* Rather than take a free chunk that is mapped elsewhere (whose layout then
 * breaks when it comes back), lease fresh ones while the held bytes stay
 * within headroom_pct of the peak allocated. Best effort: at the limit, or
 * if the source says no, the free chunks serve; after a no, the source is
 * not asked again for GML_HEADROOM_BACKOFF operations (each ask is a daemon
 * round trip). */
void gml_policy_headroom(gml_allocator *a, size_t need) {
  size_t fresh = a->lists[GML_CL_FRESH].count;
  if (fresh < need && a->headroom_pct > 0 && a->tick >= a->headroom_retry_tick) {
    uint64_t cap = a->peak_allocated + (uint64_t)((double)a->peak_allocated * a->headroom_pct / 100), held = reserved_bytes(a);
    size_t room = cap > held ? (size_t)((cap - held) / a->cs) : 0, want = GML_MIN(need - fresh, room);
    if (want && gml_lease_chunks_slow(a, want, 1) == 0) a->headroom_leased += a->lists[GML_CL_FRESH].count - fresh;
    else if (want) a->headroom_retry_tick = a->tick + GML_HEADROOM_BACKOFF;
  }
}

/* ---------- remap: which chunk for a slot ---------- */

/* A free chunk, mapped elsewhere, for slot s: of the GML_PICK_SCAN freed
 * longest ago that `stream` may use without waiting, the one whose nearest
 * mapping is farthest from s. Slots near each other serve blocks of the same
 * step, alive together; a chunk taken from far away is less likely to be
 * wanted back while s holds it (on the recorded traces: half the remaps of
 * taking simply the oldest). The oldest if none is ready. */
static int32_t pick_cached_chunk(gml_allocator *a, uint32_t s, gml_stream stream) {
  int32_t best = a->lists[GML_CL_CACHED].head;
  uint32_t best_d = 0;
  int n = 0;
  for (int32_t k = best; k >= 0 && n < GML_PICK_SCAN; k = a->chunks[k].lnext, n++) {
    if (!chunk_ready_for(a, k, stream)) continue;
    uint32_t d = UINT32_MAX;
    for (int32_t m = a->chunks[k].maps_head; m >= 0 && d > best_d; m = a->slot_anext[m]) {
      uint32_t dm = (uint32_t)m > s ? (uint32_t)m - s : s - (uint32_t)m;
      if (dm < d) d = dm;
    }
    if (d > best_d) best_d = d, best = k;
  }
  return best;
}

/* A fresh chunk (mapped nowhere, so no other layout loses it) first, the
 * oldest fresh one; else pick_cached_chunk's. */
int32_t gml_policy_chunk_for_slot(gml_allocator *a, uint32_t s, gml_stream stream) {
  if (a->lists[GML_CL_FRESH].count) return a->lists[GML_CL_FRESH].head;
  return pick_cached_chunk(a, s, stream);
}

/* ---------- trim ---------- */

/* Free chunks mapped nowhere go first, then mapped ones, freed longest ago
 * first (each is unmapped from every slot once the device is done). */
int32_t gml_policy_trim_next(gml_allocator *a) {
  if (a->lists[GML_CL_FRESH].count) return a->lists[GML_CL_FRESH].head;
  return a->lists[GML_CL_CACHED].count ? a->lists[GML_CL_CACHED].head : -1;
}

int gml_policy_trim_reaches_mapped(gml_allocator *a, size_t max_chunks) {
  return a->lists[GML_CL_FRESH].count < max_chunks && a->lists[GML_CL_CACHED].count;
}
