/* alloc_check.c: the allocator's invariant checker, for tests (and for
 * gmlake-replay --check): walks every block, slot and chunk and says which
 * invariant broke. Slow (touches everything); never on a hot path. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "alloc_internal.h"
#include "planned.h"
#include <stdio.h>
#include <stdlib.h>

int gmli_alloc_check(gml_allocator *a) {
  pthread_mutex_lock(&a->lock);
  int bad = 0;
#define CHECK(cond, ...)                                                                                               \
  if (!bad && !(cond)) {                                                                                               \
    snprintf(a->last_error, sizeof a->last_error, __VA_ARGS__);                                                        \
    bad = 1;                                                                                                           \
  }
  uint32_t *use = calloc(a->nslots, sizeof *use);
  uint64_t allocated = 0, live = 0;
  for (int i = 0; i < 2 && use; i++) {
    gml_region *r = &a->regions[i];
    uintptr_t expect = r->base;
    size_t nfree = 0, pooled = 0;
    for (gml_block *b = r->first; b; b = b->next) {
      CHECK(b->addr == expect, "region %d: block at %#lx, expected %#lx (gap or overlap)", i, (unsigned long)b->addr,
            (unsigned long)expect);
      CHECK(!b->next || b->next->prev == b, "region %d: broken prev link", i);
      CHECK(b->size % GML_ALIGN == 0 && b->size, "block size %zu not aligned", b->size);
      expect = b->addr + b->size;
      if (b->is_free) {
        nfree++;
        CHECK(!(b->next && b->next->is_free && b->next->pool == b->pool),
              "adjacent free blocks of one pool not merged");
      } else if (b->planned == GMLI_BLOCK_RANGE) { /* address space for the plan: its blocks claim its slots */
        CHECK(a->plan && gmli_ptrmap_take(&a->live, b->ptr, 0) != b,
              "planned range %#lx: in the pointer map, or no plan", (unsigned long)b->addr);
      } else if (b->paused == GML_PAUSED_FREED) { /* out of the pointer map, no slots: free at resume */
      } else if (b->paused) {                     /* in the pointer map, no slots, not allocated */
        live++;
        CHECK(gmli_ptrmap_take(&a->live, b->ptr, 0) == b, "paused block %#lx missing from the pointer map",
              (unsigned long)b->ptr);
      } else {
        allocated += b->usable;
        live++;
        CHECK(gmli_ptrmap_take(&a->live, b->ptr, 0) == b, "live block %#lx missing from the pointer map",
              (unsigned long)b->ptr);
        CHECK(b->ptr >= b->addr && b->ptr + b->usable <= b->addr + b->size && b->req <= b->usable,
              "block %#lx: its pointer or size outside it", (unsigned long)b->addr);
        uint32_t first, last;
        block_slots(a, b, &first, &last);
        for (uint32_t s = first; s <= last; s++) use[s]++;
        if (guard_slots_unmapped(a)) { /* whole-slot guards map nothing */
          uint32_t g = slot_of(a, b->ptr + b->usable);
          CHECK(a->slot_chunk[g] < 0, "block %#lx: its guard slot %u maps chunk %d", (unsigned long)b->ptr, g,
                a->slot_chunk[g]);
          if (a->guard == GML_GUARD_BOTH)
            CHECK(a->slot_chunk[first - 1] < 0, "block %#lx: its front guard slot is mapped", (unsigned long)b->ptr);
        }
      }
    }
    CHECK(expect == r->base + r->size, "region %d does not end at its end", i);
    for (int pi = 0; pi <= GML_MAX_STREAMS; pi++) pooled += r->pools[pi].count;
    CHECK(pooled == nfree, "region %d: %zu free blocks but %zu in pools", i, nfree, pooled);
  }
  /* blocks served in planned ranges: in the pointer map, in no region's list (none overlapping another) */
  if (!bad && use && gmli_planned_check(a, use, &allocated, &live)) bad = 1;
  CHECK(allocated == a->allocated, "allocated %llu but blocks sum to %llu", (unsigned long long)a->allocated,
        (unsigned long long)allocated);
  CHECK(live == a->live.count, "pointer map holds %zu, %llu live blocks", a->live.count, (unsigned long long)live);
  /* slots and chunks: each mapped slot is on its chunk's alias list; a used
   * slot owns its chunk; a chunk is owned or on the free list its maps say */
  size_t owned = 0, used = 0;
  for (uint32_t s = 0; s < a->nslots && use; s++) {
    CHECK(use[s] == a->slot_use[s], "slot %u: use %u, blocks say %u", s, a->slot_use[s], use[s]);
    int32_t ci = a->slot_chunk[s];
    if (a->slot_use[s]) {
      used++;
      CHECK(ci >= 0 && a->chunks[ci].owner == (int32_t)s, "used slot %u does not own a chunk", s);
    }
    if (ci >= 0) CHECK(a->chunks[ci].list != GML_CL_DEAD, "slot %u maps released chunk %d", s, ci);
  }
  size_t nfree[3] = {0, 0, 0}, live_chunks = 0;
  for (size_t i = 0; i < a->chunks_used && use; i++) {
    gml_pchunk *c = &a->chunks[i];
    if (c->list == GML_CL_DEAD) continue;
    live_chunks++;
    uint32_t n = 0;
    for (int32_t s = c->maps_head; s >= 0 && n <= a->nslots; s = a->slot_anext[s]) {
      CHECK(a->slot_chunk[s] == (int32_t)i, "chunk %zu lists slot %d, which maps %d", i, s, a->slot_chunk[s]);
      n++;
    }
    CHECK(n == c->nmaps, "chunk %zu: %u maps listed, %u counted", i, n, c->nmaps);
    /* snapshots show each chunk once: at its owner, else at a slot mapping it */
    CHECK(c->owner >= 0 ? c->shown_at == c->owner : (c->shown_at >= 0) == (c->nmaps > 0),
          "chunk %zu (owner %d, maps %u) shown at %d", i, c->owner, c->nmaps, c->shown_at);
    CHECK(c->shown_at < 0 || a->slot_chunk[c->shown_at] == (int32_t)i, "chunk %zu shown at slot %d, which maps %d", i,
          c->shown_at, c->shown_at >= 0 ? a->slot_chunk[c->shown_at] : -1);
    if (c->owner >= 0) {
      owned++;
      CHECK(c->list == GML_CL_OWNED, "owned chunk %zu is on a free list", i);
      CHECK(a->slot_use[c->owner] && a->slot_chunk[c->owner] == (int32_t)i,
            "chunk %zu owned by slot %d that is not using it", i, c->owner);
    } else {
      CHECK(c->list == (c->nmaps ? GML_CL_CACHED : GML_CL_FRESH), "free chunk %zu (maps %u) on list %d", i, c->nmaps,
            c->list);
      nfree[c->list]++;
    }
  }
  CHECK(owned == used, "%zu chunks owned, %zu slots used", owned, used);
  CHECK(live_chunks == a->held, "%zu live chunks, held %zu", live_chunks, a->held);
  for (int l = 1; l < 3 && use; l++) {
    size_t listed = 0;
    for (int32_t ci = a->lists[l].head; ci >= 0 && listed <= a->chunks_used; ci = a->chunks[ci].lnext) listed++;
    CHECK(listed == nfree[l] && listed == a->lists[l].count, "free list %d: %zu listed, count %zu, chunks say %zu", l,
          listed, a->lists[l].count, nfree[l]);
  }
#undef CHECK
  free(use);
  pthread_mutex_unlock(&a->lock);
  return bad ? GML_EINVAL : 0;
}
