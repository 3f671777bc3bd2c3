/* session.c: client sessions on the daemon's Unix socket. Identity comes
 * from SO_PEERCRED; every frame is validated (length, fd count, message
 * kind, chunk ownership) and a bad one closes that client only. A client
 * that leaves gets its chunks back into the lake once its process is gone
 * (a pidfd says when), so no mapping in a living process can alias a chunk
 * leased to someone else. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <errno.h>
#include <stdarg.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static void session_close(session *s, const char *why);
static void session_update_poll(session *s);

static int pidfd_open_compat(pid_t pid) {
#ifdef SYS_pidfd_open
  return (int)syscall(SYS_pidfd_open, pid, 0);
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

static int process_gone(int pidfd, pid_t pid) {
  if (pidfd >= 0) {
    struct pollfd p = {pidfd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
  }
  return kill(pid, 0) != 0 && errno == ESRCH;
}

/* ---------- sending ---------- */

static void tx_flush(session *s) {
  while (s->tx_head) {
    tx_item *t = s->tx_head;
    long r = gml_wire_sendmsg(s->fd, t->buf + t->off, t->len - t->off, t->off == 0 ? t->fds : NULL, t->off == 0 ? t->nfds : 0);
    if (r == GML_EAGAIN) break;
    if (r < 0) {
      s->closing = 1;
      return;
    }
    t->off += (size_t)r;
    if (t->off < t->len) continue;
    s->tx_head = t->next;
    if (!s->tx_head) s->tx_tail = NULL;
    free(t->buf);
    free(t);
  }
}

static int session_send(session *s, Gmlake__Envelope *env, const int *fds, int nfds) {
  tx_item *t = calloc(1, sizeof *t);
  if (!t) return GML_ENOMEM;
  if (gml_wire_encode(env, &t->buf, &t->len)) {
    free(t);
    return GML_ENOMEM;
  }
  if (nfds) memcpy(t->fds, fds, sizeof(int) * (size_t)nfds);
  t->nfds = nfds;
  if (s->tx_tail) s->tx_tail->next = t;
  else s->tx_head = t;
  s->tx_tail = t;
  tx_flush(s);
  session_update_poll(s);
  return 0;
}

static void send_error(session *s, uint64_t seq, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void send_error(session *s, uint64_t seq, int code, const char *fmt, ...) {
  char msg[256];
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

void session_send_reclaim(session *s, uint64_t bytes) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReclaimRequest r = GMLAKE__RECLAIM_REQUEST__INIT;
  r.bytes = bytes;
  env.msg_case = GMLAKE__ENVELOPE__MSG_RECLAIM;
  env.reclaim = &r;
  session_send(s, &env, NULL, 0);
}

/* ---------- leases ---------- */

static void record_latency(gmld *d, uint64_t ns) {
  d->lat_ns[d->nlat % LAT_RING] = ns;
  d->nlat++;
}

/* Serve s's waiting lease from free chunks, if any. Returns 1 when answered. */
static int serve_lease(session *s) {
  gmld *d = s->d;
  if (!s->pending || !d->lk.nfree) return 0;
  uint32_t idx[GML_MAX_LEASE_CHUNKS];
  uint32_t n = lake_take(&d->lk, s->id, s->pending_count, idx);
  uint64_t ids[GML_MAX_LEASE_CHUNKS];
  int fds[GML_MAX_LEASE_CHUNKS];
  for (uint32_t i = 0; i < n; i++) {
    ids[i] = lake_chunk_id(&d->lk, idx[i]);
    fds[i] = d->lk.chunks[idx[i]].fd;
  }
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__LeaseReply lr = GMLAKE__LEASE_REPLY__INIT;
  lr.n_chunk_ids = n;
  lr.chunk_ids = ids;
  env.seq = s->pending_seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_LEASE_REPLY;
  env.lease_reply = &lr;
  s->leased_chunks += n;
  s->pending = 0;
  s->reclaim_sent = 0;
  d->lease_count++;
  session_send(s, &env, fds, (int)n);
  record_latency(d, gml_now_ns() - s->pending_since_ns);
  return 1;
}

/* Ask clients other than `except` that hold idle cache to give some back. */
/* Returns how many clients were asked. */
static int ask_reclaim(gmld *d, session *except, uint64_t bytes) {
  int asked = 0;
  for (session *o = d->sessions; o; o = o->next) {
    if (o == except || o->closing || o->cached < d->lk.cs) continue;
    session_send_reclaim(o, bytes);
    asked++;
    GML_INFO("asked client %llu (pid %d) for %llu bytes of idle cache", (unsigned long long)o->id, (int)o->pid,
             (unsigned long long)bytes);
  }
  return asked;
}

static void refuse_lease(session *s, int code, const char *why) {
  gmld *d = s->d;
  s->pending = 0;
  s->leases_refused++;
  d->leases_refused++;
  char h[32], l[32];
  GML_WARN("lease of %u chunk(s) refused to client %llu (pid %d): %s", s->pending_count, (unsigned long long)s->id,
           (int)s->pid, why);
  send_error(s, s->pending_seq, code, "%s (lake holds %s of limit %s)", why,
             gml_format_bytes(d->lk.total * d->lk.cs, h, sizeof h), gml_format_bytes(d->lk.limit_bytes, l, sizeof l));
}

void sessions_serve_pending(gmld *d) {
  for (session *s = d->sessions; s && d->lk.nfree; s = s->next)
    if (s->pending && !s->closing) serve_lease(s);
}

void sessions_tick(gmld *d) {
  uint64_t now = gml_now_ns();
  for (session *s = d->sessions; s; s = s->next) {
    if (!s->pending || s->closing) continue;
    if (serve_lease(s)) continue;
    int nothing_coming = d->lk.creating == 0 && lake_headroom(&d->lk) == 0;
    if (nothing_coming && !s->reclaim_sent) {
      s->reclaim_sent = 1;
      /* nobody holds idle cache to give back: say so now rather than wait */
      if (!ask_reclaim(d, s, (uint64_t)s->pending_count * d->lk.cs) && d->lk.parked == 0) {
        refuse_lease(s, GML_ENOMEM, "out of memory: the lake is full");
        continue;
      }
    }
    if (now >= s->pending_deadline_ns) {
      refuse_lease(s, GML_ENOMEM, "out of memory: the lake is full");
    }
  }
}

static void handle_lease(session *s, uint64_t seq, uint32_t count, int optional) {
  gmld *d = s->d;
  d->prefetch_suspended = 0;
  s->pending = 1;
  s->pending_seq = seq;
  s->pending_count = count;
  s->pending_since_ns = gml_now_ns();
  s->pending_deadline_ns = s->pending_since_ns + LEASE_WAIT_MS * 1000000ull;
  uint64_t quota = lake_quota_for(&d->lk, s->pid, s->uid);
  uint64_t allowed = !quota ? count : quota / d->lk.cs > s->leased_chunks ? quota / d->lk.cs - s->leased_chunks : 0;
  if (s->pending_count > allowed) s->pending_count = (uint32_t)allowed;
  if (optional) { /* headroom: what is free now, else a quiet no; nobody waits or gives back for it */
    if (!allowed || !serve_lease(s)) {
      s->pending = 0;
      d->optional_declined++;
      send_error(s, seq, GML_ENOMEM, "no free chunk at once (optional lease)");
    }
    lake_refill(d);
    return;
  }
  if (!allowed) {
    char q[32];
    char why[128];
    snprintf(why, sizeof why, "quota of %s reached", gml_format_bytes(quota, q, sizeof q));
    refuse_lease(s, GML_EQUOTA, why);
    return;
  }
  if (serve_lease(s)) {
    lake_refill(d);
    return;
  }
  lake_refill(d);
  sessions_tick(d); /* may ask others to reclaim */
}

static void handle_return(session *s, uint64_t seq, const Gmlake__ReturnRequest *rr) {
  gmld *d = s->d;
  long idx[GML_MAX_LEASE_CHUNKS];
  for (size_t i = 0; i < rr->n_chunk_ids; i++) {
    idx[i] = lake_owned_index(&d->lk, rr->chunk_ids[i], s->id);
    for (size_t k = 0; k < i && idx[i] >= 0; k++)
      if (idx[k] == idx[i]) idx[i] = -1; /* the same id twice */
    if (idx[i] < 0) {
      d->protocol_errors++;
      GML_WARN("client %llu (pid %d) returned chunk %#llx it does not hold: closing it", (unsigned long long)s->id, (int)s->pid,
               (unsigned long long)rr->chunk_ids[i]);
      session_close(s, "foreign chunk id");
      return;
    }
  }
  /* The client unmapped and released them: they go straight back. */
  for (size_t i = 0; i < rr->n_chunk_ids; i++) lake_give_back(&d->lk, (uint32_t)idx[i]);
  s->leased_chunks -= rr->n_chunk_ids;
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReturnReply r = GMLAKE__RETURN_REPLY__INIT;
  r.returned = (uint32_t)rr->n_chunk_ids;
  env.seq = seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_RET_REPLY;
  env.ret_reply = &r;
  session_send(s, &env, NULL, 0);
  sessions_serve_pending(d);
}

static void handle_hello(session *s, uint64_t seq, const Gmlake__Hello *h) {
  gmld *d = s->d;
  if (h->protocol_version != GML_PROTOCOL_VERSION) {
    send_error(s, seq, GML_EPROTO, "protocol version %u not supported (daemon speaks %d)", h->protocol_version,
               GML_PROTOCOL_VERSION);
    s->closing = 1;
    return;
  }
  snprintf(s->name, sizeof s->name, "%s", h->name ? h->name : "");
  for (char *p = s->name; *p; p++)
    if ((unsigned char)*p < 32 || (unsigned char)*p > 126) *p = '?';
  s->hello_done = 1;
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__HelloReply r = GMLAKE__HELLO_REPLY__INIT;
  r.protocol_version = GML_PROTOCOL_VERSION;
  r.chunk_size = d->lk.cs;
  r.backend = (char *)d->be->name;
  r.device = d->cfg.device;
  r.client_id = s->id;
  env.seq = seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_HELLO_REPLY;
  env.hello_reply = &r;
  session_send(s, &env, NULL, 0);
  GML_INFO("client %llu connected: pid %d uid %u (%s)", (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid, s->name);
}

/* Returns 0 to go on, -1 when the session was closed. */
static int handle_frame(session *s, const uint8_t *body, size_t len) {
  gmld *d = s->d;
  Gmlake__Envelope *env = gmlake__envelope__unpack(NULL, len, body);
  const char *bad = env ? gml_wire_check_request(env, s->hello_done) : "undecodable message";
  if (!bad) {
    switch (env->msg_case) {
    case GMLAKE__ENVELOPE__MSG_HELLO: handle_hello(s, env->seq, env->hello); break;
    case GMLAKE__ENVELOPE__MSG_LEASE:
      if (s->pending) bad = "a second lease while one is in flight";
      else handle_lease(s, env->seq, env->lease->count, env->lease->optional);
      break;
    case GMLAKE__ENVELOPE__MSG_RET:
      handle_return(s, env->seq, env->ret);
      gmlake__envelope__free_unpacked(env, NULL);
      return s->closing ? -1 : 0;
    case GMLAKE__ENVELOPE__MSG_USAGE:
      s->allocated = env->usage->allocated;
      s->cached = env->usage->cached;
      s->stitched = env->usage->stitched;
      s->largest_free = env->usage->largest_free;
      break;
    default: break; /* gml_wire_check_request let no other kind through */
    }
  }
  if (env) gmlake__envelope__free_unpacked(env, NULL);
  if (bad) {
    d->protocol_errors++;
    GML_WARN("protocol error from client %llu (pid %d): %s: closing it", (unsigned long long)s->id, (int)s->pid, bad);
    session_close(s, bad);
    return -1;
  }
  return 0;
}

static void on_session_io(uv_poll_t *h, int status, int events) {
  session *s = h->data;
  if (s->closing) return;
  if (status < 0) {
    session_close(s, uv_strerror(status));
    return;
  }
  if (events & UV_WRITABLE) tx_flush(s);
  if (events & UV_READABLE) {
    for (;;) {
      long r = gml_rx_fill(&s->rx, s->fd);
      if (s->rx.fds_received) {
        s->d->protocol_errors++;
        GML_WARN("client %llu (pid %d) sent file descriptors: closing it", (unsigned long long)s->id, (int)s->pid);
        session_close(s, "unexpected fds");
        return;
      }
      if (r == GML_EAGAIN) break;
      if (r == 0 && s->rx.len) {
        s->d->protocol_errors++;
        GML_WARN("client %llu (pid %d) left in the middle of a frame", (unsigned long long)s->id, (int)s->pid);
        session_close(s, "truncated frame");
        return;
      }
      if (r <= 0) {
        session_close(s, r == 0 ? "disconnected" : r == GML_EPROTO ? "receive buffer full" : strerror(errno));
        return;
      }
      const uint8_t *body;
      size_t len;
      int k;
      while ((k = gml_rx_next(&s->rx, &body, &len)) == 1) {
        if (handle_frame(s, body, len)) return;
        gml_rx_consume(&s->rx, len);
      }
      if (k < 0) {
        s->d->protocol_errors++;
        GML_WARN("client %llu (pid %d) sent a frame over %d bytes: closing it", (unsigned long long)s->id, (int)s->pid,
                 GML_MAX_FRAME);
        session_close(s, "oversize frame");
        return;
      }
    }
  }
  if (s->closing) session_close(s, "send failed");
  else session_update_poll(s);
}

static void session_update_poll(session *s) {
  if (s->closing) return;
  int ev = UV_READABLE | (s->tx_head ? UV_WRITABLE : 0);
  if (ev != s->poll_events) {
    s->poll_events = ev;
    uv_poll_start(&s->poll, ev, on_session_io);
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
  GML_INFO("process %d exited: its parked chunks are back in the lake", (int)p->pid);
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
  while (s->tx_head) {
    tx_item *t = s->tx_head;
    s->tx_head = t->next;
    free(t->buf);
    free(t);
  }
  gml_rx_free(&s->rx);
  free(s);
}

static void session_close(session *s, const char *why) {
  gmld *d = s->d;
  if (s->fd < 0) return;
  s->closing = 1;
  uint64_t held = 0;
  for (uint32_t i = 0; i < d->lk.nslots; i++)
    held += d->lk.chunks[i].state == CHUNK_LEASED && d->lk.chunks[i].owner == s->id;
  int gone = process_gone(s->pidfd, s->pid);
  if (gone || !held || d->stopping) {
    release_owner_chunks(d, s->id);
    if (s->pidfd >= 0) close(s->pidfd);
  } else {
    /* Its process lives on and may still map them: park until it exits. */
    for (uint32_t i = 0; i < d->lk.nslots; i++)
      if (d->lk.chunks[i].state == CHUNK_LEASED && d->lk.chunks[i].owner == s->id) lake_park(&d->lk, i);
    parked_owner *p = calloc(1, sizeof *p);
    if (p && s->pidfd >= 0) {
      p->d = d;
      p->owner = s->id;
      p->pidfd = s->pidfd;
      p->pid = s->pid;
      uv_poll_init(d->loop, &p->poll, p->pidfd);
      p->poll.data = p;
      uv_poll_start(&p->poll, UV_READABLE, on_parked_exit);
      p->next = d->parked;
      d->parked = p;
    } else {
      free(p);
      if (s->pidfd >= 0) close(s->pidfd);
      GML_WARN("cannot watch pid %d: its %llu chunk(s) stay parked", (int)s->pid, (unsigned long long)held);
    }
  }
  GML_INFO("client %llu (pid %d) left (%s); %llu chunk(s) %s", (unsigned long long)s->id, (int)s->pid, why,
           (unsigned long long)held, gone || d->stopping ? "back in the lake" : "parked until its process exits");
  if (s->prev) s->prev->next = s->next;
  else d->sessions = s->next;
  if (s->next) s->next->prev = s->prev;
  d->nsessions--;
  uv_poll_stop(&s->poll);
  close(s->fd);
  s->fd = -1;
  uv_close((uv_handle_t *)&s->poll, session_free_cb);
  sessions_serve_pending(d);
}

/* ---------- accepting ---------- */

static void on_accept(uv_poll_t *h, int status, int events) {
  (void)events;
  gmld *d = h->data;
  if (status < 0) return;
  for (;;) {
    int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) GML_WARN("accept: %s", strerror(errno));
      return;
    }
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
      close(fd);
      continue;
    }
    session *s = calloc(1, sizeof *s);
    if (!s) {
      close(fd);
      continue;
    }
    s->d = d;
    s->fd = fd;
    s->id = ++d->next_client_id;
    s->pid = cred.pid;
    s->uid = cred.uid;
    s->pidfd = pidfd_open_compat(cred.pid);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->since = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    uv_poll_init(d->loop, &s->poll, fd);
    s->poll.data = s;
    s->next = d->sessions;
    if (d->sessions) d->sessions->prev = s;
    d->sessions = s;
    d->nsessions++;
    session_update_poll(s);
  }
}

int sessions_listen(gmld *d) {
  const char *path = d->cfg.socket_path;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) {
    GML_ERR("socket path too long: %s", path);
    return GML_EINVAL;
  }
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return GML_ESYS;
  /* A socket file left by a dead daemon is replaced; a live one is not. */
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0) {
    close(probe);
    close(fd);
    GML_ERR("another daemon already serves %s", path);
    return GML_EINVAL;
  }
  if (probe >= 0) close(probe);
  unlink(path);
  mode_t old = umask(0177);
  int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
  umask(old);
  if (rc != 0) {
    GML_ERR("bind %s: %s", path, strerror(errno));
    close(fd);
    return GML_ESYS;
  }
  if (d->cfg.socket_group[0]) {
    struct group *g = getgrnam(d->cfg.socket_group);
    if (!g || chown(path, (uid_t)-1, g->gr_gid) != 0)
      GML_WARN("cannot give %s to group %s: %s", path, d->cfg.socket_group, g ? strerror(errno) : "no such group");
  }
  if (chmod(path, d->cfg.socket_mode) != 0) GML_WARN("chmod %s: %s", path, strerror(errno));
  if (listen(fd, 128) != 0) {
    close(fd);
    return GML_ESYS;
  }
  d->listen_fd = fd;
  uv_poll_init(d->loop, &d->listen_poll, fd);
  d->listen_poll.data = d;
  uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
  return 0;
}

session *session_by_pid(gmld *d, pid_t pid) {
  for (session *s = d->sessions; s; s = s->next)
    if (s->pid == pid) return s;
  return NULL;
}

void sessions_close_all(gmld *d) {
  if (d->listen_fd >= 0) {
    uv_poll_stop(&d->listen_poll);
    uv_close((uv_handle_t *)&d->listen_poll, NULL);
    close(d->listen_fd);
    d->listen_fd = -1;
    unlink(d->cfg.socket_path);
  }
  while (d->sessions) session_close(d->sessions, "daemon shutting down");
  while (d->parked) {
    parked_owner *p = d->parked;
    d->parked = p->next;
    release_owner_chunks(d, p->owner);
    uv_poll_stop(&p->poll);
    close(p->pidfd);
    uv_close((uv_handle_t *)&p->poll, parked_free);
  }
}
