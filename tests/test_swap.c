/* The swap planner (client/swap.c) alone, no client: on synthetic
 * iterations (saves in forward, reads in backward, a live-bytes curve with
 * spikes), checked against an exhaustive search over every subset of the
 * tensors (12 at most) written here from the model gmlake.h states, not
 * from the planner's code; every plan re-checked from its moves alone: the
 * peak they leave, the copy queues they imply. */
#include "gmlake.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state;
static uint64_t rnd(void) { /* splitmix64: the same cases on every machine */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static uint64_t below(uint64_t n) { return rnd() % n; }

#define MAXT 400
#define MAXE (3 * MAXT + 8)
typedef struct iter {
  uint32_t nev, nt;
  uint64_t time[MAXE], live[MAXE];
  gml_swap_tensor t[MAXT];
} iter;

/* A training-like iteration of n tensors: each forward event saves one (some events save nothing: a layer
 * without a saved tensor), backward reads them back mostly in reverse; each tensor is live from its save to
 * its read; the rest (weights, transients) is a base and a spike here and there. Times grow by an op's
 * time per event (1-200 us). */
static void make_iter(iter *it, uint32_t n, int shuffle) {
  memset(it, 0, sizeof *it);
  uint32_t e = 0;
  for (uint32_t i = 0; i < n; i++) {
    e += (uint32_t)below(2); /* an event without a save */
    it->t[i] = (gml_swap_tensor){.id = 1000 + i, .bytes = (1 + below(16)) << 20, .saved_at = e++};
  }
  uint32_t order[MAXT];
  for (uint32_t i = 0; i < n; i++) order[i] = n - 1 - i;
  for (uint32_t i = 0; shuffle && i + 1 < n; i++)
    if (below(4) == 0) {
      uint32_t x = order[i];
      order[i] = order[i + 1], order[i + 1] = x;
    }
  e += 1 + (uint32_t)below(3); /* the loss */
  for (uint32_t i = 0; i < n; i++) {
    e += (uint32_t)below(2);
    it->t[order[i]].used_at = e++;
  }
  if (below(5) == 0 && n) it->t[below(n)].used_at = GML_SWAP_NEVER; /* saved, never read back */
  it->nev = e + 1;
  it->nt = n;
  uint64_t now = 0, base = 64 << 20;
  for (uint32_t k = 0; k < it->nev; k++) {
    now += 1000 + below(200000);
    it->time[k] = now;
    uint64_t l = base + (below(6) == 0 ? below(24) << 20 : 0);
    for (uint32_t i = 0; i < n; i++) {
      uint32_t end = it->t[i].used_at == GML_SWAP_NEVER ? it->nev : it->t[i].used_at;
      if (it->t[i].saved_at <= k && k <= end) l += it->t[i].bytes;
    }
    it->live[k] = l;
  }
}

static gml_swap_input input_of(const iter *it, uint64_t cap, double bps, int64_t max_nodes) {
  return (gml_swap_input){.nevents = it->nev,
                          .time_ns = it->time,
                          .live = it->live,
                          .ntensors = it->nt,
                          .tensors = it->t,
                          .cap = cap,
                          .out_bps = bps,
                          .in_bps = bps,
                          .max_nodes = max_nodes};
}

/* ---- the model, from gmlake.h's words ---- */

static uint64_t model_copy_ns(uint64_t bytes, double bps) { /* rounded up, at least 1 ns */
  double ns = (double)bytes / bps * 1e9;
  uint64_t n = (uint64_t)ns;
  n += (double)n < ns;
  return n ? n : 1;
}
/* Tensor i's window alone, events (o, p) exclusive; 0 when it has none. */
static int model_window(const iter *it, uint32_t i, double bps, uint32_t *o, uint32_t *p) {
  const gml_swap_tensor *t = &it->t[i];
  if (t->used_at == GML_SWAP_NEVER) return 0;
  uint64_t done = it->time[t->saved_at] + model_copy_ns(t->bytes, bps), in = model_copy_ns(t->bytes, bps);
  uint32_t e = t->saved_at + 1;
  while (e < t->used_at && it->time[e] < done) e++;
  *o = e;
  int found = 0;
  for (uint32_t x = *o + 1; x < t->used_at; x++)
    if (it->time[x] + in <= it->time[t->used_at]) *p = x, found = 1;
  return found && *p > *o + 1;
}
/* Every subset's peak and bytes (windows alone): sub[mask]. */
typedef struct subsets {
  uint64_t peak[1 << 12], bytes[1 << 12];
  uint32_t n;
} subsets;
static void all_subsets(const iter *it, double bps, subsets *S) {
  uint32_t o[12], p[12];
  int has[12];
  ck_assert_uint_le(it->nt, 12);
  for (uint32_t i = 0; i < it->nt; i++) has[i] = model_window(it, i, bps, &o[i], &p[i]);
  S->n = 1u << it->nt;
  for (uint32_t mask = 0; mask < S->n; mask++) {
    int64_t d[MAXE + 1] = {0};
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < it->nt; i++)
      if (mask >> i & 1) {
        bytes += it->t[i].bytes;
        if (has[i]) d[o[i] + 1] -= it->t[i].bytes, d[p[i]] += it->t[i].bytes;
      }
    int64_t run = 0;
    uint64_t peak = 0;
    for (uint32_t e = 0; e < it->nev; e++) {
      run += d[e];
      if ((uint64_t)((int64_t)it->live[e] + run) > peak) peak = (uint64_t)((int64_t)it->live[e] + run);
    }
    S->peak[mask] = peak, S->bytes[mask] = bytes;
  }
}
/* The fewest bytes of a subset whose peak fits cap (UINT64_MAX: none fits); *lowest: the lowest peak of any. */
static uint64_t exhaustive(const subsets *S, uint64_t cap, uint64_t *lowest) {
  uint64_t best = UINT64_MAX;
  *lowest = UINT64_MAX;
  for (uint32_t mask = 0; mask < S->n; mask++) {
    if (S->peak[mask] < *lowest) *lowest = S->peak[mask];
    if (S->peak[mask] <= cap && S->bytes[mask] < best) best = S->bytes[mask];
  }
  return best;
}

/* A plan checked from its moves alone: each names a tensor that is read back, goes out at its save, is gone
 * after the copy and comes back before its read; the outs through one queue in save order and the ins
 * through another in order of in_at land in time (late_ns says by how much not); the peak they leave is
 * peak_after, and fits the cap when the plan says feasible. Returns peak_after. */
static uint64_t check_plan(const iter *it, const gml_swap_plan *p, double bps) {
  int64_t d[MAXE + 1] = {0};
  uint64_t bytes = 0, busy = 0, late = 0;
  for (uint32_t j = 0; j < p->nmoves; j++) {
    const gml_swap_move *m = &p->moves[j];
    ck_assert_uint_lt(m->tensor, it->nt);
    const gml_swap_tensor *t = &it->t[m->tensor];
    ck_assert_uint_eq(m->id, t->id);
    ck_assert_uint_eq(m->bytes, t->bytes);
    ck_assert_uint_eq(m->out_at, t->saved_at);
    ck_assert_uint_eq(m->used_at, t->used_at);
    ck_assert(m->out_at < m->gone_at && m->gone_at + 1 < m->in_at && m->in_at < m->used_at);
    ck_assert(j == 0 || p->moves[j - 1].out_at <= m->out_at);
    uint64_t start = it->time[m->out_at] > busy ? it->time[m->out_at] : busy;
    busy = start + model_copy_ns(m->bytes, bps);
    ck_assert_msg(it->time[m->gone_at] >= busy, "move %u counted gone before its copy out is done", j);
    d[m->gone_at + 1] -= m->bytes, d[m->in_at] += m->bytes;
    bytes += m->bytes;
    for (uint32_t k = 0; k < j; k++) ck_assert_uint_ne(p->moves[k].tensor, m->tensor);
  }
  /* ins: issued at in_at's time, one after another in the order issued */
  uint32_t order[MAXT];
  for (uint32_t j = 0; j < p->nmoves; j++) {
    uint32_t k = j;
    while (k > 0 && p->moves[order[k - 1]].in_at > p->moves[j].in_at) order[k] = order[k - 1], k--;
    order[k] = j;
  }
  busy = 0;
  for (uint32_t j = 0; j < p->nmoves; j++) {
    const gml_swap_move *m = &p->moves[order[j]];
    uint64_t start = it->time[m->in_at] > busy ? it->time[m->in_at] : busy;
    busy = start + model_copy_ns(m->bytes, bps);
    late += busy > it->time[m->used_at] ? busy - it->time[m->used_at] : 0;
  }
  ck_assert_uint_eq(late, p->late_ns);
  ck_assert_uint_eq(bytes, p->bytes_moved);
  int64_t run = 0;
  uint64_t peak = 0;
  for (uint32_t e = 0; e < it->nev; e++) {
    run += d[e];
    if ((uint64_t)((int64_t)it->live[e] + run) > peak) peak = (uint64_t)((int64_t)it->live[e] + run);
  }
  ck_assert_uint_eq(peak, p->peak_after);
  ck_assert_int_eq(p->feasible, peak <= p->cap);
  return peak;
}

static gml_swap_plan *plan_of(const iter *it, uint64_t cap, double bps, int64_t max_nodes) {
  gml_swap_input in = input_of(it, cap, bps, max_nodes);
  gml_swap_plan *p = NULL;
  ck_assert_int_eq(gml_swap_plan_build(&in, &p), 0);
  ck_assert_ptr_nonnull(p);
  return p;
}

#define FAST 1e18 /* copies of 1 ns: every tensor's window is (save, read) */

START_TEST(test_fits_moves_nothing) {
  rng_state = 1;
  iter *it = malloc(sizeof *it);
  for (int c = 0; c < 200; c++) {
    make_iter(it, 1 + (uint32_t)below(40), c & 1);
    uint64_t peak = 0;
    for (uint32_t e = 0; e < it->nev; e++) peak = it->live[e] > peak ? it->live[e] : peak;
    gml_swap_plan *p = plan_of(it, peak + below(2) * below(1 << 30), c & 2 ? FAST : 25e9, 0);
    ck_assert_int_eq(p->feasible, 1);
    ck_assert_uint_eq(p->nmoves, 0);
    ck_assert_uint_eq(p->bytes_moved, 0);
    ck_assert_uint_eq(p->peak_after, peak);
    ck_assert_uint_eq(p->peak_before, peak);
    gml_swap_plan_free(p);
  }
  free(it);
}
END_TEST

/* Fast copies, so the queues narrow nothing: the planner's bytes are the exhaustive search's fewest, for every
 * cap between the lowest peak any subset reaches and the peak; below that, infeasible, and as low as it goes.
 * The greedy plan alone (max_nodes < 0) is worse on some of them: the comparison catches a worse planner. */
START_TEST(test_fewest_bytes_against_exhaustive) {
  rng_state = 2;
  iter *it = malloc(sizeof *it);
  subsets *S = malloc(sizeof *S);
  int cases = 0, greedy_worse = 0, infeasible = 0, searched = 0;
  for (int c = 0; c < 1500; c++) {
    make_iter(it, 2 + (uint32_t)below(11), c & 1);
    all_subsets(it, FAST, S);
    uint64_t peak = S->peak[0], lowest;
    exhaustive(S, peak, &lowest);
    uint64_t cap = below(8) == 0 ? lowest - 1 - below(4 << 20) : lowest + below(peak - lowest + 1);
    uint64_t best = exhaustive(S, cap, &lowest);
    gml_swap_plan *p = plan_of(it, cap, FAST, 0);
    uint64_t after = check_plan(it, p, FAST);
    if (best == UINT64_MAX) {
      ck_assert_msg(!p->feasible, "case %d: no subset fits cap %llu, the planner says it does", c,
                    (unsigned long long)cap);
      ck_assert_uint_eq(after, lowest); /* every candidate moved: as low as any subset goes */
      infeasible++;
    } else {
      ck_assert_msg(p->feasible && p->bytes_moved == best, "case %d: planner %llu bytes (feasible %d), fewest %llu", c,
                    (unsigned long long)p->bytes_moved, p->feasible, (unsigned long long)best);
      ck_assert_int_eq(p->optimal, 1);
      gml_swap_plan *g = plan_of(it, cap, FAST, -1);
      check_plan(it, g, FAST);
      ck_assert(g->feasible && g->bytes_moved >= best);
      greedy_worse += g->bytes_moved > best;
      searched += p->nodes > 0;
      gml_swap_plan_free(g);
    }
    cases++;
    gml_swap_plan_free(p);
  }
  printf("swap planner vs exhaustive: %d cases (%d infeasible), all fewest bytes; the greedy plan alone was worse "
         "in %d, the search ran in %d\n",
         cases, infeasible, greedy_worse, searched);
  ck_assert_int_gt(greedy_worse, 0);
  ck_assert_int_gt(infeasible, 0);
  free(S);
  free(it);
}
END_TEST

/* Copies that take time (1-25 GB/s against ops of 1-200 us): windows narrow, copies queue. Whatever the plan,
 * its moves alone give its peak and their copies land in time; it says feasible only where it fits, and
 * never says infeasible where the exhaustive search (windows alone, the widest) finds nothing either... the
 * other way round: where no subset fits even with the widest windows, it says infeasible. */
START_TEST(test_slow_copies_honest) {
  rng_state = 3;
  iter *it = malloc(sizeof *it);
  subsets *S = malloc(sizeof *S);
  int feasible = 0, fewest = 0, cases = 0;
  for (int c = 0; c < 1500; c++) {
    make_iter(it, 2 + (uint32_t)below(11), c & 1);
    double bps = (1 + below(25)) * 1e9;
    all_subsets(it, bps, S);
    uint64_t peak = S->peak[0], lowest;
    exhaustive(S, peak, &lowest);
    uint64_t cap = lowest + below(peak - lowest + 1);
    uint64_t best = exhaustive(S, cap, &lowest);
    gml_swap_plan *p = plan_of(it, cap, bps, 0);
    check_plan(it, p, bps);
    ck_assert_uint_eq(p->late_ns, 0); /* a move whose copy back cannot hide is not made */
    if (best == UINT64_MAX) ck_assert(!p->feasible);
    if (p->feasible) ck_assert_uint_ge(p->bytes_moved, best);
    feasible += p->feasible, fewest += p->feasible && p->bytes_moved == best, cases++;
    gml_swap_plan_free(p);
  }
  printf("swap planner, slow copies: %d cases, %d fit the cap, %d of them with the fewest bytes of the widest "
         "windows\n",
         cases, feasible, fewest);
  ck_assert_int_gt(feasible, cases / 2);
  free(S);
  free(it);
}
END_TEST

/* A ViT-sized iteration (400 saved tensors, 1200 events) under caps from 90% down to 60% of its peak: plans
 * in bounded time (the default search budget), fits down to 70% (below, the copies cannot keep up at 25 GB/s:
 * said, and checked from the moves), and moves within 2% of the lower bound (the largest excess of one event:
 * no plan moves less). */
START_TEST(test_large_iteration) {
  rng_state = 4;
  iter *it = malloc(sizeof *it);
  make_iter(it, MAXT, 1);
  uint64_t peak = 0;
  for (uint32_t e = 0; e < it->nev; e++) peak = it->live[e] > peak ? it->live[e] : peak;
  for (int pct = 90; pct >= 60; pct -= 10) {
    uint64_t cap = peak / 100 * pct;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    gml_swap_plan *p = plan_of(it, cap, 25e9, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    check_plan(it, p, 25e9);
    double ratio = (double)p->bytes_moved / (double)(peak - cap);
    printf("swap planner, %u tensors, cap %d%% of the peak: %u moves, %.1f MiB moved, %.3fx the lower bound, "
           "optimal %d, %llu nodes, %.0f ms\n",
           it->nt, pct, p->nmoves, p->bytes_moved / 1048576.0, ratio, p->optimal, (unsigned long long)p->nodes, ms);
    ck_assert_double_lt(ms, 20000); /* ~0.3 s plain; the sanitizers' build is slower */
    if (pct >= 70) {
      ck_assert_int_eq(p->feasible, 1);
      ck_assert_double_le(ratio, 1.02);
    }
    gml_swap_plan_free(p);
  }
  free(it);
}
END_TEST

START_TEST(test_invalid_input) {
  iter *it = malloc(sizeof *it);
  rng_state = 5;
  make_iter(it, 5, 0);
  gml_swap_plan *p = (gml_swap_plan *)1;
  ck_assert_int_eq(gml_swap_plan_build(NULL, &p), GML_EINVAL);
  ck_assert_ptr_null(p);
  gml_swap_input in = input_of(it, 1, FAST, 0);
  ck_assert_int_eq(gml_swap_plan_build(&in, NULL), GML_EINVAL);
  in.nevents = 0;
  ck_assert_int_eq(gml_swap_plan_build(&in, &p), GML_EINVAL);
  in = input_of(it, 1, FAST, 0);
  it->t[2].used_at = it->t[2].saved_at; /* read when saved */
  ck_assert_int_eq(gml_swap_plan_build(&in, &p), GML_EINVAL);
  it->t[2].used_at = it->nev; /* past the end */
  ck_assert_int_eq(gml_swap_plan_build(&in, &p), GML_EINVAL);
  it->t[2].used_at = GML_SWAP_NEVER;
  it->time[3] = it->time[2] - 1; /* time going back */
  ck_assert_int_eq(gml_swap_plan_build(&in, &p), GML_EINVAL);
  it->time[3] = it->time[2];
  ck_assert_int_eq(gml_swap_plan_build(&in, &p), 0);
  ck_assert_int_eq(p->feasible, 0); /* a cap of one byte */
  gml_swap_plan_free(p);
  gml_swap_plan_free(NULL);
  free(it);
}
END_TEST

/* GMLAKE_SWAP through gml_set_option: off, on with the client's limit as the cap (less the allocator's
 * margin), a size, a share of the device, a bad value refused; gml_swap_note's numbers in gml_stats. */
START_TEST(test_swap_target_and_note) {
  uint64_t cap = 1;
  ck_assert_int_eq(gml_set_option("GMLAKE_SWAP", NULL), 0);
  ck_assert_int_eq(gml_swap_target(NULL, &cap), 0);
  ck_assert_uint_eq(cap, 0);
  ck_assert_int_eq(gml_set_option("GMLAKE_BACKEND", "host"), 0);
  ck_assert_int_eq(gml_set_option("GMLAKE_MODE", "embedded"), 0);
  gml_client *c = NULL;
  ck_assert_int_eq(gml_open(NULL, &c), 0);
  ck_assert_int_eq(gml_swap_target(c, &cap), 0);
  ck_assert_int_eq(gml_set_option("GMLAKE_SWAP", "0"), 0);
  ck_assert_int_eq(gml_swap_target(c, &cap), 0);
  ck_assert_int_eq(gml_set_option("GMLAKE_SWAP", "1"), 0);
  ck_assert_int_eq(gml_swap_target(NULL, &cap), 1);
  ck_assert_int_eq(gml_set_limit(c, 1000ull << 20), 0);
  ck_assert_int_eq(gml_swap_target(c, &cap), 1);
  ck_assert_uint_eq(cap, (1000ull << 20) - (1000ull << 20) / 100 * 3);
  ck_assert_int_eq(gml_set_limit(c, 0), 0); /* no limit: the device's memory */
  uint64_t freeb, total;
  ck_assert_int_eq(gml_device_memory(c, &freeb, &total), 0);
  ck_assert_int_eq(gml_swap_target(c, &cap), 1);
  ck_assert_uint_eq(cap, total - total / 100 * 3);
  ck_assert_int_eq(gml_set_option("GMLAKE_SWAP", "2GiB"), 0);
  ck_assert_int_eq(gml_swap_target(NULL, &cap), 1);
  ck_assert_uint_eq(cap, (2ull << 30) - (2ull << 30) / 100 * 3);
  ck_assert_int_eq(gml_set_option("GMLAKE_SWAP", "50%"), 0);
  ck_assert_int_eq(gml_swap_target(c, &cap), 1);
  ck_assert_uint_eq(cap, total / 2 - total / 2 / 100 * 3);
  ck_assert_int_eq(gml_set_option("GMLAKE_SWAP", "lots"), 0);
  ck_assert_int_eq(gml_swap_target(c, &cap), GML_EINVAL);
  ck_assert_ptr_nonnull(strstr(gml_last_error(c), "GMLAKE_SWAP=lots"));
  ck_assert_int_eq(gml_swap_target(NULL, &cap), GML_EINVAL);
  ck_assert_int_eq(gml_swap_target(c, NULL), GML_EINVAL);
  ck_assert_int_eq(gml_swap_note(NULL, 1, 1, 1, 1), GML_EINVAL);
  ck_assert_int_eq(gml_swap_note(c, 300, 200, 7000, 100), 0);
  ck_assert_int_eq(gml_swap_note(c, 50, 150, 1000, 0), 0);
  gml_stats st;
  ck_assert_int_eq(gml_stats_get(c, &st), 0);
  ck_assert_uint_eq(st.swap_out_bytes, 350);
  ck_assert_uint_eq(st.swap_in_bytes, 350);
  ck_assert_uint_eq(st.swap_copy_ns, 8000);
  ck_assert_uint_eq(st.swap_host_bytes, 0);
  ck_assert_int_eq(gml_close(c), 0);
}
END_TEST

static Suite *swap_suite(void) {
  Suite *s = suite_create("swap");
  TCase *tc = tcase_create("swap");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_fits_moves_nothing);
  tcase_add_test(tc, test_fewest_bytes_against_exhaustive);
  tcase_add_test(tc, test_slow_copies_honest);
  tcase_add_test(tc, test_large_iteration);
  tcase_add_test(tc, test_invalid_input);
  tcase_add_test(tc, test_swap_target_and_note);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(swap_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
