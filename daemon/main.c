/* main.c: gmlaked start-up. Settings come from built-in defaults, then the
 * config file (/etc/gmlake/gmlaked.conf or --config), then the command line:
 * flags win. A bad value is an error at start that names its key. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define DEFAULT_CONFIG "/etc/gmlake/gmlaked.conf"

static void usage(FILE *f) {
  fprintf(f,
          "usage: gmlaked [options]\n"
          "  One daemon per GPU: owns the device's memory chunks and leases them to processes.\n"
          "  --device N            GPU index (default 0)\n"
          "  --backend B           auto (default: cuda when a GPU is usable), cuda or host\n"
          "  --socket PATH         client socket (default /run/gmlake/gmlake-N.sock, or $XDG_RUNTIME_DIR)\n"
          "  --control URL         control RPC endpoint (default ipc://<same dir>/gmlake-N.ctl)\n"
          "  --limit BYTES|PCT%%    the most the lake holds (default 90%% of the device; host: 50%% of RAM)\n"
          "  --prefetch BYTES      chunks created ahead of demand (default 256MiB)\n"
          "  --preallocate BYTES   create this much at start and keep at least that much (default 0)\n"
          "  --creators N          threads creating chunks (default 4)\n"
          "  --socket-mode OCTAL   permissions of the socket (default 0660)\n"
          "  --socket-group NAME   group of the socket (default: the daemon's)\n"
          "  --log-level L         error, warn, info (default) or debug\n"
          "  --config PATH         config file (default " DEFAULT_CONFIG " if present)\n"
          "  --foreground          stay in the foreground (always true; kept for scripts)\n"
          "Config file: one 'key = value' per line, keys as the long options without '--', '#' comments.\n");
}

/* Apply one setting; returns 0 or -1 with a message naming the key. */
static int apply_setting(gmld_config *c, const char *key, const char *val, char *err, size_t errlen) {
  uint64_t v;
  if (!strcmp(key, "device")) {
    char *end;
    long n = strtol(val, &end, 10);
    if (*end || n < 0 || n > 1023) goto bad;
    c->device = (int)n;
  } else if (!strcmp(key, "backend")) {
    if (strcmp(val, "auto") && strcmp(val, "cuda") && strcmp(val, "host")) goto bad;
    snprintf(c->backend, sizeof c->backend, "%s", val);
  } else if (!strcmp(key, "socket")) {
    if (!*val || strlen(val) >= sizeof(((struct sockaddr_un *)0)->sun_path)) goto bad;
    snprintf(c->socket_path, sizeof c->socket_path, "%s", val);
  } else if (!strcmp(key, "control")) {
    if (!strstr(val, "://")) goto bad;
    snprintf(c->control_url, sizeof c->control_url, "%s", val);
  } else if (!strcmp(key, "limit")) {
    if (gml_parse_size(val, 100, &v) || (strchr(val, '%') == NULL && v == 0)) goto bad;
    snprintf(c->limit, sizeof c->limit, "%s", val);
  } else if (!strcmp(key, "prefetch")) {
    if (gml_parse_size(val, 0, &v)) goto bad;
    c->prefetch_bytes = v;
  } else if (!strcmp(key, "preallocate")) {
    if (gml_parse_size(val, 0, &v)) goto bad;
    c->preallocate_bytes = v;
  } else if (!strcmp(key, "creators")) {
    char *end;
    long n = strtol(val, &end, 10);
    if (*end || n < 1 || n > 64) goto bad;
    c->creators = (int)n;
  } else if (!strcmp(key, "socket-mode")) {
    char *end;
    long n = strtol(val, &end, 8);
    if (*end || n < 0 || n > 0777) goto bad;
    c->socket_mode = (unsigned)n;
  } else if (!strcmp(key, "socket-group")) {
    snprintf(c->socket_group, sizeof c->socket_group, "%s", val);
  } else if (!strcmp(key, "log-level")) {
    int l = gml_log_parse_level(val);
    if (l < 0) goto bad;
    c->log_level = l;
  } else if (!strcmp(key, "foreground")) {
    c->foreground = 1;
  } else {
    snprintf(err, errlen, "unknown setting '%s'", key);
    return -1;
  }
  return 0;
bad:
  snprintf(err, errlen, "bad value for %s: '%s'", key, val);
  return -1;
}

static int load_config_file(gmld_config *c, const char *path, int must_exist) {
  FILE *f = fopen(path, "r");
  if (!f) {
    if (!must_exist && errno == ENOENT) return 0;
    fprintf(stderr, "gmlaked: cannot read config %s: %s\n", path, strerror(errno));
    return -1;
  }
  char line[512];
  int lineno = 0, rc = 0;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    char *p = line;
    char *hash = strchr(p, '#');
    if (hash) *hash = 0;
    while (isspace((unsigned char)*p)) p++;
    if (!*p) continue;
    char *eq = strchr(p, '=');
    char *end = p + strlen(p);
    while (end > p && isspace((unsigned char)end[-1])) *--end = 0;
    char *key = p, *val = (char *)"";
    if (eq) {
      *eq = 0;
      val = eq + 1;
      while (isspace((unsigned char)*val)) val++;
      char *ke = eq;
      while (ke > key && isspace((unsigned char)ke[-1])) *--ke = 0;
    }
    char err[256];
    if (apply_setting(c, key, val, err, sizeof err)) {
      fprintf(stderr, "gmlaked: %s:%d: %s\n", path, lineno, err);
      rc = -1;
      break;
    }
  }
  fclose(f);
  return rc;
}

static int parse_args(gmld_config *c, int argc, char **argv) {
  static const struct option opts[] = {
      {"device", required_argument, 0, 0},      {"backend", required_argument, 0, 0},  {"socket", required_argument, 0, 0},
      {"control", required_argument, 0, 0},     {"limit", required_argument, 0, 0},    {"prefetch", required_argument, 0, 0},
      {"preallocate", required_argument, 0, 0},
      {"creators", required_argument, 0, 0},    {"socket-mode", required_argument, 0, 0},
      {"socket-group", required_argument, 0, 0}, {"log-level", required_argument, 0, 0}, {"foreground", no_argument, 0, 0},
      {"config", required_argument, 0, 0},      {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
  /* first pass: the config file, so that flags can override it */
  const char *cfg = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--config") && i + 1 < argc) cfg = argv[i + 1];
    else if (!strncmp(argv[i], "--config=", 9)) cfg = argv[i] + 9;
  }
  if (!cfg) cfg = getenv("GMLAKED_CONFIG");
  if (load_config_file(c, cfg ? cfg : DEFAULT_CONFIG, cfg != NULL)) return -1;
  if (cfg) snprintf(c->config_path, sizeof c->config_path, "%s", cfg);
  int idx, ch;
  while ((ch = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
    if (ch == 'h') {
      usage(stdout);
      exit(0);
    }
    if (ch != 0) {
      usage(stderr);
      return -1;
    }
    const char *key = opts[idx].name;
    if (!strcmp(key, "config")) continue;
    char err[256];
    if (apply_setting(c, key, optarg ? optarg : "", err, sizeof err)) {
      fprintf(stderr, "gmlaked: --%s\n", err);
      return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "gmlaked: unexpected argument '%s'\n", argv[optind]);
    return -1;
  }
  return 0;
}

/* Keep the lake at its preallocated size at least. */
static void lake_keep_preallocated(gmld *d) {
  uint64_t held = d->lk.total + d->lk.creating;
  if (d->preallocate_chunks > held) {
    uint64_t n = d->preallocate_chunks - held, room = lake_headroom(&d->lk);
    creator_request(d, n < room ? n : room);
  }
}

void lake_refill(gmld *d) {
  if (d->stopping || gml_now_ns() < d->create_backoff_until_ns) return;
  uint64_t pending = 0;
  for (session *s = d->sessions; s; s = s->next)
    if (s->pending) pending += s->pending_count;
  uint64_t want = (d->prefetch_suspended ? 0 : d->prefetch_chunks) + pending;
  if (!d->prefetch_suspended) lake_keep_preallocated(d);
  uint64_t have = d->lk.nfree + d->lk.creating;
  if (want <= have) return;
  uint64_t n = want - have, room = lake_headroom(&d->lk);
  creator_request(d, n < room ? n : room);
}

/* systemd readiness, without libsystemd: one datagram to $NOTIFY_SOCKET. */
static void notify_systemd(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) return;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t len = strlen(path);
  if (len >= sizeof sa.sun_path) return;
  memcpy(sa.sun_path, path, len);
  if (sa.sun_path[0] == '@') sa.sun_path[0] = 0; /* abstract namespace */
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len));
  close(fd);
}

static void on_signal(uv_signal_t *h, int signum) {
  gmld *d = h->data;
  GML_INFO("signal %d: shutting down", signum);
  notify_systemd("STOPPING=1");
  d->stopping = 1;
  uv_stop(d->loop);
}

static void on_tick(uv_timer_t *t) {
  gmld *d = t->data;
  sessions_tick(d);
  lake_refill(d);
}

int main(int argc, char **argv) {
  gml_log_set_ident("gmlaked");
  gmld *d = calloc(1, sizeof *d);
  if (!d) return 1;
  gmld_config *c = &d->cfg;
  snprintf(c->backend, sizeof c->backend, "auto");
  c->prefetch_bytes = 256 * GML_MIB;
  c->creators = 4;
  c->socket_mode = 0660;
  c->log_level = GML_LOG_INFO;
  if (parse_args(c, argc, argv)) return 2;
  gml_log_set_level(c->log_level);
  if (!c->socket_path[0]) gml_default_socket_path(c->device, c->socket_path, sizeof c->socket_path);
  if (!c->control_url[0]) gml_default_control_url(c->device, c->control_url, sizeof c->control_url);
  signal(SIGPIPE, SIG_IGN);
  gml_raise_fd_limit();
  char msg[512];
  int rc = gml_backend_open(c->backend, c->device, &d->be, msg, sizeof msg);
  if (rc) {
    GML_ERR("%s", msg);
    fprintf(stderr, "gmlaked: %s\n", msg);
    return 1;
  }
  GML_INFO("%s", msg);
  uint64_t freeb = 0, total = 0, limit = 0;
  d->be->ops->mem_info(d->be, &freeb, &total);
  d->device_total = total;
  const char *lim = c->limit[0] ? c->limit : (strcmp(d->be->name, "cuda") ? "50%" : "90%");
  if (gml_parse_size(lim, total, &limit) || limit < d->be->chunk_size) {
    fprintf(stderr, "gmlaked: bad value for limit: '%s'\n", lim);
    return 2;
  }
  limit = limit / d->be->chunk_size * d->be->chunk_size;
  lake_init(&d->lk, d->be, limit);
  d->prefetch_chunks = c->prefetch_bytes / d->be->chunk_size;
  d->preallocate_chunks = c->preallocate_bytes / d->be->chunk_size;
  d->listen_fd = -1;
  d->loop = uv_default_loop();
  if (creator_start(d)) return 1;
  if (sessions_listen(d) || control_start(d)) {
    creator_stop(d);
    return 1;
  }
  uv_signal_init(d->loop, &d->sigterm);
  uv_signal_init(d->loop, &d->sigint);
  d->sigterm.data = d->sigint.data = d;
  uv_signal_start(&d->sigterm, on_signal, SIGTERM);
  uv_signal_start(&d->sigint, on_signal, SIGINT);
  uv_timer_init(d->loop, &d->tick);
  d->tick.data = d;
  uv_timer_start(&d->tick, on_tick, 50, 50);
  lake_refill(d);
  char lb[32];
  GML_INFO("serving device %d on %s, control %s, limit %s", c->device, c->socket_path, c->control_url,
           gml_format_bytes(limit, lb, sizeof lb));
  notify_systemd("READY=1");
  uv_run(d->loop, UV_RUN_DEFAULT);
  /* clean shutdown: clients out, chunks released, files removed */
  d->stopping = 1;
  sessions_close_all(d);
  control_stop(d);
  uv_timer_stop(&d->tick);
  uv_close((uv_handle_t *)&d->tick, NULL);
  uv_close((uv_handle_t *)&d->sigterm, NULL);
  uv_close((uv_handle_t *)&d->sigint, NULL);
  creator_stop(d);
  uv_run(d->loop, UV_RUN_DEFAULT);
  lake_destroy(&d->lk);
  if (!strncmp(c->control_url, "ipc://", 6)) unlink(c->control_url + 6);
  gml_backend_close(d->be);
  uv_loop_close(d->loop);
  free(d);
  GML_INFO("stopped");
  return 0;
}
