/* open.c: gml_open and gml_close, which put the client's parts together:
 * the allocator over one of its two chunk sources (the daemon's, lease.c, or,
 * embedded, the backend itself: below), the growable ranges, the daemon
 * connection's threads (keeper.c) and the chunk holders their reconnection
 * calls, and at close take them apart in order. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "copy.h"
#include "discover.h"
#include "gmlake.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------- embedded source: the backend directly ---------- */

static int embedded_acquire(void *ctx, size_t n, int optional, gml_phys *phys, uint64_t *ids) {
  gml_client *c = ctx;
  (void)optional; /* the device says at once whether it has memory */
  /* the limit holds for the allocator's chunks and the growable ranges' together
   * (the allocator checks its own part before it asks; called with its lock or grow.lock) */
  uint64_t held = (uint64_t)__atomic_load_n(&c->alloc.held, __ATOMIC_RELAXED) * c->be->chunk_size +
                  __atomic_load_n(&c->grow.mapped, __ATOMIC_RELAXED);
  if (c->alloc.limit_bytes && held + n * c->be->chunk_size > c->alloc.limit_bytes) return GML_ENOMEM;
  size_t got = 0;
  for (; got < n; got++) {
    int rc = c->be->ops->chunk_create(c->be, &phys[got], NULL);
    if (rc) return got ? (int)got : rc;
    ids[got] = 0;
  }
  return (int)got;
}

static void embedded_release(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids) {
  gml_client *c = ctx;
  (void)ids;
  for (size_t i = 0; i < n; i++) c->be->ops->chunk_release(c->be, phys[i]);
}
/* ---------- the allocator as a chunk holder ---------- */

static void alloc_lock(gml_client *c) { pthread_mutex_lock(&c->alloc.lock); }
static void alloc_unlock(gml_client *c) { pthread_mutex_unlock(&c->alloc.lock); }

static void alloc_handover(gml_client *c, gml_chunk_fn fn, void *ctx, int how) {
  (void)how;
  gml_allocator *a = &c->alloc;
  for (size_t i = 0; i < a->chunks_used; i++)
    if (a->chunks[i].list != GML_CL_DEAD) fn(ctx, a->chunks[i].phys, &a->chunks[i].id);
}

static const gml_holder_ops alloc_holder = {.lock = alloc_lock, .unlock = alloc_unlock, .handover = alloc_handover};

int gml_open(const gml_open_opts *opts, gml_client **out) {
  gml_open_opts o = {0};
  if (opts) o = *opts;
  gml_options opt;
  int rc = gmli_open_options(&o, &opt);
  if (rc) return rc;
  gml_backend_opts bo = {.chunk_size = opt.chunk_size, .libcuda = opt.libcuda};
  gmli_raise_fd_limit();
  gml_client *c = calloc(1, sizeof *c);
  if (!c) return GML_ENOMEM;
  c->sock = -1;
  c->device = o.device;
  pthread_mutex_init(&c->conn_lock, NULL);
  gmli_grow_init(c);
  pthread_mutex_init(&c->track_lock, NULL);
  char why[2048] = "", msg[512] = "", backend[16] = "";
  rc = GML_EDAEMON;
  char path[256] = "";
  uint64_t chunk_size = 0;
  if (opt.mode != GML_MODE_EMBEDDED)
    rc = gmli_daemon_find(c, &opt, &bo, path, sizeof path, why, sizeof why, backend, sizeof backend, &chunk_size);
  gml_chunk_source src;
  if (c->mode == GML_MODE_DAEMON) { /* a daemon of this device answered (its hello may have refused us) */
    if (rc == 0 && strcmp(opt.backend, "auto") && strcmp(opt.backend, backend)) {
      snprintf(c->last_error, sizeof c->last_error, "daemon runs the %s backend, %s was asked for", backend,
               opt.backend);
      rc = GML_ENODEV;
    }
    if (rc == 0) rc = gmli_backend_open(backend, o.device, &bo, &c->be, msg, sizeof msg);
    /* the daemon's chunks are the ones we map, whatever our own default or GMLAKE_CHUNK_SIZE says */
    if (rc == 0 && c->be->chunk_size != chunk_size && gmli_backend_set_chunk_size(c->be, chunk_size)) {
      snprintf(c->last_error, sizeof c->last_error, "daemon's chunk size %llu is not a multiple of this device's %zu",
               (unsigned long long)chunk_size, c->be->granularity);
      rc = GML_EPROTO;
    }
    if (rc) {
      GML_ERR("daemon at %s: %s: %s", path, gml_strerror(rc), c->last_error);
      goto fail;
    }
    snprintf(c->gpu_uuid, sizeof c->gpu_uuid, "%s",
             c->be->uuid); /* a reconnection's hello says the device we map for */
    src = gmli_lease_source(c);
    GML_INFO("connected to the daemon of %s at %s (client %llu, %s)", c->be->uuid, path,
             (unsigned long long)c->client_id, msg);
  } else if (opt.mode == GML_MODE_DAEMON) {
    GML_ERR("no daemon at %s; GMLAKE_MODE=daemon: not running embedded", why);
    goto fail;
  } else {
    c->mode = GML_MODE_EMBEDDED;
    rc = gmli_backend_open(opt.backend, o.device, &bo, &c->be, msg, sizeof msg);
    if (rc) {
      GML_ERR("%s", msg);
      goto fail;
    }
    src = (gml_chunk_source){c, embedded_acquire, embedded_release, NULL};
    if (opt.mode == GML_MODE_EMBEDDED) GML_INFO("embedded mode (asked for); %s", msg);
    else GML_WARN("no daemon at %s; running embedded (%s)", why, msg);
  }
  gml_alloc_config cfg;
  gmli_alloc_config_from_options(&opt, &cfg);
  if (o.guard) cfg.guard = o.guard > 0 ? o.guard : 0;
  if (o.guard_grain) cfg.guard_grain = o.guard_grain;
  if (o.borrow) cfg.borrow = o.borrow > 0;
  /* guard mode on cuda guards whole chunks: embedded, the finest chunk the
   * device allows (its granularity) unless GMLAKE_CHUNK_SIZE says otherwise */
  if (cfg.guard > 0 && c->mode == GML_MODE_EMBEDDED && !c->be->ops->protect && !opt.chunk_size)
    gmli_backend_set_chunk_size(c->be, c->be->granularity);
  rc = gmli_alloc_init(&c->alloc, c->be, src, gmli_va_size(&opt, c->be), &cfg);
  if (rc) {
    GML_ERR("cannot start the allocator: %s (%s)", gml_strerror(rc), c->alloc.last_error);
    goto fail;
  }
  if (cfg.guard > 0)
    GML_INFO("guard mode: %s, guards of %zu bytes", cfg.guard == GML_GUARD_BOTH ? "both ends" : "end",
             c->alloc.guard_grain);
  if (c->mode == GML_MODE_EMBEDDED) {
    uint64_t lim = o.limit_bytes;
    if (!lim && opt.limit) {
      uint64_t f = 0, t = 0;
      c->be->ops->mem_info(c->be, &f, &t);
      if (gmli_parse_size(opt.limit, t, &lim) || !lim) { /* a share of a device whose size is unknown (or of no byte) */
        GML_ERR("GMLAKE_LIMIT=%s: %s", opt.limit,
                t ? "less than a byte of the device" : "the device does not say its size; give the limit in bytes");
        gmli_alloc_destroy(&c->alloc);
        rc = GML_EINVAL;
        goto fail;
      }
    }
    c->alloc.limit_bytes = lim;
  } else if (opt.limit) { /* once a process: it asked for a bound it does not get */
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
      GML_WARN("GMLAKE_LIMIT=%s is not applied: this process uses the daemon at %s, whose limit and quotas hold; "
               "GMLAKE_MODE=embedded applies it",
               opt.limit, path);
  }
  /* in the order their locks nest: the allocator's, then the ranges' (shares keep none of their own) */
  gmli_holder_add(c, &alloc_holder);
  gmli_holder_add(c, &gmli_grow_holder);
  gmli_holder_add(c, &gmli_share_holder);
  gmli_holder_add(c, &gmli_pause_holder);
  if (c->mode == GML_MODE_DAEMON && (rc = gmli_link_start(c, path))) {
    gmli_alloc_destroy(&c->alloc);
    goto fail;
  }
  *out = c;
  return 0;
fail:
  if (c->sock >= 0) close(c->sock);
  if (c->be) gmli_backend_close(c->be);
  gmli_grow_destroy_all(c);
  pthread_mutex_destroy(&c->conn_lock);
  pthread_mutex_destroy(&c->track_lock);
  free(c);
  return rc;
}

int gml_close(gml_client *c) {
  if (!c) return GML_EINVAL;
  gmli_link_quiesce(c);   /* no reclaim runs in the allocator from here on */
  gmli_pause_destroy(c);  /* paused content is dropped */
  gmli_copier_destroy(c); /* the copy engine's staging pool and threads */
  gmli_ipc_client_gone(c);
  gmli_track_destroy(c);         /* pending frees and pools' blocks go back first */
  gmli_grow_destroy_all(c);      /* ranges the caller left: their chunks go back first */
  gmli_alloc_destroy(&c->alloc); /* returns every chunk (daemon: one return each) */
  gmli_link_stop(c);
  if (c->sock >= 0) close(c->sock);
  gmli_backend_close(c->be);
  pthread_mutex_destroy(&c->conn_lock);
  pthread_mutex_destroy(&c->track_lock);
  free(c);
  return 0;
}
