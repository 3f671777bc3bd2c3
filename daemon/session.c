/* session.c: client sessions on the daemon's Unix socket. Identity comes
 * from SO_PEERCRED; every frame is validated (length, fd count, message
 * kind, chunk ownership) and a bad one closes that client only. Requests go
 * through one table (`routes`: message kind -> check, handler); a lease is
 * decided by the broker (broker.c) and only carried out here. A client that
 * leaves gets its chunks back into the lake once its process is gone (a
 * pidfd says when), so no mapping in a living process can alias a chunk
 * leased to someone else. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "session.h"
#include "adopt.h"
#include "conn.h"
#include "daemon.h"
#include "pidquota.h"
#include "shares.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void session_close(session *s, const char *why);
static void session_update_poll(session *s);
static void sessions_on_kick(uv_idle_t *t);

/* ---------- sending ---------- */

/* A session that cannot go on (its peer gone, its queue over the bound, a
 * timeout) is closed at the next turn of the loop, not here: the caller may
 * be another session's handler walking the client list. Nothing is read from
 * or sent to it meanwhile. */
void session_doom(session *s, const char *why) {
  if (s->bc.closing || s->fd < 0) return;
  s->bc.closing = 1;
  s->close_why = why;
  uv_poll_stop(&s->poll);
  s->poll_events = 0;
  uv_idle_start(&s->d->kick, sessions_on_kick);
}

/* Room for one more reply of a lease's fds (fdbudget.c): it goes at once
 * (nothing waits before it), or its dups fit in what s and all queues may
 * hold. A streamed lease sends its next reply only then: else it waits for
 * the client to read (grant_more), never refused for being read slowly. */
int session_fds_room(const session *s) {
  return !s->txq.head || fdbudget_room(s->d, s->txq.nfds) >= GML_MAX_LEASE_CHUNKS;
}

static void tx_flush(session *s) {
  if (s->bc.closing) return;
  int rc = conn_flush(&s->txq, s->fd);
  if (rc) session_doom(s, rc == GML_EDAEMON ? "disconnected" : "send failed");
}

/* Sent, or queued within s's fd room; CONN_NO_FD_ROOM (nothing sent: the
 * caller refuses the request, fdbudget_refusal) or an error (s doomed). */
static int session_send(session *s, Gmlake__Envelope *env, const int *fds, int nfds) {
  if (s->bc.closing) return GML_EDAEMON;
  int rc = conn_send_or_queue(&s->txq, s->fd, env, fds, nfds, fdbudget_room(s->d, s->txq.nfds));
  if (rc == CONN_NO_FD_ROOM) return rc;
  if (rc) {
    session_doom(s, rc == GML_EDAEMON ? "disconnected" : "cannot send or queue a reply");
    return rc;
  }
  if (s->txq.bytes > s->d->cfg.send_queue_max) {
    /* it does not read what it asked for: no unbounded memory for it */
    session_doom(s, "send queue over send-queue-max (the client does not read)");
    return GML_ENOMEM;
  }
  tx_flush(s);
  session_update_poll(s);
  return 0;
}

/* An Error reply (a refusal's message carries the lake-wide picture). */
void session_send_error(session *s, uint64_t seq, int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__Error e = GMLAKE__ERROR__INIT;
  e.code = code;
  e.message = msg;
  env.seq = seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_ERROR;
  env.error = &e;
  session_send(s, &env, NULL, 0);
}
#define send_error session_send_error

int session_send_msg(session *s, Gmlake__Envelope *env, const int *fds, int nfds) { return session_send(s, env, fds, nfds); }

void session_send_reclaim(session *s, uint64_t bytes, uint64_t valid_ms) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReclaimRequest r = GMLAKE__RECLAIM_REQUEST__INIT;
  r.bytes = bytes, r.sent_ns = gml_now_ns(), r.valid_ms = valid_ms;
  env.msg_case = GMLAKE__ENVELOPE__MSG_RECLAIM;
  env.reclaim = &r;
  session_send(s, &env, NULL, 0);
}

void sessions_tick(gmld *d) {
  uint64_t now = gml_now_ns();
  for (broker_client *c = d->br.clients; c; c = c->next) {
    session *s = session_of(c);
    if (!s->hello_done && now - s->connect_ns > (uint64_t)d->cfg.hello_timeout_ms * 1000000ull)
      session_doom(s, "no hello within hello-timeout-ms");
    if (s->partial_since_ns && now - s->partial_since_ns > (uint64_t)d->cfg.frame_timeout_ms * 1000000ull)
      session_doom(s, "a partial frame not completed within frame-timeout-ms");
    if (!c->closing) grant_review(s, now);
  }
}

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
static void handle_hello(request *rq) { session_hello(rq->s, rq->env); }

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
  session_send(s, &env, NULL, 0);
  sessions_serve_pending(d);
}

static void handle_usage(request *rq) {
  const Gmlake__UsageReport *u = rq->env->usage;
  broker_client *c = &rq->s->bc;
  c->allocated = u->allocated;
  c->cached = u->cached;
  c->stitched = u->stitched;
  c->largest_free = u->largest_free;
  c->paused = u->paused, c->paused_saved = u->paused_saved;
  c->growable_mapped = u->growable_mapped, c->growable_unmapped = u->growable_unmapped;
  c->idle = u->idle_bytes, c->fragment = u->fragment_bytes, c->uncounted = u->uncounted;
  broker_usage_bound(&rq->s->d->br, c, rq->s->d->device_total);
  broker_allocations(&rq->s->d->br, c, u->alloc_count, gml_now_ns()); /* allocating: not idle */
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

/* A new client message: its case in Envelope (proto/gmlake.proto), what it
 * must be on the wire in gml_wire_check_request (common/wire.c: sizes,
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
};

static const struct msg_route *route_of(Gmlake__Envelope__MsgCase kind) {
  for (size_t i = 0; i < GML_ARRAY_LEN(routes); i++)
    if (routes[i].kind == kind) return &routes[i];
  return NULL;
}

/* Returns 0 to go on, -1 when the session was closed. */
static int handle_frame(session *s, const uint8_t *body, size_t len) {
  gmld *d = s->d;
  request rq = {.s = s};
  Gmlake__Envelope *env = gmlake__envelope__unpack(NULL, len, body);
  /* what every message must be on the wire (common/wire.c, fuzzed), then the route's own checks */
  const char *bad = env ? gml_wire_check_request(env, s->hello_done) : "undecodable message";
  const struct msg_route *r = bad ? NULL : route_of(env->msg_case);
  rq.env = env;
  if (!bad && !r) bad = "unexpected message kind";
  if (!bad && r->check && r->check(&rq)) bad = rq.why;
  if (!bad) bad = adopt_seen(s, env);
  if (!bad) r->handle(&rq);
  if (env) gmlake__envelope__free_unpacked(env, NULL);
  if (bad) {
    d->counters.protocol_errors++;
    CONN_WARN(s->bc.uid, "protocol error from client %llu (pid %d): %s: closing it", (unsigned long long)s->bc.id, (int)s->bc.pid, bad);
    session_close(s, bad);
    return -1;
  }
  return s->fd < 0 ? -1 : 0;
}

/* Handle complete frames from s's buffer, at most *budget of them. Returns
 * -1 when s was closed, 1 when complete frames are left over, else 0. */
static int take_frames(session *s, int *budget) {
  const uint8_t *body;
  size_t len;
  int k;
  while ((k = gml_rx_next(&s->rx, &body, &len)) == 1) {
    if (s->bc.closing) return -1; /* doomed by its own request: nothing more from it */
    if (*budget <= 0) return 1;
    if (handle_frame(s, body, len)) return -1;
    gml_rx_consume(&s->rx, len);
    (*budget)--;
  }
  if (k < 0) {
    s->d->counters.protocol_errors++;
    CONN_WARN(s->bc.uid, "client %llu (pid %d) sent a frame over %d bytes: closing it", (unsigned long long)s->bc.id, (int)s->bc.pid,
             GML_MAX_FRAME);
    session_close(s, "oversize frame");
    return -1;
  }
  /* what is left is part of a frame: it must be whole within frame_timeout_ms */
  if (s->rx.len == s->rx.off) s->partial_since_ns = 0;
  else if (!s->partial_since_ns) s->partial_since_ns = gml_now_ns();
  return 0;
}

/* Read and handle what s sent, within its budget for this turn of the loop
 * (read_budget frames), so that a client that floods cannot starve the
 * others: the rest waits (s->backlog) for the next turn. */
static void session_read(session *s) {
  int budget = s->d->cfg.read_budget;
  int more = take_frames(s, &budget);
  while (more == 0 && budget > 0 && !s->bc.closing) {
    long r = gml_rx_fill(&s->rx, s->fd);
    if (s->rx.fds_received) {
      s->d->counters.protocol_errors++;
      CONN_WARN(s->bc.uid, "client %llu (pid %d) sent file descriptors: closing it", (unsigned long long)s->bc.id, (int)s->bc.pid);
      session_close(s, "unexpected fds");
      return;
    }
    if (r == GML_EAGAIN) break;
    if (r == 0 && s->rx.len > s->rx.off) {
      s->d->counters.protocol_errors++;
      CONN_WARN(s->bc.uid, "client %llu (pid %d) left in the middle of a frame", (unsigned long long)s->bc.id, (int)s->bc.pid);
      session_close(s, "truncated frame");
      return;
    }
    if (r <= 0) {
      session_close(s, r == 0 ? "disconnected" : r == GML_EPROTO ? "receive buffer full" : strerror(errno));
      return;
    }
    more = take_frames(s, &budget);
  }
  if (more < 0) return;
  if (budget <= 0 && !s->bc.closing) {
    s->backlog = 1; /* come back at the next turn, after the others */
    uv_idle_start(&s->d->kick, sessions_on_kick);
  }
}

static void on_session_io(uv_poll_t *h, int status, int events) {
  session *s = h->data;
  if (s->bc.closing) return;
  if (status < 0) {
    session_close(s, uv_strerror(status));
    return;
  }
  if (events & UV_WRITABLE) tx_flush(s), grant_more(s);
  if ((events & UV_READABLE) && !s->bc.closing) session_read(s);
  if (s->fd >= 0) session_update_poll(s);
}

static void session_update_poll(session *s) {
  if (s->bc.closing || s->fd < 0) return;
  /* nothing more is read while frames wait from the last turn */
  int ev = (s->backlog ? 0 : UV_READABLE) | (s->txq.head ? UV_WRITABLE : 0);
  if (ev != s->poll_events) {
    s->poll_events = ev;
    if (ev) uv_poll_start(&s->poll, ev, on_session_io);
    else uv_poll_stop(&s->poll);
  }
}

/* The next turn of the loop: doomed sessions are closed, sessions with a
 * backlog handle their next budget of frames. */
static void sessions_on_kick(uv_idle_t *t) {
  gmld *d = t->data;
  uv_idle_stop(t); /* started again below while work is left */
  broker_client *c;
  for (;;) { /* closing changes the list: start over after each */
    for (c = d->br.clients; c && !(c->closing && session_of(c)->fd >= 0); c = c->next) {}
    if (!c) break;
    session_close(session_of(c), session_of(c)->close_why ? session_of(c)->close_why : "closing");
  }
  for (c = d->br.clients; c; c = c->next) {
    session *s = session_of(c);
    if (!s->backlog || c->closing) continue;
    s->backlog = 0;
    session_read(s); /* may close s: then c is gone from the list, start over next turn */
    if (s->fd < 0) {
      uv_idle_start(&d->kick, sessions_on_kick);
      break;
    }
    session_update_poll(s);
  }
}

/* ---------- leaving ---------- */

static void parked_free(uv_handle_t *h) { free(h->data); }

static void release_owner_chunks(gmld *d, uint64_t owner) {
  for (uint32_t i = 0; i < d->lk.nslots; i++) {
    lake_chunk *c = &d->lk.chunks[i];
    if ((c->state == CHUNK_LEASED || c->state == CHUNK_PARKED) && c->owner == owner) lake_give_back(&d->lk, i);
  }
}

static void on_parked_exit(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  parked_owner *p = h->data;
  gmld *d = p->d;
  release_owner_chunks(d, p->owner);
  broker_unpark(&d->br, &p->bc);
  CONN_INFO(p->bc.uid, "process %d exited: its parked chunks are back in the lake", (int)p->pid);
  for (parked_owner **pp = &d->parked; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  uv_poll_stop(&p->poll);
  close(p->pidfd);
  uv_close((uv_handle_t *)&p->poll, parked_free);
  sessions_serve_pending(d);
}

static void session_free_cb(uv_handle_t *h) {
  session *s = h->data;
  gml_rx_free(&s->rx);
  free(s);
}

static void session_close(session *s, const char *why) {
  gmld *d = s->d;
  if (s->fd < 0) return;
  s->bc.closing = 1;
  adopt_session_closing(s); /* a hand-over not complete: dropped, not parked (the client offers it again) */
  uint64_t held = 0;
  for (uint32_t i = 0; i < d->lk.nslots; i++)
    held += d->lk.chunks[i].state == CHUNK_LEASED && d->lk.chunks[i].owner == s->bc.id;
  int gone = conn_process_gone(s->pidfd, s->bc.pid);
  shares_session_closed(s, gone); /* before its pidfd is closed or handed on */
  if (gone || !held || d->stopping) {
    release_owner_chunks(d, s->bc.id);
    if (s->pidfd >= 0) close(s->pidfd);
  } else {
    /* Its process lives on and may still map them: park until it exits. */
    for (uint32_t i = 0; i < d->lk.nslots; i++)
      if (d->lk.chunks[i].state == CHUNK_LEASED && d->lk.chunks[i].owner == s->bc.id) lake_park(&d->lk, i);
    parked_owner *p = calloc(1, sizeof *p);
    if (p && s->pidfd >= 0) {
      p->d = d;
      p->owner = s->bc.id;
      p->pidfd = s->pidfd;
      p->pid = s->bc.pid;
      p->bc = s->bc; /* who it was, what it holds: still its process's */
      p->bc.leased_chunks = held;
      p->bc.allocated = p->bc.cached = p->bc.stitched = p->bc.paused = p->bc.paused_saved = 0;
      p->bc.idle = p->bc.fragment = p->bc.uncounted = 0;
      uv_poll_init(d->loop, &p->poll, p->pidfd);
      p->poll.data = p;
      uv_poll_start(&p->poll, UV_READABLE, on_parked_exit);
      p->next = d->parked;
      d->parked = p;
      broker_park(&d->br, &p->bc);
    } else {
      free(p);
      if (s->pidfd >= 0) close(s->pidfd);
      CONN_WARN(s->bc.uid, "cannot watch pid %d: its %llu chunk(s) stay parked", (int)s->bc.pid, (unsigned long long)held);
    }
  }
  CONN_INFO(s->bc.uid, "client %llu (pid %d) left (%s); %llu chunk(s) %s", (unsigned long long)s->bc.id, (int)s->bc.pid, why,
           (unsigned long long)held, !held ? "held" : gone || d->stopping ? "back in the lake" : "parked until its process exits");
  broker_remove_client(&d->br, &s->bc);
  uv_poll_stop(&s->poll);
  conn_txq_free(&s->txq); /* closes the fd references its queue held */
  close(s->fd);
  s->fd = -1;
  uv_close((uv_handle_t *)&s->poll, session_free_cb);
  sessions_serve_pending(d);
}

/* ---------- opening ---------- */

int session_open(gmld *d, int fd, const struct ucred *cred) {
  session *s = calloc(1, sizeof *s);
  if (!s) return GML_ENOMEM;
  s->d = d;
  s->fd = fd;
  s->bc.id = ++d->next_client_id;
  s->bc.pid = cred->pid;
  s->bc.uid = cred->uid;
  s->pidfd = conn_peer_pidfd(fd, cred->pid, &s->peer_gone);
  s->connect_ns = gml_now_ns();
  if (!d->fdb.limit) fdbudget_init(d); /* set at start (main.c); here for a daemon made without it (the fuzzers) */
  s->txq.nfds_all = &d->fds_queued;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  s->bc.since = (double)ts.tv_sec + ts.tv_nsec / 1e9;
  uv_poll_init(d->loop, &s->poll, fd);
  s->poll.data = s;
  broker_add_client(&d->br, &s->bc);
  session_update_poll(s);
  return 0;
}

int sessions_listen(gmld *d) {
  uv_idle_init(d->loop, &d->kick);
  d->kick.data = d;
  return listen_start(d);
}

session *session_by_pid(gmld *d, pid_t pid) {
  for (broker_client *c = d->br.clients; c; c = c->next)
    if (c->pid == pid) return session_of(c);
  return NULL;
}

void sessions_close_all(gmld *d) {
  sessions_stop_listening(d);
  while (d->br.clients) session_close(session_of(d->br.clients), "daemon shutting down");
  uv_idle_stop(&d->kick);
  if (!uv_is_closing((uv_handle_t *)&d->kick)) uv_close((uv_handle_t *)&d->kick, NULL);
  while (d->parked) {
    parked_owner *p = d->parked;
    d->parked = p->next;
    release_owner_chunks(d, p->owner);
    broker_unpark(&d->br, &p->bc);
    uv_poll_stop(&p->poll);
    close(p->pidfd);
    uv_close((uv_handle_t *)&p->poll, parked_free);
  }
  shares_close_all(d); /* what processes that left still mapped */
  pidquota_close_all(d);
}
