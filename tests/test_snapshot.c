/* Tests of gml_segments and the history's segment events (snapshot.c), the
 * C API behind torch.cuda.memory._snapshot() (python/gmlake/_C.cpp), on the
 * host backend, embedded: after a random run of allocations, frees, frees
 * that wait for recorded streams, and trims, the segments are where the held
 * chunks are shown (each once), their blocks cover them in address order
 * with free space listed, every tracked allocation is one of them; and the
 * history replayed backwards from the segments, as memory_viz's Allocator
 * State History does, never finds a block or a segment event outside the
 * segments (tools/memviz_check.py does the same from Python). */
#include "alloc_internal.h"
#include "client_priv.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ul * 1024ul)

static gml_client *C;
static struct gml_backend_ops gated_ops;
static const struct gml_backend_ops *real_ops;
static int gate_open;

static int gated_event_done(gml_backend *b, uintptr_t ev) {
  (void)b, (void)ev;
  return gate_open;
}

static int opened_synchronize(gml_backend *b) {
  gate_open = 1; /* the device is idle: every event is done */
  return real_ops->synchronize(b);
}

static void setup(void) {
  gml_open_opts o = {0};
  o.backend = "host";
  o.mode = GML_MODE_EMBEDDED;
  setenv("GMLAKE_CHUNK_SIZE", "2MiB", 1);
  ck_assert_int_eq(gml_open(&o, &C), 0);
  real_ops = C->be->ops;
  gated_ops = *real_ops;
  gated_ops.event_done = gated_event_done;
  gated_ops.synchronize = opened_synchronize;
  C->be->ops = &gated_ops;
  gate_open = 1;
}

static void teardown(void) {
  ck_assert_int_eq(gmli_alloc_check(&C->alloc), 0);
  C->be->ops = real_ops;
  gml_close(C);
}

typedef struct snap {
  gml_segment_info *segs;
  gml_alloc_info *blocks;
  size_t nsegs, nblocks;
  uint64_t seq;
} snap;

static snap take(void) {
  snap s = {0};
  size_t ns = 0, nb = 0;
  ck_assert_int_eq(gml_segments(C, NULL, 0, &ns, NULL, 0, &nb, NULL), 0);
  s.segs = calloc(ns + 16, sizeof *s.segs);
  s.blocks = calloc(nb + 64, sizeof *s.blocks);
  ck_assert_int_eq(gml_segments(C, s.segs, ns + 16, &s.nsegs, s.blocks, nb + 64, &s.nblocks, &s.seq), 0);
  ck_assert_uint_le(s.nsegs, ns + 16);
  ck_assert_uint_le(s.nblocks, nb + 64);
  return s;
}

/* The segments and their blocks, against the allocator and the tracked allocations. */
static size_t check_segments(const snap *s) {
  gml_allocator *a = &C->alloc;
  size_t shown = 0, b = 0, nfree = 0, nlive = 0;
  for (size_t i = 0; i < s->nsegs; i++) {
    const gml_segment_info *g = &s->segs[i];
    ck_assert_msg(g->addr && g->size && g->addr % a->cs == 0 && g->size % a->cs == 0, "segment %zu: %#lx +%zu", i,
                  (unsigned long)g->addr, g->size);
    ck_assert(gml_contains(C, (void *)g->addr) && gml_contains(C, (void *)(g->addr + g->size - 1)));
    if (i)
      ck_assert_uint_lt(s->segs[i - 1].addr + s->segs[i - 1].size,
                        g->addr + (g->large != s->segs[i - 1].large)); /* apart, or another region */
    ck_assert_uint_gt(g->nblocks, 0);
    uintptr_t pos = g->addr;
    for (size_t k = 0; k < g->nblocks; k++, b++) {
      ck_assert_uint_lt(b, s->nblocks);
      const gml_alloc_info *x = &s->blocks[b];
      ck_assert_msg(x->addr == pos && x->size > 0, "segment %zu block %zu at %#lx, expected %#lx", i, k,
                    (unsigned long)x->addr, (unsigned long)pos);
      pos += x->size;
      if (x->state == GML_BLOCK_FREE && !x->pool.a && !x->pool.b) {
        nfree++;
        if (k)
          ck_assert_int_ne(s->blocks[b - 1].state == GML_BLOCK_FREE && !s->blocks[b - 1].pool.a,
                           1); /* gaps are whole */
      } else {
        nlive++;
      }
    }
    ck_assert_uint_eq(pos, g->addr + g->size);                          /* blocks add up to the segment */
    for (uintptr_t at = g->addr; at < g->addr + g->size; at += a->cs) { /* each slot shows the chunk it maps */
      uint32_t sl = (uint32_t)((at - a->va_base) / a->cs);
      ck_assert_int_ge(a->slot_chunk[sl], 0);
      ck_assert_int_eq(a->chunks[a->slot_chunk[sl]].shown_at, (int32_t)sl);
    }
    shown += g->size;
  }
  ck_assert_uint_eq(b, s->nblocks);
  /* each held chunk once, but those mapped nowhere */
  ck_assert_uint_eq(shown, (a->held - a->lists[GML_CL_FRESH].count) * a->cs);
  /* every tracked allocation is a block, with its state */
  size_t n = 0;
  ck_assert_int_eq(gml_allocations(C, NULL, 0, &n), 0);
  gml_alloc_info *t = calloc(n + 1, sizeof *t);
  ck_assert_int_eq(gml_allocations(C, t, n + 1, &n), 0);
  ck_assert_uint_eq(nlive, n);
  for (size_t i = 0, k = 0; i < n; i++) {
    while (k < s->nblocks && s->blocks[k].addr < t[i].addr) k++;
    ck_assert_msg(k < s->nblocks && s->blocks[k].addr == t[i].addr, "allocation %#lx in no segment",
                  (unsigned long)t[i].addr);
    ck_assert_uint_eq(s->blocks[k].size, t[i].size);
    ck_assert_int_eq(s->blocks[k].state, t[i].state);
  }
  free(t);
  return nfree;
}

/* ---- memory_viz's replay: segments as address ranges, live blocks ---- */

typedef struct range {
  uintptr_t lo, hi;
} range;
static range *R, *B; /* segments (sorted, apart), blocks */
static size_t nR, nB;

static int covered(uintptr_t lo, uintptr_t hi) {
  for (size_t i = 0; i < nR; i++)
    if (R[i].lo <= lo && hi <= R[i].hi) return (int)i;
  return -1;
}

static void seg_add(uintptr_t lo,
                    uintptr_t hi) { /* undo an unmap: joined to the segments it touches, as memory_viz does */
  for (size_t i = 0; i < nR; i++)
    ck_assert_msg(hi <= R[i].lo || R[i].hi <= lo, "re-mapped %#lx overlaps a segment", (unsigned long)lo);
  for (size_t i = 0; i < nR; i++)
    if (R[i].hi == lo || R[i].lo == hi) {
      lo = lo < R[i].lo ? lo : R[i].lo, hi = hi > R[i].hi ? hi : R[i].hi;
      R[i--] = R[--nR];
    }
  R[nR++] = (range){lo, hi};
}

static void seg_carve(uintptr_t lo, uintptr_t hi) { /* undo a map */
  int i = covered(lo, hi);
  ck_assert_msg(i >= 0, "segment_map %#lx +%lu in no segment", (unsigned long)lo, (unsigned long)(hi - lo));
  for (size_t k = 0; k < nB; k++)
    ck_assert_msg(B[k].hi <= lo || hi <= B[k].lo, "block %#lx still live in unmapped %#lx", (unsigned long)B[k].lo,
                  (unsigned long)lo);
  range r = R[i];
  R[i] = R[--nR];
  if (r.lo < lo) R[nR++] = (range){r.lo, lo};
  if (hi < r.hi) R[nR++] = (range){hi, r.hi};
}

static void replay(const snap *s) {
  size_t n = 0, cap = 1 << 16;
  gml_trace_entry *t = calloc(cap, sizeof *t);
  ck_assert_int_eq(gml_trace_read(C, t, cap, &n), 0);
  ck_assert_uint_lt(n, cap);
  while (n && t[n - 1].seq > s->seq) n--;
  R = calloc(s->nsegs + 2 * n + 1, sizeof *R);
  B = calloc(s->nblocks + n + 1, sizeof *B);
  nR = nB = 0;
  for (size_t i = 0; i < s->nsegs; i++) R[nR++] = (range){s->segs[i].addr, s->segs[i].addr + s->segs[i].size};
  for (size_t i = 0; i < s->nblocks; i++)
    if (s->blocks[i].state != GML_BLOCK_FREE)
      B[nB++] = (range){s->blocks[i].addr, s->blocks[i].addr + s->blocks[i].size};
  size_t maps = 0, unmaps = 0;
  for (size_t i = n; i-- > 0;) {
    gml_trace_entry *e = &t[i];
    uintptr_t lo = e->addr, hi = e->addr + e->size;
    switch (e->action) {
    case GML_TRACE_ALLOC:
      for (size_t k = 0; k < nB; k++)
        if (B[k].lo == lo) {
          B[k] = B[--nB];
          break;
        }
      break;
    case GML_TRACE_FREE_COMPLETED: /* the block comes back */
      ck_assert_msg(covered(lo, hi) >= 0, "event %zu: freed block %#lx in no segment", i, (unsigned long)lo);
      B[nB++] = (range){lo, hi};
      break;
    case GML_TRACE_SEGMENT_MAP:
      ck_assert(lo && e->size && e->size % C->alloc.cs == 0);
      seg_carve(lo, hi);
      maps++;
      break;
    case GML_TRACE_SEGMENT_UNMAP:
      ck_assert(lo && e->size && e->size % C->alloc.cs == 0);
      seg_add(lo, hi);
      unmaps++;
      break;
    default: break;
    }
  }
  ck_assert_uint_gt(maps, 0);
  ck_assert_uint_gt(unmaps, 0);
  free(R), free(B), free(t);
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

START_TEST(test_segments_replay) {
  ck_assert_int_eq(gml_trace_enable(C, 1 << 15), 0);
  void *live[64] = {0};
  size_t unmaps_seen = 0, free_listed = 0;
  for (int step = 0; step < 1500; step++) {
    int i = (int)(next() % 64);
    if (live[i]) {
      if (next() % 5 == 0) { /* a free that waits for another stream */
        gate_open = 0;
        ck_assert_int_eq(gml_record_stream(C, live[i], 7), 0);
      }
      ck_assert_int_eq(gml_free(C, live[i]), 0);
      live[i] = NULL;
    } else {
      size_t sz = next() % 3 ? 1 + next() % (900 * 1024) : 1 * MiB + next() % (5 * MiB);
      ck_assert_msg(gml_alloc(C, sz, next() % 2, &live[i]) == 0, "alloc %zu: %s", sz, gml_last_error(C));
    }
    if (step % 97 == 0) gate_open = 1;
    if (step % 211 == 0) ck_assert_int_eq(gml_trim(C, NULL), 0);
    if (step % 50 == 0) {
      snap s = take();
      free_listed += check_segments(&s);
      free(s.segs), free(s.blocks);
    }
    unmaps_seen = C->alloc.unmaps;
  }
  ck_assert_uint_gt(unmaps_seen, 0);
  ck_assert_uint_gt(free_listed, 0);
  ck_assert_uint_gt(C->alloc.stitched, 0); /* chunks were mapped in several places */
  snap s = take();
  check_segments(&s);
  size_t pending = 0;
  for (size_t i = 0; i < s.nblocks; i++) pending += s.blocks[i].state == GML_BLOCK_PENDING_FREE;
  ck_assert_uint_gt(pending + C->ctr.ooms, 0); /* the gate held some frees back */
  replay(&s);
  free(s.segs), free(s.blocks);
  gate_open = 1;
  for (int i = 0; i < 64; i++)
    if (live[i]) ck_assert_int_eq(gml_free(C, live[i]), 0);
  ck_assert_int_eq(gml_trim(C, NULL), 0);
  s = take();
  check_segments(&s);
  ck_assert_uint_eq(s.nsegs, 0); /* everything went back: nothing shown */
  replay(&s);
  free(s.segs), free(s.blocks);
}
END_TEST

START_TEST(test_segments_small_caps) {
  void *p = NULL, *q = NULL;
  ck_assert_int_eq(gml_alloc(C, 3 * MiB, 0, &p), 0);
  ck_assert_int_eq(gml_alloc(C, 1000, 0, &q), 0);
  gml_segment_info g[1];
  gml_alloc_info b[1];
  size_t ns = 0, nb = 0;
  ck_assert_int_eq(gml_segments(C, g, 1, &ns, b, 1, &nb, NULL), 0);
  ck_assert_uint_eq(ns, 2);     /* the small region's, the large region's */
  ck_assert_uint_eq(nb, 2 + 2); /* each allocation and the free space after it */
  ck_assert_uint_eq(b[0].addr, (uintptr_t)q);
  ck_assert_uint_eq(g[0].nblocks, 2);
  ck_assert_int_eq(g[0].large, 0);
  ck_assert_int_eq(gml_segments(C, g, 1, NULL, b, 1, &nb, NULL), GML_EINVAL);
  gml_free(C, p), gml_free(C, q);
}
END_TEST

Suite *snapshot_suite(void) {
  Suite *s = suite_create("snapshot");
  TCase *tc = tcase_create("snapshot");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_segments_replay);
  tcase_add_test(tc, test_segments_small_caps);
  suite_add_tcase(s, tc);
  return s;
}
