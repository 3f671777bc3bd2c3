/* The copy engine (gml_copy*, client/copy.c) on an embedded host client,
 * under a backend whose copies are asynchronous for real: a copy is queued
 * and carried out only when an event recorded after it is waited for (or at
 * synchronize), so a slot of the staging pool reused before its copy was
 * waited for is caught (the bytes moved are the later ones). Counts every
 * driver call, and can fail the Nth copy. Directions, the pipeline over the
 * slots, packing of small pageable copies, batches and their fallback, a
 * copy failing half way, arguments. */
#include "client_priv.h"
#include "copy.h"
#include "paths.h"
#include "gmlake.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------- the deferred backend: one queue for every stream ---------- */
typedef struct qcopy {
  uintptr_t dst, src;
  size_t n;
} qcopy;
static struct {
  const struct gml_backend_ops *base;
  struct gml_backend_ops ops;
  qcopy *q;
  size_t nq, cap, done; /* queued, run */
  size_t copies, batches, batched, waits, max_copy;
  size_t fail_at; /* the copy_async call (1, 2, ...) that fails; 0: none */
} dq;

static void run_to(size_t pos) {
  for (; dq.done < pos && dq.done < dq.nq; dq.done++)
    memcpy((void *)dq.q[dq.done].dst, (void *)dq.q[dq.done].src, dq.q[dq.done].n);
}
static void enqueue(uintptr_t dst, uintptr_t src, size_t n) {
  if (dq.nq == dq.cap) {
    dq.cap = dq.cap * 2 + 64;
    dq.q = realloc(dq.q, dq.cap * sizeof *dq.q);
    ck_assert_ptr_nonnull(dq.q);
  }
  dq.q[dq.nq++] = (qcopy){dst, src, n};
  if (n > dq.max_copy) dq.max_copy = n;
}
static int d_copy_async(gml_backend *be, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) {
  (void)be, (void)stream;
  if (++dq.copies == dq.fail_at) return GML_EBACKEND;
  enqueue(dst, src, n);
  return 0;
}
static int d_copy_batch(gml_backend *be, uintptr_t *dst, uintptr_t *src, size_t *n, size_t count, uintptr_t stream) {
  (void)be, (void)stream;
  dq.batches++, dq.batched += count;
  for (size_t i = 0; i < count; i++) enqueue(dst[i], src[i], n[i]);
  return 0;
}
static int d_event_record(gml_backend *be, uintptr_t stream, uintptr_t *ev) {
  (void)be, (void)stream;
  *ev = dq.nq + 1; /* done once the queue has run to here */
  return 0;
}
static int d_event_done(gml_backend *be, uintptr_t ev) {
  (void)be;
  return dq.done >= ev - 1;
}
static int d_event_wait(gml_backend *be, uintptr_t ev) {
  (void)be;
  dq.waits++;
  run_to(ev - 1);
  return 0;
}
static void d_event_destroy(gml_backend *be, uintptr_t ev) { (void)be, (void)ev; }
static int d_synchronize(gml_backend *be) {
  (void)be;
  run_to(dq.nq);
  return 0;
}

static void counts_reset(void) { dq.copies = dq.batches = dq.batched = dq.waits = dq.max_copy = 0, dq.fail_at = 0; }

/* An embedded host client over the deferred backend, with a staging pool of `staging` and `threads` threads. */
static gml_client *open_deferred(const char *staging, const char *threads, int batch) {
  ck_assert_int_eq(gml_set_option("GMLAKE_COPY_STAGING", staging), 0);
  ck_assert_int_eq(gml_set_option("GMLAKE_COPY_THREADS", threads), 0);
  gml_client *c;
  gml_open_opts o = {.backend = "host", .mode = GML_MODE_EMBEDDED};
  ck_assert_int_eq(gml_open(&o, &c), 0);
  free(dq.q);
  memset(&dq, 0, sizeof dq);
  dq.base = c->be->ops;
  dq.ops = *c->be->ops;
  dq.ops.copy_async = d_copy_async, dq.ops.copy_batch = d_copy_batch, dq.ops.event_record = d_event_record;
  dq.ops.event_done = d_event_done, dq.ops.event_wait = d_event_wait, dq.ops.event_destroy = d_event_destroy;
  dq.ops.synchronize = d_synchronize;
  c->be->ops = &dq.ops;
  if (!batch) c->be->caps &= ~(unsigned)GML_BACKEND_COPY_BATCH;
  return c;
}

static void close_deferred(gml_client *c) {
  d_synchronize(c->be);
  gml_close(c);
  gml_set_option("GMLAKE_COPY_STAGING", NULL);
  gml_set_option("GMLAKE_COPY_THREADS", NULL);
}

/* Every byte a function of its offset, with no period a slot could alias (i * k >> 7 had one of 32 KiB). */
static unsigned char byte_at(size_t i, uint64_t seed) {
  uint64_t x = i + seed * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
  return (unsigned char)(x ^ (x >> 29));
}
static void fill(void *p, size_t n, uint64_t seed) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; i++) b[i] = byte_at(i, seed);
}
static size_t first_diff(const void *p, size_t n, uint64_t seed) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != byte_at(i, seed)) return i;
  return n;
}

/* The first byte of [from, to) that is not 0x5a (to: none): a per-byte ck_assert writes to check's pipe each time. */
static size_t untouched(const char *p, size_t from, size_t to) {
  for (size_t i = from; i < to; i++)
    if ((unsigned char)p[i] != 0x5a) return i;
  return to;
}

#define MIB (1u << 20)

/* Pageable host memory to the device and back, every size around a slot (16 MiB pool: 4 MiB slots),
 * with and without threads: pipelined over the slots, bytes intact, one driver copy per slot at most. */
START_TEST(test_copy_pageable_round_trip) {
  const char *threads[] = {"0", "3"};
  size_t sizes[] = {1, 4093, 4 * MIB - 1, 4 * MIB, 4 * MIB + 1, 14 * MIB + 12345, 41 * MIB};
  for (int t = 0; t < 2; t++) {
    gml_client *c = open_deferred("16MiB", threads[t], 1);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      size_t n = sizes[i];
      char *h = malloc(n), *back = malloc(n);
      void *d, *d2;
      ck_assert_int_eq(gml_alloc(c, n, 0, &d), 0);
      ck_assert_int_eq(gml_alloc(c, n, 0, &d2), 0);
      fill(h, n, i + 1);
      memset(back, 0, n);
      counts_reset();
      ck_assert_int_eq(gml_copy_async(c, d, h, n, GML_COPY_H2D, 5), 0);
      memset(h, 0xee, n); /* a pageable source is read before return: its later bytes are not copied */
      ck_assert_int_eq(gml_copy_async(c, d2, d, n, GML_COPY_D2D, 5), 0);
      ck_assert_int_eq(gml_copy(c, back, d2, n, GML_COPY_D2H), 0);
      ck_assert_msg(first_diff(back, n, i + 1) == n, "%zu bytes, %s threads: differ at byte %zu", n, threads[t],
                    first_diff(back, n, i + 1));
      size_t pieces = (n + 4 * MIB - 1) / (4 * MIB);
      if (n > 4 * MIB) ck_assert_uint_eq(dq.copies, 2 * pieces + 1); /* H2D and D2H by slots, D2D whole */
      ck_assert_uint_eq(dq.max_copy, n);                             /* the D2D copy: whole */
      gml_free(c, d), gml_free(c, d2);
      free(h), free(back);
    }
    gml_copy_info info;
    ck_assert_int_eq(gml_copy_info_get(c, &info), 0);
    ck_assert_uint_eq(info.staging_bytes, 16 * MIB);
    ck_assert_uint_eq(info.slots, 4);
    ck_assert_uint_eq(info.threads, (uint32_t)atoi(threads[t]));
    ck_assert_uint_gt(info.bytes_staged, 2 * 41 * MIB);
    close_deferred(c);
  }
}
END_TEST

/* Page-locked host memory (the backend's host_alloc) is copied straight, whole, and stream-ordered:
 * nothing is moved until the stream gets there. */
START_TEST(test_copy_pinned_is_direct) {
  gml_client *c = open_deferred("16MiB", "2", 1);
  size_t n = 30 * MIB;
  void *h, *back, *d;
  ck_assert_int_eq(dq.base->host_alloc(c->be, n, &h), 0);
  ck_assert_int_eq(dq.base->host_alloc(c->be, n, &back), 0);
  ck_assert_int_eq(gml_alloc(c, n, 0, &d), 0);
  fill(h, n, 9);
  memset(back, 0, n);
  counts_reset();
  ck_assert_int_eq(gml_copy_async(c, d, h, n, GML_COPY_H2D, 3), 0);
  ck_assert_int_eq(gml_copy_async(c, back, d, n, GML_COPY_D2H, 3), 0);
  ck_assert_uint_eq(dq.copies, 2);
  ck_assert_uint_eq(dq.max_copy, n);
  ck_assert_uint_eq(first_diff(back, n, 9), 0); /* async: not there yet */
  d_synchronize(c->be);
  ck_assert_uint_eq(first_diff(back, n, 9), n);
  gml_copy_info info;
  ck_assert_int_eq(gml_copy_info_get(c, &info), 0);
  ck_assert_uint_eq(info.bytes_direct, 2 * n);
  ck_assert_uint_eq(info.bytes_staged, 0);
  ck_assert_uint_eq(info.staging_bytes, 0); /* never needed, never taken */
  gml_free(c, d);
  dq.base->host_free(c->be, h), dq.base->host_free(c->be, back);
  close_deferred(c);
}
END_TEST

/* Many small copies: with the driver's batch, one call (page-locked ones as they are, pageable ones packed
 * into slots); without it, or on stream 0, one by one. Bytes intact either way. */
START_TEST(test_copy_batch_and_fallback) {
  enum { N = 200, SZ = 3000 };
  for (int mode = 0; mode < 3; mode++) { /* 0: batch, stream 7; 1: no batch; 2: batch but stream 0 */
    gml_client *c = open_deferred("1MiB", "1", mode != 1);
    uintptr_t stream = mode == 2 ? 0 : 7;
    void *pinned, *dev;
    char *pageable = malloc(N * SZ), *back = malloc(N * SZ);
    ck_assert_int_eq(dq.base->host_alloc(c->be, N * SZ, &pinned), 0);
    ck_assert_int_eq(gml_alloc(c, 2 * N * SZ, 0, &dev), 0);
    fill(pinned, N * SZ, 1);
    fill(pageable, N * SZ, 2);
    gml_copy_desc v[2 * N];
    for (int i = 0; i < N; i++) {
      v[i] = (gml_copy_desc){(char *)dev + i * SZ, (char *)pinned + i * SZ, SZ, GML_COPY_H2D};
      v[N + i] = (gml_copy_desc){(char *)dev + (N + i) * SZ, pageable + i * SZ, SZ, GML_COPY_H2D};
    }
    counts_reset();
    ck_assert_int_eq(gml_copy_batch_async(c, v, 2 * N, stream), 0);
    /* 1 MiB pool: 256 KiB slots, 87 copies of 3000 bytes (256-aligned: 3072) a slot: 3 packs */
    if (mode == 0) {
      ck_assert_uint_eq(dq.copies, 0);
      ck_assert_uint_eq(dq.batches, 1 + 3);
      ck_assert_uint_eq(dq.batched, 2 * N);
    } else {
      ck_assert_uint_eq(dq.batches, 0);
      ck_assert_uint_eq(dq.copies, 2 * N);
    }
    /* and back, pageable, packed: D2H packs are waited for and copied out */
    for (int i = 0; i < 2 * N; i++) v[i] = (gml_copy_desc){back + (i % N) * SZ, (char *)dev + i * SZ, SZ, GML_COPY_D2H};
    ck_assert_int_eq(gml_copy_batch_async(c, v + N, N, stream), 0);
    ck_assert_uint_eq(first_diff(back, N * SZ, 2), N * SZ);
    ck_assert_int_eq(gml_copy_batch_async(c, v, N, stream), 0);
    ck_assert_uint_eq(first_diff(back, N * SZ, 1), N * SZ);
    gml_copy_info info;
    ck_assert_int_eq(gml_copy_info_get(c, &info), 0);
    ck_assert_int_eq(info.batch, mode != 1);
    ck_assert_uint_eq(info.bytes_staged, 3 * N * SZ);
    ck_assert_uint_eq(info.bytes_direct, N * SZ);
    gml_free(c, dev);
    dq.base->host_free(c->be, pinned);
    free(pageable), free(back);
    close_deferred(c);
  }
}
END_TEST

/* A copy failing half way: the error, the offset reached named, the destination's bytes from there
 * untouched; the engine works after it (no slot left waiting on a copy that never ran). */
START_TEST(test_copy_fails_half_way) {
  gml_client *c = open_deferred("4MiB", "2", 1);
  size_t n = 10 * MIB; /* 1 MiB slots: 10 pieces */
  char *h = malloc(n), *back = malloc(n);
  void *d;
  ck_assert_int_eq(gml_alloc(c, n, 0, &d), 0);
  fill(h, n, 3);
  ck_assert_int_eq(gml_copy(c, d, h, n, GML_COPY_H2D), 0);
  memset(back, 0x5a, n);
  counts_reset();
  dq.fail_at = 7; /* D2H: pieces 0-3 in flight, 0-2 emptied as 4-6 go; the 7th copy (piece 6) fails */
  ck_assert_int_eq(gml_copy(c, back, d, n, GML_COPY_D2H), GML_EBACKEND);
  const char *e = gml_last_error(c);
  ck_assert_msg(strstr(e, "copy 0 of 1 (10.00 MiB, device to host) failed at byte 3145728") &&
                    strstr(e, "not written from there"),
                "%s", e);
  ck_assert_uint_eq(first_diff(back, 3 * MIB, 3), 3 * MIB); /* what it says was written, was */
  ck_assert_uint_eq(untouched(back, 3 * MIB, n), n);
  /* three copies in one call, each 2.5 pieces: one run of 9 pieces; the 8th driver copy (the second copy's
   * third piece... its second: pieces 0-2 are the first copy's) fails with pieces 0-3 emptied */
  char *outs = malloc(3 * (5 * MIB / 2));
  memset(outs, 0x5a, 3 * (5 * MIB / 2));
  gml_copy_desc three[3];
  for (int i = 0; i < 3; i++)
    three[i] = (gml_copy_desc){outs + i * (5 * MIB / 2), (char *)d + i * (5 * MIB / 2), 5 * MIB / 2, GML_COPY_D2H};
  counts_reset();
  dq.fail_at = 8;
  ck_assert_int_eq(gml_copy_batch_async(c, three, 3, 0), GML_EBACKEND);
  e = gml_last_error(c);
  ck_assert_msg(strstr(e, "copy 1 of 3 (2.50 MiB, device to host) failed or was not done at byte 1048576"), "%s", e);
  ck_assert_uint_eq(first_diff(outs, 5 * MIB / 2 + MIB, 3), 5 * MIB / 2 + MIB); /* copy 0, and copy 1's first MiB */
  ck_assert_uint_eq(untouched(outs, 5 * MIB / 2 + MIB, 3 * (5 * MIB / 2)), 3 * (5 * MIB / 2));
  free(outs);
  /* H2D failing: the error too; then a whole copy goes through */
  counts_reset();
  dq.fail_at = 4;
  ck_assert_int_eq(gml_copy(c, d, h, n, GML_COPY_H2D), GML_EBACKEND);
  ck_assert_ptr_nonnull(strstr(gml_last_error(c), "failed at byte 3145728"));
  counts_reset();
  memset(back, 0, n);
  ck_assert_int_eq(gml_copy(c, d, h, n, GML_COPY_H2D), 0);
  ck_assert_int_eq(gml_copy(c, back, d, n, GML_COPY_D2H), 0);
  ck_assert_uint_eq(first_diff(back, n, 3), n);
  gml_free(c, d);
  free(h), free(back);
  close_deferred(c);
}
END_TEST

START_TEST(test_copy_arguments) {
  gml_client *c = open_deferred("4MiB", "0", 1);
  char h[64];
  void *d;
  ck_assert_int_eq(gml_alloc(c, 64, 0, &d), 0);
  ck_assert_int_eq(gml_copy(c, d, h, 64, 0), GML_EINVAL);
  ck_assert_ptr_nonnull(strstr(gml_last_error(c), "kind 0"));
  ck_assert_int_eq(gml_copy(c, NULL, h, 64, GML_COPY_H2D), GML_EINVAL);
  ck_assert_int_eq(gml_copy_async(c, d, NULL, 64, GML_COPY_H2D, 0), GML_EINVAL);
  ck_assert_int_eq(gml_copy(c, NULL, NULL, 0, GML_COPY_H2D), 0);
  ck_assert_int_eq(gml_copy_batch_async(c, NULL, 3, 0), GML_EINVAL);
  ck_assert_int_eq(gml_copy_batch_async(c, NULL, 0, 0), 0);
  gml_copy_desc v[2] = {{d, h, 64, GML_COPY_H2D}, {h, d, 64, 9}};
  ck_assert_int_eq(gml_copy_batch_async(c, v, 2, 0), GML_EINVAL);
  ck_assert_ptr_nonnull(strstr(gml_last_error(c), "copy 1: kind 9"));
  ck_assert_int_eq(gml_copy(NULL, d, h, 64, GML_COPY_H2D), GML_EINVAL);
  gml_free(c, d);
  close_deferred(c);
}
END_TEST

/* gml_pause / gml_resume move the content through the engine, every block in one call, waited for before
 * the chunks go (the deferred backend runs a copy only when waited for: a pause that let the chunks go
 * first would save nothing, or fault): pageable host memory through the staging pool, or page-locked
 * memory kept after resume and taken again by the next pause. */
START_TEST(test_pause_through_engine) {
  const char *how[] = {"pageable", "pinned"};
  size_t sizes[] = {3 * MIB, 5000, 10 * MIB + 7, MIB, 17 * MIB};
  enum { NB = sizeof sizes / sizeof *sizes };
  for (int h = 0; h < 2; h++) {
    ck_assert_int_eq(gml_set_option("GMLAKE_PAUSE_HOST", how[h]), 0);
    gml_client *c = open_deferred("8MiB", "2", 1);
    void *p[NB];
    for (int i = 0; i < NB; i++) {
      ck_assert_int_eq(gml_alloc(c, sizes[i], 0, &p[i]), 0);
      fill(p[i], sizes[i], 20 + i);
    }
    void *kept = NULL;
    for (int round = 0; round < 2; round++) {
      gml_copy_info before, after;
      ck_assert_int_eq(gml_copy_info_get(c, &before), 0);
      ck_assert_int_eq(gml_pause(c, 0, 0), 0);
      ck_assert_ptr_null(c->pause_kept); /* pinned: the kept memory is in use (taken again in round 1) */
      ck_assert_int_eq(gml_resume(c), 0);
      ck_assert_int_eq(gml_copy_info_get(c, &after), 0);
      for (int i = 0; i < NB; i++)
        ck_assert_msg(first_diff(p[i], sizes[i], 20 + i) == sizes[i], "%s round %d: block %d differs at %zu", how[h],
                      round, i, first_diff(p[i], sizes[i], 20 + i));
      uint64_t staged = after.bytes_staged - before.bytes_staged, direct = after.bytes_direct - before.bytes_direct;
      uint64_t total = 0;
      for (int i = 0; i < NB; i++) total += sizes[i];
      ck_assert_uint_ge(h ? direct : staged, 2 * total); /* out and back, every byte */
      ck_assert_uint_eq(h ? staged : direct, 0);
      if (h && round == 0) kept = c->pause_kept;
      if (h) ck_assert_ptr_eq(c->pause_kept, kept);
      if (!h) ck_assert_ptr_null(c->pause_kept);
      ck_assert_ptr_nonnull(h ? kept : (void *)1);
    }
    for (int i = 0; i < NB; i++) gml_free(c, p[i]);
    close_deferred(c);
    gml_set_option("GMLAKE_PAUSE_HOST", NULL);
  }
}
END_TEST

/* GMLAKE_COPY_STAGING=0: no pool, pageable memory handed to the driver as it is (its own staging); a bad
 * value warns and keeps the default. */
START_TEST(test_copy_without_staging) {
  gml_client *c = open_deferred("0", "2", 1);
  size_t n = 9 * MIB;
  char *h = malloc(n), *back = malloc(n);
  void *d;
  ck_assert_int_eq(gml_alloc(c, n, 0, &d), 0);
  fill(h, n, 4);
  counts_reset();
  ck_assert_int_eq(gml_copy(c, d, h, n, GML_COPY_H2D), 0);
  ck_assert_int_eq(gml_copy(c, back, d, n, GML_COPY_D2H), 0);
  ck_assert_uint_eq(first_diff(back, n, 4), n);
  ck_assert_uint_eq(dq.copies, 2);
  gml_copy_info info;
  ck_assert_int_eq(gml_copy_info_get(c, &info), 0);
  ck_assert_uint_eq(info.staging_bytes, 0);
  ck_assert_uint_eq(info.bytes_direct, 2 * n);
  ck_assert_uint_eq(info.bytes_staged, 0);
  gml_free(c, d);
  close_deferred(c);
  c = open_deferred("lots", "2", 1);
  ck_assert_int_eq(gml_alloc(c, n, 0, &d), 0);
  ck_assert_int_eq(gml_copy(c, d, h, n, GML_COPY_H2D), 0);
  ck_assert_int_eq(gml_copy_info_get(c, &info), 0);
  ck_assert_uint_eq(info.staging_bytes, 256 * MIB);
  ck_assert_uint_eq(info.bytes_staged, n);
  gml_free(c, d);
  close_deferred(c);
  free(h), free(back);
}
END_TEST

/* ---------- multi-path policy (paths.c) against modelled topologies ----------
 * Path i crosses its own link (alone GB/s) and, where sw[i] >= 0, switch sw[i] (its capacity). A copy
 * split over a set takes as long as its busiest resource: GB/s = 1 / max(sum of shares over it / capacity). */
typedef struct topo {
  double alone[GMLI_PATHS_MAX];
  int sw[GMLI_PATHS_MAX];
  double sw_cap[4];
  int fails[GMLI_PATHS_MAX];
  int calls;
} topo;
static double model(const int *set, const double *share, int count, void *ctx) {
  topo *t = ctx;
  double worst = 0, sw[4] = {0};
  t->calls++;
  for (int i = 0; i < count; i++) {
    int p = set[i];
    if (t->fails[p]) return -1;
    if (share[i] / t->alone[p] > worst) worst = share[i] / t->alone[p];
    if (t->sw[p] >= 0) sw[t->sw[p]] += share[i];
  }
  for (int s = 0; s < 4; s++)
    if (sw[s] / t->sw_cap[s] > worst) worst = sw[s] / t->sw_cap[s];
  return 1 / worst;
}

START_TEST(test_paths_probe) {
  gmli_path_plan p;
  /* two independent links: both, halves, twice one */
  topo two = {.alone = {50, 50}, .sw = {-1, -1}};
  ck_assert_int_eq(gmli_paths_probe(2, model, &two, 0.1, &p), 0);
  ck_assert_int_eq(p.n, 2);
  ck_assert(p.path[0] == 0 && p.path[1] == 1);
  ck_assert(p.share[0] > 0.499 && p.share[0] < 0.501 && p.together > 99.9 && p.together < 100.1);
  /* the peer behind GPU 0's switch (52 GB/s for both): 4% more, not 10%: dropped */
  topo shared = {.alone = {50, 50}, .sw = {0, 0}, .sw_cap = {52}};
  ck_assert_int_eq(gmli_paths_probe(2, model, &shared, 0.1, &p), 0);
  ck_assert_int_eq(p.n, 1);
  ck_assert(p.share[0] == 1 && p.together == 50);
  /* four: 1 independent, 2 behind 1's switch (one link's worth for both), 3 failing: 0 and 1 kept, the
   * faster of 1 and 2 tried first (2 is, alone), so 1 is the one dropped */
  topo four = {.alone = {50, 45, 48, 50}, .sw = {-1, 1, 1, -1}, .sw_cap = {0, 48}, .fails = {0, 0, 0, 1}};
  ck_assert_int_eq(gmli_paths_probe(4, model, &four, 0.1, &p), 0);
  ck_assert_int_eq(p.n, 2);
  ck_assert(p.path[0] == 0 && p.path[1] == 2);
  ck_assert(p.alone[3] < 0);
  ck_assert(p.together > 97.9 && p.together < 98.1);
  ck_assert(p.share[0] > 0.5 && p.share[0] + p.share[1] > 0.999 && p.share[0] + p.share[1] < 1.001);
  ck_assert_int_eq(four.calls, 4 + 2); /* each alone, then 2 and 1 added in turn; 3 never with the others */
  /* GPU 0's own link failing: an error, the plan its link alone; arguments */
  topo bad = {.alone = {50, 50}, .sw = {-1, -1}, .fails = {1, 0}};
  ck_assert_int_eq(gmli_paths_probe(2, model, &bad, 0.1, &p), GML_EBACKEND);
  ck_assert(p.n == 1 && p.path[0] == 0 && p.share[0] == 1);
  ck_assert_int_eq(gmli_paths_probe(0, model, &two, 0.1, &p), GML_EINVAL);
  ck_assert_int_eq(gmli_paths_probe(GMLI_PATHS_MAX + 1, model, &two, 0.1, &p), GML_EINVAL);
}
END_TEST

/* ---------- multi-path (mpath.c) over a backend of streams that run apart ----------
 * Each stream is its own queue of copies and waits; an event is a stream's position. Nothing runs
 * until waited for: an event_wait runs its stream to the event (and, for a wait on the way, the
 * other stream to that event); synchronize runs every stream to its end, one after another, in the
 * order made or the reverse (ms.reverse), so a missing wait between two streams shows in one of the
 * orders as wrong bytes. Copies into and out of a peer's staging keep each slot's state: a slot
 * filled again before its bytes were taken out is counted (ms.overwrites). */
typedef struct mop {
  int is_wait;
  uintptr_t ev, dst, src;
  size_t n;
} mop;
typedef struct mstream {
  uintptr_t id;
  mop *ops;
  size_t n, cap, ran;
} mstream;
typedef struct mstaging {
  uintptr_t base;
  size_t size;
  int full[GMLI_PEER_SLOTS];
} mstaging;
static struct {
  const struct gml_backend_ops *base;
  struct gml_backend_ops ops;
  mstream st[32];
  int nst;
  struct {
    int st;
    size_t pos;
  } * ev;
  size_t nev, cap_ev;
  mstaging stg[8];
  int nstg;
  int reverse, ndev, no_access;
  int refuse_waits; /* a peer's stream cannot wait for the caller's (a stream being captured) */
  size_t slot;      /* the staging's slot size (the engine's) */
  size_t own_copies, peer_copies, overwrites; /* copy_async calls, peer_copy_async calls */
  size_t fail_own_at, fail_peer_at;           /* the Nth of each fails (0: none) */
} ms;

static mstream *ms_stream(uintptr_t id) {
  for (int i = 0; i < ms.nst; i++)
    if (ms.st[i].id == id) return &ms.st[i];
  ck_assert_int_lt(ms.nst, 32);
  ms.st[ms.nst] = (mstream){.id = id};
  return &ms.st[ms.nst++];
}
static void ms_push(uintptr_t stream, mop op) {
  mstream *s = ms_stream(stream);
  if (s->n == s->cap) {
    s->cap = s->cap * 2 + 64;
    s->ops = realloc(s->ops, s->cap * sizeof *s->ops);
    ck_assert_ptr_nonnull(s->ops);
  }
  s->ops[s->n++] = op;
}
static void ms_slot_note(uintptr_t dst, uintptr_t src) {
  for (int i = 0; i < ms.nstg; i++) {
    mstaging *g = &ms.stg[i];
    if (dst >= g->base && dst < g->base + g->size) {
      int s = (int)((dst - g->base) / ms.slot);
      if (g->full[s]) ms.overwrites++;
      g->full[s] = 1;
    }
    if (src >= g->base && src < g->base + g->size) g->full[(src - g->base) / ms.slot] = 0;
  }
}
static void ms_run_event(uintptr_t ev);
static void ms_run(mstream *s, size_t pos) {
  while (s->ran < pos && s->ran < s->n) {
    mop op = s->ops[s->ran];
    if (op.is_wait) ms_run_event(op.ev);
    else ms_slot_note(op.dst, op.src), memmove((void *)op.dst, (void *)op.src, op.n);
    s->ran++;
  }
}
static void ms_run_event(uintptr_t ev) { ms_run(&ms.st[ms.ev[ev - 1].st], ms.ev[ev - 1].pos); }
static int ms_record(uintptr_t stream, uintptr_t *ev) {
  mstream *s = ms_stream(stream);
  if (ms.nev == ms.cap_ev) {
    ms.cap_ev = ms.cap_ev * 2 + 64;
    ms.ev = realloc(ms.ev, ms.cap_ev * sizeof *ms.ev);
    ck_assert_ptr_nonnull(ms.ev);
  }
  ms.ev[ms.nev].st = (int)(s - ms.st), ms.ev[ms.nev].pos = s->n;
  *ev = ++ms.nev;
  return 0;
}
static int m_event_record(gml_backend *be, uintptr_t stream, uintptr_t *ev) { return (void)be, ms_record(stream, ev); }
static int m_peer_event_record(gml_backend *be, int peer, uintptr_t stream, uintptr_t *ev) {
  return (void)be, (void)peer, ms_record(stream, ev);
}
static int m_event_done(gml_backend *be, uintptr_t ev) {
  (void)be;
  return ms.st[ms.ev[ev - 1].st].ran >= ms.ev[ev - 1].pos;
}
static int m_event_wait(gml_backend *be, uintptr_t ev) {
  (void)be;
  ms_run_event(ev);
  return 0;
}
static int m_stream_wait_event(gml_backend *be, uintptr_t stream, uintptr_t ev) {
  (void)be;
  if (ms.refuse_waits && stream >> 40) return GML_EBACKEND; /* a peer's stream (the host's numbers) */
  ms_push(stream, (mop){.is_wait = 1, .ev = ev});
  return 0;
}
static int m_copy_async(gml_backend *be, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) {
  (void)be;
  if (++ms.own_copies == ms.fail_own_at) return GML_EBACKEND;
  ms_push(stream, (mop){.dst = dst, .src = src, .n = n});
  return 0;
}
static int m_copy_batch(gml_backend *be, uintptr_t *dst, uintptr_t *src, size_t *n, size_t count, uintptr_t stream) {
  for (size_t i = 0; i < count; i++) ms_push(stream, (mop){.dst = dst[i], .src = src[i], .n = n[i]});
  return (void)be, 0;
}
static int m_peer_copy_async(gml_backend *be, int peer, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) {
  (void)be, (void)peer;
  if (++ms.peer_copies == ms.fail_peer_at) return GML_EBACKEND;
  ms_push(stream, (mop){.dst = dst, .src = src, .n = n});
  return 0;
}
static int m_synchronize(gml_backend *be) {
  (void)be;
  for (int i = 0; i < ms.nst; i++) {
    mstream *s = &ms.st[ms.reverse ? ms.nst - 1 - i : i];
    ms_run(s, s->n);
  }
  return 0;
}
static void m_event_destroy(gml_backend *be, uintptr_t ev) { (void)be, (void)ev; }
static int m_peer_count(gml_backend *be) { return (void)be, ms.ndev; }
static int m_peer_access(gml_backend *be, int peer) { return (void)be, peer < ms.ndev && !(ms.no_access >> peer & 1); }
static int m_peer_alloc(gml_backend *be, int peer, size_t size, uintptr_t *va) {
  int rc = ms.base->peer_alloc(be, 0, size, va); /* the host's plain memory, whatever the device */
  if (!rc && peer != be->device) ms.stg[ms.nstg++] = (mstaging){.base = *va, .size = size};
  return rc;
}

/* A host client whose backend is the above, with ndev devices, multi-path from min bytes in slots of slot. */
static gml_client *open_streams(int ndev, size_t min, size_t slot) {
  gml_client *c;
  gml_open_opts o = {.backend = "host", .mode = GML_MODE_EMBEDDED};
  ck_assert_int_eq(gml_open(&o, &c), 0);
  for (int i = 0; i < ms.nst; i++) free(ms.st[i].ops);
  free(ms.ev);
  memset(&ms, 0, sizeof ms);
  ms.base = c->be->ops, ms.ops = *c->be->ops, ms.ndev = ndev, ms.slot = slot;
  ms.ops.copy_async = m_copy_async, ms.ops.copy_batch = m_copy_batch, ms.ops.event_record = m_event_record;
  ms.ops.event_done = m_event_done, ms.ops.event_wait = m_event_wait, ms.ops.event_destroy = m_event_destroy;
  ms.ops.stream_wait_event = m_stream_wait_event, ms.ops.synchronize = m_synchronize;
  ms.ops.peer_copy_async = m_peer_copy_async, ms.ops.peer_event_record = m_peer_event_record;
  ms.ops.peer_count = m_peer_count, ms.ops.peer_access = m_peer_access, ms.ops.peer_alloc = m_peer_alloc;
  c->be->ops = &ms.ops;
  gmli_copier *k = gmli_copier_get(c);
  k->mp.min_bytes = min, k->mp.slot_size = slot, k->mp.probe_bytes = 4 * MIB;
  return c;
}
static void close_streams(gml_client *c) {
  m_synchronize(c->be);
  gml_close(c);
}

/* Pinned host memory of n bytes (the engine copies it straight: multi-path's kind). */
static void *pinned_alloc(gml_client *c, size_t n) {
  void *p;
  ck_assert_int_eq(ms.base->host_alloc(c->be, n, &p), 0);
  return p;
}

/* Split over the own link and two peers (model: 50, 25, 25 GB/s, independent): bytes intact both ways,
 * every size around the slots, under both orders of running the streams; asynchronous (nothing moved at
 * return), joined to the caller's stream (gml_copy returns with every path's part there), after the
 * caller's stream's earlier work (the peers wait for it). */
START_TEST(test_mpath_split) {
  topo t = {.alone = {50, 25, 25}, .sw = {-1, -1, -1}};
  size_t sizes[] = {4 * MIB, 37 * MIB + 12345, 64 * MIB};
  for (int rev = 0; rev < 2; rev++) {
    gml_client *c = open_streams(3, 4 * MIB, MIB);
    gmli_copier *k = gmli_copier_get(c);
    k->mp.measure = model, k->mp.measure_ctx = &t;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      size_t n = sizes[i];
      char *h = pinned_alloc(c, n), *back = pinned_alloc(c, n), *h0 = pinned_alloc(c, n);
      void *d;
      ck_assert_int_eq(gml_alloc(c, n, 0, &d), 0);
      fill(h0, n, 30 + i);
      memset(h, 0, n), memset(back, 0x5a, n);
      ms.reverse = rev;
      size_t peer0 = ms.peer_copies;
      /* h is written by the stream's earlier copy (one path: D2D): the split copy's paths start after it */
      ck_assert_int_eq(gml_copy_async(c, h, h0, n, GML_COPY_D2D, 5), 0);
      ck_assert_int_eq(gml_copy_async(c, d, h, n, GML_COPY_H2D, 5), 0);
      ck_assert_int_eq(gml_copy_async(c, back, d, n, GML_COPY_D2H, 5), 0);
      ck_assert_uint_gt(ms.peer_copies, peer0);
      ck_assert_uint_eq(untouched(back, 0, n), n); /* nothing ran yet */
      m_synchronize(c->be);
      ck_assert_msg(first_diff(back, n, 30 + i) == n, "%zu bytes, order %d: differ at %zu", n, rev,
                    first_diff(back, n, 30 + i));
      /* gml_copy: its own stream's event only, which the peers' ends are joined to */
      memset(back, 0x5a, n);
      ck_assert_int_eq(gml_copy(c, back, d, n, GML_COPY_D2H), 0);
      ck_assert_uint_eq(first_diff(back, n, 30 + i), n);
      ck_assert_uint_eq(ms.overwrites, 0);
      gml_free(c, d);
      ms.base->host_free(c->be, h), ms.base->host_free(c->be, back), ms.base->host_free(c->be, h0);
    }
    gml_copy_info info;
    ck_assert_int_eq(gml_copy_info_get(c, &info), 0);
    ck_assert_uint_eq(info.npaths, 3);
    ck_assert_uint_eq(info.paths_used, 3);
    ck_assert(info.paths[0].device == 0 && info.paths[1].device == 1 && info.paths[2].device == 2);
    ck_assert(info.paths[1].h2d_gbps == 25 && info.paths[0].d2h_gbps == 50 && info.h2d_gbps > 99.9);
    ck_assert(info.paths[0].h2d_share > 0.49 && info.paths[0].h2d_share < 0.51);
    uint64_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) total += 3 * sizes[i]; /* H2D, D2H twice */
    ck_assert_uint_eq(info.bytes_split, total);
    ck_assert_uint_eq(info.paths[0].bytes + info.paths[1].bytes + info.paths[2].bytes, total);
    ck_assert(info.paths[1].bytes > total / 5 && info.paths[2].bytes > total / 5 && info.paths[0].bytes > total / 3);
    close_streams(c);
  }
}
END_TEST

/* The slots: a copy of 24 slices over a peer's four slots, each slot filled again only after its last
 * slice was taken out (the wait on its event), in either order of running the streams; every slice's
 * two hops, one driver copy each. */
START_TEST(test_mpath_pipeline) {
  topo t = {.alone = {50, 50}, .sw = {-1, -1}};
  for (int rev = 0; rev < 2; rev++) {
    gml_client *c = open_streams(2, MIB, MIB);
    gmli_copier *k = gmli_copier_get(c);
    k->mp.measure = model, k->mp.measure_ctx = &t;
    size_t n = 48 * MIB; /* halves: the peer's part 24 slices of 1 MiB */
    char *h = pinned_alloc(c, n), *back = pinned_alloc(c, n);
    void *d;
    ck_assert_int_eq(gml_alloc(c, n, 0, &d), 0);
    fill(h, n, 7);
    memset(back, 0, n);
    ms.reverse = rev;
    size_t peer0 = ms.peer_copies, own0 = ms.own_copies;
    ck_assert_int_eq(gml_copy_async(c, d, h, n, GML_COPY_H2D, 0), 0);
    ck_assert_uint_eq(ms.peer_copies - peer0, 2 * 24);
    ck_assert_uint_eq(ms.own_copies - own0, 1);
    ck_assert_int_eq(gml_copy_async(c, back, d, n, GML_COPY_D2H, 0), 0);
    m_synchronize(c->be);
    ck_assert_uint_eq(first_diff(back, n, 7), n);
    ck_assert_uint_eq(ms.overwrites, 0);
    gml_copy_info info;
    ck_assert_int_eq(gml_copy_info_get(c, &info), 0);
    ck_assert_uint_eq(info.paths[1].bytes, n); /* half of each direction */
    gml_free(c, d);
    ms.base->host_free(c->be, h), ms.base->host_free(c->be, back);
    close_streams(c);
  }
}
END_TEST

/* A peer path failing mid-copy: the copy completes (its part from the slice that failed over the own
 * link), bytes intact, the path dropped for later copies. The own link failing: the copy fails, naming
 * it, nothing written. The own link failing while redoing a failed path's part: the copy fails naming
 * both, the bytes before the offset it names written, none after. */
START_TEST(test_mpath_path_fails) {
  topo t = {.alone = {50, 50, 50}, .sw = {-1, -1, -1}};
  gml_client *c = open_streams(3, MIB, MIB);
  gmli_copier *k = gmli_copier_get(c);
  k->mp.measure = model, k->mp.measure_ctx = &t;
  size_t n = 30 * MIB; /* thirds: 10 slices a peer */
  char *h = pinned_alloc(c, n), *back = pinned_alloc(c, n);
  void *d;
  ck_assert_int_eq(gml_alloc(c, n, 0, &d), 0);
  fill(h, n, 11);
  /* the peers' streams refusing to wait for the caller's (cuda: a stream being captured): one path, no
   * path dropped */
  ms.refuse_waits = 1;
  size_t pc = ms.peer_copies;
  memset(back, 0, n);
  ck_assert_int_eq(gml_copy(c, d, h, n, GML_COPY_H2D), 0);
  ck_assert_int_eq(gml_copy(c, back, d, n, GML_COPY_D2H), 0);
  ck_assert_uint_eq(first_diff(back, n, 11), n);
  ck_assert_uint_eq(ms.peer_copies, pc);
  ms.refuse_waits = 0;
  ms.fail_peer_at = 7; /* peer GPU 1's 4th slice, first hop */
  ck_assert_int_eq(gml_copy(c, d, h, n, GML_COPY_H2D), 0);
  ms.fail_peer_at = 0;
  memset(back, 0, n);
  ck_assert_int_eq(gml_copy(c, back, d, n, GML_COPY_D2H), 0);
  ck_assert_uint_eq(first_diff(back, n, 11), n);
  gml_copy_info info;
  ck_assert_int_eq(gml_copy_info_get(c, &info), 0);
  ck_assert(info.paths[1].failed && !info.paths[1].used && !info.paths[2].failed && info.paths[2].used);
  ck_assert_uint_eq(info.paths_used, 2);
  ck_assert(info.paths[1].h2d_share == 0 && info.paths[2].h2d_share == 0.5);
  ck_assert_uint_eq(info.paths[1].bytes, 3 * MIB); /* three slices went over it */
  size_t p0 = ms.peer_copies;
  ck_assert_int_eq(gml_copy(c, d, h, n, GML_COPY_H2D), 0); /* now halves: 15 slices over GPU 2 */
  ck_assert_uint_eq(ms.peer_copies - p0, 2 * 15);
  /* the own link failing: first issued, so nothing of the copy was */
  memset(back, 0x5a, n);
  ms.fail_own_at = ms.own_copies + 1;
  ck_assert_int_eq(gml_copy(c, back, d, n, GML_COPY_D2H), GML_EBACKEND);
  const char *e = gml_last_error(c);
  ck_assert_msg(strstr(e, "failed at byte 0 on GPU 0's own link"), "%s", e);
  m_synchronize(c->be);
  ck_assert_uint_eq(untouched(back, 0, n), n);
  /* GPU 2's path fails at its 3rd slice, then the own link redoing it */
  ms.fail_peer_at = ms.peer_copies + 5, ms.fail_own_at = ms.own_copies + 2;
  ck_assert_int_eq(gml_copy(c, back, d, n, GML_COPY_D2H), GML_EBACKEND);
  e = gml_last_error(c);
  ck_assert_msg(strstr(e, "failed at byte 17825792 on GPU 0's own link, redoing the part of the path over GPU 2"), "%s",
                e);
  m_synchronize(c->be);
  ck_assert_uint_eq(first_diff(back, 17 * MIB, 11), 17 * MIB);
  ck_assert_uint_eq(untouched(back, 17 * MIB, n), n);
  ms.fail_peer_at = ms.fail_own_at = 0;
  ck_assert_int_eq(gml_copy_info_get(c, &info), 0);
  ck_assert_uint_eq(info.paths_used, 1); /* both peers dropped: the own link alone */
  ck_assert_int_eq(gml_copy(c, back, d, n, GML_COPY_D2H), 0);
  ck_assert_uint_eq(first_diff(back, n, 11), n);
  gml_free(c, d);
  ms.base->host_free(c->be, h), ms.base->host_free(c->be, back);
  close_streams(c);
}
END_TEST

/* One path: GMLAKE_COPY_PATHS=1; no peer with P2P access; peers behind the own link's switch (no gain);
 * copies too small, pageable or device to device. The host backend's own probe (no model given): its
 * links modelled independent, 1 GB/s each, both kept. The timed probe (a backend whose copies take the
 * link's time) on the host's memmove: every path measured. */
START_TEST(test_mpath_single_path) {
  size_t n = 8 * MIB;
  for (int mode = 0; mode < 5; mode++) {
    topo shared = {.alone = {50, 50}, .sw = {0, 0}, .sw_cap = {52}};
    ck_assert_int_eq(gml_set_option("GMLAKE_COPY_PATHS", mode == 0 ? "1" : NULL), 0);
    gml_client *c = open_streams(2, MIB, MIB);
    gmli_copier *k = gmli_copier_get(c);
    if (mode == 1) ms.no_access = 2;
    if (mode == 2) k->mp.measure = model, k->mp.measure_ctx = &shared;
    if (mode == 4) c->be->caps |= GML_BACKEND_COPY_TIMING; /* cuda's probe: copies timed (memmove here) */
    char *h = pinned_alloc(c, n), *back = pinned_alloc(c, n), *pg = malloc(n);
    void *d;
    ck_assert_int_eq(gml_alloc(c, n, 0, &d), 0);
    fill(h, n, 5);
    ck_assert_int_eq(gml_copy(c, d, h, n, GML_COPY_H2D), 0);
    ck_assert_int_eq(gml_copy(c, pg, d, n, GML_COPY_D2H), 0);         /* pageable: staged, one path */
    ck_assert_int_eq(gml_copy(c, back, d, MIB / 2, GML_COPY_D2H), 0); /* below min_bytes */
    ck_assert_uint_eq(first_diff(pg, n, 5), n);
    gml_copy_info info;
    ck_assert_int_eq(gml_copy_info_get(c, &info), 0);
    if (mode < 3) {
      ck_assert_uint_eq(ms.peer_copies, 0);
      ck_assert_uint_eq(info.bytes_split, 0);
      ck_assert_uint_eq(info.npaths, mode == 0 ? 0 : mode == 1 ? 1 : 2);
      ck_assert_uint_eq(info.paths_used, mode == 0 ? 0 : 1);
      if (mode == 2) ck_assert(info.paths[1].h2d_gbps == 50 && !info.paths[1].used && info.h2d_gbps == 50);
    } else if (mode == 4) { /* whatever the timings chose: both measured, the bytes intact */
      ck_assert_uint_eq(info.npaths, 2);
      ck_assert(info.paths[0].h2d_gbps > 0 && info.paths[1].h2d_gbps > 0 && info.paths[1].d2h_gbps > 0);
      ck_assert(info.h2d_gbps > 0 && info.d2h_gbps > 0 && info.paths_used >= 1);
    } else {
      ck_assert_uint_eq(info.paths_used, 2);
      ck_assert(info.paths[0].h2d_gbps == 1 && info.paths[1].d2h_gbps == 1 && info.h2d_gbps == 2);
      ck_assert_uint_eq(info.bytes_split, n);
      ck_assert_uint_gt(ms.peer_copies, 0);
    }
    gml_free(c, d);
    ms.base->host_free(c->be, h), ms.base->host_free(c->be, back);
    free(pg);
    close_streams(c);
  }
  gml_set_option("GMLAKE_COPY_PATHS", NULL);
}
END_TEST

Suite *copy_suite(void) {
  Suite *s = suite_create("copy");
  TCase *tc = tcase_create("engine");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_copy_pageable_round_trip);
  tcase_add_test(tc, test_copy_pinned_is_direct);
  tcase_add_test(tc, test_copy_batch_and_fallback);
  tcase_add_test(tc, test_copy_fails_half_way);
  tcase_add_test(tc, test_copy_arguments);
  tcase_add_test(tc, test_pause_through_engine);
  tcase_add_test(tc, test_copy_without_staging);
  tcase_add_test(tc, test_paths_probe);
  tcase_add_test(tc, test_mpath_split);
  tcase_add_test(tc, test_mpath_pipeline);
  tcase_add_test(tc, test_mpath_path_fails);
  tcase_add_test(tc, test_mpath_single_path);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(copy_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
