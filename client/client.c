/* client.c: gml_open/gml_close and the two chunk sources of the allocator:
 * the daemon (lease/return over the Unix socket, fds imported with the
 * backend) or, embedded, the backend itself. Also the periodic usage report;
 * the daemon's requests (reclaim) are served by link.c's threads. The
 * allocation entry points are in track.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "discover.h"
#include "gmlake.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include "wire.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* ---------- embedded source: the backend directly ---------- */

static int embedded_acquire(void *ctx, size_t n, int optional, gml_phys *phys, uint64_t *ids) {
  gml_client *c = ctx;
  (void)optional; /* the device says at once whether it has memory */
  /* the limit holds for the allocator's chunks and the growable ranges' together
   * (the allocator checks its own part before it asks; called with its lock or grow.lock) */
  uint64_t held = (uint64_t)__atomic_load_n(&c->alloc.held, __ATOMIC_RELAXED) * c->be->chunk_size +
                  __atomic_load_n(&c->grow.mapped, __ATOMIC_RELAXED);
  if (c->alloc.limit_bytes && held + n * c->be->chunk_size > c->alloc.limit_bytes) return GML_ENOMEM;
  size_t got = 0;
  for (; got < n; got++) {
    int rc = c->be->ops->chunk_create(c->be, &phys[got], NULL);
    if (rc) return got ? (int)got : rc;
    ids[got] = 0;
  }
  return (int)got;
}

static void embedded_release(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids) {
  gml_client *c = ctx;
  (void)ids;
  for (size_t i = 0; i < n; i++) c->be->ops->chunk_release(c->be, phys[i]);
}

/* ---------- daemon connection ---------- */

static void handle_unsolicited(gml_client *c, Gmlake__Envelope *env) {
  if (env->msg_case == GMLAKE__ENVELOPE__MSG_RECLAIM) {
    /* 0 asks for everything idle */
    uint64_t want = env->reclaim->bytes ? env->reclaim->bytes : UINT64_MAX, cur = c->reclaim_pending;
    __atomic_store_n(&c->reclaim_pending, want > UINT64_MAX - cur ? UINT64_MAX : cur + want, __ATOMIC_RELAXED);
    GML_INFO("daemon asks for %llu bytes of idle cache back", (unsigned long long)env->reclaim->bytes);
  } else {
    GML_WARN("unexpected unsolicited message %d from the daemon", (int)env->msg_case);
  }
}

/* A message from the daemon and the fds that came with it: every path that
 * receives one ends in free_received (fds set to -1 were taken over). */
static void free_received(Gmlake__Envelope *env, const int *fds, int nfds) {
  if (env) gmlake__envelope__free_unpacked(env, NULL);
  for (int i = 0; i < nfds; i++)
    if (fds[i] >= 0) close(fds[i]);
}

/* Send env; when want_reply, wait for the reply with the same seq (handling
 * unsolicited messages meanwhile). conn_lock held. */
static int conn_call(gml_client *c, Gmlake__Envelope *env, int want_reply, Gmlake__Envelope **reply, int *fds, int *nfds) {
  if (c->link) return gml_link_call(c, env, want_reply, reply, fds, nfds); /* the reader thread receives */
  if (c->daemon_gone) return GML_EDAEMON;
  env->seq = ++c->seq;
  uint8_t *frame;
  size_t len;
  int rc = gml_wire_encode(env, &frame, &len);
  if (rc) return rc;
  rc = gml_wire_send(c->sock, frame, len, NULL, 0);
  free(frame);
  int sent = rc; /* failed: a refusal's reason may wait all the same (wire.h), read if a reply is wanted */
  if (sent && (!nfds || !gml_wire_refusal_waits(c->sock))) goto gone;
  if (!sent && !want_reply) return 0;
  for (;;) {
    Gmlake__Envelope *in;
    rc = gml_wire_recv(c->sock, &in, fds, nfds, GML_MAX_LEASE_CHUNKS);
    if (rc) goto gone;
    if (in->seq == 0 && in->msg_case == GMLAKE__ENVELOPE__MSG_ERROR) { /* a connection refused (max-clients): why, then closed */
      snprintf(c->last_error, sizeof c->last_error, "the daemon refused this connection: %s", in->error->message);
      free_received(in, fds, *nfds);
      rc = GML_EDAEMON;
      goto gone;
    }
    if (sent) { /* the request never went: whatever else came, the connection is gone */
      free_received(in, fds, *nfds), rc = sent;
      goto gone;
    }
    if (in->seq == 0) {
      handle_unsolicited(c, in);
      free_received(in, fds, *nfds);
      continue;
    }
    if (in->seq != env->seq) {
      free_received(in, fds, *nfds);
      rc = GML_EPROTO;
      goto gone;
    }
    *reply = in;
    return 0;
  }
gone:
  GML_ERR("connection to the daemon lost: %s", gml_strerror(rc));
  c->daemon_gone = 1;
  return rc == GML_EPROTO ? GML_EPROTO : GML_EDAEMON;
}

/* One request and its reply (the reply's fds in fds[0..*nfds)); the caller
 * ends with free_received. Takes conn_lock. */
typedef struct daemon_reply {
  Gmlake__Envelope *env;
  int fds[GML_MAX_LEASE_CHUNKS];
  int nfds;
} daemon_reply;

static int daemon_request(gml_client *c, Gmlake__Envelope *env, daemon_reply *r) {
  r->env = NULL;
  r->nfds = 0;
  pthread_mutex_lock(&c->conn_lock);
  int rc = conn_call(c, env, 1, &r->env, r->fds, &r->nfds);
  pthread_mutex_unlock(&c->conn_lock);
  return rc;
}

/* The chunks of one lease reply imported into phys/ids from *got on (at
 * most max in all); the reply and its fds freed. 0, or what was wrong. */
static int import_reply(gml_client *c, daemon_reply *r, int optional, size_t max, gml_phys *phys, uint64_t *ids, size_t *got) {
  Gmlake__Envelope *reply = r->env;
  int rc = 0;
  if (reply->msg_case == GMLAKE__ENVELOPE__MSG_ERROR) {
    rc = reply->error->code < 0 && reply->error->code >= GML_ECLOSED ? reply->error->code : GML_ENOMEM;
    if (!optional) { /* an optional lease refused is no error of the caller's */
      snprintf(c->lake_error, sizeof c->lake_error, "%s", reply->error->message);
      snprintf(c->last_error, sizeof c->last_error, "daemon refused lease: %s", reply->error->message);
      GML_INFO("%s", c->last_error);
    }
  } else if (reply->msg_case != GMLAKE__ENVELOPE__MSG_LEASE_REPLY || reply->lease_reply->n_chunk_ids != (size_t)r->nfds ||
             r->nfds == 0 || (size_t)r->nfds > max - *got) {
    GML_ERR("bad lease reply: %zu ids, %d fds", reply->msg_case == GMLAKE__ENVELOPE__MSG_LEASE_REPLY ? reply->lease_reply->n_chunk_ids : 0, r->nfds);
    rc = GML_EPROTO;
  } else {
    uint64_t t0 = gml_now_ns();
    for (int i = 0; i < r->nfds; i++) {
      int irc = c->be->ops->chunk_import(c->be, r->fds[i], &phys[*got]);
      r->fds[i] = -1; /* the import took it, whatever its result */
      if (irc) {
        GML_ERR("importing chunk %llu failed: %s", (unsigned long long)reply->lease_reply->chunk_ids[i], gml_strerror(irc));
        continue; /* its id stays leased to us until we disconnect; nothing leaks */
      }
      ids[(*got)++] = reply->lease_reply->chunk_ids[i];
    }
    __atomic_fetch_add(&c->alloc.import_ns, gml_now_ns() - t0, __ATOMIC_RELAXED);
    c->lake_error[0] = 0;
  }
  free_received(reply, r->fds, r->nfds);
  return rc;
}

typedef void (*stream_got_fn)(void *arg, const gml_phys *phys, const uint64_t *ids, size_t k);

/* n chunks, or fewer. Up to GML_MAX_LEASE_CHUNKS: one request, one reply.
 * More (a daemon that streams): one streamed request for up to max_stream,
 * whose replies the link's reader queues while the chunks of the one before
 * are imported here, so the daemon's work and the imports overlap; with
 * got (GMLAKE_STREAM_MAP), the reader imports them too and each batch goes
 * to got() here, so the caller maps a batch while the next is imported. A
 * stream the daemon ends with a refusal after some chunks: those are
 * returned, and the next call returns the refusal at once (the allocator
 * calls again for the rest), not a second wait for the same shortage. */
static int daemon_lease(gml_client *c, size_t n, int optional, gml_phys *phys, uint64_t *ids, stream_got_fn got_fn,
                        void *arg) {
  pthread_mutex_lock(&c->conn_lock);
  int refused = optional ? 0 : c->lease_refused;
  if (refused) {
    c->lease_refused = 0;
    pthread_mutex_unlock(&c->conn_lock);
    return refused;
  }
  int streamed = !optional && n > GML_MAX_LEASE_CHUNKS && c->max_stream && c->link;
  if (n > (streamed ? c->max_stream : GML_MAX_LEASE_CHUNKS)) n = streamed ? c->max_stream : GML_MAX_LEASE_CHUNKS;
  if (!streamed) got_fn = NULL;
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__LeaseRequest lr = GMLAKE__LEASE_REQUEST__INIT;
  lr.count = (uint64_t)n;
  lr.optional = optional != 0;
  lr.streamed = streamed;
  env.msg_case = GMLAKE__ENVELOPE__MSG_LEASE;
  env.lease = &lr;
  daemon_reply r = {.env = NULL};
  gml_phys bp[GML_MAX_LEASE_CHUNKS]; /* a batch the reader imported (got_fn) */
  uint64_t bi[GML_MAX_LEASE_CHUNKS];
  size_t got = 0, k = 0;
  uint64_t waited = 0, t0 = gml_now_ns();
  int rc = streamed ? gml_link_send(c, &env, 1, got_fn != NULL) : conn_call(c, &env, 1, &r.env, r.fds, &r.nfds);
  if (!rc && streamed) rc = gml_link_next_chunks(c, &r.env, r.fds, &r.nfds, bp, bi, &k);
  while (!rc) {
    waited += gml_now_ns() - t0;
    uint64_t left = r.env->msg_case == GMLAKE__ENVELOPE__MSG_LEASE_REPLY ? r.env->lease_reply->left : 0;
    if (got_fn && r.env->msg_case == GMLAKE__ENVELOPE__MSG_LEASE_REPLY && !r.nfds && k <= n - got) {
      if (k) got_fn(arg, bp, bi, k);
      got += k;
      c->lake_error[0] = 0;
      free_received(r.env, r.fds, r.nfds);
    } else if ((rc = import_reply(c, &r, optional, n, phys, ids, &got))) {
      break;
    }
    if (!streamed || !left) break;
    t0 = gml_now_ns();
    rc = gml_link_next_chunks(c, &r.env, r.fds, &r.nfds, bp, bi, &k);
  }
  if (streamed) gml_link_end(c);
  if (got && rc) c->lease_refused = rc; /* partly served: these chunks now, the refusal next */
  pthread_mutex_unlock(&c->conn_lock);
  __atomic_fetch_add(&c->alloc.lease_wait_ns, waited, __ATOMIC_RELAXED);
  if (streamed) __atomic_fetch_add(&c->alloc.chunks_streamed, got, __ATOMIC_RELAXED);
  return got ? (int)got : rc ? rc : GML_EBACKEND;
}

void gml_daemon_clock(gml_client *c, uint64_t daemon_mono_ns) {
  c->clock_skew = (int64_t)(gml_now_ns() - daemon_mono_ns); /* the reply's transit: microseconds, on one host */
  c->clock_known = daemon_mono_ns != 0;
}

int gml_reclaim_moot(gml_client *c, const Gmlake__ReclaimRequest *r) {
  if (!c->clock_known || !r->sent_ns || !r->valid_ms || r->valid_ms > INT64_MAX / 1000000) return 0; /* valid for ever */
  int64_t age = (int64_t)(gml_now_ns() - r->sent_ns) - c->clock_skew;
  if (age <= (int64_t)(r->valid_ms * 1000000ull)) return 0;
  GML_INFO("a reclaim request of the daemon came %.1f s after it was sent (this process was stopped?): its lease is "
           "over, the cache stays", (double)age / 1e9);
  return 1;
}

static int daemon_acquire(void *ctx, size_t n, int optional, gml_phys *phys, uint64_t *ids) {
  return daemon_lease(ctx, n, optional, phys, ids, NULL, NULL);
}

/* src.acquire_stream (GMLAKE_STREAM_MAP): only through a daemon that
 * streams; else one plain acquire handed over whole. */
static int daemon_acquire_stream(void *ctx, size_t n, stream_got_fn got_fn, void *arg) {
  gml_client *c = ctx;
  if (__atomic_load_n(&c->max_stream, __ATOMIC_RELAXED) && c->link && n > GML_MAX_LEASE_CHUNKS) /* daemon_lease decides again */
    return daemon_lease(c, n, 0, NULL, NULL, got_fn, arg);
  gml_phys phys[GML_MAX_LEASE_CHUNKS];
  uint64_t ids[GML_MAX_LEASE_CHUNKS];
  int got = daemon_lease(c, GML_MIN(n, (size_t)GML_MAX_LEASE_CHUNKS), 0, phys, ids, NULL, NULL);
  if (got > 0) got_fn(arg, phys, ids, (size_t)got);
  return got;
}

static void daemon_return(gml_client *c, uint64_t *ids, size_t n, int tainted) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReturnRequest rr = GMLAKE__RETURN_REQUEST__INIT;
  rr.n_chunk_ids = n;
  rr.chunk_ids = ids;
  rr.tainted = tainted != 0;
  env.msg_case = GMLAKE__ENVELOPE__MSG_RET;
  env.ret = &rr;
  daemon_reply r;
  if (daemon_request(c, &env, &r) == 0) {
    if (r.env->msg_case != GMLAKE__ENVELOPE__MSG_RET_REPLY) GML_WARN("daemon did not accept returned chunks");
    free_received(r.env, r.fds, r.nfds);
  }
}

/* Return ids to the daemon in Return requests of up to GML_MAX_LEASE_CHUNKS;
 * parked ones (at the daemon under our pid, or never counted) are local only (link.c). */
static void return_ids(gml_client *c, const uint64_t *ids, size_t n, int tainted) {
  uint64_t keep[GML_MAX_LEASE_CHUNKS];
  for (size_t i = 0; i < n;) {
    size_t k = 0;
    for (; i < n && k < GML_MAX_LEASE_CHUNKS; i++)
      if (!(ids[i] & GML_ID_PARKED)) keep[k++] = ids[i];
      else if (ids[i] & GML_ID_UNCOUNTED) gml_client_uncounted_gone(c);
    if (k) daemon_return(c, keep, k, tainted);
  }
}

static void daemon_release(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids) {
  gml_client *c = ctx;
  for (size_t i = 0; i < n; i++) c->be->ops->chunk_release(c->be, phys[i]); /* our handles go first */
  return_ids(c, ids, n, 0);
}

void gml_client_return_tainted(gml_client *c, const uint64_t *ids, size_t n) { return_ids(c, ids, n, 1); }

void gml_client_uncounted_gone(gml_client *c) { __atomic_fetch_sub(&c->uncounted_chunks, 1, __ATOMIC_RELAXED); }

static void usage_fill(gml_client *c, Gmlake__UsageReport *u) {
  gml_stats st;
  gml_alloc_stats(&c->alloc, &st);
  gml_grow_stats(c, &st);
  gml_pause_stats(c, &st);
  u->paused = st.paused_bytes;
  u->reclaims_served = __atomic_load_n(&c->reclaims_served, __ATOMIC_RELAXED);
  u->uncounted = __atomic_load_n(&c->uncounted_chunks, __ATOMIC_RELAXED) * c->be->chunk_size;
  u->paused_saved = st.paused_saved;
  u->growable_mapped = st.growable_mapped;
  u->growable_unmapped = st.growable_unmapped;
  u->allocated = st.allocated;
  u->cached = st.cached;
  u->stitched = st.stitched;
  u->largest_free = st.largest_free;
  /* the allocator's free bytes, split: whole free chunks (gml_alloc_stats'
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
    k[i] = *(const uint64_t *)(const void *)((const char *)u + d->fields[i].offset); /* all uint64 (test_usage_fields) */
}

/* under conn_lock */
static void usage_send(gml_client *c, Gmlake__UsageReport *u) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  env.msg_case = GMLAKE__ENVELOPE__MSG_USAGE;
  env.usage = u;
  conn_call(c, &env, 0, NULL, NULL, NULL); /* the daemon's requests are the reader thread's (link.c) */
  usage_key(u, c->last_usage);
  __atomic_store_n(&c->last_report_ns, gml_now_ns(), __ATOMIC_RELAXED);
}

void gml_client_report(gml_client *c) {
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  usage_fill(c, &u);
  pthread_mutex_lock(&c->conn_lock);
  usage_send(c, &u);
  pthread_mutex_unlock(&c->conn_lock);
}

void gml_client_report_changed(gml_client *c) {
  if (gml_now_ns() - __atomic_load_n(&c->last_report_ns, __ATOMIC_RELAXED) < REPORT_INTERVAL_NS) return;
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  usage_fill(c, &u);
  uint64_t k[GML_USAGE_KEYS];
  usage_key(&u, k);
  if (pthread_mutex_trylock(&c->conn_lock)) return; /* a lease or return under way: it is the next round's */
  if (memcmp(k, c->last_usage, sizeof k)) usage_send(c, &u); /* last_usage is written under conn_lock */
  pthread_mutex_unlock(&c->conn_lock);
}

/* Between operations: serve a reclaim, report usage now and then. */
void gml_client_housekeeping(gml_client *c, int force) {
  if (c->mode != GML_MODE_DAEMON) return;
  uint64_t want = __atomic_exchange_n(&c->reclaim_pending, 0, __ATOMIC_RELAXED);
  if (want) {
    size_t freed = gml_alloc_release_idle(&c->alloc, want == UINT64_MAX ? 0 : want);
    GML_INFO("returned %zu bytes of idle cache to the lake", freed);
    force = 1;
  }
  if (force || gml_now_ns() - __atomic_load_n(&c->last_report_ns, __ATOMIC_RELAXED) > REPORT_INTERVAL_NS) gml_client_report(c);
}

int gml_open(const gml_open_opts *opts, gml_client **out) {
  gml_open_opts o = {0};
  if (opts) o = *opts;
  gml_options opt;
  int rc = gml_open_options(&o, &opt);
  if (rc) return rc;
  gml_backend_opts bo = {.chunk_size = opt.chunk_size, .libcuda = opt.libcuda};
  gml_raise_fd_limit();
  gml_client *c = calloc(1, sizeof *c);
  if (!c) return GML_ENOMEM;
  c->sock = -1;
  c->device = o.device;
  pthread_mutex_init(&c->conn_lock, NULL);
  gml_grow_init(c);
  pthread_mutex_init(&c->track_lock, NULL);
  char why[2048] = "", msg[512] = "", backend[16] = "";
  rc = GML_EDAEMON;
  char path[256] = "";
  uint64_t chunk_size = 0;
  if (opt.mode != GML_MODE_EMBEDDED) rc = gml_daemon_find(c, &opt, &bo, path, sizeof path, why, sizeof why, backend, sizeof backend, &chunk_size);
  gml_chunk_source src;
  if (c->mode == GML_MODE_DAEMON) { /* a daemon of this device answered (its hello may have refused us) */
    if (rc == 0 && strcmp(opt.backend, "auto") && strcmp(opt.backend, backend)) {
      snprintf(c->last_error, sizeof c->last_error, "daemon runs the %s backend, %s was asked for", backend, opt.backend);
      rc = GML_ENODEV;
    }
    if (rc == 0) rc = gml_backend_open(backend, o.device, &bo, &c->be, msg, sizeof msg);
    /* the daemon's chunks are the ones we map, whatever our own default or GMLAKE_CHUNK_SIZE says */
    if (rc == 0 && c->be->chunk_size != chunk_size && gml_backend_set_chunk_size(c->be, chunk_size)) {
      snprintf(c->last_error, sizeof c->last_error, "daemon's chunk size %llu is not a multiple of this device's %zu",
               (unsigned long long)chunk_size, c->be->granularity);
      rc = GML_EPROTO;
    }
    if (rc) {
      GML_ERR("daemon at %s: %s: %s", path, gml_strerror(rc), c->last_error);
      goto fail;
    }
    snprintf(c->gpu_uuid, sizeof c->gpu_uuid, "%s", c->be->uuid); /* a reconnection's hello says the device we map for */
    src = (gml_chunk_source){c, daemon_acquire, daemon_release, daemon_acquire_stream};
    GML_INFO("connected to the daemon of %s at %s (client %llu, %s)", c->be->uuid, path, (unsigned long long)c->client_id, msg);
  } else if (opt.mode == GML_MODE_DAEMON) {
    GML_ERR("no daemon at %s; GMLAKE_MODE=daemon: not running embedded", why);
    goto fail;
  } else {
    c->mode = GML_MODE_EMBEDDED;
    rc = gml_backend_open(opt.backend, o.device, &bo, &c->be, msg, sizeof msg);
    if (rc) {
      GML_ERR("%s", msg);
      goto fail;
    }
    src = (gml_chunk_source){c, embedded_acquire, embedded_release, NULL};
    if (opt.mode == GML_MODE_EMBEDDED) GML_INFO("embedded mode (asked for); %s", msg);
    else GML_WARN("no daemon at %s; running embedded (%s)", why, msg);
  }
  gml_alloc_config cfg;
  gml_alloc_config_from_options(&opt, &cfg);
  if (o.guard) cfg.guard = o.guard > 0 ? o.guard : 0;
  if (o.guard_grain) cfg.guard_grain = o.guard_grain;
  if (o.borrow) cfg.borrow = o.borrow > 0;
  /* guard mode on cuda guards whole chunks: embedded, the finest chunk the
   * device allows (its granularity) unless GMLAKE_CHUNK_SIZE says otherwise */
  if (cfg.guard > 0 && c->mode == GML_MODE_EMBEDDED && !c->be->ops->protect && !opt.chunk_size)
    gml_backend_set_chunk_size(c->be, c->be->granularity);
  rc = gml_alloc_init(&c->alloc, c->be, src, gml_va_size(&opt, c->be), &cfg);
  if (rc) {
    GML_ERR("cannot start the allocator: %s (%s)", gml_strerror(rc), c->alloc.last_error);
    goto fail;
  }
  if (cfg.guard > 0)
    GML_INFO("guard mode: %s, guards of %zu bytes", cfg.guard == GML_GUARD_BOTH ? "both ends" : "end", c->alloc.guard_grain);
  if (c->mode == GML_MODE_EMBEDDED) {
    uint64_t lim = o.limit_bytes;
    if (!lim && opt.limit) {
      uint64_t f = 0, t = 0;
      c->be->ops->mem_info(c->be, &f, &t);
      if (gml_parse_size(opt.limit, t, &lim) || !lim) { /* a share of a device whose size is unknown (or of no byte) */
        GML_ERR("GMLAKE_LIMIT=%s: %s", opt.limit,
                t ? "less than a byte of the device" : "the device does not say its size; give the limit in bytes");
        gml_alloc_destroy(&c->alloc);
        rc = GML_EINVAL;
        goto fail;
      }
    }
    c->alloc.limit_bytes = lim;
  } else if (opt.limit) { /* once a process: it asked for a bound it does not get */
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
      GML_WARN("GMLAKE_LIMIT=%s is not applied: this process uses the daemon at %s, whose limit and quotas hold; "
               "GMLAKE_MODE=embedded applies it", opt.limit, path);
  }
  if (c->mode == GML_MODE_DAEMON && (rc = gml_link_start(c, path))) {
    gml_alloc_destroy(&c->alloc);
    goto fail;
  }
  *out = c;
  return 0;
fail:
  if (c->sock >= 0) close(c->sock);
  if (c->be) gml_backend_close(c->be);
  gml_grow_destroy_all(c);
  pthread_mutex_destroy(&c->conn_lock);
  pthread_mutex_destroy(&c->track_lock);
  free(c);
  return rc;
}

int gml_close(gml_client *c) {
  if (!c) return GML_EINVAL;
  gml_link_quiesce(c);          /* no reclaim runs in the allocator from here on */
  gml_pause_destroy(c);         /* paused content is dropped */
  gml_ipc_client_gone(c);
  gml_track_destroy(c);          /* pending frees and pools' blocks go back first */
  gml_grow_destroy_all(c);      /* ranges the caller left: their chunks go back first */
  gml_alloc_destroy(&c->alloc); /* returns every chunk (daemon: one return each) */
  gml_link_stop(c);
  if (c->sock >= 0) close(c->sock);
  gml_backend_close(c->be);
  pthread_mutex_destroy(&c->conn_lock);
  pthread_mutex_destroy(&c->track_lock);
  free(c);
  return 0;
}

int gml_write(gml_client *c, void *dst, const void *src, size_t n) {
  if (!c) return GML_EINVAL;
  if (!dst || !src) return gml_fail(c, GML_EINVAL, "gml_write: %s is NULL", !dst ? "dst" : "src");
  return c->be->ops->write(c->be, (uintptr_t)dst, src, n);
}

int gml_read(gml_client *c, void *dst, const void *src, size_t n) {
  if (!c) return GML_EINVAL;
  if (!dst || !src) return gml_fail(c, GML_EINVAL, "gml_read: %s is NULL", !dst ? "dst" : "src");
  return c->be->ops->read(c->be, (uintptr_t)src, dst, n);
}

int gml_client_call(gml_client *c, Gmlake__Envelope *env, Gmlake__Envelope **reply, int *fds, int *nfds) {
  if (c->mode != GML_MODE_DAEMON) return GML_EDAEMON;
  pthread_mutex_lock(&c->conn_lock);
  int rc = conn_call(c, env, 1, reply, fds, nfds);
  pthread_mutex_unlock(&c->conn_lock);
  return rc;
}

int gml_flush(gml_client *c) {
  if (!c) return GML_EINVAL;
  gml_client_housekeeping(c, 1);
  return __atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE) ? GML_EDAEMON : 0; /* the reader sets it */
}

const char *gml_last_error(gml_client *c) { return c ? c->last_error : "no client"; }

int gml_block_of(gml_client *c, const void *addr, gml_block_info *info) {
  if (!c) return GML_EINVAL;
  if (!info) return gml_fail(c, GML_EINVAL, "gml_block_of: info is NULL");
  int rc = gml_alloc_block_of(&c->alloc, (uintptr_t)addr, info);
  return rc ? gml_fail(c, rc, "gml_block_of: %p is in, just past or in the guard of no live allocation", addr) : 0;
}

int gml_block_list(gml_client *c, gml_block_info *out, size_t max) {
  if (!c) return GML_EINVAL;
  if (!out && max) return gml_fail(c, GML_EINVAL, "gml_block_list: out is NULL with max %zu", max);
  return gml_alloc_block_list(&c->alloc, out, max);
}
