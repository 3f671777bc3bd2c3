/* lease.c: the daemon as the allocator's chunk source: leases (one request
 * and reply, or a streamed lease whose replies link.c's reader queues and may
 * import), the imports of the chunks' fds with the backend, and returns (parked
 * and uncounted chunks released locally only). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "log.h"
#include "util.h"
#include "wire.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  int rc = gmli_link_call(c, env, 1, &r->env, r->fds, &r->nfds);
  pthread_mutex_unlock(&c->conn_lock);
  return rc;
}

/* The chunks of one lease reply imported into phys/ids from *got on (at
 * most max in all); the reply and its fds freed. 0, or what was wrong. */
static int import_reply(gml_client *c, daemon_reply *r, int optional, size_t max, gml_phys *phys, uint64_t *ids,
                        size_t *got) {
  Gmlake__Envelope *reply = r->env;
  int rc = 0;
  if (reply->msg_case == GMLAKE__ENVELOPE__MSG_ERROR) {
    rc = reply->error->code < 0 && reply->error->code >= GML_ECLOSED ? reply->error->code : GML_ENOMEM;
    if (!optional) { /* an optional lease refused is no error of the caller's */
      snprintf(c->lake_error, sizeof c->lake_error, "%s", reply->error->message);
      snprintf(c->last_error, sizeof c->last_error, "daemon refused lease: %s", reply->error->message);
      GML_INFO("%s", c->last_error);
    }
  } else if (reply->msg_case != GMLAKE__ENVELOPE__MSG_LEASE_REPLY ||
             reply->lease_reply->n_chunk_ids != (size_t)r->nfds || r->nfds == 0 || (size_t)r->nfds > max - *got) {
    GML_ERR("bad lease reply: %zu ids, %d fds",
            reply->msg_case == GMLAKE__ENVELOPE__MSG_LEASE_REPLY ? reply->lease_reply->n_chunk_ids : 0, r->nfds);
    rc = GML_EPROTO;
  } else {
    uint64_t t0 = gmli_now_ns();
    for (int i = 0; i < r->nfds; i++) {
      int irc = c->be->ops->chunk_import(c->be, r->fds[i], &phys[*got]);
      r->fds[i] = -1; /* the import took it, whatever its result */
      if (irc) {
        GML_ERR("importing chunk %llu failed: %s", (unsigned long long)reply->lease_reply->chunk_ids[i],
                gml_strerror(irc));
        continue; /* its id stays leased to us until we disconnect; nothing leaks */
      }
      ids[(*got)++] = reply->lease_reply->chunk_ids[i];
    }
    __atomic_fetch_add(&c->alloc.import_ns, gmli_now_ns() - t0, __ATOMIC_RELAXED);
    c->lake_error[0] = 0;
  }
  gmli_link_free(reply, r->fds, r->nfds);
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
  uint64_t waited = 0, t0 = gmli_now_ns();
  int rc = streamed ? gmli_link_send(c, &env, 1, got_fn != NULL) : gmli_link_call(c, &env, 1, &r.env, r.fds, &r.nfds);
  if (!rc && streamed) rc = gmli_link_next_chunks(c, &r.env, r.fds, &r.nfds, bp, bi, &k);
  while (!rc) {
    waited += gmli_now_ns() - t0;
    uint64_t left = r.env->msg_case == GMLAKE__ENVELOPE__MSG_LEASE_REPLY ? r.env->lease_reply->left : 0;
    if (got_fn && r.env->msg_case == GMLAKE__ENVELOPE__MSG_LEASE_REPLY && !r.nfds && k <= n - got) {
      if (k) got_fn(arg, bp, bi, k);
      got += k;
      c->lake_error[0] = 0;
      gmli_link_free(r.env, r.fds, r.nfds);
    } else if ((rc = import_reply(c, &r, optional, n, phys, ids, &got))) {
      break;
    }
    if (!streamed || !left) break;
    t0 = gmli_now_ns();
    rc = gmli_link_next_chunks(c, &r.env, r.fds, &r.nfds, bp, bi, &k);
  }
  if (streamed) gmli_link_end(c);
  if (got && rc) c->lease_refused = rc; /* partly served: these chunks now, the refusal next */
  pthread_mutex_unlock(&c->conn_lock);
  __atomic_fetch_add(&c->alloc.lease_wait_ns, waited, __ATOMIC_RELAXED);
  if (streamed) __atomic_fetch_add(&c->alloc.chunks_streamed, got, __ATOMIC_RELAXED);
  return got ? (int)got : rc ? rc : GML_EBACKEND;
}
static int daemon_acquire(void *ctx, size_t n, int optional, gml_phys *phys, uint64_t *ids) {
  return daemon_lease(ctx, n, optional, phys, ids, NULL, NULL);
}

/* src.acquire_stream (GMLAKE_STREAM_MAP): only through a daemon that
 * streams; else one plain acquire handed over whole. */
static int daemon_acquire_stream(void *ctx, size_t n, stream_got_fn got_fn, void *arg) {
  gml_client *c = ctx;
  if (__atomic_load_n(&c->max_stream, __ATOMIC_RELAXED) && c->link &&
      n > GML_MAX_LEASE_CHUNKS) /* daemon_lease decides again */
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
    gmli_link_free(r.env, r.fds, r.nfds);
  }
}

/* Return ids to the daemon in Return requests of up to GML_MAX_LEASE_CHUNKS;
 * parked ones (at the daemon under our pid, or never counted) are local only (keeper.c). */
static void return_ids(gml_client *c, const uint64_t *ids, size_t n, int tainted) {
  uint64_t keep[GML_MAX_LEASE_CHUNKS];
  for (size_t i = 0; i < n;) {
    size_t k = 0;
    for (; i < n && k < GML_MAX_LEASE_CHUNKS; i++)
      if (!(ids[i] & GML_ID_PARKED)) keep[k++] = ids[i];
      else if (ids[i] & GML_ID_UNCOUNTED) gmli_client_uncounted_gone(c);
    if (k) daemon_return(c, keep, k, tainted);
  }
}

static void daemon_release(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids) {
  gml_client *c = ctx;
  for (size_t i = 0; i < n; i++) c->be->ops->chunk_release(c->be, phys[i]); /* our handles go first */
  return_ids(c, ids, n, 0);
}

void gmli_client_return_tainted(gml_client *c, const uint64_t *ids, size_t n) { return_ids(c, ids, n, 1); }

gml_chunk_source gmli_lease_source(gml_client *c) {
  return (gml_chunk_source){c, daemon_acquire, daemon_release, daemon_acquire_stream};
}
