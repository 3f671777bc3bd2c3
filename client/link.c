/* link.c: the daemon connection (daemon mode): every request and its reply
 * go through gmli_link_call or its steps (send, next, end). Before the threads
 * start (gml_open's hello) the caller reads the reply itself; after, two
 * threads of the library serve it, so that the daemon is answered at once even when the
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
 *   keeper  (keeper.c) serves the daemon's requests, reports usage, and
 *           reconnects when the connection is gone.
 *
 * One socket, not a second one for the daemon's requests: the session, its
 * chunks and its quota stay one identity, and messages keep their order (a
 * return is seen before the next lease). A reclaim returns its chunks in
 * messages of up to GML_MAX_LEASE_CHUNKS (reclaim.c), one round trip each. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "link.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include "wire.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REPLY_TIMEOUT_MS                                                                                               \
  30000 /* a reply (or a streamed lease's next one) not come by then: the daemon is taken for gone */

typedef struct link_msg { /* a reply the reader received, with its fds (or the chunks it imported from them) */
  struct link_msg *next;
  Gmlake__Envelope *env;
  size_t nchunks; /* imported by the reader: phys[i] of chunk ids[i] */
  gml_phys phys[GML_MAX_LEASE_CHUNKS];
  uint64_t ids[GML_MAX_LEASE_CHUNKS];
  int nfds;
  int fds[];
} link_msg;

static void free_msg(Gmlake__Envelope *env, const int *fds, int nfds) {
  if (env) gmlake__envelope__free_unpacked(env, NULL);
  for (int i = 0; i < nfds; i++) close(fds[i]);
}

/* A lease reply's chunks imported on the reader's thread, while the caller
 * maps the last batch (the fds are taken, whatever the result). */
static void import_msg(gml_client *c, link_msg *m) {
  uint64_t t0 = gmli_now_ns();
  for (int i = 0; i < m->nfds; i++) {
    int rc = c->be->ops->chunk_import(c->be, m->fds[i], &m->phys[m->nchunks]);
    if (rc)
      GML_ERR("importing chunk %llu failed: %s", (unsigned long long)m->env->lease_reply->chunk_ids[i],
              gml_strerror(rc));
    else m->ids[m->nchunks++] = m->env->lease_reply->chunk_ids[i];
  }
  m->nfds = 0;
  __atomic_fetch_add(&c->alloc.import_ns, gmli_now_ns() - t0, __ATOMIC_RELAXED);
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
    int rc = gmli_wire_recv(c->sock, &in, fds, &nfds, GML_MAX_LEASE_CHUNKS);
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
        if (gmli_reclaim_moot(c, in->reclaim)) l->moot++; /* answered, nothing given: its lease is over */
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
      GML_WARN("reply %llu (kind %d) from the daemon that nobody waits for", (unsigned long long)in->seq,
               (int)in->msg_case);
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
  GML_ERR("the daemon %s within %.1f s (stopped? wedged?): dropping the connection, reconnecting", what,
          (double)wait / 1e9);
  shutdown(c->sock, SHUT_RDWR);
}

int gmli_link_next_chunks(gml_client *c, Gmlake__Envelope **reply, int *fds, int *nfds, gml_phys *phys, uint64_t *ids,
                          size_t *nchunks) {
  gml_link *l = c->link;
  pthread_mutex_lock(&l->mu);
  /* Bounded: a daemon that is stopped (SIGSTOP, a debugger, a frozen container) or wedged
   * answers nothing. Before, the caller waited for ever, holding the allocator's lock and
   * conn_lock, so every other thread's allocation, free and gml_close hung with it. */
  uint64_t wait = daemon_wait_ns(c);
  uint64_t until = gmli_now_ns() + wait;
  int timed_out = 0;
  while (!l->head && !l->gone && !l->lost && !timed_out) {
    uint64_t now = gmli_now_ns();
    timed_out = now >= until || (gmli_link_wait_ns(l, until - now) == ETIMEDOUT && !l->head && !l->gone && !l->lost);
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
void gmli_client_test_reply_timeout(gml_client *c, uint64_t ms) {
  if (c->link) c->link->reply_timeout_ns = ms * 1000000ull;
}

int gmli_link_next(gml_client *c, Gmlake__Envelope **reply, int *fds, int *nfds) {
  return gmli_link_next_chunks(c, reply, fds, nfds, NULL, NULL, NULL);
}

void gmli_link_end(gml_client *c) {
  gml_link *l = c->link;
  pthread_mutex_lock(&l->mu);
  l->wait_seq = l->import_seq = 0;
  l->lost = 0;
  drop_queue(l);
  pthread_mutex_unlock(&l->mu);
}

int gmli_link_send(gml_client *c, Gmlake__Envelope *env, int want_reply, int import) {
  gml_link *l = c->link;
  if (__atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE)) return GML_EDAEMON;
  env->seq = ++c->seq;
  uint8_t *frame;
  size_t len;
  int rc = gmli_wire_encode(env, &frame, &len);
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
  rc = gmli_wire_send_until(c->sock, frame, len, NULL, 0, gmli_now_ns() + wait);
  free(frame);
  if (rc == GML_EAGAIN) drop_connection(c, "read nothing we sent", wait);
  if (rc && want_reply) gmli_link_end(c);
  return rc ? GML_EDAEMON : 0;
}

/* A call through the reader thread. */
static int reader_call(gml_client *c, Gmlake__Envelope *env, int want_reply, Gmlake__Envelope **reply, int *fds,
                       int *nfds) {
  int rc = gmli_link_send(c, env, want_reply, 0);
  if (rc || !want_reply) return rc;
  rc = gmli_link_next(c, reply, fds, nfds);
  gmli_link_end(c);
  return rc;
}
int gmli_link_wait_ns(gml_link *l, uint64_t ns) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)(ns / 1000000000ull);
  until.tv_nsec += (long)(ns % 1000000000ull);
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  return pthread_cond_timedwait(&l->cv, &l->mu, &until);
}
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
void gmli_link_free(Gmlake__Envelope *env, const int *fds, int nfds) {
  if (env) gmlake__envelope__free_unpacked(env, NULL);
  for (int i = 0; i < nfds; i++)
    if (fds[i] >= 0) close(fds[i]);
}

/* Send env; when want_reply, wait for the reply with the same seq (handling
 * unsolicited messages meanwhile). conn_lock held. */
int gmli_link_call(gml_client *c, Gmlake__Envelope *env, int want_reply, Gmlake__Envelope **reply, int *fds,
                   int *nfds) {
  if (c->link) return reader_call(c, env, want_reply, reply, fds, nfds); /* the reader thread receives */
  if (c->daemon_gone) return GML_EDAEMON;
  env->seq = ++c->seq;
  uint8_t *frame;
  size_t len;
  int rc = gmli_wire_encode(env, &frame, &len);
  if (rc) return rc;
  rc = gmli_wire_send(c->sock, frame, len, NULL, 0);
  free(frame);
  int sent = rc; /* failed: a refusal's reason may wait all the same (wire.h), read if a reply is wanted */
  if (sent && (!nfds || !gmli_wire_refusal_waits(c->sock))) goto gone;
  if (!sent && !want_reply) return 0;
  for (;;) {
    Gmlake__Envelope *in;
    rc = gmli_wire_recv(c->sock, &in, fds, nfds, GML_MAX_LEASE_CHUNKS);
    if (rc) goto gone;
    if (in->seq == 0 &&
        in->msg_case == GMLAKE__ENVELOPE__MSG_ERROR) { /* a connection refused (max-clients): why, then closed */
      snprintf(c->last_error, sizeof c->last_error, "the daemon refused this connection: %s", in->error->message);
      gmli_link_free(in, fds, *nfds);
      rc = GML_EDAEMON;
      goto gone;
    }
    if (sent) { /* the request never went: whatever else came, the connection is gone */
      gmli_link_free(in, fds, *nfds), rc = sent;
      goto gone;
    }
    if (in->seq == 0) {
      handle_unsolicited(c, in);
      gmli_link_free(in, fds, *nfds);
      continue;
    }
    if (in->seq != env->seq) {
      gmli_link_free(in, fds, *nfds);
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
void gmli_daemon_clock(gml_client *c, uint64_t daemon_mono_ns) {
  c->clock_skew = (int64_t)(gmli_now_ns() - daemon_mono_ns); /* the reply's transit: microseconds, on one host */
  c->clock_known = daemon_mono_ns != 0;
}

int gmli_reclaim_moot(gml_client *c, const Gmlake__ReclaimRequest *r) {
  if (!c->clock_known || !r->sent_ns || !r->valid_ms || r->valid_ms > INT64_MAX / 1000000)
    return 0; /* valid for ever */
  int64_t age = (int64_t)(gmli_now_ns() - r->sent_ns) - c->clock_skew;
  if (age <= (int64_t)(r->valid_ms * 1000000ull)) return 0;
  GML_INFO("a reclaim request of the daemon came %.1f s after it was sent (this process was stopped?): its lease is "
           "over, the cache stays",
           (double)age / 1e9);
  return 1;
}
int gmli_client_call(gml_client *c, Gmlake__Envelope *env, Gmlake__Envelope **reply, int *fds, int *nfds) {
  if (c->mode != GML_MODE_DAEMON) return GML_EDAEMON;
  pthread_mutex_lock(&c->conn_lock);
  int rc = gmli_link_call(c, env, 1, reply, fds, nfds);
  pthread_mutex_unlock(&c->conn_lock);
  return rc;
}

int gmli_link_reader_start(gml_client *c) {
  if (pthread_create(&c->link->reader, NULL, reader_main, c)) return GML_ESYS;
  c->link->reader_on = 1;
  return 0;
}

int gmli_link_open(gml_client *c, const char *socket_path) {
  gml_link *l = calloc(1, sizeof *l);
  if (!l) return GML_ENOMEM;
  if (gmli_env_flag(GML_ENV_RECONNECT, gmli_env(GML_ENV_RECONNECT), 1))
    snprintf(l->path, sizeof l->path, "%s", socket_path ? socket_path : "");
  l->rsock = -1;
  l->reply_timeout_ns = REPLY_TIMEOUT_MS * 1000000ull;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  c->link = l;
  gmli_link_reader_start(c);
  return 0;
}

void gmli_link_close(gml_client *c) {
  gml_link *l = c->link;
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
