/* Cross-stream borrowing on the host backend with fake events (events done
 * only when the test lets a stream's work progress): the fake-event model
 * itself, borrowing's limits, and a randomized multi-stream run that checks
 * every block handed out against the ordering the backend recorded: the
 * lender's last use of every byte (by address, and by physical chunk
 * offset, since stitching maps chunks elsewhere) must be done, or on the
 * borrower's own stream, or waited for on the borrower's stream. The same
 * run with stream_wait_event dropped (a mutant that "forgets" the wait)
 * must be caught. */
#include "backends.h"
#include "client_priv.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ul * 1024ul)

typedef struct bsrc {
  gml_backend *be;
  size_t live;
} bsrc;

static int b_acquire(void *ctx, size_t n, int optional, gml_phys *phys, uint64_t *ids) {
  bsrc *s = ctx;
  (void)optional;
  for (size_t k = 0; k < n; k++) {
    ck_assert_int_eq(s->be->ops->chunk_create(s->be, &phys[k], NULL), 0);
    ids[k] = ++s->live;
  }
  return (int)n;
}

static void b_release(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids) {
  bsrc *s = ctx;
  (void)ids;
  for (size_t i = 0; i < n; i++) s->be->ops->chunk_release(s->be, phys[i]);
  s->live -= n;
}

/* The backend as the allocator sees it: fake events, and map/unmap tracked
 * so the test knows which chunk backs which slot; `drop_waits` is the mutant. */
static gml_backend *be;
static struct gml_backend_ops wrapped;
static const struct gml_backend_ops *fake_ops;
static uintptr_t va_base;
static gml_phys *slot_phys; /* by slot index; 0 = nothing mapped (memfds are never fd 0 here) */
static size_t nslots_tracked;
static int drop_waits;
static bsrc src;
static gml_allocator A;

static int w_va_reserve(gml_backend *b, size_t size, uintptr_t *va) {
  int rc = fake_ops->va_reserve(b, size, va);
  if (!rc) {
    va_base = *va;
    nslots_tracked = size / b->chunk_size;
    slot_phys = calloc(nslots_tracked, sizeof *slot_phys);
  }
  return rc;
}
static int w_map(gml_backend *b, uintptr_t va, gml_phys phys) {
  int rc = fake_ops->map(b, va, phys);
  if (!rc) slot_phys[(va - va_base) / b->chunk_size] = phys;
  return rc;
}
static int w_unmap(gml_backend *b, uintptr_t va, size_t size) {
  int rc = fake_ops->unmap(b, va, size);
  for (size_t s = (va - va_base) / b->chunk_size; !rc && s < (va + size - va_base) / b->chunk_size; s++)
    slot_phys[s] = 0;
  return rc;
}
static int w_wait(gml_backend *b, uintptr_t stream, uintptr_t event) {
  return drop_waits ? 0 : fake_ops->stream_wait_event(b, stream, event);
}

static void bsetup(void) {
  char msg[256];
  ck_assert_int_eq(gmli_backend_open("host", 0, NULL, &be, msg, sizeof msg), 0);
  ck_assert_int_eq(gml_host_fake_events(be), 0);
  fake_ops = be->ops;
  wrapped = *be->ops;
  wrapped.va_reserve = w_va_reserve, wrapped.map = w_map, wrapped.unmap = w_unmap, wrapped.stream_wait_event = w_wait;
  be->ops = &wrapped;
  drop_waits = 0;
  memset(&src, 0, sizeof src);
  src.be = be;
  ck_assert_int_eq(gmli_alloc_init(&A, be, (gml_chunk_source){&src, b_acquire, b_release, NULL}, 8ul << 30, NULL), 0);
  gmli_alloc_set_borrow(&A, 1, 1.5, 8);
}

static void bteardown(void) {
  gmli_alloc_destroy(&A);
  ck_assert_int_eq(src.live, 0);
  be->ops = fake_ops;
  gmli_backend_close(be);
  free(slot_phys);
  slot_phys = NULL;
}

static void *balloc(size_t n, gml_stream s) {
  void *p = NULL;
  int rc = gmli_alloc_malloc(&A, n, s, &p);
  ck_assert_msg(rc == 0, "alloc %zu: %s", n, A.last_error);
  return p;
}

/* The fake-event model: work completes in order, an event waits for its
 * stream's work, a wait holds the waiting stream and orders it after. */
START_TEST(test_fake_events_model) {
  uint64_t p1 = gml_host_fake_launch(be, 1);
  uintptr_t ev;
  ck_assert_int_eq(be->ops->event_record(be, 1, &ev), 0);
  ck_assert_int_eq(be->ops->event_done(be, ev), 0);
  ck_assert(!gml_host_fake_ordered(be, 1, p1, 2));
  ck_assert(gml_host_fake_ordered(be, 1, p1, 1)); /* the same stream is ordered */
  gml_host_fake_launch(be, 2);
  ck_assert_int_eq(fake_ops->stream_wait_event(be, 2, ev), 0);
  uint64_t p2 = gml_host_fake_launch(be, 2);
  ck_assert(gml_host_fake_ordered(be, 1, p1, 2)); /* through the wait */
  gml_host_fake_progress(be, 2, 10);              /* the unit before the wait only */
  ck_assert(!gml_host_fake_ordered(be, 2, p2, 3));
  ck_assert(gml_host_fake_ordered(be, 2, p2 - 1, 3));
  gml_host_fake_progress(be, 1, 1);
  ck_assert_int_eq(be->ops->event_done(be, ev), 1);
  gml_host_fake_progress(be, 2, 10);
  ck_assert(gml_host_fake_ordered(be, 2, p2, 3)); /* done now */
  be->ops->event_destroy(be, ev);
  gml_host_fake_launch(be, 3);
  ck_assert_int_eq(be->ops->synchronize(be), 0);
  ck_assert(gml_host_fake_ordered(be, 3, 1, 1));
}
END_TEST

/* Stream 2 takes the block stream 1 freed while stream 1 is still busy,
 * with a wait; with borrowing off it does not (it syncs or maps instead). */
START_TEST(test_borrow_with_wait) {
  void *a = balloc(6 * MiB, 1);
  uint64_t use = gml_host_fake_launch(be, 1);
  ck_assert_int_eq(gmli_alloc_free(&A, a), 0);
  uint64_t maps = A.maps;
  void *b = balloc(6 * MiB, 2);
  ck_assert_ptr_eq(b, a);
  ck_assert_uint_eq(A.maps, maps); /* its chunks were mapped already */
  gml_stats st;
  gmli_alloc_stats(&A, &st);
  ck_assert_uint_eq(st.borrows, 1);
  ck_assert_uint_eq(st.borrow_waits, 1);
  ck_assert_uint_eq(st.syncs, 0);
  ck_assert_uint_eq(gml_host_fake_waits(be), 1);
  ck_assert(gml_host_fake_ordered(be, 1, use, 2));
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  gmli_alloc_free(&A, b);
  /* off: the same situation gets other memory, or a synchronize first */
  gmli_alloc_set_borrow(&A, 0, 1.5, 8);
  void *c = balloc(6 * MiB, 3);
  gml_host_fake_launch(be, 3);
  gmli_alloc_free(&A, c);
  void *d = balloc(6 * MiB, 4);
  gmli_alloc_stats(&A, &st);
  ck_assert_uint_eq(st.borrow_waits, 1);
  ck_assert_uint_eq(gml_host_fake_waits(be), 1);
  ck_assert_msg(d != c || st.syncs > 0, "borrowing off handed stream 3's busy block to stream 4 without a sync");
  gmli_alloc_free(&A, d);
}
END_TEST

/* Limits and what a borrow takes: a stream whose only candidate is much
 * larger than asked does not wait for it; once a stream waits for another,
 * every block that one freed so far joins its pool and best fit splits them
 * as usual (the rest serves it later with no further wait); no more waits
 * outstanding than the count allows. */
START_TEST(test_borrow_limits) {
  gmli_alloc_set_borrow(&A, 1, 1.5, 1);
  A.headroom_pct = 1000; /* fresh chunks rather than a synchronize for busy ones: keeps stream 1 busy */
  void *big = balloc(20 * MiB, 1), *sep = balloc(2 * MiB, 1), *x = balloc(6 * MiB, 1), *y = balloc(8 * MiB, 1);
  gml_host_fake_launch(be, 1);
  gmli_alloc_free(&A, big);
  void *p = balloc(6 * MiB, 2); /* 20 MiB > 1.5 x 6 MiB: no wait for it */
  ck_assert((char *)p >= (char *)big + 20 * MiB);
  gml_stats st;
  gmli_alloc_stats(&A, &st);
  ck_assert_uint_eq(st.borrow_waits, 0);
  gmli_alloc_free(&A, x), gmli_alloc_free(&A, y); /* coalesced: one free block of 14 MiB */
  gml_host_fake_launch(be, 1);
  void *q = balloc(10 * MiB, 3); /* 14 <= 1.5 x 10: stream 3 waits for stream 1, and splits the block */
  ck_assert_ptr_eq(q, x);
  ck_assert_uint_eq(gmli_alloc_size_of(&A, q), 10 * MiB);
  gmli_alloc_stats(&A, &st);
  ck_assert_uint_eq(st.borrow_waits, 1);
  uint64_t maps = A.maps;
  void *q2 = balloc(4 * MiB, 3),
       *q3 = balloc(20 * MiB, 3); /* the rest, and stream 1's other block: no more waits, no maps */
  ck_assert_ptr_eq(q2, (char *)x + 10 * MiB);
  ck_assert_ptr_eq(q3, big);
  ck_assert_uint_eq(A.maps, maps);
  gmli_alloc_stats(&A, &st);
  ck_assert_uint_eq(st.borrow_waits, 1);
  ck_assert_uint_eq(st.borrows, 3);
  gmli_alloc_free(&A, p);
  gml_host_fake_launch(be, 2);
  void *r = balloc(6 * MiB, 4); /* stream 1 not done: one wait outstanding already, no second */
  ck_assert_ptr_ne(r, p);
  gmli_alloc_stats(&A, &st);
  ck_assert_uint_eq(st.borrow_waits, 1);
  ck_assert_int_eq(gmli_alloc_check(&A), 0);
  gmli_alloc_free(&A, q), gmli_alloc_free(&A, q2), gmli_alloc_free(&A, q3), gmli_alloc_free(&A, r),
      gmli_alloc_free(&A, sep);
}
END_TEST

/* ---------- the randomized run ---------- */

typedef struct use_rec { /* bytes last used by a stream up to a position */
  int phys;              /* 0: by address, else the chunk (memfd) */
  uintptr_t lo, hi;
  gml_stream stream;
  uint64_t pos;
} use_rec;

static use_rec *uses;
static size_t nuses, cap_uses;

static void use_add(int phys, uintptr_t lo, uintptr_t hi, gml_stream s, uint64_t pos) {
  if (nuses == cap_uses) {
    cap_uses = cap_uses ? cap_uses * 2 : 1024;
    uses = realloc(uses, cap_uses * sizeof *uses);
  }
  uses[nuses++] = (use_rec){phys, lo, hi, s, pos};
}

/* Every byte range of [p, p + n) by address and by chunk: fn(phys, lo, hi). */
static void for_pieces(uintptr_t p, size_t n, void (*fn)(int, uintptr_t, uintptr_t, void *), void *ctx) {
  fn(0, p, p + n, ctx);
  size_t cs = be->chunk_size;
  for (uintptr_t a = p; a < p + n;) {
    size_t s = (a - va_base) / cs;
    uintptr_t end = va_base + (s + 1) * cs < p + n ? va_base + (s + 1) * cs : p + n;
    ck_assert_msg(slot_phys[s], "live block over an unmapped slot");
    fn((int)slot_phys[s], a - (va_base + s * cs), end - (va_base + s * cs), ctx);
    a = end;
  }
}

typedef struct chk_ctx {
  gml_stream to;
  size_t bad;
  uint64_t pos;
} chk_ctx;

static void piece_check(int phys, uintptr_t lo, uintptr_t hi, void *vctx) {
  chk_ctx *c = vctx;
  for (size_t i = 0; i < nuses; i++) {
    use_rec *u = &uses[i];
    if (u->phys != phys || u->hi <= lo || hi <= u->lo) continue;
    if (!gml_host_fake_ordered(be, u->stream, u->pos, c->to)) {
      c->bad++;
      if (getenv("GMLAKE_TEST_VERBOSE"))
        fprintf(stderr, "unordered: %s [%#lx,%#lx) last used by stream %lu at %llu, handed to stream %lu\n",
                phys ? "chunk bytes" : "address", (unsigned long)u->lo, (unsigned long)u->hi, (unsigned long)u->stream,
                (unsigned long long)u->pos, (unsigned long)c->to);
    }
  }
}

static void piece_record(int phys, uintptr_t lo, uintptr_t hi, void *vctx) {
  chk_ctx *c = vctx;
  use_add(phys, lo, hi, c->to, c->pos);
}

typedef struct rlive {
  void *p;
  size_t size;
  gml_stream s;
} rlive;

/* Returns the number of blocks handed out before their last use was ordered. */
static size_t random_run(uint64_t seed, int steps, gml_stats *st) {
  enum { N = 300, NSTREAMS = 4 };
  static const size_t sizes[] = {512 << 10, 1 * MiB, 3 * MiB, 6 * MiB, 6 * MiB + 512, 12 * MiB, 5 * MiB};
  rlive live[N];
  size_t nlive = 0, bad = 0;
  uint64_t rng = seed;
  nuses = 0;
  for (int step = 0; step < steps; step++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(rng >> 33);
    gml_stream s = 1 + (r >> 4) % NSTREAMS;
    if (r % 100 < 45 && nlive < N) {
      size_t size = sizes[(r >> 8) % (sizeof sizes / sizeof sizes[0])];
      void *p = balloc(size, s);
      size_t n = gmli_alloc_size_of(&A, p);
      chk_ctx c = {s, 0, 0};
      for_pieces((uintptr_t)p, n, piece_check, &c);
      bad += c.bad != 0;
      gml_host_fake_launch(be, s); /* a kernel uses it */
      live[nlive++] = (rlive){p, n, s};
    } else if (r % 100 < 85 && nlive) {
      size_t i = (r >> 8) % nlive;
      chk_ctx c = {live[i].s, 0, gml_host_fake_launch(be, live[i].s)}; /* its last use */
      for_pieces((uintptr_t)live[i].p, live[i].size, piece_record, &c);
      ck_assert_int_eq(gmli_alloc_free(&A, live[i].p), 0);
      live[i] = live[--nlive];
    } else {
      gml_host_fake_progress(be, s, (r >> 12) % 4);
    }
    if (step % 500 == 499) {
      ck_assert_msg(gmli_alloc_check(&A) == 0, "%s", A.last_error);
      size_t k = 0; /* forget uses that are done: ordered before a stream that never runs anything */
      for (size_t i = 0; i < nuses; i++)
        if (!gml_host_fake_ordered(be, uses[i].stream, uses[i].pos, 999)) uses[k++] = uses[i];
      nuses = k;
    }
  }
  for (size_t i = 0; i < nlive; i++) gmli_alloc_free(&A, live[i].p);
  gmli_alloc_stats(&A, st);
  return bad;
}

START_TEST(test_borrow_randomized_ordering) {
  gml_stats st;
  size_t bad = random_run(777, 20000, &st);
  ck_assert_msg(bad == 0, "%zu blocks handed to a stream before the lender's last use was ordered before it", bad);
  ck_assert_uint_gt(st.borrow_waits, 50); /* the run exercised borrowing with waits */
  ck_assert_uint_ge(st.borrows, st.borrow_waits);
  ck_assert_uint_eq(gml_host_fake_waits(be), st.borrow_waits);
  printf("borrow randomized run (borrowing on): %llu borrows, %llu with a wait, %llu syncs, %llu maps, peak reserved "
         "%.0f MiB\n",
         (unsigned long long)st.borrows, (unsigned long long)st.borrow_waits, (unsigned long long)st.syncs,
         (unsigned long long)st.maps, st.peak_reserved / (double)MiB);
  free(uses), uses = NULL, cap_uses = 0;
}
END_TEST

START_TEST(test_borrow_randomized_off) {
  gmli_alloc_set_borrow(&A, 0, 1.5, 8);
  gml_stats st;
  size_t bad = random_run(777, 20000, &st);
  ck_assert_msg(bad == 0, "%zu blocks handed out unordered with borrowing off", bad);
  ck_assert_uint_eq(st.borrow_waits, 0);
  printf("borrow randomized run (borrowing off): %llu borrows, %llu syncs, %llu maps, peak reserved %.0f MiB\n",
         (unsigned long long)st.borrows, (unsigned long long)st.syncs, (unsigned long long)st.maps,
         st.peak_reserved / (double)MiB);
  free(uses), uses = NULL, cap_uses = 0;
}
END_TEST

/* The mutant: the allocator asks for the wait, the backend drops it. The
 * checker must see blocks handed out before the lender was done. */
START_TEST(test_borrow_mutant_without_wait_is_caught) {
  drop_waits = 1;
  gml_stats st;
  size_t bad = random_run(777, 20000, &st);
  ck_assert_uint_gt(st.borrow_waits, 0);
  ck_assert_msg(bad > 0, "the checker missed a borrow whose wait was dropped");
  free(uses), uses = NULL, cap_uses = 0;
}
END_TEST

/* ---------- a side stream whose frees wait for the compute stream ----------
 * Through gml_open (embedded, host backend, fake events): a side stream D
 * fills each layer's weights into a fresh buffer, the compute stream C waits
 * for it, uses it (record_stream) and the buffer is freed at once, as FSDP
 * does with gathered parameters; C also keeps each layer's activation until
 * its backward. The device lags the CPU (C completes one unit every third
 * CPU operation; the step ends with a synchronize, loss.item()), so the
 * weights' frees wait for C. Borrowing off, D leases new memory for every
 * layer; on, it makes D wait for C's use of an older buffer and takes it. */
static gml_client *BC;
enum { SIDE_C = 1, SIDE_D = 2, SIDE_LAYERS = 8 };
#define SIDE_W (8 * MiB)
#define SIDE_ACT (4 * MiB)

static void csetup(void) {
  gml_open_opts o = {0};
  o.backend = "host";
  o.mode = GML_MODE_EMBEDDED;
  ck_assert_int_eq(gml_open(&o, &BC), 0);
  be = BC->be;
  ck_assert_int_eq(gml_host_fake_events(be), 0);
  fake_ops = be->ops;
  wrapped = *be->ops;
  wrapped.map = w_map, wrapped.unmap = w_unmap, wrapped.stream_wait_event = w_wait;
  be->ops = &wrapped;
  va_base = BC->alloc.va_base;
  nslots_tracked = BC->alloc.va_size / be->chunk_size;
  slot_phys = calloc(nslots_tracked, sizeof *slot_phys);
  drop_waits = 0;
}

static void cteardown(void) {
  ck_assert_int_eq(gmli_alloc_check(&BC->alloc), 0);
  be->ops = fake_ops;
  gml_close(BC);
  free(slot_phys);
  slot_phys = NULL;
  free(uses), uses = NULL, cap_uses = 0, nuses = 0;
}

static void *side_alloc(size_t n, gml_stream s, size_t *bad) {
  void *p = NULL;
  int rc = gml_alloc(BC, n, s, &p);
  ck_assert_msg(rc == 0, "alloc %zu: %s", n, gml_last_error(BC));
  chk_ctx c = {s, 0, 0};
  for_pieces((uintptr_t)p, n, piece_check, &c);
  *bad += c.bad != 0;
  return p;
}

static void side_use(void *p, size_t n, gml_stream s, uint64_t pos) {
  chk_ctx c = {s, 0, pos};
  for_pieces((uintptr_t)p, n, piece_record, &c);
}

static void side_tick(uint64_t *ops) {
  if (++*ops % 3 == 0) gml_host_fake_progress(be, SIDE_C, 1);
  gml_host_fake_progress(be, SIDE_D, 4);
}

/* Returns the allocations handed out before an earlier use of their bytes was ordered before them. */
static size_t side_run(int borrow, int steps, gml_stats *st) {
  size_t bad = 0;
  uint64_t ops = 0;
  gmli_alloc_set_borrow(&BC->alloc, borrow, 1.5, 8);
  for (int step = 0; step < steps; step++) {
    void *act[SIDE_LAYERS];
    for (int l = 0; l < SIDE_LAYERS; l++) {
      void *w = side_alloc(SIDE_W, SIDE_D, &bad);
      uint64_t filled = gml_host_fake_launch(be, SIDE_D);
      uintptr_t ev; /* C waits for the weights (wait_stream) */
      ck_assert_int_eq(fake_ops->event_record(be, SIDE_D, &ev), 0);
      ck_assert_int_eq(fake_ops->stream_wait_event(be, SIDE_C, ev), 0);
      fake_ops->event_destroy(be, ev);
      ck_assert_int_eq(gml_record_stream(BC, w, SIDE_C), 0);
      act[l] = side_alloc(SIDE_ACT, SIDE_C, &bad);
      uint64_t used = gml_host_fake_launch(be, SIDE_C);
      side_use(w, SIDE_W, SIDE_D, filled);
      side_use(w, SIDE_W, SIDE_C, used);
      ck_assert_int_eq(gml_free(BC, w), 0);
      side_tick(&ops);
    }
    for (int l = SIDE_LAYERS - 1; l >= 0; l--) {
      side_use(act[l], SIDE_ACT, SIDE_C, gml_host_fake_launch(be, SIDE_C));
      ck_assert_int_eq(gml_free(BC, act[l]), 0);
      side_tick(&ops);
    }
    ck_assert_int_eq(be->ops->synchronize(be), 0);
    nuses = 0; /* all done */
  }
  ck_assert_int_eq(gml_stats_get(BC, st), 0);
  return bad;
}

START_TEST(test_borrow_side_stream_off_grows) {
  gml_stats st;
  ck_assert_uint_eq(side_run(0, 6, &st), 0);
  printf("side stream (borrowing off): peak reserved %.0f MiB, peak allocated %.0f MiB, %llu maps, %llu syncs\n",
         st.peak_reserved / (double)MiB, st.peak_allocated / (double)MiB, (unsigned long long)st.maps,
         (unsigned long long)st.syncs);
  ck_assert_uint_eq(st.borrow_waits, 0);
  ck_assert_uint_ge(st.peak_reserved,
                    SIDE_LAYERS * (SIDE_ACT + SIDE_W) / 2); /* frees pile up behind the compute stream */
}
END_TEST

START_TEST(test_borrow_side_stream_on_does_not_grow) {
  gml_stats st;
  size_t bad = side_run(1, 6, &st);
  printf("side stream (borrowing on): peak reserved %.0f MiB, peak allocated %.0f MiB, %llu maps, %llu syncs, %llu "
         "borrows, %llu waits\n",
         st.peak_reserved / (double)MiB, st.peak_allocated / (double)MiB, (unsigned long long)st.maps,
         (unsigned long long)st.syncs, (unsigned long long)st.borrows, (unsigned long long)st.borrow_waits);
  ck_assert_msg(bad == 0, "%zu allocations handed out before an earlier use of their bytes was ordered before them",
                bad);
  ck_assert_uint_gt(st.borrow_waits, 0);
  ck_assert_uint_le(st.peak_reserved,
                    SIDE_LAYERS * SIDE_ACT + 3 * SIDE_W); /* a buffer or two in flight, not one per layer */
}
END_TEST

START_TEST(test_borrow_side_stream_mutant_is_caught) {
  drop_waits = 1;
  gml_stats st;
  ck_assert_uint_gt(side_run(1, 6, &st), 0);
}
END_TEST

/* The randomized run through gml_open: 4 streams, and a block may be used
 * on other streams than its own (gml_record_stream and a unit of work
 * there), so its free waits for them. Every allocation is checked against
 * every earlier use of its bytes, by address and by chunk. */
typedef struct clive {
  void *p;
  size_t n;
  gml_stream s;
  int nuse;
  gml_stream use_s[5]; /* its own stream, up to 3 others, its last use */
  uint64_t use_pos[5];
} clive;

static size_t client_random_run(int borrow, uint64_t seed, int steps, gml_stats *st) {
  enum { N = 200, NSTREAMS = 4 };
  static const size_t sizes[] = {512 << 10, 1 * MiB, 3 * MiB, 6 * MiB, 6 * MiB + 512, 12 * MiB, 5 * MiB};
  static clive live[N];
  size_t nlive = 0, bad = 0;
  uint64_t rng = seed;
  gmli_alloc_set_borrow(&BC->alloc, borrow, 1.5, 8);
  BC->alloc.headroom_pct = 0; /* no fresh chunks beyond need: memory waiting for other streams is what there is */
  for (int step = 0; step < steps; step++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(rng >> 33);
    gml_stream s = 1 + (r >> 4) % NSTREAMS;
    if (r % 100 < 40 && nlive < N) {
      void *p = side_alloc(sizes[(r >> 8) % (sizeof sizes / sizeof sizes[0])], s, &bad);
      clive *l = &live[nlive++];
      memset(l, 0, sizeof *l);
      l->p = p, l->n = gmli_alloc_size_of(&BC->alloc, p), l->s = s;
      l->use_s[l->nuse] = s, l->use_pos[l->nuse++] = gml_host_fake_launch(be, s);
    } else if (r % 100 < 60 && nlive) { /* used on another stream too */
      clive *l = &live[(r >> 8) % nlive];
      if (l->nuse < 4 && s != l->s) {
        ck_assert_int_eq(gml_record_stream(BC, l->p, s), 0);
        l->use_s[l->nuse] = s, l->use_pos[l->nuse++] = gml_host_fake_launch(be, s);
      }
    } else if (r % 100 < 92 && nlive) {
      size_t i = (r >> 8) % nlive;
      clive *l = &live[i];
      l->use_s[l->nuse] = l->s, l->use_pos[l->nuse++] = gml_host_fake_launch(be, l->s); /* its last use on its stream */
      for (int k = 0; k < l->nuse; k++) side_use(l->p, l->n, l->use_s[k], l->use_pos[k]);
      ck_assert_int_eq(gml_free(BC, l->p), 0);
      *l = live[--nlive];
    } else {
      gml_host_fake_progress(be, s, (r >> 12) % 4);
    }
    if (step % 500 == 499) {
      ck_assert_msg(gmli_alloc_check(&BC->alloc) == 0, "%s", BC->alloc.last_error);
      size_t k = 0; /* forget uses that are done */
      for (size_t i = 0; i < nuses; i++)
        if (!gml_host_fake_ordered(be, uses[i].stream, uses[i].pos, 999)) uses[k++] = uses[i];
      nuses = k;
    }
  }
  for (size_t i = 0; i < nlive; i++) gml_free(BC, live[i].p);
  ck_assert_int_eq(gml_stats_get(BC, st), 0);
  return bad;
}

START_TEST(test_borrow_client_randomized) {
  gml_stats st;
  size_t bad = client_random_run(1, 4242, 12000, &st);
  printf("borrow randomized run with record_stream (borrowing on): %llu borrows, %llu waits, %llu syncs, %llu maps, "
         "peak reserved %.0f MiB\n",
         (unsigned long long)st.borrows, (unsigned long long)st.borrow_waits, (unsigned long long)st.syncs,
         (unsigned long long)st.maps, st.peak_reserved / (double)MiB);
  ck_assert_msg(bad == 0, "%zu allocations handed out before an earlier use of their bytes was ordered before them",
                bad);
  ck_assert_uint_gt(st.borrow_waits, 50);
}
END_TEST

START_TEST(test_borrow_client_randomized_off) {
  gml_stats st;
  size_t bad = client_random_run(0, 4242, 12000, &st);
  printf("borrow randomized run with record_stream (borrowing off): %llu syncs, %llu maps, peak reserved %.0f MiB\n",
         (unsigned long long)st.syncs, (unsigned long long)st.maps, st.peak_reserved / (double)MiB);
  ck_assert_msg(bad == 0, "%zu allocations handed out unordered with borrowing off", bad);
  ck_assert_uint_eq(st.borrow_waits, 0);
}
END_TEST

START_TEST(test_borrow_client_randomized_mutant_is_caught) {
  drop_waits = 1;
  gml_stats st;
  ck_assert_uint_gt(client_random_run(1, 4242, 12000, &st), 0);
}
END_TEST

Suite *borrow_suite(void) {
  Suite *s = suite_create("borrow");
  TCase *tc = tcase_create("borrow");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, bsetup, bteardown);
  tcase_add_test(tc, test_fake_events_model);
  tcase_add_test(tc, test_borrow_with_wait);
  tcase_add_test(tc, test_borrow_limits);
  tcase_add_test(tc, test_borrow_randomized_ordering);
  tcase_add_test(tc, test_borrow_randomized_off);
  tcase_add_test(tc, test_borrow_mutant_without_wait_is_caught);
  suite_add_tcase(s, tc);
  TCase *side = tcase_create("side_stream");
  tcase_set_timeout(side, 120);
  tcase_add_checked_fixture(side, csetup, cteardown);
  tcase_add_test(side, test_borrow_side_stream_off_grows);
  tcase_add_test(side, test_borrow_side_stream_on_does_not_grow);
  tcase_add_test(side, test_borrow_side_stream_mutant_is_caught);
  tcase_add_test(side, test_borrow_client_randomized);
  tcase_add_test(side, test_borrow_client_randomized_off);
  tcase_add_test(side, test_borrow_client_randomized_mutant_is_caught);
  suite_add_tcase(s, side);
  return s;
}
