/* pools.c: private pools, as PyTorch's CUDA graphs need them. A graph's
 * memory must stay its own for the graph's life: blocks freed while their
 * pool lives go to the pool's free list, and only allocations routed to the
 * pool (gml_pool_begin's filter) reuse them, on the stream that freed them.
 * When nobody uses the pool any more its free blocks go back to the
 * allocator, and each live one when it is freed. */
#include "client_priv.h"
#include "util.h"
#include <stdlib.h>

int gmli_pools_find(gml_client *c, gml_pool_id id) {
  for (int i = 0; i < GML_MAX_POOLS; i++)
    if (c->pools[i].used && c->pools[i].id.a == id.a && c->pools[i].id.b == id.b) return i;
  return -1;
}

/* Create the pool or add a use; its index, or -1 when every slot is taken. */
static int pool_incref(gml_client *c, gml_pool_id id) {
  int i = gmli_pools_find(c, id);
  if (i >= 0 && c->pools[i].use_count > 0) {
    c->pools[i].use_count++;
    return i;
  }
  if (i < 0) {
    for (i = 0; i < GML_MAX_POOLS && c->pools[i].used; i++) {}
    if (i == GML_MAX_POOLS) return -1;
  }
  gml_priv_pool *p = &c->pools[i];
  size_t live = p->used ? p->live : 0; /* a released pool with live blocks comes back to use */
  gml_rec *fh = p->used ? p->free_head : NULL;
  *p = (gml_priv_pool){.id = id, .used = 1, .use_count = 1, .live = live, .free_head = fh};
  return i;
}

int gml_pool_create(gml_client *c, gml_pool_id id) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  int i = pool_incref(c, id);
  pthread_mutex_unlock(&c->track_lock);
  return i < 0 ? gmli_fail(c, GML_ENOMEM, "gml_pool_create: no room for pool (%llu, %llu): %d pools in use",
                           (unsigned long long)id.a, (unsigned long long)id.b, GML_MAX_POOLS)
               : 0;
}

int gml_pool_begin(gml_client *c, gml_pool_id id, gml_stream_filter filter, void *ctx) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  int i = gmli_pools_find(c, id), rc = 0;
  if (i >= 0 && c->pools[i].capturing) {
    rc = gmli_fail(c, GML_EINVAL, "gml_pool_begin: pool (%llu, %llu) already allocates (gml_pool_end first)",
                   (unsigned long long)id.a, (unsigned long long)id.b);
  } else if ((i = pool_incref(c, id)) < 0) {
    rc = gmli_fail(c, GML_ENOMEM, "gml_pool_begin: no room for pool (%llu, %llu): %d pools in use",
                   (unsigned long long)id.a, (unsigned long long)id.b, GML_MAX_POOLS);
  } else {
    /* the capture may neither wait for the device nor query events: what was
     * freed so far becomes usable from any stream now */
    if (!c->ncapturing) gmli_alloc_quiesce(&c->alloc);
    c->pools[i].capturing = 1;
    c->pools[i].filter = filter;
    c->pools[i].filter_ctx = ctx;
    c->ncapturing++;
    c->alloc.no_device_waits = 1;
  }
  pthread_mutex_unlock(&c->track_lock);
  return rc;
}

int gml_pool_end(gml_client *c, gml_pool_id id) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  int i = gmli_pools_find(c, id), rc = 0;
  if (i < 0 || !c->pools[i].capturing) {
    rc = gmli_fail(c, GML_EINVAL, "gml_pool_end: pool (%llu, %llu) %s", (unsigned long long)id.a,
                   (unsigned long long)id.b, i < 0 ? "does not exist" : "is not allocating (no gml_pool_begin)");
  } else {
    c->pools[i].capturing = 0;
    c->pools[i].filter = NULL;
    if (--c->ncapturing == 0) c->alloc.no_device_waits = 0;
    gmli_streams_poll(c, 0); /* frees that waited for the capture to end */
  }
  pthread_mutex_unlock(&c->track_lock);
  return rc;
}

static void pool_give_back(gml_client *c, int i) {
  gml_priv_pool *p = &c->pools[i];
  for (gml_rec *r = p->free_head, *n; r; r = n) {
    n = r->lnext;
    gmli_recmap_get(&c->recs, r->ptr, 1);
    if (r->exported) gmli_ipc_forget(c, r->ptr);
    gmli_alloc_free(&c->alloc, (void *)r->ptr);
    free(r);
  }
  p->free_head = NULL;
  if (!p->live) p->used = 0;
}

int gml_pool_release(gml_client *c, gml_pool_id id) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  int i = gmli_pools_find(c, id), rc = 0;
  if (i < 0 || c->pools[i].use_count <= 0)
    rc = gmli_fail(c, GML_EINVAL, "gml_pool_release: pool (%llu, %llu) %s", (unsigned long long)id.a,
                   (unsigned long long)id.b, i < 0 ? "does not exist" : "has no use left");
  else if (--c->pools[i].use_count == 0) pool_give_back(c, i);
  pthread_mutex_unlock(&c->track_lock);
  return rc;
}

int gml_pool_use_count(gml_client *c, gml_pool_id id) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  int i = gmli_pools_find(c, id);
  int n = i < 0 ? gmli_fail(c, GML_EINVAL, "gml_pool_use_count: pool (%llu, %llu) does not exist",
                            (unsigned long long)id.a, (unsigned long long)id.b)
                : c->pools[i].use_count;
  pthread_mutex_unlock(&c->track_lock);
  return n;
}

int gml_pool_live(gml_client *c, gml_pool_id id, void **ptrs, size_t cap, size_t *n) {
  if (!c) return GML_EINVAL;
  if (!n || (cap && !ptrs))
    return gmli_fail(c, GML_EINVAL, "gml_pool_live: %s is NULL", !n ? "n" : "ptrs (with cap > 0)");
  pthread_mutex_lock(&c->track_lock);
  int i = gmli_pools_find(c, id);
  size_t k = 0;
  for (size_t b = 0; i >= 0 && b < c->recs.cap; b++)
    for (gml_rec *r = c->recs.buckets[b]; r; r = r->hnext)
      if (r->pool == i && r->state == GML_BLOCK_ALLOCATED) {
        if (k < cap) ptrs[k] = (void *)r->ptr;
        k++;
      }
  pthread_mutex_unlock(&c->track_lock);
  *n = k;
  return i < 0 ? GML_EINVAL : 0;
}

int32_t gmli_pools_route(gml_client *c, gml_stream stream) {
  for (int i = 0; i < GML_MAX_POOLS; i++) {
    gml_priv_pool *p = &c->pools[i];
    if (p->used && p->capturing && (!p->filter || p->filter(p->filter_ctx, stream))) return i;
  }
  return -1;
}

/* The smallest of the pool's free blocks freed on `stream` that fits, if it
 * wastes at most half of itself (a block is never split). */
gml_rec *gmli_pools_take(gml_client *c, int32_t pool, size_t size, gml_stream stream) {
  size_t rsize = gmli_round_up(size, GML_ALIGN);
  gml_rec *best = NULL;
  for (gml_rec *r = c->pools[pool].free_head; r; r = r->lnext)
    if (r->stream == stream && r->size >= rsize && r->size <= 2 * rsize && (!best || r->size < best->size)) best = r;
  if (best) gmli_pools_unlink(c, best);
  return best;
}

void gmli_pools_unlink(gml_client *c, gml_rec *r) {
  if (r->lprev) r->lprev->lnext = r->lnext;
  else c->pools[r->pool].free_head = r->lnext;
  if (r->lnext) r->lnext->lprev = r->lprev;
  r->lnext = r->lprev = NULL;
}

void gmli_pools_trim(gml_client *c) {
  for (int i = 0; i < GML_MAX_POOLS; i++)
    if (c->pools[i].used && c->pools[i].use_count <= 0) pool_give_back(c, i);
}
