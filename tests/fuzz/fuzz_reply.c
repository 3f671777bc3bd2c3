/* fuzz_reply.c: libFuzzer target for the client's side of the socket: a
 * fake daemon plays the input back to a real client (gml_open in daemon mode,
 * then allocations, frees, a flush and gml_close), so every byte the client
 * reads goes through gmli_wire_recv, the hello/lease/return reply checks and
 * the handling of unsolicited messages in client/client.c.
 *
 * Input: records of [flags][len lo][len hi][len bytes]; each record is one
 * sendmsg of those bytes, with (flags & 7) host-backend chunk fds (memfds of
 * 2 MiB) attached when flags & 8. After the last record the fake daemon
 * shuts its side down, so the client sees EOF and every call ends. */
#include "gmlake.h"
#include "log.h"
#include "wire.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static char dir[64], path[128];
static int listen_fd = -1;

typedef struct play {
  const uint8_t *data;
  size_t size;
} play;

static int chunk_fd(void) {
  int fd = memfd_create("gml-fuzz-chunk", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, 2 << 20)) abort();
  return fd;
}

static void *fake_daemon(void *arg) {
  play *p = arg;
  int s = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (s < 0) abort();
  size_t off = 0;
  while (off + 3 <= p->size) {
    uint8_t flags = p->data[off];
    size_t len = (size_t)p->data[off + 1] | (size_t)p->data[off + 2] << 8;
    off += 3;
    if (len > p->size - off) len = p->size - off;
    int fds[7], nfds = flags & 8 ? flags & 7 : 0;
    for (int i = 0; i < nfds; i++) fds[i] = chunk_fd();
    long r = len ? gmli_wire_sendmsg(s, p->data + off, len, fds, nfds) : 0;
    for (int i = 0; i < nfds; i++) close(fds[i]);
    if (r < 0) break; /* the client hung up */
    off += len;
  }
  shutdown(s, SHUT_WR);
  /* read what the client sends until it closes, so its sends never block */
  uint8_t tmp[4096];
  while (recv(s, tmp, sizeof tmp, 0) > 0) {}
  close(s);
  return NULL;
}

static void setup(void) {
  gmli_log_set_level(GML_LOG_ERROR - 1);
  snprintf(dir, sizeof dir, "/tmp/gml-fuzz-reply-XXXXXX");
  if (!mkdtemp(dir)) abort();
  snprintf(path, sizeof path, "%s/d.sock", dir);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&sa, sizeof sa) || listen(listen_fd, 4)) abort();
  setenv("GMLAKE_VA_SIZE", "256MiB", 1); /* small reservations: many of them per second */
  setenv("GMLAKE_RECONNECT", "0", 1);    /* the fake daemon's EOF is the end, not a restart to reconnect to */
}

static void cleanup(void) {
  unlink(path);
  rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (listen_fd < 0) {
    setup();
    atexit(cleanup);
  }
  play p = {data, size};
  pthread_t t;
  if (pthread_create(&t, NULL, fake_daemon, &p)) abort();
  gml_open_opts o = {0};
  o.socket_path = path;
  o.mode = GML_MODE_DAEMON;
  o.backend = "host";
  gml_client *c = NULL;
  if (gml_open(&o, &c) == 0) {
    void *ptr[4] = {0};
    static const size_t sizes[4] = {1 << 20, 3 << 20, 512, 9 << 20};
    for (int i = 0; i < 4; i++)
      if (gml_alloc(c, sizes[i], 0, &ptr[i])) ptr[i] = NULL;
    gml_free(c, ptr[1]);
    size_t released;
    gml_trim(c, &released);
    gml_flush(c);
    gml_stats st;
    gml_stats_get(c, &st);
    for (int i = 0; i < 4; i++)
      if (ptr[i] && i != 1) gml_free(c, ptr[i]);
    gml_close(c);
  }
  pthread_join(t, NULL);
  return 0;
}
