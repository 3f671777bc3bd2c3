/* dispatch.c: what a client's frames mean (the protocol over the
 * transport of session.c). Every request goes through one table (`routes`:
 * message kind -> check against the daemon's state, handler); the wire
 * checks come first (common/wire.c). A lease is decided by the broker
 * (broker.c) and carried out by grant.c; hello, shares and the restart's
 * hand-over are their own files; the end of a session is park.c. The
 * hooks the transport calls are installed here, at start. */
#include "dispatch.h"
#include "adopt.h"
#include "daemon.h"
#include "grant.h"
#include "hello.h"
#include "listen.h"
#include "meminfo.h"
#include "park.h"
#include "pidquota.h"
#include "shares.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <stdio.h>

/* ---------- requests: one table, message kind -> check and handler ---------- */

typedef struct request {
  session *s;
  const Gmlake__Envelope *env;
  char why[160];                      /* set by a check that refuses the message */
  uint32_t idx[GML_MAX_LEASE_CHUNKS]; /* return: lake indices of the chunks, checked */
} request;

static int refuse_msg(request *rq, const char *why) {
  snprintf(rq->why, sizeof rq->why, "%s", why);
  return -1;
}

/* The hello: hello.c. */
static void handle_hello(request *rq) { hello_handle(rq->s, rq->env); }

static int check_lease(request *rq) {
  return rq->s->bc.lease.pending ? refuse_msg(rq, "a second lease while one is in flight") : 0;
}

static void handle_lease(request *rq) { /* decided by the broker, carried out by grant.c */
  const Gmlake__LeaseRequest *lr = rq->env->lease;
  grant_lease(rq->s, rq->env->seq, (uint32_t)lr->count, lr->optional, lr->streamed);
}

/* Every id must be a chunk the client holds, each once. */
static int check_return(request *rq) {
  const Gmlake__ReturnRequest *rr = rq->env->ret;
  const lake *lk = &rq->s->d->lk;
  for (size_t i = 0; i < rr->n_chunk_ids; i++) {
    long idx = lake_owned_index(lk, rr->chunk_ids[i], rq->s->bc.id);
    for (size_t k = 0; k < i && idx >= 0; k++)
      if (rq->idx[k] == (uint32_t)idx) idx = -1; /* the same id twice */
    if (idx < 0) {
      snprintf(rq->why, sizeof rq->why, "returned chunk %#llx it does not hold", (unsigned long long)rr->chunk_ids[i]);
      return -1;
    }
    rq->idx[i] = (uint32_t)idx;
  }
  return 0;
}

static void handle_return(request *rq) {
  session *s = rq->s;
  gmld *d = s->d;
  size_t n = rq->env->ret->n_chunk_ids;
  /* The client unmapped and released them: they go straight back; tainted
   * ones (another user's process may map them) are released, made anew */
  uint8_t retire[GML_MAX_LEASE_CHUNKS]; /* only a hand-over's chunks: else a client could mint chunks it keeps */
  for (size_t i = 0; i < n; i++) retire[i] = rq->env->ret->tainted && d->lk.chunks[rq->idx[i]].adopted;
  broker_returned(&d->br, &s->bc, rq->idx, n);
  for (size_t i = 0; i < n; i++)
    if (retire[i]) lake_destroy_chunk(&d->lk, rq->idx[i]), d->counters.chunks_remade++;
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReturnReply r = GMLAKE__RETURN_REPLY__INIT;
  r.returned = (uint32_t)n;
  env.seq = rq->env->seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_RET_REPLY;
  env.ret_reply = &r;
  session_send_msg(s, &env, NULL, 0);
  sessions_serve_pending(d);
}

static void handle_usage(request *rq) {
  const Gmlake__UsageReport *u = rq->env->usage;
  broker_client *c = &rq->s->bc;
  c->reported = *u, c->reported.base.n_unknown_fields = 0, c->reported.base.unknown_fields = NULL; /* freed with u */
  c->allocated = u->allocated;
  c->cached = u->cached;
  c->stitched = u->stitched;
  c->largest_free = u->largest_free;
  c->paused = u->paused, c->paused_saved = u->paused_saved;
  c->growable_mapped = u->growable_mapped, c->growable_unmapped = u->growable_unmapped;
  c->idle = u->idle_bytes, c->fragment = u->fragment_bytes, c->uncounted = u->uncounted;
  broker_usage_bound(&rq->s->d->br, c, rq->s->d->device_total);
  broker_allocations(&rq->s->d->br, c, u->alloc_count, gmli_now_ns()); /* allocating: not idle */
  broker_reported(&rq->s->d->br, c, u->reclaims_served);
  sessions_tick(rq->s->d); /* a lease waiting for this client's answer may be decided now */
}

/* Share, attach, detach: daemon/shares.c. */
static int check_shares(request *rq) {
  const char *why = shares_check(rq->s, rq->env);
  return why ? refuse_msg(rq, why) : 0;
}

static void handle_shares(request *rq) { shares_handle(rq->s, rq->env); }

/* Adopt: after a restart, a client hands over the chunks it holds (adopt.c). */
static int check_adopt(request *rq) {
  const char *why = adopt_check(rq->s, rq->env);
  return why ? refuse_msg(rq, why) : 0;
}

static void handle_adopt(request *rq) { adopt_handle(rq->s, rq->env); }

/* What it could get now: decided by meminfo.c (a promise for a moment), the device's free memory bounding
 * what may still be made. */
static void handle_mem_info(request *rq) {
  session *s = rq->s;
  gmld *d = s->d;
  uint64_t dev_free = 0, dev_total = 0;
  if (d->be->ops->mem_info(d->be, &dev_free, &dev_total)) dev_free = 0; /* unknown: only what the lake has made */
  gmli_mem_answer a;
  gmli_broker_mem_info(&d->br, &s->bc, gmli_now_ns(), dev_free, &a);
  if (a.wait_ms) /* a test waits for this line: the asker now waits on another's promise */
    GML_DEBUG("client %llu (pid %d) asked its free memory: another client's promise holds, ask again in %u ms",
              (unsigned long long)s->bc.id, (int)s->bc.pid, a.wait_ms);
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__MemInfoReply r = GMLAKE__MEM_INFO_REPLY__INIT;
  r.limit_bytes = a.limit_bytes, r.quota_bytes = a.quota_bytes, r.quota_room_bytes = a.quota_room_bytes;
  r.free_bytes = a.free_bytes, r.wait_ms = a.wait_ms;
  r.device_total = d->device_total ? d->device_total : dev_total;
  e.seq = rq->env->seq;
  e.msg_case = GMLAKE__ENVELOPE__MSG_MEM_INFO_REPLY;
  e.mem_info_reply = &r;
  session_send_msg(s, &e, NULL, 0);
}

/* A new client message: its case in Envelope (proto/gmlake.proto), what it
 * must be on the wire in gmli_wire_check_request (common/wire.c: sizes,
 * ranges, allowed before hello?), a row here with a check against the
 * daemon's state (NULL: none) and a handler. A message that fails either
 * check closes that client's connection. */
static const struct msg_route {
  Gmlake__Envelope__MsgCase kind;
  int (*check)(request *rq); /* 0, or -1 with rq->why */
  void (*handle)(request *rq);
} routes[] = {
    {GMLAKE__ENVELOPE__MSG_HELLO, NULL, handle_hello},
    {GMLAKE__ENVELOPE__MSG_LEASE, check_lease, handle_lease},
    {GMLAKE__ENVELOPE__MSG_RET, check_return, handle_return},
    {GMLAKE__ENVELOPE__MSG_USAGE, NULL, handle_usage},
    {GMLAKE__ENVELOPE__MSG_SHARE, check_shares, handle_shares},
    {GMLAKE__ENVELOPE__MSG_ATTACH, check_shares, handle_shares},
    {GMLAKE__ENVELOPE__MSG_DETACH, check_shares, handle_shares},
    {GMLAKE__ENVELOPE__MSG_ADOPT, check_adopt, handle_adopt},
    {GMLAKE__ENVELOPE__MSG_MEM_INFO, NULL, handle_mem_info},
};

static const struct msg_route *route_of(Gmlake__Envelope__MsgCase kind) {
  for (size_t i = 0; i < GML_ARRAY_LEN(routes); i++)
    if (routes[i].kind == kind) return &routes[i];
  return NULL;
}

/* The transport's on_frame: decoded, checked on the wire, then by its
 * route, then as part of a hand-over (adopt_seen), and handled. */
static int on_frame(session *s, const uint8_t *body, size_t len, char why[SESSION_WHY_MAX]) {
  request rq = {.s = s};
  Gmlake__Envelope *env = gmlake__envelope__unpack(NULL, len, body);
  /* what every message must be on the wire (common/wire.c, fuzzed), then the route's own checks */
  const char *bad = env ? gmli_wire_check_request(env, s->hello_done) : "undecodable message";
  const struct msg_route *r = bad ? NULL : route_of(env->msg_case);
  rq.env = env;
  if (!bad && !r) bad = "unexpected message kind";
  if (!bad && r->check && r->check(&rq)) bad = rq.why;
  if (!bad) bad = adopt_seen(s, env);
  if (!bad) r->handle(&rq);
  if (bad) snprintf(why, SESSION_WHY_MAX, "%s", bad);
  if (env) gmlake__envelope__free_unpacked(env, NULL);
  return bad ? -1 : 0;
}

static const session_ops dispatch_ops = {
    .on_frame = on_frame,
    .on_writable = grant_more,
    .on_closing = park_on_closing,
    .on_closed = sessions_serve_pending,
};

void dispatch_start(gmld *d) { sessions_start(d, &dispatch_ops); }

void dispatch_stop(gmld *d) {
  sessions_stop_listening(d);
  sessions_close_all(d);
  park_release_all(d);
  shares_close_all(d); /* what processes that left still mapped */
  pidquota_close_all(d);
}
