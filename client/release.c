/* release.c: where a tracked allocation ends, once no stream uses it: back
 * to its private pool's free list while the pool is used, else to the
 * allocator. Below the frees that call it (track.c now, streams.c once the
 * recorded streams passed) and the pools (pools.c), which use it alike. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "log.h"
#include <stdlib.h>

void gmli_pools_put(gml_client *c, gml_rec *r) {
  gml_priv_pool *p = &c->pools[r->pool];
  p->live--;
  r->state = GML_BLOCK_FREE;
  r->lprev = NULL;
  r->lnext = p->free_head;
  if (p->free_head) p->free_head->lprev = r;
  p->free_head = r;
}

void gmli_rec_release(gml_client *c, gml_rec *r) {
  if (r->exported) { /* no new receiver may open it */
    gmli_ipc_forget(c, r->ptr);
    r->exported = 0;
  }
  gmli_stat_dec(&c->ctr.active, 1);
  gmli_stat_dec(&c->ctr.active_bytes, (int64_t)r->size);
  gmli_trace_add(c, GML_TRACE_FREE_COMPLETED, r->ptr, r->size, r->stream, r->pool, r->tag);
  if (r->pool >= 0 && c->pools[r->pool].use_count > 0) {
    gmli_pools_put(c, r);
    return;
  }
  if (r->pool >= 0) {
    gml_priv_pool *p = &c->pools[r->pool];
    if (--p->live == 0 && !p->free_head) p->used = 0; /* released earlier; its last block is gone */
  }
  gmli_recmap_get(&c->recs, r->ptr, 1);
  int rc = gmli_alloc_free(&c->alloc, (void *)r->ptr);
  if (rc) GML_ERR("free of %#lx: %s", (unsigned long)r->ptr, c->alloc.last_error);
  free(r);
}
