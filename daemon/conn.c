/* conn.c: send queue, listening socket, process liveness and cgroup (see conn.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "conn.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
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

/* The queue's fds: n more (dup'ed) or fewer (sent or closed). */
static void count_fds(conn_txq *q, long n) {
  q->nfds += (size_t)n;
  if (q->nfds_all) *q->nfds_all += (size_t)n;
}

static void item_free(conn_txq *q, tx_item *t) {
  for (int i = 0; i < t->nfds; i++) close(t->fds[i]);
  count_fds(q, -(long)t->nfds);
  free(t->buf);
  free(t);
}

static int queue_item(conn_txq *q, uint8_t *buf, size_t len, const int *fds, int nfds) {
  tx_item *t = calloc(1, sizeof *t + sizeof(int) * (size_t)nfds);
  if (!t) {
    free(buf);
    return GML_ENOMEM;
  }
  t->buf = buf;
  t->len = len;
  for (int i = 0; i < nfds; i++) {
    if ((t->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0)) < 0) {
      item_free(q, t);
      return GML_ESYS;
    }
    t->nfds = i + 1;
    count_fds(q, 1);
  }
  t->cost = sizeof *t + sizeof(int) * (size_t)nfds + len;
  q->bytes += t->cost;
  if (q->tail) q->tail->next = t;
  else q->head = t;
  q->tail = t;
  return 0;
}

int conn_send_or_queue(conn_txq *q, int sock, const Gmlake__Envelope *env, const int *fds, int nfds, size_t fd_room) {
  uint8_t *buf;
  size_t len;
  if (gmli_wire_encode(env, &buf, &len)) return GML_ENOMEM;
  long r = q->head ? GML_EAGAIN : gmli_wire_sendmsg(sock, buf, len, fds, nfds);
  if (r == (long)len) {
    free(buf);
    return 0;
  }
  if (r > 0) { /* its fds went with the part sent: the rest waits without them */
    int rc = queue_item(q, buf, len, NULL, 0);
    if (!rc) q->tail->off = (size_t)r;
    return rc;
  }
  if (r != GML_EAGAIN || (size_t)nfds > fd_room) {
    free(buf);
    return r != GML_EAGAIN ? (int)r : CONN_NO_FD_ROOM;
  }
  return queue_item(q, buf, len, fds, nfds);
}

int conn_queue_bytes(conn_txq *q, uint8_t *frame, size_t len) { return queue_item(q, frame, len, NULL, 0); }

int conn_flush(conn_txq *q, int fd) {
  while (q->head) {
    tx_item *t = q->head;
    int first = t->off == 0;
    long r = gmli_wire_sendmsg(fd, t->buf + t->off, t->len - t->off, first ? t->fds : NULL, first ? t->nfds : 0);
    if (r == GML_EAGAIN) break;
    if (r < 0) return (int)r;
    if (first && t->nfds) { /* the peer has its own references now */
      for (int i = 0; i < t->nfds; i++) close(t->fds[i]);
      count_fds(q, -(long)t->nfds);
      t->nfds = 0;
    }
    t->off += (size_t)r;
    if (t->off < t->len) continue;
    q->head = t->next;
    if (!q->head) q->tail = NULL;
    q->bytes -= t->cost;
    item_free(q, t);
  }
  return 0;
}

void conn_txq_free(conn_txq *q) {
  while (q->head) {
    tx_item *t = q->head;
    q->head = t->next;
    item_free(q, t);
  }
  q->tail = NULL;
  q->bytes = 0;
}

int conn_claim_path(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) {
    GML_ERR("socket path too long: %s", path);
    return GML_EINVAL;
  }
  strcpy(sa.sun_path, path);
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : GML_ESYS;
  if (!S_ISSOCK(st.st_mode)) {
    GML_ERR("%s exists and is not a socket: not touching it (remove it or choose another path)", path);
    gmli_log_fatal("%s exists and is not a socket", path);
    return GML_EINVAL;
  }
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0) {
    close(probe);
    GML_ERR("another daemon already serves %s", path);
    gmli_log_fatal("another daemon already serves %s", path);
    return GML_EINVAL;
  }
  if (probe >= 0) close(probe);
  return unlink(path) == 0 || errno == ENOENT ? 0 : GML_ESYS;
}

void conn_set_mode_group(const char *path, unsigned mode, const char *group) {
  if (group[0]) {
    struct group *g = getgrnam(group);
    if (!g || chown(path, (uid_t)-1, g->gr_gid) != 0)
      GML_WARN("cannot give %s to group %s: %s", path, group, g ? strerror(errno) : "no such group");
  }
  if (chmod(path, mode) != 0) GML_WARN("chmod %s: %s", path, strerror(errno));
}

/* Clients trust a socket only where no one else could have put it
 * (client/discover.c): its own directory written by its owner alone, and no
 * directory above it written by others unless sticky (/tmp). Say so now, not
 * in every client's error (only the socket's own directory was looked at: a
 * socket in a 0755 directory under a 0777 one was refused by every client
 * while the daemon said nothing). */
static void warn_shared_dirs(const char *path) {
  char dir[PATH_MAX], real[PATH_MAX];
  gmli_path_dir(path, dir, sizeof dir);
  if (!realpath(dir, real)) return;
  size_t n = strlen(real);
  for (size_t end = 0; end <= n; end++) { /* each directory from / down to the socket's own */
    if ((end < n && real[end] != '/') || (end == n && n == 1)) continue;
    char c = real[end];
    real[end] = 0;
    struct stat st;
    const char *at = end ? real : "/";
    int own = end == n || n == 1, shared = stat(at, &st) == 0 && (st.st_mode & 022);
    if (shared && (own || !(st.st_mode & S_ISVTX))) {
      if (own)
        GML_WARN("%s is in %s, a directory others may write: clients refuse such a socket (another user could have "
                 "put it there); give it a directory of its own (e.g. /tmp/gmlake-$USER/lake.sock, mode 0755)",
                 path, at);
      else
        GML_WARN("%s lies under %s, a directory others may write (mode %04o, not sticky): clients refuse such a socket "
                 "(another user could have put another directory there); give it a directory of its own (e.g. "
                 "/tmp/gmlake-$USER/lake.sock, mode 0755)",
                 path, at, (unsigned)(st.st_mode & 07777));
      real[end] = c;
      return;
    }
    real[end] = c;
  }
}

int conn_listen_unix(const char *path, unsigned mode, const char *group) {
  int rc = conn_claim_path(path);
  if (rc) return rc;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return GML_ESYS;
  mode_t old = umask(0177);
  rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
  umask(old);
  if (rc != 0) {
    GML_ERR("bind %s: %s", path, strerror(errno));
    close(fd);
    return GML_ESYS;
  }
  conn_set_mode_group(path, mode, group);
  warn_shared_dirs(path);
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

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5 */
#endif
/* The pid a pidfd stands for (its fdinfo's "Pid:": -1 once exited and reaped), 0 if unknown. */
static pid_t pidfd_pid(int fd) {
  char path[64], line[128];
  pid_t pid = 0;
  snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
  FILE *f = fopen(path, "re");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Pid:", 4)) {
      pid = (pid_t)atoi(line + 4);
      break;
    }
  if (f) fclose(f);
  return pid;
}

int conn_peer_pidfd(int sock, pid_t pid, int *gone) {
  int fd = -1;
  socklen_t len = sizeof fd;
  *gone = 0;
  if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0) {
    pid_t p = pidfd_pid(fd);
    if (p == pid) return fd; /* the process SO_PEERCRED names (a socket pair's creator is another) */
    close(fd);
    if (p == -1) *gone = 1;
    return p == -1 ? -1 : conn_pidfd_open(pid);
  }
  if (errno == ESRCH || errno == EINVAL) { /* the kernel knows the option: its process has exited */
    *gone = 1;
    return -1;
  }
  return conn_pidfd_open(pid); /* an older kernel (ENOPROTOOPT) */
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
  char path[64], line[GML_QUOTA_CGROUP_MAX + 8];
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

/* Its cgroup v1 lines ("CONTROLLERS:PATH\n" each, the hierarchy's number left out), as many as fit in len. */
void gmli_conn_process_cgroup_v1(pid_t pid, char *out, size_t len) {
  char path[64], line[GML_QUOTA_CGROUP_MAX + 128];
  size_t n = 0;
  out[0] = 0;
  snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    char *ctrl = strchr(line, ':');
    if (!ctrl || ctrl[1] == ':') continue; /* v2's "0::PATH" (or a line of none) */
    ctrl++;
    line[strcspn(line, "\n")] = 0;
    for (char *p = ctrl; *p; p++) /* shown and used as a label: printable only */
      if ((unsigned char)*p < 32 || (unsigned char)*p > 126 || *p == '"' || *p == '\\') *p = '?';
    size_t k = strlen(ctrl);
    if (n + k + 2 > len) continue;
    memcpy(out + n, ctrl, k);
    out[n + k] = '\n';
    out[n += k + 1] = 0;
  }
  fclose(f);
}

/* Where the v1 hierarchy of controller (as /proc/PID/cgroup names it: "freezer", "name=systemd") is mounted. */
static int cgroup1_mount(const char *controller, char *out, size_t len) {
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f) return 0;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) { /* ... - cgroup SOURCE SUPER_OPTIONS (rw,freezer) */
    char mnt[1024], opts[1024], *dash = strstr(line, " - ");
    if (!dash || strncmp(dash + 3, "cgroup ", 7) || sscanf(dash + 3, "%*s %*s %1023s", opts) != 1 ||
        sscanf(line, "%*s %*s %*s %*s %1023s", mnt) != 1 || strlen(mnt) >= len)
      continue;
    for (char *tok = strtok(opts, ","); tok && !found; tok = strtok(NULL, ","))
      if (!strcmp(tok, controller)) found = 1;
    if (found) snprintf(out, len, "%s", mnt);
  }
  fclose(f);
  return found;
}

/* Where the cgroup2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host):
 * 0 when nothing is (cgroup v1 only). */
static int cgroup2_mount(char *out, size_t len) {
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f) return 0;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) { /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS... - FSTYPE SOURCE ... */
    char mnt[1024], *dash = strstr(line, " - ");
    if (dash && !strncmp(dash + 3, "cgroup2 ", 8) && sscanf(line, "%*s %*s %*s %*s %1023s", mnt) == 1 &&
        strlen(mnt) < len) {
      snprintf(out, len, "%s", mnt);
      found = 1;
    }
  }
  fclose(f);
  return found;
}

int conn_cgroup_check(const char *path, char *why, size_t len) {
  char mnt[1024], full[1024 + GML_QUOTA_CGROUP_MAX];
  struct stat st;
  if (path[0] != '/') { /* CONTROLLER:/PATH, a v1 hierarchy's */
    char controller[72];
    const char *colon = strchr(path, ':');
    snprintf(controller, sizeof controller, "%.*s", colon ? (int)GML_MIN((size_t)(colon - path), 71) : 0, path);
    if (!colon || !cgroup1_mount(controller, mnt, sizeof mnt)) {
      snprintf(why, len, "this host mounts no cgroup v1 hierarchy of %.70s", controller);
      return GML_EINVAL;
    }
    path = colon + 1;
  } else if (!cgroup2_mount(mnt, sizeof mnt)) {
    snprintf(why, len,
             "this host mounts no cgroup v2 hierarchy (cgroup v1 only), so no client's cgroup can be told: "
             "give uid: or PID quotas");
    return GML_EINVAL;
  }
  snprintf(full, sizeof full, "%s%s", mnt, strcmp(path, "/") ? path : "");
  if (stat(full, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(why, len, "no cgroup %.200s on this host (no directory %.400s)", path, full);
    return GML_EINVAL;
  }
  return 0;
}

/* ---------- a user's share of the log ---------- */

#define LOG_USERS 256 /* users tracked at once; the one heard from last the longest ago makes room */
#define LOG_BURST 40  /* lines about one user's connections at once */
#define LOG_PER_S 10  /* ... and a second after that */

static struct log_budget {
  uint32_t uid;
  int used;
  double tokens;
  uint64_t at_ns, dropped;
} logb[LOG_USERS];

static void log_dropped(struct log_budget *b) {
  if (b->dropped)
    GML_WARN("uid %u: %llu log line(s) about its connections left out (over %d a second)", (unsigned)b->uid,
             (unsigned long long)b->dropped, LOG_PER_S);
  b->dropped = 0;
}

int conn_log_ok(uint32_t uid) {
  uint64_t now = gmli_now_ns();
  struct log_budget *b = NULL, *lru = &logb[0];
  for (int i = 0; i < LOG_USERS && !b; i++) {
    if (logb[i].used && logb[i].uid == uid) b = &logb[i];
    else if (lru->used && (!logb[i].used || logb[i].at_ns < lru->at_ns))
      lru = &logb[i]; /* a free one, else the oldest */
  }
  if (!b) {
    b = lru;
    if (b->used) log_dropped(b);
    *b = (struct log_budget){uid, 1, LOG_BURST, now, 0};
  }
  b->tokens += (double)(now - b->at_ns) / 1e9 * LOG_PER_S;
  if (b->tokens > LOG_BURST) b->tokens = LOG_BURST;
  b->at_ns = now;
  if (b->tokens < 1) {
    b->dropped++;
    return 0;
  }
  b->tokens -= 1;
  log_dropped(b);
  return 1;
}

void conn_log_tick(void) {
  uint64_t now = gmli_now_ns();
  for (int i = 0; i < LOG_USERS; i++)
    if (logb[i].used && logb[i].dropped && now - logb[i].at_ns > 1000000000ull) log_dropped(&logb[i]);
}
