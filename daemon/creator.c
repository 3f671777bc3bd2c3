/* creator.c: the chunk-making worker pool (see creator.h). */
#include "creator.h"
#include "gmlake.h"
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static void *creator_main(void *arg) {
  creator *cr = arg;
  pthread_mutex_lock(&cr->mu);
  for (;;) {
    while (!cr->stop && cr->requested == 0) pthread_cond_wait(&cr->cv, &cr->mu);
    if (cr->stop) break;
    /* room for the result first, so a created chunk is never dropped */
    if (cr->done_cap < cr->ndone + cr->inflight + 1) {
      size_t cap = cr->done_cap ? cr->done_cap * 2 : 64;
      creator_result *n = realloc(cr->done, cap * sizeof *n);
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
    errno = 0;
    int rc = cr->be->ops->chunk_create(cr->be, &phys, &fd), err = errno;
    pthread_mutex_lock(&cr->mu);
    cr->inflight--;
    if (rc) {
      cr->failures++;
      fd = -1; /* reported as a failed result: the loop counts it out of "creating" */
    }
    cr->done[cr->ndone++] = (creator_result){phys, fd, rc ? err : 0};
    uv_async_send(&cr->async);
  }
  pthread_mutex_unlock(&cr->mu);
  return NULL;
}

static void on_async(uv_async_t *h) {
  creator *cr = h->data;
  pthread_mutex_lock(&cr->mu);
  size_t n = cr->ndone;
  creator_result *items = NULL;
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
  cr->on_done(cr->arg, items, n);
  free(items);
}

void creator_make(creator *cr, uint64_t n) {
  if (!n) return;
  pthread_mutex_lock(&cr->mu);
  cr->requested += n;
  pthread_cond_broadcast(&cr->cv);
  pthread_mutex_unlock(&cr->mu);
}

int creator_start(creator *cr, uv_loop_t *loop, gml_backend *be, int nthreads, creator_done_fn on_done, void *arg) {
  cr->be = be;
  cr->on_done = on_done;
  cr->arg = arg;
  pthread_mutex_init(&cr->mu, NULL);
  pthread_cond_init(&cr->cv, NULL);
  uv_async_init(loop, &cr->async, on_async);
  cr->async.data = cr;
  cr->nthreads = nthreads > 0 ? nthreads : 1;
  cr->threads = calloc((size_t)cr->nthreads, sizeof *cr->threads);
  if (!cr->threads) return GML_ENOMEM;
  for (int i = 0; i < cr->nthreads; i++)
    if (pthread_create(&cr->threads[i], NULL, creator_main, cr)) return GML_ESYS;
  return 0;
}

void creator_stop(creator *cr) {
  pthread_mutex_lock(&cr->mu);
  cr->stop = 1;
  pthread_cond_broadcast(&cr->cv);
  pthread_mutex_unlock(&cr->mu);
  for (int i = 0; i < cr->nthreads; i++) pthread_join(cr->threads[i], NULL);
  for (size_t i = 0; i < cr->ndone; i++) {
    if (cr->done[i].fd < 0) continue;
    cr->be->ops->chunk_release(cr->be, cr->done[i].phys);
    close(cr->done[i].fd);
  }
  free(cr->done);
  free(cr->threads);
  uv_close((uv_handle_t *)&cr->async, NULL);
}
