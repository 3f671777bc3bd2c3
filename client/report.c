/* report.c: the usage report (the allocator's numbers and those each part
 * adds, sent to the daemon now, or from the keeper thread when they changed),
 * and what runs between operations: a reclaim served, a report now and then;
 * gml_flush. Below the parts that call it (growable ranges, shares, pause). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "log.h"
#include "util.h"
#include "wire.h"
#include <string.h>

static void usage_fill(gml_client *c, Gmlake__UsageReport *u) {
  gml_stats st;
  gmli_alloc_stats(&c->alloc, &st);
  for (int i = 0; i < c->nholders; i++) /* the ranges' and pause's numbers */
    if (c->holders[i]->usage) c->holders[i]->usage(c, &st);
  u->paused = st.paused_bytes;
  u->reclaims_served = __atomic_load_n(&c->reclaims_served, __ATOMIC_RELAXED);
  u->uncounted = __atomic_load_n(&c->uncounted_chunks, __ATOMIC_RELAXED) * c->be->chunk_size;
  u->paused_saved = st.paused_saved;
  u->swapped = __atomic_load_n(&c->swap_out, __ATOMIC_RELAXED);
  u->swap_host = __atomic_load_n(&c->swap_host, __ATOMIC_RELAXED);
  u->growable_mapped = st.growable_mapped;
  u->growable_unmapped = st.growable_unmapped;
  u->allocated = st.allocated;
  u->cached = st.cached;
  u->stitched = st.stitched;
  u->largest_free = st.largest_free;
  /* the allocator's free bytes, split: whole free chunks (gmli_alloc_stats'
   * largest_free: any shape can be stitched from them) are idle cache the
   * lake can reclaim; the rest of cached sits in chunks partly in use */
  u->idle_bytes = st.largest_free < st.cached ? st.largest_free : st.cached;
  u->fragment_bytes = st.cached - u->idle_bytes;
  u->alloc_count = st.alloc_count;
}

/* the report's numbers as one array, to see whether any changed: every
 * field, through the descriptor, so a new one needs no line here */
static void usage_key(const Gmlake__UsageReport *u, uint64_t k[GML_USAGE_KEYS]) {
  const ProtobufCMessageDescriptor *d = u->base.descriptor;
  memset(k, 0, GML_USAGE_KEYS * sizeof *k);
  for (unsigned i = 0; i < d->n_fields && i < GML_USAGE_KEYS; i++)
    k[i] =
        *(const uint64_t *)(const void *)((const char *)u + d->fields[i].offset); /* all uint64 (test_usage_fields) */
}

/* under conn_lock */
static void usage_send(gml_client *c, Gmlake__UsageReport *u) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  env.msg_case = GMLAKE__ENVELOPE__MSG_USAGE;
  env.usage = u;
  gmli_link_call(c, &env, 0, NULL, NULL, NULL); /* the daemon's requests are the reader thread's (link.c) */
  usage_key(u, c->last_usage);
  __atomic_store_n(&c->last_report_ns, gmli_now_ns(), __ATOMIC_RELAXED);
}

void gmli_client_report(gml_client *c) {
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  usage_fill(c, &u);
  pthread_mutex_lock(&c->conn_lock);
  usage_send(c, &u);
  pthread_mutex_unlock(&c->conn_lock);
}

void gmli_client_report_changed(gml_client *c) {
  if (gmli_now_ns() - __atomic_load_n(&c->last_report_ns, __ATOMIC_RELAXED) < REPORT_INTERVAL_NS) return;
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  usage_fill(c, &u);
  uint64_t k[GML_USAGE_KEYS];
  usage_key(&u, k);
  if (pthread_mutex_trylock(&c->conn_lock)) return;          /* a lease or return under way: it is the next round's */
  if (memcmp(k, c->last_usage, sizeof k)) usage_send(c, &u); /* last_usage is written under conn_lock */
  pthread_mutex_unlock(&c->conn_lock);
}

/* Between operations: serve a reclaim, report usage now and then. */
void gmli_client_housekeeping(gml_client *c, int force) {
  if (c->mode != GML_MODE_DAEMON) return;
  uint64_t want = __atomic_exchange_n(&c->reclaim_pending, 0, __ATOMIC_RELAXED);
  if (want) {
    size_t freed = gmli_alloc_release_idle(&c->alloc, want == UINT64_MAX ? 0 : want);
    GML_INFO("returned %zu bytes of idle cache to the lake", freed);
    force = 1;
  }
  if (force || gmli_now_ns() - __atomic_load_n(&c->last_report_ns, __ATOMIC_RELAXED) > REPORT_INTERVAL_NS)
    gmli_client_report(c);
}
int gml_flush(gml_client *c) {
  if (!c) return GML_EINVAL;
  gmli_client_housekeeping(c, 1);
  return __atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE) ? GML_EDAEMON : 0; /* the reader sets it */
}
