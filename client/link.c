/* link.c: the daemon connection once it is up (daemon mode). Two threads of
 * the library serve it, so that the daemon is answered at once even when the
 * process makes no allocator call (an idle notebook, a server between
 * requests):
 *
 *   reader  owns the receiving end of the socket. A reply goes to the one
 *           caller waiting for it (conn_lock lets one request be in flight:
 *           the caller registers its seq before sending); a request of the
 *           daemon (reclaim) goes to the keeper. It never takes the
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
 * Locks: link->mu guards the fields below and is the innermost lock; no
 * thread holds it across a socket call or another lock. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "log.h"
#include "util.h"
#include "wire.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RECLAIM_POLL_MS 50 /* a reclaim waits this long at most for the streams to pass a fence */

struct gml_link {
  pthread_mutex_t mu;
  pthread_cond_t cv;       /* a reply came, the connection went, the keeper has work, or stop */
  pthread_t reader, keeper;
  int reader_on, keeper_on;
  int stop;                /* gml_link_stop: the keeper ends */
  int gone;                /* the reader saw the connection end */
  uint64_t wait_seq;       /* the request whose reply a caller waits for (0: none) */
  int have_reply;
  Gmlake__Envelope *reply;
  int fds[GML_MAX_LEASE_CHUNKS], nfds;
  uint64_t reclaim_want;   /* bytes the daemon asked back, not served yet (UINT64_MAX: all idle) */
};

static void free_msg(Gmlake__Envelope *env, const int *fds, int nfds) {
  if (env) gmlake__envelope__free_unpacked(env, NULL);
  for (int i = 0; i < nfds; i++) close(fds[i]);
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
        l->reclaim_want = want > UINT64_MAX - l->reclaim_want ? UINT64_MAX : l->reclaim_want + want;
        pthread_cond_broadcast(&l->cv);
      } else {
        GML_WARN("unexpected message %d from the daemon", (int)in->msg_case);
      }
      free_msg(in, fds, nfds);
    } else if (in->seq == l->wait_seq && !l->have_reply) {
      l->reply = in;
      memcpy(l->fds, fds, sizeof(int) * (size_t)nfds);
      l->nfds = nfds;
      l->have_reply = 1;
      pthread_cond_broadcast(&l->cv);
    } else {
      /* nobody waits for it (its caller gave up: the connection went) */
      GML_WARN("reply %llu (kind %d) from the daemon that nobody waits for", (unsigned long long)in->seq, (int)in->msg_case);
      free_msg(in, fds, nfds);
    }
    pthread_mutex_unlock(&l->mu);
  }
}

int gml_link_call(gml_client *c, Gmlake__Envelope *env, int want_reply, Gmlake__Envelope **reply, int *fds, int *nfds) {
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
    l->have_reply = 0;
    pthread_mutex_unlock(&l->mu);
  }
  rc = gml_wire_send(c->sock, frame, len, NULL, 0);
  free(frame);
  if (!want_reply) return rc ? GML_EDAEMON : 0;
  pthread_mutex_lock(&l->mu);
  while (!rc && !l->have_reply && !l->gone) pthread_cond_wait(&l->cv, &l->mu);
  if (!rc && l->have_reply) {
    *reply = l->reply;
    memcpy(fds, l->fds, sizeof(int) * (size_t)l->nfds);
    *nfds = l->nfds;
  } else {
    rc = GML_EDAEMON;
  }
  l->wait_seq = 0;
  l->have_reply = 0;
  l->reply = NULL;
  pthread_mutex_unlock(&l->mu);
  return rc;
}

static void sleep_ms(int ms) {
  struct timespec t = {0, ms * 1000000L};
  nanosleep(&t, NULL);
}

/* The daemon asked for want bytes of idle cache (UINT64_MAX: all of it). */
static void serve_reclaim(gml_client *c, uint64_t want) {
  uint64_t t0 = gml_now_ns(), got = 0;
  size_t left = 0;
  for (;;) {
    size_t max = want == UINT64_MAX ? 0 : (size_t)(want - got);
    got += gml_alloc_release_ready(&c->alloc, max, &left);
    if ((want != UINT64_MAX && got >= want) || !left) break;
    if (gml_now_ns() - t0 > RECLAIM_POLL_MS * 1000000ull || c->link->stop) break;
    sleep_ms(1); /* the rest is mapped where a stream may still use it: poll the fence again */
  }
  __atomic_fetch_add(&c->reclaims_served, 1, __ATOMIC_RELAXED);
  GML_INFO("gave %llu bytes of idle cache back to the lake in %.1f ms (asked %llu)", (unsigned long long)got,
           (double)(gml_now_ns() - t0) / 1e6, want == UINT64_MAX ? 0ull : (unsigned long long)want);
  gml_client_report(c);
}

static void *keeper_main(void *arg) {
  gml_client *c = arg;
  gml_link *l = c->link;
  pthread_mutex_lock(&l->mu);
  while (!l->stop) {
    if (l->reclaim_want) {
      uint64_t want = l->reclaim_want;
      l->reclaim_want = 0;
      pthread_mutex_unlock(&l->mu);
      serve_reclaim(c, want);
      pthread_mutex_lock(&l->mu);
      continue;
    }
    pthread_cond_wait(&l->cv, &l->mu);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

int gml_link_start(gml_client *c) {
  gml_link *l = calloc(1, sizeof *l);
  if (!l) return GML_ENOMEM;
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
  if (l->have_reply) free_msg(l->reply, l->fds, l->nfds);
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  free(l);
  c->link = NULL;
}
