/* snapshot.c: what a framework's memory snapshot shows (gml_segments,
 * gmlake.h): segments, the runs of slots that show the held chunks (each
 * chunk once: gml_pchunk.shown_at), with their blocks; and the segment
 * events of the history, which the allocator logs whenever a chunk's shown
 * slot changes and the client moves into its history ring before its own
 * next entry, so the ring is always in the order memory_viz replays. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "alloc_internal.h"
#include "client_priv.h"
#include "log.h"
#include "util.h"
#include <stdlib.h>
#include <string.h>

/* Turn the allocator's segment log on or off (history on or off). track_lock held. */
void gmli_trace_segments_enable(gml_client *c, int on) {
  gml_allocator *a = &c->alloc;
  pthread_mutex_lock(&a->lock);
  a->seg_log = on;
  a->seg_ev_n = 0;
  pthread_mutex_unlock(&a->lock);
}

/* Move the allocator's logged segment events into the history, adjacent
 * slots of one kind and one region joined into one range. track_lock held. */
void gmli_trace_segments(gml_client *c) {
  gml_allocator *a = &c->alloc;
  pthread_mutex_lock(&a->lock);
  uintptr_t addr = 0;
  size_t size = 0;
  int map = 0;
  for (size_t i = 0; i <= a->seg_ev_n; i++) {
    uintptr_t ev = i < a->seg_ev_n ? a->seg_ev[i] : 0;
    uintptr_t at = ev & ~(uintptr_t)1;
    int m = (int)(ev & 1);
    if (size && i < a->seg_ev_n && m == map && at == addr + size && at != a->regions[0].base &&
        at != a->regions[1].base) {
      size += a->cs;
      continue;
    }
    if (size) gmli_trace_put(c, map ? GML_TRACE_SEGMENT_MAP : GML_TRACE_SEGMENT_UNMAP, addr, size, 0, -1, 0);
    addr = at, size = a->cs, map = m;
  }
  a->seg_ev_n = 0;
  if (a->seg_ev_lost) {
    GML_WARN("history: %llu segment event(s) lost (no memory): snapshots may not replay",
             (unsigned long long)a->seg_ev_lost);
    a->seg_ev_lost = 0;
  }
  pthread_mutex_unlock(&a->lock);
}

static int cmp_info(const void *x, const void *y) {
  const gml_alloc_info *a = x, *b = y;
  return a->addr < b->addr ? -1 : a->addr > b->addr;
}

typedef struct seg_out {
  gml_segment_info *segs;
  gml_alloc_info *blocks;
  size_t seg_cap, block_cap, nsegs, nblocks;
} seg_out;

static void put_block(seg_out *o, const gml_alloc_info *b) {
  if (o->nblocks < o->block_cap) o->blocks[o->nblocks] = *b;
  o->nblocks++;
  if (o->nsegs && o->nsegs <= o->seg_cap) o->segs[o->nsegs - 1].nblocks++;
}

/* Segment [start, end) and its blocks: the sorted records from *j on that begin in it, free space between. */
static void put_segment(seg_out *o, int large, uintptr_t start, uintptr_t end, const gml_alloc_info *recs, size_t nrecs,
                        size_t *j) {
  if (o->nsegs < o->seg_cap) o->segs[o->nsegs] = (gml_segment_info){.addr = start, .size = end - start, .large = large};
  o->nsegs++;
  uintptr_t pos = start;
  while (*j < nrecs && recs[*j].addr < start) ++*j; /* in no segment (paused) */
  for (; *j < nrecs && recs[*j].addr < end; ++*j) {
    gml_alloc_info b = recs[*j];
    if (b.addr < pos) continue; /* overlaps the one before: cannot happen */
    if (b.addr > pos) put_block(o, &(gml_alloc_info){.addr = pos, .size = b.addr - pos, .state = GML_BLOCK_FREE});
    if (b.size > end - b.addr) b.size = end - b.addr;
    put_block(o, &b);
    pos = b.addr + b.size;
  }
  if (pos < end) put_block(o, &(gml_alloc_info){.addr = pos, .size = end - pos, .state = GML_BLOCK_FREE});
}

int gml_segments(gml_client *c, gml_segment_info *segs, size_t seg_cap, size_t *nsegs, gml_alloc_info *blocks,
                 size_t block_cap, size_t *nblocks, uint64_t *trace_seq) {
  if (!c) return GML_EINVAL;
  if ((seg_cap && !segs) || (block_cap && !blocks) || !nsegs || !nblocks)
    return gmli_fail(c, GML_EINVAL, "gml_segments: %s is NULL",
                     !nsegs     ? "nsegs"
                     : !nblocks ? "nblocks"
                     : !segs    ? "segs (with seg_cap > 0)"
                                : "blocks (with block_cap > 0)");
  pthread_mutex_lock(&c->track_lock);
  gml_alloc_info *recs = malloc((c->recs.count + 1) * sizeof *recs);
  if (!recs) {
    pthread_mutex_unlock(&c->track_lock);
    return GML_ENOMEM;
  }
  size_t k = 0;
  for (size_t i = 0; i < c->recs.cap; i++)
    for (gml_rec *r = c->recs.buckets[i]; r; r = r->hnext) {
      recs[k] = (gml_alloc_info){.addr = r->ptr,
                                 .size = r->size,
                                 .requested = r->requested,
                                 .state = r->state,
                                 .stream = r->stream,
                                 .tag = r->tag};
      if (r->pool >= 0) recs[k].pool = c->pools[r->pool].id;
      k++;
    }
  qsort(recs, k, sizeof *recs, cmp_info);
  if (c->trace.cap) gmli_trace_segments(c);
  if (trace_seq) *trace_seq = c->trace.seq;
  gml_allocator *a = &c->alloc;
  seg_out o = {segs, blocks, seg_cap, block_cap, 0, 0};
  size_t j = 0;
  pthread_mutex_lock(&a->lock);
  int lo = a->regions[0].base < a->regions[1].base ? 0 : 1; /* regions in address order, like the records */
  for (int ri = 0; ri < 2; ri++) {
    gml_region *r = &a->regions[ri == 0 ? lo : 1 - lo];
    uint32_t s = r->first_slot, end = r->first_slot + (uint32_t)(r->size / a->cs);
    while (s < end) {
      uint32_t s0 = s;
      while (s < end && a->slot_chunk[s] >= 0 && a->chunks[a->slot_chunk[s]].shown_at == (int32_t)s) s++;
      if (s > s0) put_segment(&o, r == &a->regions[1], slot_addr(a, s0), slot_addr(a, s), recs, k, &j);
      else s++;
    }
  }
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_unlock(&c->track_lock);
  free(recs);
  *nsegs = o.nsegs;
  *nblocks = o.nblocks;
  return 0;
}

void gmli_trace_add(gml_client *c, int action, uintptr_t addr, size_t size, gml_stream stream, int32_t pool,
                    uint64_t tag) {
  if (!c->trace.cap) return;
  gmli_trace_segments(c); /* the segment changes before it come first */
  gmli_trace_put(c, action, addr, size, stream, pool, tag);
}
