/* discover.c: finding and verifying the daemon a client connects to (the
 * rules are in discover.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "discover.h"
#include "options.h"
#include "util.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int gml_daemon_candidates(int device, const char *named, char out[][GML_PATH_MAX]) {
  if (named && *named) { /* "%d" in it stands for the device: one setting for every GPU of a process */
    const char *d = strstr(named, "%d");
    if (d) snprintf(out[0], GML_PATH_MAX, "%.*s%d%s", (int)(d - named), named, device, d + 2);
    else snprintf(out[0], GML_PATH_MAX, "%s", named);
    return 1;
  }
  int n = 0;
  snprintf(out[n++], GML_PATH_MAX, "%s/gmlake-%d.sock", GML_SYSTEM_RUNTIME_DIR, device);
  const char *x = gml_env(GML_ENV_XDG_RUNTIME_DIR);
  if (x && *x == '/') snprintf(out[n++], GML_PATH_MAX, "%s/gmlake-%d.sock", x, device);
  return n;
}

/* 0 when path may be trusted, else -1 with the reason in why. */
static int check_socket(const char *path, uid_t *owner, char *why, size_t len) {
  char dir[GML_PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  struct stat ds, ss;
  if (stat(dir, &ds) != 0) {
    snprintf(why, len, "%s: %s", dir, strerror(errno));
    return -1;
  }
  if (ds.st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(why, len, "%s is writable by %s (mode %04o): anyone could have put a socket there", dir,
             ds.st_mode & S_IWOTH ? "everyone" : "its group", (unsigned)(ds.st_mode & 07777));
    return -1;
  }
  if (lstat(path, &ss) != 0) {
    snprintf(why, len, "%s", strerror(errno));
    return -1;
  }
  if (!S_ISSOCK(ss.st_mode)) {
    snprintf(why, len, "not a socket");
    return -1;
  }
  if (ss.st_uid != 0 && ss.st_uid != geteuid() && ss.st_uid != ds.st_uid) {
    snprintf(why, len, "the socket belongs to uid %u, neither root, this user (%u) nor the owner of %s (%u)",
             (unsigned)ss.st_uid, (unsigned)geteuid(), dir, (unsigned)ds.st_uid);
    return -1;
  }
  *owner = ss.st_uid;
  return 0;
}

/* Connect and check who answered. Returns the socket or -1. */
static int connect_verified(const char *path, uid_t owner, char *why, size_t len, int *refused) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) {
    snprintf(why, len, "path too long for a socket");
    return -1;
  }
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) {
    snprintf(why, len, "socket: %s", strerror(errno));
    return -1;
  }
  if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    char hint[256];
    if (e == EACCES && gml_socket_access_hint(path, hint, sizeof hint) == 0) /* the daemon is there; this login is not in its socket's group */
      snprintf(why, len, "%s: %s", strerror(EACCES), hint);
    else snprintf(why, len, "%s", strerror(e));
    close(s);
    return -1;
  }
  struct ucred cred;
  socklen_t cl = sizeof cred;
  if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
    snprintf(why, len, "SO_PEERCRED: %s", strerror(errno));
    close(s);
    return -1;
  }
  if (cred.uid != 0 && cred.uid != owner) {
    snprintf(why, len, "the process serving it (pid %d) runs as uid %u, neither root nor the socket's owner (%u)",
             (int)cred.pid, (unsigned)cred.uid, (unsigned)owner);
    *refused = 1;
    close(s);
    return -1;
  }
  return s;
}

int gml_daemon_connect(int device, const char *named, char *path_out, size_t path_len, char *why, size_t why_len,
                       int *refused) {
  char cand[2][GML_PATH_MAX];
  int n = gml_daemon_candidates(device, named, cand);
  size_t off = 0;
  why[0] = 0;
  *refused = 0;
  for (int i = 0; i < n; i++) {
    char reason[1024];
    uid_t owner = 0;
    int s = -1;
    if (check_socket(cand[i], &owner, reason, sizeof reason) == 0) s = connect_verified(cand[i], owner, reason, sizeof reason, refused);
    else if (access(cand[i], F_OK) == 0) *refused = 1; /* something is there, and we do not trust it */
    if (s >= 0) {
      snprintf(path_out, path_len, "%s", cand[i]);
      return s;
    }
    int w = snprintf(why + off, why_len - off, "%s%s (%s)", i ? "; " : "", cand[i], reason);
    if (w > 0) off += (size_t)w < why_len - off ? (size_t)w : why_len - off - 1;
  }
  return -1;
}
