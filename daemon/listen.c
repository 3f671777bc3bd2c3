/* listen.c: the client socket and accepting connections, within bounds: at
 * most max_clients connections in all, as many as the fd budget allows
 * (fdbudget.c), and max_clients_per_uid per user (the one over a bound gets
 * an error frame and is closed), and accept() out of fds
 * pauses accepting for accept_backoff_ms instead of spinning, with one log
 * line a second at most. The sessions themselves are session.c (their
 * transport) and dispatch.c (what they say). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "conn.h"
#include "daemon.h"
#include "gmlake.h"
#include "listen.h"
#include "log.h"
#include "session.h"
#include "util.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* At most one warning a second; the ones held back are counted in the next. */
static void warn_limited(gmld *d, const char *what, const char *detail) {
  uint64_t now = gmli_now_ns();
  if (now - d->accept_log_ns < 1000000000ull && d->accept_log_ns) {
    d->accept_log_held++;
    return;
  }
  GML_WARN("%s: %s (%llu more like it in the last second)", what, detail, (unsigned long long)d->accept_log_held);
  d->accept_log_ns = now;
  d->accept_log_held = 0;
}

static void on_accept(uv_poll_t *h, int status, int events);

static void on_accept_resume(uv_timer_t *t) {
  gmld *d = t->data;
  if (d->listen_fd >= 0) uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
}

/* A connection over a limit: say why in one error frame, then close it. */
static void refuse_connection(gmld *d, int fd, const char *why) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__Error e = GMLAKE__ERROR__INIT;
  e.code = GML_EDAEMON;
  e.message = (char *)why;
  env.msg_case = GMLAKE__ENVELOPE__MSG_ERROR;
  env.error = &e;
  uint8_t *f;
  size_t len;
  if (gmli_wire_encode(&env, &f, &len) == 0) {
    gmli_wire_sendmsg(fd, f, len, NULL, 0);
    free(f);
  }
  close(fd);
  d->counters.connections_refused++;
  warn_limited(d, "connection refused", why);
}

/* The connections' share of the fd table is taken (fdbudget.c): the rest is the lake's and the daemon's own. */
static void refuse_over_fd_budget(gmld *d, int fd) {
  char why[160];
  snprintf(why, sizeof why, "too many connections for the daemon's fd limit (RLIMIT_NOFILE %zu allows %zu)",
           d->fdb.limit, d->fdb.conns_max);
  refuse_connection(d, fd, why);
}

static void on_accept(uv_poll_t *h, int status, int events) {
  (void)events;
  gmld *d = h->data;
  if (status < 0) return;
  for (;;) {
    int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* the connection waits in the backlog; polling again now would spin */
        uv_poll_stop(&d->listen_poll);
        uv_timer_start(&d->accept_pause, on_accept_resume, (uint64_t)d->cfg.accept_backoff_ms, 0);
        warn_limited(d, "accept paused", strerror(errno));
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        warn_limited(d, "accept", strerror(errno));
      }
      return;
    }
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
      close(fd);
      continue;
    }
    long same_uid = 0;
    for (const broker_client *c = d->br.clients; c; c = c->next) same_uid += c->uid == cred.uid;
    if (d->br.nclients >= (size_t)d->cfg.max_clients) refuse_connection(d, fd, "too many connections (max-clients)");
    else if (d->fdb.limit && d->br.nclients >= d->fdb.conns_max) refuse_over_fd_budget(d, fd);
    else if (same_uid >= d->cfg.max_clients_per_uid)
      refuse_connection(d, fd, "too many connections of this user (max-clients-per-uid)");
    else if (session_open(d, fd, &cred)) close(fd);
  }
}

int listen_start(gmld *d) {
  int fd = conn_listen_unix(d->cfg.socket_path, d->cfg.socket_mode, d->cfg.socket_group);
  if (fd < 0) return fd;
  d->listen_fd = fd;
  uv_poll_init(d->loop, &d->listen_poll, fd);
  d->listen_poll.data = d;
  uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
  uv_timer_init(d->loop, &d->accept_pause);
  d->accept_pause.data = d;
  return 0;
}

void sessions_stop_listening(gmld *d) {
  if (d->listen_fd < 0) return;
  uv_poll_stop(&d->listen_poll);
  uv_close((uv_handle_t *)&d->listen_poll, NULL);
  uv_timer_stop(&d->accept_pause);
  uv_close((uv_handle_t *)&d->accept_pause, NULL);
  close(d->listen_fd);
  d->listen_fd = -1;
  unlink(d->cfg.socket_path);
}
