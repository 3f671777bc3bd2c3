/* fuzz_session.c: libFuzzer target for what the daemon does with a
 * client's frames past the wire checks (fuzz_frame): the session's request
 * table and handlers (daemon/dispatch.c over session.c: hello, lease, return, usage),
 * shares (daemon/shares.c: share, attach, detach) and the restart hand-over
 * (daemon/adopt.c), on a lake of the host backend, through the real event
 * loop. The input goes down a Unix socket pair in pieces (sizes drawn from
 * its first byte); bit 0 of that byte sends fds with the byte after the
 * first frame, as a client that adopts sends them with its Adopt: a real
 * chunk of this uid (adoptable), a pipe and a chunk the lake holds (both
 * refused), which one first from bits 1-2. Then the
 * client hangs up; the session must close and every chunk come back. Each
 * input starts from a lake of the same 8 free chunks (ids (1 << 32) | 1..8),
 * so a crash reproduces alone. FUZZ_LOG=1 in the environment prints the
 * daemon's log (info) while it runs inputs. */
#include "daemon.h"
#include "dispatch.h"
#include "session.h"
#include "shares.h"
#include "gmlake.h"
#include "log.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static gmld *d;
static pid_t dead_pid; /* a client whose process is gone: its chunks come back when it leaves */

/* The chunk creator is not under test: refills are what the harness does. */
void creator_make(creator *cr, uint64_t n) { (void)cr, (void)n; }

static void fresh_lake(void) {
  lake_destroy(&d->lk);
  lake_init(&d->lk, d->be, 16 * d->be->chunk_size);
  while (d->lk.total < 8) {
    gml_phys phys;
    int fd = -1;
    if (d->be->ops->chunk_create(d->be, &phys, &fd) || lake_add_created(&d->lk, phys, fd)) abort();
  }
}

static void setup(void) {
  gmli_log_set_level(getenv("FUZZ_LOG") ? GML_LOG_INFO : GML_LOG_ERROR - 1); /* quiet: the fuzzer prints its own */
  d = calloc(1, sizeof *d);
  char msg[256];
  if (!d || gmli_backend_open("host", 0, NULL, &d->be, msg, sizeof msg)) abort();
  d->loop = uv_default_loop();
  lake_init(&d->lk, d->be, 16 * d->be->chunk_size);
  gmlake__lake_stats__init(&d->counters);
  broker_init(&d->br, &d->lk, &d->counters, 0, 0);
  d->device_total = 64 * d->be->chunk_size;
  d->listen_fd = -1;
  d->instance = 42;
  dispatch_start(d); /* the protocol's hooks, as gmlaked installs them */
  d->cfg.send_queue_max = 1 << 20;
  d->cfg.read_budget = 64;
  d->cfg.hello_timeout_ms = d->cfg.frame_timeout_ms = 5000;
  pid_t p = fork();
  if (p == 0) _exit(0);
  /* exited, not reaped: a zombie keeps its pid (its pidfd says it exited), so
   * no later process takes it during a long run (pids wrapped in one: a live
   * process got it and the harness's chunks were parked) */
  siginfo_t si;
  if (p < 0 || waitid(P_PID, (id_t)p, &si, WEXITED | WNOWAIT) != 0) abort();
  dead_pid = p;
}

/* Replies (and the fds of lease and attach replies) are read and dropped. */
static void drain(int s) {
  uint8_t buf[8192];
  char cbuf[CMSG_SPACE(sizeof(int) * GML_MAX_LEASE_CHUNKS)];
  for (;;) {
    struct iovec iov = {buf, sizeof buf};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    if (recvmsg(s, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) <= 0) return;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
      int n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < n; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        close(fd);
      }
    }
  }
}

static void turn(int peer) {
  for (int i = 0; i < 4; i++) {
    uv_run(d->loop, UV_RUN_NOWAIT);
    drain(peer);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!d) setup();
  if (size < 1) return 0;
  fresh_lake();
  uint8_t flags = data[0];
  uint32_t rng = data[0] * 2654435761u + 1;
  data++, size--;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) abort();
  struct ucred cred = {.pid = dead_pid, .uid = 1000, .gid = 1000};
  if (session_open(d, sv[0], &cred)) abort();
  int fds[3] = {-1, -1, -1}, nfds = 0, lake_fd = d->lk.chunks[0].fd;
  gml_phys own = 0;
  if (flags & 1) {
    int p[2];
    if (d->be->ops->chunk_create(d->be, &own, &fds[0]) || pipe(p)) abort();
    close(p[1]);
    fds[1] = p[0];
    fds[2] = lake_fd;
    nfds = 3;
    int first = (flags >> 1) % 3, tmp = fds[0];
    fds[0] = fds[first], fds[first] = tmp;
  }
  /* the fds ride with the byte after the first frame (a hello: as a client sends them with its Adopt) */
  size_t off = 0, fd_at = size >= 4 ? 4 + ((size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16) : size;
  if (fd_at >= size) fd_at = 0;
  while (off < size && d->br.nclients) {
    rng = rng * 1103515245u + 12345u;
    size_t piece = 1 + (rng >> 16) % 8192;
    if (piece > size - off) piece = size - off;
    if (nfds && off < fd_at && off + piece > fd_at) piece = fd_at - off;
    long w = off == fd_at && nfds ? gmli_wire_sendmsg(sv[1], data + off, piece, fds, nfds)
                                  : send(sv[1], data + off, piece, MSG_NOSIGNAL);
    if (w <= 0) break; /* closed by the daemon, or its buffer full: the rest does not matter */
    off += (size_t)w;
    turn(sv[1]);
  }
  shutdown(sv[1], SHUT_WR); /* the client leaves */
  for (int i = 0; i < 64 && d->br.nclients; i++) turn(sv[1]);
  if (d->br.nclients || d->br.parked || d->parked || d->shares) abort(); /* its process is gone: nothing of it stays */
  for (uint32_t i = 0; i < d->lk.nslots; i++)
    if (d->lk.chunks[i].state == CHUNK_LEASED || d->lk.chunks[i].state == CHUNK_PARKED) abort();
  close(sv[1]);
  for (int i = 0; i < nfds; i++) /* ours (the daemon has its own copies); the lake's stays the lake's */
    if (fds[i] != lake_fd) close(fds[i]);
  if (flags & 1) d->be->ops->chunk_release(d->be, own);
  for (int i = 0; i < 4; i++) uv_run(d->loop, UV_RUN_NOWAIT); /* the session's handle closed, freed */
  return 0;
}
