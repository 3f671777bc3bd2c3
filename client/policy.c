/* policy.c: the allocator's decisions (policy.h lists them), each a plan
 * read off the state it is given, never carried out here. Measured on
 * the recorded traces with gmlake-replay (bench/results/history.md, sessions 2-4):
 * best-fit placement plus headroom lets a repeated training step lay out
 * exactly as before and map nothing; placement that chased mapped chunks
 * took chunks other layouts needed and never settled. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "policy.h"
#include "planned.h"
#include "util.h"

/* ---------- what a window needs (the mechanism asks too) ---------- */

/* A slot the block touches that no live block uses maps no chunk, or one
 * owned elsewhere, or a free chunk another stream may still be using. */
int gmli_window_needs_calls(const gml_allocator *a, uintptr_t addr, size_t rsize, gml_stream stream) {
  for (uint32_t s = slot_of(a, addr), last = slot_of(a, addr + rsize - 1); s <= last; s++) {
    int32_t ci = a->slot_chunk[s];
    if (a->slot_use[s]) { /* joining another stream's slot may have to wait (slot_claim) */
      if (a->slot_stream[s] != stream && !chunk_ready_for(a, ci, stream)) return 1;
      continue;
    }
    if (ci < 0 || a->chunks[ci].owner >= 0 || !chunk_ready_for(a, ci, stream)) return 1;
  }
  return 0;
}

int gmli_window_ready_after_wait(const gml_allocator *a, uintptr_t addr, size_t size, gml_stream stream, int j) {
  for (uint32_t s = slot_of(a, addr), last = slot_of(a, addr + size - 1); s <= last; s++) {
    int32_t ci = a->slot_chunk[s];
    if (!a->slot_use[s] && (ci < 0 || a->chunks[ci].owner >= 0)) return 0; /* needs a mapping */
    if ((a->slot_use[s] && a->slot_stream[s] == stream) || chunk_ready_for(a, ci, stream)) continue;
    if (a->chunks[ci].free_stream != a->streams_seen[j]) return 0; /* another stream's work: not this wait's */
  }
  return 1;
}

/* ---------- placement with several streams ---------- */

/* Where the sequence of gmli_policy_place_slow stands (gml_place_plan.stage). */
enum { STAGE_HARVESTED = 1, STAGE_TOOK_ORDERED, STAGE_BORROWED };

static inline int fit_needs_calls(const gml_allocator *a, const gml_block *b, size_t rsize, gml_stream stream) {
  uintptr_t lo, hi;
  claim_window(a, b->addr, gmli_policy_block_size(a, rsize), rsize, &lo, &hi);
  return gmli_window_needs_calls(a, lo, hi - lo, stream);
}

static inline gml_place_plan fit(gml_block *b) { return (gml_place_plan){.kind = GML_PLACE_FIT, .block = b}; }
static inline gml_place_plan step(gml_place_kind kind, int stage, gml_block *b) {
  return (gml_place_plan){.kind = kind, .stage = stage, .block = b};
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
 * streams together (the mechanism counts them as it borrows); not in guard
 * mode (its block sizes differ). With borrowing off such a request maps or
 * stitches chunks, waiting for the device (a fence, or a synchronize)
 * where another stream freed them. */
static gml_place_plan plan_borrow(const gml_allocator *a, const gml_region *r, int pi, size_t rsize, gml_stream stream,
                                  gml_block *b) {
  if (pi <= 0 || stream_index(a, stream) < 0) return fit(b);
  double cap = (double)rsize * a->borrow_ratio;
  gml_block *best = NULL;
  int best_j = -1;
  for (int pj = 1; pj <= GML_MAX_STREAMS; pj++) {
    const gml_pool *p = &r->pools[pj];
    int j, n = 0;
    if (pj == pi || !p->used || !p->count || (j = stream_index(a, p->stream)) < 0) continue;
    gml_block *cand[8];
    gmli_treap_collect_ge(p->root, rsize, cand, &n, 8); /* smallest first */
    for (int i = 0; i < n && (double)cand[i]->size <= cap && (!best || cand[i]->size < best->size); i++) {
      if (gmli_window_ready_after_wait(a, cand[i]->addr, rsize, stream, j)) {
        best = cand[i], best_j = j;
        break;
      }
    }
  }
  if (!best) return fit(b);
  gml_place_plan p = step(GML_PLACE_BORROW, STAGE_BORROWED, b);
  p.lender = best_j, p.max_pending = a->borrow_max;
  return p;
}

/* After the harvest: the fit if it needs no driver calls (or borrowing is
 * off), else the blocks this stream already waits for, then borrowing. */
static gml_place_plan after_harvest(const gml_allocator *a, const gml_region *r, int pi, size_t rsize,
                                    gml_stream stream, gml_block *b) {
  if (a->nstreams_seen < 2 || !a->borrow || a->guard || (b && !fit_needs_calls(a, b, rsize, stream))) return fit(b);
  if (a->any_ordered) return step(GML_PLACE_TAKE_ORDERED, STAGE_TOOK_ORDERED, b);
  return plan_borrow(a, r, pi, rsize, stream, b);
}

/* Other streams' free blocks whose work is done join the shared pool when
 * none fits, or when the fit would need driver calls; if it still would,
 * borrowing takes the blocks of streams this one already waits for, then
 * makes it wait for one more. */
gml_place_plan gmli_policy_place_slow(const gml_allocator *a, const gml_region *r, int pi, size_t rsize,
                                      gml_stream stream, gml_block *b) {
  if (!b || (a->nstreams_seen > 1 && fit_needs_calls(a, b, rsize, stream)))
    return step(GML_PLACE_HARVEST, STAGE_HARVESTED, b);
  return after_harvest(a, r, pi, rsize, stream, b);
}

gml_place_plan gmli_policy_place_next(const gml_allocator *a, const gml_region *r, int pi, size_t rsize,
                                      gml_stream stream, const gml_place_plan *done, int moved) {
  gml_block *b = moved ? find_fit(r, pi, gmli_policy_block_size(a, rsize)) : done->block;
  switch (done->stage) {
  case STAGE_HARVESTED: return after_harvest(a, r, pi, rsize, stream, b);
  case STAGE_TOOK_ORDERED:
    if (moved && b && !fit_needs_calls(a, b, rsize, stream)) return fit(b);
    return plan_borrow(a, r, pi, rsize, stream, b);
  default: return fit(b);
  }
}

/* ---------- planned placement ---------- */

/* A hit (or a lent chunk run) within the range held goes at its offset, no
 * search; with several streams, only where every slot it touches was last
 * freed on this stream or before the fence (the range's per-slot record): the
 * keeper's lifetimes say nothing of streams, and a slot another block still
 * holds keeps its chunk, so the chunk's own readiness (slot_claim) does not
 * cover bytes freed inside it. */
gml_place_plan gmli_policy_place_at(const gml_allocator *a, const gmli_range *rg, int verdict, const gml_plan_grant *g,
                                    size_t rsize, gml_stream stream) {
  gml_place_plan no = {.kind = GML_PLACE_FIT, .block = NULL};
  if (!rg || (verdict != GML_PLAN_HIT && !g->lent) || g->offset + rsize > rg->size) return no;
  uintptr_t at = rg->base + g->offset;
  if (a->nstreams_seen > 1)
    for (uint32_t s = slot_of(a, at), last = slot_of(a, at + rsize - 1), s0 = slot_of(a, rg->base); s <= last; s++)
      if (rg->free_stream[s - s0] != stream && rg->free_tick[s - s0] >= a->safe_tick) return no;
  return (gml_place_plan){.kind = GML_PLACE_AT, .at = at};
}

/* ---------- leases ---------- */

/* Needed chunks first. Then, rather than take a free chunk that is mapped
 * elsewhere (whose layout then breaks when it comes back), lease fresh ones
 * while the held bytes stay within headroom_pct of the peak allocated. Best
 * effort: at the limit, or if the source says no, the free chunks serve;
 * after a no, the source is not asked again for GML_HEADROOM_BACKOFF
 * operations (each ask is a daemon round trip). */
gml_lease_plan gmli_policy_lease(const gml_allocator *a, size_t need) {
  gml_lease_plan p = {0, 0, 0};
  size_t free = free_chunks(a), fresh = a->lists[GML_CL_FRESH].count;
  if (free < need) {
    p.chunks = need - free;
  } else if (fresh < need && a->headroom_pct > 0 && a->tick >= a->headroom_retry_tick) {
    uint64_t cap = a->peak_allocated + (uint64_t)((double)a->peak_allocated * a->headroom_pct / 100),
             held = reserved_bytes(a);
    size_t room = cap > held ? (size_t)((cap - held) / a->cs) : 0;
    p.chunks = GML_MIN(need - fresh, room);
    p.optional = 1;
    p.retry_tick = a->tick + GML_HEADROOM_BACKOFF;
  }
  return p;
}

/* ---------- remap: which chunk for a slot ---------- */

/* A free chunk, mapped elsewhere, for slot s: of the GML_PICK_SCAN freed
 * longest ago that `stream` may use without waiting, the one whose nearest
 * mapping is farthest from s. Slots near each other serve blocks of the same
 * step, alive together; a chunk taken from far away is less likely to be
 * wanted back while s holds it (on the recorded traces: half the remaps of
 * taking simply the oldest). The oldest if none is ready. */
static int32_t pick_cached_chunk(const gml_allocator *a, uint32_t s, gml_stream stream) {
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
int32_t gmli_policy_chunk_for_slot(const gml_allocator *a, uint32_t s, gml_stream stream) {
  if (a->lists[GML_CL_FRESH].count) return a->lists[GML_CL_FRESH].head;
  return pick_cached_chunk(a, s, stream);
}

/* ---------- trim ---------- */

/* Free chunks mapped nowhere go first, then mapped ones, freed longest ago
 * first (each is unmapped from every slot once the device is done). */
int32_t gmli_policy_trim_next(const gml_allocator *a) {
  if (a->lists[GML_CL_FRESH].count) return a->lists[GML_CL_FRESH].head;
  return a->lists[GML_CL_CACHED].count ? a->lists[GML_CL_CACHED].head : -1;
}

int gmli_policy_trim_reaches_mapped(const gml_allocator *a, size_t max_chunks) {
  return a->lists[GML_CL_FRESH].count < max_chunks && a->lists[GML_CL_CACHED].count;
}
