/* creator.h: a pool of worker threads that make chunks. cuMemCreate +
 * cuMemExportToShareableHandle take ~1.2 ms a chunk on the H100, far too
 * long for the event loop, so the loop orders "make N chunks" and gets the
 * results back on its own thread, through a uv_async, in a callback. The pool
 * knows nothing of the lake or its policy (broker.c decides how many). */
#ifndef GML_CREATOR_H
#define GML_CREATOR_H
#include "backend.h"
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct creator_result {
  gml_phys phys;
  int fd;  /* its exported handle; -1 when creating it failed */
  int err; /* ... then errno as the creation left it (EMFILE: the fd table was full) */
} creator_result;

/* Runs on the loop thread with the chunks made since the last call; it owns
 * them (keeps or releases each). */
typedef void (*creator_done_fn)(void *arg, const creator_result *r, size_t n);

typedef struct creator {
  gml_backend *be;
  pthread_t *threads;
  int nthreads;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t requested; /* chunks still to make */
  size_t inflight;    /* being made right now */
  int stop;
  creator_result *done;
  size_t ndone, done_cap;
  uint64_t failures;
  uv_async_t async;
  creator_done_fn on_done;
  void *arg;
} creator;

int creator_start(creator *cr, uv_loop_t *loop, gml_backend *be, int nthreads, creator_done_fn on_done, void *arg);
/* Make n more chunks (on top of those ordered before). */
void creator_make(creator *cr, uint64_t n);
/* Joins the threads; chunks made but not handed over are released. */
void creator_stop(creator *cr);
#endif
