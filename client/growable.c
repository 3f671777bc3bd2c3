/* growable.c: growable ranges (gmlake.h: gml_growable_*). A range is a
 * virtual reservation of its own, chunk slots mapped and unmapped on demand
 * with chunks from the allocator's chunk source (the daemon's leases, or the
 * backend when embedded), so it grows in place: mapping more never moves
 * what is mapped. The allocator never sees these chunks; the client's stats
 * count them apart (growable_mapped / growable_unmapped) and so does the
 * usage report to the daemon. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "log.h"
#include "util.h"
#include "wire.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gmli_grow_init(gml_client *c) {
  memset(&c->grow, 0, sizeof c->grow);
  pthread_mutex_init(&c->grow.lock, NULL);
}

void gmli_grow_stats(gml_client *c, gml_stats *st) {
  pthread_mutex_lock(&c->grow.lock);
  st->growable_ranges = c->grow.ranges;
  st->growable_mapped = c->grow.mapped;
  st->growable_unmapped = c->grow.reserved - c->grow.mapped - c->grow.shared;
  st->shared_mapped = c->grow.shared;
  pthread_mutex_unlock(&c->grow.lock);
}

static void set_error(gml_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(gml_client *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
  va_end(ap);
}

/* Give chunks back to the source, at most one message's worth at a time. grow.lock held. */
static void release_chunks(gml_client *c, size_t n, const gml_phys *phys, const uint64_t *ids) {
  for (size_t i = 0; i < n; i += GML_MAX_LEASE_CHUNKS) {
    size_t k = GML_MIN(n - i, (size_t)GML_MAX_LEASE_CHUNKS);
    c->alloc.src.release(c->alloc.src.ctx, k, phys + i, ids + i);
  }
  c->grow.chunks_returned += n;
}

/* n chunks from the source, all or none (embedded, the source applies the
 * client's limit to the allocator's chunks and the ranges' together). On a
 * shortage the allocator's idle cache goes back first, once. grow.lock held. */
static int acquire_chunks(gml_client *c, size_t n, gml_phys *phys, uint64_t *ids) {
  size_t got = 0;
  int retried = 0;
  while (got < n) {
    int rc = c->alloc.src.acquire(c->alloc.src.ctx, n - got, 0, phys + got, ids + got);
    if (rc > 0) {
      got += (size_t)rc;
      continue;
    }
    if (rc == GML_ENOMEM && !retried && gmli_alloc_release_idle(&c->alloc, (n - got) * c->be->chunk_size) > 0) {
      retried = 1;
      continue;
    }
    if (got) release_chunks(c, got, phys, ids), c->grow.chunks_returned -= got;
    return rc ? rc : GML_ENOMEM;
  }
  c->grow.chunks_leased += n;
  return 0;
}

static int check_range(gml_growable *g, size_t offset, size_t len) {
  if (g->shared) {
    set_error(g->c, "growable range: shared as '%s': read-only, its chunks are the share's", g->key);
    return GML_EINVAL;
  }
  if (g->broken) {
    set_error(g->c, "growable range: unusable since a failed dedup could not put its own chunks back: destroy it");
    return GML_EBACKEND;
  }
  if (offset % g->cs || len % g->cs || offset > g->size || len > g->size - offset) {
    if (offset % g->cs || len % g->cs)
      set_error(g->c, "growable range: offset %zu / length %zu not chunk-aligned (chunks of %zu)", offset, len, g->cs);
    else set_error(g->c, "growable range: offset %zu / length %zu past the end (%zu bytes)", offset, len, g->size);
    return GML_EINVAL;
  }
  return 0;
}

int gml_growable_create(gml_client *c, size_t max_bytes, gml_growable **out) {
  if (!c) return GML_EINVAL;
  if (!out) return gmli_fail(c, GML_EINVAL, "gml_growable_create: out is NULL");
  if (!max_bytes) return gmli_fail(c, GML_EINVAL, "gml_growable_create: max_bytes 0 (a range is at least one chunk)");
  size_t cs = c->be->chunk_size;
  if (max_bytes > SIZE_MAX - cs)
    return gmli_fail(c, GML_EINVAL, "gml_growable_create: max_bytes %zu does not round up to whole chunks of %zu",
                     max_bytes, cs);
  gml_growable *g = calloc(1, sizeof *g);
  if (!g) return gmli_fail(c, GML_ENOMEM, "gml_growable_create: no memory for the range's bookkeeping");
  g->c = c;
  g->cs = cs;
  g->size = gmli_round_up(max_bytes, cs);
  g->nslots = g->size / cs;
  g->phys = calloc(g->nslots, sizeof *g->phys);
  g->ids = calloc(g->nslots, sizeof *g->ids);
  g->mapped = calloc(g->nslots, 1);
  int rc = g->phys && g->ids && g->mapped ? c->be->ops->va_reserve(c->be, g->size, &g->base) : GML_ENOMEM;
  if (rc) {
    set_error(c, "cannot reserve a growable range of %zu bytes", g->size);
    free(g->phys), free(g->ids), free(g->mapped), free(g);
    return rc;
  }
  pthread_mutex_lock(&c->grow.lock);
  g->next = c->grow.head;
  if (g->next) g->next->prev = g;
  c->grow.head = g;
  c->grow.ranges++;
  c->grow.reserved += g->size;
  pthread_mutex_unlock(&c->grow.lock);
  *out = g;
  return 0;
}

/* Unmap slots [s0, s1) that are mapped and give their chunks back. grow.lock held. */
int gmli_grow_unmap_slots(gml_growable *g, size_t s0, size_t s1) {
  gml_client *c = g->c;
  gml_backend *be = c->be;
  size_t n = 0;
  for (size_t s = s0; s < s1; s++) n += g->mapped[s];
  if (!n) return 0;
  /* no kernel may still use a chunk that goes back to the lake */
  int rc = be->ops->synchronize(be);
  if (rc) return rc;
  gml_phys *phys = malloc(n * sizeof *phys);
  uint64_t *ids = malloc(n * sizeof *ids);
  if (!phys || !ids) {
    free(phys), free(ids);
    return GML_ENOMEM;
  }
  size_t k = 0;
  for (size_t s = s0; s < s1;) {
    if (!g->mapped[s]) {
      s++;
      continue;
    }
    size_t e = s;
    while (e < s1 && g->mapped[e]) e++;
    rc = be->ops->unmap(be, g->base + s * g->cs, (e - s) * g->cs);
    if (rc) break; /* what stays mapped stays counted */
    for (size_t i = s; i < e; i++) {
      phys[k] = g->phys[i], ids[k] = g->ids[i], k++;
      g->mapped[i] = 0;
    }
    s = e;
  }
  g->nmapped -= k;
  __atomic_fetch_sub(&c->grow.mapped, k * g->cs, __ATOMIC_RELAXED);
  release_chunks(c, k, phys, ids);
  free(phys), free(ids);
  return rc;
}

/* Map chunks at the unmapped slots of [s0, s1): all or nothing. grow.lock held. */
static int map_slots(gml_growable *g, size_t s0, size_t s1) {
  gml_client *c = g->c;
  gml_backend *be = c->be;
  size_t n = 0;
  for (size_t s = s0; s < s1; s++) n += !g->mapped[s];
  if (!n) return 0;
  gml_phys *phys = malloc(n * sizeof *phys);
  uint64_t *ids = malloc(n * sizeof *ids);
  size_t *slots = malloc(n * sizeof *slots);
  int rc = phys && ids && slots ? acquire_chunks(c, n, phys, ids) : GML_ENOMEM;
  if (rc) {
    set_error(c, "growable range: %zu chunk(s) of %zu bytes not available: %s", n, g->cs, gml_strerror(rc));
    free(phys), free(ids), free(slots);
    return rc;
  }
  size_t k = 0;
  for (size_t s = s0; s < s1 && k < n; s++) {
    if (g->mapped[s]) continue;
    rc = be->ops->map(be, g->base + s * g->cs, phys[k]);
    if (rc) break;
    slots[k++] = s;
    g->mapped[s] = 1;
  }
  /* make every new run usable: one set-access call a run (the costly step on cuda) */
  for (size_t i = 0; i < k && !rc;) {
    size_t e = i + 1;
    while (e < k && slots[e] == slots[e - 1] + 1) e++;
    rc = be->ops->set_access(be, g->base + slots[i] * g->cs, (e - i) * g->cs, 0);
    i = e;
  }
  if (rc) { /* undo this call's mappings; every chunk it took goes back */
    for (size_t i = 0; i < k; i++) {
      be->ops->unmap(be, g->base + slots[i] * g->cs, g->cs);
      g->mapped[slots[i]] = 0;
    }
    release_chunks(c, n, phys, ids);
    set_error(c, "growable range: mapping %zu chunk(s) failed: %s", n, gml_strerror(rc));
  } else {
    for (size_t i = 0; i < k; i++) g->phys[slots[i]] = phys[i], g->ids[slots[i]] = ids[i];
    g->nmapped += k;
    __atomic_fetch_add(&c->grow.mapped, k * g->cs, __ATOMIC_RELAXED);
  }
  free(phys), free(ids), free(slots);
  return rc;
}

/* After a change in daemon mode: tell the daemon now. Called without grow.lock. */
static void report(gml_client *c) {
  if (c->mode == GML_MODE_DAEMON) gml_flush(c);
}

int gml_growable_map(gml_growable *g, size_t offset, size_t len) {
  if (!g) return GML_EINVAL;
  int rc = check_range(g, offset, len);
  if (rc) return rc;
  pthread_mutex_lock(&g->c->grow.lock);
  size_t before = g->nmapped;
  rc = map_slots(g, offset / g->cs, (offset + len) / g->cs);
  int changed = g->nmapped != before;
  pthread_mutex_unlock(&g->c->grow.lock);
  if (changed) report(g->c);
  return rc;
}

int gml_growable_unmap(gml_growable *g, size_t offset, size_t len) {
  if (!g) return GML_EINVAL;
  int rc = check_range(g, offset, len);
  if (rc) return rc;
  pthread_mutex_lock(&g->c->grow.lock);
  size_t before = g->nmapped;
  rc = gmli_grow_unmap_slots(g, offset / g->cs, (offset + len) / g->cs);
  int changed = g->nmapped != before;
  pthread_mutex_unlock(&g->c->grow.lock);
  if (changed) report(g->c);
  return rc;
}

int gml_growable_ensure(gml_growable *g, size_t bytes) {
  if (!g) return GML_EINVAL;
  if (g->shared) return check_range(g, 0, 0);
  if (bytes > g->size)
    return gmli_fail(g->c, GML_EINVAL, "gml_growable_ensure: %zu bytes asked of a range of %zu", bytes, g->size);
  return gml_growable_map(g, 0, gmli_round_up(bytes, g->cs));
}

int gml_growable_shrink(gml_growable *g, size_t bytes) {
  if (!g) return GML_EINVAL;
  if (g->shared) return check_range(g, 0, 0);
  if (bytes > g->size)
    return gmli_fail(g->c, GML_EINVAL, "gml_growable_shrink: to %zu bytes, past the end of the range (%zu bytes)",
                     bytes, g->size);
  size_t keep = gmli_round_up(bytes, g->cs);
  return gml_growable_unmap(g, keep, g->size - keep);
}

int gml_growable_is_mapped(gml_growable *g, size_t offset) {
  if (!g) return GML_EINVAL;
  if (offset >= g->size)
    return gmli_fail(g->c, GML_EINVAL, "gml_growable_is_mapped: offset %zu is past the end of the range (%zu bytes)",
                     offset, g->size);
  pthread_mutex_lock(&g->c->grow.lock);
  int m = g->mapped[offset / g->cs];
  pthread_mutex_unlock(&g->c->grow.lock);
  return m;
}

int gml_growable_info_get(gml_growable *g, gml_growable_info *out) {
  if (!g) return GML_EINVAL;
  if (!out) return gmli_fail(g->c, GML_EINVAL, "gml_growable_info_get: out is NULL");
  pthread_mutex_lock(&g->c->grow.lock);
  out->base = (void *)g->base;
  out->reserved = g->size;
  out->mapped = g->nmapped * g->cs;
  size_t p = 0;
  while (p < g->nslots && g->mapped[p]) p++;
  out->mapped_prefix = p * g->cs;
  out->chunk_size = g->cs;
  pthread_mutex_unlock(&g->c->grow.lock);
  return 0;
}

/* grow.lock held. */
static int destroy_locked(gml_growable *g) {
  gml_client *c = g->c;
  int rc = g->shared ? c->grow.release_shared(g) : gmli_grow_unmap_slots(g, 0, g->nslots);
  if (rc) return rc; /* still mapped: keep the range rather than free a mapped reservation */
  c->be->ops->va_free(c->be, g->base, g->size);
  if (g->prev) g->prev->next = g->next;
  else c->grow.head = g->next;
  if (g->next) g->next->prev = g->prev;
  c->grow.ranges--;
  c->grow.reserved -= g->size;
  free(g->pub.meta), free(g->pub.allow);
  free(g->phys), free(g->ids), free(g->mapped), free(g);
  return 0;
}

int gml_growable_destroy(gml_growable *g) {
  if (!g) return GML_EINVAL;
  gml_client *c = g->c;
  pthread_mutex_lock(&c->grow.lock);
  int had = g->nmapped != 0;
  int rc = destroy_locked(g);
  pthread_mutex_unlock(&c->grow.lock);
  if (had) report(c);
  return rc;
}

void gmli_grow_destroy_all(gml_client *c) {
  pthread_mutex_lock(&c->grow.lock);
  while (c->grow.head) {
    gml_growable *g = c->grow.head;
    if (destroy_locked(g)) {
      GML_ERR("a growable range at %#lx could not be unmapped at close", (unsigned long)g->base);
      c->grow.head = g->next; /* leave it: its chunks go back when the process exits */
    }
  }
  pthread_mutex_unlock(&c->grow.lock);
  pthread_mutex_destroy(&c->grow.lock);
}

static void holder_handover(gml_client *c, gml_chunk_fn fn, void *ctx, int how) {
  (void)how;
  for (gml_growable *g = c->grow.head; g; g = g->next)
    for (size_t k = 0; k < g->nslots && !g->shared; k++) /* a share's chunks are the share's, not ours */
      if (g->mapped[k]) fn(ctx, g->phys[k], &g->ids[k]);
}

static void holder_lock(gml_client *c) { pthread_mutex_lock(&c->grow.lock); }
static void holder_unlock(gml_client *c) { pthread_mutex_unlock(&c->grow.lock); }

const gml_holder_ops gmli_grow_holder = {
    .lock = holder_lock, .unlock = holder_unlock, .handover = holder_handover, .usage = gmli_grow_stats};
