/* replay_plan.c: gmlake-replay --plan[=STEP]: the trace cut into steps as
 * --steps cuts it, each step served by the plan keeper (client/plan.c) as
 * the allocator would: a hit takes its planned offset in the plan's range, a
 * miss goes to a separate pool. Prints per step the max live bytes, the
 * planned range, the planned peak (the range plus what the pool holds) and
 * hits and misses, and overall how close planned peak comes to max live and
 * how many steps the plan served entirely. The pool is modelled as holding
 * exactly its live bytes (a perfect stitching allocator), so the peak here is
 * what the plan costs, not what the stitching costs. */
#include "gmlake.h"
#include "plan.h"
#include "replay.h"
#include "statsview.h"
#include "util.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct plan_step_row {
  size_t allocs, lent;            /* lent: misses placed in the range's free granules */
  uint64_t max_live, range, peak; /* peak: the range plus the pool's live bytes, at its highest in the step */
  uint64_t verdicts[GML_PLAN_VERDICTS];
  int full;         /* every allocation of the step matched the plan and was served from it where planned */
  int taken;        /* a plan was taken from this step (served from the next) */
  long plan_from;   /* the step the serving plan was taken from; -1: none */
  uint64_t plan_lb; /* at a take: the new plan's lower bound and range */
  uint64_t plan_range;
} plan_step_row;

/* A departing step's misses of at least this much are lent the plan range's
 * free granules: the allocator's chunk (2 MiB on the GPUs measured) */
#define REPLAY_PLAN_GRANULE (2ull << 20)

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0; }

/* The highest byte the range holds: the plan's, or above it a live block of an earlier plan. */
static uint64_t range_in_use(const gml_plan_keeper *kp) {
  uint64_t r = kp->plan ? kp->plan->range : 0;
  for (uint32_t i = 0; i < kp->srv.nstraggler; i++)
    if (kp->srv.straggler[i].offset + kp->srv.straggler[i].size > r)
      r = kp->srv.straggler[i].offset + kp->srv.straggler[i].size;
  return r;
}

/* Serves the events of steps [0, nsteps) through the keeper into rows. */
static int plan_simulate(gml_plan_keeper *kp, const replay_event *ev, const step_sample *v, const size_t *ends,
                         size_t nsteps, plan_step_row *rows, uint64_t *visits_per_hit) {
  gml_plan_grant *grant = calloc(ends[nsteps - 1] ? ends[nsteps - 1] : 1, sizeof *grant);
  if (!grant) return -ENOMEM;
  uint64_t pool = 0; /* bytes live outside the plan's range */
  for (size_t s = 0, i = 0; s < nsteps; s++) {
    plan_step_row *r = &rows[s];
    memset(r, 0, sizeof *r);
    for (; i < ends[s]; i++) {
      if (ev[i].is_alloc) {
        int rc = gmli_plan_keeper_alloc(kp, ev[i].size, ev[i].stream, &grant[i]);
        if (rc < 0) {
          free(grant);
          return rc;
        }
        r->allocs++, r->verdicts[rc]++;
        if (rc != GML_PLAN_HIT && !grant[i].lent) pool += ev[i].size;
        r->lent += grant[i].lent;
      } else {
        const gml_plan_grant *g = &grant[ev[i].alloc_event];
        if (g->index == GML_PLAN_NEVER && !g->lent) pool -= ev[ev[i].alloc_event].size;
        gmli_plan_keeper_free(kp, g);
      }
      uint64_t reserved = range_in_use(kp) + pool;
      r->peak = reserved > r->peak ? reserved : r->peak;
      r->max_live = v[i].live > r->max_live ? v[i].live : r->max_live;
    }
    r->range = range_in_use(kp);
    /* the plan that served the step's end (the keeper may have switched to it at the step's first allocations) */
    r->plan_from = kp->plan ? (long)kp->planned_from : -1;
    r->full = kp->plan && r->allocs == kp->plan->n && !r->verdicts[GML_PLAN_MISS_SHAPE] &&
              !r->verdicts[GML_PLAN_MISS_OCCUPIED];
    int rc = gmli_plan_keeper_step(kp);
    if (rc < 0) {
      free(grant);
      return rc;
    }
    if (rc == 1) r->taken = 1, r->plan_lb = kp->plan->lower_bound, r->plan_range = kp->plan->range;
  }
  uint64_t hits = kp->srv.verdicts[GML_PLAN_HIT];
  *visits_per_hit = hits ? kp->srv.tree_visits / hits : 0;
  free(grant);
  return 0;
}

static void print_rows_text(const char *name, const plan_step_row *rows, size_t nsteps, long plan_step) {
  printf("%s: plan (%s)\n", name,
         plan_step < 0
             ? "one per pattern: taken when a step repeats an earlier one, picked by a step's first allocations"
             : "taken from the step given");
  printf("  %4s %6s %9s %9s %9s %7s %6s %6s %6s %6s %6s %5s %5s %s\n", "step", "allocs", "max_live", "range", "peak",
         "pk/live", "hits", "noplan", "shape", "unplan", "occup", "lent", "plan", "");
  for (size_t s = 0; s < nsteps; s++) {
    const plan_step_row *r = &rows[s];
    char from[24] = "-";
    if (r->plan_from >= 0) snprintf(from, sizeof from, "%ld", r->plan_from);
    printf("  %4zu %6zu %8.3fG %8.3fG %8.3fG %7.4f %6llu %6llu %6llu %6llu %6llu %5zu %5s %s", s, r->allocs,
           r->max_live / (double)GML_GIB, r->range / (double)GML_GIB, r->peak / (double)GML_GIB,
           ratio(r->peak, r->max_live), (unsigned long long)r->verdicts[GML_PLAN_HIT],
           (unsigned long long)r->verdicts[GML_PLAN_MISS_NOPLAN], (unsigned long long)r->verdicts[GML_PLAN_MISS_SHAPE],
           (unsigned long long)r->verdicts[GML_PLAN_MISS_UNPLANNED],
           (unsigned long long)r->verdicts[GML_PLAN_MISS_OCCUPIED], r->lent, from, r->full ? "from the plan" : "");
    if (r->taken)
      printf("%splan taken: range %.3f GiB, lower bound %.3f GiB (x%.4f)", r->full ? "; " : "",
             r->plan_range / (double)GML_GIB, r->plan_lb / (double)GML_GIB, ratio(r->plan_range, r->plan_lb));
    printf("\n");
  }
}

static void print_rows_json(const char *name, const plan_step_row *rows, size_t nsteps) {
  printf("{\"trace\":");
  gmli_print_json_string(stdout, name);
  printf(",\"plan_steps\":[");
  for (size_t s = 0; s < nsteps; s++) {
    const plan_step_row *r = &rows[s];
    printf("%s{\"step\":%zu,\"allocs\":%zu,\"max_live\":%llu,\"range\":%llu,\"peak\":%llu,\"hits\":%llu,\"miss_"
           "noplan\":%llu,"
           "\"miss_shape\":%llu,\"miss_unplanned\":%llu,\"miss_occupied\":%llu,\"plan_from\":%ld,\"from_plan\":%s",
           s ? "," : "", s, r->allocs, (unsigned long long)r->max_live, (unsigned long long)r->range,
           (unsigned long long)r->peak, (unsigned long long)r->verdicts[GML_PLAN_HIT],
           (unsigned long long)r->verdicts[GML_PLAN_MISS_NOPLAN], (unsigned long long)r->verdicts[GML_PLAN_MISS_SHAPE],
           (unsigned long long)r->verdicts[GML_PLAN_MISS_UNPLANNED],
           (unsigned long long)r->verdicts[GML_PLAN_MISS_OCCUPIED], r->plan_from, r->full ? "true" : "false");
    if (r->taken)
      printf(",\"plan_taken_range\":%llu,\"plan_taken_lower_bound\":%llu", (unsigned long long)r->plan_range,
             (unsigned long long)r->plan_lb);
    printf("}");
  }
  printf("]");
}

int replay_plan(const char *name, const replay_event *ev, const step_sample *v, size_t n, const size_t *marks,
                size_t nmarks, long plan_step, int json) {
  if (!n) return 0;
  size_t *ends = malloc(n * sizeof *ends);
  plan_step_row *rows = calloc(n, sizeof *rows);
  gml_plan_keeper kp;
  gmli_plan_keeper_init(&kp, GML_PLAN_ALIGN, plan_step);
  kp.srv.granule = REPLAY_PLAN_GRANULE;
  uint64_t floor, visits_per_hit = 0;
  size_t nsteps = ends && rows ? replay_step_ends(v, n, marks, nmarks, ends, &floor) : 0;
  if (nsteps && plan_step >= (long)nsteps) {
    fprintf(stderr, "gmlake-replay: %s: --plan=%ld: the trace has %zu steps (0 to %zu)\n", name, plan_step, nsteps,
            nsteps - 1);
    gmli_plan_keeper_destroy(&kp);
    free(ends), free(rows);
    return 1;
  }
  if (!nsteps || plan_simulate(&kp, ev, v, ends, nsteps, rows, &visits_per_hit)) {
    fprintf(stderr, "gmlake-replay: %s: out of memory for --plan's %zu events\n", name, n);
    gmli_plan_keeper_destroy(&kp);
    free(ends), free(rows);
    return 1;
  }
  /* Overall, over the steps served while a plan existed ("from the second
   * iteration on"): their highest peak against their highest max live; and
   * the worst ratio of one step among those served entirely by the plan. */
  uint64_t peak = 0, live = 0, hits = 0, misses = 0;
  double worst_full = 0;
  size_t full = 0, with_plan = 0;
  for (size_t s = 0; s < nsteps; s++) {
    const plan_step_row *r = &rows[s];
    hits += r->verdicts[GML_PLAN_HIT];
    for (int k = GML_PLAN_HIT + 1; k < GML_PLAN_VERDICTS; k++) misses += r->verdicts[k];
    if (r->plan_from < 0 || !r->allocs) continue;
    with_plan++;
    peak = r->peak > peak ? r->peak : peak;
    live = r->max_live > live ? r->max_live : live;
    if (r->full) {
      full++;
      worst_full = ratio(r->peak, r->max_live) > worst_full ? ratio(r->peak, r->max_live) : worst_full;
    }
  }
  if (json) {
    print_rows_json(name, rows, nsteps);
    printf(",\"steps\":%zu,\"steps_with_plan\":%zu,\"steps_from_plan\":%zu,\"plans_taken\":%u,\"hits\":%llu,\"misses\":"
           "%llu,"
           "\"planned_peak\":%llu,\"max_live\":%llu,\"planned_peak_over_max_live\":%.6f,\"worst_from_plan_step\":%.6f,"
           "\"tree_visits_per_hit\":%llu,\"plans_kept\":%u,\"plan_switches\":%u,\"plans_dropped\":%u,\"plan_seconds\":%"
           ".6f,"
           "\"plan_seconds_max\":%.6f,\"lent\":%llu,\"lent_bytes\":%llu}\n",
           nsteps, with_plan, full, kp.plans_taken, (unsigned long long)hits, (unsigned long long)misses,
           (unsigned long long)peak, (unsigned long long)live, ratio(peak, live), worst_full,
           (unsigned long long)visits_per_hit, kp.nkept, kp.switches, kp.dropped, kp.plan_seconds, kp.plan_seconds_max,
           (unsigned long long)kp.srv.lends, (unsigned long long)kp.srv.lent_bytes);
  } else {
    print_rows_text(name, rows, nsteps, plan_step);
    printf("  %s: %zu steps, %zu with a plan, %zu served from the plan, %u plan(s) taken; %llu hits, %llu misses; "
           "planned peak / max live over the steps with a plan: %.3f / %.3f GiB = %.4f; worst step served from the "
           "plan: %.4f; "
           "atom tree nodes visited per hit (its check and count, frees, lends): %llu; %u plan(s) kept at the end, %u "
           "switch(es), %u dropped; "
           "planning %.1f ms in all, %.1f ms the longest; %llu misses lent %.3f GiB of the range in all\n",
           name, nsteps, with_plan, full, kp.plans_taken, (unsigned long long)hits, (unsigned long long)misses,
           peak / (double)GML_GIB, live / (double)GML_GIB, ratio(peak, live), worst_full,
           (unsigned long long)visits_per_hit, kp.nkept, kp.switches, kp.dropped, kp.plan_seconds * 1e3,
           kp.plan_seconds_max * 1e3, (unsigned long long)kp.srv.lends, kp.srv.lent_bytes / (double)GML_GIB);
  }
  gmli_plan_keeper_destroy(&kp);
  free(ends), free(rows);
  return 0;
}
