/* ipc.c: an allocation shared with another process of the same user
 * (PyTorch's shareIpcHandle/getIpcDevPtr). A process that exports answers on
 * an abstract Unix socket of its own ("\0gmlake-ipc-<pid>-<nonce>", one
 * thread per process) with the fds of the chunks behind an exported
 * allocation, to peers of its uid only (SO_PEERCRED). The receiver imports
 * them with its backend, maps them into a virtual range of its own, and that
 * mapping keeps the memory alive (the backends' semantics: a chunk lives
 * while any handle or mapping does). In daemon mode the chunks stay leased
 * to the exporter; the daemon takes them back when it exits, so a receiver
 * must not outlive the exporter there (PyTorch's receivers do not). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "log.h"
#include "util.h"
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define IPC_MAGIC 0x4b4c4d47u /* "GMLK" */
#define IPC_VERSION 1
#define IPC_MAX_CHUNKS 65536
#define IPC_FDS_PER_MSG 64

typedef struct ipc_wire_handle {
  uint32_t magic, version;
  int32_t pid, device;
  uint64_t nonce, token, size, chunk_size;
} ipc_wire_handle;
_Static_assert(sizeof(ipc_wire_handle) <= GML_IPC_HANDLE_SIZE, "handle too large");

typedef struct ipc_reply {
  int32_t status;
  uint32_t n;
  uint64_t offset, size, chunk_size;
} ipc_reply;

struct gml_ipc_map {
  uintptr_t va;
  size_t n, cs;
  gml_phys *phys;
  struct gml_ipc_map *next;
};

typedef struct ipc_export {
  uint64_t token;
  gml_client *c;
  uintptr_t ptr;
} ipc_export;

static struct {
  pthread_mutex_t lock;
  int listening;
  uint64_t nonce;
  ipc_export *v;
  size_t n, cap;
} ex = {PTHREAD_MUTEX_INITIALIZER, 0, 0, NULL, 0, 0};

static socklen_t ipc_addr(struct sockaddr_un *sa, int pid, uint64_t nonce) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  int len =
      snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "gmlake-ipc-%d-%016llx", pid, (unsigned long long)nonce);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len);
}

static int io_full(int fd, void *buf, size_t n, int out) {
  char *p = buf;
  while (n) {
    ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return GML_ESYS;
    p += k, n -= (size_t)k;
  }
  return 0;
}

static int send_fds(int sock, const int *fds, size_t n) {
  for (size_t i = 0; i < n; i += IPC_FDS_PER_MSG) {
    size_t k = n - i < IPC_FDS_PER_MSG ? n - i : IPC_FDS_PER_MSG;
    char byte = 0, cbuf[CMSG_SPACE(IPC_FDS_PER_MSG * sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = CMSG_SPACE(k * sizeof(int))};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(k * sizeof(int));
    memcpy(CMSG_DATA(cm), fds + i, k * sizeof(int));
    ssize_t r;
    do r = sendmsg(sock, &m, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    if (r != 1) return GML_ESYS;
  }
  return 0;
}

/* Receive n fds; on failure every fd received is closed. */
static int recv_fds(int sock, int *fds, size_t n) {
  size_t got = 0;
  while (got < n) {
    char byte, cbuf[CMSG_SPACE(IPC_FDS_PER_MSG * sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    ssize_t r;
    do r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    struct cmsghdr *cm = r == 1 ? CMSG_FIRSTHDR(&m) : NULL;
    size_t k = cm && cm->cmsg_type == SCM_RIGHTS ? (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int) : 0;
    if (!k || got + k > n) {
      if (k) {
        int tmp[IPC_FDS_PER_MSG];
        memcpy(tmp, CMSG_DATA(cm), k * sizeof(int));
        for (size_t i = 0; i < k; i++) close(tmp[i]);
      }
      for (size_t i = 0; i < got; i++) close(fds[i]);
      return GML_EPROTO;
    }
    memcpy(fds + got, CMSG_DATA(cm), k * sizeof(int));
    got += k;
  }
  return 0;
}

/* ---------- the exporting side ---------- */

/* Anyone may connect (an abstract name has no mode): a line per refusal let another user fill this
 * process's log, so one a second at most, with the count since the last. */
static void refused_peer(uid_t uid) {
  static uint64_t last_ns, quiet;
  uint64_t now = gmli_now_ns();
  if (last_ns && now - last_ns < 1000000000ull) {
    quiet++;
    return;
  }
  GML_WARN("ipc: refused a peer of another user (uid %u; %llu more refused since the last such line)", (unsigned)uid,
           (unsigned long long)quiet);
  last_ns = now, quiet = 0;
}

static void serve_one(int s) {
  struct ucred cr = {.uid = (uid_t)-1}; /* as said when getsockopt fails */
  socklen_t cl = sizeof cr;
  uint64_t token;
  if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != geteuid()) {
    refused_peer(cl == sizeof cr ? cr.uid : (uid_t)-1);
    return;
  }
  /* one peer at a time: one that sends no token or reads nothing holds the others 5 s at most */
  struct timeval tv = {5, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (io_full(s, &token, sizeof token, 0)) return;
  ipc_reply rep = {.status = GML_EBADPTR};
  gml_phys *phys = NULL;
  int *fds = NULL;
  size_t n = 0;
  pthread_mutex_lock(&ex.lock);
  gml_client *c = NULL;
  uintptr_t ptr = 0;
  for (size_t i = 0; i < ex.n; i++)
    if (ex.v[i].token == token) c = ex.v[i].c, ptr = ex.v[i].ptr;
  if (c) {
    size_t off = 0, size = 0;
    phys = malloc(IPC_MAX_CHUNKS * sizeof *phys);
    rep.status =
        phys ? gmli_alloc_block_phys(&c->alloc, (void *)ptr, phys, IPC_MAX_CHUNKS, &n, &off, &size) : GML_ENOMEM;
    rep.offset = off, rep.size = size, rep.chunk_size = c->alloc.cs;
    if (!rep.status && !(fds = calloc(n, sizeof *fds))) rep.status = GML_ENOMEM;
    for (size_t i = 0; !rep.status && i < n; i++) {
      rep.status = c->be->ops->chunk_export(c->be, phys[i], &fds[i]);
      if (rep.status) {
        while (i) close(fds[--i]);
      }
    }
  }
  pthread_mutex_unlock(&ex.lock); /* an export is forgotten under it: c and ptr stayed valid */
  rep.n = rep.status ? 0 : (uint32_t)n;
  if (io_full(s, &rep, sizeof rep, 1) == 0 && !rep.status && send_fds(s, fds, n))
    GML_WARN("ipc: sending %zu chunk fds failed", n);
  for (size_t i = 0; !rep.status && i < n; i++) close(fds[i]);
  free(fds);
  free(phys);
}

static void *serve(void *arg) {
  int ls = (int)(intptr_t)arg;
  for (;;) {
    int s = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      GML_ERR("ipc: accept: %s; no more exports are served", strerror(errno));
      return NULL;
    }
    serve_one(s);
    close(s);
  }
}

/* ex.lock held. */
static int start_listener(void) {
  if (ex.listening) return 0;
  if (getrandom(&ex.nonce, sizeof ex.nonce, 0) != sizeof ex.nonce) ex.nonce = (uint64_t)gmli_now_ns();
  int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa;
  socklen_t len = ipc_addr(&sa, getpid(), ex.nonce);
  if (ls < 0 || bind(ls, (struct sockaddr *)&sa, len) != 0 || listen(ls, 64) != 0) {
    GML_ERR("ipc: cannot listen: %s", strerror(errno));
    if (ls >= 0) close(ls);
    return GML_ESYS;
  }
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &at, serve, (void *)(intptr_t)ls);
  pthread_attr_destroy(&at);
  if (rc) {
    close(ls);
    return GML_ESYS;
  }
  ex.listening = 1;
  return 0;
}

int gml_ipc_export(gml_client *c, void *ptr, gml_ipc_handle *out) {
  if (!c) return GML_EINVAL;
  if (!out) return gmli_fail(c, GML_EINVAL, "gml_ipc_export: out is NULL");
  pthread_mutex_lock(&c->track_lock);
  gml_rec *r = gmli_recmap_get(&c->recs, (uintptr_t)ptr, 0);
  if (!r || r->state != GML_BLOCK_ALLOCATED) {
    pthread_mutex_unlock(&c->track_lock);
    return gmli_fail(c, GML_EBADPTR, "gml_ipc_export: %p is not the start of a live allocation of this client", ptr);
  }
  pthread_mutex_lock(&ex.lock);
  int rc = start_listener();
  uint64_t token = 0;
  for (size_t i = 0; !rc && i < ex.n && !token; i++) /* exported before: the same handle (receivers cache by it) */
    if (ex.v[i].c == c && ex.v[i].ptr == (uintptr_t)ptr) token = ex.v[i].token;
  int again = token != 0;
  if (!rc && !again && getrandom(&token, sizeof token, 0) != sizeof token) token = gmli_now_ns() ^ (uintptr_t)ptr;
  if (!rc && !again && ex.n == ex.cap) {
    size_t cap = ex.cap ? 2 * ex.cap : 64;
    ipc_export *v = realloc(ex.v, cap * sizeof *v);
    if (!v) rc = GML_ENOMEM;
    else ex.v = v, ex.cap = cap;
  }
  if (!rc && !again) ex.v[ex.n++] = (ipc_export){token, c, (uintptr_t)ptr};
  uint64_t nonce = ex.nonce;
  pthread_mutex_unlock(&ex.lock);
  if (rc) gmli_fail(c, rc, "gml_ipc_export: cannot start answering for exports (%s)", gml_strerror(rc));
  if (!rc) {
    r->exported = 1;
    ipc_wire_handle h = {IPC_MAGIC, IPC_VERSION, getpid(), c->device, nonce, token, r->size, c->alloc.cs};
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &h, sizeof h);
  }
  pthread_mutex_unlock(&c->track_lock);
  return rc;
}

void gmli_ipc_forget(gml_client *c, uintptr_t ptr) {
  gmli_ipc_fds_forget(c, ptr); /* the fds gml_ipc_export_fds kept for it */
  pthread_mutex_lock(&ex.lock);
  for (size_t i = 0; i < ex.n;)
    if (ex.v[i].c == c && (ex.v[i].ptr == ptr || !ptr)) ex.v[i] = ex.v[--ex.n];
    else i++;
  pthread_mutex_unlock(&ex.lock);
}

/* ---------- the receiving side ---------- */

int gml_ipc_device(const gml_ipc_handle *h) {
  ipc_wire_handle w;
  if (!h) return GML_EINVAL;
  memcpy(&w, h->bytes, sizeof w);
  return w.magic == IPC_MAGIC && w.version == IPC_VERSION && w.device >= 0 ? w.device : GML_EINVAL;
}

static void unmap_all(gml_client *c, uintptr_t va, size_t mapped, size_t n, size_t cs, gml_phys *phys) {
  if (mapped) c->be->ops->unmap(c->be, va, mapped * cs);
  if (va) c->be->ops->va_free(c->be, va, n * cs);
  for (size_t i = 0; i < n; i++) c->be->ops->chunk_release(c->be, phys[i]);
}

int gml_ipc_open(gml_client *c, const gml_ipc_handle *h, void **ptr, size_t *size) {
  if (!c) return GML_EINVAL;
  if (!ptr) return gmli_fail(c, GML_EINVAL, "gml_ipc_open: ptr is NULL");
  if (gml_ipc_device(h) < 0)
    return gmli_fail(c, GML_EINVAL, "gml_ipc_open: %s",
                     h ? "the handle is not one gml_ipc_export made (or of another version)" : "h is NULL");
  ipc_wire_handle w;
  memcpy(&w, h->bytes, sizeof w);
  if (w.chunk_size != c->alloc.cs) {
    snprintf(c->last_error, sizeof c->last_error, "ipc: the exporter's chunks are %llu bytes, ours %zu",
             (unsigned long long)w.chunk_size, c->alloc.cs);
    return GML_EPROTO;
  }
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa;
  socklen_t len = ipc_addr(&sa, w.pid, w.nonce);
  if (s < 0 || connect(s, (struct sockaddr *)&sa, len) != 0) {
    snprintf(c->last_error, sizeof c->last_error, "ipc: cannot reach process %d: %s", w.pid, strerror(errno));
    if (s >= 0) close(s);
    return GML_ESYS;
  }
  /* the exporter may be gone and another user's process bound its name (abstract names are listed in
   * /proc/net/unix): only a process of ours is asked, and its fds mapped */
  struct ucred cr = {.uid = (uid_t)-1}; /* as said when getsockopt fails */
  socklen_t cl = sizeof cr;
  if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != geteuid()) {
    snprintf(c->last_error, sizeof c->last_error,
             "ipc: the process answering for %d runs as another user (uid %u): refused", w.pid, (unsigned)cr.uid);
    close(s);
    return GML_EPERM;
  }
  ipc_reply rep;
  int rc = io_full(s, &w.token, sizeof w.token, 1);
  if (!rc) rc = io_full(s, &rep, sizeof rep, 0);
  if (!rc && rep.status) rc = rep.status;
  /* the pointer and size handed back lie in what is mapped, and are the exported allocation's */
  if (!rc && (rep.n == 0 || rep.n > IPC_MAX_CHUNKS || rep.chunk_size != c->alloc.cs || rep.offset >= c->alloc.cs ||
              rep.size < w.size || rep.size > (uint64_t)rep.n * c->alloc.cs - rep.offset))
    rc = GML_EPROTO;
  int *fds = rc ? NULL : calloc(rep.n, sizeof *fds);
  gml_phys *phys = rc ? NULL : calloc(rep.n, sizeof *phys);
  if (!rc && (!fds || !phys)) rc = GML_ENOMEM;
  if (!rc) rc = recv_fds(s, fds, rep.n);
  close(s);
  if (rc) {
    snprintf(c->last_error, sizeof c->last_error, "ipc: process %d did not give allocation %016llx: %s", w.pid,
             (unsigned long long)w.token, gml_strerror(rc));
    free(fds), free(phys);
    return rc;
  }
  size_t n = rep.n, imported = 0, mapped = 0, cs = c->alloc.cs;
  uintptr_t va = 0;
  for (; imported < n; imported++)
    if ((rc = c->be->ops->chunk_import(c->be, fds[imported], &phys[imported]))) break;
  for (size_t i = imported + (rc ? 1 : 0); i < n; i++) close(fds[i]); /* import took the others */
  free(fds);
  if (!rc) rc = c->be->ops->va_reserve(c->be, n * cs, &va);
  for (; !rc && mapped < n; mapped++)
    if ((rc = c->be->ops->map(c->be, va + mapped * cs, phys[mapped]))) break;
  if (!rc) rc = c->be->ops->set_access(c->be, va, n * cs, 0);
  struct gml_ipc_map *m = rc ? NULL : malloc(sizeof *m);
  if (!rc && !m) rc = GML_ENOMEM;
  if (rc) {
    unmap_all(c, va, mapped, imported, cs, phys);
    free(phys);
    return gmli_fail(c, rc, "ipc: mapping the %zu chunk(s) of process %d's allocation failed: %s", n, w.pid,
                     gml_strerror(rc));
  }
  *m = (struct gml_ipc_map){va, n, cs, phys, NULL};
  pthread_mutex_lock(&c->track_lock);
  m->next = c->ipc_maps;
  c->ipc_maps = m;
  pthread_mutex_unlock(&c->track_lock);
  *ptr = (void *)(va + rep.offset);
  if (size) *size = rep.size;
  return 0;
}

int gml_ipc_close(gml_client *c, void *ptr) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  struct gml_ipc_map **pp = &c->ipc_maps, *m = NULL;
  for (; *pp; pp = &(*pp)->next)
    if ((uintptr_t)ptr >= (*pp)->va && (uintptr_t)ptr < (*pp)->va + (*pp)->n * (*pp)->cs) {
      m = *pp;
      *pp = m->next;
      break;
    }
  pthread_mutex_unlock(&c->track_lock);
  if (!m) return gmli_fail(c, GML_EBADPTR, "gml_ipc_close: %p is not in memory gml_ipc_open mapped", ptr);
  c->be->ops->synchronize(c->be); /* no kernel of ours reads it any more */
  unmap_all(c, m->va, m->n, m->n, m->cs, m->phys);
  free(m->phys);
  free(m);
  return 0;
}

void gmli_ipc_client_gone(gml_client *c) {
  gmli_ipc_forget(c, 0);
  while (c->ipc_maps) gml_ipc_close(c, (void *)c->ipc_maps->va);
}
