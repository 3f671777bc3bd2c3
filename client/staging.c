/* staging.c: the copy engine's page-locked staging pool and the threads
 * that copy between pageable memory and it (copy.h).
 *
 * The pool is taken once, at the first copy that needs it, and kept for the
 * client's life: page-locking costs far more than a copy (PyTorch's
 * activation offloading lost 27 points of step time to it, pytorch#186161),
 * and a pool kept across calls pays it once. It is cut into
 * GMLI_STAGING_SLOTS slots: while the link moves one slot, the threads fill
 * or empty the next. One host thread copies pageable memory at ~10 GB/s,
 * well below a PCIe 5 link (~55 GB/s), so several share each slot; the
 * host's memory bandwidth bounds them all (36 GB/s for any number of
 * threads on the H200 host measured: docs/benchmarks.md). */
#include "client_priv.h"
#include "copy.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STAGING_DEFAULT (256ull << 20)
#define PAR_MIN (2u << 20) /* below this a copy is the caller's alone */

static void *copier_thread(void *arg) {
  gmli_copier *k = arg;
  pthread_mutex_lock(&k->wlock);
  while (!k->stop) {
    gmli_memcpy_job *j = &k->job;
    if (j->next < j->parts) {
      size_t i = j->next++, at = i * j->part, n = GML_MIN(j->part, j->n - at);
      pthread_mutex_unlock(&k->wlock);
      memcpy(j->dst + at, j->src + at, n);
      pthread_mutex_lock(&k->wlock);
      if (++j->finished == j->parts) pthread_cond_broadcast(&k->done);
      continue;
    }
    pthread_cond_wait(&k->work, &k->wlock);
  }
  pthread_mutex_unlock(&k->wlock);
  return NULL;
}

/* The caller takes parts too: with no threads it copies alone. */
void gmli_par_memcpy(gmli_copier *k, void *dst, const void *src, size_t n) {
  if (!k->nthreads || n < PAR_MIN) {
    memcpy(dst, src, n);
    return;
  }
  size_t parts = (size_t)k->nthreads + 1, part = gmli_round_up((n + parts - 1) / parts, 4096);
  pthread_mutex_lock(&k->wlock);
  k->job = (gmli_memcpy_job){(char *)dst, (const char *)src, n, part, 0, (n + part - 1) / part, 0};
  pthread_cond_broadcast(&k->work);
  gmli_memcpy_job *j = &k->job;
  while (j->next < j->parts) {
    size_t i = j->next++, at = i * j->part, m = GML_MIN(j->part, j->n - at);
    pthread_mutex_unlock(&k->wlock);
    memcpy(j->dst + at, j->src + at, m);
    pthread_mutex_lock(&k->wlock);
    j->finished++;
  }
  while (j->finished < j->parts) pthread_cond_wait(&k->done, &k->wlock);
  j->parts = j->next = j->finished = 0;
  pthread_mutex_unlock(&k->wlock);
}

/* GMLAKE_COPY_THREADS, else the cores less the caller's, at most 16: on an H200 host (16 cores) 15 threads
 * staged pageable memory at 37.5 GB/s H2D where 8 did 22.5, the host's own memcpy reaching 36 (run99). */
static int threads_setting(void) {
  const char *t = gmli_env(GML_ENV_COPY_THREADS);
  long cores = sysconf(_SC_NPROCESSORS_ONLN), n = cores > 1 ? GML_MIN(cores - 1, 16) : 0;
  if (t) {
    char *end;
    long v = strtol(t, &end, 10);
    if (*end || v < 0 || v > GMLI_COPY_THREADS_MAX)
      GML_WARN("GMLAKE_COPY_THREADS=%s ignored: 0 to %d was expected; %ld threads", t, GMLI_COPY_THREADS_MAX, n);
    else n = v;
  }
  return (int)n;
}

int gmli_staging_init(gmli_copier *k, gml_backend *be) {
  k->be = be;
  pthread_mutex_init(&k->lock, NULL);
  pthread_mutex_init(&k->wlock, NULL);
  pthread_cond_init(&k->work, NULL);
  pthread_cond_init(&k->done, NULL);
  uint64_t size = STAGING_DEFAULT;
  const char *s = gmli_env(GML_ENV_COPY_STAGING);
  if (s && gmli_parse_size(s, 0, &size)) {
    GML_WARN("GMLAKE_COPY_STAGING=%s ignored: a size was expected; %llu MiB", s, STAGING_DEFAULT >> 20);
    size = STAGING_DEFAULT;
  }
  /* whole slots of whole pages: a slot's copy never shares a page with the next one's */
  k->slot_size = gmli_round_up((size_t)size / GMLI_STAGING_SLOTS, 4096);
  k->size = size ? k->slot_size * GMLI_STAGING_SLOTS : 0;
  k->info.slots = k->size ? GMLI_STAGING_SLOTS : 0;
  k->info.batch = !!(be->caps & GML_BACKEND_COPY_BATCH);
  return 0;
}

int gmli_staging_ready(gmli_copier *k) {
  if (k->base) return 0;
  if (!k->size || k->staging_failed) return GML_ENOMEM;
  void *p = NULL;
  uint64_t t0 = gmli_now_ns();
  if (k->be->ops->host_alloc(k->be, k->size, &p) || !p) {
    k->staging_failed = 1;
    char b[32];
    GML_WARN("copy engine: no page-locked staging pool of %s: pageable copies go to the driver as they are",
             gmli_format_bytes(k->size, b, sizeof b));
    return GML_ENOMEM;
  }
  k->base = p;
  k->info.staging_bytes = k->size;
  int want = threads_setting(); /* with the pool: a client that never stages runs none */
  for (int i = 0; i < want; i++) {
    if (pthread_create(&k->threads[i], NULL, copier_thread, k)) break;
    k->nthreads++;
  }
  k->info.threads = (uint32_t)k->nthreads;
  char b[32];
  GML_INFO("copy engine: staging pool of %s (%d slots) page-locked in %.1f ms, %d copying threads",
           gmli_format_bytes(k->size, b, sizeof b), GMLI_STAGING_SLOTS, (gmli_now_ns() - t0) / 1e6, k->nthreads);
  return 0;
}

int gmli_staging_slot_wait(gmli_copier *k, int slot) {
  if (!k->has_ev[slot]) return 0;
  int rc = k->be->ops->event_wait(k->be, k->ev[slot]);
  k->be->ops->event_destroy(k->be, k->ev[slot]);
  k->has_ev[slot] = 0;
  return rc;
}

int gmli_staging_slot_mark(gmli_copier *k, int slot, uintptr_t stream) {
  int rc = k->be->ops->event_record(k->be, stream, &k->ev[slot]);
  k->has_ev[slot] = !rc;
  return rc;
}

void gmli_staging_destroy(gmli_copier *k) {
  for (int i = 0; i < GMLI_STAGING_SLOTS; i++) gmli_staging_slot_wait(k, i);
  pthread_mutex_lock(&k->wlock);
  k->stop = 1;
  pthread_cond_broadcast(&k->work);
  pthread_mutex_unlock(&k->wlock);
  for (int i = 0; i < k->nthreads; i++) pthread_join(k->threads[i], NULL);
  if (k->base) k->be->ops->host_free(k->be, k->base);
  pthread_cond_destroy(&k->work);
  pthread_cond_destroy(&k->done);
  pthread_mutex_destroy(&k->wlock);
  pthread_mutex_destroy(&k->lock);
}
