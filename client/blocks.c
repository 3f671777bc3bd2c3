/* blocks.c: the allocator's virtual-range bookkeeping, no driver calls
 * beyond destroying events: block structs (recycled through a spare list),
 * the best-fit treaps of free blocks keyed (size, addr), one per stream
 * pool, coalescing and splitting, and the pointer map from a live block's
 * address to its struct, and whether borrowing ordered a stream after a
 * chunk's free. Its declarations, and the state it works on, are
 * blocks.h's. Which free block serves a request is policy.c's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blocks.h"
#include <stdlib.h>
#include <string.h>

/* ---------- block structs ---------- */

gml_block *gmli_block_new(gml_allocator *a) {
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
void gmli_block_put(gml_allocator *a, gml_block *b) {
  b->next = a->spare;
  a->spare = b;
}

void gmli_region_free_blocks(gml_allocator *a, gml_region *r) {
  for (gml_block *b = r->first, *n; b; b = n) {
    n = b->next;
    if (b->has_event) a->be->ops->event_destroy(a->be, b->event);
    if (!b->is_free) free(b->bt);
    free(b);
  }
  r->first = NULL;
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

void gmli_treap_collect_ge(gml_block *n, size_t want, gml_block **out, int *k, int max) {
  if (!n || *k >= max) return;
  if (n->size >= want) gmli_treap_collect_ge(L(n), want, out, k, max);
  if (*k >= max) return;
  if (n->size >= want) out[(*k)++] = n;
  gmli_treap_collect_ge(R(n), want, out, k, max);
}

#undef L
#undef R

/* ---------- pools (one free tree per stream, [0] = any stream) ---------- */

void gmli_pool_add(gml_region *r, int pi, gml_block *b) {
  b->pool = (uint8_t)pi;
  r->pools[pi].root = treap_insert(r->pools[pi].root, b);
  r->pools[pi].count++;
}

void gmli_pool_del(gml_region *r, gml_block *b) {
  gml_pool *p = &r->pools[b->pool];
  p->root = treap_remove(p->root, b);
  p->count--;
}

/* ---------- blocks in regions ---------- */

/* Merged free blocks: the result was lent if either was, by one stream or
 * several, and was freed when the later of them was. */
static inline void merge_lender(gml_block *into, const gml_block *from) {
  if (from->free_tick > into->free_tick) into->free_tick = from->free_tick;
  if (!from->lent) return;
  into->lender = into->lent && into->lender != from->lender ? GML_STREAM_MIXED : from->lender;
  into->lent = 1;
}

gml_block *gmli_block_coalesce(gml_allocator *a, gml_region *r, gml_block *b) {
  gml_block *n = b->next;
  if (n && n->is_free && n->pool == b->pool) {
    gmli_pool_del(r, n);
    b->size += n->size;
    merge_lender(b, n);
    b->next = n->next;
    if (n->next) n->next->prev = b;
    if (n->has_event) a->be->ops->event_destroy(a->be, n->event);
    if (b->has_event) a->be->ops->event_destroy(a->be, b->event);
    b->has_event = 0; /* re-recorded at the next harvest: covers both */
    gmli_block_put(a, n);
  }
  gml_block *p = b->prev;
  if (p && p->is_free && p->pool == b->pool) {
    gmli_pool_del(r, p);
    p->size += b->size;
    merge_lender(p, b);
    p->next = b->next;
    if (b->next) b->next->prev = p;
    if (b->has_event) a->be->ops->event_destroy(a->be, b->event);
    if (p->has_event) a->be->ops->event_destroy(a->be, p->event);
    p->has_event = 0;
    gmli_block_put(a, b);
    b = p;
  }
  return b;
}

gml_block *gmli_block_split(gml_allocator *a, gml_block *b, size_t at) {
  gml_block *n = gmli_block_new(a);
  if (!n) return NULL;
  n->addr = b->addr + at;
  n->size = b->size - at;
  n->region = b->region;
  n->is_free = 1;
  n->stream = b->stream;
  n->pool = b->pool;
  n->lent = b->lent, n->lender = b->lender, n->free_tick = b->free_tick;
  n->prev = b;
  n->next = b->next;
  if (b->next) b->next->prev = n;
  b->next = n;
  b->size = at;
  return n;
}

/* ---------- pointer map: open addressing, backward-shift deletion ---------- */

static inline size_t ptr_hash(uintptr_t k, size_t cap) {
  return (size_t)((k >> 9) * 0x9E3779B97F4A7C15ull) & (cap - 1);
}

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

int gmli_ptrmap_put(gml_ptrmap *m, uintptr_t k, gml_block *v) {
  if ((m->count + 1) * 2 > m->cap && ptrmap_grow(m)) return GML_ENOMEM;
  size_t j = ptr_hash(k, m->cap);
  while (m->keys[j]) j = (j + 1) & (m->cap - 1);
  m->keys[j] = k;
  m->vals[j] = v;
  m->count++;
  return 0;
}

gml_block *gmli_ptrmap_take(gml_ptrmap *m, uintptr_t k, int remove) {
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

/* ---------- chunks: ordered by borrowing ---------- */

int gmli_chunk_ordered_slow(const gml_allocator *a, const gml_pchunk *c, gml_stream stream) {
  if (c->free_stream == GML_STREAM_MIXED) return 0;
  int i = stream_index(a, stream), j = stream_index(a, c->free_stream);
  return i >= 0 && j >= 0 && c->free_tick <= a->ordered[i][j];
}
