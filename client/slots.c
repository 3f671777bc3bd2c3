/* slots.c: the allocator's mechanism for physical chunks: leasing them from
 * the source, mapping them into slots (and unmapping, and rolling a failed
 * run back), giving them back, and the stream fences and harvest that say
 * when the device is done with what was freed, the waits that order a
 * borrowing stream after its lender, and guard mode's guards. Which chunk
 * goes where is policy.c's; this file carries it out and keeps every slot
 * consistent. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "policy.h"
#include "slots.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------- slot mappings ---------- */

/* Record that slot s now maps chunk ci (the backend call is done). */
static void slot_link(gml_allocator *a, uint32_t s, int32_t ci) {
  gml_pchunk *c = &a->chunks[ci];
  a->slot_chunk[s] = ci;
  a->slot_aprev[s] = -1;
  a->slot_anext[s] = c->maps_head;
  if (c->maps_head >= 0) a->slot_aprev[c->maps_head] = (int32_t)s;
  c->maps_head = (int32_t)s;
  c->nmaps++;
}

int gmli_slot_unmap(gml_allocator *a, uint32_t s) {
  int32_t ci = a->slot_chunk[s];
  int rc = a->be->ops->unmap(a->be, slot_addr(a, s), a->cs);
  if (rc) return rc;
  gml_pchunk *c = &a->chunks[ci];
  int32_t p = a->slot_aprev[s], n = a->slot_anext[s];
  if (p >= 0) a->slot_anext[p] = n;
  else c->maps_head = n;
  if (n >= 0) a->slot_aprev[n] = p;
  c->nmaps--;
  a->slot_chunk[s] = -1;
  a->slot_anext[s] = a->slot_aprev[s] = -1;
  a->unmaps++;
  if (c->shown_at == (int32_t)s) gmli_chunk_show(a, ci, c->maps_head); /* another slot mapping it, or none */
  if (c->list == GML_CL_CACHED && !c->nmaps) {
    clist_unlink(a, ci);
    clist_push(a, GML_CL_FRESH, ci);
  }
  return 0;
}

static void seg_event(gml_allocator *a, uintptr_t ev) {
  if (a->seg_ev_n == a->seg_ev_cap) {
    size_t ncap = a->seg_ev_cap ? a->seg_ev_cap * 2 : 256;
    uintptr_t *n = realloc(a->seg_ev, ncap * sizeof *n);
    if (!n) {
      a->seg_ev_lost++;
      return;
    }
    a->seg_ev = n;
    a->seg_ev_cap = ncap;
  }
  a->seg_ev[a->seg_ev_n++] = ev;
}

/* Where a snapshot shows chunk ci moves from one slot to another (or from
 * or to nowhere): an unmap of the old slot, a map of the new one, as
 * memory_viz replays them (the driver calls may have happened earlier: a
 * free chunk stays mapped in every slot it was mapped at). */
void gmli_chunk_show(gml_allocator *a, int32_t ci, int32_t s) {
  gml_pchunk *c = &a->chunks[ci];
  if (c->shown_at == s) return;
  if (a->seg_log && c->shown_at >= 0) seg_event(a, slot_addr(a, (uint32_t)c->shown_at));
  if (a->seg_log && s >= 0) seg_event(a, slot_addr(a, (uint32_t)s) | 1);
  c->shown_at = s;
}

void gmli_slots_unclaim(gml_allocator *a, uint32_t first, uint32_t last) {
  for (uint32_t s = first; s <= last; s++) {
    if (--a->slot_use[s]) continue;
    int32_t ci = a->slot_chunk[s];
    if (ci >= 0 && a->chunks[ci].owner == (int32_t)s) slot_release(a, s);
  }
}

/* ---------- fences: when is the device done with what was freed ---------- */

void gmli_fence_update(gml_allocator *a) {
  if (a->no_device_waits) return;
  if (a->fence_n) {
    for (int i = 0; i < a->fence_n; i++)
      if (a->be->ops->event_done(a->be, a->fence_ev[i]) != 1) return;
    for (int i = 0; i < a->fence_n; i++) a->be->ops->event_destroy(a->be, a->fence_ev[i]);
    a->fence_n = 0;
    if (a->fence_tick > a->safe_tick) a->safe_tick = a->fence_tick;
  }
  int n = a->nstreams_seen ? a->nstreams_seen : 1;
  for (int i = 0; i < n; i++) {
    gml_stream st = a->nstreams_seen ? a->streams_seen[i] : 0;
    if (a->be->ops->event_record(a->be, st, &a->fence_ev[a->fence_n])) {
      for (int k = 0; k < a->fence_n; k++) a->be->ops->event_destroy(a->be, a->fence_ev[k]);
      a->fence_n = 0; /* no fence: the caller falls back to a full synchronize */
      return;
    }
    a->fence_n++;
  }
  a->fence_tick = a->tick;
}

/* Make sure the device is done with everything released at or before
 * `tick`: the fence if it has passed, else a full synchronize. */
static int device_past(gml_allocator *a, uint64_t tick) {
  if (tick < a->safe_tick) return 0;
  if (a->no_device_waits) {
    snprintf(a->last_error, sizeof a->last_error,
             "memory freed on another stream is needed while a CUDA graph is captured");
    return GML_ENOMEM;
  }
  gmli_fence_update(a);
  if (tick < a->safe_tick) return 0;
  int rc = a->be->ops->synchronize(a->be);
  if (rc) return rc;
  a->safe_tick = a->tick + 1;
  a->syncs++;
  return 0;
}

/* Chunk ci, free but maybe still used by the stream that freed it, is to
 * serve `stream`: a fence past its free is enough; else, borrowing, a wait
 * on `stream` for that stream's work so far (the device orders them, the
 * CPU runs on); else a device synchronize. Fewer synchronizations, never
 * more chunks: the chunk is the one borrowing off would take. */
static int chunk_wait(gml_allocator *a, int32_t ci, gml_stream stream) {
  const gml_pchunk *c = &a->chunks[ci];
  if (chunk_ready_for(a, ci, stream)) return 0;
  if (!a->no_device_waits) gmli_fence_update(a);
  if (c->free_tick < a->safe_tick) return 0;
  int j = a->borrow && !a->no_device_waits && c->free_stream != GML_STREAM_MIXED ? stream_index(a, c->free_stream) : -1;
  if (j >= 0 && gmli_borrows_pending(a) < a->borrow_max && !gmli_order_after_slow(a, stream, j)) return 0;
  return device_past(a, c->free_tick);
}

/* ---------- chunks from and back to the source ---------- */

static int chunks_reserve(gml_allocator *a, size_t more) {
  if (a->chunks_used + more <= a->chunks_cap) return 0;
  size_t cap = GML_MAX(a->chunks_cap * 2, a->chunks_used + more);
  gml_pchunk *c = realloc(a->chunks, cap * sizeof *c);
  if (!c) return GML_ENOMEM;
  a->chunks = c;
  a->chunks_cap = cap;
  return 0;
}

/* got chunks from the source onto the fresh list (room reserved before). */
static void chunks_add(gml_allocator *a, const gml_phys *phys, const uint64_t *ids, size_t got) {
  for (size_t i = 0; i < got; i++) {
    int32_t ci;
    if (a->dead >= 0) {
      ci = a->dead;
      a->dead = a->chunks[ci].lnext;
    } else {
      ci = (int32_t)a->chunks_used++;
    }
    gml_pchunk *c = &a->chunks[ci];
    memset(c, 0, sizeof *c);
    c->phys = phys[i];
    c->id = ids[i];
    c->owner = c->maps_head = c->shown_at = -1;
    clist_push(a, GML_CL_FRESH, ci);
    a->held++;
  }
  a->chunks_acquired += (uint64_t)got;
}

/* Up to want chunks in one call to the source (the daemon streams a large
 * lease: one request, its replies imported as they come). */
int gmli_lease_chunks_slow(gml_allocator *a, size_t want, int optional) {
  if (a->limit_bytes && reserved_bytes(a) + want * a->cs > a->limit_bytes) return GML_ENOMEM;
  if (want > GML_LEASE_MAX) want = GML_LEASE_MAX;
  if (chunks_reserve(a, want)) return GML_ENOMEM;
  gml_phys phys_few[128], *phys = phys_few;
  uint64_t ids_few[128], *ids = ids_few;
  if (want > 128) {
    phys = malloc(want * sizeof *phys);
    ids = malloc(want * sizeof *ids);
    if (!phys || !ids) {
      free(phys), free(ids);
      return GML_ENOMEM;
    }
  }
  uint64_t t0 = gmli_now_ns();
  int got = a->src.acquire(a->src.ctx, want, optional, phys, ids);
  a->lease_ns[a->lease_calls++ % GML_ARRAY_LEN(a->lease_ns)] = gmli_now_ns() - t0;
  if (got > 0) chunks_add(a, phys, ids, (size_t)got);
  if (phys != phys_few) free(phys), free(ids);
  return got > 0 ? 0 : got < 0 ? got : GML_ENOMEM;
}

int gmli_chunk_give_back(gml_allocator *a, int32_t ci) {
  gml_pchunk *c = &a->chunks[ci];
  while (c->maps_head >= 0 && !gmli_slot_unmap(a, (uint32_t)c->maps_head)) {}
  if (c->maps_head >= 0) return GML_EBACKEND; /* the backend refused: keep it */
  clist_unlink(a, ci);
  a->src.release(a->src.ctx, 1, &c->phys, &c->id);
  c->list = GML_CL_DEAD;
  c->lnext = a->dead;
  a->dead = ci;
  a->held--;
  return 0;
}

/* ---------- mapping slots ---------- */

/* Access for the new mappings of slots [from, to); on failure they are
 * taken back (no slot may keep an inaccessible mapping) and it says why. */
static int access_run(gml_allocator *a, uint32_t from, uint32_t to) {
  uint64_t t0 = gmli_now_ns();
  int rc = a->be->ops->set_access(a->be, slot_addr(a, from), (size_t)(to - from) * a->cs, 0);
  a->access_ns += gmli_now_ns() - t0;
  if (!rc) {
    a->access_calls++;
    return 0;
  }
  for (uint32_t k = from; k < to; k++) {
    int32_t ci = a->slot_chunk[k];
    if (gmli_slot_unmap(a, k)) continue;
    a->chunks[ci].owner = -1;
    clist_push(a, a->chunks[ci].nmaps ? GML_CL_CACHED : GML_CL_FRESH, ci);
  }
  return rc;
}

/* Map chunk ci at slot s and make it the slot's own (the map call timed). */
static int map_chunk(gml_allocator *a, uint32_t s, int32_t ci) {
  uint64_t t0 = gmli_now_ns();
  int rc = a->be->ops->map(a->be, slot_addr(a, s), a->chunks[ci].phys);
  a->map_call_ns += gmli_now_ns() - t0;
  if (rc) return rc;
  chunk_own(a, ci, s);
  slot_link(a, s, ci);
  a->maps++;
  return 0;
}

/* A streamed lease mapped as it comes (GMLAKE_STREAM_MAP): each batch of
 * fresh chunks goes to the next slots of the range that map nothing, while
 * the source brings (and imports) the next batch on its own thread. */
typedef struct stream_map {
  gml_allocator *a;
  uint32_t s, last; /* the next slot to look at, the range's last */
  int rc;
} stream_map;

static void stream_got(void *arg, const gml_phys *phys, const uint64_t *ids, size_t k) {
  stream_map *m = arg;
  gml_allocator *a = m->a;
  chunks_add(a, phys, ids, k);
  uint32_t run = UINT32_MAX, s = m->s;
  for (; !m->rc && s <= m->last && a->lists[GML_CL_FRESH].count; s++) {
    if (a->slot_chunk[s] >= 0) { /* its own chunk, or another slot's mapped here: the main loop's */
      if (run != UINT32_MAX) m->rc = access_run(a, run, s), run = UINT32_MAX;
      continue;
    }
    int rc = map_chunk(a, s, a->lists[GML_CL_FRESH].head);
    if (rc) {
      m->rc = rc;
      break;
    }
    if (run == UINT32_MAX) run = s;
  }
  if (run != UINT32_MAX) {
    int rc = access_run(a, run, s);
    if (!m->rc) m->rc = rc;
  }
  m->s = s;
}

/* need slots of [first, last] map nothing and no chunk is free: lease them
 * streamed, mapping as they come. What is left unmapped (fewer came, a slot
 * mapped another's chunk) the main loop does. */
static int map_streamed(gml_allocator *a, uint32_t first, uint32_t last, size_t need) {
  if (a->limit_bytes && reserved_bytes(a) + need * a->cs > a->limit_bytes) return GML_ENOMEM;
  if (need > GML_LEASE_MAX) need = GML_LEASE_MAX;
  if (chunks_reserve(a, need)) return GML_ENOMEM;
  stream_map m = {a, first, last, 0};
  uint64_t t0 = gmli_now_ns();
  int got = a->src.acquire_stream(a->src.ctx, need, stream_got, &m);
  a->lease_ns[a->lease_calls++ % GML_ARRAY_LEN(a->lease_ns)] = gmli_now_ns() - t0;
  return m.rc ? m.rc : got < 0 ? got : 0;
}

/* Give chunks to every slot of [first, last] that has none of its own: a
 * free chunk mapped there already (waiting for the device if another stream
 * freed it), else the free chunk gmli_policy_chunk_for_slot picks, leasing
 * what gmli_policy_lease plans (too few free, then headroom).
 * A slot still mapping a chunk that is owned elsewhere is unmapped first.
 * New mappings get their access set in runs. On failure every slot is
 * consistent and nothing is lost: the caller unclaims the range. */
int gmli_map_slots_slow(gml_allocator *a, uint32_t first, uint32_t last, gml_stream stream, int *stole) {
  size_t need = 0;
  for (uint32_t s = first; s <= last; s++) {
    int32_t ci = a->slot_chunk[s];
    if (ci >= 0 && a->chunks[ci].owner == (int32_t)s) { /* joined a used slot: ready for this stream? (slot_claim) */
      int rc = chunk_wait(a, ci, stream);
      if (rc) return rc;
      continue;
    }
    if (ci >= 0 && a->chunks[ci].owner < 0) { /* free here, not ready for this stream yet */
      int rc = chunk_wait(a, ci, stream);
      if (rc) return rc;
      chunk_own(a, ci, s);
      continue;
    }
    need++;
  }
  if (!need) return 0;
  if (a->stream_map && a->src.acquire_stream && !a->no_grow && need > 128 && !free_chunks(a)) {
    int rc = map_streamed(a, first, last, need);
    if (rc) return rc;
    need = 0;
    for (uint32_t s = first; s <= last; s++)
      need += a->slot_chunk[s] < 0 || a->chunks[a->slot_chunk[s]].owner != (int32_t)s;
    if (!need) return 0;
  }
  gml_lease_plan lp;
  while ((lp = gmli_policy_lease(a, need)).chunks && !lp.optional) {
    if (a->no_grow) return GML_EAGAIN;
    int rc = gmli_lease_chunks_slow(a, lp.chunks, 0);
    if (rc) return rc;
  }
  if (lp.chunks) { /* headroom: a no leaves the request to the free chunks */
    size_t fresh = a->lists[GML_CL_FRESH].count;
    if (gmli_lease_chunks_slow(a, lp.chunks, 1) == 0) a->headroom_leased += a->lists[GML_CL_FRESH].count - fresh;
    else a->headroom_retry_tick = lp.retry_tick;
  }
  uint32_t run_start = UINT32_MAX;
  for (uint32_t s = first; s <= last + 1; s++) {
    int mapped_now = 0;
    if (s <= last && (a->slot_chunk[s] < 0 || a->chunks[a->slot_chunk[s]].owner != (int32_t)s)) {
      int rc;
      if (a->slot_chunk[s] >= 0) { /* maps a chunk another slot owns now */
        if ((rc = device_past(a, a->slot_idle_tick[s])) || (rc = gmli_slot_unmap(a, s))) return rc;
      }
      int32_t ci = gmli_policy_chunk_for_slot(a, s, stream);
      int cached = a->chunks[ci].list == GML_CL_CACHED;
      if ((cached && (rc = chunk_wait(a, ci, stream))) || (rc = map_chunk(a, s, ci))) return rc;
      *stole |= cached;
      mapped_now = 1;
      if (run_start == UINT32_MAX) run_start = s;
    }
    if (!mapped_now && run_start != UINT32_MAX) {
      int rc = access_run(a, run_start, s);
      if (rc) return rc;
      run_start = UINT32_MAX;
    }
  }
  return 0;
}

/* ---------- streams: harvest ---------- */

/* Only runs when a request found no fit (or one needing driver calls). */
int gmli_harvest_streams_slow(gml_allocator *a, gml_region *r) {
  int moved = 0;
  if (a->no_device_waits) return 0;
  for (int pi = 1; pi <= GML_MAX_STREAMS; pi++) {
    gml_pool *p = &r->pools[pi];
    if (!p->used || !p->count) continue;
    /* collect first: moving changes the tree */
    size_t n = p->count;
    int k = 0;
    gml_block **list = malloc(n * sizeof *list);
    if (!list) return moved;
    gmli_treap_collect_ge(p->root, 0, list, &k, (int)n);
    for (int i = 0; i < k; i++) {
      gml_block *b = list[i];
      if (!b->has_event) {
        /* work queued on the stream so far covers every use of the block */
        if (a->be->ops->event_record(a->be, p->stream, &b->event)) continue;
        b->has_event = 1;
      }
      if (a->be->ops->event_done(a->be, b->event) != 1) continue;
      a->be->ops->event_destroy(a->be, b->event);
      b->has_event = 0;
      gmli_pool_del(r, b);
      b->pool = 0;
      b->stream = 0;
      b->lent = 1, b->lender = p->stream; /* counted as a borrow if it serves another stream */
      b = gmli_block_coalesce(a, r, b);
      gmli_pool_add(r, 0, b);
      moved++;
    }
    free(list);
  }
  return moved;
}

/* ---------- cross-stream borrowing: ordering a stream after another ---------- */

int gmli_borrows_pending(gml_allocator *a) {
  int k = 0;
  for (int i = 0; i < a->borrow_nev; i++) {
    if (a->be->ops->event_done(a->be, a->borrow_ev[i]) == 1) a->be->ops->event_destroy(a->be, a->borrow_ev[i]);
    else a->borrow_ev[k++] = a->borrow_ev[i];
  }
  return a->borrow_nev = k;
}

/* The event covers every free stream j made so far (they were enqueued
 * before it); once `stream` waits for it, chunks j freed up to this tick
 * are ready for `stream` too (ordered[][], chunk_ready_for). An event done
 * already needs no wait. */
int gmli_order_after_slow(gml_allocator *a, gml_stream stream, int j) {
  int i = stream_index(a, stream);
  uintptr_t ev;
  if (i < 0 || !a->be->ops->stream_wait_event || a->borrow_nev >= GML_BORROW_MAX_CAP ||
      a->be->ops->event_record(a->be, a->streams_seen[j], &ev))
    return GML_EBACKEND;
  if (a->be->ops->event_done(a->be, ev) == 1) {
    a->be->ops->event_destroy(a->be, ev);
  } else {
    if (a->be->ops->stream_wait_event(a->be, stream, ev)) { /* e.g. a stream being captured into a graph */
      a->be->ops->event_destroy(a->be, ev);
      return GML_EBACKEND;
    }
    a->borrow_ev[a->borrow_nev++] = ev;
    a->borrow_waits++;
  }
  if (a->ordered[i][j] < a->tick) a->ordered[i][j] = a->tick;
  for (int k = 0; k < a->nstreams_seen; k++) /* j's own waits so far come with it */
    if (k != i && a->ordered[j][k] > a->ordered[i][k]) a->ordered[i][k] = a->ordered[j][k];
  a->any_ordered = 1;
  return 0;
}

int gmli_take_ordered_slow(gml_allocator *a, gml_region *r, int pi, gml_stream stream) {
  int i = stream_index(a, stream), moved = 0;
  if (i < 0 || pi <= 0) return 0;
  for (int pj = 1; pj <= GML_MAX_STREAMS; pj++) {
    gml_pool *p = &r->pools[pj];
    int j, k = 0;
    if (pj == pi || !p->used || !p->count || (j = stream_index(a, p->stream)) < 0 || !a->ordered[i][j]) continue;
    gml_block **list = malloc(p->count * sizeof *list); /* collect first: moving changes the tree */
    if (!list) return moved;
    gmli_treap_collect_ge(p->root, 0, list, &k, (int)p->count);
    for (int n = 0; n < k; n++) {
      gml_block *b = list[n];
      if (b->free_tick > a->ordered[i][j]) continue; /* freed after the wait */
      if (b->has_event)
        a->be->ops->event_destroy(a->be, b->event); /* recorded on j: the next harvest records on `stream` */
      b->has_event = 0;
      gmli_pool_del(r, b);
      b->stream = stream;
      b->lent = 1, b->lender = p->stream;
      b->free_tick = a->tick; /* `stream`'s from now: a stream ordered after it up to an earlier tick is not after j */
      b->pool = (uint8_t)pi;
      gmli_pool_add(r, pi, gmli_block_coalesce(a, r, b));
      moved++;
    }
    free(list);
  }
  return moved;
}

/* ---------- guard mode ---------- */

/* Whole-slot guards: unmap whatever an earlier block left mapped there,
 * once the device is done with it; nothing maps them while b lives (no
 * other block touches them, and b does not claim them). Page guards: the
 * backend protects them; b claims their slots, so no remap undoes that. */
int gmli_guards_set(gml_allocator *a, gml_block *b, int on) {
  size_t g = a->guard_grain;
  uintptr_t back = b->ptr + b->usable, front = guard_data_start(a, b->addr) - g;
  int both = a->guard == GML_GUARD_BOTH;
  if (g == a->cs) {
    for (int k = 0; on && k < 1 + both; k++) {
      uint32_t s = slot_of(a, k ? front : back);
      int rc;
      if (a->slot_chunk[s] >= 0 && ((rc = device_past(a, a->slot_idle_tick[s])) || (rc = gmli_slot_unmap(a, s))))
        return rc;
    }
    return 0;
  }
  int rc = a->be->ops->protect(a->be, back, g, !on);
  if (!rc && both && (rc = a->be->ops->protect(a->be, front, g, !on)) && on) a->be->ops->protect(a->be, back, g, 1);
  return rc;
}
