/* alloc.c: the allocator's entry points (alloc.h). The fast path of a
 * request (a cached block fits and its slots keep their chunks) is
 * gmli_alloc_malloc down to the pointer-map insert: a best-fit search, slot
 * use counts, maybe a split. Anything rarer is a named *_slow function:
 * mapping chunks (slots.c), harvesting other streams' blocks, failures.
 * Decisions are policy.c's plans, carried out here (placement) and in
 * slots.c (chunks); bookkeeping is blocks.c's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "alloc_internal.h"
#include "guard.h"
#include "log.h"
#include "planned.h"
#include "policy.h"
#include "util.h"
#include <execinfo.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

/* ---------- malloc and free ---------- */

static void format_oom(gml_allocator *a, size_t size, int rc) {
  char s1[32], s2[32], s3[32], s4[32];
  snprintf(a->last_error, sizeof a->last_error, "%s: asked %s, allocated %s, cached %s, held %s%s",
           rc == GML_EDAEMON ? "no new chunks: the daemon is gone (a lease fails until it is back)" : "out of memory",
           gmli_format_bytes(size, s1, sizeof s1), gmli_format_bytes(a->allocated, s2, sizeof s2),
           gmli_format_bytes(reserved_bytes(a) - a->allocated, s3, sizeof s3),
           gmli_format_bytes(reserved_bytes(a), s4, sizeof s4), rc == GML_EQUOTA ? " (quota reached)" : "");
}

/* Size 0, or more than half the virtual range (by default twice the
 * device's memory, so more than the device has): refused before anything is
 * leased. The message names the bound and the variable that raises it. */
static int malloc_bad_size_slow(gml_allocator *a, size_t size) {
  char s1[32], s2[32];
  if (!size) snprintf(a->last_error, sizeof a->last_error, "invalid size 0");
  else
    snprintf(a->last_error, sizeof a->last_error,
             "%s is more than half the %s of virtual address space reserved (GMLAKE_VA_SIZE raises it)",
             gmli_format_bytes(size, s1, sizeof s1), gmli_format_bytes(a->va_size, s2, sizeof s2));
  return size ? GML_ENOMEM : GML_EINVAL;
}

/* No free block is large enough: the region's virtual range is used up. */
static int malloc_no_fit_slow(gml_allocator *a, gml_region *r, size_t size) {
  format_oom(a, size, GML_ENOMEM);
  snprintf(a->last_error + strlen(a->last_error), sizeof a->last_error - strlen(a->last_error),
           " (virtual range of the %s region exhausted)", r == &a->regions[0] ? "small" : "large");
  a->ooms++;
  return GML_ENOMEM;
}

/* Block b (out of its pool, slots [first, last] claimed) has `need` slots
 * without a chunk of their own: map them. On failure b goes back free and
 * the slots unclaimed; returns the error the caller reports. */
static int malloc_map_slow(gml_allocator *a, gml_region *r, gml_block *b, size_t size, uint32_t first, uint32_t last,
                           size_t need, gml_stream stream, int *stole) {
  GML_DEBUG("map: size %zu needs %zu of %u slots (free chunks %zu, tick %llu)", gmli_round_up(size, GML_ALIGN), need,
            last - first + 1, free_chunks(a), (unsigned long long)a->tick);
  uint64_t t0 = gmli_now_ns();
  a->mapped_allocs++;
  int rc = gmli_map_slots_slow(a, first, last, stream, stole);
  a->map_ns += gmli_now_ns() - t0;
  if (!rc) return 0;
  gmli_slots_unclaim(a, first, last);
  gmli_pool_add(r, b->pool, gmli_block_coalesce(a, r, b));
  if (rc == GML_EAGAIN) { /* would lease (GML_ALLOC_NO_GROW): not an out-of-memory; asked again */
    a->mapped_allocs--;
    return rc;
  }
  format_oom(a, size, rc);
  a->ooms++;
  return rc == GML_EQUOTA || rc == GML_EDAEMON || rc == GML_EBACKEND ? rc : GML_ENOMEM;
}

/* Guard mode: b's guards could not be made (an unmap or protect failed). */
static int malloc_guard_failed_slow(gml_allocator *a, gml_region *r, gml_block *b, size_t size, uint32_t first,
                                    uint32_t last, int rc) {
  gmli_slots_unclaim(a, first, last);
  gmli_pool_add(r, b->pool, gmli_block_coalesce(a, r, b));
  format_oom(a, size, rc);
  a->ooms++;
  return rc == GML_EBACKEND ? rc : GML_ENOMEM;
}

/* Guard mode: when and where b was allocated, for the fault report. */
static void malloc_guard_record_slow(gml_allocator *a, gml_block *b) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  b->alloc_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  if (a->guard_bt && (b->bt = calloc(GML_GUARD_BT, sizeof *b->bt))) backtrace(b->bt, GML_GUARD_BT);
}

/* The pointer map could not grow: b cannot be tracked, so it must not be
 * handed out. */
static int malloc_untracked_slow(gml_allocator *a, gml_region *r, gml_block *b, uint32_t first, uint32_t last) {
  if (a->guard) gmli_guards_set(a, b, 0);
  gmli_slots_unclaim(a, first, last);
  b->is_free = 1;
  gmli_pool_add(r, b->pool, gmli_block_coalesce(a, r, b));
  return GML_ENOMEM;
}

/* Carry out the placement policy's steps until it names the block. */
static gml_block *place_slow(gml_allocator *a, gml_region *r, int pi, size_t rsize, gml_stream stream,
                             gml_place_plan p) {
  while (p.kind != GML_PLACE_FIT) {
    int moved = 0;
    switch (p.kind) {
    case GML_PLACE_HARVEST: moved = gmli_harvest_streams_slow(a, r); break;
    case GML_PLACE_TAKE_ORDERED: moved = gmli_take_ordered_slow(a, r, pi, stream); break;
    case GML_PLACE_BORROW:
      if (gmli_borrows_pending(a) < p.max_pending && !gmli_order_after_slow(a, stream, p.lender))
        moved = gmli_take_ordered_slow(a, r, pi, stream);
      break;
    case GML_PLACE_FIT:
    case GML_PLACE_AT: /* planned.c's, never here */ break;
    }
    p = gmli_policy_place_next(a, r, pi, rsize, stream, &p, moved);
  }
  return p.block;
}

int gmli_alloc_malloc(gml_allocator *a, size_t size, gml_stream stream, void **ptr) {
  return gmli_alloc_malloc_ex(a, size, stream, 0, ptr);
}

/* A request the plan did not serve (g: what the keeper said of it; NULL: planned placement off), a->lock held. */
static int malloc_locked(gml_allocator *a, size_t size, size_t rsize, gml_stream stream, int flags,
                         const gml_plan_grant *g, void **ptr) {
  size_t bsize = gmli_policy_block_size(a, rsize);
  gml_region *r = region_for(a, bsize);
  int pi = pool_index(a, r, stream, 1);
  gml_place_plan plan = gmli_policy_place(a, r, pi, rsize, stream);
  gml_block *b = plan.kind == GML_PLACE_FIT ? plan.block : place_slow(a, r, pi, rsize, stream, plan);
  if (!b) return malloc_no_fit_slow(a, r, size);
  gmli_pool_del(r, b);
  /* Claim the slots first, so that stitching cannot take their chunks;
   * whole-slot guards are not claimed. */
  uintptr_t lo, hi;
  claim_window(a, b->addr, bsize, rsize, &lo, &hi);
  uint32_t first = slot_of(a, lo), last = slot_of(a, hi - 1);
  size_t need = 0;
  for (uint32_t s = first; s <= last; s++) need += (size_t)slot_claim(a, s, stream);
  int stole = 0, rc;
  a->no_grow = flags & GML_ALLOC_NO_GROW;
  rc = need ? malloc_map_slow(a, r, b, size, first, last, need, stream, &stole) : 0;
  a->no_grow = 0;
  if (rc) {
    GML_DEBUG("%s", a->last_error);
    return rc;
  }
  b->ptr = a->guard ? gmli_policy_guard_ptr(a, b->addr, rsize) : b->addr;
  b->usable = rsize;
  if (a->guard && (rc = gmli_guards_set(a, b, 1))) return malloc_guard_failed_slow(a, r, b, size, first, last, rc);
  if (b->size - bsize >= GML_ALIGN) {
    gml_block *rest = gmli_block_split(a, b, bsize);
    if (rest) gmli_pool_add(r, b->pool, rest);
  }
  if (!a->guard) b->usable = b->size; /* all of it: a split's rest under 512 B */
  if (b->has_event) {
    a->be->ops->event_destroy(a->be, b->event);
    b->has_event = 0;
  }
  a->borrows += b->lent && b->lender != stream;
  b->lent = 0;
  b->is_free = 0;
  b->stream = stream;
  b->stitched = (uint8_t)stole;
  b->pause_tag = a->tag;
  if (gmli_ptrmap_put(&a->live, b->ptr, b)) return malloc_untracked_slow(a, r, b, first, last);
  if (g) b->grant = *g;
  b->req = size;
  b->seq = ++a->alloc_count;
  b->alloc_ns = 0;
  if (a->guard) malloc_guard_record_slow(a, b);
  a->allocated += b->usable;
  if (b->stitched) a->stitched += b->usable;
  if (a->allocated > a->peak_allocated) a->peak_allocated = a->allocated;
  if (reserved_bytes(a) > a->peak_reserved) a->peak_reserved = reserved_bytes(a);
  *ptr = (void *)b->ptr;
  return 0;
}

int gmli_alloc_malloc_ex(gml_allocator *a, size_t size, gml_stream stream, int flags, void **ptr) {
  if (!size || size > (a->va_size >> 1)) return malloc_bad_size_slow(a, size);
  size_t rsize = gmli_round_up(size, GML_ALIGN);
  pthread_mutex_lock(&a->lock);
  a->tick++;
  gml_plan_grant g;
  uint64_t hash_before = 0;
  int rc = a->plan ? gmli_planned_malloc(a, size, rsize, stream, flags & GML_ALLOC_NO_GROW, ptr, &g, &hash_before) : 1;
  if (rc == 1) {
    rc = malloc_locked(a, size, rsize, stream, flags, a->plan ? &g : NULL, ptr);
    if (rc && a->plan) gmli_planned_unserved(a, &g, hash_before); /* never served: not recorded either */
  }
  pthread_mutex_unlock(&a->lock);
  return rc;
}

int gmli_alloc_free(gml_allocator *a, void *ptr) {
  pthread_mutex_lock(&a->lock);
  gml_block *b = gmli_ptrmap_take(&a->live, (uintptr_t)ptr, 1);
  if (!b) {
    snprintf(a->last_error, sizeof a->last_error, "free of %p: not a live block of this client", ptr);
    pthread_mutex_unlock(&a->lock);
    return GML_EBADPTR;
  }
  if (b->paused) { /* its slots are let go already: it becomes free at resume (pause.c) */
    b->paused = GML_PAUSED_FREED;
    a->free_count++;
    pthread_mutex_unlock(&a->lock);
    return 0;
  }
  if (b->planned == GMLI_BLOCK_PLANNED) { /* served in a planned range (planned.c) */
    gmli_planned_free(a, b, 1);
    pthread_mutex_unlock(&a->lock);
    return 0;
  }
  if (a->plan) gmli_planned_note_free(a, b);
  gml_region *r = &a->regions[b->region];
  uint32_t first, last;
  block_slots(a, b, &first, &last);
  a->tick++;
  if (a->guard) { /* its guards become ordinary memory again (page guards) */
    gmli_guards_set(a, b, 0);
    free(b->bt);
    b->bt = NULL;
  }
  for (uint32_t s = first; s <= last; s++)
    if (--a->slot_use[s] == 0) slot_release(a, s);
  if ((a->free_count & 255) == 0) gmli_fence_update(a); /* keep a recent fence: remaps then need no synchronize */
  a->allocated -= b->usable;
  if (b->stitched) a->stitched -= b->usable;
  a->free_count++;
  b->is_free = 1;
  b->pool = (uint8_t)pool_index(a, r, b->stream, 1);
  b->has_event = 0;
  b->lent = 0;
  b->free_tick = a->tick;
  b = gmli_block_coalesce(a, r, b);
  gmli_pool_add(r, b->pool, b);
  pthread_mutex_unlock(&a->lock);
  return 0;
}

int gmli_alloc_block_phys(gml_allocator *a, void *ptr, gml_phys *phys, size_t max, size_t *n, size_t *offset,
                          size_t *size) {
  pthread_mutex_lock(&a->lock);
  gml_block *b = gmli_ptrmap_take(&a->live, (uintptr_t)ptr, 0);
  int rc = 0;
  if (!b) {
    rc = GML_EBADPTR;
  } else {
    /* the caller's bytes (ptr, usable): in guard mode the block's start and its guards lie
     * around them, and a whole-slot guard maps no chunk of this block */
    uint32_t first = slot_of(a, b->ptr), last = slot_of(a, b->ptr + b->usable - 1);
    *n = last - first + 1;
    *offset = b->ptr - slot_addr(a, first);
    *size = b->usable;
    if (*n > max) rc = GML_EINVAL;
    for (uint32_t s = first; !rc && s <= last; s++) phys[s - first] = a->chunks[a->slot_chunk[s]].phys;
  }
  pthread_mutex_unlock(&a->lock);
  return rc;
}

int gmli_alloc_quiesce(gml_allocator *a) {
  pthread_mutex_lock(&a->lock);
  int rc = a->be->ops->synchronize(a->be);
  if (rc == 0) {
    a->safe_tick = a->tick + 1;
    a->syncs++;
  }
  pthread_mutex_unlock(&a->lock);
  return rc;
}

size_t gmli_alloc_size_of(gml_allocator *a, void *ptr) {
  pthread_mutex_lock(&a->lock);
  gml_block *b = gmli_ptrmap_take(&a->live, (uintptr_t)ptr, 0);
  size_t n = b ? b->usable : 0;
  pthread_mutex_unlock(&a->lock);
  return n;
}

/* ---------- trim, stats, init, destroy ---------- */

size_t gmli_alloc_release_idle(gml_allocator *a, size_t max_bytes) {
  pthread_mutex_lock(&a->lock);
  size_t max_chunks = max_bytes ? max_bytes / a->cs + (max_bytes % a->cs != 0) : SIZE_MAX; /* no wrap near 2^64 */
  /* mapped chunks are unmapped from every slot once the device is done */
  if (!a->no_device_waits && gmli_policy_trim_reaches_mapped(a, max_chunks)) {
    if (a->be->ops->synchronize(a->be) == 0) a->safe_tick = a->tick + 1;
  }
  size_t released = 0;
  int32_t ci;
  while (released < max_chunks && (ci = gmli_policy_trim_next(a)) >= 0) {
    if (a->chunks[ci].list == GML_CL_CACHED && a->chunks[ci].free_tick >= a->safe_tick) break; /* synchronize failed */
    if (gmli_chunk_give_back(a, ci)) break; /* the backend refused an unmap: keep it */
    released++;
  }
  a->chunks_released += released;
  pthread_mutex_unlock(&a->lock);
  return released * a->cs;
}

void gmli_alloc_stats(gml_allocator *a, gml_stats *st) {
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
  st->borrows = a->borrows;
  st->borrow_waits = a->borrow_waits;
  st->lease_calls = a->lease_calls;
  st->lease_wait_ns = __atomic_load_n(&a->lease_wait_ns, __ATOMIC_RELAXED);
  st->import_ns = __atomic_load_n(&a->import_ns, __ATOMIC_RELAXED);
  st->chunks_streamed = __atomic_load_n(&a->chunks_streamed, __ATOMIC_RELAXED);
  st->map_call_ns = a->map_call_ns;
  st->access_ns = a->access_ns;
  size_t nl = a->lease_calls < GML_ARRAY_LEN(a->lease_ns) ? a->lease_calls : GML_ARRAY_LEN(a->lease_ns);
  if (nl) {
    uint64_t tmp[GML_ARRAY_LEN(a->lease_ns)];
    memcpy(tmp, a->lease_ns, nl * sizeof tmp[0]);
    st->lease_p50_ns = (uint64_t)gmli_percentile_u64(tmp, nl, 50);
    st->lease_p99_ns = (uint64_t)gmli_percentile_u64(tmp, nl, 99);
  }
  st->fragmentation = st->reserved ? 1.0 - (double)st->allocated / (double)st->reserved : 0.0;
  st->chunk_size = a->cs;
  st->backend = a->be->name;
  gmli_planned_stats(a, st);
  pthread_mutex_unlock(&a->lock);
}

int gmli_alloc_init(gml_allocator *a, gml_backend *be, gml_chunk_source src, size_t va_size,
                    const gml_alloc_config *cfg) {
  static const gml_alloc_config defaults = GML_ALLOC_CONFIG_DEFAULT;
  if (!cfg) cfg = &defaults;
  memset(a, 0, sizeof *a);
  pthread_mutex_init(&a->lock, NULL);
  a->be = be;
  a->src = src;
  a->cs = be->chunk_size;
  a->va_size = gmli_round_up(va_size, 8 * a->cs);
  a->rng = 0x2545F4914F6CDD1Dull;
  a->timing = cfg->timing;
  a->stream_map = cfg->stream_map;
  a->headroom_pct = cfg->headroom_pct;
  gmli_alloc_set_borrow(a, cfg->borrow, cfg->borrow_ratio, cfg->borrow_max);
  a->dead = -1;
  a->safe_tick = 1; /* fresh chunks (free_tick 0) are ready for every stream */
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
    gmli_alloc_destroy(a);
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
    gml_block *b = gmli_block_new(a);
    if (!b) {
      gmli_alloc_destroy(a);
      return GML_ENOMEM;
    }
    b->addr = r->base;
    b->size = r->size;
    b->region = (uint8_t)i;
    b->is_free = 1;
    r->first = b;
    gmli_pool_add(r, 0, b);
  }
  if (cfg->guard > 0 && (rc = gmli_alloc_set_guard(a, cfg->guard, cfg->guard_grain))) {
    gmli_alloc_destroy(a);
    return rc;
  }
  a->guard_bt = cfg->guard_bt;
  if (cfg->plan && !a->guard &&
      (rc = gmli_planned_init(a, cfg->plan_at))) { /* guard mode: every block its own grains */
    gmli_alloc_destroy(a);
    return rc;
  }
  return 0;
}

int gmli_alloc_step(gml_allocator *a) {
  if (!a->plan) return 0;
  pthread_mutex_lock(&a->lock);
  int rc = gmli_planned_step(a);
  pthread_mutex_unlock(&a->lock);
  return rc;
}

void gmli_alloc_set_borrow(gml_allocator *a, int on, double ratio, int max_waits) {
  if (a->be) pthread_mutex_lock(&a->lock);
  a->borrow = on != 0;
  a->borrow_ratio = ratio >= 1 ? ratio : 1;
  a->borrow_max = max_waits < 0 ? 0 : max_waits > GML_BORROW_MAX_CAP ? GML_BORROW_MAX_CAP : max_waits;
  if (a->be) pthread_mutex_unlock(&a->lock);
}

void gmli_alloc_destroy(gml_allocator *a) {
  if (!a->be) return;
  if (a->guard) gmli_guard_unregister(a);
  for (int i = 0; i < a->borrow_nev; i++) a->be->ops->event_destroy(a->be, a->borrow_ev[i]);
  if (a->slot_chunk) {
    a->be->ops->synchronize(a->be);
    for (uint32_t s = 0; s < a->nslots; s++)
      if (a->slot_chunk[s] >= 0) a->be->ops->unmap(a->be, slot_addr(a, s), a->cs);
    for (size_t i = 0; i < a->chunks_used; i++)
      if (a->chunks[i].list != GML_CL_DEAD) a->src.release(a->src.ctx, 1, &a->chunks[i].phys, &a->chunks[i].id);
  }
  gmli_planned_destroy(a);
  for (int i = 0; i < 2; i++) gmli_region_free_blocks(a, &a->regions[i]);
  if (a->va_base) a->be->ops->va_free(a->be, a->va_base, a->va_size);
  for (int i = 0; i < a->fence_n; i++) a->be->ops->event_destroy(a->be, a->fence_ev[i]);
  free(a->slot_chunk), free(a->slot_use), free(a->slot_anext), free(a->slot_aprev), free(a->slot_idle_tick);
  free(a->slot_stream), free(a->chunks), free(a->seg_ev);
  free(a->live.keys), free(a->live.vals);
  while (a->spare) {
    gml_block *n = a->spare->next;
    free(a->spare);
    a->spare = n;
  }
  pthread_mutex_destroy(&a->lock);
  a->be = NULL;
}
