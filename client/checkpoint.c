/* checkpoint.c: a private pool's live set, recorded and restored, as
 * PyTorch's cudagraph trees need it (torch/_inductor/cudagraph_trees.py).
 * After recording a graph they checkpoint its pool; replaying graphs then
 * changes memory but no bookkeeping, so before recording a new graph from a
 * node that is not the tree's tail they restore the pool to that node's
 * checkpoint: what is live now but was not then is freed, what was live then
 * but is not now is live again at the same address. The second is possible
 * because a pool keeps each freed block whole (never split nor merged,
 * pools.c) for as long as it has a use: an allocation live in the checkpoint
 * is, now, either still live or on the pool's free list with the same
 * address, size and stream, its memory still held in the allocator, so
 * making it live again can overlap nothing. Anything else (the pool was
 * released and its memory went back) is GML_ESTALE, checked for every block
 * before anything changes. */
#include "client_priv.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ckpt_block {
  uintptr_t ptr;
  size_t size, requested;
  gml_stream stream;
  uint64_t tag;
} ckpt_block;

struct gml_pool_ckpt {
  gml_pool_id pool;
  size_t n;
  ckpt_block *b; /* by address */
};

static int cmp_ptr(const void *x, const void *y) {
  const ckpt_block *a = x, *b = y;
  return a->ptr < b->ptr ? -1 : a->ptr > b->ptr;
}

static int ckpt_has(const gml_pool_ckpt *k, uintptr_t ptr) {
  ckpt_block key = {.ptr = ptr};
  return k->n && bsearch(&key, k->b, k->n, sizeof *k->b, cmp_ptr) != NULL;
}

/* The pool of id, with a use; else -1 and why in last_error. */
static int pool_in_use(gml_client *c, gml_pool_id id, const char *what) {
  int i = gmli_pools_find(c, id);
  if (i < 0 || c->pools[i].use_count <= 0)
    snprintf(c->last_error, sizeof c->last_error, "%s: no pool (%llu, %llu) in use", what, (unsigned long long)id.a,
             (unsigned long long)id.b);
  return i >= 0 && c->pools[i].use_count > 0 ? i : -1;
}

int gml_pool_checkpoint(gml_client *c, gml_pool_id id, gml_pool_ckpt **out) {
  if (!c) return GML_EINVAL;
  if (!out) return gmli_fail(c, GML_EINVAL, "gml_pool_checkpoint: out is NULL");
  *out = NULL;
  gml_pool_ckpt *k = calloc(1, sizeof *k);
  if (!k) return GML_ENOMEM;
  k->pool = id;
  pthread_mutex_lock(&c->track_lock);
  int i = pool_in_use(c, id, "checkpoint"), rc = 0;
  if (i < 0) {
    rc = GML_EINVAL;
    goto out;
  }
  size_t n = 0;
  for (size_t h = 0; h < c->recs.cap; h++)
    for (gml_rec *r = c->recs.buckets[h]; r; r = r->hnext) n += r->pool == i && r->state == GML_BLOCK_ALLOCATED;
  if (n && !(k->b = malloc(n * sizeof *k->b))) {
    rc = GML_ENOMEM;
    goto out;
  }
  for (size_t h = 0; h < c->recs.cap; h++)
    for (gml_rec *r = c->recs.buckets[h]; r; r = r->hnext)
      if (r->pool == i && r->state == GML_BLOCK_ALLOCATED)
        k->b[k->n++] =
            (ckpt_block){.ptr = r->ptr, .size = r->size, .requested = r->requested, .stream = r->stream, .tag = r->tag};
  if (k->n) qsort(k->b, k->n, sizeof *k->b, cmp_ptr);
out:
  pthread_mutex_unlock(&c->track_lock);
  if (rc) gml_pool_checkpoint_free(k);
  else *out = k;
  return rc;
}

int gml_pool_checkpoint_blocks(const gml_pool_ckpt *k, gml_alloc_info *out, size_t cap, size_t *n) {
  if (!k || !n || (cap && !out)) return GML_EINVAL;
  for (size_t i = 0; i < k->n && i < cap; i++)
    out[i] = (gml_alloc_info){.addr = k->b[i].ptr,
                              .size = k->b[i].size,
                              .requested = k->b[i].requested,
                              .state = GML_BLOCK_ALLOCATED,
                              .stream = k->b[i].stream,
                              .pool = k->pool,
                              .tag = k->b[i].tag};
  *n = k->n;
  return 0;
}

void gml_pool_checkpoint_free(gml_pool_ckpt *k) {
  if (!k) return;
  free(k->b);
  free(k);
}

/* Can checkpoint block b be live in pool i after the restore? 0, or
 * GML_ESTALE with why in last_error. */
static int block_restorable(gml_client *c, int i, const ckpt_block *b, const gml_rec *r) {
  const char *why = !r                                   ? "no longer the pool's (its memory went back)"
                    : r->pool != i                       ? "now another pool's, or no pool's"
                    : r->size != b->size                 ? "now a block of another size"
                    : r->stream != b->stream             ? "now a block of another stream"
                    : r->state == GML_BLOCK_PENDING_FREE ? "freed, and its free still waits for a recorded stream"
                                                         : NULL;
  if (!why) return 0;
  snprintf(c->last_error, sizeof c->last_error,
           "restore of pool (%llu, %llu): the allocation at %#lx (%zu bytes) live in the checkpoint is %s",
           (unsigned long long)c->pools[i].id.a, (unsigned long long)c->pools[i].id.b, (unsigned long)b->ptr, b->size,
           why);
  return GML_ESTALE;
}

int gml_pool_restore(gml_client *c, const gml_pool_ckpt *k, void **freed, size_t freed_cap, size_t *nfreed,
                     void **allocd, size_t allocd_cap, size_t *nallocd) {
  if (!c) return GML_EINVAL;
  if (!k || !nfreed || !nallocd || (freed_cap && !freed) || (allocd_cap && !allocd))
    return gmli_fail(c, GML_EINVAL, "gml_pool_restore: %s is NULL",
                     !k         ? "k"
                     : !nfreed  ? "nfreed"
                     : !nallocd ? "nallocd"
                     : !freed   ? "freed (with freed_cap > 0)"
                                : "allocd (with allocd_cap > 0)");
  *nfreed = *nallocd = 0;
  pthread_mutex_lock(&c->track_lock);
  int i = pool_in_use(c, k->pool, "restore"), rc = 0;
  if (i < 0) {
    rc = GML_EINVAL;
    goto out;
  }
  if (c->pools[i].capturing) {
    snprintf(c->last_error, sizeof c->last_error, "restore: the pool captures a graph");
    rc = GML_EINVAL;
    goto out;
  }
  if (c->pending) gmli_streams_poll(c, 1); /* an allocation of the checkpoint may wait for its streams */
  size_t na = 0, nf = 0;
  for (size_t j = 0; j < k->n; j++) {
    gml_rec *r = gmli_recmap_get(&c->recs, k->b[j].ptr, 0);
    if ((rc = block_restorable(c, i, &k->b[j], r))) goto out;
    na += r->state == GML_BLOCK_FREE;
  }
  for (size_t h = 0; h < c->recs.cap; h++)
    for (gml_rec *r = c->recs.buckets[h]; r; r = r->hnext)
      nf += r->pool == i && r->state == GML_BLOCK_ALLOCATED && !ckpt_has(k, r->ptr);
  if (nf > freed_cap || na > allocd_cap) {
    snprintf(c->last_error, sizeof c->last_error, "restore: room for %zu freed and %zu made live, %zu and %zu needed",
             freed_cap, allocd_cap, nf, na);
    *nfreed = nf, *nallocd = na;
    rc = GML_EINVAL;
    goto out;
  }
  /* collect first: a free may move records (a pool's free list, the pending list) */
  for (size_t h = 0; h < c->recs.cap; h++)
    for (gml_rec *r = c->recs.buckets[h]; r; r = r->hnext)
      if (r->pool == i && r->state == GML_BLOCK_ALLOCATED && !ckpt_has(k, r->ptr)) freed[(*nfreed)++] = (void *)r->ptr;
  for (size_t j = 0; j < *nfreed; j++) gmli_rec_free(c, gmli_recmap_get(&c->recs, (uintptr_t)freed[j], 0), 0);
  for (size_t j = 0; j < k->n; j++) {
    gml_rec *r = gmli_recmap_get(&c->recs, k->b[j].ptr, 0);
    if (r->state != GML_BLOCK_FREE) continue; /* live then and now */
    gmli_pools_unlink(c, r);
    gmli_rec_activate(c, r, i, k->b[j].requested, k->b[j].stream, k->b[j].tag);
    allocd[(*nallocd)++] = (void *)r->ptr;
  }
out:
  pthread_mutex_unlock(&c->track_lock);
  return rc;
}
