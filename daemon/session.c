/* session.c: the transport of client sessions on the daemon's Unix socket
 * (session.h). Identity comes from SO_PEERCRED; frames are read within a
 * budget a turn, and one over the size bound, fds a client may not send or
 * a connection that ends within a frame close that client only; replies
 * wait in a bounded send queue. The transport owns a session's life, from
 * session_open to its close, and hands what happens to the protocol
 * (dispatch.c) through the hooks installed at start: each frame
 * (on_frame), room to send (on_writable), the end (on_closing, on_closed). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "session.h"
#include "conn.h"
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <errno.h>
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
 * the client to read (on_writable), never refused for being read slowly. */
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

int session_send_msg(session *s, Gmlake__Envelope *env, const int *fds, int nfds) {
  return session_send(s, env, fds, nfds);
}

void session_fd_refusal(const session *s, int nfds, char *why, size_t len) {
  fdbudget_refusal(s->d, s->txq.nfds, nfds, why, len);
}

void session_timeouts(session *s, uint64_t now) {
  gmld *d = s->d;
  if (!s->hello_done && now - s->connect_ns > (uint64_t)d->cfg.hello_timeout_ms * 1000000ull)
    session_doom(s, "no hello within hello-timeout-ms");
  if (s->partial_since_ns && now - s->partial_since_ns > (uint64_t)d->cfg.frame_timeout_ms * 1000000ull)
    session_doom(s, "a partial frame not completed within frame-timeout-ms");
}

/* ---------- reading ---------- */

/* One frame to the protocol. Returns 0 to go on, -1 when the session was closed. */
static int handle_frame(session *s, const uint8_t *body, size_t len) {
  gmld *d = s->d;
  char why[SESSION_WHY_MAX];
  if (d->session_ops->on_frame(s, body, len, why)) {
    d->counters.protocol_errors++;
    CONN_WARN(s->bc.uid, "protocol error from client %llu (pid %d): %s: closing it", (unsigned long long)s->bc.id,
              (int)s->bc.pid, why);
    session_close(s, why);
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
  while ((k = gmli_rx_next(&s->rx, &body, &len)) == 1) {
    if (s->bc.closing) return -1; /* doomed by its own request: nothing more from it */
    if (*budget <= 0) return 1;
    if (handle_frame(s, body, len)) return -1;
    gmli_rx_consume(&s->rx, len);
    (*budget)--;
  }
  if (k < 0) {
    s->d->counters.protocol_errors++;
    CONN_WARN(s->bc.uid, "client %llu (pid %d) sent a frame over %d bytes: closing it", (unsigned long long)s->bc.id,
              (int)s->bc.pid, GML_MAX_FRAME);
    session_close(s, "oversize frame");
    return -1;
  }
  /* what is left is part of a frame: it must be whole within frame_timeout_ms */
  if (s->rx.len == s->rx.off) s->partial_since_ns = 0;
  else if (!s->partial_since_ns) s->partial_since_ns = gmli_now_ns();
  return 0;
}

/* Read and handle what s sent, within its budget for this turn of the loop
 * (read_budget frames), so that a client that floods cannot starve the
 * others: the rest waits (s->backlog) for the next turn. */
static void session_read(session *s) {
  int budget = s->d->cfg.read_budget;
  int more = take_frames(s, &budget);
  while (more == 0 && budget > 0 && !s->bc.closing) {
    long r = gmli_rx_fill(&s->rx, s->fd);
    if (s->rx.fds_received) {
      s->d->counters.protocol_errors++;
      CONN_WARN(s->bc.uid, "client %llu (pid %d) sent file descriptors: closing it", (unsigned long long)s->bc.id,
                (int)s->bc.pid);
      session_close(s, "unexpected fds");
      return;
    }
    if (r == GML_EAGAIN) break;
    if (r == 0 && s->rx.len > s->rx.off) {
      s->d->counters.protocol_errors++;
      CONN_WARN(s->bc.uid, "client %llu (pid %d) left in the middle of a frame", (unsigned long long)s->bc.id,
                (int)s->bc.pid);
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
  if (events & UV_WRITABLE) tx_flush(s), s->d->session_ops->on_writable(s);
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

/* ---------- closing ---------- */

static void session_free_cb(uv_handle_t *h) {
  session *s = h->data;
  gmli_rx_free(&s->rx);
  free(s);
}

/* Closed now (a protocol error, or doomed at the last turn): the protocol
 * ends the session first (on_closing: chunks back or parked), then it
 * leaves the client list and its socket is closed, then the protocol hears
 * that it left (on_closed: what it held may serve others). */
static void session_close(session *s, const char *why) {
  gmld *d = s->d;
  if (s->fd < 0) return;
  s->bc.closing = 1;
  d->session_ops->on_closing(s, why);
  if (s->pidfd >= 0) close(s->pidfd);
  broker_remove_client(&d->br, &s->bc);
  uv_poll_stop(&s->poll);
  conn_txq_free(&s->txq); /* closes the fd references its queue held */
  close(s->fd);
  s->fd = -1;
  uv_close((uv_handle_t *)&s->poll, session_free_cb);
  d->session_ops->on_closed(d);
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
  s->connect_ns = gmli_now_ns();
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

void sessions_start(gmld *d, const session_ops *ops) {
  d->session_ops = ops;
  uv_idle_init(d->loop, &d->kick);
  d->kick.data = d;
}

session *session_by_pid(gmld *d, pid_t pid) {
  for (broker_client *c = d->br.clients; c; c = c->next)
    if (c->pid == pid) return session_of(c);
  return NULL;
}

void sessions_close_all(gmld *d) {
  while (d->br.clients) session_close(session_of(d->br.clients), "daemon shutting down");
  uv_idle_stop(&d->kick);
  if (!uv_is_closing((uv_handle_t *)&d->kick)) uv_close((uv_handle_t *)&d->kick, NULL);
}
