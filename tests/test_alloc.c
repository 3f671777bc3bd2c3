/* Allocator tests on the host backend: split, stitch, small-block packing,
 * stream-ordered reuse, out-of-memory, and a long randomized run checked
 * against a reference model (no overlap, content kept, accounting adds up). */
#include "alloc.h"
#include "options.h"
#include "rounds.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ul * 1024ul)

typedef struct test_src {
  gml_backend *be;
  size_t live, max_live, limit;
} test_src;

static int src_acquire(void *ctx, size_t n, int optional, gml_phys *phys, uint64_t *ids) {
  test_src *s = ctx;
  (void)optional;
  size_t k = 0;
  for (; k < n && (!s->limit || s->live < s->limit); k++) {
    ck_assert_int_eq(s->be->ops->chunk_create(s->be, &phys[k], NULL), 0);
    ids[k] = ++s->live;
  }
  if (s->live > s->max_live) s->max_live = s->live;
  return k ? (int)k : GML_ENOMEM;
}

static void src_release(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids) {
  test_src *s = ctx;
  (void)ids;
  for (size_t i = 0; i < n; i++) s->be->ops->chunk_release(s->be, phys[i]);
  s->live -= n;
}

static gml_backend *be;
static test_src src;
static gml_allocator A;

static void setup(void) {
  char msg[256];
  ck_assert_int_eq(gmli_backend_open("host", 0, NULL, &be, msg, sizeof msg), 0);
  memset(&src, 0, sizeof src);
  src.be = be;
  ck_assert_int_eq(gmli_alloc_init(&A, be, (gml_chunk_source){&src, src_acquire, src_release, NULL}, 8ul << 30, NULL),
                   0);
}

static void teardown(void) {
  gmli_alloc_destroy(&A);
  ck_assert_int_eq(src.live, 0); /* every chunk went back */
  gmli_backend_close(be);
}

static void *xalloc(size_t n, gml_stream s) {
  void *p = NULL;
  int rc = gmli_alloc_malloc(&A, n, s, &p);
  ck_assert_msg(rc == 0, "alloc %zu: %s", n, A.last_error);
  return p;
}

START_TEST(test_split_shares_chunks) {
  /* two 1 MiB blocks share one 2 MiB chunk; the remainder of a 3 MiB block is used by the next */
  void *a = xalloc(1 * MiB, 0), *b = xalloc(1 * MiB, 0);
  ck_assert_ptr_eq((char *)a + MiB, b);
  ck_assert_uint_eq(src.live, 1);
  void *c = xalloc(3 * MiB, 0), *d = xalloc(1 * MiB, 0);
  ck_assert_uint_eq(src.live, 3); /* 6 MiB of blocks in 3 chunks */
  memset(a, 1, MiB), memset(b, 2, MiB), memset(c, 3, 3 * MiB), memset(d, 4, MiB);
  ck_assert_int_eq(((char *)b)[0], 2);
  ck_assert_int_eq(((char *)c)[3 * MiB - 1], 3);
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  gmli_alloc_free(&A, a), gmli_alloc_free(&A, b), gmli_alloc_free(&A, c), gmli_alloc_free(&A, d);
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  ck_assert_uint_eq(A.allocated, 0);
}
END_TEST

START_TEST(test_stitch_reuses_free_chunks) {
  void *x = xalloc(4 * MiB, 0), *y = xalloc(4 * MiB, 0), *z = xalloc(4 * MiB, 0);
  ck_assert_uint_eq(src.live, 6);
  memset(y, 0x5a, 4 * MiB);
  gmli_alloc_free(&A, x);
  gmli_alloc_free(&A, z);
  /* 8 MiB free, but in two pieces around y: stitching serves 8 MiB without new chunks */
  uint64_t maps0 = A.maps;
  void *w = xalloc(8 * MiB, 0);
  ck_assert_uint_eq(src.live, 6);
  ck_assert_uint_gt(A.maps, maps0);
  gml_stats st;
  gmli_alloc_stats(&A, &st);
  ck_assert_uint_eq(st.stitched, 8 * MiB);
  memset(w, 0x33, 8 * MiB);
  for (size_t i = 0; i < 4 * MiB; i += 4096) ck_assert_int_eq(((unsigned char *)y)[i], 0x5a);
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  gmli_alloc_free(&A, w);
  gmli_alloc_free(&A, y);
}
END_TEST

/* Two step shapes taking turns: the second time round each finds its
 * chunks still mapped where it left them (no driver call), memory stays at
 * the larger shape's, and the aliases do not let live blocks share memory. */
static void run_shape(const size_t *mib, int n, unsigned char fill) {
  void *p[8];
  for (int i = 0; i < n; i++) {
    p[i] = xalloc(mib[i] * MiB, 0);
    memset(p[i], fill + i, mib[i] * MiB);
  }
  for (int i = 0; i < n; i++)
    for (size_t k = 0; k < mib[i] * MiB; k += 65536)
      ck_assert_int_eq(((unsigned char *)p[i])[k], (unsigned char)(fill + i));
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  for (int i = 0; i < n; i++) gmli_alloc_free(&A, p[i]);
}

/* A reclaim of nearly 2^64 bytes (the daemon's word: several asks summed,
 * or one odd one) is everything idle: rounding it up to whole chunks wrapped
 * to 0 chunks and nothing went back. */
START_TEST(test_release_huge_is_all) {
  for (int ready = 0; ready < 2; ready++) {
    void *p;
    ck_assert_int_eq(gmli_alloc_malloc(&A, 5 * MiB, 0, &p), 0);
    ck_assert_int_eq(gmli_alloc_free(&A, p), 0);
    size_t held = src.live, left = 0;
    ck_assert_uint_gt(held, 0);
    size_t got = 0;
    if (!ready) got = gmli_alloc_release_idle(&A, SIZE_MAX - 100);
    for (int i = 0; ready && i < 3; i++)
      got += gmli_alloc_release_ready(&A, SIZE_MAX - 100, &left); /* a fence, then past it */
    ck_assert_msg(got == held * 2 * MiB, "%s: %zu of %zu bytes", ready ? "ready" : "idle", got, held * 2 * MiB);
    ck_assert_uint_eq(src.live, 0);
  }
}
END_TEST

START_TEST(test_repeated_shapes_map_nothing) {
  static const size_t s1[] = {10, 6, 8, 1}, s2[] = {4, 12, 3, 7, 2};
  run_shape(s1, 4, 1), run_shape(s2, 5, 2);
  uint64_t maps = A.maps, unmaps = A.unmaps;
  size_t held = src.live;
  ck_assert_uint_le(held, 16); /* 29 MiB at most: the larger shape, in 2 MiB chunks, plus a little */
  for (int round = 0; round < 3; round++) run_shape(s1, 4, 3), run_shape(s2, 5, 4);
  ck_assert_uint_eq(A.maps, maps);
  ck_assert_uint_eq(A.unmaps, unmaps);
  ck_assert_uint_eq(src.live, held);
  /* giving back unmaps every alias of every chunk */
  ck_assert_uint_eq(gmli_alloc_release_idle(&A, 0), held * 2 * MiB);
  ck_assert_uint_eq(src.live, 0);
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  run_shape(s2, 5, 5); /* and works again from nothing */
}
END_TEST

/* A slot that needs a chunk takes a fresh one (leased as headroom) rather
 * than one mapped elsewhere, while the held bytes stay within headroom_pct
 * of the peak allocated; at the limit, or with no headroom, the free
 * chunks mapped elsewhere serve (stitching). */
static void headroom_case(double pct, size_t want_live, uint64_t want_headroom) {
  A.headroom_pct = pct;
  void *a = xalloc(4 * MiB, 0), *b = xalloc(4 * MiB, 0); /* slots 0-1, 2-3 */
  gmli_alloc_free(&A, a);                                /* its 2 chunks stay mapped there, free */
  uint64_t maps = A.maps;
  void *c = xalloc(6 * MiB, 0); /* 3 new slots: 1 chunk leased for need, then headroom or a's */
  ck_assert_uint_eq(A.maps - maps, 3);
  ck_assert_uint_eq(src.live, want_live);
  ck_assert_uint_eq(A.headroom_leased, want_headroom);
  gml_stats st;
  gmli_alloc_stats(&A, &st);
  ck_assert_uint_eq(st.headroom_leased, want_headroom);
  ck_assert_uint_le(st.peak_reserved, (uint64_t)((double)st.peak_allocated * (1 + pct / 100)) + 2 * MiB);
  memset(b, 1, 4 * MiB), memset(c, 2, 6 * MiB); /* no two live blocks share memory */
  ck_assert_int_eq(((unsigned char *)b)[4 * MiB - 1], 1);
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  gmli_alloc_free(&A, b), gmli_alloc_free(&A, c);
}
START_TEST(test_headroom_takes_fresh_chunks) { headroom_case(50, 6, 1); }
END_TEST
START_TEST(test_no_headroom_stitches) { headroom_case(0, 5, 0); }
END_TEST

START_TEST(test_small_blocks_packed) {
  void *p[200];
  for (int i = 0; i < 200; i++) {
    p[i] = xalloc(4000, 0);
    memset(p[i], i, 4000);
  }
  ck_assert_uint_eq(src.live, 1); /* 200 x 4 KiB in one 2 MiB chunk */
  for (int i = 0; i < 200; i++) ck_assert_int_eq(((unsigned char *)p[i])[3999], (unsigned char)i);
  for (int i = 0; i < 200; i += 2) gmli_alloc_free(&A, p[i]);
  void *q = xalloc(4000, 0); /* reuses a hole */
  ck_assert_uint_eq(src.live, 1);
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  gmli_alloc_free(&A, q);
  for (int i = 1; i < 200; i += 2) gmli_alloc_free(&A, p[i]);
}
END_TEST

/* Host events are done at once; this wrapper lets the test say when. */
static int event_gate_open;
static int gated_event_done(gml_backend *b, uintptr_t ev) {
  (void)b, (void)ev;
  return event_gate_open;
}

START_TEST(test_stream_ordered_reuse) {
  struct gml_backend_ops ops = *be->ops;
  ops.event_done = gated_event_done;
  const struct gml_backend_ops *saved = be->ops;
  be->ops = &ops;
  event_gate_open = 0;
  gmli_alloc_set_borrow(&A, 0, 1, 0); /* without borrowing (test_borrow.c has it): no block crosses streams early */
  void *a = xalloc(6 * MiB, 1);
  gmli_alloc_free(&A, a);
  ck_assert_ptr_eq(xalloc(6 * MiB, 1), a); /* same stream: at once */
  gmli_alloc_free(&A, a);
  void *b = xalloc(6 * MiB, 2); /* stream 1 not past it yet: not reused */
  ck_assert_ptr_ne(b, a);
  gmli_alloc_free(&A, b);
  event_gate_open = 1;
  void *c = xalloc(6 * MiB, 3); /* stream 1 and 2 are past their blocks: reused */
  ck_assert_msg(c == a || c == b, "expected a block freed on another stream");
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  gmli_alloc_free(&A, c);
  be->ops = saved;
}
END_TEST

START_TEST(test_oom_is_clear_and_recoverable) {
  src.limit = 8; /* 16 MiB */
  void *a = xalloc(10 * MiB, 0);
  void *p = NULL;
  int rc = gmli_alloc_malloc(&A, 10 * MiB, 0, &p);
  ck_assert_int_eq(rc, GML_ENOMEM);
  ck_assert_msg(strstr(A.last_error, "asked 10.00 MiB") && strstr(A.last_error, "allocated 10.00 MiB"), "%s",
                A.last_error);
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  gmli_alloc_free(&A, a);
  /* the freed chunks are stitched into the new request: no new chunk needed */
  void *b = xalloc(16 * MiB, 0);
  ck_assert_uint_le(src.live, 8);
  ck_assert_int_eq(gmli_alloc_free(&A, b), 0);
  ck_assert_int_eq(gmli_alloc_free(&A, b), GML_EBADPTR);
  ck_assert_int_eq(gmli_alloc_malloc(&A, 0, 0, &p), GML_EINVAL);
}
END_TEST

START_TEST(test_release_idle) {
  void *a = xalloc(20 * MiB, 0);
  gmli_alloc_free(&A, a);
  ck_assert_uint_eq(src.live, 10);
  size_t n = gmli_alloc_release_idle(&A, 0);
  ck_assert_uint_eq(n, 20 * MiB);
  ck_assert_uint_eq(src.live, 0);
  void *b = xalloc(3 * MiB, 0); /* and the range can be used again */
  memset(b, 1, 3 * MiB);
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  gmli_alloc_free(&A, b);
}
END_TEST

typedef struct model_block {
  unsigned char *p;
  size_t size;
  unsigned char fill;
} model_block;

static int cmp_ptr(const void *x, const void *y) {
  const model_block *a = x, *b = y;
  return a->p < b->p ? -1 : a->p > b->p;
}

/* GMLAKE_CHUNK_SIZE and gmli_backend_set_chunk_size: multiples of the
 * granularity only; anything else leaves the default and says so. */
START_TEST(test_chunk_size_setting) {
  ck_assert_uint_eq(be->granularity, 2 * MiB);
  ck_assert_int_eq(gmli_backend_set_chunk_size(be, 3 * MiB), GML_EINVAL);
  ck_assert_int_eq(gmli_backend_set_chunk_size(be, 0), GML_EINVAL);
  ck_assert_uint_eq(be->chunk_size, 2 * MiB);
  ck_assert_int_eq(gmli_backend_set_chunk_size(be, 8 * MiB), 0);
  ck_assert_uint_eq(be->chunk_size, 8 * MiB);
  const char *cases[][2] = {{"4MiB", "4194304"}, {"3MiB", "2097152"}, {"junk", "2097152"}, {"1MiB", "2097152"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gml_backend_opts bo = {.chunk_size = cases[i][0]}; /* GMLAKE_CHUNK_SIZE, passed down */
    gml_backend *b2 = NULL;
    char msg[256];
    ck_assert_int_eq(gmli_backend_open("host", 0, &bo, &b2, msg, sizeof msg), 0);
    ck_assert_msg(b2->chunk_size == strtoull(cases[i][1], NULL, 10), "GMLAKE_CHUNK_SIZE=%s gave %zu", cases[i][0],
                  b2->chunk_size);
    gmli_backend_close(b2);
  }
}
END_TEST

/* The host backend reserves as the cuda one does: aligned to the largest
 * power of two dividing the chunk, and (a chunk that is no power of two)
 * never to the chunk itself, so nothing above may count on a chunk-aligned
 * range (it held on the host only, where ranges were chunk-aligned). */
START_TEST(test_va_reserve_aligned_like_cuda) {
  const size_t sizes[] = {2 * MiB, 4 * MiB, 6 * MiB, 10 * MiB, 12 * MiB, 14 * MiB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t cs = sizes[i], align = cs & (~cs + 1);
    ck_assert_int_eq(gmli_backend_set_chunk_size(be, cs), 0);
    uintptr_t va[8];
    for (int k = 0; k < 8; k++) {
      ck_assert_int_eq(be->ops->va_reserve(be, (size_t)(k + 1) * cs, &va[k]), 0);
      ck_assert_msg(va[k] % align == 0, "chunk %zu: range at %#lx, not %zu-aligned", cs, (unsigned long)va[k], align);
      ck_assert_msg(align == cs || va[k] % cs != 0, "chunk %zu: range at %#lx is chunk-aligned", cs,
                    (unsigned long)va[k]);
    }
    for (int k = 0; k < 8; k++) be->ops->va_free(be, va[k], (size_t)(k + 1) * cs);
  }
  ck_assert_int_eq(gmli_backend_set_chunk_size(be, 2 * MiB), 0);
}
END_TEST

START_TEST(test_headroom_setting) {
  ck_assert(A.headroom_pct == GML_DEFAULT_HEADROOM_PCT);
  const struct {
    const char *env;
    double want;
  } cases[] = {{"5", 5}, {"0.5%", 0.5}, {"0", 0}, {"junk", 2}, {"-1", 2}, {"101", 2}, {"3x", 2}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    setenv("GMLAKE_HEADROOM", cases[i].env, 1);
    gml_allocator a2;
    gml_options opt;
    gmli_options_from_env(&opt); /* read once at gml_open; the allocator reads no environment */
    gml_alloc_config cfg;
    gmli_alloc_config_from_options(&opt, &cfg);
    ck_assert_int_eq(
        gmli_alloc_init(&a2, be, (gml_chunk_source){&src, src_acquire, src_release, NULL}, 1ul << 30, &cfg), 0);
    ck_assert_msg(a2.headroom_pct == cases[i].want, "GMLAKE_HEADROOM=%s gave %g", cases[i].env, a2.headroom_pct);
    gmli_alloc_destroy(&a2);
  }
  unsetenv("GMLAKE_HEADROOM");
}
END_TEST

/* Writes (write=1) or checks a block's fill at its two ends and at every address of it that is a
 * multiple of 4 KiB; returns how many bytes differ. The addresses are absolute, not offsets from
 * the block, so two live blocks that a wrong mapping aliased to one physical page both write that
 * page's first byte and the one written first fails its check; a memset of every byte found
 * nothing more and cost the suite most of its time (under ASan 2.5 CPU-minutes). */
static size_t model_touch(unsigned char *p, size_t size, unsigned char fill, int write) {
  size_t bad = 0;
  unsigned char *page = (unsigned char *)(((uintptr_t)p + 4095) & ~(uintptr_t)4095);
  unsigned char *end = p + size;
  unsigned char *at[2] = {p, end - 1};
  for (int i = 0; i < 2; i++) {
    if (write) *at[i] = fill;
    else bad += *at[i] != fill;
  }
  for (; page < end; page += 4096) {
    if (write) *page = fill;
    else bad += *page != fill;
  }
  return bad;
}

/* _i = 0: 2 MiB chunks (the host default); 1: 6 MiB (the cuda default: no power
 * of two, so nothing may assume one); 2: 4 MiB */
START_TEST(test_randomized_against_model) {
  enum { N = 600 };
  model_block live[N];
  size_t nlive = 0;
  uint64_t rng = 12345 + (uint64_t)_i;
  uint64_t expect_allocated = 0;
  if (_i >= 1) {
    gmli_alloc_destroy(&A);
    ck_assert_int_eq(gmli_backend_set_chunk_size(be, (_i == 1 ? 6 : 4) * MiB), 0);
    ck_assert_int_eq(gmli_alloc_init(&A, be, (gml_chunk_source){&src, src_acquire, src_release, NULL}, 8ul << 30, NULL),
                     0);
  }
  src.limit = (400 * MiB) / be->chunk_size; /* 400 MiB: some requests fail, and must fail cleanly */
  for (int step = 0; step < TEST_ROUNDS(30000); step++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(rng >> 33);
    int do_alloc = nlive == 0 || (nlive < N && (r & 1));
    if (do_alloc) {
      size_t size;
      switch ((r >> 1) % 4) {
      case 0: size = 1 + (r >> 4) % 4096; break;
      case 1: size = 4096 + (r >> 4) % (1 << 20); break;
      case 2: size = (1 << 20) + (r >> 4) % (8 << 20); break;
      default: size = ((r >> 4) % 12 + 1) * (2 << 20); break;
      }
      gml_stream s = (r >> 28) % 3;
      void *p;
      int rc = gmli_alloc_malloc(&A, size, s, &p);
      if (rc) {
        ck_assert_int_eq(rc, GML_ENOMEM);
        continue;
      }
      unsigned char fill = (unsigned char)(step * 7 + 1);
      model_touch((unsigned char *)p, size, fill, 1);
      live[nlive++] = (model_block){p, size, fill};
      expect_allocated += (size + GML_ALIGN - 1) / GML_ALIGN * GML_ALIGN;
    } else {
      size_t i = (r >> 1) % nlive;
      model_block m = live[i];
      /* the content must be what we wrote */
      ck_assert_msg(model_touch(m.p, m.size, m.fill, 0) == 0, "a block's bytes changed while it lived");
      ck_assert_int_eq(gmli_alloc_free(&A, m.p), 0);
      expect_allocated -= (m.size + GML_ALIGN - 1) / GML_ALIGN * GML_ALIGN;
      live[i] = live[--nlive];
    }
    if (step % 1000 == 999) {
      ck_assert_uint_eq(A.allocated, expect_allocated);
      ck_assert_msg(gmli_alloc_check(&A) == 0, "%s", A.last_error);
      qsort(live, nlive, sizeof live[0], cmp_ptr);
      for (size_t i = 1; i < nlive; i++)
        ck_assert_msg(live[i - 1].p + live[i - 1].size <= live[i].p, "live blocks overlap");
      if ((r >> 8) % 4 == 0) gmli_alloc_release_idle(&A, (r >> 10) % 64 * MiB);
    }
  }
  for (size_t i = 0; i < nlive; i++) {
    ck_assert_int_eq(model_touch(live[i].p, live[i].size, live[i].fill, 0), 0);
    gmli_alloc_free(&A, live[i].p);
  }
  ck_assert_uint_eq(A.allocated, 0);
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  ck_assert_uint_le(src.max_live, 200);
}
END_TEST

Suite *alloc_suite(void) {
  Suite *s = suite_create("alloc");
  TCase *tc = tcase_create("alloc");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_split_shares_chunks);
  tcase_add_test(tc, test_stitch_reuses_free_chunks);
  tcase_add_test(tc, test_small_blocks_packed);
  tcase_add_test(tc, test_stream_ordered_reuse);
  tcase_add_test(tc, test_oom_is_clear_and_recoverable);
  tcase_add_test(tc, test_release_idle);
  tcase_add_test(tc, test_repeated_shapes_map_nothing);
  tcase_add_test(tc, test_release_huge_is_all);
  tcase_add_test(tc, test_headroom_takes_fresh_chunks);
  tcase_add_test(tc, test_no_headroom_stitches);
  tcase_add_loop_test(tc, test_randomized_against_model, 0, 3);
  tcase_add_test(tc, test_chunk_size_setting);
  tcase_add_test(tc, test_va_reserve_aligned_like_cuda);
  tcase_add_test(tc, test_headroom_setting);
  suite_add_tcase(s, tc);
  return s;
}
