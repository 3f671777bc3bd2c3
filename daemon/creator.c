/* creator.c: worker threads that create and export chunks ahead of demand.
 * cuMemCreate + cuMemExportToShareableHandle take ~1.2 ms a chunk on the
 * H100, far too long for the event loop, so the loop asks for N chunks and
 * gets them back through a uv_async. */
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <stdlib.h>
#include <unistd.h>

static void *creator_main(void *arg) {
  gmld *d = arg;
  creator *cr = &d->cr;
  pthread_mutex_lock(&cr->mu);
  for (;;) {
    while (!cr->stop && cr->requested == 0) pthread_cond_wait(&cr->cv, &cr->mu);
    if (cr->stop) break;
    /* room for the result first, so a created chunk is never dropped */
    if (cr->done_cap < cr->ndone + cr->inflight + 1) {
      size_t cap = cr->done_cap ? cr->done_cap * 2 : 64;
      struct created *n = realloc(cr->done, cap * sizeof *n);
      if (!n) {
        pthread_mutex_unlock(&cr->mu);
        usleep(10000);
        pthread_mutex_lock(&cr->mu);
        continue;
      }
      cr->done = n;
      cr->done_cap = cap;
    }
    cr->requested--;
    cr->inflight++;
    pthread_mutex_unlock(&cr->mu);
    gml_phys phys = 0;
    int fd = -1;
    int rc = d->be->ops->chunk_create(d->be, &phys, &fd);
    pthread_mutex_lock(&cr->mu);
    cr->inflight--;
    if (rc) {
      cr->failures++;
      fd = -1; /* reported as a failed slot: the loop counts it out of "creating" */
    }
    cr->done[cr->ndone++] = (struct created){phys, fd};
    uv_async_send(&cr->async);
  }
  pthread_mutex_unlock(&cr->mu);
  return NULL;
}

static void on_created(uv_async_t *h) {
  gmld *d = h->data;
  creator *cr = &d->cr;
  pthread_mutex_lock(&cr->mu);
  size_t n = cr->ndone;
  struct created *items = NULL;
  if (n) {
    items = malloc(n * sizeof *items);
    if (items) {
      for (size_t i = 0; i < n; i++) items[i] = cr->done[i];
      cr->ndone = 0;
    } else {
      n = 0;
    }
  }
  pthread_mutex_unlock(&cr->mu);
  size_t failed = 0;
  for (size_t i = 0; i < n; i++) {
    d->lk.creating--;
    if (items[i].fd < 0) {
      failed++;
      continue;
    }
    if (lake_add_created(&d->lk, items[i].phys, items[i].fd)) {
      d->be->ops->chunk_release(d->be, items[i].phys);
      close(items[i].fd);
    }
  }
  free(items);
  if (failed) {
    /* the device is probably full: no new attempt for a second (no busy loop, no log flood) */
    if (gml_now_ns() >= d->create_backoff_until_ns) GML_WARN("creating %zu chunk(s) failed (device full?)", failed);
    d->create_backoff_until_ns = gml_now_ns() + 1000000000ull;
  }
  sessions_serve_pending(d);
  if (failed) sessions_tick(d); /* waiting leases may have to fail now */
  else lake_refill(d);
}

void creator_request(gmld *d, uint64_t n) {
  if (!n) return;
  creator *cr = &d->cr;
  d->lk.creating += n;
  pthread_mutex_lock(&cr->mu);
  cr->requested += n;
  pthread_cond_broadcast(&cr->cv);
  pthread_mutex_unlock(&cr->mu);
}

int creator_start(gmld *d) {
  creator *cr = &d->cr;
  pthread_mutex_init(&cr->mu, NULL);
  pthread_cond_init(&cr->cv, NULL);
  uv_async_init(d->loop, &cr->async, on_created);
  cr->async.data = d;
  cr->nthreads = d->cfg.creators > 0 ? d->cfg.creators : 1;
  cr->threads = calloc((size_t)cr->nthreads, sizeof *cr->threads);
  if (!cr->threads) return GML_ENOMEM;
  for (int i = 0; i < cr->nthreads; i++)
    if (pthread_create(&cr->threads[i], NULL, creator_main, d)) return GML_ESYS;
  return 0;
}

void creator_stop(gmld *d) {
  creator *cr = &d->cr;
  pthread_mutex_lock(&cr->mu);
  cr->stop = 1;
  pthread_cond_broadcast(&cr->cv);
  pthread_mutex_unlock(&cr->mu);
  for (int i = 0; i < cr->nthreads; i++) pthread_join(cr->threads[i], NULL);
  for (size_t i = 0; i < cr->ndone; i++) {
    if (cr->done[i].fd < 0) continue;
    d->be->ops->chunk_release(d->be, cr->done[i].phys);
    close(cr->done[i].fd);
  }
  free(cr->done);
  free(cr->threads);
  uv_close((uv_handle_t *)&cr->async, NULL);
}
