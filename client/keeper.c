/* keeper.c: the daemon connection's keeper thread (link.c has the reader):
 *
 *   keeper  serves the daemon's requests: a reclaim gives back the free
 *           chunks that no live block uses and whose streams are done
 *           (gmli_alloc_release_ready: a fence, never a synchronize; it polls
 *           the fence for up to RECLAIM_POLL_MS), then reports usage. It
 *           takes the allocator's lock, then conn_lock (to return chunks):
 *           the order every allocator call takes them in. Every
 *           REPORT_INTERVAL_NS it reports usage where it changed and gives
 *           the chunk holders their tick (shares a restarted daemon does not
 *           know yet are restored then).
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
 * It holds every chunk holder's lock (in the order they registered: the
 * allocator's, the ranges') and conn_lock meanwhile, so no chunk comes or
 * goes during the hand-over; the holders' chunks come through their hooks
 * (gml_holder_ops, client_priv.h), no holder is called by name. While the
 * daemon is away, allocations are served from what the process holds and a
 * lease fails at once with GML_EDAEMON; chunks given back meanwhile are
 * released here (the dead daemon's chunks: the driver frees them once the
 * last handle goes). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "discover.h"
#include "link.h"
#include "log.h"
#include "util.h"
#include "wire.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RECLAIM_POLL_MS 50 /* a reclaim waits this long at most for the streams to pass a fence */

static void sleep_ms(int ms) {
  struct timespec t = {0, ms * 1000000L};
  nanosleep(&t, NULL);
}

/* The daemon asked for want bytes of idle cache (UINT64_MAX: all of it). */
static void serve_reclaim(gml_client *c, uint64_t want, uint64_t answers) {
  uint64_t t0 = gmli_now_ns(), got = 0;
  size_t left = 0;
  for (; want;) { /* 0: only moot requests, answered with nothing */
    size_t max = want == UINT64_MAX ? 0 : (size_t)(want - got);
    got += gmli_alloc_release_ready(&c->alloc, max, &left);
    if ((want != UINT64_MAX && got >= want) || !left) break;
    if (gmli_now_ns() - t0 > RECLAIM_POLL_MS * 1000000ull || c->link->stop) break;
    sleep_ms(1); /* the rest is mapped where a stream may still use it: poll the fence again */
  }
  __atomic_store_n(&c->reclaims_served, answers, __ATOMIC_RELAXED); /* the report below answers them all */
  if (want)
    GML_INFO("gave %llu bytes of idle cache back to the lake in %.1f ms (asked %llu)", (unsigned long long)got,
             (double)(gmli_now_ns() - t0) / 1e6, want == UINT64_MAX ? 0ull : (unsigned long long)want);
  gmli_client_report(c);
}

/* ---------- the daemon restarted: reconnect and hand the chunks over ---------- */

/* A chunk kept ours, released locally only: the same daemon closed our connection and parked it
 * under our pid (GML_ID_PARKED), or a restarted one took no hand-over (and GML_ID_UNCOUNTED). */
typedef struct local_mark {
  uint64_t bits;
  size_t n;
} local_mark;
static void mark_local(void *ctx, gml_phys phys, uint64_t *id) {
  (void)phys;
  if (*id) *id |= ((local_mark *)ctx)->bits, ((local_mark *)ctx)->n++;
}

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
  int untrusted = 0, s = gmli_daemon_connect(l->path, path, sizeof path, why0, sizeof why0, &untrusted);
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
  l->rsock = s; /* gmli_link_stop shuts it down: no wait for an answer that does not come */
  pthread_mutex_unlock(&l->mu);
  struct timeval tv = {5, 0}; /* a daemon that does not answer is not waited for forever */
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  gml_hello_said hs = {0};
  char why[sizeof l->said];
  int rc = gmli_adopt_hello(c, s, &hs, why, sizeof why);
  if (rc) { /* said once a reason: the keeper tries again up to every second while it lasts */
    gmli_log(strcmp(why, l->said) ? GML_LOG_WARN : GML_LOG_DEBUG, "reconnecting to the daemon at %s: %s (trying again)",
             l->path, why);
    memcpy(l->said, why, sizeof why);
    pthread_mutex_lock(&l->mu);
    l->rsock = -1;
    pthread_mutex_unlock(&l->mu);
    close(s);
    return rc;
  }
  gml_adopt_batch b = {.c = c, .sock = s};
  l->said[0] = 0;
  for (int i = 0; i < c->nholders; i++)
    if (c->holders[i]->lock) c->holders[i]->lock(c);
  pthread_mutex_lock(&c->conn_lock);
  /* the new connection's, set here under conn_lock: daemon_lease reads max_stream under it, a
   * test reads client_id without it (atomic); the reader that reads the clock starts after */
  int same = hs.same, no_adopt = hs.no_adopt;
  uint64_t inst = hs.instance;
  __atomic_store_n(&c->client_id, hs.client_id, __ATOMIC_RELEASE);
  __atomic_store_n(&c->max_stream, hs.max_stream, __ATOMIC_RELAXED);
  __atomic_store_n(&c->lease_wait_ns, hs.lease_wait_ns, __ATOMIC_RELAXED);
  __atomic_store_n(&c->daemon_mem_info, hs.mem_info, __ATOMIC_RELAXED);
  gmli_daemon_clock(c, hs.mono_ns);
  /* not a restart, or a daemon that takes no hand-over (past its window, or
   * over our quota last time): keep using them; released locally only (lease.c) */
  int refused = l->adopt_refused && (inst ? inst : 1) == l->adopt_refused;
  int local = same || no_adopt || refused;
  int how = same ? GML_HANDOVER_PARKED : local ? GML_HANDOVER_UNCOUNTED : GML_HANDOVER_ADOPT;
  local_mark parked = {GML_ID_PARKED | (same ? 0 : GML_ID_UNCOUNTED), 0};
  for (int i = 0; i < c->nholders; i++) /* in the order they registered: the allocator's chunks first */
    if (c->holders[i]->handover)
      c->holders[i]->handover(c, local ? mark_local : gmli_adopt_add, local ? (void *)&parked : (void *)&b, how);
  rc = gmli_adopt_flush(&b);
  if (!rc) {
    /* what no lake counts now: all we hold (a daemon that took none), nothing (one that took all), or
     * as before (the same daemon: those it never counted stay so, the rest it keeps parked) */
    if (!same) __atomic_store_n(&c->uncounted_chunks, local ? (uint64_t)parked.n : 0, __ATOMIC_RELAXED);
    c->daemon_instance = inst,
    l->adopt_refused = 0; /* the next reconnection compares with this daemon, not the first */
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
    rc = gmli_link_reader_start(c);
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
  for (int i = c->nholders - 1; i >= 0; i--)
    if (c->holders[i]->unlock) c->holders[i]->unlock(c);
  if (rc) return rc;
  if (same)
    GML_WARN("reconnected to the daemon at %s (it closed our connection, it did not restart): of the %zu chunk(s) we "
             "hold, it keeps those it counted parked under our pid until we exit; none handed over again",
             l->path, parked.n);
  else if (local)
    GML_WARN("reconnected to the daemon at %s, which takes no hand-over from us (%s): the %zu chunk(s) we hold stay "
             "ours until we exit, not counted by the lake",
             l->path, no_adopt ? "it restarted longer ago than its adopt-window" : "over our quota or what it adopts",
             parked.n);
  else GML_WARN("reconnected to the daemon at %s: it adopted the %zu chunk(s) we hold", l->path, b.total);
  gmli_client_report(c);
  for (int i = 0; i < c->nholders; i++)
    if (c->holders[i]->reconnected) c->holders[i]->reconnected(c, how);
  return 0;
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
      gmli_link_wait_ns(l, backoff_ms * 1000000ull);
      backoff_ms = backoff_ms * 2 > 1000 ? 1000 : backoff_ms * 2;
      continue;
    }
    /* connected and nothing asked: keep the daemon's picture of us current
     * (an idle process's last operations are reported within ~0.1 s, not at
     * its 256th next one) */
    if (gmli_link_wait_ns(l, REPORT_INTERVAL_NS) == ETIMEDOUT && !l->stop && !l->gone && !l->reclaim_want) {
      pthread_mutex_unlock(&l->mu);
      gmli_client_report_changed(c);
      for (int i = 0; i < c->nholders; i++)
        if (c->holders[i]->tick) c->holders[i]->tick(c);
      pthread_mutex_lock(&l->mu);
    }
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

int gmli_link_start(gml_client *c, const char *socket_path) {
  int rc = gmli_link_open(c, socket_path);
  if (rc) return rc;
  gml_link *l = c->link;
  if (l->reader_on && pthread_create(&l->keeper, NULL, keeper_main, c) == 0) l->keeper_on = 1;
  if (!l->keeper_on) {
    GML_ERR("cannot start the library's daemon threads: %s", strerror(errno));
    gmli_link_stop(c);
    return GML_ESYS;
  }
  return 0;
}

void gmli_link_quiesce(gml_client *c) {
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

void gmli_link_stop(gml_client *c) {
  if (!c->link) return;
  gmli_link_quiesce(c);
  gmli_link_close(c);
}

/* Tests: no streamed leases on this connection (daemon_acquire_stream, lease.c). */
void gmli_client_test_nostream(gml_client *c) {
  pthread_mutex_lock(&c->conn_lock); /* max_stream is conn_lock's (daemon_acquire_stream peeks without it) */
  __atomic_store_n(&c->max_stream, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&c->conn_lock);
}
