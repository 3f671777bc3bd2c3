/* records.c: what the framework layer keeps of each allocation, at its
 * bottom: the records by pointer (a chained hash) and the history ring's
 * append. track.c, streams.c, pools.c, ipc.c and snapshot.c all use them, and
 * they use none of those. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "util.h"
#include <stdlib.h>
#include <string.h>

static inline size_t rec_hash(uintptr_t k, size_t cap) {
  return (size_t)(((k >> 9) * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

int gmli_recmap_put(gml_recmap *m, gml_rec *r) {
  if (m->count >= m->cap) {
    size_t ncap = m->cap ? m->cap * 2 : 1024;
    gml_rec **nb = calloc(ncap, sizeof *nb);
    if (!nb) return GML_ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
      for (gml_rec *e = m->buckets[i], *n; e; e = n) {
        n = e->hnext;
        size_t j = rec_hash(e->ptr, ncap);
        e->hnext = nb[j];
        nb[j] = e;
      }
    }
    free(m->buckets);
    m->buckets = nb;
    m->cap = ncap;
  }
  size_t j = rec_hash(r->ptr, m->cap);
  r->hnext = m->buckets[j];
  m->buckets[j] = r;
  m->count++;
  return 0;
}

gml_rec *gmli_recmap_get(gml_recmap *m, uintptr_t ptr, int remove) {
  if (!m->cap) return NULL;
  for (gml_rec **pp = &m->buckets[rec_hash(ptr, m->cap)]; *pp; pp = &(*pp)->hnext) {
    gml_rec *r = *pp;
    if (r->ptr != ptr) continue;
    if (remove) {
      *pp = r->hnext;
      m->count--;
    }
    return r;
  }
  return NULL;
}

void gmli_recmap_destroy(gml_recmap *m) {
  for (size_t i = 0; i < m->cap; i++)
    for (gml_rec *e = m->buckets[i], *n; e; e = n) {
      n = e->hnext;
      free(e);
    }
  free(m->buckets);
  memset(m, 0, sizeof *m);
}

void gmli_trace_put(gml_client *c, int action, uintptr_t addr, size_t size, gml_stream stream, int32_t pool,
                    uint64_t tag) {
  gml_trace_ring *t = &c->trace;
  if (!t->cap) return;
  gml_trace_entry *e = &t->e[(t->head + t->count) % t->cap];
  if (t->count < t->cap) t->count++;
  else t->head = (t->head + 1) % t->cap; /* full: the oldest goes */
  *e = (gml_trace_entry){.seq = ++t->seq,
                         .time_ns = gmli_now_ns(),
                         .tag = tag,
                         .action = action,
                         .addr = addr,
                         .size = size,
                         .stream = stream};
  if (pool >= 0) e->pool = c->pools[pool].id;
}
