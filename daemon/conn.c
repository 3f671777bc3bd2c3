/* conn.c: send queue, listening socket, process liveness and cgroup (see conn.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "conn.h"
#include "gmlake.h"
#include "log.h"
#include <errno.h>
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
#include <unistd.h>

int conn_queue(conn_txq *q, const Gmlake__Envelope *env, const int *fds, int nfds) {
  tx_item *t = calloc(1, sizeof *t);
  if (!t) return GML_ENOMEM;
  if (gml_wire_encode(env, &t->buf, &t->len)) {
    free(t);
    return GML_ENOMEM;
  }
  if (nfds) memcpy(t->fds, fds, sizeof(int) * (size_t)nfds);
  t->nfds = nfds;
  if (q->tail) q->tail->next = t;
  else q->head = t;
  q->tail = t;
  return 0;
}

int conn_flush(conn_txq *q, int fd) {
  while (q->head) {
    tx_item *t = q->head;
    long r = gml_wire_sendmsg(fd, t->buf + t->off, t->len - t->off, t->off == 0 ? t->fds : NULL, t->off == 0 ? t->nfds : 0);
    if (r == GML_EAGAIN) break;
    if (r < 0) return -1;
    t->off += (size_t)r;
    if (t->off < t->len) continue;
    q->head = t->next;
    if (!q->head) q->tail = NULL;
    free(t->buf);
    free(t);
  }
  return 0;
}

void conn_txq_free(conn_txq *q) {
  while (q->head) {
    tx_item *t = q->head;
    q->head = t->next;
    free(t->buf);
    free(t);
  }
  q->tail = NULL;
}

int conn_listen_unix(const char *path, unsigned mode, const char *group) {
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
  if (group[0]) {
    struct group *g = getgrnam(group);
    if (!g || chown(path, (uid_t)-1, g->gr_gid) != 0)
      GML_WARN("cannot give %s to group %s: %s", path, group, g ? strerror(errno) : "no such group");
  }
  if (chmod(path, mode) != 0) GML_WARN("chmod %s: %s", path, strerror(errno));
  if (listen(fd, 128) != 0) {
    close(fd);
    return GML_ESYS;
  }
  return fd;
}

int conn_pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return (int)syscall(SYS_pidfd_open, pid, 0);
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

int conn_process_gone(int pidfd, pid_t pid) {
  if (pidfd >= 0) {
    struct pollfd p = {pidfd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
  }
  return kill(pid, 0) != 0 && errno == ESRCH;
}

/* The cgroup of pid: the cgroup v2 (unified) line "0::PATH" of
 * /proc/PID/cgroup; "" when there is none (v1 only) or it cannot be read. */
void conn_process_cgroup(pid_t pid, char *out, size_t len) {
  char path[64], line[512];
  out[0] = 0;
  snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "0::", 3)) continue;
    line[strcspn(line, "\n")] = 0;
    if (strlen(line + 3) < len) snprintf(out, len, "%s", line + 3);
    for (char *p = out; *p; p++) /* shown and used as a label: printable only */
      if ((unsigned char)*p < 32 || (unsigned char)*p > 126 || *p == '"' || *p == '\\') *p = '?';
    break;
  }
  fclose(f);
}
