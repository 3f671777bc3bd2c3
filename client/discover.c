/* discover.c: finding and verifying the daemon a client connects to (the
 * rules are in discover.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "discover.h"
#include "gpuname.h"
#include "options.h"
#include "util.h"
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int gmli_daemon_candidates(int device, const char *uuid, const char *named, char out[][GML_PATH_MAX]) {
  char ordinal[16];
  snprintf(ordinal, sizeof ordinal, "%d", device);
  if (named && *named) { /* "%d" in it stands for the device: one setting for every GPU of a process */
    gmli_socket_of_device(named, ordinal, out[0], GML_PATH_MAX);
    return 1;
  }
  int n = 0;
  const char *x = gmli_env(GML_ENV_XDG_RUNTIME_DIR),
             *names[2] = {uuid && gmli_device_name_ok(uuid) ? uuid : NULL, ordinal};
  for (int i = 0; i < 2; i++) {
    if (!names[i]) continue;
    snprintf(out[n++], GML_PATH_MAX, "%s/gmlake-%s.sock", GML_SYSTEM_RUNTIME_DIR, names[i]);
    if (x && *x == '/') snprintf(out[n++], GML_PATH_MAX, "%s/gmlake-%s.sock", x, names[i]);
  }
  return n;
}

#define GML_WALK_MAX 4096
#define GML_SYMLINKS_MAX 32

/* Whom the walk trusts: root, the caller, and the system daemon's user once
 * the path has gone through /run/gmlake (root made that directory and gave
 * it to that user). */
typedef struct {
  uid_t self, service;
  int has_service;
} trust_set;

static int trusts(const trust_set *t, uid_t u) { return u == 0 || u == t->self || (t->has_service && u == t->service); }

/* Says why into why; -1. (Long paths are cut at len.) */
__attribute__((format(printf, 3, 4))) static int refuse(char *why, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, len, fmt, ap);
  va_end(ap);
  return -1;
}

static const char *writers(mode_t m) { return m & S_IWOTH ? "everyone" : "its group"; }

/* A directory others may write to: sticky ones (/tmp) only let them add names. */
static int shared_dir(const struct stat *st) { return (st->st_mode & (S_IWGRP | S_IWOTH)) != 0; }

/* 0 when path may be trusted (*owner: the socket's owner), else -1 with the
 * reason in why. The path is walked from / as the kernel will resolve it,
 * symlinks followed by hand, and every directory on the way must be one only
 * trusted users could have changed:
 *   - it belongs to root or the caller; or it is /run/gmlake in a directory
 *     only root may write (/run), and then its owner is the system daemon's
 *     user, trusted from there on;
 *   - nobody else may write it, except a sticky directory (/tmp): there
 *     anyone may add a name but only its owner replace it, so the entry taken
 *     from it (directory or symlink) must belong to root or the caller; a name
 *     another user made there proves nothing, it may be a squatter's;
 *   - the socket's own directory may not be written by others at all.
 * The socket itself belongs to a trusted user. Whoever could replace a piece
 * of the path is then trusted already, so connecting to the same path right
 * after reaches the same socket. */
static int check_socket(const char *path, uid_t *owner, char *why, size_t len) {
  trust_set t = {.self = geteuid()};
  char todo[GML_WALK_MAX], done[GML_WALK_MAX] = "", entry[GML_WALK_MAX], target[GML_WALK_MAX];
  if (path[0] == '/') snprintf(todo, sizeof todo, "%s", path);
  else { /* relative: walked from / all the same, through the working directory */ char cwd[GML_WALK_MAX];
    if (!getcwd(cwd, sizeof cwd)) return refuse(why, len, "getcwd: %s", strerror(errno));
    if (snprintf(todo, sizeof todo, "%s/%s", cwd, path) >= (int)sizeof todo)
      return refuse(why, len, "%s", strerror(ENAMETOOLONG));
  }
  struct stat cur; /* the directory `done` ("" is /) */
  if (stat("/", &cur) != 0) return refuse(why, len, "/: %s", strerror(errno));
  if (!trusts(&t, cur.st_uid))
    return refuse(why, len, "/ belongs to uid %u, neither root nor this user (%u)", (unsigned)cur.st_uid,
                  (unsigned)t.self);
  int links = 0;
  char *next = todo;
  for (;;) {
    while (*next == '/') next++;
    if (!*next) return refuse(why, len, "not a socket"); /* the path names a directory */
    char *comp = next, *slash = strchr(next, '/');
    next = slash ? slash + 1 : next + strlen(next);
    if (slash) *slash = 0;
    int last = !next[strspn(next, "/")];
    const char *dir = *done ? done : "/";
    if (!strcmp(comp, ".")) continue;
    if (!strcmp(comp, "..")) { /* done holds no symlink: its parent is its parent, checked on the way in */
      char *up = strrchr(done, '/');
      if (up) *up = 0;
      if (stat(*done ? done : "/", &cur) != 0) return refuse(why, len, "%s: %s", *done ? done : "/", strerror(errno));
      continue;
    }
    if (snprintf(entry, sizeof entry, "%s/%s", done, comp) >= (int)sizeof entry)
      return refuse(why, len, "%s", strerror(ENAMETOOLONG));
    struct stat st;
    int found = lstat(entry, &st) == 0, e = errno;
    int leaf = found ? !S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode) : last; /* the socket, or where it would be */
    if (shared_dir(&cur) && (leaf || !(cur.st_mode & S_ISVTX)))
      return refuse(why, len, "%s is writable by %s (mode %04o): anyone could have put %s there", dir,
                    writers(cur.st_mode), (unsigned)(cur.st_mode & 07777),
                    leaf ? "a socket" : "another directory or symlink");
    if (!found) return last ? refuse(why, len, "%s", strerror(e)) : refuse(why, len, "%s: %s", entry, strerror(e));
    if (shared_dir(&cur) && st.st_uid != 0 && st.st_uid != t.self) /* sticky: anyone may have made this name */
      return refuse(
          why, len,
          "%s belongs to uid %u, neither root nor this user (%u), and lies in %s, which %s may write (mode %04o): "
          "anyone may create a name there, so that it exists proves nothing",
          entry, (unsigned)st.st_uid, (unsigned)t.self, dir, writers(cur.st_mode), (unsigned)(cur.st_mode & 07777));
    if (S_ISLNK(st.st_mode)) { /* its directory is trusted, so is what it says: go on from its target */
      ssize_t n = readlink(entry, target, sizeof target - 1);
      if (n < 0) return refuse(why, len, "%s: %s", entry, strerror(errno));
      if (++links > GML_SYMLINKS_MAX) return refuse(why, len, "%s: %s", entry, strerror(ELOOP));
      target[n] = 0;
      char rest[GML_WALK_MAX];
      if (snprintf(rest, sizeof rest, "%s/%s", target, next) >= (int)sizeof rest)
        return refuse(why, len, "%s", strerror(ENAMETOOLONG));
      memcpy(todo, rest, sizeof todo);
      next = todo;
      if (target[0] == '/') {
        done[0] = 0;
        if (stat("/", &cur) != 0) return refuse(why, len, "/: %s", strerror(errno));
      }
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      if (!trusts(&t, st.st_uid)) {
        /* only root could have made /run/gmlake (RuntimeDirectory=, given to the service
           user with User=): its owner is the system daemon's user */
        if (strcmp(entry, GML_SYSTEM_RUNTIME_DIR) != 0 || cur.st_uid != 0 || shared_dir(&cur))
          return refuse(why, len,
                        "%s belongs to uid %u, neither root nor this user (%u): that user could put any socket there",
                        entry, (unsigned)st.st_uid, (unsigned)t.self);
        t.service = st.st_uid;
        t.has_service = 1;
      }
      memcpy(done, entry, sizeof done);
      cur = st;
      continue;
    }
    if (!last) return refuse(why, len, "%s: %s", entry, strerror(ENOTDIR));
    if (!S_ISSOCK(st.st_mode)) return refuse(why, len, "not a socket");
    if (!trusts(&t, st.st_uid)) {
      if (t.has_service)
        return refuse(why, len, "the socket belongs to uid %u, neither root, this user (%u) nor the owner of %s (%u)",
                      (unsigned)st.st_uid, (unsigned)t.self, GML_SYSTEM_RUNTIME_DIR, (unsigned)t.service);
      return refuse(why, len, "the socket belongs to uid %u, neither root nor this user (%u)", (unsigned)st.st_uid,
                    (unsigned)t.self);
    }
    *owner = st.st_uid;
    return 0;
  }
}

int gmli_socket_path_trusted(const char *path, char *why, size_t why_len, int *missing) {
  uid_t owner;
  struct stat st;
  if (check_socket(path, &owner, why, why_len) == 0) return 0;
  *missing = lstat(path, &st) != 0 && errno == ENOENT;
  return -1;
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
    if (e == EACCES && gmli_socket_access_hint(path, hint, sizeof hint) ==
                           0) /* the daemon is there; this login is not in its socket's group */
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

int gmli_daemon_dial(const char *path, char *why, size_t why_len, int *refused) {
  uid_t owner = 0;
  if (check_socket(path, &owner, why, why_len) == 0) return connect_verified(path, owner, why, why_len, refused);
  if (access(path, F_OK) == 0) *refused = 1; /* something is there, and we do not trust it */
  return -1;
}

void gmli_why_add(char *why, size_t len, const char *path, const char *reason) {
  size_t off = strnlen(why, len);
  if (off < len) snprintf(why + off, len - off, "%s%s (%s)", off ? "; " : "", path, reason);
}

int gmli_daemon_connect(const char *named, char *path_out, size_t path_len, char *why, size_t why_len, int *refused) {
  why[0] = 0;
  *refused = 0;
  char reason[1024];
  int s = gmli_daemon_dial(named, reason, sizeof reason, refused);
  if (s >= 0) snprintf(path_out, path_len, "%s", named);
  else gmli_why_add(why, why_len, named, reason);
  return s;
}
