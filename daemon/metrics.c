/* metrics.c: Prometheus text over HTTP, `--metrics-listen ADDR:PORT`, on the
 * libuv loop: GET /metrics answers what `gmlakectl metrics` prints (the same
 * printer, common/statsview.c, over the same control reply), anything else
 * 404. A tiny HTTP/1.0 responder rather than nng's HTTP server: nng's
 * handlers run on nng's threads and the daemon's state is the loop thread's
 * alone (and libnng 1.5.2's listeners had to be left for the control socket,
 * ctlsock.c). Bounded: 16 connections, 8 KiB of request, 5 s each. A 17th
 * connection takes the place of the oldest (before, 16 idle connections of
 * any local user, reopened every 5 s, left every scrape refused); accept()
 * out of fds pauses the listener until the next tick (before, it spun). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "conn.h"
#include "control.h"
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include "statsview.h"
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HTTP_MAX_CONNS 16
#define HTTP_MAX_REQUEST 8192
#define HTTP_TIMEOUT_NS 5000000000ull

typedef struct http_conn {
  struct http_conn *next;
  gmld *d;
  int fd;
  uv_poll_t poll;
  char req[HTTP_MAX_REQUEST];
  size_t len;
  int answered;
  uint64_t since_ns;
  conn_txq tx;
} http_conn;

static void http_free_cb(uv_handle_t *h) { free(h->data); }

static void http_close(http_conn *c) {
  gmld *d = c->d;
  for (http_conn **pp = (http_conn **)&d->http_conns; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  d->nhttp_conns--;
  uv_poll_stop(&c->poll);
  conn_txq_free(&c->tx);
  close(c->fd);
  uv_close((uv_handle_t *)&c->poll, http_free_cb);
}

/* The exposition text, malloc'd (NULL when out of memory). */
static char *metrics_text(gmld *d, size_t *len) {
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  req.req_case = GMLAKE__CTL_REQUEST__REQ_CLIENTS;
  req.clients = 1;
  size_t n = gmlake__ctl_request__get_packed_size(&req);
  uint8_t buf[16], *out;
  size_t outn;
  if (n > sizeof buf) return NULL;
  gmlake__ctl_request__pack(&req, buf);
  if (control_handle_as(d, 0, -1, buf, n, &out, &outn)) return NULL;
  Gmlake__CtlReply *r = gmlake__ctl_reply__unpack(NULL, outn, out);
  free(out);
  if (!r || !r->stats) {
    if (r) gmlake__ctl_reply__free_unpacked(r, NULL);
    return NULL;
  }
  char *text = NULL;
  FILE *f = open_memstream(&text, len);
  if (f) {
    gmli_print_metrics(f, r);
    fclose(f);
  }
  gmlake__ctl_reply__free_unpacked(r, NULL);
  return text;
}

static void http_answer(http_conn *c) {
  char head[256], *body = NULL;
  size_t blen = 0;
  int ok = !strncmp(c->req, "GET /metrics ", 13) || !strncmp(c->req, "GET /metrics?", 13);
  if (ok) body = metrics_text(c->d, &blen);
  const char *status = ok ? (body ? "200 OK" : "500 Internal Server Error") : "404 Not Found";
  if (!body) {
    body = strdup(ok ? "out of memory\n" : "only /metrics here\n");
    blen = body ? strlen(body) : 0;
  }
  int hl = snprintf(head, sizeof head,
                    "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: %zu\r\n"
                    "Connection: close\r\n\r\n",
                    status, blen);
  uint8_t *frame = malloc((size_t)hl + blen);
  if (frame) {
    memcpy(frame, head, (size_t)hl);
    if (body) memcpy(frame + hl, body, blen);
    if (conn_queue_bytes(&c->tx, frame, (size_t)hl + blen) == 0) c->answered = 1;
  }
  free(body);
}

static void on_http_io(uv_poll_t *h, int status, int events) {
  http_conn *c = h->data;
  if (status < 0 || gmli_now_ns() - c->since_ns > HTTP_TIMEOUT_NS) {
    http_close(c);
    return;
  }
  if ((events & UV_READABLE) && !c->answered) {
    ssize_t r = recv(c->fd, c->req + c->len, sizeof c->req - 1 - c->len, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
      http_close(c);
      return;
    }
    if (r > 0) c->len += (size_t)r;
    c->req[c->len] = 0;
    if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) http_answer(c);
    else if (c->len >= sizeof c->req - 1) {
      http_close(c);
      return;
    }
  }
  if (c->answered) {
    if (conn_flush(&c->tx, c->fd) || !c->tx.head) { /* sent (or the peer left): done */
      http_close(c);
      return;
    }
    uv_poll_start(&c->poll, UV_WRITABLE, on_http_io);
  }
}

/* The connection open the longest (the list's last: new ones go first). */
static http_conn *http_oldest(gmld *d) {
  http_conn *c = d->http_conns;
  while (c && c->next) c = c->next;
  return c;
}

static void on_http_accept(uv_poll_t *h, int status, int events) {
  (void)events;
  gmld *d = h->data;
  if (status < 0) return;
  int fd;
  while ((fd = accept4(d->http_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
    if (d->nhttp_conns >= HTTP_MAX_CONNS) http_close(http_oldest(d)); /* the newest may be the scraper */
    http_conn *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    c->d = d;
    c->fd = fd;
    c->since_ns = gmli_now_ns();
    c->next = d->http_conns;
    d->http_conns = c;
    d->nhttp_conns++;
    uv_poll_init(d->loop, &c->poll, fd);
    c->poll.data = c;
    uv_poll_start(&c->poll, UV_READABLE, on_http_io);
  }
  if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
    /* the connection waits in the backlog: polling again now would spin */
    uv_poll_stop(&d->http_poll);
    d->http_accept_paused = 1;
    GML_DEBUG("metrics accept: %s", strerror(errno));
  }
}

/* The tick: connections that outstay HTTP_TIMEOUT_NS go. */
void metrics_tick(gmld *d) {
  uint64_t now = gmli_now_ns();
  for (http_conn *c = d->http_conns, *next; c; c = next) {
    next = c->next;
    if (now - c->since_ns > HTTP_TIMEOUT_NS) http_close(c);
  }
  if (d->http_accept_paused && d->http_fd >= 0) {
    d->http_accept_paused = 0;
    uv_poll_start(&d->http_poll, UV_READABLE, on_http_accept);
  }
}

int metrics_start(gmld *d) {
  d->http_fd = -1;
  const char *hp = d->cfg.metrics_listen;
  if (!*hp) return 0;
  char host[128];
  const char *colon = strrchr(hp, ':');
  if (!colon || (size_t)(colon - hp) >= sizeof host) {
    gmli_log_fatal("--metrics-listen wants ADDR:PORT, not '%s'", hp);
    return GML_EINVAL;
  }
  memcpy(host, hp, (size_t)(colon - hp));
  host[colon - hp] = 0;
  char *hn = host;
  if (hn[0] == '[' && hn[strlen(hn) - 1] == ']') hn++, hn[strlen(hn) - 1] = 0;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
  if (getaddrinfo(*hn ? hn : NULL, colon + 1, &hints, &ai)) {
    gmli_log_fatal("--metrics-listen %s: cannot resolve", hp);
    return GML_EINVAL;
  }
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd >= 0 && (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 16))) {
    gmli_log_fatal("--metrics-listen %s: %s", hp, strerror(errno));
    close(fd);
    fd = -1;
  }
  freeaddrinfo(ai);
  if (fd < 0) return GML_ESYS;
  d->http_fd = fd;
  uv_poll_init(d->loop, &d->http_poll, fd);
  d->http_poll.data = d;
  uv_poll_start(&d->http_poll, UV_READABLE, on_http_accept);
  GML_INFO("metrics on http://%s/metrics", hp);
  return 0;
}

void metrics_stop(gmld *d) {
  while (d->http_conns) http_close(d->http_conns);
  if (d->http_fd < 0) return;
  uv_poll_stop(&d->http_poll);
  uv_close((uv_handle_t *)&d->http_poll, NULL);
  close(d->http_fd);
  d->http_fd = -1;
}
