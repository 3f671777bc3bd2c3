/* mpath.c: multi-path copies, the mechanism (issue 30 item 2; paths.c is the
 * policy: which paths, what shares). A page-locked host<->device copy of
 * GPU A is cut in ranges: the first crosses A's own link on the caller's
 * stream; each other one a peer GPU B's: host -> B's staging on B's stream
 * (B's link), then B's staging -> A on a stream of A's (the P2P hop: A's copy
 * engine reads B's memory, which B's staging grants A; A's memory grants B
 * nothing), D2H the reverse. A range goes in slot-sized slices over
 * GMLI_PEER_SLOTS slots, the device ordering them with events: a slice's
 * second hop waits for its first, a slot's next first hop waits for its last
 * second hop, so the link fills one slot while NVLink empties the one before;
 * the host never waits. Both streams wait for the caller's stream at the
 * start, and the caller's stream for both at the end: stream-ordered like one
 * cudaMemcpyAsync.
 *
 * The staging (GMLI_PEER_SLOTS x 16 MiB a peer) comes from the driver, in
 * daemon mode too (the peer's lake is another daemon, another conversation:
 * not done), taken at the probe and kept until gml_close. A peer path that
 * fails has its part from the slice that failed redone on A's own link, and
 * is not used again; A's link failing fails the copy. */
#include "client_priv.h"
#include "copy.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_DEFAULT (64u << 20)
#define SLOT_DEFAULT (16u << 20)
#define PROBE_BYTES (256u << 20)
#define PROBE_GAIN 0.1 /* a path is kept where it adds 10% */
#define RANGE_ALIGN 4096

static gmli_peer_path *peer_of(gmli_copier *k, int path) { return path > 0 ? &k->mp.peer[path - 1] : NULL; }

/* Host-waits for every slot's last use: the peer's issued copies are done (0) or failed. */
static int settle(gmli_copier *k, gmli_peer_path *pp) {
  int rc = 0;
  for (int s = 0; s < GMLI_PEER_SLOTS; s++)
    if (pp->has_ev[s]) {
      int r = k->be->ops->event_wait(k->be, pp->ev[s]);
      k->be->ops->event_destroy(k->be, pp->ev[s]);
      pp->has_ev[s] = 0;
      if (r && !rc) rc = r;
    }
  return rc;
}

/* [off, off + len) of the copy over peer path pp, slice by slice. *done: the bytes whose both hops were issued. */
static int peer_run(gmli_copier *k, gmli_peer_path *pp, uintptr_t dst, uintptr_t src, size_t off, size_t len, int h2d,
                    size_t *done) {
  gml_backend *be = k->be;
  int self = be->device, first_dev = h2d ? pp->device : self, second_dev = h2d ? self : pp->device;
  uintptr_t first = h2d ? pp->link : pp->hop, second = h2d ? pp->hop : pp->link;
  size_t ss = k->mp.slot_size;
  int rc = 0;
  for (*done = 0; *done < len && !rc;) {
    size_t l = GML_MIN(ss, len - *done), at = off + *done;
    int s = pp->next;
    uintptr_t slot = pp->staging + (size_t)s * ss, e;
    if (pp->has_ev[s]) { /* the slot is refilled once its last second hop has read or written it */
      if ((rc = be->ops->stream_wait_event(be, first, pp->ev[s]))) break;
      be->ops->event_destroy(be, pp->ev[s]);
      pp->has_ev[s] = 0;
    }
    if ((rc = be->ops->peer_copy_async(be, first_dev, slot, src + at, l, first))) break;
    if ((rc = be->ops->peer_event_record(be, first_dev, first, &e))) break;
    rc = be->ops->stream_wait_event(be, second, e);
    be->ops->event_destroy(be, e);
    if (rc || (rc = be->ops->peer_copy_async(be, second_dev, dst + at, slot, l, second))) break;
    if ((rc = be->ops->peer_event_record(be, second_dev, second, &pp->ev[s]))) break;
    pp->has_ev[s] = 1;
    pp->next = (s + 1) % GMLI_PEER_SLOTS;
    *done += l;
  }
  return rc;
}

/* The caller's stream after a peer's copies (both its streams); else they are waited for on the host. */
static int join(gmli_copier *k, gmli_peer_path *pp, uintptr_t stream) {
  gml_backend *be = k->be;
  int devs[2] = {pp->device, be->device}, rc = 0;
  uintptr_t st[2] = {pp->link, pp->hop};
  for (int i = 0; i < 2 && !rc; i++) {
    uintptr_t e;
    if (!(rc = be->ops->peer_event_record(be, devs[i], st[i], &e))) {
      rc = be->ops->stream_wait_event(be, stream, e);
      be->ops->event_destroy(be, e);
    }
  }
  return rc ? settle(k, pp) : 0;
}

/* Removes a failed path from both plans, the others' shares in proportion to their speed alone. */
static void drop_path(gmli_copier *k, int path) {
  for (int dir = 0; dir < 2; dir++) {
    gmli_path_plan *p = &k->mp.plan[dir];
    int n = 0;
    double sum = 0;
    for (int i = 0; i < p->n; i++)
      if (p->path[i] != path) p->path[n++] = p->path[i], sum += p->alone[p->path[i]];
    p->n = n;
    for (int i = 0; i < n; i++) p->share[i] = sum > 0 ? p->alone[p->path[i]] / sum : 1.0 / n;
    for (int i = 0; i < GML_COPY_PATHS_MAX; i++) *(dir ? &k->info.paths[i].d2h_share : &k->info.paths[i].h2d_share) = 0;
    for (int i = 0; i < n; i++)
      *(dir ? &k->info.paths[p->path[i]].d2h_share : &k->info.paths[p->path[i]].h2d_share) = p->share[i];
  }
  k->info.paths[path].used = 0;
  k->info.paths[path].failed = 1;
  k->mp.peer[path - 1].failed = 1;
  k->info.paths_used = (uint32_t)GML_MAX(k->mp.plan[0].n, k->mp.plan[1].n);
}

/* n bytes split over paths set[0..count) (path set[i] taking share[i]), the own link's range first.
 * probe: a path failing fails the call (a measurement), no redo, no counting. */
static int split(gmli_copier *k, const int *set, const double *share, int count, uintptr_t dst, uintptr_t src, size_t n,
                 int h2d, uintptr_t stream, int probe, size_t *at, char *why, size_t whylen) {
  gml_backend *be = k->be;
  size_t len[GMLI_PATHS_MAX], rest = n;
  int order[GMLI_PATHS_MAX], m = 0;
  for (int i = 0; i < count; i++)
    if (set[i] == 0) order[m++] = i;
  for (int i = 0; i < count; i++)
    if (set[i] != 0) order[m++] = i;
  for (int j = 1; j < count; j++) rest -= len[order[j]] = (size_t)(n * share[order[j]]) / RANGE_ALIGN * RANGE_ALIGN;
  len[order[0]] = rest;
  uintptr_t ev0;
  int rc = be->ops->event_record(be, stream, &ev0);
  *at = 0;
  if (rc) return snprintf(why, whylen, "the caller's stream (an event on it)"), rc;
  int bad = 0;
  for (int j = 0; j < count && !bad; j++) { /* the peers' streams after the caller's earlier work */
    gmli_peer_path *pp = peer_of(k, set[order[j]]);
    bad = pp && (be->ops->stream_wait_event(be, pp->link, ev0) || be->ops->stream_wait_event(be, pp->hop, ev0));
  }
  be->ops->event_destroy(be, ev0);
  if (bad && !probe) { /* the caller's stream cannot be waited for (being captured into a graph): one path */
    if ((rc = be->ops->copy_async(be, dst, src, n, stream))) snprintf(why, whylen, "GPU %d's own link", be->device);
    else k->info.driver_copies++, k->info.paths[0].bytes += n;
    return rc;
  }
  if (bad) return snprintf(why, whylen, "a peer's stream (waiting for the caller's)"), GML_EBACKEND;
  size_t off = 0;
  for (int j = 0; j < count && !rc; off += len[order[j]], j++) {
    int path = set[order[j]];
    size_t l = len[order[j]], done = 0;
    gmli_peer_path *pp = peer_of(k, path);
    if (!l) continue;
    if (!pp) { /* the own link, first: failing, nothing of the copy was issued */
      if ((rc = be->ops->copy_async(be, dst + off, src + off, l, stream)))
        snprintf(why, whylen, "GPU %d's own link", be->device);
      else if (!probe) k->info.driver_copies++, k->info.paths[0].bytes += l;
      continue;
    }
    int prc = peer_run(k, pp, dst, src, off, l, h2d, &done);
    if (!prc && !(prc = join(k, pp, stream))) {
      if (!probe) k->info.paths[path].bytes += l;
      continue;
    }
    char b[32];
    if (probe) {
      settle(k, pp);
      rc = prc, *at = off + done;
      snprintf(why, whylen, "the path over GPU %d", pp->device);
      continue;
    }
    /* a peer path failed: what it issued is waited for, the rest goes over the own link */
    int settled = settle(k, pp);
    GML_WARN("copy engine: the path over GPU %d failed at byte %zu of a %s copy (%s)%s; the path is not used again",
             pp->device, off + done, gmli_format_bytes(n, b, sizeof b), gml_strerror(prc),
             settled ? ", and its copies could not be waited for" : ": the rest of its part goes over the own link");
    drop_path(k, path);
    if (!settled && !(rc = be->ops->copy_async(be, dst + off + done, src + off + done, l - done, stream))) {
      k->info.driver_copies++, k->info.paths[0].bytes += l - done, k->info.paths[path].bytes += done;
      continue;
    }
    rc = settled ? settled : rc;
    *at = off + done;
    if (settled) snprintf(why, whylen, "the path over GPU %d (its copies could not be waited for)", pp->device);
    else
      snprintf(why, whylen, "GPU %d's own link, redoing the part of the path over GPU %d (which failed)", be->device,
               pp->device);
  }
  if (!rc && !probe && count > 1) k->info.bytes_split += n;
  return rc;
}

/* ---------- the probe ---------- */
typedef struct probe {
  gmli_copier *k;
  int h2d;
  uintptr_t host, dev, stream;
  size_t n;
} probe;

/* GB/s of a split copy of probe_bytes, the best of two after a warm-up; -1 where a path failed. */
static double measure_timed(const int *set, const double *share, int count, void *ctx) {
  probe *pr = ctx;
  gml_backend *be = pr->k->be;
  double best = -1;
  for (int r = 0; r < 3; r++) {
    size_t at;
    char why[128];
    uintptr_t ev, dst = pr->h2d ? pr->dev : pr->host, src = pr->h2d ? pr->host : pr->dev;
    uint64_t t0 = gmli_now_ns();
    if (split(pr->k, set, share, count, dst, src, pr->n, pr->h2d, pr->stream, 1, &at, why, sizeof why)) return -1;
    if (be->ops->event_record(be, pr->stream, &ev)) return -1;
    int rc = be->ops->event_wait(be, ev);
    be->ops->event_destroy(be, ev);
    double gbps = pr->n / (double)GML_MAX(gmli_now_ns() - t0, 1);
    if (rc) return -1;
    if (r && gbps > best) best = gbps;
  }
  return best;
}

/* Where copies cannot be timed (host: memmove): every path a link of its own, 1 GB/s. */
static double measure_model(const int *set, const double *share, int count, void *ctx) {
  (void)set, (void)ctx;
  double worst = 0;
  for (int i = 0; i < count; i++) worst = GML_MAX(worst, share[i]);
  return worst > 0 ? 1 / worst : -1;
}

static void peer_release(gmli_copier *k, gmli_peer_path *pp) {
  gml_backend *be = k->be;
  settle(k, pp);
  if (pp->staging) be->ops->peer_free(be, pp->device, pp->staging, GMLI_PEER_SLOTS * k->mp.slot_size);
  if (pp->link) be->ops->peer_stream_destroy(be, pp->device, pp->link);
  if (pp->hop) be->ops->peer_stream_destroy(be, be->device, pp->hop);
  pp->staging = pp->link = pp->hop = 0;
}

/* The peers with P2P access, each its staging and streams; then each direction's plan. */
static void probe_paths(gmli_copier *k) {
  gml_backend *be = k->be;
  gmli_mpath *mp = &k->mp;
  mp->probed = 1;
  int ndev = be->ops->peer_count(be);
  k->info.npaths = 1, k->info.paths_used = 1;
  k->info.paths[0] = (gml_copy_path){.device = be->device, .used = 1, .h2d_share = 1, .d2h_share = 1};
  for (int d = 0; d < ndev && mp->npeers < GMLI_PATHS_MAX - 1; d++) {
    gmli_peer_path *pp = &mp->peer[mp->npeers];
    if (d == be->device || be->ops->peer_access(be, d) != 1) continue;
    memset(pp, 0, sizeof *pp);
    pp->device = d;
    int rc = be->ops->peer_alloc(be, d, GMLI_PEER_SLOTS * mp->slot_size, &pp->staging);
    if (!rc && !(rc = be->ops->peer_stream(be, d, &pp->link))) rc = be->ops->peer_stream(be, be->device, &pp->hop);
    if (rc) {
      GML_WARN("copy engine: no staging on GPU %d (%s): not a copy path", d, gml_strerror(rc));
      peer_release(k, pp);
      continue;
    }
    mp->npeers++;
  }
  if (!mp->npeers) {
    GML_INFO("copy engine: no peer GPU with P2P access to GPU %d: copies take its own link alone", be->device);
    return;
  }
  probe pr = {.k = k, .n = mp->probe_bytes};
  void *host = NULL;
  int timed = !mp->measure && (be->caps & GML_BACKEND_COPY_TIMING);
  if (timed && (be->ops->host_alloc(be, pr.n, &host) || be->ops->peer_alloc(be, be->device, pr.n, &pr.dev) ||
                be->ops->peer_stream(be, be->device, &pr.stream))) {
    GML_WARN("copy engine: no memory to probe the copy paths: copies take GPU %d's own link alone", be->device);
    timed = -1;
  }
  pr.host = (uintptr_t)host;
  for (int dir = 0; dir < 2 && timed >= 0; dir++) {
    pr.h2d = !dir;
    gmli_path_measure f = mp->measure ? mp->measure : timed ? measure_timed : measure_model;
    gmli_paths_probe(1 + mp->npeers, f, mp->measure ? mp->measure_ctx : &pr, PROBE_GAIN, &mp->plan[dir]);
  }
  if (pr.stream) be->ops->peer_stream_destroy(be, be->device, pr.stream);
  if (pr.dev) be->ops->peer_free(be, be->device, pr.dev, pr.n);
  if (host) be->ops->host_free(be, host);
  k->info.npaths = (uint32_t)(1 + mp->npeers);
  for (int i = 0; i <= mp->npeers; i++) {
    gml_copy_path *cp = &k->info.paths[i];
    cp->device = i ? mp->peer[i - 1].device : be->device;
    cp->h2d_gbps = mp->plan[0].alone[i], cp->d2h_gbps = mp->plan[1].alone[i];
    cp->h2d_share = cp->d2h_share = 0;
  }
  for (int dir = 0; dir < 2; dir++)
    for (int i = 0; i < mp->plan[dir].n; i++) {
      gml_copy_path *cp = &k->info.paths[mp->plan[dir].path[i]];
      cp->used = 1;
      *(dir ? &cp->d2h_share : &cp->h2d_share) = mp->plan[dir].share[i];
    }
  k->info.paths_used = (uint32_t)GML_MAX(mp->plan[0].n, mp->plan[1].n);
  k->info.h2d_gbps = mp->plan[0].together, k->info.d2h_gbps = mp->plan[1].together;
  for (int i = 1; i <= mp->npeers; i++) /* a peer neither direction takes gives its staging back */
    if (!k->info.paths[i].used) peer_release(k, &mp->peer[i - 1]);
  GML_INFO("copy engine: %d of %d copy paths of GPU %d used: H2D %.1f GB/s together (own link %.1f), D2H %.1f (%.1f)",
           (int)k->info.paths_used, (int)k->info.npaths, be->device, k->info.h2d_gbps, mp->plan[0].alone[0],
           k->info.d2h_gbps, mp->plan[1].alone[0]);
}

static int paths_auto(void) {
  const char *v = gmli_env(GML_ENV_COPY_PATHS);
  if (!v || !strcmp(v, "auto")) return 1;
  if (!strcmp(v, "1")) return 0;
  GML_WARN("GMLAKE_COPY_PATHS=%s ignored: auto or 1 was expected; auto", v);
  return 1;
}

/* The sizes multi-path works in, unless a test set its own. */
static gmli_mpath *mpath_of(gmli_copier *k) {
  gmli_mpath *mp = &k->mp;
  if (!mp->min_bytes) mp->min_bytes = MIN_DEFAULT, mp->slot_size = SLOT_DEFAULT, mp->probe_bytes = PROBE_BYTES;
  return mp;
}

int gmli_mpath_wanted(gmli_copier *k, const gml_copy_desc *d) {
  gml_backend *be = k->be;
  gmli_mpath *mp = mpath_of(k);
  if (d->kind == GML_COPY_D2D || d->size < mp->min_bytes || !(be->caps & GML_BACKEND_PEER_COPY)) return 0;
  if (!be->ops->host_pinned(be, d->kind == GML_COPY_H2D ? d->src : d->dst, d->size)) return 0;
  if (!mp->probed) {
    if (!paths_auto()) return 0; /* asked again at the next such copy: nothing was taken */
    probe_paths(k);
  }
  return mp->plan[d->kind == GML_COPY_D2H].n > 1;
}

int gmli_mpath_copy(gmli_copier *k, const gml_copy_desc *d, uintptr_t stream, size_t *at, char *why, size_t whylen) {
  const gmli_path_plan *p = &k->mp.plan[d->kind == GML_COPY_D2H];
  int set[GMLI_PATHS_MAX];
  double share[GMLI_PATHS_MAX];
  memcpy(set, p->path, sizeof set), memcpy(share, p->share, sizeof share); /* a failure edits the plan */
  return split(k, set, share, p->n, (uintptr_t)d->dst, (uintptr_t)d->src, d->size, d->kind == GML_COPY_H2D, stream, 0,
               at, why, whylen);
}

int gmli_mpath_probe(gmli_copier *k) {
  gmli_mpath *mp = mpath_of(k);
  if (!mp->probed && (k->be->caps & GML_BACKEND_PEER_COPY) && paths_auto()) probe_paths(k);
  return 0;
}

void gmli_mpath_destroy(gmli_copier *k) {
  for (int i = 0; i < k->mp.npeers; i++) peer_release(k, &k->mp.peer[i]);
  k->mp.npeers = 0;
}
