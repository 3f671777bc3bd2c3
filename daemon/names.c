/* names.c: the daemon's endpoints named after its GPU (common/gpuname.h).
 * By default the socket and the control endpoint are gmlake-<UUID>.sock and
 * gmlake-<UUID>.ctl in /run/gmlake (else $XDG_RUNTIME_DIR): a client finds
 * its GPU's daemon from the UUID the driver gives it, whatever its
 * CUDA_VISIBLE_DEVICES. Beside each, gmlake-<N>.sock and gmlake-<N>.ctl (N:
 * the index, nvidia-smi's) are symlinks to them, for older clients and
 * gmlakectl --device N. A link is made only for an endpoint that took its
 * default name, after it listens; it replaces a link or a dead socket of
 * its name, never a live one (an older daemon given --socket gmlake-N.sock
 * serves there), and goes at exit if it still points at ours. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "daemon.h"
#include "gpuname.h"
#include "log.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int names_defaults(gmld_config *c, const gml_backend *be, int took_default[2]) {
  char index[16];
  snprintf(index, sizeof index, "%d", be ? be->device : c->device);
  const char *name = be ? be->uuid : "check"; /* not opened yet (--check-config): only whether there are defaults */
  took_default[0] = !c->socket_path[0];
  took_default[1] = !c->control_url[0] && !c->socket_path[0];
  /* the control endpoint defaults to the socket's directory: a daemon given
   * only --socket put it in /run/gmlake, beside (or in place of) the system
   * daemon's; named by the index, where gmlakectl --device N with
   * GMLAKE_SOCKET=.../gmlake-%d.sock looks */
  if (!c->control_url[0] && c->socket_path[0])
    gmli_control_url_beside(c->socket_path, index, c->control_url, sizeof c->control_url);
  if (!c->socket_path[0]) gmli_default_socket_path(name, c->socket_path, sizeof c->socket_path);
  if (!c->control_url[0]) gmli_default_control_url(name, c->control_url, sizeof c->control_url);
  return c->socket_path[0] && c->control_url[0];
}

/* A live socket at path: something accepts connections there. */
static int socket_live(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) return 0;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int live = s >= 0 && connect(s, (struct sockaddr *)&sa, sizeof sa) == 0;
  if (s >= 0) close(s);
  return live;
}

/* link -> target (a name in link's directory), replacing a link or a dead
 * socket there at once (rename). 0, or -1 with why. */
static int make_link(const char *link, const char *target, char *why, size_t len) {
  struct stat st;
  if (lstat(link, &st) == 0 && !S_ISLNK(st.st_mode)) {
    if (!S_ISSOCK(st.st_mode)) return snprintf(why, len, "it exists and is neither a link nor a socket"), -1;
    if (socket_live(link)) return snprintf(why, len, "another daemon serves it (an older one given --socket?)"), -1;
  }
  char tmp[GMLD_NAME_MAX + 32];
  snprintf(tmp, sizeof tmp, "%s.%d.new", link, (int)getpid());
  unlink(tmp);
  if (symlink(target, tmp) == 0 && rename(tmp, link) == 0) return 0;
  snprintf(why, len, "%s", strerror(errno));
  unlink(tmp);
  return -1;
}

void names_link(gmld *d, const int took_default[2]) {
  const char *paths[2] = {d->cfg.socket_path, d->cfg.control_url + 6}, *ext[2] = {"sock", "ctl"};
  for (int i = 0; i < 2; i++) {
    d->links[i][0] = 0;
    if (!took_default[i] || (i == 1 && strncmp(d->cfg.control_url, "ipc://", 6))) continue;
    char dir[256], why[160];
    const char *base = gmli_path_dir(paths[i], dir, sizeof dir);
    snprintf(d->link_targets[i], sizeof d->link_targets[i], "%s", base);
    snprintf(d->links[i], sizeof d->links[i], "%s/gmlake-%d.%s", dir, d->be->device, ext[i]);
    if (make_link(d->links[i], base, why, sizeof why) == 0) {
      GML_INFO("%s -> %s (the name of device %d, for older clients and gmlakectl --device %d)", d->links[i], base,
               d->be->device, d->be->device);
    } else {
      GML_WARN("no link %s -> %s: %s; clients that look for gmlake-%d.%s do not find this daemon", d->links[i], base,
               why, d->be->device, ext[i]);
      d->links[i][0] = 0;
    }
  }
}

void names_unlink(gmld *d) {
  for (int i = 0; i < 2; i++) {
    char target[GMLD_NAME_MAX];
    ssize_t n = d->links[i][0] ? readlink(d->links[i], target, sizeof target - 1) : -1;
    if (n < 0) continue;
    target[n] = 0;
    if (!strcmp(target, d->link_targets[i])) unlink(d->links[i]); /* another daemon's since: its to keep */
    d->links[i][0] = 0;
  }
}
