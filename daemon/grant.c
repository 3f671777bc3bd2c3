/* grant.c: the broker's lease decisions (broker.c) carried out on a
 * session: chunks sent with their fds, refusals, reclaim requests to the
 * clients the broker names. A streamed lease gets reply after reply while
 * chunks are free (each carries how many are still to come), and the rest
 * as chunks come back or are created (sessions_serve_pending). Nothing is
 * decided here. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "grant.h"
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <stdlib.h>

/* A streamed lease's replies wait in its send queue only up to this many
 * bytes, and only while the fd budget has room for their fds
 * (session_fds_room): the rest is sent as the client reads (grant_more), so
 * a client that does not read holds neither the daemon's fds nor its memory. */
#define GRANT_QUEUE_MAX (32 * 1024)

void grant_send_reclaim(session *s, uint64_t bytes, uint64_t valid_ms) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReclaimRequest r = GMLAKE__RECLAIM_REQUEST__INIT;
  r.bytes = bytes, r.sent_ns = gmli_now_ns(), r.valid_ms = valid_ms;
  env.msg_case = GMLAKE__ENVELOPE__MSG_RECLAIM;
  env.reclaim = &r;
  session_send_msg(s, &env, NULL, 0);
}

/* Ask the clients the broker names (most idle cache first) for idle cache,
 * each for what the broker asks of it. The request is moot once the lease
 * is over: twice its wait bound after it is sent (a stream's bound restarts
 * with each batch), a client that gets it later (it was stopped) keeps its
 * cache. */
static void ask_reclaim(gmld *d, const broker_client *asker) {
  broker_client *few[32], **who = few;
  size_t n = broker_reclaim_targets(&d->br, asker, few, GML_ARRAY_LEN(few));
  if (n > GML_ARRAY_LEN(few)) {
    if ((who = malloc(n * sizeof *who))) broker_reclaim_targets(&d->br, asker, who, n);
    else who = few, n = GML_ARRAY_LEN(few); /* out of memory: the most idle ones */
  }
  for (size_t i = 0; i < n; i++) {
    grant_send_reclaim(session_of(who[i]), who[i]->reclaim_ask, 2 * d->br.lease_wait_ns / 1000000);
    CONN_INFO(asker->uid, "asked client %llu (pid %d) for %llu bytes of idle cache", (unsigned long long)who[i]->id,
              (int)who[i]->pid, (unsigned long long)who[i]->reclaim_ask);
  }
  if (who != few) free(who);
}

/* The reply has no room for its fds (fdbudget.c: the client does not read
 * and its replies' fds, or all clients', fill their budget): its chunks go
 * back unsent and the lease ends refused, naming the limit. */
static void refuse_no_fd_room(session *s, const broker_decision *dec) {
  gmld *d = s->d;
  char why[512];
  session_fd_refusal(s, (int)dec->n, why, sizeof why);
  broker_unsent(&d->br, &s->bc, dec);
  CONN_WARN(s->bc.uid, "lease of %u chunk(s) refused to client %llu (pid %d): %s", dec->n, (unsigned long long)s->bc.id,
            (int)s->bc.pid, why);
  session_send_error(s, dec->seq, GML_EAGAIN, "lease of %u chunk(s) refused: %s", dec->n, why);
}

static void send_chunks(session *s, const broker_decision *dec) {
  gmld *d = s->d;
  uint64_t ids[BROKER_MAX_LEASE];
  int fds[BROKER_MAX_LEASE];
  for (uint32_t i = 0; i < dec->n; i++) {
    ids[i] = lake_chunk_id(&d->lk, dec->idx[i]);
    fds[i] = d->lk.chunks[dec->idx[i]].fd;
  }
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__LeaseReply lr = GMLAKE__LEASE_REPLY__INIT;
  lr.n_chunk_ids = dec->n;
  lr.chunk_ids = ids;
  lr.left = dec->left;
  env.seq = dec->seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_LEASE_REPLY;
  env.lease_reply = &lr;
  if (session_send_msg(s, &env, fds, (int)dec->n) == CONN_NO_FD_ROOM) {
    refuse_no_fd_room(s, dec);
    return;
  }
  if (dec->left) return; /* a streamed lease's latency is its last reply's */
  uint64_t ns = gmli_now_ns() - dec->since_ns;
  broker_record_latency(&d->br, ns);
  if (s->bc.lease.asked > BROKER_MAX_LEASE) /* a streamed lease: one line for the operator (and the GPU bench) */
    CONN_INFO(s->bc.uid, "streamed lease of %u chunk(s) to client %llu (pid %d) served in %.1f ms", s->bc.lease.asked,
              (unsigned long long)s->bc.id, (int)s->bc.pid, (double)ns / 1e6);
}

/* A streamed lease: every free chunk it may have now, reply after reply,
 * while its send queue has room. */
static void serve_stream(session *s) {
  broker_decision more;
  while (s->bc.lease.pending && s->bc.lease.streamed && session_queued_bytes(s) < GRANT_QUEUE_MAX &&
         session_fds_room(s) && broker_serve_free(&s->d->br, &s->bc, &more))
    send_chunks(s, &more);
}

void grant_more(session *s) { serve_stream(s); }

/* Reclaim requests first, then s's answer (nothing while its lease waits). */
static void carry_out(session *s, const broker_decision *dec) {
  if (dec->from_idle)
    CONN_INFO(s->bc.uid,
              "client %llu (pid %d) waits for %u chunk(s), more than the free ones: idle clients' idle cache covers "
              "the rest, "
              "%llu bytes asked of them alone, no chunk created for it",
              (unsigned long long)s->bc.id, (int)s->bc.pid, s->bc.lease.count, (unsigned long long)dec->reclaim_bytes);
  if (dec->idle_short) { /* chunks for it may be created now, not at the next tick */
    CONN_INFO(s->bc.uid,
              "lease of client %llu (pid %d): the idle clients asked answered short of it or gave nothing for a while, "
              "%u chunk(s) still wanted: creating what the limit allows, asking the rest of any client with idle cache",
              (unsigned long long)s->bc.id, (int)s->bc.pid, s->bc.lease.count);
    daemon_refill(s->d);
  }
  if (dec->reclaim_bytes) ask_reclaim(s->d, &s->bc);
  switch (dec->verdict) {
  case BROKER_SERVE:
    send_chunks(s, dec);
    serve_stream(s);
    break;
  case BROKER_REFUSE: {
    /* A refused allocation is asked again once, after the client gave its
     * idle cache back (alloc_with_retry, client/track.c): the same refusal
     * within a second of the last one logged goes to the debug level, so one
     * allocation is one warning (and a client refused in a loop, one a second). */
    uint64_t now = gmli_now_ns();
    int again = s->bc.refusal_logged_code == dec->code && now - s->bc.refusal_logged_ns < 1000000000ull;
    if (!again) s->bc.refusal_logged_ns = now, s->bc.refusal_logged_code = dec->code;
    /* and a warning is in its user's share of the log (conn.h): a user connecting
     * again and again to be refused at once wrote a line each time, unbounded */
    if (again)
      gmli_log(GML_LOG_DEBUG, "lease of %u chunk(s) refused to client %llu (pid %d): %s (again)", dec->count,
               (unsigned long long)s->bc.id, (int)s->bc.pid, GML_LOG_ESC(dec->why)); /* it names quotas' cgroups */
    else
      CONN_WARN(s->bc.uid, "lease of %u chunk(s) refused to client %llu (pid %d): %s", dec->count,
                (unsigned long long)s->bc.id, (int)s->bc.pid, GML_LOG_ESC(dec->why));
    session_send_error(s, dec->seq, dec->code, "%s", dec->message);
    break;
  }
  case BROKER_DECLINE: session_send_error(s, dec->seq, dec->code, "%s", dec->message); break;
  case BROKER_NONE:
  case BROKER_WAIT: break;
  }
}

void grant_lease(session *s, uint64_t seq, uint32_t count, int optional, int streamed) {
  gmld *d = s->d;
  broker_decision dec;
  if (streamed) broker_lease_streamed(&d->br, &s->bc, seq, count, gmli_now_ns(), &dec);
  else broker_lease(&d->br, &s->bc, seq, count, optional, gmli_now_ns(), &dec);
  carry_out(s, &dec);
  daemon_refill(d);
  if (s->bc.lease.pending) sessions_tick(d); /* may ask others to reclaim */
}

void grant_review(session *s, uint64_t now_ns) {
  broker_decision dec;
  broker_review(&s->d->br, &s->bc, now_ns, &dec);
  carry_out(s, &dec);
}

void sessions_serve_pending(gmld *d) {
  broker_decision dec;
  for (broker_client *c = d->br.clients; c && d->lk.nfree; c = c->next)
    if (broker_serve_free(&d->br, c, &dec)) carry_out(session_of(c), &dec);
}

/* Each session's timeouts (the transport's) and its waiting lease's review, in one walk of the list. */
void sessions_tick(gmld *d) {
  uint64_t now = gmli_now_ns();
  for (broker_client *c = d->br.clients; c; c = c->next) {
    session *s = session_of(c);
    session_timeouts(s, now);
    if (!c->closing) grant_review(s, now);
  }
}
