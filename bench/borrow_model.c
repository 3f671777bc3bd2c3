/* borrow_model: the two-replica workload of bench/borrow.py modelled on
 * the host, with borrowing off and on. A recorded single-stream trace
 * (bench/traces, with step marks) is replayed as two replicas on two
 * streams in one allocator, step i of replica 0 then step i of replica 1,
 * then a synchronize (borrow.py's torch.cuda.synchronize per step). Each
 * allocation and each free launches a unit of work on its stream (a kernel
 * writing it, its last use); the device lags the CPU: every `lag` CPU
 * operations each stream completes one unit (host backend, fake events),
 * so frees are still pending on one stream when the other allocates.
 *
 *   make borrow-model && build/borrow-model [--steps N] [--lag K] TRACE
 *
 * Prints per setting: peak reserved and allocated, maps, unmaps, device
 * synchronizations, borrows and waits. Not part of the test suite. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../tests/backends.h"
#include "alloc.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef struct ev {
  char op; /* 'a' or 'f' */
  unsigned long long id, size;
} ev;

static ev *evs;
static size_t nevs, cap_evs, marks[4096];
static int nmarks;
static unsigned long long max_id;
static gml_backend *be;

static int acquire(void *ctx, size_t n, int optional, gml_phys *phys, uint64_t *ids) {
  (void)ctx, (void)optional;
  for (size_t k = 0; k < n; k++) {
    if (be->ops->chunk_create(be, &phys[k], NULL)) return k ? (int)k : GML_ENOMEM;
    ids[k] = k;
  }
  return (int)n;
}

static void release(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids) {
  (void)ctx, (void)ids;
  for (size_t i = 0; i < n; i++) be->ops->chunk_release(be, phys[i]);
}

static int load(const char *path) {
  gzFile f = gzopen(path, "r");
  char line[256];
  if (!f) return -1;
  while (gzgets(f, line, sizeof line)) {
    ev e = {0};
    unsigned long long stream;
    if (line[0] == 's' && nmarks < 4096) marks[nmarks++] = nevs;
    if (line[0] == 'a' && sscanf(line + 1, "%llu %llu %llu", &e.id, &e.size, &stream) == 3) e.op = 'a';
    else if (line[0] == 'f' && sscanf(line + 1, "%llu", &e.id) == 1) e.op = 'f';
    else continue;
    if (nevs == cap_evs && !(evs = realloc(evs, (cap_evs = cap_evs ? cap_evs * 2 : 1 << 16) * sizeof *evs))) return -1;
    if (e.id > max_id) max_id = e.id;
    evs[nevs++] = e;
  }
  gzclose(f);
  return 0;
}

typedef struct run {
  gml_allocator a;
  void **live[2];
  unsigned long long ops;
  int lag;
} run;

static int play(run *m, int r, const ev *e) {
  gml_stream s = (gml_stream)r + 1;
  if (e->op == 'a') {
    void *p;
    gml_host_fake_launch(be, s);
    if (gmli_alloc_malloc(&m->a, e->size, s, &p)) {
      fprintf(stderr, "borrow-model: %s\n", m->a.last_error);
      return -1;
    }
    m->live[r][e->id] = p;
  } else if (m->live[r][e->id]) {
    gml_host_fake_launch(be, s);
    gmli_alloc_free(&m->a, m->live[r][e->id]);
    m->live[r][e->id] = NULL;
  }
  if (++m->ops % (unsigned long long)m->lag == 0)
    for (gml_stream q = 1; q <= 2; q++) gml_host_fake_progress(be, q, 1);
  return 0;
}

static int model(int borrow, int steps, int lag) {
  char msg[256];
  if (gmli_backend_open("host", 0, NULL, &be, msg, sizeof msg) || gml_host_fake_events(be)) return -1;
  static run m;
  memset(&m, 0, sizeof m);
  m.lag = lag;
  gml_alloc_config cfg = GML_ALLOC_CONFIG_DEFAULT;
  cfg.borrow = borrow;
  if (gmli_alloc_init(&m.a, be, (gml_chunk_source){NULL, acquire, release, NULL}, 128ul << 30, &cfg)) return -1;
  for (int r = 0; r < 2; r++) m.live[r] = calloc(max_id + 1, sizeof(void *));
  int first = nmarks > 2 ? 2 : 0, rc = 0; /* the steps after the first two (warm-up) */
  for (int r = 0; r < 2 && !rc; r++)      /* each replica's model, optimizer state and first steps */
    for (size_t i = 0; i < (first ? marks[first] : 0) && !rc; i++) rc = play(&m, r, &evs[i]);
  be->ops->synchronize(be);
  for (int st = first; st < first + steps && st + 1 < nmarks && !rc; st++) {
    for (int r = 0; r < 2 && !rc; r++)
      for (size_t i = marks[st]; i < marks[st + 1] && !rc; i++) rc = play(&m, r, &evs[i]);
    be->ops->synchronize(be);
  }
  gml_stats s;
  gmli_alloc_stats(&m.a, &s);
  printf("borrowing %-3s  peak reserved %7.3f GiB  peak allocated %7.3f GiB  maps %6llu  unmaps %6llu  syncs %4llu  "
         "borrows %6llu  waits %4llu\n",
         borrow ? "on" : "off", s.peak_reserved / 1073741824.0, s.peak_allocated / 1073741824.0,
         (unsigned long long)s.maps, (unsigned long long)s.unmaps, (unsigned long long)s.syncs,
         (unsigned long long)s.borrows, (unsigned long long)s.borrow_waits);
  for (int r = 0; r < 2; r++) free(m.live[r]);
  gmli_alloc_destroy(&m.a);
  gmli_backend_close(be);
  return rc;
}

int main(int argc, char **argv) {
  int steps = 10, lag = 8, i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--lag") && i + 1 < argc) lag = atoi(argv[++i]);
    else break;
  }
  if (i != argc - 1 || lag < 1 || load(argv[i])) {
    fprintf(stderr, "usage: borrow-model [--steps N] [--lag K] TRACE (a trace with step marks, bench/traces)\n");
    return 2;
  }
  printf("%s: two replicas on two streams, %d steps, device one unit behind every %d CPU operations\n", argv[i], steps,
         lag);
  return model(0, steps, lag) || model(1, steps, lag);
}
