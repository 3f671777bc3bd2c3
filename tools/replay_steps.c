/* replay_steps.c: gmlake-replay's cut of a trace into training steps (by
 * the trace's step marks, or where live memory returns to the floor it keeps
 * between steps), and --steps's table of the driver calls each step made. */
#include "gmlake.h"
#include "options.h"
#include "replay.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Modelled cost of the driver calls the allocator made, in microseconds,
 * from bench/vmm_cost.c on an idle H100 (bench/results/history.md): cuMemUnmap 17.6 per
 * chunk; cuMemMap 1.0 plus cuMemSetAccess 27 per newly mapped chunk (whether
 * set one by one or for a whole run), so "map" carries both and a set-access
 * call costs nothing more; a synchronize is a guess. Busy GPUs cost more.
 * Override with GMLAKE_REPLAY_COST="unmap,map,access,sync". */
static void step_costs(double *c) {
  c[0] = 18, c[1] = 28, c[2] = 0, c[3] = 100;
  const char *e = gmli_env(GML_ENV_REPLAY_COST);
  double v[4];
  char extra;
  if (e && sscanf(e, "%lf,%lf,%lf,%lf%c", &v[0], &v[1], &v[2], &v[3], &extra) == 4) memcpy(c, v, sizeof v);
  else if (e)
    fprintf(
        stderr,
        "gmlake-replay: GMLAKE_REPLAY_COST=%s: four numbers unmap,map,access,sync were expected; using %g,%g,%g,%g\n",
        e, c[0], c[1], c[2], c[3]);
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* A step ends where the trace marks the next one's start, or, unmarked,
 * where live bytes come back down to the floor the trace keeps between
 * steps (its minimum over the middle of the trace, plus 2% of the swing,
 * after rising past 10% of it); the last event ends the last step. */
size_t replay_step_ends(const step_sample *v, size_t n, const size_t *marks, size_t nmarks, size_t *ends,
                        uint64_t *floor) {
  uint64_t lowest = UINT64_MAX, peak = 0;
  for (size_t i = n / 5; i < n * 9 / 10; i++) lowest = v[i].live < lowest ? v[i].live : lowest;
  for (size_t i = 0; i < n; i++) peak = v[i].live > peak ? v[i].live : peak;
  if (lowest > peak) lowest = 0; /* too few events for a middle */
  uint64_t lo = lowest + (peak - lowest) / 50, hi = lowest + (peak - lowest) / 10;
  *floor = lowest;
  size_t nsteps = 0, mk = 0;
  int above = 0;
  while (mk < nmarks && marks[mk] == 0) mk++;
  for (size_t i = 0; i < n; i++) {
    if (nmarks) { /* the trace marks where each step begins */
      if (!(mk < nmarks && marks[mk] == i + 1) && i != n - 1) continue;
      while (mk < nmarks && marks[mk] <= i + 1) mk++;
    } else {
      if (v[i].live > hi) above = 1;
      if (!(above && v[i].live <= lo) && i != n - 1) continue;
    }
    ends[nsteps++] = i + 1;
    above = 0;
  }
  return nsteps;
}

/* A row per step and the median modelled cost of steps >= 2, the statistic
 * bench/torch_bench.py reports for ms/step. */
int print_steps(const char *name, const step_sample *v, size_t n, const size_t *marks, size_t nmarks) {
  if (n < 10) return 0;
  double cost[4];
  step_costs(cost);
  double *ms = malloc(n * sizeof *ms);
  size_t *ends = malloc(n * sizeof *ends);
  if (!ms || !ends) {
    fprintf(stderr, "gmlake-replay: %s: out of memory for the steps of %zu events\n", name, n);
    free(ms), free(ends);
    return 1;
  }
  uint64_t floor;
  size_t nsteps = replay_step_ends(v, n, marks, nmarks, ends, &floor);
  printf("%s: steps (%s, floor %.2f GiB, cost model us: unmap %.0f map %.0f access %.0f sync %.0f)\n", name,
         nmarks ? "as marked in the trace" : "cut where live memory returns to the floor", floor / (double)GML_GIB,
         cost[0], cost[1], cost[2], cost[3]);
  printf("  %4s %8s %9s %6s %6s %6s %5s %9s %7s %8s %6s\n", "step", "events", "peak", "maps", "unmaps", "access",
         "syncs", "model_ms", "mallocs", "headroom", "leased");
  for (size_t s = 0, start = 0; s < nsteps; start = ends[s++]) {
    uint64_t speak = 0;
    for (size_t i = start; i < ends[s]; i++) speak = v[i].live > speak ? v[i].live : speak;
    const step_sample *a = start ? &v[start - 1] : &(step_sample){0}, *b = &v[ends[s] - 1];
    double m = ((b->unmaps - a->unmaps) * cost[0] + (b->maps - a->maps) * cost[1] + (b->access - a->access) * cost[2] +
                (b->syncs - a->syncs) * cost[3]) /
               1000.0;
    printf("  %4zu %8zu %8.2fG %6llu %6llu %6llu %5llu %9.2f %7llu %8llu %6llu\n", s, ends[s] - start,
           speak / (double)GML_GIB, (unsigned long long)(b->maps - a->maps),
           (unsigned long long)(b->unmaps - a->unmaps), (unsigned long long)(b->access - a->access),
           (unsigned long long)(b->syncs - a->syncs), m, (unsigned long long)(b->mapping - a->mapping),
           (unsigned long long)(b->headroom - a->headroom), (unsigned long long)(b->leased - a->leased));
    ms[s] = m;
  }
  if (nsteps > 3) {
    qsort(ms + 2, nsteps - 2, sizeof *ms, cmp_double);
    double med =
        (nsteps - 2) % 2 ? ms[2 + (nsteps - 2) / 2] : (ms[2 + (nsteps - 2) / 2 - 1] + ms[2 + (nsteps - 2) / 2]) / 2;
    double sum = 0;
    for (size_t i = 2; i < nsteps; i++) sum += ms[i];
    printf("  %s: %zu steps, modelled driver time per step >= 2: median %.2f ms, mean %.2f ms\n", name, nsteps, med,
           sum / (double)(nsteps - 2));
  }
  free(ms), free(ends);
  return 0;
}
