/* plan_keep.c: serving plans (the server: the k-th allocation's planned
 * offset, or a miss saying why) and keeping them (the keeper: records every
 * iteration, keeps a plan per repeating pattern, picks the one a new
 * iteration follows); plan.h says why each is as it is. */
#include "plan.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t plan_round(uint64_t align, uint64_t size) {
  uint64_t units = size / align + (size % align != 0);
  return (units ? units : 1) * align;
}

/* ---- server ---- */

void gmli_plan_server_init(gml_plan_server *s) { memset(s, 0, sizeof *s); }

void gmli_plan_server_destroy(gml_plan_server *s) {
  free(s->live), free(s->straggler), free(s->occ), free(s->tmax), free(s->tadd), free(s->lent_span);
  memset(s, 0, sizeof *s);
}

/* The per-granule counts cover [0, range): they grow with the largest
 * plan, and stay (stragglers and lent blocks may lie above a smaller one). */
static int granules_cover(gml_plan_server *s, uint64_t range) {
  if (!s->granule) return 0;
  uint64_t need = range / s->granule + 1;
  if (need <= s->ngranules) return 0;
  if (need > UINT32_MAX / 2) return -ENOMEM;
  uint32_t *occ = realloc(s->occ, need * sizeof *occ);
  if (!occ) return -ENOMEM;
  memset(occ + s->ngranules, 0, (need - s->ngranules) * sizeof *occ);
  s->occ = occ, s->ngranules = (uint32_t)need;
  return 0;
}

static void occ_add(gml_plan_server *s, uint64_t offset, uint64_t size, int delta) {
  if (!s->granule) return;
  for (uint64_t g = offset / s->granule; g <= (offset + size - 1) / s->granule; g++) s->occ[g] += (uint32_t)delta;
}

/* The atom tree: node 1 covers leaves [0, tree_leaves); a node's tmax is
 * the most live blocks on one of its atoms, tadd what was added to all of
 * them at once. Adding over a run of atoms and asking its max each visit
 * O(log atoms) nodes. */
static void tree_add(gml_plan_server *s, uint32_t node, uint32_t lo, uint32_t hi, uint32_t a, uint32_t b, int delta) {
  s->tree_visits++;
  if (b <= lo || hi <= a) return;
  if (a <= lo && hi <= b) {
    s->tmax[node] += delta, s->tadd[node] += delta;
    return;
  }
  uint32_t mid = lo + (hi - lo) / 2;
  tree_add(s, 2 * node, lo, mid, a, b, delta);
  tree_add(s, 2 * node + 1, mid, hi, a, b, delta);
  int32_t l = s->tmax[2 * node], r = s->tmax[2 * node + 1];
  s->tmax[node] = s->tadd[node] + (l > r ? l : r);
}

static int32_t tree_max(gml_plan_server *s, uint32_t node, uint32_t lo, uint32_t hi, uint32_t a, uint32_t b) {
  s->tree_visits++;
  if (b <= lo || hi <= a) return 0;
  if (a <= lo && hi <= b) return s->tmax[node];
  uint32_t mid = lo + (hi - lo) / 2;
  int32_t l = tree_max(s, 2 * node, lo, mid, a, b), r = tree_max(s, 2 * node + 1, mid, hi, a, b);
  return s->tadd[node] + (l > r ? l : r);
}

/* A span that is not one of the plan's blocks (a straggler, a lent block),
 * counted on every atom it touches. */
static void tree_span(gml_plan_server *s, gml_plan_span sp, int delta) {
  uint32_t a0, a1;
  gmli_plan_atoms_of(s->plan, sp.offset, sp.size, &a0, &a1);
  if (a0 < a1) tree_add(s, 1, 0, s->tree_leaves, a0, a1, delta);
}

int gmli_plan_server_install(gml_plan_server *s, const gml_plan *p) {
  if (granules_cover(s, p->range)) return -ENOMEM;
  uint32_t nlive = 0, leaves = 1;
  for (uint32_t i = 0; s->plan && i < s->plan->n; i++) nlive += s->live[i];
  if (gmli_plan_grow((void **)&s->straggler, &s->straggler_cap, s->nstraggler + nlive, sizeof *s->straggler))
    return -ENOMEM;
  while (leaves < p->nbound) leaves *= 2;
  if (2 * leaves > s->tree_cap) {
    int32_t *tmax = realloc(s->tmax, 2 * (size_t)leaves * sizeof *tmax);
    if (tmax) s->tmax = tmax;
    int32_t *tadd = realloc(s->tadd, 2 * (size_t)leaves * sizeof *tadd);
    if (tadd) s->tadd = tadd;
    if (!tmax || !tadd) return -ENOMEM;
    s->tree_cap = 2 * leaves;
  }
  uint8_t *live = calloc(p->n ? p->n : 1, 1);
  if (!live) return -ENOMEM;
  for (uint32_t i = 0; s->plan && i < s->plan->n; i++)
    if (s->live[i]) s->straggler[s->nstraggler++] = (gml_plan_span){s->plan->offset[i], s->plan->size[i]};
  free(s->live);
  s->live = live, s->plan = p, s->epoch++, s->tree_leaves = leaves;
  memset(s->tmax, 0, 2 * (size_t)leaves * sizeof *s->tmax), memset(s->tadd, 0, 2 * (size_t)leaves * sizeof *s->tadd);
  uint64_t visits = s->tree_visits; /* what an install costs is not the hit path's */
  for (uint32_t i = 0; i < s->nstraggler; i++) tree_span(s, s->straggler[i], 1);
  for (uint32_t i = 0; i < s->nlent_span; i++)
    if (s->lent_span[i].size) tree_span(s, s->lent_span[i], 1);
  s->tree_visits = visits;
  return 0;
}

void gmli_plan_server_step(gml_plan_server *s) { s->next = 0; }

/* The hit path: one comparison with the recording, then the most live
 * blocks on one of the slot's atoms, from the tree: every live block in the
 * range is counted there (this plan's on their own atoms; stragglers and
 * lent blocks on every atom they touch). */
enum gml_plan_verdict gmli_plan_serve_alloc(gml_plan_server *s, uint64_t size, uint64_t stream, gml_plan_grant *g) {
  const gml_plan *p = s->plan;
  uint32_t k = s->next++;
  enum gml_plan_verdict v = GML_PLAN_HIT;
  g->index = GML_PLAN_NEVER, g->epoch = s->epoch, g->lent = 0;
  if (!p) v = GML_PLAN_MISS_NOPLAN;
  else if (k >= p->n) v = GML_PLAN_MISS_SHAPE;
  else if (plan_round(p->align, size) != p->size[k] || stream != p->stream[k]) v = GML_PLAN_MISS_SHAPE;
  else if (p->offset[k] == GML_PLAN_NONE) v = GML_PLAN_MISS_UNPLANNED;
#ifdef GMLI_PLAN_BROKEN /* built with it, a slot something lives in is handed out: tests/test_planned.c must fail */
  else if (0 && (s->live[k] || tree_max(s, 1, 0, s->tree_leaves, p->atom[2 * k], p->atom[2 * k + 1]) > 0))
#else
  else if (s->live[k] || tree_max(s, 1, 0, s->tree_leaves, p->atom[2 * k], p->atom[2 * k + 1]) > 0)
#endif
    v = GML_PLAN_MISS_OCCUPIED;
  s->verdicts[v]++;
  if (v == GML_PLAN_HIT) {
    s->live[k] = 1;
    tree_add(s, 1, 0, s->tree_leaves, p->atom[2 * k], p->atom[2 * k + 1], 1);
    occ_add(s, p->offset[k], p->size[k], 1);
    g->index = k, g->offset = p->offset[k], g->size = p->size[k];
  }
  return v;
}

/* Lent granules are taken from the top of the plan's range down: the
 * planner stacks blocks from offset 0 up, so the top is where the fewest
 * planned blocks lie and a lent block blocks the fewest slots. */
int gmli_plan_server_lend(gml_plan_server *s, uint64_t size, gml_plan_grant *g) {
  if (!s->granule || !s->plan || size < s->granule) return 0;
  uint64_t want = size / s->granule + (size % s->granule != 0), top = s->plan->range / s->granule, run = 0;
  uint32_t slot = 0;
  while (slot < s->nlent_span && s->lent_span[slot].size) slot++;
  if (slot == s->nlent_span &&
      gmli_plan_grow((void **)&s->lent_span, &s->lent_span_cap, s->nlent_span + 1, sizeof *s->lent_span))
    return 0;
  for (uint64_t gr = top; gr-- > 0;) {
    run = s->occ[gr] ? 0 : run + 1;
    if (run < want) continue;
    g->lent = slot + 1, g->offset = gr * s->granule, g->size = want * s->granule;
    occ_add(s, g->offset, g->size, 1);
    s->lent_span[slot] = (gml_plan_span){g->offset, g->size};
    s->nlent_span += slot == s->nlent_span;
    tree_span(s, s->lent_span[slot], 1);
    s->lends++, s->lent_bytes += g->size;
    return 1;
  }
  return 0;
}

void gmli_plan_serve_free(gml_plan_server *s, const gml_plan_grant *g) {
  if (g->index == GML_PLAN_NEVER && !g->lent) return;
  occ_add(s, g->offset, g->size, -1);
  if (g->lent) {
    tree_span(s, s->lent_span[g->lent - 1], -1);
    s->lent_span[g->lent - 1].size = 0;
    while (s->nlent_span && !s->lent_span[s->nlent_span - 1].size) s->nlent_span--;
    return;
  }
  if (g->epoch == s->epoch) {
    s->live[g->index] = 0;
    tree_add(s, 1, 0, s->tree_leaves, s->plan->atom[2 * g->index], s->plan->atom[2 * g->index + 1], -1);
    return;
  }
  for (uint32_t i = 0; i < s->nstraggler; i++) /* a block of an earlier plan: its span is free again */
    if (s->straggler[i].offset == g->offset && s->straggler[i].size == g->size) {
      tree_span(s, s->straggler[i], -1);
      s->straggler[i] = s->straggler[--s->nstraggler];
      return;
    }
}

/* ---- keeper ---- */

void gmli_plan_keeper_init(gml_plan_keeper *kp, uint64_t align, int64_t take_at) {
  memset(kp, 0, sizeof *kp);
  kp->take_at = take_at, kp->prev = -1, kp->max_bytes = GML_PLAN_KEPT_BYTES;
  gmli_plan_rec_init(&kp->cur, align);
  for (int i = 0; i < GML_PLAN_REMEMBERED; i++) gmli_plan_rec_init(&kp->past[i], align);
  gmli_plan_server_init(&kp->srv);
}

static void keeper_drop(gml_plan_keeper *kp, uint32_t i) {
  kp->kept_bytes -= kp->kept[i]->bytes;
  gmli_plan_destroy(kp->kept[i]);
  free(kp->kept[i]);
  kp->kept[i] = NULL, kp->nkept--, kp->cand &= ~(1u << i), kp->dropped++;
}

void gmli_plan_keeper_destroy(gml_plan_keeper *kp) {
  gmli_plan_rec_destroy(&kp->cur);
  for (int i = 0; i < GML_PLAN_REMEMBERED; i++) gmli_plan_rec_destroy(&kp->past[i]);
  gmli_plan_server_destroy(&kp->srv);
  for (uint32_t i = 0; i < GML_PLAN_KEPT; i++)
    if (kp->kept[i]) keeper_drop(kp, i);
  memset(kp, 0, sizeof *kp);
}

/* Serves kp->kept[i] from now on (the old one's live blocks become stragglers). */
static int keeper_install(gml_plan_keeper *kp, uint32_t i) {
  if (kp->plan == kp->kept[i]) return 0;
  if (gmli_plan_server_install(&kp->srv, kp->kept[i])) return -ENOMEM;
  if (kp->plan) kp->switches++;
  kp->plan = kp->kept[i], kp->planned_from = kp->plan->from_iter;
  return 0;
}

/* The k-th allocation of the iteration: drops the candidates it departs
 * from; where the served plan is no longer one of them, installs the most
 * recently used candidate. Once none is left the iteration is a new
 * pattern: the served plan goes on serving what still matches it by index. */
static int keeper_pick(gml_plan_keeper *kp, uint64_t size, uint64_t stream, uint32_t k) {
  uint32_t keep = 0, best = GML_PLAN_KEPT;
  for (uint32_t i = 0; i < GML_PLAN_KEPT; i++) {
    const gml_plan *p = kp->kept[i];
    if (!(kp->cand >> i & 1) || k >= p->n || p->size[k] != plan_round(p->align, size) || p->stream[k] != stream)
      continue;
    keep |= 1u << i;
    if (best == GML_PLAN_KEPT || p->used_iter > kp->kept[best]->used_iter) best = i;
  }
  kp->cand = keep;
  for (uint32_t i = 0; i < GML_PLAN_KEPT; i++)
    if ((keep >> i & 1) && kp->kept[i] == kp->plan) return 0;
  return best < GML_PLAN_KEPT ? keeper_install(kp, best) : 0;
}

int gmli_plan_keeper_alloc(gml_plan_keeper *kp, uint64_t size, uint64_t stream, gml_plan_grant *g) {
  if (kp->cand && keeper_pick(kp, size, stream, kp->cur.n)) return -ENOMEM;
  int v = gmli_plan_serve_alloc(&kp->srv, size, stream, g);
  if (!kp->cand && kp->plan && v == GML_PLAN_MISS_SHAPE) kp->departed = 1; /* no kept plan is this iteration's */
  if (v != GML_PLAN_HIT && kp->departed) gmli_plan_server_lend(&kp->srv, size, g);
  g->rec_iter = kp->iteration;
  if (gmli_plan_rec_alloc(&kp->cur, size, stream, &g->rec_k)) {
    gmli_plan_serve_free(&kp->srv, g);
    return -ENOMEM;
  }
  return v;
}

void gmli_plan_keeper_undo(gml_plan_keeper *kp, const gml_plan_grant *g, uint64_t hash_before) {
  gmli_plan_serve_free(&kp->srv, g);
  if (kp->srv.next) kp->srv.next--;
  if (g->rec_iter == kp->iteration && g->rec_k != GML_PLAN_NEVER && g->rec_k + 1 == kp->cur.n)
    kp->cur.n--, kp->cur.events--, kp->cur.hash = hash_before;
}

void gmli_plan_keeper_free(gml_plan_keeper *kp, const gml_plan_grant *g) {
  gmli_plan_serve_free(&kp->srv, g);
  if (g->rec_iter == kp->iteration) {
    gmli_plan_rec_free(&kp->cur, g->rec_k);
  } else if (g->rec_iter + 1 == kp->iteration && kp->prev >= 0) { /* the previous iteration's block: its wrap free */
    gml_plan_rec *a = g->rec_k < kp->past[kp->prev].n ? &kp->past[kp->prev].a[g->rec_k] : NULL;
    if (a && a->free_at == GML_PLAN_NEVER && a->wrap_free == GML_PLAN_NEVER) a->wrap_free = kp->cur.events++;
  }
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A free slot of kept (want_free), or the kept plan used least recently
 * but the one served; GML_PLAN_KEPT: none. */
static uint32_t keeper_lru(const gml_plan_keeper *kp, int want_free) {
  uint32_t r = GML_PLAN_KEPT;
  for (uint32_t i = 0; i < GML_PLAN_KEPT; i++) {
    if (want_free && !kp->kept[i]) return i;
    if (!want_free && kp->kept[i] && kp->kept[i] != kp->plan &&
        (r == GML_PLAN_KEPT || kp->kept[i]->used_iter < kp->kept[r]->used_iter))
      r = i;
  }
  return r;
}

/* Plans the remembered iteration in ring slot `slot`, keeps the plan (the
 * least recently used dropped first where the count or the byte bound
 * would be passed, never the one served) and serves it from the next
 * iteration. */
static int keeper_take(gml_plan_keeper *kp, uint32_t slot) {
  gml_plan *np = malloc(sizeof *np);
  double t0 = now_seconds();
  if (!np || gmli_plan_build(np, &kp->past[slot])) {
    free(np);
    return -ENOMEM;
  }
  double dt = now_seconds() - t0;
  kp->plan_seconds += dt, kp->plan_seconds_max = dt > kp->plan_seconds_max ? dt : kp->plan_seconds_max;
  np->from_iter = kp->past_iter[slot], np->used_iter = kp->iteration;
  uint32_t at = keeper_lru(kp, 1);
  if (at == GML_PLAN_KEPT) keeper_drop(kp, at = keeper_lru(kp, 0)); /* full: the least recently used goes */
  kp->kept[at] = np, kp->nkept++, kp->kept_bytes += np->bytes, kp->plans_taken++;
  if (keeper_install(kp, at)) {
    keeper_drop(kp, at);
    kp->dropped--;
    return -ENOMEM;
  }
  for (uint32_t lru; kp->kept_bytes > kp->max_bytes && (lru = keeper_lru(kp, 0)) < GML_PLAN_KEPT;) keeper_drop(kp, lru);
  return 1;
}

int gmli_plan_keeper_step(gml_plan_keeper *kp) {
  int rc = 0, matched = 0;
  uint32_t remembered = kp->npast < GML_PLAN_REMEMBERED ? kp->npast : GML_PLAN_REMEMBERED;
  for (uint32_t i = 0; i < GML_PLAN_KEPT && kp->cur.n; i++) /* a kept pattern, whole: the most recently used now */
    if ((kp->cand >> i & 1) && kp->kept[i]->n == kp->cur.n && gmli_plan_matches(kp->kept[i], &kp->cur)) {
      kp->kept[i]->used_iter = kp->iteration, matched = 1;
      if (keeper_install(kp, i)) rc = -ENOMEM;
    }
  if (kp->take_at >= 0) {
    if (kp->prev >= 0 && (int64_t)kp->past_iter[kp->prev] == kp->take_at && kp->plans_taken == 0)
      rc = keeper_take(kp, (uint32_t)kp->prev);
  } else if (kp->cur.n && !matched) {
    for (uint32_t d = 1; d <= remembered; d++) { /* the newest first: its wrap frees are the latest */
      uint32_t i = (kp->npast - d) % GML_PLAN_REMEMBERED;
      if (gmli_plan_rec_same(&kp->past[i], &kp->cur)) { /* a pattern seen before, now again: plan it */
        rc = keeper_take(kp, i);
        break;
      }
    }
  }
  for (uint32_t i = 0; i < GML_PLAN_KEPT; i++) /* patterns not seen for long */
    if (kp->kept[i] && kp->kept[i] != kp->plan && kp->iteration - kp->kept[i]->used_iter > GML_PLAN_STALE)
      keeper_drop(kp, i);
  uint32_t slot = kp->npast % GML_PLAN_REMEMBERED; /* remembered in the ring, over the oldest */
  if (gmli_plan_rec_copy(&kp->past[slot], &kp->cur)) {
    rc = -ENOMEM, kp->prev = -1; /* the next iteration's frees of this one's blocks go unrecorded */
  } else {
    kp->past_iter[slot] = kp->iteration, kp->prev = (int32_t)slot;
    kp->npast++;
  }
  gmli_plan_rec_reset(&kp->cur);
  gmli_plan_server_step(&kp->srv);
  kp->cand = 0, kp->departed = 0; /* the next iteration may follow any kept plan */
  for (uint32_t i = 0; i < GML_PLAN_KEPT; i++) kp->cand |= (uint32_t)(kp->kept[i] != NULL) << i;
  kp->iteration++;
  return rc;
}
