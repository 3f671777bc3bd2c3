/* main.c: gmlaked start-up and the loop's wiring: settings (config.c), the
 * backend, the lake and its broker, the creator pool and what happens with
 * its results, the client socket (listen.c, dispatch.c), the control RPC (control.c),
 * the tick that reviews waiting leases, signals and systemd readiness. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "control.h"
#include "daemon.h"
#include "dispatch.h"
#include "grant.h"
#include "listen.h"
#include "pidquota.h"
#include "gmlake.h"
#include "gpuname.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The creators' results, on the loop thread: into the lake, then the
 * waiting leases get what is free (or fail now when creating failed). */
static void on_chunks_made(void *arg, const creator_result *r, size_t n) {
  gmld *d = arg;
  size_t failed = 0;
  int no_fds = 0; /* the fd table was full, not the device */
  for (size_t i = 0; i < n; i++) {
    d->lk.creating--;
    if (r[i].fd < 0) {
      failed++;
      no_fds |= r[i].err == EMFILE || r[i].err == ENFILE;
      continue;
    }
    if (lake_add_created(&d->lk, r[i].phys, r[i].fd)) {
      d->be->ops->chunk_release(d->be, r[i].phys);
      close(r[i].fd);
    }
  }
  /* the device is probably full, or the fd table: no new attempt for a while (no busy loop, no log flood) */
  if (failed) {
    no_fds = no_fds || fdbudget_out_of_fds();
    d->br.create_failed_why[0] = 0; /* a waiting lease's refusal says which */
    if (no_fds)
      snprintf(d->br.create_failed_why, sizeof d->br.create_failed_why,
               "the daemon's fd limit (RLIMIT_NOFILE %zu) is reached: "
               "the daemon",
               d->fdb.limit);
    int starts = broker_creation_failed(&d->br, gmli_now_ns()); /* said once a back-off starts */
    if (starts && no_fds)
      GML_WARN("creating %zu chunk(s) failed: the daemon's fd limit (RLIMIT_NOFILE %zu) is reached (raise it: "
               "LimitNOFILE= in "
               "the unit, ulimit -n)",
               failed, d->fdb.limit);
    else if (starts) GML_WARN("creating %zu chunk(s) failed (device full?)", failed);
  }
  sessions_serve_pending(d);
  uint32_t keep = broker_keep_free(&d->br); /* trimmed meanwhile: what no lease took goes again */
  if (d->lk.nfree > keep) lake_trim(&d->lk, keep);
  if (failed) sessions_tick(d); /* waiting leases may have to fail now */
  else daemon_refill(d);
}

/* systemd readiness, without libsystemd: one datagram to $NOTIFY_SOCKET. */
static void notify_systemd(const gmld *d, const char *state) {
  const char *path = d->cfg.notify_socket;
  if (!*path) return;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t len = strlen(path);
  if (len >= sizeof sa.sun_path) return;
  memcpy(sa.sun_path, path, len);
  if (sa.sun_path[0] == '@') sa.sun_path[0] = 0; /* abstract namespace */
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa,
         (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len));
  close(fd);
}

/* One line for `systemctl status`: what is served, the limit, who uses it.
 * Sent when it changed (at start, on reload, then at most every 5 s). */
static void notify_status(gmld *d, int force) {
  char st[512], lb[32], hb[32], ub[32];
  uint64_t leased = d->lk.leased + d->lk.parked;
  snprintf(st, sizeof st, "STATUS=device %d (%s), %s backend: limit %s, lake holds %s, %zu client(s) lease %s%s%s",
           d->cfg.device, d->be->uuid, d->be->name, gmli_format_bytes(d->lk.limit_bytes, lb, sizeof lb),
           gmli_format_bytes(d->lk.total * d->lk.cs, hb, sizeof hb), d->br.nclients,
           gmli_format_bytes(leased * d->lk.cs, ub, sizeof ub), d->reload_refused[0] ? "; last reload refused: " : "",
           d->reload_refused); /* systemctl status shows it */
  if (!force && !strcmp(st, d->status)) return;
  snprintf(d->status, sizeof d->status, "%s", st);
  d->status_ns = gmli_now_ns();
  notify_systemd(d, st);
}

/* The limit c asks for, in bytes (a multiple of the chunk size), or 0 when it is bad. */
static uint64_t config_limit(const gmld *d, const gmld_config *c) {
  const char *lim = c->limit[0] ? c->limit : gmli_backend_default_limit(d->be);
  uint64_t limit;
  if (gmli_parse_size(lim, d->device_total, &limit) || limit < d->be->chunk_size) return 0;
  if (d->device_total && limit > d->device_total) /* allowed (gmlakectl refuses it): said, as nothing else would */
    GML_WARN("limit %s is more than the device's memory (%llu bytes): the lake stops where the device has no more", lim,
             (unsigned long long)d->device_total);
  return limit / d->be->chunk_size * d->be->chunk_size;
}

/* --check-config: the limit's form, which a start checks only once the device is open (its size
 * for a percentage, its chunk for a floor): a size, or a percentage of the device. */
static int check_limit_form(const gmld_config *c) {
  uint64_t v;
  if (!c->limit[0] || !gmli_parse_size(c->limit, 1ull << 40, &v)) return 1;
  gmli_log_fatal("bad value for limit: '%s' (a size, or a percentage of the device's memory)", c->limit);
  return 0;
}

/* --check-config: the device is one the backend has, where it can tell without a driver (a GPU's UUID or PCI bus id
 * needs the driver to check, which --check-config does not load). */
static int check_offline_device(const gmld_config *c) {
  char msg[256];
  int n;
  const gml_backend_entry *e = gmli_backend_find(c->backend);
  if (!e || !(e->caps & GML_BACKEND_RESOLVES_OFFLINE)) return 1;
  if (!e->resolve(c->device_spec, NULL, &n, msg, sizeof msg)) return 1;
  gmli_log_fatal("bad value for device: %s", msg);
  return 0;
}

/* The config's quotas replace the lake's (those set with gmlakectl too: a
 * quota meant to outlive a reload, a cgroup's included, goes in the file). */
_Static_assert(sizeof(((lake_quota *)0)->cgroup) == GML_QUOTA_CGROUP_MAX &&
                   sizeof(((config_quota *)0)->cgroup) == GML_QUOTA_CGROUP_MAX,
               "a cgroup path the config takes fits the lake's quota");
/* The config's quotas, in place of the lake's; returns how many hold (a pid
 * quota of no living process is said and left out). */
static int apply_quotas(gmld *d) {
  int applied = 0;
  d->lk.nquotas = 0;
  for (int i = 0; i < d->cfg.nquotas; i++) {
    const config_quota *q = &d->cfg.quotas[i];
    int rc = q->kind == GML_QUOTA_PID && q->bytes ? pidquota_watch(d, (pid_t)q->key) : 0;
    if (rc) {
      char why[160];
      GML_WARN("quota of pid %u not set: %s", q->key, pidquota_why((pid_t)q->key, rc, why, sizeof why));
      continue;
    }
    char why[700];
    if (q->kind == GML_QUOTA_CGROUP && q->bytes && conn_cgroup_check(q->cgroup, why, sizeof why)) {
      GML_WARN("quota of cgroup %s not set: %s", q->cgroup, why); /* it bound nothing, without a word */
      continue;
    }
    if (q->kind == GML_QUOTA_CGROUP) rc = lake_set_quota_cgroup(&d->lk, q->cgroup, q->bytes);
    else rc = lake_set_quota(&d->lk, q->kind == GML_QUOTA_UID, q->key, q->bytes);
    applied += rc == 0;
  }
  return applied;
}

/* The log level: --log-level or the config file's, else $GMLAKE_LOG (a bad
 * value warned about), else info. Returns where it came from. */
static const char *apply_log_level(const gmld_config *c) {
  if (c->log_level) {
    gmli_log_set_level(c->log_level);
    return "--log-level or the config file";
  }
  return gmli_log_set_level_from_env(GML_LOG_INFO) ? "GMLAKE_LOG" : "the default";
}

/* --device N is nvidia-smi's GPU N: CUDA's ordinals here follow the PCI bus
 * order over every GPU (its default, fastest first, need not be nvidia-smi's;
 * a CUDA_VISIBLE_DEVICES inherited from a shell would hide and renumber
 * them). Set before the driver is loaded, which reads them at cuInit. */
static void device_order_pci(void) {
  const char *v = gmli_env(GML_ENV_CUDA_VISIBLE_DEVICES);
  if (v)
    GML_WARN("CUDA_VISIBLE_DEVICES=%s ignored: gmlaked serves the GPU --device names (an index is nvidia-smi's)", v);
  unsetenv("CUDA_VISIBLE_DEVICES");
  setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
}

/* The idle release's settings, at start and on SIGHUP. */
static void apply_idle(gmld *d, const gmld_config *c) {
  d->br.idle_release_ns = (uint64_t)c->idle_release_s * 1000000000ull;
  d->br.idle_reserve_chunks = c->idle_reserve_bytes / d->lk.cs;
  d->cfg.idle_release_s = c->idle_release_s, d->cfg.idle_reserve_bytes = c->idle_reserve_bytes;
}

/* SIGHUP: the config file (and the same command line) read again; the limit,
 * the quotas, the log level and the idle release take its values. A file that does not parse
 * changes nothing. Other settings take effect at the next start. */
static void on_reload(uv_signal_t *h, int signum) {
  (void)signum;
  gmld *d = h->data;
  notify_systemd(d, "RELOADING=1");
  gmld_config nc;
  uint64_t limit = 0;
  const char *bad = NULL;
  config_set_quiet(1); /* its reason goes in this function's logged line, with a time and a level */
  int rc = config_load(&nc, d->argc, d->argv);
  config_set_quiet(0);
  if (rc != 0) bad = *config_error() ? config_error() : "the configuration cannot be read or does not parse";
  else if (!(limit = config_limit(d, &nc))) bad = "bad value for limit (a size of one chunk or more, or a percentage)";
  else {
    char changed[512];
    int took[2];
    nc.device = d->cfg.device; /* the index a UUID resolved to at start */
    names_defaults(&nc, d->be, took);
    if (config_changed_at_start(&d->cfg, &nc, changed, sizeof changed)) /* before: only socket-group and -mode said */
      GML_WARN("SIGHUP: %s changed: taken at the next start, not now (a reload takes limit, quota, log-level, "
               "idle-release and idle-reserve)",
               changed);
  }
  if (bad) {
    GML_ERR("SIGHUP: %s: nothing reloaded, every setting stays as it was", bad);
    snprintf(d->reload_refused, sizeof d->reload_refused, "%s", bad);
  } else {
    d->reload_refused[0] = 0;
    d->cfg.log_level = nc.log_level;
    const char *from = apply_log_level(&nc);
    snprintf(d->cfg.limit, sizeof d->cfg.limit, "%s", nc.limit);
    apply_idle(d, &nc);
    uint64_t was = d->lk.limit_bytes;
    broker_set_limit(&d->br, limit);
    memcpy(d->cfg.quotas, nc.quotas, sizeof nc.quotas);
    d->cfg.nquotas = nc.nquotas;
    int applied = apply_quotas(d);
    char lb[32], left_out[48] = "";
    if (applied < nc.nquotas) snprintf(left_out, sizeof left_out, " (%d not set: see above)", nc.nquotas - applied);
    GML_INFO("SIGHUP: reloaded %s: limit %s, %d quota(s)%s, log level %s (%s)",
             d->cfg.config_path[0] ? d->cfg.config_path : GMLD_DEFAULT_CONFIG, gmli_format_bytes(limit, lb, sizeof lb),
             applied, left_out, gmli_log_level_name(gmli_log_level()), from);
    control_say_limit_below_held(d, "SIGHUP", was, NULL, 0);
    sessions_serve_pending(d);
    daemon_refill(d);
  }
  notify_systemd(d, "READY=1");
  notify_status(d, 1);
}

static void on_signal(uv_signal_t *h, int signum) {
  gmld *d = h->data;
  GML_INFO("signal %d: shutting down", signum);
  notify_systemd(d, "STOPPING=1");
  d->stopping = 1;
  uv_stop(d->loop);
}

static void on_tick(uv_timer_t *t) {
  gmld *d = t->data;
  sessions_tick(d);
  conn_log_tick();
  uint32_t over = broker_trim_over_limit(&d->br);
  /* the reason: a hand-over after the restart, or a limit set below what the lake held (before: always the
   * hand-over, after `gmlakectl limit` or a reload too) */
  if (over)
    GML_INFO("released %u free chunk(s) the lake held past its limit (%s)", over,
             d->over_limit_why[0] ? d->over_limit_why : "over it");
  if (d->lk.total + d->lk.creating <= d->lk.limit_bytes / d->lk.cs) d->over_limit_why[0] = 0; /* within it again */
  uint32_t idle = broker_idle_release(&d->br, gmli_now_ns());
  if (idle) {
    char g[32], k[32];
    GML_INFO("released %u free chunk(s) (%s) to the driver: nothing leased or given back for %d s (--idle-release); "
             "the lake holds %s",
             idle, gmli_format_bytes((uint64_t)idle * d->lk.cs, g, sizeof g), d->cfg.idle_release_s,
             gmli_format_bytes(d->lk.total * d->lk.cs, k, sizeof k));
  }
  metrics_tick(d);
  daemon_refill(d);
  if (gmli_now_ns() - d->status_ns > 5000000000ull) notify_status(d, 0);
}

int main(int argc, char **argv) {
  gmli_log_set_ident("gmlaked");
  gmld *d = calloc(1, sizeof *d);
  if (!d) return 1;
  /* this daemon's instance (HelloReply.instance): a client that lost its
   * connection to it and comes back does not hand its chunks over again */
  if (getrandom(&d->instance, sizeof d->instance, 0) != (ssize_t)sizeof d->instance)
    d->instance = gmli_now_ns() ^ ((uint64_t)getpid() << 32);
  if (!d->instance) d->instance = 1;
  d->start_ns = gmli_now_ns();
  gmld_config *c = &d->cfg;
  int rc = config_load(c, argc, argv);
  if (rc) {
    free(d); /* --help, --version (0) or a bad setting (2) */
    return rc > 0 ? 0 : 2;
  }
  if (c->check_config) { /* --check-config: what a start would refuse before it opens anything; nothing is opened */
    int took[2], ok = names_defaults(c, NULL, took) && check_limit_form(c) && check_offline_device(c);
    if (ok) printf("gmlaked: the configuration is valid (%s)\n", c->config_path[0] ? c->config_path : "no file");
    free(d);
    return ok ? 0 : 2;
  }
  const char *level_from = apply_log_level(c);
  GML_DEBUG("log level debug (%s)", level_from);
  gmld_config probe = *c; /* the names wait for the device's UUID; whether there are any, not */
  int took[2];
  if (!names_defaults(&probe, NULL, took)) {
    gmli_log_fatal("/run/gmlake is not writable and XDG_RUNTIME_DIR is unset: give --socket and --control "
                   "(not in /tmp or another directory others may write: clients refuse those)");
    free(d);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  gmli_raise_fd_limit();
  fdbudget_init(d); /* the fd table shared out from the limit it has now */
  char msg[512];
  gml_backend_opts bo = {.chunk_size = gmli_env(GML_ENV_CHUNK_SIZE), .libcuda = gmli_env(GML_ENV_LIBCUDA)};
  device_order_pci();
  const char *picked = c->backend;
  rc = gmli_backend_resolve(c->backend, c->device_spec, &bo, &picked, &c->device, msg, sizeof msg);
  if (rc == 0) {
    if (msg[0]) GML_INFO("%s", msg);
    rc = gmli_backend_open(picked, c->device, &bo, &d->be, msg, sizeof msg);
    if (rc && strcmp(picked, c->backend) &&
        gmli_device_spec_index(c->device_spec) >= 0) /* auto: a GPU that cannot serve */
      rc = gmli_backend_open(c->backend, c->device, &bo, &d->be, msg, sizeof msg);
  }
  if (rc) {
    GML_ERR("%s", msg);
    gmli_log_fatal("%s", msg);
    return 1;
  }
  GML_INFO("%s", msg);
  c->device = d->be->device;
  names_defaults(c, d->be, took);
  uint64_t freeb = 0, total = 0, limit = 0;
  d->be->ops->mem_info(d->be, &freeb, &total);
  d->device_total = total;
  if (!(limit = config_limit(d, c))) {
    gmli_log_fatal("bad value for limit: '%s' (a size of at least one chunk, %zu bytes, or a percentage of the "
                   "device's memory)",
                   c->limit[0] ? c->limit : "the default", d->be->chunk_size);
    return 2;
  }
  lake_init(&d->lk, d->be, limit);
  fdbudget_say(d);
  apply_quotas(d);
  gmlake__lake_stats__init(&d->counters);
  broker_init(&d->br, &d->lk, &d->counters, c->prefetch_bytes / d->be->chunk_size,
              c->preallocate_bytes / d->be->chunk_size);
  d->br.lease_wait_ns = (uint64_t)c->lease_wait_ms * 1000000ull;
  d->br.promise_ns = (uint64_t)c->meminfo_promise_ms * 1000000ull;
  apply_idle(d, c);
  trust_install(d);
  d->listen_fd = -1;
  d->loop = uv_default_loop();
  /* the signals first: once the socket is there, a service manager may send
   * them (a SIGHUP or SIGTERM before killed the daemon outright) */
  uv_signal_init(d->loop, &d->sigterm);
  uv_signal_init(d->loop, &d->sigint);
  d->sigterm.data = d->sigint.data = d;
  uv_signal_start(&d->sigterm, on_signal, SIGTERM);
  uv_signal_start(&d->sigint, on_signal, SIGINT);
  d->argc = argc, d->argv = argv;
  uv_signal_init(d->loop, &d->sighup);
  d->sighup.data = d;
  uv_signal_start(&d->sighup, on_reload, SIGHUP);
  if (creator_start(&d->cr, d->loop, d->be, c->creators, on_chunks_made, d)) return 1;
  dispatch_start(d);
  int failed = listen_start(d), ctl_up = !failed && !(failed = control_start(d));
  if (!failed) failed = metrics_start(d);
  if (!failed) names_link(d, took);
  if (failed) { /* a failed start leaves no socket file of its own (another daemon may own the control URL) */
    if (ctl_up) {
      control_stop(d);
      if (!strncmp(c->control_url, "ipc://", 6)) unlink(c->control_url + 6);
    }
    sessions_stop_listening(d);
    creator_stop(&d->cr);
    return 1;
  }
  uv_timer_init(d->loop, &d->tick);
  d->tick.data = d;
  uv_timer_start(&d->tick, on_tick, 50, 50);
  daemon_refill(d);
  char lb[32];
  GML_INFO("serving device %d (%s) on %s, control %s, limit %s", c->device, d->be->uuid, c->socket_path, c->control_url,
           gmli_format_bytes(limit, lb, sizeof lb));
  notify_systemd(d, "READY=1");
  notify_status(d, 1);
  uv_run(d->loop, UV_RUN_DEFAULT);
  /* clean shutdown: clients out, chunks released, files removed */
  d->stopping = 1;
  names_unlink(d);
  dispatch_stop(d);
  control_stop(d);
  metrics_stop(d);
  uv_timer_stop(&d->tick);
  uv_close((uv_handle_t *)&d->tick, NULL);
  uv_close((uv_handle_t *)&d->sigterm, NULL);
  uv_close((uv_handle_t *)&d->sigint, NULL);
  uv_close((uv_handle_t *)&d->sighup, NULL);
  creator_stop(&d->cr);
  uv_run(d->loop, UV_RUN_DEFAULT);
  lake_destroy(&d->lk);
  if (!strncmp(c->control_url, "ipc://", 6)) unlink(c->control_url + 6);
  gmli_backend_close(d->be);
  uv_loop_close(d->loop);
  free(d);
  GML_INFO("stopped");
  return 0;
}
