/* wire.c: frames and fd passing over Unix stream sockets. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "wire.h"
#include "gmlake.h"
#include "util.h"
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A failed socket call as the GML_E* code a caller acts on; errno stays set
 * for its log line. */
static long errno_to_gml(int e) {
  if (e == EAGAIN || e == EWOULDBLOCK) return GML_EAGAIN;
  if (e == EPIPE || e == ECONNRESET) return GML_EDAEMON; /* the peer is gone */
  if (e == ENOMEM || e == ENOBUFS) return GML_ENOMEM;
  return GML_ESYS;
}

int gmli_wire_encode(const Gmlake__Envelope *env, uint8_t **frame, size_t *len) {
  size_t n = gmlake__envelope__get_packed_size(env);
  if (n > GML_MAX_FRAME) return GML_EINVAL;
  uint8_t *f = malloc(4 + n);
  if (!f) return GML_ENOMEM;
  f[0] = (uint8_t)n, f[1] = (uint8_t)(n >> 8), f[2] = (uint8_t)(n >> 16), f[3] = (uint8_t)(n >> 24);
  gmlake__envelope__pack(env, f + 4);
  *frame = f;
  *len = 4 + n;
  return 0;
}

static long send_some(int sock, const uint8_t *buf, size_t len, const int *fds, int nfds, int flags) {
  struct iovec iov = {(void *)buf, len};
  struct msghdr m = {0};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  char cbuf[CMSG_SPACE(sizeof(int) * GML_MAX_LEASE_CHUNKS)];
  if (nfds > 0) {
    if (nfds > GML_MAX_LEASE_CHUNKS) return GML_EINVAL;
    memset(cbuf, 0, sizeof cbuf);
    m.msg_control = cbuf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
  }
  ssize_t r;
  do r = sendmsg(sock, &m, MSG_NOSIGNAL | flags);
  while (r < 0 && errno == EINTR);
  return r < 0 ? errno_to_gml(errno) : (long)r;
}

long gmli_wire_sendmsg(int sock, const uint8_t *buf, size_t len, const int *fds, int nfds) {
  return send_some(sock, buf, len, fds, nfds, 0);
}

int gmli_wire_send_until(int sock, const uint8_t *frame, size_t len, const int *fds, int nfds, uint64_t deadline_ns) {
  int bounded = deadline_ns != UINT64_MAX;
  size_t off = 0;
  while (off < len) {
    /* MSG_DONTWAIT on this call only: the socket stays blocking for the thread that receives on it */
    long r =
        send_some(sock, frame + off, len - off, off == 0 ? fds : NULL, off == 0 ? nfds : 0, bounded ? MSG_DONTWAIT : 0);
    if (r == GML_EAGAIN && bounded) { /* the buffer is full: the peer reads nothing (stopped?) */
      uint64_t now = gmli_now_ns();
      if (now >= deadline_ns) return GML_EAGAIN;
      uint64_t ms = (deadline_ns - now + 999999) / 1000000;
      if (poll(&(struct pollfd){.fd = sock, .events = POLLOUT}, 1, ms > INT_MAX ? INT_MAX : (int)ms) < 0 &&
          errno != EINTR)
        return GML_ESYS;
      continue;
    }
    if (r < 0) return r == GML_EDAEMON ? GML_EDAEMON : GML_ESYS;
    off += (size_t)r;
  }
  return 0;
}

int gmli_wire_send(int sock, const uint8_t *frame, size_t len, const int *fds, int nfds) {
  return gmli_wire_send_until(sock, frame, len, fds, nfds, UINT64_MAX);
}

/* recvmsg that appends received fds to fds[*nfds..]; fds beyond maxfds are closed
 * and make the frame a protocol error. */
static long recv_some(int sock, uint8_t *buf, size_t len, int *fds, int *nfds, int maxfds, int *overflow) {
  char cbuf[CMSG_SPACE(sizeof(int) * GML_MAX_LEASE_CHUNKS)];
  struct iovec iov = {buf, len};
  struct msghdr m = {0};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = cbuf;
  m.msg_controllen = sizeof cbuf;
  ssize_t r;
  do r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  if (r < 0) return errno_to_gml(errno);
  if (m.msg_flags & MSG_CTRUNC) *overflow = 1;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    int n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    int *in = (int *)CMSG_DATA(cm);
    for (int i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, in + i, sizeof fd);
      if (fds && *nfds < maxfds) fds[(*nfds)++] = fd;
      else {
        close(fd);
        *overflow = 1;
      }
    }
  }
  return (long)r;
}

static int recv_exact(int sock, uint8_t *buf, size_t len, int *fds, int *nfds, int maxfds, int *overflow) {
  size_t off = 0;
  while (off < len) {
    long r = recv_some(sock, buf + off, len - off, fds, nfds, maxfds, overflow);
    if (r <= 0) return GML_EDAEMON;
    off += (size_t)r;
  }
  return 0;
}

int gmli_wire_refusal_waits(int sock) { return poll(&(struct pollfd){.fd = sock, .events = POLLIN}, 1, 0) == 1; }

int gmli_wire_recv(int sock, Gmlake__Envelope **env, int *fds, int *nfds, int maxfds) {
  uint8_t hdr[4];
  int overflow = 0, rc;
  *nfds = 0;
  *env = NULL;
  if ((rc = recv_exact(sock, hdr, 4, fds, nfds, maxfds, &overflow)) != 0) goto fail;
  size_t n = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 | (size_t)hdr[3] << 24;
  if (n > GML_MAX_FRAME) {
    rc = GML_EPROTO;
    goto fail;
  }
  uint8_t *body = malloc(n ? n : 1);
  if (!body) {
    rc = GML_ENOMEM;
    goto fail;
  }
  if ((rc = recv_exact(sock, body, n, fds, nfds, maxfds, &overflow)) != 0) {
    free(body);
    goto fail;
  }
  *env = gmlake__envelope__unpack(NULL, n, body);
  free(body);
  if (!*env || overflow) {
    rc = GML_EPROTO;
    goto fail;
  }
  return 0;
fail:
  if (*env) gmlake__envelope__free_unpacked(*env, NULL);
  *env = NULL;
  for (int i = 0; i < *nfds; i++) close(fds[i]);
  *nfds = 0;
  return rc;
}

const char *gmli_wire_check_request(const Gmlake__Envelope *env, int hello_done) {
  if (env->seq == 0) return "request without a sequence number";
  if (!hello_done && env->msg_case != GMLAKE__ENVELOPE__MSG_HELLO) return "request before hello";
  switch (env->msg_case) {
  case GMLAKE__ENVELOPE__MSG_HELLO: return hello_done ? "second hello" : NULL;
  case GMLAKE__ENVELOPE__MSG_LEASE:
    if (env->lease->streamed && env->lease->optional) return "an optional lease streamed";
    return env->lease->count < 1 ||
                   env->lease->count > (env->lease->streamed ? GML_MAX_STREAM_LEASE : GML_MAX_LEASE_CHUNKS)
               ? "lease count out of range"
               : NULL;
  case GMLAKE__ENVELOPE__MSG_RET:
    return env->ret->n_chunk_ids < 1 || env->ret->n_chunk_ids > GML_MAX_LEASE_CHUNKS ? "return count out of range"
                                                                                     : NULL;
  case GMLAKE__ENVELOPE__MSG_USAGE: return NULL;
  case GMLAKE__ENVELOPE__MSG_SHARE: return env->share->n_chunk_ids < 1 ? "share of no chunk" : NULL;
  case GMLAKE__ENVELOPE__MSG_ATTACH:
    return env->attach->count > GML_MAX_LEASE_CHUNKS ? "attach count out of range" : NULL;
  case GMLAKE__ENVELOPE__MSG_DETACH: return NULL; /* the rest is checked by daemon/shares.c */
  case GMLAKE__ENVELOPE__MSG_MEM_INFO: return NULL;
  case GMLAKE__ENVELOPE__MSG_ADOPT:
    return env->adopt->n_old_ids < 1 || env->adopt->n_old_ids > GML_MAX_LEASE_CHUNKS ? "adopt count out of range"
                                                                                     : NULL;
  default: return "unexpected message kind";
  }
}

long gmli_rx_fill(gml_rx *rx, int sock) {
  if (rx->off && rx->cap - rx->len < 4096) { /* frames taken from the front: move the rest down once */
    memmove(rx->buf, rx->buf + rx->off, rx->len - rx->off);
    rx->len -= rx->off;
    rx->off = 0;
  }
  if (rx->cap - rx->len < 4096) {
    size_t cap = rx->cap ? rx->cap * 2 : 8192;
    if (cap > 2 * (GML_MAX_FRAME + 4)) cap = 2 * (GML_MAX_FRAME + 4);
    if (cap <= rx->len) return GML_EPROTO; /* a frame over the maximum is caught by rx_next first */
    uint8_t *b = realloc(rx->buf, cap);
    if (!b) return GML_ENOMEM;
    rx->buf = b;
    rx->cap = cap;
  }
  int fds[GML_MAX_LEASE_CHUNKS], nfds = 0, overflow = 0;
  long r = recv_some(sock, rx->buf + rx->len, rx->cap - rx->len, fds, &nfds, GML_MAX_LEASE_CHUNKS, &overflow);
  int saved = errno; /* GML_ESYS: the caller may log it */
  for (int i = 0; i < nfds; i++) {
    if (rx->nkept < rx->keep_max && rx->nkept < GML_MAX_LEASE_CHUNKS) {
      rx->kept[rx->nkept++] = fds[i];
      continue;
    }
    close(fds[i]);
    rx->fds_received++;
  }
  errno = saved;
  rx->fds_received += overflow;
  if (r > 0) rx->len += (size_t)r;
  return r;
}

int gmli_rx_next(gml_rx *rx, const uint8_t **body, size_t *len) {
  size_t have = rx->len - rx->off;
  if (have < 4) return 0;
  const uint8_t *h = rx->buf + rx->off;
  size_t n = (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
  if (n > GML_MAX_FRAME) return GML_EPROTO;
  if (have < 4 + n) return 0;
  *body = h + 4;
  *len = n;
  return 1;
}

/* O(1): no move per frame (a buffer of many small frames would cost its
 * square); gmli_rx_fill moves what is left down when it needs the room. */
void gmli_rx_consume(gml_rx *rx, size_t body_len) {
  rx->off += 4 + body_len;
  if (rx->off == rx->len) rx->off = rx->len = 0;
}

int gmli_rx_take_fds(gml_rx *rx, int n, int *out) {
  if (n < 0 || n > rx->nkept) return -1;
  memcpy(out, rx->kept, sizeof(int) * (size_t)n);
  memmove(rx->kept, rx->kept + n, sizeof(int) * (size_t)(rx->nkept - n));
  rx->nkept -= n;
  return 0;
}

void gmli_rx_free(gml_rx *rx) {
  for (int i = 0; i < rx->nkept; i++) close(rx->kept[i]);
  free(rx->buf);
  memset(rx, 0, sizeof *rx);
}

int gmli_share_key_owner(const char *k, char name[GML_SHARE_KEY_MAX + 1], uint32_t *uid) {
  const char *at = strrchr(k, '@');
  char *end;
  if (!at || at == k || (size_t)(at - k) > GML_SHARE_KEY_MAX || at[1] < '0' || at[1] > '9') return 0;
  errno = 0;
  unsigned long u = strtoul(at + 1, &end, 10);
  if (*end || errno || u > UINT32_MAX) return 0;
  memcpy(name, k, (size_t)(at - k));
  name[at - k] = 0;
  *uid = (uint32_t)u;
  return gmli_share_key_ok(name, NULL);
}

int gmli_share_key_ok(const char *k, size_t *bad) {
  size_t n = k ? strlen(k) : 0, at = SIZE_MAX;
  for (size_t i = 0; i < n && i <= GML_SHARE_KEY_MAX && at == SIZE_MAX; i++)
    if ((unsigned char)k[i] < 33 || (unsigned char)k[i] > 126) at = i;
  if (bad) *bad = at;
  return at == SIZE_MAX && n >= 1 && n <= GML_SHARE_KEY_MAX;
}
