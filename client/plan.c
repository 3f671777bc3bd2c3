/* plan.c: the recorder and the planner (plan.h says why each is as it is);
 * the server and the keeper that take and serve plans are plan_keep.c. */
#include "plan.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int gmli_plan_grow(void **v, uint32_t *cap, uint32_t need, size_t elem) {
  if (need <= *cap) return 0;
  uint32_t c = *cap ? *cap : 64;
  while (c < need) {
    if (c > UINT32_MAX / 2) return -ENOMEM;
    c *= 2;
  }
  void *n = realloc(*v, (size_t)c * elem);
  if (!n) return -ENOMEM;
  *v = n, *cap = c;
  return 0;
}

/* ---- recorder ---- */

void gmli_plan_rec_init(gml_plan_recording *r, uint64_t align) {
  memset(r, 0, sizeof *r);
  r->align = align ? align : 1;
}

void gmli_plan_rec_destroy(gml_plan_recording *r) {
  free(r->a);
  memset(r, 0, sizeof *r);
}

void gmli_plan_rec_reset(gml_plan_recording *r) { r->n = 0, r->events = 0, r->hash = 0; }

static uint64_t rec_round(const gml_plan_recording *r, uint64_t size) {
  uint64_t units = size / r->align + (size % r->align != 0);
  return (units ? units : 1) * r->align; /* a zero-byte request still takes an address of its own */
}

static uint64_t hash_step(uint64_t h, uint64_t size, uint64_t stream) {
  h ^= size + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h ^= stream * 0xBF58476D1CE4E5B9ull + (h << 6) + (h >> 2);
  return h;
}

int gmli_plan_rec_alloc(gml_plan_recording *r, uint64_t size, uint64_t stream, uint32_t *k) {
  if (r->n == UINT32_MAX - 1 || r->events >= UINT32_MAX - 2) return -ENOMEM; /* indices are 32-bit; NEVER is reserved */
  if (gmli_plan_grow((void **)&r->a, &r->cap, r->n + 1, sizeof *r->a)) return -ENOMEM;
  uint64_t s = rec_round(r, size);
  r->a[r->n] = (gml_plan_rec){
      .size = s, .stream = stream, .alloc_at = r->events++, .free_at = GML_PLAN_NEVER, .wrap_free = GML_PLAN_NEVER};
  r->hash = hash_step(r->hash, s, stream);
  *k = r->n++;
  return 0;
}

void gmli_plan_rec_free(gml_plan_recording *r, uint32_t k) {
  if (k < r->n && r->a[k].free_at == GML_PLAN_NEVER) r->a[k].free_at = r->events++;
}

int gmli_plan_rec_same(const gml_plan_recording *x, const gml_plan_recording *y) {
  if (x->n != y->n || x->hash != y->hash || x->align != y->align) return 0;
  for (uint32_t i = 0; i < x->n; i++)
    if (x->a[i].size != y->a[i].size || x->a[i].stream != y->a[i].stream) return 0;
  return 1;
}

int gmli_plan_rec_copy(gml_plan_recording *dst, const gml_plan_recording *src) {
  if (gmli_plan_grow((void **)&dst->a, &dst->cap, src->n, sizeof *dst->a)) return -ENOMEM;
  if (src->n) memcpy(dst->a, src->a, (size_t)src->n * sizeof *src->a);
  dst->n = src->n, dst->events = src->events, dst->align = src->align, dst->hash = src->hash;
  return 0;
}

/* ---- planner ---- */

/* What the orderings compare (qsort_r's argument: no globals). */
typedef struct place_key {
  const gml_plan_rec *a;
  const uint64_t *breadth; /* per block: the most bytes live at one event of its lifetime */
} place_key;

static int by_size_desc(const void *x, const void *y, void *arg) {
  const place_key *k = arg;
  const gml_plan_rec *a = &k->a[*(const uint32_t *)x], *b = &k->a[*(const uint32_t *)y];
  if (a->size != b->size) return a->size > b->size ? -1 : 1;
  return a->alloc_at < b->alloc_at ? -1 : a->alloc_at > b->alloc_at;
}

static int by_breadth_desc(const void *x, const void *y, void *arg) {
  const place_key *k = arg;
  uint64_t a = k->breadth[*(const uint32_t *)x], b = k->breadth[*(const uint32_t *)y];
  return a != b ? (a > b ? -1 : 1) : by_size_desc(x, y, arg);
}

typedef struct span_end {
  uint64_t offset, end;
} span_end;
static int span_cmp(const void *x, const void *y) {
  const span_end *a = x, *b = y;
  return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Whether block a is planned: freed in its iteration, or wrapping around to
 * a free in the next that comes before its own next allocation. */
static int rec_planned(const gml_plan_rec *a) {
  return a->free_at != GML_PLAN_NEVER || (a->wrap_free != GML_PLAN_NEVER && a->wrap_free <= a->alloc_at);
}

/* A lifetime on the circle of an iteration of e events, unrolled: [alloc_at,
 * end) with end past e for a block that wraps. */
static uint64_t rec_end(const gml_plan_rec *a, uint32_t e) {
  return a->free_at != GML_PLAN_NEVER ? a->free_at : (uint64_t)e + a->wrap_free;
}

static int spans_overlap(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1) { return a0 < b1 && b0 < a1; }

/* Two planned lifetimes overlap on the circle: as they are, or one of them a
 * turn later (each is shorter than a turn). */
static int lifetimes_overlap(const gml_plan_rec *a, const gml_plan_rec *b, uint32_t e) {
  uint64_t a0 = a->alloc_at, a1 = rec_end(a, e), b0 = b->alloc_at, b1 = rec_end(b, e);
  return spans_overlap(a0, a1, b0, b1) || spans_overlap(a0, a1, b0 + e, b1 + e) ||
         spans_overlap(a0 + e, a1 + e, b0, b1);
}

/* Bytes live at each event of the steady state (a wrapping block is live
 * from the start too) into live[events]; their largest sum is the lower bound. */
static uint64_t plan_live(const gml_plan_recording *r, uint64_t *live) {
  memset(live, 0, ((size_t)r->events + 1) * sizeof *live);
  for (uint32_t i = 0; i < r->n; i++) { /* deltas first, summed below (unsigned: wraps back right) */
    const gml_plan_rec *a = &r->a[i];
    if (!rec_planned(a)) continue;
    live[a->alloc_at] += a->size;
    if (a->free_at != GML_PLAN_NEVER) live[a->free_at] -= a->size;
    else live[0] += a->size, live[a->wrap_free] -= a->size;
  }
  uint64_t sum = 0, peak = 0;
  for (uint32_t e = 0; e < r->events; e++) {
    sum += live[e], live[e] = sum;
    peak = sum > peak ? sum : peak;
  }
  return peak;
}

static uint64_t max_live_in(const uint64_t *live, uint64_t from, uint64_t to) {
  uint64_t m = 0;
  for (uint64_t e = from; e < to; e++) m = live[e] > m ? live[e] : m;
  return m;
}

/* One greedy placement: blocks in the order cmp gives, each into a gap
 * among the placed blocks whose lifetimes overlap its own (the smallest
 * that holds it: best_fit; else the lowest), or above the highest of them.
 * Offsets into off; returns the range. */
static uint64_t plan_place(const gml_plan_recording *r, uint32_t *order, uint32_t np, place_key *key,
                           int (*cmp)(const void *, const void *, void *), int best_fit, uint64_t *off,
                           span_end *busy) {
  uint64_t range = 0;
  qsort_r(order, np, sizeof *order, cmp, key);
  for (uint32_t i = 0; i < np; i++) {
    const gml_plan_rec *b = &r->a[order[i]];
    uint32_t nb = 0;
    for (uint32_t j = 0; j < i; j++) {
      const gml_plan_rec *o = &r->a[order[j]];
      if (lifetimes_overlap(b, o, r->events)) busy[nb++] = (span_end){off[order[j]], off[order[j]] + o->size};
    }
    qsort(busy, nb, sizeof *busy, span_cmp);
    uint64_t prev_end = 0, best = GML_PLAN_NONE, best_gap = UINT64_MAX;
    for (uint32_t j = 0; j < nb && !(best != GML_PLAN_NONE && !best_fit); j++) {
      if (busy[j].offset > prev_end) {
        uint64_t gap = busy[j].offset - prev_end;
        if (gap >= b->size && gap < best_gap) best = prev_end, best_gap = gap;
      }
      prev_end = busy[j].end > prev_end ? busy[j].end : prev_end;
    }
    off[order[i]] = best != GML_PLAN_NONE ? best : prev_end;
    range = off[order[i]] + b->size > range ? off[order[i]] + b->size : range;
  }
  return range;
}

/* Four greedy placements, the smallest range kept: by size (TFLite's and
 * SmartPool's order: large blocks first claim the lifetimes they span) and
 * by breadth (blocks of the busiest moments first: those decide the peak),
 * each with the best-fitting and the lowest gap. Each is O(n^2); four cost
 * a few milliseconds on a training step and each wins on some iterations. */
static int plan_offsets(gml_plan *p, const gml_plan_recording *r, uint32_t *order, uint32_t np) {
  uint64_t *live = malloc(((size_t)r->events + 1) * sizeof *live), *breadth = calloc(p->n + 1, sizeof *breadth);
  uint64_t *off = malloc(((size_t)p->n + 1) * sizeof *off);
  span_end *busy = malloc(((size_t)np + 1) * sizeof *busy);
  if (!live || !breadth || !off || !busy) {
    free(live), free(breadth), free(off), free(busy);
    return -ENOMEM;
  }
  p->lower_bound = plan_live(r, live);
  for (uint32_t i = 0; i < np; i++) {
    const gml_plan_rec *a = &r->a[order[i]];
    uint64_t head = max_live_in(live, a->alloc_at, a->free_at != GML_PLAN_NEVER ? a->free_at : r->events);
    /* a wrapping block's start */
    uint64_t tail = a->free_at != GML_PLAN_NEVER ? 0 : max_live_in(live, 0, a->wrap_free);
    breadth[order[i]] = head > tail ? head : tail;
  }
  place_key key = {r->a, breadth};
  int (*cmps[2])(const void *, const void *, void *) = {by_size_desc, by_breadth_desc};
  p->range = UINT64_MAX;
  for (int s = 0; s < 4; s++) {
    uint64_t range = plan_place(r, order, np, &key, cmps[s / 2], s % 2 == 0, off, busy);
    if (range < p->range) {
      p->range = range;
      for (uint32_t i = 0; i < np; i++) p->offset[order[i]] = off[order[i]];
    }
  }
  if (!np) p->range = 0;
  free(live), free(breadth), free(off), free(busy);
  return 0;
}

static int u64_cmp(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* The atoms: the planned blocks' offsets and ends, sorted and distinct, cut
 * the range into intervals that each block covers whole or not at all; two
 * planned blocks share bytes exactly when they share an atom. The server
 * counts live blocks per atom in a tree, so a hit costs O(log atoms) where
 * a list of the blocks sharing its bytes cost their number (up to hundreds). */
static int plan_atoms(gml_plan *p, const uint32_t *order, uint32_t np) {
  p->bound = malloc(((size_t)np * 2 + 1) * sizeof *p->bound);
  p->atom = malloc(((size_t)p->n * 2 + 1) * sizeof *p->atom);
  if (!p->bound || !p->atom) return -ENOMEM;
  uint32_t nb = 0;
  for (uint32_t i = 0; i < np; i++)
    p->bound[nb++] = p->offset[order[i]], p->bound[nb++] = p->offset[order[i]] + p->size[order[i]];
  qsort(p->bound, nb, sizeof *p->bound, u64_cmp);
  uint32_t d = 0;
  for (uint32_t i = 0; i < nb; i++)
    if (!d || p->bound[i] != p->bound[d - 1]) p->bound[d++] = p->bound[i];
  p->nbound = d;
  for (uint32_t i = 0; i < p->n; i++) {
    p->atom[2 * i] = p->atom[2 * i + 1] = 0;
    if (p->offset[i] != GML_PLAN_NONE)
      gmli_plan_atoms_of(p, p->offset[i], p->size[i], &p->atom[2 * i], &p->atom[2 * i + 1]);
  }
  return 0;
}

/* Atoms [*a0, *a1) that bytes [offset, offset + size) touch: exactly a
 * planned block's own; any other span's, rounded out (a straggler of an
 * earlier plan, a lent block) so that it occupies every atom it touches. */
void gmli_plan_atoms_of(const gml_plan *p, uint64_t offset, uint64_t size, uint32_t *a0, uint32_t *a1) {
  uint32_t lo = 0, hi = p->nbound; /* bounds <= offset: lo after the search */
  while (lo < hi) {
    uint32_t m = lo + (hi - lo) / 2;
    if (p->bound[m] <= offset) lo = m + 1;
    else hi = m;
  }
  *a0 = lo ? lo - 1 : 0;
  uint32_t l2 = *a0, h2 = p->nbound; /* bounds < end */
  while (l2 < h2) {
    uint32_t m = l2 + (h2 - l2) / 2;
    if (p->bound[m] < offset + size) l2 = m + 1;
    else h2 = m;
  }
  uint32_t atoms = p->nbound ? p->nbound - 1 : 0;
  *a1 = l2 < atoms ? l2 : atoms;
  if (*a0 > *a1) *a0 = *a1;
}

int gmli_plan_build(gml_plan *p, const gml_plan_recording *r) {
  memset(p, 0, sizeof *p);
  p->align = r->align, p->n = r->n, p->hash = r->hash;
  size_t n = r->n ? r->n : 1;
  p->size = malloc(n * sizeof *p->size), p->stream = malloc(n * sizeof *p->stream);
  p->offset = malloc(n * sizeof *p->offset);
  uint32_t *order = malloc(n * sizeof *order);
  int rc = p->size && p->stream && p->offset && order ? 0 : -ENOMEM;
  uint32_t np = 0;
  for (uint32_t i = 0; !rc && i < r->n; i++) {
    p->size[i] = r->a[i].size, p->stream[i] = r->a[i].stream, p->offset[i] = GML_PLAN_NONE;
    if (rec_planned(&r->a[i])) order[np++] = i; /* else live past the iteration: weights, optimizer state */
  }
  p->planned = np;
  if (!rc) rc = plan_offsets(p, r, order, np);
  if (!rc) rc = plan_atoms(p, order, np);
  if (!rc) /* what the keeper's byte bound counts */
    p->bytes =
        sizeof *p + (uint64_t)n * (3 * sizeof(uint64_t) + 2 * sizeof(uint32_t)) + (uint64_t)np * 2 * sizeof(uint64_t);
  free(order);
  if (rc) gmli_plan_destroy(p);
  return rc;
}

void gmli_plan_destroy(gml_plan *p) {
  free(p->size), free(p->stream), free(p->offset), free(p->bound), free(p->atom);
  memset(p, 0, sizeof *p);
}

int gmli_plan_matches(const gml_plan *p, const gml_plan_recording *r) {
  if (p->n != r->n || p->hash != r->hash || p->align != r->align) return 0;
  for (uint32_t i = 0; i < r->n; i++)
    if (p->size[i] != r->a[i].size || p->stream[i] != r->a[i].stream) return 0;
  return 1;
}
