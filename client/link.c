/* link.c: the daemon connection once it is up (daemon mode). Two threads of
 * the library serve it, so that the daemon is answered at once even when the
 * process makes no allocator call (an idle notebook, a server between
 * requests):
 *
 *   reader  owns the receiving end of the socket. A reply goes to the one
 *           caller waiting for it (conn_lock lets one request be in flight:
 *           the caller registers its seq before sending), into a queue: a
 *           streamed lease has many replies, and the reader takes the next
 *           ones off the socket while the caller imports the chunks of the
 *           last (the daemon's sends and the imports overlap); a request of
 *           the daemon (reclaim) goes to the keeper. It never takes the
 *           allocator's lock, so it can always deliver the reply that a
 *           caller holding that lock waits for.
 *   keeper  serves the daemon's requests: a reclaim gives back the free
 *           chunks that no live block uses and whose streams are done
 *           (gml_alloc_release_ready: a fence, never a synchronize; it polls
 *           the fence for up to RECLAIM_POLL_MS), then reports usage. It
 *           takes the allocator's lock, then conn_lock (to return chunks):
 *           the order every allocator call takes them in.
 *
 * One socket, not a second one for the daemon's requests: the session, its
 * chunks and its quota stay one identity, and messages keep their order (a
 * return is seen before the next lease). A reclaim returns its chunks in
 * messages of up to GML_MAX_LEASE_CHUNKS (reclaim.c), one round trip each.
 *
 * The daemon gone (EOF or an error on the socket: a restart, a SIGKILL), the
 * reader ends and the keeper reconnects (backoff from 10 ms to 1 s) to the
 * same socket, says hello as `adopting` and hands the new daemon every chunk
 * it holds (the allocator's and the growable ranges'), an fd each (the
 * backend's chunk_export) in Adopt messages of up to GML_MAX_LEASE_CHUNKS;
 * the new daemon gives them new ids, which replace the old ones in place.
 * All or nothing: the daemon counts them as ours once our usage report
 * follows the last batch; a connection that ends before (a batch refused,
 * an export failed, the socket gone) has its chunks dropped from the new
 * lake, not parked, and the next attempt offers every chunk again, so none
 * is counted twice or lost (the messages: adopt.c). Not a restart (the hello reply names the
 * daemon instance we connected to last: the daemon closed our connection,
 * a protocol error): it parked our chunks under our pid, so nothing is
 * handed over; their ids get GML_ID_PARKED and are released locally only.
 * It holds the allocator's lock, the ranges' lock and conn_lock meanwhile (in
 * that order), so no chunk comes or goes during the hand-over. While the
 * daemon is away, allocations are served from what the process holds and a
 * lease fails at once with GML_EDAEMON; chunks given back meanwhile are
 * released here (the dead daemon's chunks: the driver frees them once the
 * last handle goes).
 *
 * Locks: link->mu guards the fields below and is the innermost lock; no
 * thread holds it across a socket call or another lock. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "discover.h"
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
#include <time.h>
#include <unistd.h>

#define RECLAIM_POLL_MS 50 /* a reclaim waits this long at most for the streams to pass a fence */
#define REPLY_TIMEOUT_MS 30000 /* a reply (or a streamed lease's next one) not come by then: the daemon is taken for gone */

struct gml_link {
  pthread_mutex_t mu;
  pthread_cond_t cv;       /* a reply came, the connection went, the keeper has work, or stop */
  pthread_t reader, keeper;
  int reader_on, keeper_on;
  int stop;                /* gml_link_stop: the keeper ends */
  int gone;                /* the reader saw the connection end */
  uint64_t adopt_refused;  /* the instance (1: unnamed) of a restarted daemon that refused our hand-over (over a quota,
                            * or past what it adopts): our next connection to it keeps our chunks, uncounted */
  uint64_t wait_seq;       /* the request whose replies a caller waits for (0: none) */
  uint64_t import_seq;     /* ... whose lease replies the reader imports itself (GMLAKE_STREAM_MAP) */
  struct link_msg *head, *tail; /* its replies, not taken yet */
  int lost;                /* one of them could not be queued (no memory): the call fails */
  uint64_t reclaim_want;   /* bytes the daemon asked back, not served yet (UINT64_MAX: all idle) */
  uint64_t reclaims_got;   /* reclaim requests received */
  uint64_t moot;           /* ... of them moot when they came (gml_reclaim_moot), not answered yet */
  char path[256];          /* the daemon's socket, to reconnect to ("": never) */
  int rsock;               /* the socket of a reconnection under way (-1: none): shut down by gml_link_stop */
  uint64_t reconnects;
  uint64_t reply_timeout_ns; /* REPLY_TIMEOUT_MS, or a test's */
  char said[320];          /* why the last reconnection's hello failed, as logged ("": it did not) */
};

typedef struct link_msg { /* a reply the reader received, with its fds (or the chunks it imported from them) */
  struct link_msg *next;
  Gmlake__Envelope *env;
  size_t nchunks;          /* imported by the reader: phys[i] of chunk ids[i] */
  gml_phys phys[GML_MAX_LEASE_CHUNKS];
  uint64_t ids[GML_MAX_LEASE_CHUNKS];
  int nfds;
  int fds[];
} link_msg;

static int wait_ns(gml_link *l, uint64_t ns);

static void free_msg(Gmlake__Envelope *env, const int *fds, int nfds) {
  if (env) gmlake__envelope__free_unpacked(env, NULL);
  for (int i = 0; i < nfds; i++) close(fds[i]);
}

/* A lease reply's chunks imported on the reader's thread, while the caller
 * maps the last batch (the fds are taken, whatever the result). */
static void import_msg(gml_client *c, link_msg *m) {
  uint64_t t0 = gml_now_ns();
  for (int i = 0; i < m->nfds; i++) {
    int rc = c->be->ops->chunk_import(c->be, m->fds[i], &m->phys[m->nchunks]);
    if (rc) GML_ERR("importing chunk %llu failed: %s", (unsigned long long)m->env->lease_reply->chunk_ids[i], gml_strerror(rc));
    else m->ids[m->nchunks++] = m->env->lease_reply->chunk_ids[i];
  }
  m->nfds = 0;
  __atomic_fetch_add(&c->alloc.import_ns, gml_now_ns() - t0, __ATOMIC_RELAXED);
}

/* The replies nobody will take (l->mu held). */
static void drop_queue(gml_link *l) {
  while (l->head) {
    link_msg *m = l->head;
    l->head = m->next;
    free_msg(m->env, m->fds, m->nfds);
    free(m); /* chunks it imported stay leased to us until we disconnect, unused (a caller that gave up) */
  }
  l->tail = NULL;
}

static void *reader_main(void *arg) {
  gml_client *c = arg;
  gml_link *l = c->link;
  for (;;) {
    Gmlake__Envelope *in = NULL;
    int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
    int rc = gml_wire_recv(c->sock, &in, fds, &nfds, GML_MAX_LEASE_CHUNKS);
    pthread_mutex_lock(&l->mu);
    if (rc) {
      if (!l->stop) GML_ERR("connection to the daemon lost: %s", gml_strerror(rc));
      l->gone = 1;
      __atomic_store_n(&c->daemon_gone, 1, __ATOMIC_RELEASE);
      pthread_cond_broadcast(&l->cv);
      pthread_mutex_unlock(&l->mu);
      return NULL;
    }
    if (in->seq == 0) {
      if (in->msg_case == GMLAKE__ENVELOPE__MSG_RECLAIM) {
        uint64_t want = in->reclaim->bytes ? in->reclaim->bytes : UINT64_MAX; /* 0 asks for everything idle */
        if (gml_reclaim_moot(c, in->reclaim)) l->moot++; /* answered, nothing given: its lease is over */
        else l->reclaim_want = want > UINT64_MAX - l->reclaim_want ? UINT64_MAX : l->reclaim_want + want;
        l->reclaims_got++;
        pthread_cond_broadcast(&l->cv);
      } else {
        GML_WARN("unexpected message %d from the daemon", (int)in->msg_case);
      }
      free_msg(in, fds, nfds);
    } else if (in->seq == l->wait_seq) {
      link_msg *m = malloc(sizeof *m + sizeof(int) * (size_t)nfds);
      if (m) {
        m->next = NULL, m->env = in, m->nchunks = 0, m->nfds = nfds;
        memcpy(m->fds, fds, sizeof(int) * (size_t)nfds);
        if (in->seq == l->import_seq && in->msg_case == GMLAKE__ENVELOPE__MSG_LEASE_REPLY &&
            in->lease_reply->n_chunk_ids == (size_t)nfds) {
          pthread_mutex_unlock(&l->mu); /* the caller goes on with the last batch meanwhile */
          import_msg(c, m);
          pthread_mutex_lock(&l->mu);
        }
        if (in->seq != l->wait_seq) { /* its caller gave up meanwhile */
          free_msg(in, m->fds, m->nfds);
          free(m);
        } else {
          if (l->tail) l->tail->next = m;
          else l->head = m;
          l->tail = m;
        }
      } else {
        l->lost = 1;
        free_msg(in, fds, nfds);
      }
      pthread_cond_broadcast(&l->cv);
    } else {
      /* nobody waits for it (its caller gave up: the connection went) */
      GML_WARN("reply %llu (kind %d) from the daemon that nobody waits for", (unsigned long long)in->seq, (int)in->msg_case);
      free_msg(in, fds, nfds);
    }
    pthread_mutex_unlock(&l->mu);
  }
}

/* How long a reply, or room in the socket for a request, is waited for: past
 * the daemon's --lease-wait, which a lease may rightly wait (HelloReply.lease_wait_ms). */
static uint64_t daemon_wait_ns(gml_client *c) {
  return c->link->reply_timeout_ns + __atomic_load_n(&c->lease_wait_ns, __ATOMIC_RELAXED);
}

/* The daemon did not answer, or read nothing of ours, for wait ns: the connection is ended as if
 * it had gone. The reader sees it end, the keeper reconnects (a daemon that runs again parks what
 * this connection held under our pid, a reply that comes meanwhile has nobody to go to), and leases
 * fail at once until then. */
static void drop_connection(gml_client *c, const char *what, uint64_t wait) {
  __atomic_store_n(&c->daemon_gone, 1, __ATOMIC_RELEASE);
  GML_ERR("the daemon %s within %.1f s (stopped? wedged?): dropping the connection, reconnecting", what, (double)wait / 1e9);
  shutdown(c->sock, SHUT_RDWR);
}

int gml_link_next_chunks(gml_client *c, Gmlake__Envelope **reply, int *fds, int *nfds, gml_phys *phys, uint64_t *ids,
                         size_t *nchunks) {
  gml_link *l = c->link;
  pthread_mutex_lock(&l->mu);
  /* Bounded: a daemon that is stopped (SIGSTOP, a debugger, a frozen container) or wedged
   * answers nothing. Before, the caller waited for ever, holding the allocator's lock and
   * conn_lock, so every other thread's allocation, free and gml_close hung with it. */
  uint64_t wait = daemon_wait_ns(c);
  uint64_t until = gml_now_ns() + wait;
  int timed_out = 0;
  while (!l->head && !l->gone && !l->lost && !timed_out) {
    uint64_t now = gml_now_ns();
    timed_out = now >= until || (wait_ns(l, until - now) == ETIMEDOUT && !l->head && !l->gone && !l->lost);
  }
  link_msg *m = l->head; /* what came before the connection went is still taken */
  int rc = m ? 0 : l->lost ? GML_ENOMEM : GML_EDAEMON;
  if (m) {
    l->head = m->next;
    if (!l->head) l->tail = NULL;
    *reply = m->env;
    memcpy(fds, m->fds, sizeof(int) * (size_t)m->nfds);
    *nfds = m->nfds;
    if (nchunks) {
      memcpy(phys, m->phys, sizeof *phys * m->nchunks);
      memcpy(ids, m->ids, sizeof *ids * m->nchunks);
      *nchunks = m->nchunks;
    }
    free(m);
  }
  pthread_mutex_unlock(&l->mu);
  if (timed_out) drop_connection(c, "did not answer", wait);
  return rc;
}

/* Tests: how long a reply is waited for. */
void gml_client_test_reply_timeout(gml_client *c, uint64_t ms) {
  if (c->link) c->link->reply_timeout_ns = ms * 1000000ull;
}

int gml_link_next(gml_client *c, Gmlake__Envelope **reply, int *fds, int *nfds) {
  return gml_link_next_chunks(c, reply, fds, nfds, NULL, NULL, NULL);
}

void gml_link_end(gml_client *c) {
  gml_link *l = c->link;
  pthread_mutex_lock(&l->mu);
  l->wait_seq = l->import_seq = 0;
  l->lost = 0;
  drop_queue(l);
  pthread_mutex_unlock(&l->mu);
}

int gml_link_send(gml_client *c, Gmlake__Envelope *env, int want_reply, int import) {
  gml_link *l = c->link;
  if (__atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE)) return GML_EDAEMON;
  env->seq = ++c->seq;
  uint8_t *frame;
  size_t len;
  int rc = gml_wire_encode(env, &frame, &len);
  if (rc) return rc;
  if (want_reply) {
    pthread_mutex_lock(&l->mu);
    l->wait_seq = env->seq; /* before the send: the reply may come before we wait */
    l->import_seq = import ? env->seq : 0;
    l->lost = 0;
    drop_queue(l);
    pthread_mutex_unlock(&l->mu);
  }
  /* bounded as the reply is: a stopped daemon reads nothing, and once the socket's buffer is full
   * (a few hundred usage reports, which want no reply) a blocking send waited for as long as it was
   * stopped, holding conn_lock */
  uint64_t wait = daemon_wait_ns(c);
  rc = gml_wire_send_until(c->sock, frame, len, NULL, 0, gml_now_ns() + wait);
  free(frame);
  if (rc == GML_EAGAIN) drop_connection(c, "read nothing we sent", wait);
  if (rc && want_reply) gml_link_end(c);
  return rc ? GML_EDAEMON : 0;
}

int gml_link_call(gml_client *c, Gmlake__Envelope *env, int want_reply, Gmlake__Envelope **reply, int *fds, int *nfds) {
  int rc = gml_link_send(c, env, want_reply, 0);
  if (rc || !want_reply) return rc;
  rc = gml_link_next(c, reply, fds, nfds);
  gml_link_end(c);
  return rc;
}

static void sleep_ms(int ms) {
  struct timespec t = {0, ms * 1000000L};
  nanosleep(&t, NULL);
}

/* The daemon asked for want bytes of idle cache (UINT64_MAX: all of it). */
static void serve_reclaim(gml_client *c, uint64_t want, uint64_t answers) {
  uint64_t t0 = gml_now_ns(), got = 0;
  size_t left = 0;
  for (; want;) { /* 0: only moot requests, answered with nothing */
    size_t max = want == UINT64_MAX ? 0 : (size_t)(want - got);
    got += gml_alloc_release_ready(&c->alloc, max, &left);
    if ((want != UINT64_MAX && got >= want) || !left) break;
    if (gml_now_ns() - t0 > RECLAIM_POLL_MS * 1000000ull || c->link->stop) break;
    sleep_ms(1); /* the rest is mapped where a stream may still use it: poll the fence again */
  }
  __atomic_store_n(&c->reclaims_served, answers, __ATOMIC_RELAXED); /* the report below answers them all */
  if (want) GML_INFO("gave %llu bytes of idle cache back to the lake in %.1f ms (asked %llu)", (unsigned long long)got,
           (double)(gml_now_ns() - t0) / 1e6, want == UINT64_MAX ? 0ull : (unsigned long long)want);
  gml_client_report(c);
}

/* ---------- the daemon restarted: reconnect and hand the chunks over ---------- */

/* A chunk kept ours, released locally only: the same daemon closed our connection and parked it
 * under our pid (GML_ID_PARKED), or a restarted one took no hand-over (and GML_ID_UNCOUNTED). */
typedef struct local_mark { uint64_t bits; size_t n; } local_mark;
static void mark_local(void *ctx, gml_phys phys, uint64_t *id) {
  (void)phys;
  if (*id) *id |= ((local_mark *)ctx)->bits, ((local_mark *)ctx)->n++;
}

static void *reader_main(void *arg);

/* One attempt: 0 when the new daemon holds every chunk of ours. */
static int reconnect(gml_client *c) {
  gml_link *l = c->link;
  if (l->reader_on) {
    pthread_join(l->reader, NULL);
    l->reader_on = 0;
  }
  /* the checks of the first connection again (discover.c): whoever owns the
   * socket now gets every chunk's fd as the hand-over. Before, a plain
   * connect: a socket another user put at the path was sent them all. */
  char path[GML_PATH_MAX], why0[sizeof l->said];
  int untrusted = 0, s = gml_daemon_connect(l->path, path, sizeof path, why0, sizeof why0, &untrusted);
  if (s < 0) {
    if (untrusted && strcmp(why0, l->said))
      GML_WARN("reconnecting to the daemon: not connecting to %s: not trusted (trying again)", why0);
    if (untrusted) memcpy(l->said, why0, sizeof why0);
    return GML_EDAEMON;
  }
  pthread_mutex_lock(&l->mu);
  if (l->stop) {
    pthread_mutex_unlock(&l->mu);
    close(s);
    return GML_ECLOSED;
  }
  l->rsock = s; /* gml_link_stop shuts it down: no wait for an answer that does not come */
  pthread_mutex_unlock(&l->mu);
  struct timeval tv = {5, 0}; /* a daemon that does not answer is not waited for forever */
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  gml_hello_said hs = {0};
  char why[sizeof l->said];
  int rc = gml_adopt_hello(c, s, &hs, why, sizeof why);
  if (rc) { /* said once a reason: the keeper tries again up to every second while it lasts */
    gml_log(strcmp(why, l->said) ? GML_LOG_WARN : GML_LOG_DEBUG, "reconnecting to the daemon at %s: %s (trying again)",
            l->path, why);
    memcpy(l->said, why, sizeof why);
    pthread_mutex_lock(&l->mu);
    l->rsock = -1;
    pthread_mutex_unlock(&l->mu);
    close(s);
    return rc;
  }
  gml_allocator *a = &c->alloc;
  gml_adopt_batch b = {.c = c, .sock = s};
  l->said[0] = 0;
  pthread_mutex_lock(&a->lock);
  pthread_mutex_lock(&c->grow.lock);
  pthread_mutex_lock(&c->conn_lock);
  /* the new connection's, set here under conn_lock: daemon_lease reads max_stream under it, a
   * test reads client_id without it (atomic); the reader that reads the clock starts after */
  int same = hs.same, no_adopt = hs.no_adopt;
  uint64_t inst = hs.instance;
  __atomic_store_n(&c->client_id, hs.client_id, __ATOMIC_RELEASE);
  __atomic_store_n(&c->max_stream, hs.max_stream, __ATOMIC_RELAXED);
  __atomic_store_n(&c->lease_wait_ns, hs.lease_wait_ns, __ATOMIC_RELAXED);
  gml_daemon_clock(c, hs.mono_ns);
  /* not a restart, or a daemon that takes no hand-over (past its window, or
   * over our quota last time): keep using them; released locally only (client.c) */
  int refused = l->adopt_refused && (inst ? inst : 1) == l->adopt_refused;
  int local = same || no_adopt || refused;
  /* shared counted apart: the message counts the allocator's and the ranges' */
  local_mark parked = {GML_ID_PARKED | (same ? 0 : GML_ID_UNCOUNTED), 0}, shared = parked;
  if (local) {
    for (size_t i = 0; i < a->chunks_used; i++)
      if (a->chunks[i].list != GML_CL_DEAD) mark_local(&parked, a->chunks[i].phys, &a->chunks[i].id);
    gml_grow_each_chunk(c, mark_local, &parked);
    if (!same) gml_share_handover(c, mark_local, &shared, 0);
  } else {
    for (size_t i = 0; i < a->chunks_used && !b.rc; i++)
      if (a->chunks[i].list != GML_CL_DEAD) gml_adopt_add(&b, a->chunks[i].phys, &a->chunks[i].id);
    gml_grow_each_chunk(c, gml_adopt_add, &b);
    gml_share_handover(c, gml_adopt_add, &b, 1); /* published ranges' chunks too: published again after */
  }
  rc = gml_adopt_flush(&b);
  if (!rc) {
    /* what no lake counts now: all we hold (a daemon that took none), nothing (one that took all), or
     * as before (the same daemon: those it never counted stay so, the rest it keeps parked) */
    if (!same) __atomic_store_n(&c->uncounted_chunks, local ? (uint64_t)(parked.n + shared.n) : 0, __ATOMIC_RELAXED);
    c->daemon_instance = inst, l->adopt_refused = 0; /* the next reconnection compares with this daemon, not the first */
    tv.tv_sec = 0;
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    close(c->sock);
    c->sock = s;
    pthread_mutex_lock(&l->mu);
    l->rsock = -1;
    l->gone = 0;
    l->reconnects++;
    l->reclaims_got = 0, l->reclaim_want = 0; /* counted per daemon: the new one's start at 0 */
    __atomic_store_n(&c->reclaims_served, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&c->daemon_gone, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&l->mu);
    if (pthread_create(&l->reader, NULL, reader_main, c) == 0) l->reader_on = 1;
    else rc = GML_ESYS;
  } else {
    pthread_mutex_lock(&l->mu);
    l->rsock = -1;
    pthread_mutex_unlock(&l->mu);
    /* The hand-over failed halfway: the daemon drops what this connection
     * took (it was not complete: daemon/adopt.c), we keep holding and mapping
     * every chunk, and the next attempt offers them all again (their ids are
     * only names for the daemon: it gives new ones); over our quota, the next
     * attempt offers none and keeps them ours, uncounted. */
    if (rc == GML_EQUOTA || rc == GML_ENOMEM) l->adopt_refused = inst ? inst : 1;
    close(s);
  }
  pthread_mutex_unlock(&c->conn_lock);
  pthread_mutex_unlock(&c->grow.lock);
  pthread_mutex_unlock(&a->lock);
  if (rc) return rc;
  if (same)
    GML_WARN("reconnected to the daemon at %s (it closed our connection, it did not restart): of the %zu chunk(s) we "
             "hold, it keeps those it counted parked under our pid until we exit; none handed over again", l->path, parked.n);
  else if (local)
    GML_WARN("reconnected to the daemon at %s, which takes no hand-over from us (%s): the %zu chunk(s) we hold stay "
             "ours until we exit, not counted by the lake", l->path,
             no_adopt ? "it restarted longer ago than its adopt-window" : "over our quota or what it adopts", parked.n);
  else
    GML_WARN("reconnected to the daemon at %s: it adopted the %zu chunk(s) we hold", l->path, b.total);
  gml_client_report(c);
  if (!local && __atomic_load_n(&c->grow.lost_shares, __ATOMIC_RELAXED)) gml_share_restore(c);
  return 0;
}

/* Wait on l->cv (l->mu held) for at most ns: pthread_cond_timedwait's result. */
static int wait_ns(gml_link *l, uint64_t ns) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)(ns / 1000000000ull);
  until.tv_nsec += (long)(ns % 1000000000ull);
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  return pthread_cond_timedwait(&l->cv, &l->mu, &until);
}

static void *keeper_main(void *arg) {
  gml_client *c = arg;
  gml_link *l = c->link;
  uint64_t backoff_ms = 10;
  pthread_mutex_lock(&l->mu);
  while (!l->stop) {
    if (l->reclaim_want || l->moot) {
      uint64_t want = l->reclaim_want, answers = l->reclaims_got;
      l->reclaim_want = l->moot = 0;
      pthread_mutex_unlock(&l->mu);
      serve_reclaim(c, want, answers);
      pthread_mutex_lock(&l->mu);
      continue;
    }
    if (l->gone && l->path[0]) {
      pthread_mutex_unlock(&l->mu);
      int rc = reconnect(c);
      pthread_mutex_lock(&l->mu);
      if (!rc) {
        backoff_ms = 10;
        continue;
      }
      wait_ns(l, backoff_ms * 1000000ull);
      backoff_ms = backoff_ms * 2 > 1000 ? 1000 : backoff_ms * 2;
      continue;
    }
    /* connected and nothing asked: keep the daemon's picture of us current
     * (an idle process's last operations are reported within ~0.1 s, not at
     * its 256th next one) */
    if (wait_ns(l, REPORT_INTERVAL_NS) == ETIMEDOUT && !l->stop && !l->gone && !l->reclaim_want) {
      pthread_mutex_unlock(&l->mu);
      gml_client_report_changed(c);
      /* attached ranges wait for their publishers to publish again after a restart */
      if (__atomic_load_n(&c->grow.lost_shares, __ATOMIC_RELAXED) && gml_now_ns() - c->grow.restore_ns > 1000000000ull)
        gml_share_restore(c);
      pthread_mutex_lock(&l->mu);
    }
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

int gml_link_start(gml_client *c, const char *socket_path) {
  gml_link *l = calloc(1, sizeof *l);
  if (!l) return GML_ENOMEM;
  if (gml_env_flag(GML_ENV_RECONNECT, gml_env(GML_ENV_RECONNECT), 1)) snprintf(l->path, sizeof l->path, "%s", socket_path ? socket_path : "");
  l->rsock = -1;
  l->reply_timeout_ns = REPLY_TIMEOUT_MS * 1000000ull;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  c->link = l;
  if (pthread_create(&l->reader, NULL, reader_main, c) == 0) l->reader_on = 1;
  if (l->reader_on && pthread_create(&l->keeper, NULL, keeper_main, c) == 0) l->keeper_on = 1;
  if (!l->keeper_on) {
    GML_ERR("cannot start the library's daemon threads: %s", strerror(errno));
    gml_link_stop(c);
    return GML_ESYS;
  }
  return 0;
}

void gml_link_quiesce(gml_client *c) {
  gml_link *l = c->link;
  if (!l || !l->keeper_on) return;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  if (l->rsock >= 0) shutdown(l->rsock, SHUT_RDWR); /* a reconnection under way ends now */
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  pthread_join(l->keeper, NULL);
  l->keeper_on = 0;
}

void gml_link_stop(gml_client *c) {
  gml_link *l = c->link;
  if (!l) return;
  gml_link_quiesce(c);
  if (l->reader_on) {
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_mutex_unlock(&l->mu);
    shutdown(c->sock, SHUT_RDWR); /* the reader's recv ends */
    pthread_join(l->reader, NULL);
  }
  drop_queue(l);
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  free(l);
  c->link = NULL;
}

/* Tests: no streamed leases on this connection (daemon_acquire_stream, client.c). */
void gml_client_test_nostream(gml_client *c) {
  pthread_mutex_lock(&c->conn_lock); /* max_stream is conn_lock's (daemon_acquire_stream peeks without it) */
  __atomic_store_n(&c->max_stream, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&c->conn_lock);
}
