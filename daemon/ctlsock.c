/* ctlsock.c: the control RPC's socket, served on the libuv loop. gmlakectl
 * speaks nng's REQ protocol; the daemon answers as a REP peer on its own
 * listener rather than nng's, because in libnng 1.5.2 (Debian's) a peer that
 * connects and closes during the handshake stops nng's listener for good
 * (nng issue #1518, fixed after 1.5.2): every later gmlakectl timed out. The
 * SP wire is small: both sides send an 8-byte header {0,'S','P',0, proto
 * (16 bits BE), 0,0}; then each message is, on ipc, a type byte (1) and a
 * 64-bit BE length, on tcp the length alone; a request's body begins with
 * its backtrace (32-bit BE words, the last with the high bit set), which the
 * reply echoes.
 *
 * Who may do what: the peer's uid comes from SO_PEERCRED (ipc); requests
 * that change the lake are for root and the daemon's own uid, reading is for
 * whoever can open the socket (its mode and group: --socket-mode,
 * --socket-group). tcp:// carries no identity: only with
 * --control-insecure-tcp, and then anyone who reaches it may change the lake.
 *
 * What a reader can hold (the trust model: nothing a client sends makes the
 * daemon hold unbounded memory, time or fds, and one user cannot lock out
 * another): REQ/REP is one request at a time, so a connection is not read
 * while its reply waits to be sent (a pipelined request waits in the socket,
 * not in the daemon's memory); a user other than root and the daemon's own
 * holds at most CTL_MAX_PER_UID connections, and all of them together leave
 * CTL_RESERVED for root and the daemon's uid; a connection that makes no
 * progress (no SP greeting, no request, its reply not read) for
 * hello-timeout-ms is closed. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "control.h"
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include "session.h"
#include "conn.h"
#include "util.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define CTL_MAX_CONNS 64
#define CTL_RESERVED 16        /* of them, only for root and the daemon's uid */
#define CTL_MAX_PER_UID 8      /* connections of one other user at once */
#define CTL_MAX_MSG (1u << 20) /* larger closes the connection; over 64 KiB gets an error reply */
#define SP_REQ0 0x30
#define SP_REP0 0x31

typedef struct ctl_conn {
  struct ctl_conn *next;
  gmld *d;
  int fd;
  uv_poll_t poll;
  int may_change;    /* root or the daemon's uid (ipc), or --control-insecure-tcp */
  int trusted;       /* root or the daemon's uid (ipc): the reserved slots, no per-uid cap */
  long uid;          /* the peer's (ipc); -1 on tcp */
  uint64_t since_ns; /* its last progress (connected, greeted, a request read, a reply sent) */
  uint8_t *buf;
  size_t len, cap;
  int greeted; /* the peer's 8-byte SP header was read and checked */
  conn_txq tx;
} ctl_conn;

static int is_ipc(const gmld *d) { return !strncmp(d->cfg.control_url, "ipc://", 6); }

static void conn_free_cb(uv_handle_t *h) {
  ctl_conn *c = h->data;
  free(c->buf);
  free(c);
}

static void conn_close(ctl_conn *c) {
  gmld *d = c->d;
  for (ctl_conn **pp = (ctl_conn **)&d->ctl_conns; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  d->nctl_conns--;
  uv_poll_stop(&c->poll);
  conn_txq_free(&c->tx);
  close(c->fd);
  uv_close((uv_handle_t *)&c->poll, conn_free_cb);
}

static void on_conn_io(uv_poll_t *h, int status, int events);

/* Read only while no reply waits: one request at a time (REQ/REP), so a
 * peer that pipelines requests and reads nothing has them wait in its
 * socket, and at most one reply in the daemon. */
static void conn_update_poll(ctl_conn *c) {
  uv_poll_start(&c->poll, c->tx.head ? UV_WRITABLE : UV_READABLE, on_conn_io);
}

static int conn_send(ctl_conn *c, const uint8_t *bt, size_t btlen, const uint8_t *body, size_t n) {
  size_t hl = is_ipc(c->d) ? 9 : 8, len = btlen + n;
  uint8_t *f = malloc(hl + len);
  if (!f) return -1;
  uint8_t *p = f;
  if (hl == 9) *p++ = 1;
  for (int i = 7; i >= 0; i--) *p++ = (uint8_t)((uint64_t)len >> (8 * i));
  memcpy(p, bt, btlen);
  memcpy(p + btlen, body, n);
  if (conn_queue_bytes(&c->tx, f, hl + len)) return -1;
  return conn_flush(&c->tx, c->fd);
}

/* One whole message: answer it. Returns -1 to close the connection. */
static int conn_request(ctl_conn *c, const uint8_t *msg, size_t n) {
  size_t bt = 0;
  for (;;) { /* the backtrace: words up to one with the high bit (at most 8 hops) */
    if (bt + 4 > n || bt >= 32) return -1;
    bt += 4;
    if (msg[bt - 4] & 0x80) break;
  }
  uint8_t *out;
  size_t outn;
  /* all for root, the daemon's uid and --control-insecure-tcp; an ipc peer whose credentials could
   * not be read sees no one's processes (uid (uid_t)-1 is no one's) */
  long viewer = c->trusted || (c->uid < 0 && c->may_change) ? -1 : c->uid >= 0 ? c->uid : (long)UINT32_MAX;
  if (control_handle_as(c->d, c->may_change, viewer, msg + bt, n - bt, &out, &outn)) return -1;
  int rc = conn_send(c, msg, bt, out, outn);
  free(out);
  return rc;
}

/* Frames in c->buf: handle the whole ones. Returns -1 to close. */
static int conn_take(ctl_conn *c) {
  size_t off = 0;
  if (!c->greeted) {
    if (c->len < 8) return 0;
    const uint8_t *h = c->buf;
    if (h[0] || h[1] != 'S' || h[2] != 'P' || h[3] || h[4] != 0 || h[5] != SP_REQ0 || h[6] || h[7]) return -1;
    c->greeted = 1;
    c->since_ns = gmli_now_ns();
    off = 8;
  }
  size_t hl = is_ipc(c->d) ? 9 : 8;
  while (c->len - off >= hl) {
    const uint8_t *h = c->buf + off;
    if (hl == 9 && h[0] != 1) return -1;
    uint64_t n = 0;
    for (size_t i = hl - 8; i < hl; i++) n = n << 8 | h[i];
    if (n > CTL_MAX_MSG) return -1;
    if (c->len - off - hl < n) break;
    if (conn_request(c, h + hl, (size_t)n)) return -1;
    off += hl + (size_t)n;
    c->since_ns = gmli_now_ns();
    if (c->tx.head) break; /* its reply waits for the peer: the next request after it is sent */
  }
  memmove(c->buf, c->buf + off, c->len - off);
  c->len -= off;
  return 0;
}

static void on_conn_io(uv_poll_t *h, int status, int events) {
  ctl_conn *c = h->data;
  if (status < 0) {
    conn_close(c);
    return;
  }
  if (events & UV_WRITABLE) {
    if (conn_flush(&c->tx, c->fd)) {
      conn_close(c);
      return;
    }
    if (!c->tx.head) c->since_ns = gmli_now_ns();
    if (!c->tx.head && conn_take(c)) { /* requests that came while the reply waited */
      conn_close(c);
      return;
    }
  }
  if ((events & UV_READABLE) && !c->tx.head) {
    if (c->cap - c->len < 4096) {
      size_t cap = c->cap ? c->cap * 2 : 8192;
      if (cap > CTL_MAX_MSG + 64) cap = CTL_MAX_MSG + 64;
      uint8_t *b = cap > c->len ? realloc(c->buf, cap) : NULL;
      if (!b) {
        conn_close(c);
        return;
      }
      c->buf = b;
      c->cap = cap;
    }
    ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) { /* a stray connect-and-close ends here */
      conn_close(c);
      return;
    }
    if (r > 0) c->len += (size_t)r;
    if (conn_take(c)) {
      conn_close(c);
      return;
    }
  }
  conn_update_poll(c);
}

static void on_ctl_accept(uv_poll_t *h, int status, int events);

/* A connection over a bound is closed at once (gmlakectl says it cannot
 * reach the daemon); one log line a second at most. */
static void refuse_conn(gmld *d, int fd, long uid, const char *why) {
  close(fd);
  uint64_t now = gmli_now_ns();
  if (d->ctl_log_ns && now - d->ctl_log_ns < 1000000000ull) return;
  d->ctl_log_ns = now;
  GML_WARN("control connection of uid %ld refused: %s", uid, why);
}

/* Which bound, if any, a new connection of uid (-1: tcp) is over. */
static const char *over_bound(const gmld *d, long uid, int trusted) {
  if (d->nctl_conns >= CTL_MAX_CONNS) return "control connections all taken";
  if (trusted) return NULL;
  int others = 0, same = 0;
  for (const ctl_conn *o = d->ctl_conns; o; o = o->next) {
    others += !o->trusted;
    same += !o->trusted && uid >= 0 && o->uid == uid;
  }
  if (others >= CTL_MAX_CONNS - CTL_RESERVED) return "the control connections left are root's";
  if (same >= CTL_MAX_PER_UID) return "too many control connections of this user";
  return NULL;
}

/* The control socket's tick: a connection that made no progress for
 * hello-timeout-ms is closed (its slot is someone else's); accepting
 * paused for want of fds starts again. */
static void on_ctl_tick(uv_timer_t *t) {
  gmld *d = t->data;
  uint64_t now = gmli_now_ns(), limit = (uint64_t)d->cfg.hello_timeout_ms * 1000000ull;
  for (ctl_conn *c = d->ctl_conns, *next; c; c = next) {
    next = c->next;
    if (now - c->since_ns <= limit) continue;
    GML_DEBUG("control connection of uid %ld closed: %s within hello-timeout-ms", c->uid,
              !c->greeted  ? "no SP greeting"
              : c->tx.head ? "its reply not read"
                           : "no request");
    conn_close(c);
  }
  if (d->ctl_accept_paused) {
    d->ctl_accept_paused = 0;
    uv_poll_start(&d->ctl_poll, UV_READABLE, on_ctl_accept);
  }
}

static void on_ctl_accept(uv_poll_t *h, int status, int events) {
  (void)events;
  gmld *d = h->data;
  if (status < 0) return;
  int fd;
  while ((fd = accept4(d->ctl_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
    long uid = -1;
    int may_change = 1, trusted = 0; /* --control-insecure-tcp: no identity on tcp */
    if (is_ipc(d)) {
      struct ucred cr;
      socklen_t cl = sizeof cr;
      int known = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0;
      uid = known ? (long)cr.uid : -1;
      may_change = trusted = known && (cr.uid == 0 || cr.uid == geteuid());
    }
    const char *why = over_bound(d, uid, trusted);
    if (why) {
      refuse_conn(d, fd, uid, why);
      continue;
    }
    ctl_conn *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    c->d = d;
    c->fd = fd;
    c->uid = uid;
    c->may_change = may_change;
    c->trusted = trusted;
    c->since_ns = gmli_now_ns();
    static const uint8_t hello[8] = {0, 'S', 'P', 0, 0, SP_REP0, 0, 0};
    uint8_t *f = malloc(8);
    if (f) memcpy(f, hello, 8);
    if (!f || conn_queue_bytes(&c->tx, f, 8)) {
      close(fd);
      free(c);
      continue;
    }
    c->next = d->ctl_conns;
    d->ctl_conns = c;
    d->nctl_conns++;
    uv_poll_init(d->loop, &c->poll, fd);
    c->poll.data = c;
    conn_flush(&c->tx, fd);
    conn_update_poll(c);
  }
  if (errno == EMFILE || errno == ENFILE) { /* the connection waits in the backlog: polling now would spin */
    GML_DEBUG("control accept: %s", strerror(errno));
    uv_poll_stop(&d->ctl_poll);
    d->ctl_accept_paused = 1;
  }
}

/* tcp://HOST:PORT (tcp4, tcp6 too): a bound socket, or -1. */
static int tcp_listen(const char *url) {
  const char *hp = strstr(url, "://") + 3;
  char host[256];
  const char *colon = strrchr(hp, ':');
  if (!colon || (size_t)(colon - hp) >= sizeof host) return -1;
  memcpy(host, hp, (size_t)(colon - hp));
  host[colon - hp] = 0;
  char *h = host;
  if (h[0] == '[') h++, h[strlen(h) - 1] = 0;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
  if (getaddrinfo(*h && strcmp(h, "*") ? h : NULL, colon + 1, &hints, &ai)) return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd >= 0 && bind(fd, ai->ai_addr, ai->ai_addrlen)) close(fd), fd = -1;
  freeaddrinfo(ai);
  return fd;
}

int control_start(gmld *d) {
  const char *url = d->cfg.control_url;
  int fd = -1;
  if (is_ipc(d)) {
    const char *path = url + 6;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
      GML_ERR("control path too long: %s", path);
      return GML_EINVAL;
    }
    strcpy(sa.sun_path, path);
    if (conn_claim_path(path)) return GML_EINVAL; /* a live daemon's, or not a socket */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    mode_t old = umask(0177);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa)) close(fd), fd = -1;
    umask(old);
    if (fd >= 0) conn_set_mode_group(path, d->cfg.socket_mode, d->cfg.socket_group);
  } else if (!strncmp(url, "tcp", 3) && strstr(url, "://")) {
    if (!d->cfg.control_insecure_tcp) {
      GML_ERR("control %s: tcp carries no identity, so anyone who reaches it could change the lake; "
              "pass --control-insecure-tcp to accept that, or use ipc://",
              url);
      gmli_log_fatal("control %s is unauthenticated: refused without --control-insecure-tcp", url);
      return GML_EINVAL;
    }
    GML_WARN("control %s is UNAUTHENTICATED (--control-insecure-tcp): anyone who reaches it may change the lake", url);
    fd = tcp_listen(url);
  } else {
    GML_ERR("control %s: only ipc:// (or tcp:// with --control-insecure-tcp)", url);
    return GML_EINVAL;
  }
  if (fd < 0 || listen(fd, 64)) {
    GML_ERR("control %s: %s", url, strerror(errno));
    gmli_log_fatal("control %s: %s", url, strerror(errno));
    if (fd >= 0) close(fd);
    return GML_ESYS;
  }
  d->ctl_fd = fd;
  uv_poll_init(d->loop, &d->ctl_poll, fd);
  d->ctl_poll.data = d;
  uv_poll_start(&d->ctl_poll, UV_READABLE, on_ctl_accept);
  uint64_t every = (uint64_t)d->cfg.hello_timeout_ms / 4;
  every = every < 10 ? 10 : every > 1000 ? 1000 : every;
  uv_timer_init(d->loop, &d->ctl_tick);
  d->ctl_tick.data = d;
  uv_timer_start(&d->ctl_tick, on_ctl_tick, every, every);
  return 0;
}

void control_stop(gmld *d) {
  while (d->ctl_conns) conn_close(d->ctl_conns);
  uv_timer_stop(&d->ctl_tick);
  uv_close((uv_handle_t *)&d->ctl_tick, NULL);
  uv_poll_stop(&d->ctl_poll);
  uv_close((uv_handle_t *)&d->ctl_poll, NULL);
  close(d->ctl_fd);
}
