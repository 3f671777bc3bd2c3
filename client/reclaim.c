/* reclaim.c: giving idle chunks back without waiting for the device, for a
 * thread that is not the allocator's caller: the keeper (keeper.c) serving
 * the daemon's reclaim request while the process may be idle, or busy on
 * its streams. gmli_alloc_release_idle (alloc.c) synchronizes the device
 * when it must unmap chunks a stream may still touch; this never does: it
 * gives back the free chunks mapped nowhere and the mapped free chunks that
 * a fence says every stream is done with, in the trim policy's order
 * (policy.c), and says how many free chunks are left, so the keeper can
 * poll the fence again a moment later. A chunk a live block touches is
 * never free, so never given back. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "alloc_internal.h"
#include "policy.h"

#define RECLAIM_BATCH 128 /* chunks per message back (the wire's GML_MAX_LEASE_CHUNKS) */

/* Unmap free chunk ci from every slot and take it off the lists, like
 * gmli_chunk_give_back, but leave the return to the caller's batch. */
static int chunk_detach(gml_allocator *a, int32_t ci) {
  gml_pchunk *c = &a->chunks[ci];
  while (c->maps_head >= 0 && !gmli_slot_unmap(a, (uint32_t)c->maps_head)) {}
  if (c->maps_head >= 0) return GML_EBACKEND; /* the backend refused: keep it */
  clist_unlink(a, ci);
  c->list = GML_CL_DEAD;
  c->lnext = a->dead;
  a->dead = ci;
  a->held--;
  return 0;
}

static void flush_batch(gml_allocator *a, gml_phys *phys, uint64_t *ids, size_t *n) {
  if (*n) a->src.release(a->src.ctx, *n, phys, ids);
  *n = 0;
}

size_t gmli_alloc_release_ready(gml_allocator *a, size_t max_bytes, size_t *free_left) {
  pthread_mutex_lock(&a->lock);
  size_t max_chunks = max_bytes ? max_bytes / a->cs + (max_bytes % a->cs != 0) : SIZE_MAX; /* no wrap near 2^64 */
  /* This pass counts as an operation, so whatever was released before it
   * has a smaller tick than a fence armed now; the fence's events are
   * recorded after every release so far (no operation runs meanwhile). */
  a->tick++;
  gmli_fence_update(a);
  size_t released = 0, n = 0;
  gml_phys phys[RECLAIM_BATCH];
  uint64_t ids[RECLAIM_BATCH];
  int32_t ci;
  while (released < max_chunks && (ci = gmli_policy_trim_next(a)) >= 0) {
    if (a->chunks[ci].list == GML_CL_CACHED && a->chunks[ci].free_tick >= a->safe_tick)
      break;                        /* device not past it yet */
    if (chunk_detach(a, ci)) break; /* the backend refused an unmap: keep it */
    phys[n] = a->chunks[ci].phys;
    ids[n++] = a->chunks[ci].id;
    if (n == RECLAIM_BATCH) flush_batch(a, phys, ids, &n);
    released++;
  }
  flush_batch(a, phys, ids, &n);
  a->chunks_released += released;
  if (free_left) *free_left = free_chunks(a);
  pthread_mutex_unlock(&a->lock);
  return released * a->cs;
}
