/* alloc_fastpath.c: instructions per gml_alloc/gml_free on the fast path
 * (bench/results/history.md, issue 14). One "step" of N allocations of fixed mixed
 * sizes freed in a shuffled order, repeated; from step 10 on callgrind
 * counts (every request is then a cached fit). Not built by make:
 *   cc -O2 -Iinclude bench/alloc_fastpath.c build/libgmlake-client.a -o /tmp/fp -pthread -lprotobuf-c -ldl
 *   GMLAKE_VA_SIZE=16GiB GMLAKE_BACKEND=host GMLAKE_MODE=embedded \
 *     valgrind --tool=callgrind --callgrind-out-file=/tmp/fp.cg /tmp/fp 40
 *   callgrind_annotate --inclusive=yes /tmp/fp.cg | grep -E 'gml_alloc_(malloc|free) '
 * (per call: divide by 30 * 2000). Without valgrind it prints ns/op. */
#include "gmlake.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <valgrind/callgrind.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}
int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 300;
  enum { N = 2000 };
  size_t sz[N];
  int ord[N];
  void *p[N];
  unsigned long long r = 42;
  for (int i = 0; i < N; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    unsigned x = (unsigned)(r >> 33);
    sz[i] = (x & 3) == 0 ? 64 + x % 8192 : (x & 3) == 1 ? 8192 + x % (1 << 20) : (1 << 20) + x % (16 << 20);
    ord[i] = i;
  }
  for (int i = N - 1; i > 0; i--) {
    r = r * 6364136223846793005ull + 1;
    int j = (int)((r >> 33) % (unsigned)(i + 1));
    int t = ord[i];
    ord[i] = ord[j];
    ord[j] = t;
  }
  gml_client *c;
  int orc = gml_open(NULL, &c);
  if (orc) {
    fprintf(stderr, "gml_open: %s\n", gml_strerror(orc));
    return 1;
  }
  double ta = 0, tf = 0;
  for (int s = 0; s < steps; s++) {
    if (s == 10) CALLGRIND_ZERO_STATS;
    double t0 = now();
    for (int i = 0; i < N; i++)
      if (gml_alloc(c, sz[i], 0, &p[i])) return 2;
    double t1 = now();
    for (int i = 0; i < N; i++) gml_free(c, p[ord[i]]);
    double t2 = now();
    if (s >= 10) ta += t1 - t0, tf += t2 - t1;
  }
  printf("alloc %.1f ns/op  free %.1f ns/op\n", ta / ((steps - 10) * (double)N), tf / ((steps - 10) * (double)N));
  gml_close(c);
  return 0;
}
