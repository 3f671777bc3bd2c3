/* Planned placement served by the allocator (client/planned.c), on the host
 * backend: a repeated iteration is served from its plan with no driver call
 * and reserved memory at the plan's size; randomized departures (shapes that
 * change mid-iteration, frees out of order, extra allocations, several
 * streams, blocks kept past their iteration) never get a planned slot that
 * something lives in: the invariant checker (gmli_alloc_check, which checks
 * that no two live planned blocks overlap) runs after every operation, and
 * every block's content is checked at its free (an overlapping block would
 * have overwritten it). Built with -DGMLI_PLAN_BROKEN (the policy then serves
 * a hit whose slot is occupied), test_departures_never_share fails:
 *   make BUILD=build-broken EXTRA_CFLAGS=-DGMLI_PLAN_BROKEN build-broken/test_planned */
#include "alloc.h"
#include "client_priv.h"
#include "planned.h"
#include "policy.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ul * 1024ul)

typedef struct psrc {
  gml_backend *be;
  size_t live;
} psrc;

static int src_acquire(void *ctx, size_t n, int optional, gml_phys *phys, uint64_t *ids) {
  psrc *s = ctx;
  (void)optional;
  for (size_t k = 0; k < n; k++) {
    ck_assert_int_eq(s->be->ops->chunk_create(s->be, &phys[k], NULL), 0);
    ids[k] = ++s->live;
  }
  return (int)n;
}

static void src_release(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids) {
  psrc *s = ctx;
  (void)ids;
  for (size_t i = 0; i < n; i++) s->be->ops->chunk_release(s->be, phys[i]);
  s->live -= n;
}

static gml_backend *be;
static psrc src;
static gml_allocator A;

static void setup(void) {
  char msg[256];
  ck_assert_int_eq(gmli_backend_open("host", 0, NULL, &be, msg, sizeof msg), 0);
  memset(&src, 0, sizeof src);
  src.be = be;
  gml_alloc_config cfg = GML_ALLOC_CONFIG_DEFAULT;
  cfg.plan = 1;
  gml_chunk_source cs = {&src, src_acquire, src_release, NULL};
  ck_assert_int_eq(gmli_alloc_init(&A, be, cs, 16ul << 30, &cfg), 0);
  ck_assert_ptr_nonnull(A.plan);
}

static void teardown(void) {
  gmli_alloc_destroy(&A);
  ck_assert_int_eq(src.live, 0);
  gmli_backend_close(be);
}

static void check_state(const char *when, int step, int op) {
  int rc = gmli_alloc_check(&A);
  ck_assert_msg(rc == 0, "%s (step %d, op %d): %s", when, step, op, A.last_error);
}

/* A block's content: its id in its first and last 8 bytes. */
static void tag(void *p, size_t size, uint64_t id, int write) {
  uint64_t t = id * 0x9E3779B97F4A7C15ull + 1, got[2];
  char *tail = (char *)p + size - 8;
  if (write) {
    ck_assert_int_eq(be->ops->write(be, (uintptr_t)p, &t, 8), 0);
    ck_assert_int_eq(be->ops->write(be, (uintptr_t)tail, &t, 8), 0);
    return;
  }
  ck_assert_int_eq(be->ops->read(be, (uintptr_t)p, got, 8), 0);
  ck_assert_int_eq(be->ops->read(be, (uintptr_t)tail, &got[1], 8), 0);
  ck_assert_msg(got[0] == t && got[1] == t, "block %llu at %p was overwritten: two live blocks shared memory",
                (unsigned long long)id, p);
}

/* One iteration's script: allocation k of size[k] on stream[k], freed after
 * allocation free_after[k] (n: at the end of the iteration; > n: kept into the
 * next iteration, freed when it has made that many allocations minus n). */
typedef struct script {
  int n;
  size_t size[64];
  gml_stream stream[64];
  int free_after[64];
} script;

typedef struct livebk {
  void *p;
  size_t size;
  uint64_t id;
  int free_at; /* this iteration's allocation count after which it goes; -1: at the end */
} livebk;

static livebk held[256];
static int nheld;
static uint64_t next_id;

static void release(int i) {
  tag(held[i].p, held[i].size, held[i].id, 0);
  ck_assert_int_eq(gmli_alloc_free(&A, held[i].p), 0);
  held[i] = held[--nheld];
}

/* Frees the held blocks due after `count` allocations, in the order given by
 * shuffle (0: as held; else a random order). */
static void free_due(int count, unsigned *seed, int shuffle, int step) {
  for (int pass = 0; pass < 2; pass++)
    for (int i = shuffle ? (int)(rand_r(seed) % (unsigned)(nheld + 1)) : 0, k = 0; k < nheld; k++) {
      int j = (i + k) % (nheld ? nheld : 1);
      if (j < nheld && held[j].free_at >= 0 && held[j].free_at <= count) {
        release(j);
        check_state("free", step, count);
        k = -1;
      }
    }
}

/* Runs one iteration of script s (departures as the flags say), then gml_step. */
static void run_iteration(const script *s, int step, unsigned *seed, int depart) {
  for (int i = 0; i < nheld; i++) /* last iteration's blocks kept into this one */
    if (held[i].free_at < -1) held[i].free_at = -held[i].free_at - 2;
  for (int k = 0; k < s->n; k++) {
    size_t size = s->size[k];
    gml_stream st = s->stream[k];
    if (depart && rand_r(seed) % 8 == 0) size = (size_t)(rand_r(seed) % (6 * MiB)) + 4096; /* another shape */
    if (depart && rand_r(seed) % 10 == 0) st = (gml_stream)(rand_r(seed) % 3);             /* another stream */
    void *p;
    int rc = gmli_alloc_malloc(&A, size, st, &p);
    ck_assert_msg(rc == 0, "alloc %zu: %s", size, A.last_error);
    ck_assert_int_lt(nheld, 256);
    int fa = s->free_after[k];
    if (depart && rand_r(seed) % 12 == 0) fa = k + 1 + (int)(rand_r(seed) % (unsigned)(s->n + 8)); /* freed elsewhere */
    held[nheld++] = (livebk){p, size, ++next_id, fa >= s->n ? (fa > s->n ? -(fa - s->n) - 2 : -1) : fa};
    tag(p, size, next_id, 1);
    check_state("alloc", step, k);
    if (depart && rand_r(seed) % 10 == 0) { /* an extra allocation, freed at once or kept a while */
      void *q;
      size_t qs = (size_t)(rand_r(seed) % (3 * MiB)) + 512;
      ck_assert_int_eq(gmli_alloc_malloc(&A, qs, 0, &q), 0);
      held[nheld++] = (livebk){q, qs, ++next_id, rand_r(seed) % 2 ? k + 1 : -1};
      tag(q, qs, next_id, 1);
      check_state("extra alloc", step, k);
    }
    free_due(k + 1, seed, depart, step);
  }
  for (int i = 0; i < nheld;) /* the iteration's end */
    if (held[i].free_at == -1 || held[i].free_at >= 0) release(i);
    else i++;
  check_state("end", step, s->n);
  ck_assert_int_eq(gmli_alloc_step(&A), 0);
  check_state("step", step, s->n);
}

/* A training-like iteration: weights-like blocks allocated in the first
 * iteration only (not planned), activations freed in reverse order, a few
 * gradients kept into the next iteration. */
static void make_script(script *s, unsigned seed, int streams) {
  s->n = 40;
  for (int k = 0; k < s->n; k++) {
    s->size[k] = (size_t)(rand_r(&seed) % 5 + 1) * MiB + (rand_r(&seed) % 4) * 512 * (unsigned)(rand_r(&seed) % 3);
    s->stream[k] = streams > 1 ? (gml_stream)(rand_r(&seed) % (unsigned)streams) : 0;
    if (k < 20) s->free_after[k] = 39 - k;             /* forward activations, freed in backward */
    else if (k % 5 == 0) s->free_after[k] = s->n + 3;  /* gradients: freed early in the next iteration */
    else s->free_after[k] = k + 1 + rand_r(&seed) % 3; /* temporaries */
    if (s->free_after[k] > s->n + 3) s->free_after[k] = s->n;
  }
}

START_TEST(test_repeated_iteration_served_from_plan) {
  script s;
  unsigned seed = 7;
  make_script(&s, 11, 1);
  nheld = 0;
  void *w;
  ck_assert_int_eq(gmli_alloc_malloc(&A, 24 * MiB, 0, &w), 0); /* weights: live throughout */
  gml_stats st, s0;
  for (int it = 0; it < 4; it++) run_iteration(&s, it, &seed, 0);
  gmli_alloc_stats(&A, &s0);
  ck_assert_uint_ge(s0.plans_taken, 1);
  for (int it = 4; it < 10; it++) run_iteration(&s, it, &seed, 0);
  gmli_alloc_stats(&A, &st);
  /* every allocation of the last six iterations at its planned offset, no driver call, no lease */
  ck_assert_uint_eq(st.plan_hits - s0.plan_hits, 6u * (unsigned)s.n);
  ck_assert_uint_eq(st.plan_misses, s0.plan_misses);
  ck_assert_uint_eq(st.maps, s0.maps);
  ck_assert_uint_eq(st.unmaps, s0.unmaps);
  ck_assert_uint_eq(st.chunks_leased, s0.chunks_leased);
  /* reserved: the plan's range plus the weights, within chunk rounding of the most live at once */
  gml_stats cur;
  gmli_alloc_stats(&A, &cur);
  const gml_plan *p = A.plan->kp.plan;
  ck_assert_ptr_nonnull(p);
  ck_assert_uint_le(p->range, p->lower_bound + p->lower_bound / 200); /* the plan within 0.5% of the bound */
  ck_assert_uint_le(cur.reserved, gmli_round_up(p->range, A.cs) + 24 * MiB + 2 * A.cs);
  for (int i = 0; i < nheld;) release(i);
}
END_TEST

START_TEST(test_departures_never_share) {
  gmli_plan_give_up = GMLI_PLAN_JUDGED + 1; /* departures at length: planning never given up here */
  unsigned seed = 1234u + (unsigned)_i;
  script s;
  make_script(&s, 99u + (unsigned)_i, 3);
  nheld = 0;
  for (int it = 0; it < 30; it++) {
    int depart = it >= 3 && rand_r(&seed) % 2;
    run_iteration(&s, it, &seed, depart);
    if (it == 17) make_script(&s, 5u + (unsigned)_i, 3); /* a new pattern: planned anew when it repeats */
  }
  gml_stats st;
  gmli_alloc_stats(&A, &st);
  ck_assert_uint_ge(st.plans_taken, 2);
  ck_assert_uint_gt(st.plan_hits, 0);
  ck_assert_uint_gt(st.plan_misses, 0);
  while (nheld) release(0);
  check_state("all freed", 30, 0);
  gmli_plan_give_up = GMLI_PLAN_GIVE_UP;
}
END_TEST

/* Planning gives up where plans do not hold (planned.h, GMLI_PLAN_GIVE_UP): one departure in six
 * planned iterations keeps it; departures in most iterations end it, and from then on everything is the
 * stitching allocator's (no plan taken, nothing served at an offset), the invariants held throughout. */
START_TEST(test_gives_up_on_changing_shapes) {
  unsigned seed = 77;
  script s;
  make_script(&s, 31, 1);
  nheld = 0;
  int it = 0;
  for (; it < 16; it++) run_iteration(&s, it, &seed, it >= 4 && it % 6 == 0); /* now and then */
  ck_assert_int_eq(A.plan->off, 0);
  gml_stats s0, st;
  gmli_alloc_stats(&A, &s0);
  ck_assert_uint_ge(s0.plans_taken, 1);
  for (int k = 0; k < GMLI_PLAN_JUDGED && !A.plan->off; k++, it++) run_iteration(&s, it, &seed, 1); /* every time */
  ck_assert_int_eq(A.plan->off, 1);
  ck_assert_ptr_null(A.plan->cur);
  gmli_alloc_stats(&A, &s0);
  for (int k = 0; k < 8; k++, it++) run_iteration(&s, it, &seed, k % 2); /* it would repeat now: not planned */
  gmli_alloc_stats(&A, &st);
  ck_assert_uint_eq(st.plans_taken, s0.plans_taken);
  ck_assert_uint_eq(st.plan_hits, s0.plan_hits);
  ck_assert_uint_eq(st.plan_steps, s0.plan_steps + 8);
  while (nheld) release(0);
  check_state("all freed", it, 0);
}
END_TEST

START_TEST(test_plan_off_by_default) {
  gml_allocator b;
  gml_chunk_source cs = {&src, src_acquire, src_release, NULL};
  ck_assert_int_eq(gmli_alloc_init(&b, be, cs, 1ul << 30, NULL), 0);
  ck_assert_ptr_null(b.plan);
  ck_assert_int_eq(gmli_alloc_step(&b), 0);
  gmli_alloc_destroy(&b);
}
END_TEST

/* The policy alone, on state built by hand (policy.h): a hit within the range goes at its offset; past
 * the range, a miss, or bytes last freed on another stream that no fence has passed go to the stitching
 * allocator (a FIT with no block). */
START_TEST(test_policy_place_at) {
  gml_allocator a;
  memset(&a, 0, sizeof a);
  a.cs = 2 * MiB, a.va_base = 1ul << 40, a.safe_tick = 10, a.nstreams_seen = 1;
  gml_stream fs[4] = {0, 0, 0, 0};
  uint64_t ft[4] = {0, 0, 0, 0};
  gmli_range rg = {.base = a.va_base + 8 * a.cs, .size = 4 * a.cs, .free_stream = fs, .free_tick = ft};
  gml_plan_grant g = {.offset = a.cs + 512, .size = a.cs, .index = 3};
  gml_place_plan p = gmli_policy_place_at(&a, &rg, GML_PLAN_HIT, &g, a.cs, 7);
  ck_assert_int_eq(p.kind, GML_PLACE_AT);
  ck_assert_uint_eq(p.at, rg.base + a.cs + 512);
  ck_assert_ptr_null(gmli_policy_place_at(&a, NULL, GML_PLAN_HIT, &g, a.cs, 7).block); /* no range held */
  ck_assert_int_eq(gmli_policy_place_at(&a, &rg, GML_PLAN_MISS_SHAPE, &g, a.cs, 7).kind, GML_PLACE_FIT);
  g.lent = 1; /* a miss lent chunks of the range goes there too */
  ck_assert_int_eq(gmli_policy_place_at(&a, &rg, GML_PLAN_MISS_SHAPE, &g, a.cs, 7).kind, GML_PLACE_AT);
  g.lent = 0, g.offset = 3 * a.cs + 4096; /* past the range's end */
  ck_assert_int_eq(gmli_policy_place_at(&a, &rg, GML_PLAN_HIT, &g, a.cs, 7).kind, GML_PLACE_FIT);
  g.offset = a.cs + 512; /* slots 1 and 2 of the range: slot 2 last freed on stream 5 at tick 12 */
  fs[2] = 5, ft[2] = 12;
  ck_assert_int_eq(gmli_policy_place_at(&a, &rg, GML_PLAN_HIT, &g, a.cs, 7).kind, GML_PLACE_AT); /* one stream seen */
  a.nstreams_seen = 2;
  ck_assert_int_eq(gmli_policy_place_at(&a, &rg, GML_PLAN_HIT, &g, a.cs, 7).kind, GML_PLACE_FIT);
  ck_assert_int_eq(gmli_policy_place_at(&a, &rg, GML_PLAN_HIT, &g, a.cs, 5).kind, GML_PLACE_AT); /* its own stream */
  a.safe_tick = 13; /* a fence passed the free */
  ck_assert_int_eq(gmli_policy_place_at(&a, &rg, GML_PLAN_HIT, &g, a.cs, 7).kind, GML_PLACE_AT);
}
END_TEST

/* Through a client (gml_set_option, gml_step): blocks served in a planned range are paused and resumed
 * with their content, one freed while paused becomes free at resume, gml_block_of and gml_block_list name
 * them, and the invariants hold throughout. */
START_TEST(test_client_pause_and_blocks) {
  ck_assert_int_eq(gml_set_option("GMLAKE_PLAN", "1"), 0);
  gml_open_opts o = {.backend = "host", .mode = GML_MODE_EMBEDDED};
  gml_client *c;
  ck_assert_int_eq(gml_open(&o, &c), 0);
  ck_assert_int_eq(gml_set_option("GMLAKE_PLAN", NULL), 0);
  ck_assert_ptr_nonnull(c->alloc.plan);
  size_t sizes[4] = {3 * MiB, 1 * MiB + 512, 5 * MiB, 4096};
  void *p[4];
  for (int it = 0; it < 5; it++) {
    for (int k = 0; k < 4; k++) ck_assert_int_eq(gml_alloc(c, sizes[k], 0, &p[k]), 0);
    if (it == 4) break; /* the last iteration's blocks stay live */
    for (int k = 3; k >= 0; k--) ck_assert_int_eq(gml_free(c, p[k]), 0);
    ck_assert_int_eq(gml_step(c), 0);
  }
  gml_stats st;
  gml_stats_get(c, &st);
  ck_assert_uint_ge(st.plan_hits, 8); /* planned after iteration 1 repeated 0: iterations 2 to 4 served */
  ck_assert_uint_eq(st.plan_steps, 4);
  gml_block_info bi, list[16];
  for (int k = 0; k < 4; k++) {
    uint64_t v = 0x1234 + (uint64_t)k;
    ck_assert_int_eq(gml_write(c, p[k], &v, 8), 0);
    ck_assert_int_eq(gml_block_of(c, (char *)p[k] + 1, &bi), 0);
    ck_assert_uint_eq(bi.ptr, (uintptr_t)p[k]);
  }
  ck_assert_int_eq(gml_block_list(c, list, 16), 4);
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  ck_assert_int_eq(gml_pause(c, 0, 0), 0);
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  ck_assert_int_eq(gml_free(c, p[1]), 0); /* freed while paused */
  ck_assert_int_eq(gml_resume(c), 0);
  ck_assert_msg(gmli_alloc_check(&c->alloc) == 0, "%s", c->alloc.last_error);
  for (int k = 0; k < 4; k++) {
    if (k == 1) continue;
    uint64_t v = 0;
    ck_assert_int_eq(gml_read(c, &v, p[k], 8), 0);
    ck_assert_uint_eq(v, 0x1234 + (uint64_t)k);
    ck_assert_int_eq(gml_free(c, p[k]), 0);
  }
  ck_assert_msg(gmli_alloc_check(&c->alloc) == 0, "%s", c->alloc.last_error);
  gml_stats_get(c, &st);
  ck_assert_uint_eq(st.allocated, 0);
  gml_close(c);
}
END_TEST

int main(void) {
  Suite *s = suite_create("planned");
  TCase *tc = tcase_create("planned");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_repeated_iteration_served_from_plan);
  tcase_add_loop_test(tc, test_departures_never_share, 0, 6);
  tcase_add_test(tc, test_gives_up_on_changing_shapes);
  tcase_add_test(tc, test_plan_off_by_default);
  tcase_add_test(tc, test_policy_place_at);
  tcase_add_test(tc, test_client_pause_and_blocks);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
