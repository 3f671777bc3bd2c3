/* The client allocator's policy (client/policy.c) on state built by hand:
 * no allocator is initialised, no backend maps anything, no chunk source
 * leases; each test lays out free blocks, slots and chunks, asks a policy
 * and checks the plan it answers (placement steps, leases, the chunk a
 * slot gets, trim order). */
#include "policy.h"
#include <check.h>
#include <string.h>

#define CS ((size_t)2 << 20)
#define BASE ((uintptr_t)1 << 40) /* never mapped: the policy only does arithmetic on it */
#define NSLOTS 16
#define S1 ((gml_stream)11) /* the stream asking */
#define S2 ((gml_stream)22) /* another stream */

static gml_allocator a;
static gml_region r;
static gml_pchunk chunks[8];
static int32_t slot_chunk[NSLOTS], slot_anext[NSLOTS], slot_aprev[NSLOTS];
static uint32_t slot_use[NSLOTS];
static gml_stream slot_stream[NSLOTS];
static gml_block blocks[8];
static int nblocks, nchunks;

static void setup(void) {
  memset(&a, 0, sizeof a), memset(&r, 0, sizeof r), memset(chunks, 0, sizeof chunks), memset(blocks, 0, sizeof blocks);
  memset(slot_chunk, 0xff, sizeof slot_chunk), memset(slot_anext, 0xff, sizeof slot_anext);
  memset(slot_aprev, 0xff, sizeof slot_aprev), memset(slot_use, 0, sizeof slot_use),
      memset(slot_stream, 0, sizeof slot_stream);
  nblocks = nchunks = 0;
  a.cs = CS, a.va_base = BASE, a.va_size = NSLOTS * CS, a.nslots = NSLOTS;
  a.slot_chunk = slot_chunk, a.slot_anext = slot_anext, a.slot_aprev = slot_aprev;
  a.slot_use = slot_use, a.slot_stream = slot_stream;
  a.chunks = chunks, a.chunks_cap = 8;
  for (int l = 0; l < 3; l++) a.lists[l].head = a.lists[l].tail = -1;
  a.safe_tick = 1, a.tick = 100;
  a.borrow = 1, a.borrow_ratio = 1.5, a.borrow_max = 8;
  r.base = BASE, r.size = NSLOTS * CS;
}

/* Stream s is seen and has pool pi of region r. */
static void stream(int pi, gml_stream s) {
  a.streams_seen[a.nstreams_seen++] = s;
  r.pools[pi].used = 1, r.pools[pi].stream = s;
}

/* A free block of `size` bytes at slot `slot`, in pool pi. */
static gml_block *free_block(int pi, uint32_t slot, size_t size) {
  gml_block *b = &blocks[nblocks++];
  b->addr = BASE + slot * CS, b->size = size, b->is_free = 1, b->prio = (uint32_t)nblocks;
  b->stream = r.pools[pi].stream;
  gmli_pool_add(&r, pi, b);
  return b;
}

/* A free chunk on list l (fresh or cached), mapped at `slot` (-1: nowhere),
 * freed on `freed_on` at tick `tick`. */
static int32_t free_chunk(int l, int32_t slot, gml_stream freed_on, uint64_t tick) {
  int32_t ci = nchunks++;
  gml_pchunk *c = &chunks[ci];
  c->owner = -1, c->maps_head = slot, c->shown_at = slot, c->free_stream = freed_on, c->free_tick = tick;
  if (slot >= 0) slot_chunk[slot] = ci, c->nmaps = 1;
  clist_push(&a, l, ci);
  return ci;
}

/* One stream: the best fit (smallest, then lowest address) of its own pool
 * and the shared one, at once, whatever its slots map. */
START_TEST(test_one_stream_best_fit) {
  stream(1, S1);
  free_block(1, 0, 3 * CS);
  gml_block *shared = free_block(0, 4, 2 * CS);
  free_block(0, 8, 2 * CS); /* as small, higher address */
  gml_place_plan p = gmli_policy_place(&a, &r, 1, CS, S1);
  ck_assert_int_eq(p.kind, GML_PLACE_FIT);
  ck_assert_ptr_eq(p.block, shared);
}
END_TEST

/* Nothing fits: a harvest first; if it moves nothing, the range is exhausted. */
START_TEST(test_no_fit_harvests_then_gives_up) {
  stream(1, S1);
  free_block(1, 0, CS);
  gml_place_plan p = gmli_policy_place(&a, &r, 1, 2 * CS, S1);
  ck_assert_int_eq(p.kind, GML_PLACE_HARVEST);
  ck_assert_ptr_null(p.block);
  gml_place_plan q = gmli_policy_place_next(&a, &r, 1, 2 * CS, S1, &p, 0);
  ck_assert_int_eq(q.kind, GML_PLACE_FIT);
  ck_assert_ptr_null(q.block);
  /* a harvest that moved a large enough block into the shared pool: it serves */
  gml_block *harvested = free_block(0, 6, 4 * CS);
  q = gmli_policy_place_next(&a, &r, 1, 2 * CS, S1, &p, 1);
  ck_assert_int_eq(q.kind, GML_PLACE_FIT);
  ck_assert_ptr_eq(q.block, harvested);
}
END_TEST

/* Several streams: a fit whose slots keep their chunks serves at once; one
 * that would map chunks asks for a harvest first. */
START_TEST(test_fit_needing_calls_harvests) {
  stream(1, S1), stream(2, S2);
  gml_block *b = free_block(1, 0, CS);
  free_chunk(GML_CL_CACHED, 0, S1, 50); /* freed on S1: ready for S1 */
  gml_place_plan p = gmli_policy_place(&a, &r, 1, CS, S1);
  ck_assert_int_eq(p.kind, GML_PLACE_FIT);
  ck_assert_ptr_eq(p.block, b);
  chunks[0].free_stream = S2; /* freed on S2 since no fence: S1 would wait */
  p = gmli_policy_place(&a, &r, 1, CS, S1);
  ck_assert_int_eq(p.kind, GML_PLACE_HARVEST);
  ck_assert_ptr_eq(p.block, b);
  a.borrow = 0; /* borrowing off: after a harvest that moved nothing, the fit as it is */
  gml_place_plan q = gmli_policy_place_next(&a, &r, 1, CS, S1, &p, 0);
  ck_assert_int_eq(q.kind, GML_PLACE_FIT);
  ck_assert_ptr_eq(q.block, b);
}
END_TEST

/* Borrowing: S1's fit would map a chunk; S2's pool holds a block whose
 * chunk S2 freed: S1 is to wait for S2 (the lender, with at most borrow_max
 * waits pending), and once S2's blocks moved into S1's pool, they serve. */
START_TEST(test_borrow_names_lender_and_wait) {
  stream(1, S1), stream(2, S2);
  gml_block *own = free_block(1, 0, 2 * CS); /* slots map nothing */
  gml_block *lent = free_block(2, 4, CS);
  free_chunk(GML_CL_CACHED, 4, S2, 50);
  gml_place_plan p = gmli_policy_place(&a, &r, 1, CS, S1);
  ck_assert_int_eq(p.kind, GML_PLACE_HARVEST);
  p = gmli_policy_place_next(&a, &r, 1, CS, S1, &p, 0);
  ck_assert_int_eq(p.kind, GML_PLACE_BORROW);
  ck_assert_int_eq(p.lender, 1); /* S2's index in streams_seen */
  ck_assert_int_eq(p.max_pending, 8);
  ck_assert_ptr_eq(p.block, own);
  /* the mechanism ordered S1 after S2 and took S2's blocks into S1's pool */
  gmli_pool_del(&r, lent);
  gmli_pool_add(&r, 1, lent);
  gml_place_plan q = gmli_policy_place_next(&a, &r, 1, CS, S1, &p, 1);
  ck_assert_int_eq(q.kind, GML_PLACE_FIT);
  ck_assert_ptr_eq(q.block, lent);
  /* the wait could not be made (nothing moved): the own fit, mapping */
  q = gmli_policy_place_next(&a, &r, 1, CS, S1, &p, 0);
  ck_assert_int_eq(q.kind, GML_PLACE_FIT);
  ck_assert_ptr_eq(q.block, own);
}
END_TEST

/* No borrowing for a block more than borrow_ratio times the request, nor in
 * guard mode; a stream already ordered after others takes their blocks first. */
START_TEST(test_borrow_bounds_and_ordered_first) {
  stream(1, S1), stream(2, S2);
  gml_block *own = free_block(1, 0, 4 * CS);
  free_block(2, 8, 2 * CS);
  free_chunk(GML_CL_CACHED, 8, S2, 50);
  free_chunk(GML_CL_CACHED, 9, S2, 50);
  gml_place_plan h = gmli_policy_place(&a, &r, 1, CS, S1);
  ck_assert_int_eq(h.kind, GML_PLACE_HARVEST);
  gml_place_plan p = gmli_policy_place_next(&a, &r, 1, CS, S1, &h, 0);
  ck_assert_int_eq(p.kind, GML_PLACE_FIT); /* 2 chunks for a request of 1: over 1.5 times */
  ck_assert_ptr_eq(p.block, own);
  a.borrow_ratio = 2;
  p = gmli_policy_place_next(&a, &r, 1, CS, S1, &h, 0);
  ck_assert_int_eq(p.kind, GML_PLACE_BORROW);
  a.any_ordered = 1;
  p = gmli_policy_place_next(&a, &r, 1, CS, S1, &h, 0);
  ck_assert_int_eq(p.kind, GML_PLACE_TAKE_ORDERED);
  p = gmli_policy_place_next(&a, &r, 1, CS, S1, &p, 0); /* it moved nothing: borrow */
  ck_assert_int_eq(p.kind, GML_PLACE_BORROW);
  a.guard = GML_GUARD_END, a.guard_grain = CS;
  p = gmli_policy_place_next(&a, &r, 1, CS, S1, &h, 0);
  ck_assert_int_eq(p.kind, GML_PLACE_FIT);
}
END_TEST

/* A window needs driver calls where a slot maps nothing, maps a chunk owned
 * elsewhere, or joins a live block of another stream whose chunk that
 * stream may still use. */
START_TEST(test_window_needs_calls) {
  stream(1, S1), stream(2, S2);
  free_chunk(GML_CL_CACHED, 0, S1, 50);
  ck_assert_int_eq(gmli_window_needs_calls(&a, BASE, CS, S1), 0);
  ck_assert_int_eq(gmli_window_needs_calls(&a, BASE, 2 * CS, S1), 1); /* slot 1 maps nothing */
  chunks[0].owner = 3;
  ck_assert_int_eq(gmli_window_needs_calls(&a, BASE, CS, S1), 1);
  chunks[0].owner = 0, slot_use[0] = 1, slot_stream[0] = S2, chunks[0].free_stream = S2;
  ck_assert_int_eq(gmli_window_needs_calls(&a, BASE, CS, S1), 1);
  ck_assert_int_eq(gmli_window_needs_calls(&a, BASE, CS, S2), 0);
  a.safe_tick = 51; /* a fence passed the free */
  ck_assert_int_eq(gmli_window_needs_calls(&a, BASE, CS, S1), 0);
}
END_TEST

/* Leases: the shortfall first, needed; then headroom, optional, up to
 * headroom_pct of the peak allocated, not before the retry tick. */
START_TEST(test_lease_plan) {
  a.headroom_pct = 50, a.peak_allocated = 8 * CS, a.held = 6;
  free_chunk(GML_CL_FRESH, -1, 0, 0);
  free_chunk(GML_CL_CACHED, 0, S1, 50);
  gml_lease_plan p = gmli_policy_lease(&a, 5);
  ck_assert_uint_eq(p.chunks, 3);
  ck_assert_int_eq(p.optional, 0);
  p = gmli_policy_lease(&a, 2); /* enough free, one fresh: headroom of need - fresh, within 12 - 6 */
  ck_assert_uint_eq(p.chunks, 1);
  ck_assert_int_eq(p.optional, 1);
  ck_assert_uint_eq(p.retry_tick, 100 + GML_HEADROOM_BACKOFF);
  a.held = 12; /* at the cap */
  ck_assert_uint_eq(gmli_policy_lease(&a, 2).chunks, 0);
  a.held = 6, a.headroom_retry_tick = 101; /* the source said no lately */
  ck_assert_uint_eq(gmli_policy_lease(&a, 2).chunks, 0);
  a.headroom_retry_tick = 0, a.headroom_pct = 0;
  ck_assert_uint_eq(gmli_policy_lease(&a, 2).chunks, 0);
}
END_TEST

/* A slot gets a fresh chunk first; else, of the cached ones ready for its
 * stream, the one mapped farthest away; the oldest if none is ready. */
START_TEST(test_chunk_for_slot) {
  stream(1, S1), stream(2, S2);
  int32_t near = free_chunk(GML_CL_CACHED, 3, S1, 50);
  int32_t far_not_ready = free_chunk(GML_CL_CACHED, 15, S2, 50);
  int32_t far = free_chunk(GML_CL_CACHED, 10, S1, 50);
  ck_assert_int_eq(gmli_policy_chunk_for_slot(&a, 2, S1), far);
  ck_assert_int_eq(gmli_policy_chunk_for_slot(&a, 2, S2), far_not_ready);
  chunks[near].free_stream = chunks[far].free_stream = S2;
  chunks[far_not_ready].free_stream = S2;
  ck_assert_int_eq(gmli_policy_chunk_for_slot(&a, 2, S1), near); /* none ready: the oldest */
  int32_t fresh = free_chunk(GML_CL_FRESH, -1, 0, 0);
  ck_assert_int_eq(gmli_policy_chunk_for_slot(&a, 2, S1), fresh);
}
END_TEST

/* Trim: chunks mapped nowhere go back first, then the cached ones oldest
 * first; the device is synchronized only if the trim reaches those. */
START_TEST(test_trim_order) {
  ck_assert_int_eq(gmli_policy_trim_next(&a), -1);
  int32_t cached = free_chunk(GML_CL_CACHED, 0, S1, 50);
  int32_t fresh = free_chunk(GML_CL_FRESH, -1, 0, 0);
  ck_assert_int_eq(gmli_policy_trim_next(&a), fresh);
  ck_assert_int_eq(gmli_policy_trim_reaches_mapped(&a, 1), 0);
  ck_assert_int_eq(gmli_policy_trim_reaches_mapped(&a, 2), 1);
  clist_unlink(&a, fresh);
  ck_assert_int_eq(gmli_policy_trim_next(&a), cached);
}
END_TEST

Suite *policy_suite(void) {
  Suite *s = suite_create("policy");
  TCase *tc = tcase_create("policy");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, test_one_stream_best_fit);
  tcase_add_test(tc, test_no_fit_harvests_then_gives_up);
  tcase_add_test(tc, test_fit_needing_calls_harvests);
  tcase_add_test(tc, test_borrow_names_lender_and_wait);
  tcase_add_test(tc, test_borrow_bounds_and_ordered_first);
  tcase_add_test(tc, test_window_needs_calls);
  tcase_add_test(tc, test_lease_plan);
  tcase_add_test(tc, test_chunk_for_slot);
  tcase_add_test(tc, test_trim_order);
  suite_add_tcase(s, tc);
  return s;
}
