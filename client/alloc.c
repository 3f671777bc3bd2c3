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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gml_block {
  uintptr_t addr;
  size_t size;
  gml_block *prev, *next;   /* address order within the region */
  gml_block *left, *right;  /* treap children (free blocks only) */
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

static void block_put(gml_allocator *a, gml_block *b) {
  b->next = a->spare;
  a->spare = b;
}

/* ---------- treap of free blocks, keyed (size, addr) ---------- */

static inline int key_less(const gml_block *x, const gml_block *y) {
  return x->size < y->size || (x->size == y->size && x->addr < y->addr);
}

static gml_block *treap_insert(gml_block *root, gml_block *b) {
  if (!root) {
    b->left = b->right = NULL;
    return b;
  }
  if (key_less(b, root)) {
    root->left = treap_insert(root->left, b);
    if (root->left->prio > root->prio) {
      gml_block *l = root->left;
      root->left = l->right;
      l->right = root;
      return l;
    }
  } else {
    root->right = treap_insert(root->right, b);
    if (root->right->prio > root->prio) {
      gml_block *r = root->right;
      root->right = r->left;
      r->left = root;
      return r;
    }
  }
  return root;
}

static gml_block *treap_merge(gml_block *l, gml_block *r) {
  if (!l) return r;
  if (!r) return l;
  if (l->prio > r->prio) {
    l->right = treap_merge(l->right, r);
    return l;
  }
  r->left = treap_merge(l, r->left);
  return r;
}

static gml_block *treap_remove(gml_block *root, gml_block *b) {
  if (!root) return NULL;
  if (root == b) return treap_merge(b->left, b->right);
  if (key_less(b, root)) root->left = treap_remove(root->left, b);
  else root->right = treap_remove(root->right, b);
  return root;
}

static void treap_collect_ge(gml_block *n, size_t want, gml_block **out, int *k, int max) {
  if (!n || *k >= max) return;
  if (n->size >= want) treap_collect_ge(n->left, want, out, k, max);
  if (*k >= max) return;
  if (n->size >= want) out[(*k)++] = n;
  treap_collect_ge(n->right, want, out, k, max);
}

/* Smallest (size, addr) with size >= want. */
static gml_block *treap_best_fit(gml_block *root, size_t want) {
  gml_block *best = NULL;
  while (root) {
    if (root->size >= want) {
      best = root;
      root = root->left;
    } else {
      root = root->right;
    }
  }
  return best;
}

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

/* ---------- slots and idle (mapped, untouched) LRU list ---------- */

static inline void idle_push(gml_allocator *a, int32_t s) {
  a->slot_idle_tick[s] = a->tick;
  a->idle_prev[s] = a->idle_tail;
  a->idle_next[s] = -1;
  if (a->idle_tail >= 0) a->idle_next[a->idle_tail] = s;
  else a->idle_head = s;
  a->idle_tail = s;
  a->idle_count++;
}

static inline void idle_unlink(gml_allocator *a, int32_t s) {
  int32_t p = a->idle_prev[s], n = a->idle_next[s];
  if (p >= 0) a->idle_next[p] = n;
  else a->idle_head = n;
  if (n >= 0) a->idle_prev[n] = p;
  else a->idle_tail = p;
  a->idle_prev[s] = a->idle_next[s] = -1;
  a->idle_count--;
}

static inline uint32_t slot_of(gml_allocator *a, uintptr_t addr) { return (uint32_t)((addr - a->va_base) / a->cs); }
static inline uintptr_t slot_addr(gml_allocator *a, uint32_t s) { return a->va_base + (uintptr_t)s * a->cs; }

static inline uint64_t reserved_bytes(gml_allocator *a) { return (uint64_t)a->nchunks * a->cs; }

/* Unmap the chunk of an idle slot; it goes to the unmapped stack. */
static int idle_slot_unmap(gml_allocator *a, int32_t s) {
  int32_t ci = a->slot_chunk[s];
  int rc = a->be->ops->unmap(a->be, slot_addr(a, (uint32_t)s), a->cs);
  if (rc) return rc;
  idle_unlink(a, s);
  a->slot_chunk[s] = -1;
  a->chunks[ci].slot = -1;
  a->unmapped[a->nunmapped++] = ci;
  a->unmaps++;
  return 0;
}

static int chunks_reserve(gml_allocator *a, size_t more) {
  if (a->nchunks + more <= a->chunks_cap) return 0;
  size_t cap = GML_MAX(a->chunks_cap * 2, a->nchunks + more);
  gml_pchunk *c = realloc(a->chunks, cap * sizeof *c);
  if (!c) return GML_ENOMEM;
  a->chunks = c;
  int32_t *u = realloc(a->unmapped, cap * sizeof *u);
  if (!u) return GML_ENOMEM;
  a->unmapped = u;
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
      a->fence_n = 0; /* no fence: steals fall back to a full synchronize */
      return;
    }
    a->fence_n++;
  }
  a->fence_tick = a->tick;
}

/* Get `need` chunks onto the unmapped stack: idle chunks first (stitching),
 * then new ones from the source. Unmapping must not race kernels still using
 * a range: slots idle since before a completed fence are taken at once, the
 * rest only after a synchronize. On failure nothing is lost: chunks already
 * gathered stay on the stack for later. */
static int gather_chunks_slow(gml_allocator *a, size_t need, int *stole) {
  if (a->nunmapped >= need) return 0;
  fence_update(a);
  while (a->nunmapped < need && a->idle_head >= 0 && a->slot_idle_tick[a->idle_head] < a->safe_tick) {
    int rc = idle_slot_unmap(a, a->idle_head);
    if (rc) return rc;
    *stole = 1;
  }
  if (a->nunmapped < need && a->idle_head >= 0) {
    int rc = a->be->ops->synchronize(a->be);
    if (rc) return rc;
    a->safe_tick = a->tick + 1;
    a->syncs++;
    while (a->nunmapped < need && a->idle_head >= 0) {
      rc = idle_slot_unmap(a, a->idle_head);
      if (rc) return rc;
      *stole = 1;
    }
  }
  while (a->nunmapped < need) {
    size_t want = need - a->nunmapped;
    if (a->limit_bytes && reserved_bytes(a) + want * a->cs > a->limit_bytes) return GML_ENOMEM;
    if (want > 128) want = 128;
    if (chunks_reserve(a, want)) return GML_ENOMEM;
    gml_phys phys[128];
    uint64_t ids[128];
    uint64_t t0 = gml_now_ns();
    int got = a->src.acquire(a->src.ctx, want, phys, ids);
    a->lease_ns[a->lease_calls++ % GML_ARRAY_LEN(a->lease_ns)] = gml_now_ns() - t0;
    if (got <= 0) return got < 0 ? got : GML_ENOMEM;
    for (int i = 0; i < got; i++) {
      size_t ci = a->nchunks++;
      a->chunks[ci].phys = phys[i];
      a->chunks[ci].id = ids[i];
      a->chunks[ci].slot = -1;
      a->unmapped[a->nunmapped++] = (int32_t)ci;
    }
    a->chunks_acquired += (uint64_t)got;
  }
  return 0;
}

/* Back every slot of [first, last] that has no chunk, then make the new
 * mappings accessible in runs. */
static int map_slots_slow(gml_allocator *a, uint32_t first, uint32_t last, size_t need, int *stole) {
  int rc = gather_chunks_slow(a, need, stole);
  if (rc) return rc;
  uint32_t run_start = UINT32_MAX;
  for (uint32_t s = first; s <= last + 1; s++) {
    int mapped_now = 0;
    if (s <= last && a->slot_chunk[s] < 0) {
      int32_t ci = a->unmapped[--a->nunmapped];
      rc = a->be->ops->map(a->be, slot_addr(a, s), a->chunks[ci].phys);
      if (rc) {
        a->unmapped[a->nunmapped++] = ci;
        return rc;
      }
      a->slot_chunk[s] = ci;
      a->chunks[ci].slot = (int32_t)s;
      a->maps++;
      mapped_now = 1;
      if (run_start == UINT32_MAX) run_start = s;
    }
    if (!mapped_now && run_start != UINT32_MAX) {
      rc = a->be->ops->set_access(a->be, slot_addr(a, run_start), (size_t)(s - run_start) * a->cs);
      if (rc) return rc;
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

/* Would serving rsize from b need new chunks mapped? (slow path only) */
static int block_needs_chunks(gml_allocator *a, gml_block *b, size_t rsize) {
  for (uint32_t s = slot_of(a, b->addr); s <= slot_of(a, b->addr + rsize - 1); s++)
    if (a->slot_chunk[s] < 0) return 1;
  return 0;
}


/* The best fit would need new chunks: a slightly larger free block that is
 * already backed serves the request without stitching (no unmap, no map). */
static gml_block *find_backed_fit_slow(gml_allocator *a, gml_region *r, int pi, size_t size, gml_block *best) {
  gml_block *cand[32];
  int k = 0;
  treap_collect_ge(r->pools[0].root, size, cand, &k, 16);
  if (pi > 0) treap_collect_ge(r->pools[pi].root, size, cand, &k, 32);
  gml_block *pick = NULL;
  for (int i = 0; i < k; i++) {
    if (cand[i] == best || cand[i]->size > 2 * size + 4 * a->cs) continue;
    if (block_needs_chunks(a, cand[i], size)) continue;
    if (!pick || key_less(cand[i], pick)) pick = cand[i];
  }
  return pick ? pick : best;
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
  gml_block *b = find_fit(a, r, pi, rsize);
  if ((!b || (a->nstreams_seen > 1 && block_needs_chunks(a, b, rsize))) && harvest_streams_slow(a, r))
    b = find_fit(a, r, pi, rsize);
  if (b && block_needs_chunks(a, b, rsize)) b = find_backed_fit_slow(a, r, pi, rsize, b);
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
  for (uint32_t s = first; s <= last; s++) {
    if (a->slot_use[s]++ == 0 && a->slot_chunk[s] >= 0) idle_unlink(a, (int32_t)s);
    need += a->slot_chunk[s] < 0;
  }
  int stole = 0;
  if (need) {
    GML_DEBUG("map: size %zu needs %zu of %u slots (idle %zu, unmapped %zu, tick %llu)", rsize, need, last - first + 1,
              a->idle_count, a->nunmapped, (unsigned long long)a->tick);
    int rc = map_slots_slow(a, first, last, need, &stole);
    if (rc) {
      for (uint32_t s = first; s <= last; s++)
        if (--a->slot_use[s] == 0 && a->slot_chunk[s] >= 0) idle_push(a, (int32_t)s);
      pool_add(r, b->pool, b);
      format_oom(a, size, rc);
      a->ooms++;
      pthread_mutex_unlock(&a->lock);
      GML_DEBUG("%s", a->last_error);
      return rc == GML_EQUOTA || rc == GML_EDAEMON || rc == GML_EBACKEND ? rc : GML_ENOMEM;
    }
  }
  if (b->size - rsize >= GML_ALIGN) {
    gml_block *rest = block_new(a);
    if (rest) {
      rest->addr = b->addr + rsize;
      rest->size = b->size - rsize;
      rest->region = b->region;
      rest->is_free = 1;
      rest->stream = b->stream;
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = rsize;
      pool_add(r, b->pool, rest);
    }
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
    for (uint32_t s = first; s <= last; s++)
      if (--a->slot_use[s] == 0) idle_push(a, (int32_t)s);
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
    if (--a->slot_use[s] == 0) idle_push(a, (int32_t)s);
  if ((a->free_count & 4095) == 0) fence_update(a); /* keep a recent fence for the next steal */
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
  if (a->idle_count && a->nunmapped < max_chunks) {
    a->be->ops->synchronize(a->be);
    a->safe_tick = a->tick + 1;
  }
  while (a->idle_head >= 0 && a->nunmapped < max_chunks)
    if (idle_slot_unmap(a, a->idle_head)) break;
  /* Give back unmapped chunks; compact the chunk array by moving the last
   * chunk into each hole (its slot, if mapped, is re-pointed). */
  size_t released = 0;
  while (a->nunmapped && released < max_chunks) {
    int32_t ci = a->unmapped[--a->nunmapped];
    a->src.release(a->src.ctx, 1, &a->chunks[ci].phys, &a->chunks[ci].id);
    size_t lastc = --a->nchunks;
    if ((size_t)ci != lastc) {
      a->chunks[ci] = a->chunks[lastc];
      if (a->chunks[ci].slot >= 0) a->slot_chunk[a->chunks[ci].slot] = ci;
      else
        for (size_t k = 0; k < a->nunmapped; k++)
          if (a->unmapped[k] == (int32_t)lastc) a->unmapped[k] = ci;
    }
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
  st->largest_free = (uint64_t)(a->idle_count + a->nunmapped) * a->cs;
  st->peak_allocated = a->peak_allocated;
  st->peak_reserved = a->peak_reserved;
  st->alloc_count = a->alloc_count;
  st->free_count = a->free_count;
  st->chunks_leased = a->chunks_acquired;
  st->chunks_returned = a->chunks_released;
  st->maps = a->maps;
  st->syncs = a->syncs;
  st->unmaps = a->unmaps;
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
  a->idle_head = a->idle_tail = -1;
  int rc = be->ops->va_reserve(be, a->va_size, &a->va_base);
  if (rc) return rc;
  a->nslots = (uint32_t)(a->va_size / a->cs);
  a->slot_chunk = malloc(a->nslots * sizeof *a->slot_chunk);
  a->slot_use = calloc(a->nslots, sizeof *a->slot_use);
  a->slot_idle_tick = calloc(a->nslots, sizeof *a->slot_idle_tick);
  a->idle_prev = malloc(a->nslots * sizeof *a->idle_prev);
  a->idle_next = malloc(a->nslots * sizeof *a->idle_next);
  if (!a->slot_chunk || !a->slot_use || !a->idle_prev || !a->idle_next || !a->slot_idle_tick) {
    gml_alloc_destroy(a);
    return GML_ENOMEM;
  }
  memset(a->slot_chunk, 0xff, a->nslots * sizeof *a->slot_chunk);
  memset(a->idle_prev, 0xff, a->nslots * sizeof *a->idle_prev);
  memset(a->idle_next, 0xff, a->nslots * sizeof *a->idle_next);
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
  size_t idle = 0, mapped = 0;
  for (uint32_t s = 0; s < a->nslots && use; s++) {
    CHECK(use[s] == a->slot_use[s], "slot %u: use %u, blocks say %u", s, a->slot_use[s], use[s]);
    CHECK(!use[s] || a->slot_chunk[s] >= 0, "slot %u is used but has no chunk", s);
    if (a->slot_chunk[s] >= 0) {
      mapped++;
      CHECK(a->chunks[a->slot_chunk[s]].slot == (int32_t)s, "slot %u and its chunk disagree", s);
      if (!a->slot_use[s]) idle++;
    }
  }
  size_t listed = 0;
  for (int32_t s = a->idle_head; s >= 0 && listed <= a->nslots; s = a->idle_next[s]) {
    listed++;
    CHECK(a->slot_chunk[s] >= 0 && !a->slot_use[s], "idle list holds slot %d that is not idle", s);
  }
  CHECK(listed == idle && idle == a->idle_count, "idle list %zu, count %zu, idle slots %zu", listed, a->idle_count, idle);
  CHECK(mapped + a->nunmapped == a->nchunks, "%zu mapped + %zu unmapped != %zu chunks", mapped, a->nunmapped, a->nchunks);
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
    for (size_t i = 0; i < a->nchunks; i++) a->src.release(a->src.ctx, 1, &a->chunks[i].phys, &a->chunks[i].id);
  }
  for (int i = 0; i < 2; i++) free_region_blocks(a, &a->regions[i]);
  if (a->va_base) a->be->ops->va_free(a->be, a->va_base, a->va_size);
  for (int i = 0; i < a->fence_n; i++) a->be->ops->event_destroy(a->be, a->fence_ev[i]);
  free(a->slot_chunk), free(a->slot_use), free(a->idle_prev), free(a->idle_next), free(a->slot_idle_tick);
  free(a->chunks), free(a->unmapped);
  free(a->live.keys), free(a->live.vals);
  while (a->spare) {
    gml_block *n = a->spare->next;
    free(a->spare);
    a->spare = n;
  }
  pthread_mutex_destroy(&a->lock);
  a->be = NULL;
}
