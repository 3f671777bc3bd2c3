/* planned.c: planned placement carried out in the allocator (planned.h says
 * how it works and why): the planned range, serving a request at its planned
 * offset, frees, the iteration's end, and what the checker and the numbers
 * need of it. The decisions are the keeper's (plan_keep.c) and the policy's
 * (gmli_policy_place_at); nothing here searches. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "log.h"
#include "planned.h"
#include "policy.h"
#include "slots.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gmli_plan_give_up = GMLI_PLAN_GIVE_UP;

int gmli_planned_init(gml_allocator *a, int64_t take_at) {
  gmli_planned *p = calloc(1, sizeof *p);
  if (!p) return GML_ENOMEM;
  p->trim_wait = 1;
  gmli_plan_keeper_init(&p->kp, GML_ALIGN, take_at);
  p->kp.srv.granule = a->cs; /* a departing iteration's large misses may borrow whole free chunks of the range */
  a->plan = p;
  return 0;
}

static void range_free_state(gmli_range *rg) {
  free(rg->free_stream), free(rg->free_tick);
  free(rg);
}

void gmli_planned_destroy(gml_allocator *a) {
  gmli_planned *p = a->plan;
  if (!p) return;
  for (size_t i = 0; i < a->live.cap; i++) { /* planned blocks are in no region's list: theirs go here */
    gml_block *b = a->live.vals ? a->live.vals[i] : NULL;
    if (a->live.keys[i] && b && b->planned == GMLI_BLOCK_PLANNED) {
      a->live.vals[i] = NULL;
      free(b);
    }
  }
  if (p->cur) range_free_state(p->cur);
  for (gmli_range *r = p->retired, *n; r; r = n) n = r->next, range_free_state(r);
  gmli_plan_keeper_destroy(&p->kp);
  free(p);
  a->plan = NULL;
}

/* ---------- the planned range ---------- */

/* A range of `size` bytes (whole chunks, chunk-aligned, so it shares no slot
 * with another block) carved from the large region's free address space that
 * any stream may use; NULL when there is none that large. Address space
 * only: its slots get chunks as the blocks served in it claim them. */
static gmli_range *range_new(gml_allocator *a, size_t size) {
  gml_region *r = &a->regions[1];
  gml_block *b = treap_best_fit(r->pools[0].root, size + a->cs);
  gmli_range *rg = calloc(1, sizeof *rg);
  size_t slots = size / a->cs;
  if (rg) {
    rg->free_stream = calloc(slots, sizeof *rg->free_stream);
    rg->free_tick = calloc(slots, sizeof *rg->free_tick);
  }
  if (!b || !rg || !rg->free_stream || !rg->free_tick) {
    if (rg) range_free_state(rg);
    return NULL;
  }
  gmli_pool_del(r, b);
  uintptr_t start = gmli_round_up(b->addr, a->cs);
  if (start > b->addr) {
    gml_block *rest = gmli_block_split(a, b, start - b->addr);
    if (!rest) {
      gmli_pool_add(r, 0, b);
      range_free_state(rg);
      return NULL;
    }
    gmli_pool_add(r, 0, b);
    b = rest;
  }
  if (b->size > size) {
    gml_block *tail = gmli_block_split(a, b, size);
    if (tail) gmli_pool_add(r, 0, tail);
  }
  b->is_free = 0, b->planned = GMLI_BLOCK_RANGE, b->ptr = b->addr, b->usable = 0, b->req = 0;
  rg->blk = b, rg->base = b->addr, rg->size = b->size;
  a->plan->range_bytes += rg->size;
  return rg;
}

/* A range none of whose blocks lives any more goes back to the region's free
 * address space (pool 0: its slots are released, each chunk's readiness is
 * its own, slot_claim asks it). */
static void range_drop(gml_allocator *a, gmli_range *rg) {
  gml_region *r = &a->regions[1];
  gml_block *b = rg->blk;
  a->plan->range_bytes -= rg->size;
  b->planned = GMLI_BLOCK_ORDINARY, b->is_free = 1, b->pool = 0, b->has_event = 0, b->lent = 0, b->free_tick = a->tick;
  gmli_pool_add(r, 0, gmli_block_coalesce(a, r, b));
  range_free_state(rg);
}

/* The current range is served no more: back to the large region now if nothing lives in it, else retired
 * until its last block goes. */
static void range_let_go(gml_allocator *a) {
  gmli_planned *p = a->plan;
  if (p->cur && !p->cur->live) range_drop(a, p->cur);
  else if (p->cur) p->cur->next = p->retired, p->retired = p->cur;
  p->cur = NULL;
}

/* The plan now served needs `need` bytes of range: the one held if large
 * enough; else a new one (its size with an eighth to spare, so a plan that
 * grows a little fits), the old one dropped at once if nothing lives in it,
 * else retired until its last block goes. No range (no address space):
 * every request goes to the stitching allocator. */
static void range_cover(gml_allocator *a) {
  gmli_planned *p = a->plan;
  const gml_plan *pl = p->kp.plan;
  if (!pl || pl == p->served) return;
  p->served = pl;
  size_t need = gmli_round_up(pl->range ? pl->range : 1, a->cs);
  if (p->cur && p->cur->size >= need) return;
  gmli_range *rg = range_new(a, gmli_round_up(need + need / 8, a->cs));
  if (!rg) rg = range_new(a, need);
  if (!rg) return; /* the old range, if any, goes on serving what fits in it */
  range_let_go(a);
  p->cur = rg, p->cur_dirty = 1;
}

static gmli_range *range_of(gmli_planned *p, uintptr_t addr, gmli_range ***link) {
  static gmli_range *none;
  *link = &none;
  if (p->cur && addr - p->cur->base < p->cur->size) return p->cur;
  for (gmli_range **l = &p->retired; *l; l = &(*l)->next)
    if (addr - (*l)->base < (*l)->size) {
      *link = l;
      return *l;
    }
  return NULL;
}

/* ---------- serving ---------- */

/* Carries out a GML_PLACE_AT plan: a block at `at`, its slots claimed (and
 * mapped where they hold no chunk of their own: the first iteration served,
 * or a chunk taken meanwhile). 0 and *ptr, or nonzero (nothing changed). */
static int serve_at(gml_allocator *a, gmli_range *rg, uintptr_t at, size_t size, size_t rsize, gml_stream stream,
                    int no_grow, const gml_plan_grant *g, void **ptr) {
  uint32_t first = slot_of(a, at), last = slot_of(a, at + rsize - 1);
  gml_block *b = gmli_block_new(a);
  if (!b) return GML_ENOMEM;
  size_t need = 0;
  for (uint32_t s = first; s <= last; s++) need += (size_t)slot_claim(a, s, stream);
  int stole = 0, rc = 0;
  if (need) {
    uint64_t t0 = gmli_now_ns();
    a->mapped_allocs++;
    a->no_grow = no_grow;
    rc = gmli_map_slots_slow(a, first, last, stream, &stole);
    a->no_grow = 0;
    a->map_ns += gmli_now_ns() - t0;
    if (rc) a->mapped_allocs--;
  }
  b->addr = b->ptr = at, b->size = b->usable = rsize, b->region = 1, b->planned = GMLI_BLOCK_PLANNED;
  if (!rc && gmli_ptrmap_put(&a->live, b->ptr, b)) rc = GML_ENOMEM;
  if (rc) {
    gmli_slots_unclaim(a, first, last);
    gmli_block_put(a, b);
    return rc;
  }
  b->grant = *g, b->stream = stream, b->stitched = (uint8_t)stole, b->pause_tag = a->tag;
  b->req = size, b->seq = ++a->alloc_count;
  rg->live++;
  a->allocated += rsize;
  if (stole) a->stitched += rsize;
  if (a->allocated > a->peak_allocated) a->peak_allocated = a->allocated;
  if (reserved_bytes(a) > a->peak_reserved) a->peak_reserved = reserved_bytes(a);
  *ptr = (void *)at;
  return 0;
}

int gmli_planned_malloc(gml_allocator *a, size_t size, size_t rsize, gml_stream stream, int no_grow, void **ptr,
                        gml_plan_grant *g, uint64_t *hash_before) {
  gmli_planned *p = a->plan;
  *hash_before = p->kp.cur.hash;
  if (p->off) { /* given up: the stitching allocator's, unrecorded */
    g->index = GML_PLAN_NEVER, g->lent = 0, g->rec_k = GML_PLAN_NEVER;
    return 1;
  }
  int v = gmli_plan_keeper_alloc(&p->kp, rsize, stream, g);
  if (v < 0) { /* no memory to record it: served unrecorded by the stitching allocator */
    g->index = GML_PLAN_NEVER, g->lent = 0, g->rec_k = GML_PLAN_NEVER;
    return 1;
  }
  range_cover(a); /* the keeper may have switched to another kept plan */
  gml_place_plan pl = gmli_policy_place_at(a, p->cur, v, g, rsize, stream);
  if (pl.kind == GML_PLACE_AT) {
    int rc = serve_at(a, p->cur, pl.at, size, rsize, stream, no_grow, g, ptr);
    if (!rc) {
      if (v == GML_PLAN_HIT) p->hits++;
      else p->lent++;
      p->step_hits++;
      return 0;
    }
    if (rc == GML_EAGAIN) { /* would lease: asked again, so not recorded now */
      gmli_plan_keeper_undo(&p->kp, g, *hash_before);
      return GML_EAGAIN;
    }
  }
  if (p->kp.plan && v != GML_PLAN_MISS_UNPLANNED) { /* unplanned: the plan leaves it to the stitching allocator */
    if (v == GML_PLAN_HIT || g->lent) p->refused++;
    else p->misses++;
    p->step_misses++;
  }
  gmli_plan_serve_free(&p->kp.srv, g); /* not served at its offset: the keeper frees what it marked */
  g->index = GML_PLAN_NEVER, g->lent = 0;
  return 1;
}

void gmli_planned_unserved(gml_allocator *a, const gml_plan_grant *g, uint64_t hash_before) {
  if (!a->plan->off) gmli_plan_keeper_undo(&a->plan->kp, g, hash_before); /* given up: nothing was recorded */
}

/* Where a planned block's bytes were freed, per slot: the stream, or
 * GML_STREAM_MIXED where another stream freed there and no fence has passed
 * since (gmli_policy_place_at asks). */
static void range_note_free(gml_allocator *a, gmli_range *rg, const gml_block *b) {
  uint32_t s0 = slot_of(a, rg->base);
  for (uint32_t s = slot_of(a, b->addr), last = slot_of(a, b->addr + b->size - 1); s <= last; s++) {
    gml_stream *fs = &rg->free_stream[s - s0];
    uint64_t *ft = &rg->free_tick[s - s0];
    *fs = *ft >= a->safe_tick && *fs != b->stream ? GML_STREAM_MIXED : b->stream;
    *ft = a->tick;
  }
}

void gmli_planned_note_free(gml_allocator *a, const gml_block *b) {
  if (!a->plan->off) gmli_plan_keeper_free(&a->plan->kp, &b->grant);
}

void gmli_planned_free(gml_allocator *a, gml_block *b, int slots_held) {
  gmli_planned *p = a->plan;
  gmli_range **link, *rg = range_of(p, b->addr, &link);
  a->tick++;
  if (slots_held) {
    uint32_t first = slot_of(a, b->addr), last = slot_of(a, b->addr + b->size - 1);
    for (uint32_t s = first; s <= last; s++)
      if (--a->slot_use[s] == 0) slot_release(a, s);
    if ((a->free_count & 255) == 0) gmli_fence_update(a);
    a->allocated -= b->usable;
    if (b->stitched) a->stitched -= b->usable;
    a->free_count++; /* a paused block's free counted it already */
  }
  if (rg) range_note_free(a, rg, b);
  gmli_plan_keeper_free(&p->kp, &b->grant);
  if (rg && !--rg->live && rg != p->cur) { /* a retired range's last block */
    *link = rg->next;
    range_drop(a, rg);
  }
  gmli_block_put(a, b);
}

/* Does free chunk ci map a slot of range rg? */
static int chunk_in_range(const gml_allocator *a, int32_t ci, const gmli_range *rg, size_t used) {
  uint32_t s0 = slot_of(a, rg->base), s1 = s0 + (uint32_t)(gmli_round_up(used, a->cs) / a->cs);
  for (int32_t s = a->chunks[ci].maps_head; s >= 0; s = a->slot_anext[s])
    if ((uint32_t)s >= s0 && (uint32_t)s < s1) return 1;
  return 0;
}

/* An iteration range rg served whole just ended, the first since the range
 * came or since one departed: the free chunks that map none of the slots its
 * kept plans use (its first `used` bytes) go back
 * (planned.h: reserved memory), those mapped elsewhere once the device is
 * done with them (one synchronize). */
static void range_trim(gml_allocator *a, gmli_range *rg, size_t used) {
  a->plan->cur_dirty = 0;
  int need_sync = 0;
  for (int32_t ci = a->lists[GML_CL_CACHED].head; ci >= 0; ci = a->chunks[ci].lnext)
    need_sync |= a->chunks[ci].free_tick >= a->safe_tick && !chunk_in_range(a, ci, rg, used);
  if (need_sync && !a->no_device_waits && a->be->ops->synchronize(a->be) == 0) a->safe_tick = a->tick + 1, a->syncs++;
  for (int l = GML_CL_FRESH; l <= GML_CL_CACHED; l++)
    for (int32_t ci = a->lists[l].head, next; ci >= 0; ci = next) {
      next = a->chunks[ci].lnext;
      if (l == GML_CL_CACHED && (a->chunks[ci].free_tick >= a->safe_tick || chunk_in_range(a, ci, rg, used))) continue;
      if (gmli_chunk_give_back(a, ci)) continue; /* the backend refused an unmap: kept */
      a->chunks_released++, a->plan->trimmed_chunks++;
    }
}

/* The bytes of range rg that the kept plans serving in it use: the largest of their ranges that fits. */
static size_t range_used(const gmli_planned *p, const gmli_range *rg) {
  size_t used = 0;
  for (uint32_t i = 0; i < GML_PLAN_KEPT; i++)
    if (p->kp.kept[i] && p->kp.kept[i]->range <= rg->size && p->kp.kept[i]->range > used) used = p->kp.kept[i]->range;
  return used;
}

/* Planning given up (planned.h, GMLI_PLAN_GIVE_UP): no range is served from now on; the current one goes
 * back to the large region now if nothing lives in it, else when its last block goes (retired). */
static void give_up(gml_allocator *a) {
  gmli_planned *p = a->plan;
  p->off = 1;
  range_let_go(a);
  GML_WARN("planned placement (GMLAKE_PLAN) given up after %llu iterations: %d of the last %d that had a plan "
           "departed from it (shapes that change, e.g. dynamic padding); allocations are served as without a plan",
           (unsigned long long)p->steps, __builtin_popcount(p->departed_bits), GMLI_PLAN_JUDGED);
}

int gmli_planned_step(gml_allocator *a) {
  gmli_planned *p = a->plan;
  p->steps++;
  if (p->off) return 0;
  if (p->kp.plan && (p->step_hits || p->step_misses)) { /* an iteration that had a plan: held or departed */
    p->departed_bits = (p->departed_bits << 1 | (p->step_misses != 0)) & ((1u << GMLI_PLAN_JUDGED) - 1);
    if (__builtin_popcount(p->departed_bits) >= gmli_plan_give_up) {
      p->step_hits = p->step_misses = 0;
      give_up(a);
      return 0;
    }
  }
  if (p->step_misses) { /* departed: soon after a give-back, the next one waits for twice as many whole steps */
    p->cur_dirty = 1, p->whole_run = 0;
    if (p->trim_at && p->steps - p->trim_at <= 4 * (uint64_t)p->trim_wait && p->trim_wait < GMLI_TRIM_WAIT_MAX)
      p->trim_wait *= 2;
  } else if (p->step_hits && ++p->whole_run >= p->trim_wait && p->cur && p->cur_dirty && p->kp.plan) {
    range_trim(a, p->cur, range_used(p, p->cur));
    p->trim_at = p->steps;
  }
  p->step_hits = p->step_misses = 0;
  int rc = gmli_plan_keeper_step(&p->kp);
  range_cover(a);
  return rc < 0 ? GML_ENOMEM : 0;
}

/* ---------- what the checker, gml_block_of and the numbers need ---------- */

const gml_block *gmli_planned_block_at(const gml_allocator *a, uintptr_t addr) {
  for (size_t i = 0; a->plan && i < a->live.cap; i++) {
    const gml_block *b = a->live.vals[i];
    if (a->live.keys[i] && b && b->planned == GMLI_BLOCK_PLANNED && addr - b->addr < b->size) return b;
  }
  return NULL;
}

typedef struct span {
  uintptr_t lo, hi;
} span;
static int span_cmp(const void *x, const void *y) {
  const span *s = x, *t = y;
  return s->lo < t->lo ? -1 : s->lo > t->lo;
}

int gmli_planned_check(gml_allocator *a, uint32_t *use, uint64_t *allocated, uint64_t *live) {
  gmli_planned *p = a->plan;
  if (!p) return 0;
  span *v = malloc((a->live.count + 1) * sizeof *v);
  if (!v) return 0;
  size_t n = 0, in_cur = 0, in_retired = 0;
  int bad = 0;
  for (size_t i = 0; i < a->live.cap && !bad; i++) {
    gml_block *b = a->live.vals[i];
    if (!a->live.keys[i] || !b || b->planned != GMLI_BLOCK_PLANNED) continue;
    gmli_range **link, *rg = range_of(p, b->addr, &link);
    if (!rg || b->addr + b->size > rg->base + rg->size) {
      snprintf(a->last_error, sizeof a->last_error, "planned block %#lx+%zu lies in no planned range",
               (unsigned long)b->addr, b->size);
      bad = 1;
      break;
    }
    in_cur += rg == p->cur, in_retired += rg != p->cur;
    v[n++] = (span){b->addr, b->addr + b->size};
    (*live)++;
    if (b->paused) continue; /* its slots let go; not allocated */
    *allocated += b->usable;
    for (uint32_t s = slot_of(a, b->addr), last = slot_of(a, b->addr + b->size - 1); s <= last; s++) use[s]++;
  }
  qsort(v, n, sizeof *v, span_cmp);
  for (size_t i = 1; i < n && !bad; i++)
    if (v[i].lo < v[i - 1].hi) {
      snprintf(a->last_error, sizeof a->last_error,
               "planned blocks %#lx and %#lx overlap: a slot handed out while "
               "something lived in it",
               (unsigned long)v[i - 1].lo, (unsigned long)v[i].lo);
      bad = 1;
    }
  uint64_t retired_live = 0;
  for (gmli_range *r = p->retired; r; r = r->next) retired_live += r->live;
  if (!bad && ((p->cur ? p->cur->live : 0) != in_cur || retired_live != in_retired)) {
    snprintf(a->last_error, sizeof a->last_error, "planned ranges count %llu + %llu live blocks, %zu + %zu found",
             (unsigned long long)(p->cur ? p->cur->live : 0), (unsigned long long)retired_live, in_cur, in_retired);
    bad = 1;
  }
  free(v);
  return bad;
}

void gmli_planned_stats(const gml_allocator *a, gml_stats *st) {
  const gmli_planned *p = a->plan;
  if (!p) return;
  st->plan_steps = p->steps, st->plan_hits = p->hits + p->lent, st->plan_misses = p->misses + p->refused;
  st->plans_taken = p->kp.plans_taken, st->plan_range = p->range_bytes;
}
