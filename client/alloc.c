/* alloc.c: the stitching caching allocator. See alloc.h for the layout.
 * Fast path (a cached block fits): one tree search, maybe one split, slot
 * use counts, a hash insert. Slow path (alloc_map_slots_slow): find chunks
 * for unbacked slots, from idle slots elsewhere (stitching), else the source. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "alloc.h"
#include "log.h"
#include "util.h"
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
};

/* ---------- block structs ---------- */

static gml_block *block_new(gml_allocator *a) {
  gml_block *b = a->spare;
  if (b) a->spare = b->next;
  else b = malloc(sizeof *b);
  if (!b) return NULL;
  memset(b, 0, sizeof *b);
  a->rng = a->rng * 6364136223846793005ull + 1442695040888963407ull;
  b->prio = (uint32_t)(a->rng >> 33);
  return b;
}

/* b was merged away: its struct goes to the spare list. */
static void block_put(gml_allocator *a, gml_block *b) {
  b->next = a->spare;
  a->spare = b;
}

/* ---------- treap of free blocks, keyed (size, addr) ---------- */

#define L(n) (n)->kid[0]
#define R(n) (n)->kid[1]

static inline int key_less(const gml_block *x, const gml_block *y) {
  return x->size < y->size || (x->size == y->size && x->addr < y->addr);
}

static gml_block *treap_insert(gml_block *root, gml_block *b) {
  if (!root) {
    L(b) = R(b) = NULL;
    return b;
  }
  int side = !key_less(b, root);
  gml_block *c = root->kid[side] = treap_insert(root->kid[side], b);
  if (c->prio > root->prio) { /* rotate c up */
    root->kid[side] = c->kid[!side];
    c->kid[!side] = root;
    return c;
  }
  return root;
}

static gml_block *treap_merge(gml_block *l, gml_block *r) {
  if (!l) return r;
  if (!r) return l;
  if (l->prio > r->prio) {
    R(l) = treap_merge(R(l), r);
    return l;
  }
  L(r) = treap_merge(l, L(r));
  return r;
}

static gml_block *treap_remove(gml_block *root, gml_block *b) {
  if (!root) return NULL;
  if (root == b) return treap_merge(L(b), R(b));
  if (key_less(b, root)) L(root) = treap_remove(L(root), b);
  else R(root) = treap_remove(R(root), b);
  return root;
}

static void treap_collect_ge(gml_block *n, size_t want, gml_block **out, int *k, int max) {
  if (!n || *k >= max) return;
  if (n->size >= want) treap_collect_ge(L(n), want, out, k, max);
  if (*k >= max) return;
  if (n->size >= want) out[(*k)++] = n;
  treap_collect_ge(R(n), want, out, k, max);
}

/* Smallest (size, addr) with size >= want. */
static gml_block *treap_best_fit(gml_block *root, size_t want) {
  gml_block *best = NULL;
  while (root) {
    if (root->size >= want) {
      best = root;
      root = L(root);
    } else {
      root = R(root);
    }
  }
  return best;
}

#undef L
#undef R

/* ---------- pools (one free tree per stream, [0] = any stream) ---------- */

static int pool_index(gml_allocator *a, gml_region *r, gml_stream s, int create) {
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

static void pool_add(gml_region *r, int pi, gml_block *b) {
  b->pool = (uint8_t)pi;
  r->pools[pi].root = treap_insert(r->pools[pi].root, b);
  r->pools[pi].count++;
}

static void pool_del(gml_region *r, gml_block *b) {
  gml_pool *p = &r->pools[b->pool];
  p->root = treap_remove(p->root, b);
  p->count--;
}

/* ---------- pointer map: open addressing, backward-shift deletion ---------- */

static inline size_t ptr_hash(uintptr_t k, size_t cap) { return (size_t)((k >> 9) * 0x9E3779B97F4A7C15ull) & (cap - 1); }

static int ptrmap_grow(gml_ptrmap *m) {
  size_t ncap = m->cap ? m->cap * 2 : 1024;
  uintptr_t *nk = calloc(ncap, sizeof *nk);
  gml_block **nv = calloc(ncap, sizeof *nv);
  if (!nk || !nv) {
    free(nk), free(nv);
    return GML_ENOMEM;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = ptr_hash(m->keys[i], ncap);
    while (nk[j]) j = (j + 1) & (ncap - 1);
    nk[j] = m->keys[i];
    nv[j] = m->vals[i];
  }
  free(m->keys), free(m->vals);
  m->keys = nk, m->vals = nv, m->cap = ncap;
  return 0;
}

static int ptrmap_put(gml_ptrmap *m, uintptr_t k, gml_block *v) {
  if ((m->count + 1) * 2 > m->cap && ptrmap_grow(m)) return GML_ENOMEM;
  size_t j = ptr_hash(k, m->cap);
  while (m->keys[j]) j = (j + 1) & (m->cap - 1);
  m->keys[j] = k;
  m->vals[j] = v;
  m->count++;
  return 0;
}

static gml_block *ptrmap_take(gml_ptrmap *m, uintptr_t k, int remove) {
  if (!m->cap) return NULL;
  size_t j = ptr_hash(k, m->cap);
  while (m->keys[j] && m->keys[j] != k) j = (j + 1) & (m->cap - 1);
  if (!m->keys[j]) return NULL;
  gml_block *v = m->vals[j];
  if (!remove) return v;
  m->count--;
  /* backward shift: keep every later key of the cluster reachable */
  size_t hole = j;
  for (size_t i = (j + 1) & (m->cap - 1); m->keys[i]; i = (i + 1) & (m->cap - 1)) {
    size_t home = ptr_hash(m->keys[i], m->cap);
    if (((i - home) & (m->cap - 1)) >= ((i - hole) & (m->cap - 1))) {
      m->keys[hole] = m->keys[i];
      m->vals[hole] = m->vals[i];
      hole = i;
    }
  }
  m->keys[hole] = 0;
  m->vals[hole] = NULL;
  return v;
}

/* ---------- chunks, their free lists, and slot mappings ---------- */

static inline uint32_t slot_of(gml_allocator *a, uintptr_t addr) { return (uint32_t)((addr - a->va_base) / a->cs); }
static inline uintptr_t slot_addr(gml_allocator *a, uint32_t s) { return a->va_base + (uintptr_t)s * a->cs; }

static inline uint64_t reserved_bytes(gml_allocator *a) { return (uint64_t)a->held * a->cs; }
static inline size_t free_chunks(gml_allocator *a) { return a->lists[GML_CL_FRESH].count + a->lists[GML_CL_CACHED].count; }

static void clist_push(gml_allocator *a, int l, int32_t ci) {
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

static void clist_unlink(gml_allocator *a, int32_t ci) {
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

/* Free chunk ci becomes owned by slot s. */
static inline void chunk_own(gml_allocator *a, int32_t ci, uint32_t s) {
  clist_unlink(a, ci);
  a->chunks[ci].owner = (int32_t)s;
}

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

/* Unmap slot s (no live block touches it, nor will the device again). */
static int slot_unmap(gml_allocator *a, uint32_t s) {
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
  if (c->list == GML_CL_CACHED && !c->nmaps) {
    clist_unlink(a, ci);
    clist_push(a, GML_CL_FRESH, ci);
  }
  return 0;
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
static inline int chunk_ready_for(gml_allocator *a, int32_t ci, gml_stream stream) {
  gml_pchunk *c = &a->chunks[ci];
  return c->free_stream == stream || c->free_tick < a->safe_tick; /* MIXED matches no stream */
}

/* Slot s becomes touched by a block on `stream`: take its mapped chunk if
 * that is free and ready. Returns 1 if the slot still needs a chunk. */
static inline int slot_claim(gml_allocator *a, uint32_t s, gml_stream stream) {
  if (a->slot_use[s]++) {
    if (a->slot_stream[s] != stream) a->slot_stream[s] = GML_STREAM_MIXED;
    return 0;
  }
  a->slot_stream[s] = stream;
  int32_t ci = a->slot_chunk[s];
  if (ci >= 0 && a->chunks[ci].owner < 0 && chunk_ready_for(a, ci, stream)) {
    chunk_own(a, ci, s);
    return 0;
  }
  return 1;
}

/* Undo slot_claim for slots [first, last] after a failed request. */
static void slots_unclaim(gml_allocator *a, uint32_t first, uint32_t last) {
  for (uint32_t s = first; s <= last; s++) {
    if (--a->slot_use[s]) continue;
    int32_t ci = a->slot_chunk[s];
    if (ci >= 0 && a->chunks[ci].owner == (int32_t)s) slot_release(a, s);
  }
}

static int chunks_reserve(gml_allocator *a, size_t more) {
  if (a->chunks_used + more <= a->chunks_cap) return 0;
  size_t cap = GML_MAX(a->chunks_cap * 2, a->chunks_used + more);
  gml_pchunk *c = realloc(a->chunks, cap * sizeof *c);
  if (!c) return GML_ENOMEM;
  a->chunks = c;
  a->chunks_cap = cap;
  return 0;
}

/* Poll the fence; arm a new one when none is pending. */
static void fence_update(gml_allocator *a) {
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
  fence_update(a);
  if (tick < a->safe_tick) return 0;
  int rc = a->be->ops->synchronize(a->be);
  if (rc) return rc;
  a->safe_tick = a->tick + 1;
  a->syncs++;
  return 0;
}

/* New chunks from the source onto the fresh list. */
static int lease_chunks_slow(gml_allocator *a, size_t want, int optional) {
  if (a->limit_bytes && reserved_bytes(a) + want * a->cs > a->limit_bytes) return GML_ENOMEM;
  if (want > 128) want = 128;
  if (chunks_reserve(a, want)) return GML_ENOMEM;
  gml_phys phys[128];
  uint64_t ids[128];
  uint64_t t0 = gml_now_ns();
  int got = a->src.acquire(a->src.ctx, want, optional, phys, ids);
  a->lease_ns[a->lease_calls++ % GML_ARRAY_LEN(a->lease_ns)] = gml_now_ns() - t0;
  if (got <= 0) return got < 0 ? got : GML_ENOMEM;
  for (int i = 0; i < got; i++) {
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
    c->owner = c->maps_head = -1;
    clist_push(a, GML_CL_FRESH, ci);
    a->held++;
  }
  a->chunks_acquired += (uint64_t)got;
  return 0;
}

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

/* Give chunks to every slot of [first, last] that has none of its own: a
 * free chunk mapped there already (waiting for the device if another stream
 * freed it), else a free chunk from anywhere (fresh ones first, leased as
 * headroom if need be, then pick_cached_chunk's), else a new one. A slot
 * still mapping a chunk that is owned elsewhere is unmapped first. New
 * mappings get their access set in runs. On failure every slot is consistent
 * and nothing is lost: the caller unclaims the range. */
static int map_slots_slow(gml_allocator *a, uint32_t first, uint32_t last, gml_stream stream, int *stole) {
  size_t need = 0;
  for (uint32_t s = first; s <= last; s++) {
    int32_t ci = a->slot_chunk[s];
    if (ci >= 0 && a->chunks[ci].owner == (int32_t)s) continue;
    if (ci >= 0 && a->chunks[ci].owner < 0) { /* free here, not ready for this stream yet */
      int rc = device_past(a, a->chunks[ci].free_tick);
      if (rc) return rc;
      chunk_own(a, ci, s);
      continue;
    }
    need++;
  }
  if (!need) return 0;
  while (free_chunks(a) < need) {
    int rc = lease_chunks_slow(a, need - free_chunks(a), 0);
    if (rc) return rc;
  }
  /* Headroom: rather than take a free chunk that is mapped elsewhere (whose
   * layout then breaks when it comes back), lease fresh ones while the held
   * bytes stay within headroom_pct of the peak allocated. Best effort: at
   * the limit, or if the source says no, the free chunks serve; after a no,
   * the source is not asked again for GML_HEADROOM_BACKOFF operations (each
   * ask is a daemon round trip). */
  size_t fresh = a->lists[GML_CL_FRESH].count;
  if (fresh < need && a->headroom_pct > 0 && a->tick >= a->headroom_retry_tick) {
    uint64_t cap = a->peak_allocated + (uint64_t)((double)a->peak_allocated * a->headroom_pct / 100), held = reserved_bytes(a);
    size_t room = cap > held ? (size_t)((cap - held) / a->cs) : 0, want = GML_MIN(need - fresh, room);
    if (want && lease_chunks_slow(a, want, 1) == 0) a->headroom_leased += a->lists[GML_CL_FRESH].count - fresh;
    else if (want) a->headroom_retry_tick = a->tick + GML_HEADROOM_BACKOFF;
  }
  uint32_t run_start = UINT32_MAX;
  for (uint32_t s = first; s <= last + 1; s++) {
    int mapped_now = 0;
    if (s <= last && (a->slot_chunk[s] < 0 || a->chunks[a->slot_chunk[s]].owner != (int32_t)s)) {
      int rc;
      if (a->slot_chunk[s] >= 0) { /* maps a chunk another slot owns now */
        if ((rc = device_past(a, a->slot_idle_tick[s])) || (rc = slot_unmap(a, s))) return rc;
      }
      int l = a->lists[GML_CL_FRESH].count ? GML_CL_FRESH : GML_CL_CACHED;
      int32_t ci = l == GML_CL_FRESH ? a->lists[l].head : pick_cached_chunk(a, s, stream);
      if (l == GML_CL_CACHED && !chunk_ready_for(a, ci, stream) && (rc = device_past(a, a->chunks[ci].free_tick)))
        return rc;
      if ((rc = a->be->ops->map(a->be, slot_addr(a, s), a->chunks[ci].phys))) return rc;
      chunk_own(a, ci, s);
      slot_link(a, s, ci);
      a->maps++;
      *stole |= l == GML_CL_CACHED;
      mapped_now = 1;
      if (run_start == UINT32_MAX) run_start = s;
    }
    if (!mapped_now && run_start != UINT32_MAX) {
      int rc = a->be->ops->set_access(a->be, slot_addr(a, run_start), (size_t)(s - run_start) * a->cs);
      if (rc) { /* take the run's new mappings back: no slot may keep an inaccessible one */
        for (uint32_t k = run_start; k < s; k++) {
          int32_t ci = a->slot_chunk[k];
          if (slot_unmap(a, k)) continue;
          a->chunks[ci].owner = -1;
          clist_push(a, a->chunks[ci].nmaps ? GML_CL_CACHED : GML_CL_FRESH, ci);
        }
        return rc;
      }
      a->access_calls++;
      run_start = UINT32_MAX;
    }
  }
  return 0;
}

/* ---------- blocks in regions ---------- */

static inline gml_region *region_for(gml_allocator *a, size_t size) { return &a->regions[size < GML_SMALL_LIMIT ? 0 : 1]; }

/* Merge b with free neighbours of the same pool; b is not in any tree. */
static gml_block *coalesce(gml_allocator *a, gml_region *r, gml_block *b) {
  gml_block *n = b->next;
  if (n && n->is_free && n->pool == b->pool) {
    pool_del(r, n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    if (n->has_event) a->be->ops->event_destroy(a->be, n->event);
    if (b->has_event) a->be->ops->event_destroy(a->be, b->event);
    b->has_event = 0; /* re-recorded at the next harvest: covers both */
    block_put(a, n);
  }
  gml_block *p = b->prev;
  if (p && p->is_free && p->pool == b->pool) {
    pool_del(r, p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    if (b->has_event) a->be->ops->event_destroy(a->be, b->event);
    if (p->has_event) a->be->ops->event_destroy(a->be, p->event);
    p->has_event = 0;
    block_put(a, b);
    b = p;
  }
  return b;
}

/* Move free blocks whose stream has passed them into the shared pool, so
 * other streams may use them. Only runs when a request found no fit. */
static int harvest_streams_slow(gml_allocator *a, gml_region *r) {
  int moved = 0;
  for (int pi = 1; pi <= GML_MAX_STREAMS; pi++) {
    gml_pool *p = &r->pools[pi];
    if (!p->used || !p->count) continue;
    /* collect first: moving changes the tree */
    size_t n = p->count;
    int k = 0;
    gml_block **list = malloc(n * sizeof *list);
    if (!list) return moved;
    treap_collect_ge(p->root, 0, list, &k, (int)n);
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
      pool_del(r, b);
      b->pool = 0;
      b->stream = 0;
      b = coalesce(a, r, b);
      pool_add(r, 0, b);
      moved++;
    }
    free(list);
  }
  return moved;
}

/* Would a block at [addr, addr + rsize) on `stream` need a driver call or
 * a wait: a slot it touches that no live block uses maps no chunk, or one
 * owned elsewhere, or a free chunk another stream may still be using? */
static int window_needs_calls(gml_allocator *a, uintptr_t addr, size_t rsize, gml_stream stream) {
  for (uint32_t s = slot_of(a, addr), last = slot_of(a, addr + rsize - 1); s <= last; s++) {
    if (a->slot_use[s]) continue;
    int32_t ci = a->slot_chunk[s];
    if (ci < 0 || a->chunks[ci].owner >= 0 || !chunk_ready_for(a, ci, stream)) return 1;
  }
  return 0;
}

static gml_block *find_fit(gml_allocator *a, gml_region *r, int pi, size_t size) {
  gml_block *b = pi > 0 ? treap_best_fit(r->pools[pi].root, size) : NULL;
  gml_block *c = treap_best_fit(r->pools[0].root, size);
  if (!b || (c && c->size < b->size)) b = c;
  (void)a;
  return b;
}

static void format_oom(gml_allocator *a, size_t size, int rc) {
  char s1[32], s2[32], s3[32], s4[32];
  snprintf(a->last_error, sizeof a->last_error,
           "out of memory: asked %s, allocated %s, cached %s, held %s%s%s", gml_format_bytes(size, s1, sizeof s1),
           gml_format_bytes(a->allocated, s2, sizeof s2), gml_format_bytes(reserved_bytes(a) - a->allocated, s3, sizeof s3),
           gml_format_bytes(reserved_bytes(a), s4, sizeof s4), rc == GML_EQUOTA ? " (quota reached)" : "",
           rc == GML_EDAEMON ? " (daemon gone)" : "");
}

/* Cut free block b (in no tree) at offset `at`: b keeps the front, the
 * returned free block (in no tree yet) the rest; NULL if out of memory. */
static gml_block *block_split(gml_allocator *a, gml_block *b, size_t at) {
  gml_block *n = block_new(a);
  if (!n) return NULL;
  n->addr = b->addr + at;
  n->size = b->size - at;
  n->region = b->region;
  n->is_free = 1;
  n->stream = b->stream;
  n->pool = b->pool;
  n->prev = b;
  n->next = b->next;
  if (b->next) b->next->prev = n;
  b->next = n;
  b->size = at;
  return n;
}

int gml_alloc_malloc(gml_allocator *a, size_t size, gml_stream stream, void **ptr) {
  if (!size || size > (a->va_size >> 1)) {
    snprintf(a->last_error, sizeof a->last_error, "invalid size %zu", size);
    return size ? GML_ENOMEM : GML_EINVAL;
  }
  size_t rsize = gml_round_up(size, GML_ALIGN);
  pthread_mutex_lock(&a->lock);
  a->tick++;
  gml_region *r = region_for(a, rsize);
  int pi = pool_index(a, r, stream, 1);
  /* Always the best fit, whatever its slots map: placement that depends only
   * on sizes and order lays a repeated step out as before, so its slots find
   * their chunks again; placement chasing mapped chunks takes chunks other
   * layouts need and never settles (BENCHMARKS.md, session 4). */
  gml_block *b = find_fit(a, r, pi, rsize);
  /* other streams' free blocks whose work is done join the shared pool when
   * none fits, or the fit would need driver calls */
  if ((!b || (a->nstreams_seen > 1 && window_needs_calls(a, b->addr, rsize, stream))) && harvest_streams_slow(a, r))
    b = find_fit(a, r, pi, rsize);
  if (!b) {
    format_oom(a, size, GML_ENOMEM);
    snprintf(a->last_error + strlen(a->last_error), sizeof a->last_error - strlen(a->last_error),
             " (virtual range of the %s region exhausted)", r == &a->regions[0] ? "small" : "large");
    a->ooms++;
    pthread_mutex_unlock(&a->lock);
    return GML_ENOMEM;
  }
  pool_del(r, b);
  /* Claim the slots first, so that stitching cannot take their chunks. */
  uint32_t first = slot_of(a, b->addr), last = slot_of(a, b->addr + rsize - 1);
  size_t need = 0;
  for (uint32_t s = first; s <= last; s++) need += (size_t)slot_claim(a, s, stream);
  int stole = 0;
  if (need) {
    GML_DEBUG("map: size %zu needs %zu of %u slots (free chunks %zu, tick %llu)", rsize, need, last - first + 1,
              free_chunks(a), (unsigned long long)a->tick);
    uint64_t t0 = gml_now_ns();
    a->mapped_allocs++;
    int rc = map_slots_slow(a, first, last, stream, &stole);
    a->map_ns += gml_now_ns() - t0;
    if (rc) {
      slots_unclaim(a, first, last);
      pool_add(r, b->pool, coalesce(a, r, b));
      format_oom(a, size, rc);
      a->ooms++;
      pthread_mutex_unlock(&a->lock);
      GML_DEBUG("%s", a->last_error);
      return rc == GML_EQUOTA || rc == GML_EDAEMON || rc == GML_EBACKEND ? rc : GML_ENOMEM;
    }
  }
  if (b->size - rsize >= GML_ALIGN) {
    gml_block *rest = block_split(a, b, rsize);
    if (rest) pool_add(r, b->pool, rest);
  }
  if (b->has_event) {
    a->be->ops->event_destroy(a->be, b->event);
    b->has_event = 0;
  }
  b->is_free = 0;
  b->stream = stream;
  b->stitched = (uint8_t)stole;
  if (ptrmap_put(&a->live, b->addr, b)) {
    /* undo: cannot track it, so it must not be handed out */
    slots_unclaim(a, first, last);
    b->is_free = 1;
    pool_add(r, b->pool, coalesce(a, r, b));
    pthread_mutex_unlock(&a->lock);
    return GML_ENOMEM;
  }
  a->allocated += b->size;
  if (b->stitched) a->stitched += b->size;
  if (a->allocated > a->peak_allocated) a->peak_allocated = a->allocated;
  if (reserved_bytes(a) > a->peak_reserved) a->peak_reserved = reserved_bytes(a);
  a->alloc_count++;
  *ptr = (void *)b->addr;
  pthread_mutex_unlock(&a->lock);
  return 0;
}

int gml_alloc_free(gml_allocator *a, void *ptr) {
  pthread_mutex_lock(&a->lock);
  gml_block *b = ptrmap_take(&a->live, (uintptr_t)ptr, 1);
  if (!b) {
    snprintf(a->last_error, sizeof a->last_error, "free of %p: not a live block of this client", ptr);
    pthread_mutex_unlock(&a->lock);
    return GML_EBADPTR;
  }
  gml_region *r = &a->regions[b->region];
  uint32_t first = slot_of(a, b->addr), last = slot_of(a, b->addr + b->size - 1);
  a->tick++;
  for (uint32_t s = first; s <= last; s++)
    if (--a->slot_use[s] == 0) slot_release(a, s);
  if ((a->free_count & 255) == 0) fence_update(a); /* keep a recent fence: remaps then need no synchronize */
  a->allocated -= b->size;
  if (b->stitched) a->stitched -= b->size;
  a->free_count++;
  b->is_free = 1;
  b->pool = (uint8_t)pool_index(a, r, b->stream, 1);
  b->has_event = 0;
  b = coalesce(a, r, b);
  pool_add(r, b->pool, b);
  pthread_mutex_unlock(&a->lock);
  return 0;
}

size_t gml_alloc_size_of(gml_allocator *a, void *ptr) {
  pthread_mutex_lock(&a->lock);
  gml_block *b = ptrmap_take(&a->live, (uintptr_t)ptr, 0);
  size_t n = b ? b->size : 0;
  pthread_mutex_unlock(&a->lock);
  return n;
}

size_t gml_alloc_release_idle(gml_allocator *a, size_t max_bytes) {
  pthread_mutex_lock(&a->lock);
  size_t max_chunks = max_bytes ? (max_bytes + a->cs - 1) / a->cs : SIZE_MAX;
  /* Free chunks mapped nowhere go first; mapped ones are unmapped from every
   * slot, once the device is done with them. */
  if (a->lists[GML_CL_FRESH].count < max_chunks && a->lists[GML_CL_CACHED].count) {
    if (a->be->ops->synchronize(a->be) == 0) a->safe_tick = a->tick + 1;
  }
  size_t released = 0;
  while (released < max_chunks && free_chunks(a)) {
    int l = a->lists[GML_CL_FRESH].count ? GML_CL_FRESH : GML_CL_CACHED;
    int32_t ci = a->lists[l].head;
    if (l == GML_CL_CACHED && a->chunks[ci].free_tick >= a->safe_tick) break; /* synchronize failed */
    gml_pchunk *c = &a->chunks[ci];
    while (c->maps_head >= 0 && !slot_unmap(a, (uint32_t)c->maps_head)) {
    }
    if (c->maps_head >= 0) break; /* the backend refused: keep it */
    clist_unlink(a, ci);
    a->src.release(a->src.ctx, 1, &c->phys, &c->id);
    c->list = GML_CL_DEAD;
    c->lnext = a->dead;
    a->dead = ci;
    a->held--;
    released++;
  }
  a->chunks_released += released;
  pthread_mutex_unlock(&a->lock);
  return released * a->cs;
}

void gml_alloc_stats(gml_allocator *a, gml_stats *st) {
  pthread_mutex_lock(&a->lock);
  memset(st, 0, sizeof *st);
  st->allocated = a->allocated;
  st->reserved = reserved_bytes(a);
  st->cached = st->reserved - a->allocated;
  st->stitched = a->stitched;
  st->largest_free = (uint64_t)free_chunks(a) * a->cs;
  st->peak_allocated = a->peak_allocated;
  st->peak_reserved = a->peak_reserved;
  st->alloc_count = a->alloc_count;
  st->free_count = a->free_count;
  st->chunks_leased = a->chunks_acquired;
  st->chunks_returned = a->chunks_released;
  st->maps = a->maps;
  st->syncs = a->syncs;
  st->unmaps = a->unmaps;
  st->access_calls = a->access_calls;
  st->mapped_allocs = a->mapped_allocs;
  st->headroom_leased = a->headroom_leased;
  st->map_ns = a->map_ns;
  st->malloc_ns = __atomic_load_n(&a->malloc_ns, __ATOMIC_RELAXED); /* added to outside the lock (client.c) */
  st->ooms = a->ooms;
  st->lease_calls = a->lease_calls;
  size_t nl = a->lease_calls < GML_ARRAY_LEN(a->lease_ns) ? a->lease_calls : GML_ARRAY_LEN(a->lease_ns);
  if (nl) {
    uint64_t tmp[GML_ARRAY_LEN(a->lease_ns)];
    memcpy(tmp, a->lease_ns, nl * sizeof tmp[0]);
    st->lease_p50_ns = (uint64_t)gml_percentile_u64(tmp, nl, 50);
    st->lease_p99_ns = (uint64_t)gml_percentile_u64(tmp, nl, 99);
  }
  st->fragmentation = st->reserved ? 1.0 - (double)st->allocated / (double)st->reserved : 0.0;
  st->chunk_size = a->cs;
  st->backend = a->be->name;
  pthread_mutex_unlock(&a->lock);
}

int gml_alloc_init(gml_allocator *a, gml_backend *be, gml_chunk_source src, size_t va_size) {
  memset(a, 0, sizeof *a);
  pthread_mutex_init(&a->lock, NULL);
  a->be = be;
  a->src = src;
  a->cs = be->chunk_size;
  a->va_size = gml_round_up(va_size, 8 * a->cs);
  a->rng = 0x2545F4914F6CDD1Dull;
  a->timing = getenv("GMLAKE_TIMING") && atoi(getenv("GMLAKE_TIMING")) > 0;
  a->headroom_pct = GML_DEFAULT_HEADROOM_PCT;
  const char *hr = getenv("GMLAKE_HEADROOM");
  if (hr && *hr) {
    char *end;
    double v = strtod(hr, &end);
    if (*end == '%') end++;
    if (*end || !(v >= 0 && v <= 100)) GML_WARN("GMLAKE_HEADROOM=%s: not a percentage from 0 to 100; using %g", hr, a->headroom_pct);
    else a->headroom_pct = v;
  }
  a->dead = -1;
  for (int l = 0; l < 3; l++) a->lists[l].head = a->lists[l].tail = -1;
  int rc = be->ops->va_reserve(be, a->va_size, &a->va_base);
  if (rc) return rc;
  a->nslots = (uint32_t)(a->va_size / a->cs);
  a->slot_chunk = malloc(a->nslots * sizeof *a->slot_chunk);
  a->slot_use = calloc(a->nslots, sizeof *a->slot_use);
  a->slot_idle_tick = calloc(a->nslots, sizeof *a->slot_idle_tick);
  a->slot_anext = malloc(a->nslots * sizeof *a->slot_anext);
  a->slot_aprev = malloc(a->nslots * sizeof *a->slot_aprev);
  a->slot_stream = calloc(a->nslots, sizeof *a->slot_stream);
  if (!a->slot_chunk || !a->slot_use || !a->slot_anext || !a->slot_aprev || !a->slot_idle_tick || !a->slot_stream) {
    gml_alloc_destroy(a);
    return GML_ENOMEM;
  }
  memset(a->slot_chunk, 0xff, a->nslots * sizeof *a->slot_chunk);
  memset(a->slot_anext, 0xff, a->nslots * sizeof *a->slot_anext);
  memset(a->slot_aprev, 0xff, a->nslots * sizeof *a->slot_aprev);
  size_t small = a->va_size / 8;
  for (int i = 0; i < 2; i++) {
    gml_region *r = &a->regions[i];
    r->base = a->va_base + (i ? small : 0);
    r->size = i ? a->va_size - small : small;
    r->first_slot = slot_of(a, r->base);
    gml_block *b = block_new(a);
    if (!b) {
      gml_alloc_destroy(a);
      return GML_ENOMEM;
    }
    b->addr = r->base;
    b->size = r->size;
    b->region = (uint8_t)i;
    b->is_free = 1;
    r->first = b;
    pool_add(r, 0, b);
  }
  return 0;
}

static void free_region_blocks(gml_allocator *a, gml_region *r) {
  for (gml_block *b = r->first, *n; b; b = n) {
    n = b->next;
    if (b->has_event) a->be->ops->event_destroy(a->be, b->event);
    free(b);
  }
  r->first = NULL;
}

int gml_alloc_check(gml_allocator *a) {
  pthread_mutex_lock(&a->lock);
  int bad = 0;
#define CHECK(cond, ...)                                                  \
  if (!bad && !(cond)) {                                                  \
    snprintf(a->last_error, sizeof a->last_error, __VA_ARGS__);           \
    bad = 1;                                                              \
  }
  uint32_t *use = calloc(a->nslots, sizeof *use);
  uint64_t allocated = 0, live = 0;
  for (int i = 0; i < 2 && use; i++) {
    gml_region *r = &a->regions[i];
    uintptr_t expect = r->base;
    size_t nfree = 0, pooled = 0;
    for (gml_block *b = r->first; b; b = b->next) {
      CHECK(b->addr == expect, "region %d: block at %#lx, expected %#lx (gap or overlap)", i, (unsigned long)b->addr,
            (unsigned long)expect);
      CHECK(!b->next || b->next->prev == b, "region %d: broken prev link", i);
      CHECK(b->size % GML_ALIGN == 0 && b->size, "block size %zu not aligned", b->size);
      expect = b->addr + b->size;
      if (b->is_free) {
        nfree++;
        CHECK(!(b->next && b->next->is_free && b->next->pool == b->pool), "adjacent free blocks of one pool not merged");
      } else {
        allocated += b->size;
        live++;
        CHECK(ptrmap_take(&a->live, b->addr, 0) == b, "live block %#lx missing from the pointer map", (unsigned long)b->addr);
        for (uint32_t s = slot_of(a, b->addr); s <= slot_of(a, b->addr + b->size - 1); s++) use[s]++;
      }
    }
    CHECK(expect == r->base + r->size, "region %d does not end at its end", i);
    for (int pi = 0; pi <= GML_MAX_STREAMS; pi++) pooled += r->pools[pi].count;
    CHECK(pooled == nfree, "region %d: %zu free blocks but %zu in pools", i, nfree, pooled);
  }
  CHECK(allocated == a->allocated, "allocated %llu but blocks sum to %llu", (unsigned long long)a->allocated,
        (unsigned long long)allocated);
  CHECK(live == a->live.count, "pointer map holds %zu, %llu live blocks", a->live.count, (unsigned long long)live);
  /* slots and chunks: each mapped slot is on its chunk's alias list; a used
   * slot owns its chunk; a chunk is owned or on the free list its maps say */
  size_t owned = 0, used = 0;
  for (uint32_t s = 0; s < a->nslots && use; s++) {
    CHECK(use[s] == a->slot_use[s], "slot %u: use %u, blocks say %u", s, a->slot_use[s], use[s]);
    int32_t ci = a->slot_chunk[s];
    if (a->slot_use[s]) {
      used++;
      CHECK(ci >= 0 && a->chunks[ci].owner == (int32_t)s, "used slot %u does not own a chunk", s);
    }
    if (ci >= 0) CHECK(a->chunks[ci].list != GML_CL_DEAD, "slot %u maps released chunk %d", s, ci);
  }
  size_t nfree[3] = {0, 0, 0}, live_chunks = 0;
  for (size_t i = 0; i < a->chunks_used && use; i++) {
    gml_pchunk *c = &a->chunks[i];
    if (c->list == GML_CL_DEAD) continue;
    live_chunks++;
    uint32_t n = 0;
    for (int32_t s = c->maps_head; s >= 0 && n <= a->nslots; s = a->slot_anext[s]) {
      CHECK(a->slot_chunk[s] == (int32_t)i, "chunk %zu lists slot %d, which maps %d", i, s, a->slot_chunk[s]);
      n++;
    }
    CHECK(n == c->nmaps, "chunk %zu: %u maps listed, %u counted", i, n, c->nmaps);
    if (c->owner >= 0) {
      owned++;
      CHECK(c->list == GML_CL_OWNED, "owned chunk %zu is on a free list", i);
      CHECK(a->slot_use[c->owner] && a->slot_chunk[c->owner] == (int32_t)i, "chunk %zu owned by slot %d that is not using it", i,
            c->owner);
    } else {
      CHECK(c->list == (c->nmaps ? GML_CL_CACHED : GML_CL_FRESH), "free chunk %zu (maps %u) on list %d", i, c->nmaps, c->list);
      nfree[c->list]++;
    }
  }
  CHECK(owned == used, "%zu chunks owned, %zu slots used", owned, used);
  CHECK(live_chunks == a->held, "%zu live chunks, held %zu", live_chunks, a->held);
  for (int l = 1; l < 3 && use; l++) {
    size_t listed = 0;
    for (int32_t ci = a->lists[l].head; ci >= 0 && listed <= a->chunks_used; ci = a->chunks[ci].lnext) listed++;
    CHECK(listed == nfree[l] && listed == a->lists[l].count, "free list %d: %zu listed, count %zu, chunks say %zu", l, listed,
          a->lists[l].count, nfree[l]);
  }
#undef CHECK
  free(use);
  pthread_mutex_unlock(&a->lock);
  return bad ? GML_EINVAL : 0;
}

void gml_alloc_destroy(gml_allocator *a) {
  if (!a->be) return;
  if (a->slot_chunk) {
    a->be->ops->synchronize(a->be);
    for (uint32_t s = 0; s < a->nslots; s++)
      if (a->slot_chunk[s] >= 0) a->be->ops->unmap(a->be, slot_addr(a, s), a->cs);
    for (size_t i = 0; i < a->chunks_used; i++)
      if (a->chunks[i].list != GML_CL_DEAD) a->src.release(a->src.ctx, 1, &a->chunks[i].phys, &a->chunks[i].id);
  }
  for (int i = 0; i < 2; i++) free_region_blocks(a, &a->regions[i]);
  if (a->va_base) a->be->ops->va_free(a->be, a->va_base, a->va_size);
  for (int i = 0; i < a->fence_n; i++) a->be->ops->event_destroy(a->be, a->fence_ev[i]);
  free(a->slot_chunk), free(a->slot_use), free(a->slot_anext), free(a->slot_aprev), free(a->slot_idle_tick);
  free(a->slot_stream), free(a->chunks);
  free(a->live.keys), free(a->live.vals);
  while (a->spare) {
    gml_block *n = a->spare->next;
    free(a->spare);
    a->spare = n;
  }
  pthread_mutex_destroy(&a->lock);
  a->be = NULL;
}
