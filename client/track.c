/* track.c: the client's allocation entry points, and what it keeps of each
 * allocation for a framework layer: a record per allocation (size asked,
 * stream, tag, private pool, recorded streams), PyTorch's counters, the
 * history ring, the block list for snapshots. Before an allocation fails it
 * completes the frees that wait for streams, gives idle memory back and tries
 * once more. track_lock orders all of it; the allocator's lock nests inside.
 * The records' hash and the ring's append are records.c's, an allocation's
 * end release.c's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "log.h"
#include "util.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------- counters and history ---------- */

int gml_trace_enable(gml_client *c, size_t capacity) {
  if (!c) return GML_EINVAL;
  gml_trace_entry *e = capacity ? calloc(capacity, sizeof *e) : NULL;
  if (capacity && !e) return gmli_fail(c, GML_ENOMEM, "gml_trace_enable: no memory for %zu entries", capacity);
  pthread_mutex_lock(&c->track_lock);
  free(c->trace.e);
  c->trace.e = e;
  c->trace.cap = capacity;
  c->trace.head = c->trace.count = 0;
  gmli_trace_segments_enable(c, capacity > 0);
  pthread_mutex_unlock(&c->track_lock);
  return 0;
}

int gml_trace_read(gml_client *c, gml_trace_entry *out, size_t cap, size_t *n) {
  if (!c) return GML_EINVAL;
  if ((cap && !out) || !n)
    return gmli_fail(c, GML_EINVAL, "gml_trace_read: %s is NULL", !n ? "n" : "out (with cap > 0)");
  pthread_mutex_lock(&c->track_lock);
  gml_trace_ring *t = &c->trace;
  if (t->cap) gmli_trace_segments(c);
  size_t k = GML_MIN(cap, t->count);
  for (size_t i = 0; i < k; i++) out[i] = t->e[(t->head + i) % t->cap];
  *n = k;
  pthread_mutex_unlock(&c->track_lock);
  return 0;
}

/* The peak reserved, after chunks may have been leased. (The history's
 * segment events come from the allocator: gmli_trace_segments.) */
static void note_reserved(gml_client *c) {
  uint64_t reserved = (uint64_t)c->alloc.held * c->alloc.cs;
  if (reserved > c->ctr.reserved_peak) c->ctr.reserved_peak = reserved;
}

/* ---------- allocation ---------- */

static void format_oom(gml_client *c, size_t size) {
  char s[6][32];
  uint64_t reserved = (uint64_t)c->alloc.held * c->alloc.cs, freeb = 0, total = 0;
  c->be->ops->mem_info(c->be, &freeb, &total);
  int n = snprintf(
      c->last_error, sizeof c->last_error,
      "GMLake out of memory on device %d: tried to allocate %s; this process has %s allocated and %s reserved "
      "(%s cached)",
      c->device, gmli_format_bytes(size, s[0], 32),
      gmli_format_bytes((uint64_t)c->ctr.allocated_bytes.current, s[1], 32), gmli_format_bytes(reserved, s[2], 32),
      gmli_format_bytes(reserved - (uint64_t)c->ctr.active_bytes.current, s[3], 32));
  if (c->alloc.limit_bytes && n < (int)sizeof c->last_error)
    n += snprintf(c->last_error + n, sizeof c->last_error - n, ", its limit is %s",
                  gmli_format_bytes(c->alloc.limit_bytes, s[4], 32));
  if (n < (int)sizeof c->last_error) {
    if (c->mode == GML_MODE_DAEMON)
      snprintf(c->last_error + n, sizeof c->last_error - n, "; the lake (daemon) said: %s",
               c->lake_error[0] ? c->lake_error : c->alloc.last_error);
    else
      snprintf(c->last_error + n, sizeof c->last_error - n, "; embedded, the device has %s free of %s (%s)",
               gmli_format_bytes(freeb, s[4], 32), gmli_format_bytes(total, s[5], 32), c->alloc.last_error);
  }
}

static int alloc_with_retry(gml_client *c, size_t size, gml_stream stream, void **p) {
  c->lake_error[0] = 0;
  int rc = GML_EAGAIN;
  /* borrowing: rather than lease more, release frees that wait for other
   * streams, with waits on the device (streams.c) */
  if (c->alloc.borrow && c->pending && !c->ncapturing && gmli_streams_lendable(c) &&
      (rc = gmli_alloc_malloc_ex(&c->alloc, size, stream, GML_ALLOC_NO_GROW, p)) == GML_EAGAIN)
    gmli_streams_borrow(c, size);
  if (rc == GML_EAGAIN) rc = gmli_alloc_malloc(&c->alloc, size, stream, p);
  if (rc != GML_ENOMEM && rc != GML_EQUOTA) return rc;
  if (size > c->alloc.va_size >> 1) { /* over the allocator's bound (alloc.c): no retry helps, say the bound */
    c->ctr.ooms++;
    snprintf(c->last_error, sizeof c->last_error, "GMLake cannot allocate on device %d: %s", c->device,
             c->alloc.last_error);
    uint64_t freeb = 0, total = 0;
    c->be->ops->mem_info(c->be, &freeb, &total);
    gmli_trace_add(c, GML_TRACE_OOM, (uintptr_t)freeb, size, stream, -1, 0);
    return rc;
  }
  /* what the native allocator does before an OOM: wait for the frees that
   * wait for streams, give cached memory back, try again */
  c->ctr.retries++;
  gmli_streams_poll(c, 1);
  gmli_pools_trim(c);
  gmli_alloc_release_idle(&c->alloc, 0);
  if (c->mode == GML_MODE_DAEMON) gmli_client_housekeeping(c, 1);
  c->lake_error[0] = 0;
  rc = gmli_alloc_malloc(&c->alloc, size, stream, p);
  if (rc) {
    c->ctr.ooms++;
    format_oom(c, size);
    uint64_t freeb = 0, total = 0;
    c->be->ops->mem_info(c->be, &freeb, &total);
    gmli_trace_add(c, GML_TRACE_OOM, (uintptr_t)freeb, size, stream, -1, 0);
  }
  return rc;
}

void gmli_rec_activate(gml_client *c, gml_rec *r, int32_t pool, size_t size, gml_stream stream, uint64_t tag) {
  if (pool >= 0) c->pools[pool].live++;
  r->requested = size;
  r->stream = stream;
  r->tag = tag;
  r->state = GML_BLOCK_ALLOCATED;
  r->nuses = r->uses_overflow = r->nevents = 0;
  gmli_stat_inc(&c->ctr.allocation, 1);
  gmli_stat_inc(&c->ctr.active, 1);
  gmli_stat_inc(&c->ctr.allocated_bytes, (int64_t)r->size);
  gmli_stat_inc(&c->ctr.active_bytes, (int64_t)r->size);
  gmli_stat_inc(&c->ctr.requested_bytes, (int64_t)size);
  gmli_trace_add(c, GML_TRACE_ALLOC, r->ptr, r->size, stream, pool, tag);
}

int gml_alloc_ex(gml_client *c, size_t size, gml_stream stream, uint64_t tag, void **ptr) {
  if (!c) return GML_EINVAL;
  if (!ptr) return gmli_fail(c, GML_EINVAL, "gml_alloc: ptr (where the pointer goes) is NULL");
  if (!size) return gmli_fail(c, GML_EINVAL, "gml_alloc: size 0 (an allocation is at least 1 byte)");
  uint64_t t0 = c->alloc.timing ? gmli_now_ns() : 0;
  int rc = 0;
  pthread_mutex_lock(&c->track_lock);
  if (c->pending) gmli_streams_poll(c, 0);
  int32_t pool = c->ncapturing ? gmli_pools_route(c, stream) : -1;
  gml_rec *r = pool >= 0 ? gmli_pools_take(c, pool, size, stream) : NULL;
  if (!r) {
    void *p = NULL;
    r = calloc(1, sizeof *r);
    if (!r) {
      rc = GML_ENOMEM;
      goto out;
    }
    int64_t ooms =
        c->ctr.ooms; /* track_lock held to the compare below, as at every ooms++: no other thread's OOM between */
    rc = alloc_with_retry(c, size, stream, &p);
    note_reserved(c);
    if (rc) {
      free(r);
      /* alloc_with_retry wrote its out-of-memory report (and counted it), or
       * the allocator's own words say why (the daemon gone, a backend error):
       * never an earlier failure's report (before, a GML_EDAEMON after a quota
       * refusal kept that refusal as gml_last_error) */
      if (c->ctr.ooms == ooms) snprintf(c->last_error, sizeof c->last_error, "%s", c->alloc.last_error);
      goto out;
    }
    r->ptr = (uintptr_t)p;
    r->size = gmli_round_up(size, GML_ALIGN);
    r->pool = pool;
    if (gmli_recmap_put(&c->recs, r)) {
      gmli_alloc_free(&c->alloc, p);
      free(r);
      rc = GML_ENOMEM;
      goto out;
    }
  }
  gmli_rec_activate(c, r, pool, size, stream, tag);
  *ptr = (void *)r->ptr;
out:
  if (++c->ops_since_check >= 256 || rc || c->reclaim_pending) {
    c->ops_since_check = 0;
    gmli_client_housekeeping(c, rc != 0);
  }
  pthread_mutex_unlock(&c->track_lock);
  if (t0) __atomic_fetch_add(&c->alloc.malloc_ns, gmli_now_ns() - t0, __ATOMIC_RELAXED);
  return rc;
}

int gml_alloc(gml_client *c, size_t size, gml_stream stream, void **ptr) {
  return gml_alloc_ex(c, size, stream, 0, ptr);
}

void gmli_rec_free(gml_client *c, gml_rec *r, uint64_t tag) {
  gmli_stat_dec(&c->ctr.allocation, 1);
  gmli_stat_dec(&c->ctr.allocated_bytes, (int64_t)r->size);
  gmli_stat_dec(&c->ctr.requested_bytes, (int64_t)r->requested);
  r->tag = tag ? tag : r->tag;
  gmli_trace_add(c, GML_TRACE_FREE_REQUESTED, r->ptr, r->size, r->stream, r->pool, r->tag);
  r->state = GML_BLOCK_PENDING_FREE;
  if (r->nuses || r->uses_overflow) gmli_streams_defer(c, r);
  else gmli_rec_release(c, r);
}

int gml_free_ex(gml_client *c, void *ptr, uint64_t tag) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  gml_rec *r = gmli_recmap_get(&c->recs, (uintptr_t)ptr, 0);
  int rc = 0;
  if (!r || r->state != GML_BLOCK_ALLOCATED) {
    snprintf(c->last_error, sizeof c->last_error, "free of %p: not a live allocation of this client", ptr);
    rc = GML_EBADPTR;
    goto out;
  }
  gmli_rec_free(c, r, tag);
  if (c->pending) gmli_streams_poll(c, 0);
out:
  if (++c->ops_since_check >= 256 || c->reclaim_pending) {
    c->ops_since_check = 0;
    gmli_client_housekeeping(c, 0);
  }
  pthread_mutex_unlock(&c->track_lock);
  if (!rc && __atomic_load_n(&c->gc_on, __ATOMIC_RELAXED))
    gmli_torch_conf_collect(c); /* a framework client's PyTorch setting */
  return rc;
}

int gml_free(gml_client *c, void *ptr) { return gml_free_ex(c, ptr, 0); }

int gml_step(gml_client *c) {
  if (!c) return GML_EINVAL;
  int rc = gmli_alloc_step(&c->alloc);
  return rc ? gmli_fail(c, rc, "gml_step: no memory to record or plan the iteration (served as without a plan)") : 0;
}

int gml_trim(gml_client *c, size_t *released_bytes) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  gmli_streams_poll(c, 1);
  gmli_pools_trim(c);
  size_t n = gmli_alloc_release_idle(&c->alloc, 0);
  note_reserved(c);
  if (released_bytes) *released_bytes = n;
  gmli_client_housekeeping(c, 1);
  pthread_mutex_unlock(&c->track_lock);
  return 0;
}

/* ---------- what the layer reads ---------- */

int gml_contains(gml_client *c, const void *ptr) {
  return c && (uintptr_t)ptr >= c->alloc.va_base && (uintptr_t)ptr < c->alloc.va_base + c->alloc.va_size;
}

int gml_size_of(gml_client *c, const void *ptr, size_t *requested, size_t *size) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  gml_rec *r = gmli_recmap_get(&c->recs, (uintptr_t)ptr, 0);
  int ok = r && r->state == GML_BLOCK_ALLOCATED;
  if (ok && requested) *requested = r->requested;
  if (ok && size) *size = r->size;
  pthread_mutex_unlock(&c->track_lock);
  return ok ? 0 : gmli_fail(c, GML_EBADPTR, "gml_size_of: %p is not a live allocation of this client", ptr);
}

int gml_stats_get(gml_client *c, gml_stats *out) {
  if (!c) return GML_EINVAL;
  if (!out) return gmli_fail(c, GML_EINVAL, "gml_stats_get: out is NULL");
  gmli_alloc_stats(&c->alloc, out);
  gmli_grow_stats(c, out);
  gmli_pause_stats(c, out);
  out->swap_out_bytes = __atomic_load_n(&c->swap_out, __ATOMIC_RELAXED);
  out->swap_in_bytes = __atomic_load_n(&c->swap_in, __ATOMIC_RELAXED);
  out->swap_copy_ns = __atomic_load_n(&c->swap_ns, __ATOMIC_RELAXED);
  out->swap_host_bytes = __atomic_load_n(&c->swap_host, __ATOMIC_RELAXED);
  out->version = GML_VERSION;
  out->mode = c->mode;
  return 0;
}

int gml_mem_stats_get(gml_client *c, gml_mem_stats *o) {
  if (!c) return GML_EINVAL;
  if (!o) return gmli_fail(c, GML_EINVAL, "gml_mem_stats_get: out is NULL");
  gml_stats st;
  pthread_mutex_lock(&c->track_lock);
  gmli_alloc_stats(&c->alloc, &st);
  gml_counters *k = &c->ctr;
  memset(o, 0, sizeof *o);
  o->allocation = k->allocation;
  o->active = k->active;
  o->allocated_bytes = k->allocated_bytes;
  o->active_bytes = k->active_bytes;
  o->requested_bytes = k->requested_bytes;
  uint64_t cs = st.chunk_size, held = st.reserved / cs;
  if (st.reserved > k->reserved_peak) k->reserved_peak = st.reserved;
  o->reserved_bytes =
      (gml_stat){(int64_t)st.reserved, (int64_t)k->reserved_peak, (int64_t)((st.chunks_leased - k->base_acquired) * cs),
                 (int64_t)((st.chunks_returned - k->base_released) * cs)};
  o->segment =
      (gml_stat){(int64_t)held, (int64_t)(k->reserved_peak / cs), (int64_t)(st.chunks_leased - k->base_acquired),
                 (int64_t)(st.chunks_returned - k->base_released)};
  /* held, not used by a live block, and not a whole free chunk (those can go back) */
  int64_t inactive = (int64_t)st.reserved - k->active_bytes.current - (int64_t)st.largest_free;
  k->inactive_split_bytes.current = inactive > 0 ? inactive : 0;
  if (k->inactive_split_bytes.current > k->inactive_split_bytes.peak)
    k->inactive_split_bytes.peak = k->inactive_split_bytes.current;
  o->inactive_split_bytes = k->inactive_split_bytes;
  o->num_alloc_retries = k->retries;
  o->num_ooms = k->ooms;
  o->num_sync_all_streams = (int64_t)st.syncs + k->waits;
  o->num_device_alloc = o->segment.allocated;
  o->num_device_free = o->segment.freed;
  o->limit_bytes = (int64_t)c->alloc.limit_bytes;
  pthread_mutex_unlock(&c->track_lock);
  return 0;
}

int gml_reset_peak(gml_client *c) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  gml_stat *s[] = {&c->ctr.allocation,   &c->ctr.active,          &c->ctr.allocated_bytes,
                   &c->ctr.active_bytes, &c->ctr.requested_bytes, &c->ctr.inactive_split_bytes};
  for (size_t i = 0; i < GML_ARRAY_LEN(s); i++) s[i]->peak = s[i]->current;
  c->ctr.reserved_peak = (uint64_t)c->alloc.held * c->alloc.cs;
  pthread_mutex_unlock(&c->track_lock);
  return 0;
}

int gml_reset_accumulated(gml_client *c) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  gml_stat *s[] = {&c->ctr.allocation,   &c->ctr.active,          &c->ctr.allocated_bytes,
                   &c->ctr.active_bytes, &c->ctr.requested_bytes, &c->ctr.inactive_split_bytes};
  for (size_t i = 0; i < GML_ARRAY_LEN(s); i++) s[i]->allocated = s[i]->freed = 0;
  c->ctr.retries = c->ctr.ooms = 0;
  c->ctr.waits = -(int64_t)c->alloc.syncs;
  c->ctr.base_acquired = c->alloc.chunks_acquired;
  c->ctr.base_released = c->alloc.chunks_released;
  pthread_mutex_unlock(&c->track_lock);
  return 0;
}

int gml_set_limit(gml_client *c, size_t bytes) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->alloc.lock);
  c->alloc.limit_bytes = bytes;
  pthread_mutex_unlock(&c->alloc.lock);
  return 0;
}

int gml_device_memory(gml_client *c, uint64_t *free_bytes, uint64_t *total_bytes) {
  if (!c) return GML_EINVAL;
  if (!free_bytes || !total_bytes)
    return gmli_fail(c, GML_EINVAL, "gml_device_memory: %s is NULL", !free_bytes ? "free_bytes" : "total_bytes");
  return c->be->ops->mem_info(c->be, free_bytes, total_bytes);
}

static int cmp_block(const void *x, const void *y) {
  const gml_alloc_info *a = x, *b = y;
  return a->addr < b->addr ? -1 : a->addr > b->addr;
}

int gml_allocations(gml_client *c, gml_alloc_info *out, size_t cap, size_t *n) {
  if (!c) return GML_EINVAL;
  if ((cap && !out) || !n)
    return gmli_fail(c, GML_EINVAL, "gml_allocations: %s is NULL", !n ? "n" : "out (with cap > 0)");
  pthread_mutex_lock(&c->track_lock);
  size_t k = 0;
  for (size_t i = 0; i < c->recs.cap; i++)
    for (gml_rec *r = c->recs.buckets[i]; r; r = r->hnext, k++) {
      if (k >= cap) continue;
      out[k] = (gml_alloc_info){.addr = r->ptr,
                                .size = r->size,
                                .requested = r->requested,
                                .state = r->state,
                                .stream = r->stream,
                                .tag = r->tag};
      if (r->pool >= 0) out[k].pool = c->pools[r->pool].id;
    }
  pthread_mutex_unlock(&c->track_lock);
  *n = k;
  if (out && k) qsort(out, GML_MIN(k, cap), sizeof *out, cmp_block);
  return 0;
}

void gmli_track_destroy(gml_client *c) {
  pthread_mutex_lock(&c->track_lock);
  gmli_streams_poll(c, 1);
  for (int i = 0; i < GML_MAX_POOLS; i++) c->pools[i].use_count = 0;
  gmli_pools_trim(c);
  gmli_recmap_destroy(&c->recs); /* live ones: the allocator's destroy takes their memory back */
  free(c->trace.e);
  c->trace.e = NULL;
  c->trace.cap = 0;
  pthread_mutex_unlock(&c->track_lock);
}
