/* Pid quotas last as long as their process (pidquota.h). */
#include "pidquota.h"
#include "conn.h"
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct pid_watch {
  struct pid_watch *next;
  gmld *d;
  pid_t pid;
  int pidfd;
  uv_poll_t poll;
} pid_watch;

static void watch_free(uv_handle_t *h) { free(h->data); }

static void unlink_watch(gmld *d, pid_watch *w) {
  for (pid_watch **pp = &d->pid_watches; *pp; pp = &(*pp)->next)
    if (*pp == w) {
      *pp = w->next;
      break;
    }
  uv_poll_stop(&w->poll);
  close(w->pidfd);
  uv_close((uv_handle_t *)&w->poll, watch_free);
}

static void on_exit_cb(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  pid_watch *w = h->data;
  gmld *d = w->d;
  for (size_t i = 0; i < d->lk.nquotas; i++)
    if (d->lk.quotas[i].by_uid == LAKE_QUOTA_PID && d->lk.quotas[i].key == (uint32_t)w->pid)
      GML_INFO("process %d exited: its quota of %llu bytes is dropped", (int)w->pid,
               (unsigned long long)d->lk.quotas[i].bytes);
  lake_set_quota(&d->lk, 0, (uint32_t)w->pid, 0);
  unlink_watch(d, w);
}

int pidquota_watch(gmld *d, pid_t pid) {
  if (pid <= 0) return GML_EINVAL;
  for (pid_watch *w = d->pid_watches; w; w = w->next)
    if (w->pid == pid) return 0;
  int fd = conn_pidfd_open(pid);
  if (fd < 0) return errno == ESRCH ? GML_ENOENT : GML_ESYS;
  pid_watch *w = calloc(1, sizeof *w);
  if (!w) {
    close(fd);
    return GML_ENOMEM;
  }
  w->d = d;
  w->pid = pid;
  w->pidfd = fd;
  if (uv_poll_init(d->loop, &w->poll, fd) != 0) {
    close(fd);
    free(w);
    return GML_ESYS;
  }
  w->poll.data = w;
  uv_poll_start(&w->poll, UV_READABLE, on_exit_cb);
  w->next = d->pid_watches;
  d->pid_watches = w;
  return 0;
}

/* The thread group (process) that pid belongs to, from /proc/PID/status
 * (a tid has one there too, though /proc does not list it); -1 if unknown. */
static pid_t thread_group_of(pid_t pid) {
  char path[64], line[128];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  pid_t tgid = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "Tgid:", 5)) {
      tgid = (pid_t)atoi(line + 5);
      break;
    }
  fclose(f);
  return tgid;
}

const char *pidquota_why(pid_t pid, int rc, char *why, size_t len) {
  pid_t tgid = rc == GML_ENOENT ? -1 : thread_group_of(pid);
  if (rc == GML_ENOENT)
    snprintf(why, len,
             "no process %d: a pid quota holds for a living process (uid: or cgroup: for one not started yet)",
             (int)pid);
  else if (tgid > 0 && tgid != pid) /* pidfd_open takes a process, not one of its threads */
    snprintf(why, len, "%d is a thread of process %d: a pid quota is set for the process", (int)pid, (int)tgid);
  else snprintf(why, len, "cannot watch process %d: %s", (int)pid, gml_strerror(rc));
  return why;
}

void pidquota_unwatch(gmld *d, pid_t pid) {
  for (pid_watch *w = d->pid_watches; w; w = w->next)
    if (w->pid == pid) {
      unlink_watch(d, w);
      return;
    }
}

void pidquota_close_all(gmld *d) {
  while (d->pid_watches) unlink_watch(d, d->pid_watches);
}
