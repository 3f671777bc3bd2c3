/* planned.h: placement planned from a recorded iteration (SmartPool, issue
 * 29), served by the allocator: the mechanism around plan.h's keeper.
 *
 * With planned placement on (GMLAKE_PLAN), every request and free goes
 * through the keeper, which records the iteration (gml_step marks where one
 * ends) and, once an iteration repeats, plans it: every allocation an offset
 * in one range. The allocator holds that range as a planned range: a block
 * of the large region's virtual addresses (chunk-aligned, a whole number of
 * slots), which the best-fit search never sees; it claims no slot itself.
 * A request the keeper serves (a hit: the k-th allocation of the iteration
 * matches the plan's k-th in size and stream, and nothing live holds its
 * bytes) becomes a block at base + offset: no search, the slots claimed as
 * any block claims them. A repeated iteration finds each slot's chunk still
 * mapped where it left it, so after the first served iteration it makes no
 * driver call; chunks are the allocator's as ever, so reserved counts them
 * once, and allocated counts live blocks, planned or not.
 *
 * What the plan does not serve goes to the stitching allocator: a miss
 * (another shape, another order, extra allocations, what lives past its
 * iteration) or a hit the mechanism refuses: bytes last freed on another
 * stream that a fence has not passed yet (the range keeps, per slot, the
 * stream and tick of its last free), or an offset past the range held (a
 * plan larger than the range, while the old range still has live blocks).
 * The keeper's server never hands out planned bytes that something lives
 * in (its atom tree counts every live block in the range, those of earlier
 * plans too); gmli_alloc_check verifies it on its own (no two live planned
 * blocks overlap, each lies in a range). A departing iteration's large
 * misses may be lent whole free chunks of the range (the keeper's lending),
 * so dynamic shapes do not hold the range and the stitched memory both.
 *
 * Reserved memory: an iteration served whole by the range (every allocation
 * a hit, or one the plan leaves to the stitching allocator), the first since
 * the range came or since an iteration departed, ends with the chunks the
 * slots of the kept plans map and those of what lives outside the range; the
 * stitching allocator's other free chunks (the earlier or departing
 * iterations' layout) are given back then (a device synchronize and an unmap
 * each): what the plans do not need is not held beside them. Iterations that
 * follow a plan lease nothing, map nothing; a workload whose shapes never
 * repeat has no iteration served whole, so nothing is given back there.
 * Where departures recur (a few shapes, one not yet planned), each give-back
 * would be mapped again at the next one: a departure within 4 x the wait of
 * a give-back doubles the run of whole iterations the next one waits for
 * (1 at first, at most GMLI_TRIM_WAIT_MAX).
 *
 * The decision is policy.c's (gml_policy_place_at: a GML_PLACE_AT plan, or
 * the stitching allocator's); this file carries it out. */
#ifndef GML_PLANNED_H
#define GML_PLANNED_H
#include "blocks.h"
#include "plan.h"

/* Planning gives up where plans do not hold: once GMLI_PLAN_GIVE_UP of the last GMLI_PLAN_JUDGED
 * iterations that had a plan departed from it (dynamic shapes: each departure pays misses, a new plan,
 * give-backs and mappings; on the H200 a dynamically padded ViT ran 40.8 ms/step with plans, 25.9
 * without), every request goes to the stitching allocator from then on, the range's address space back
 * to it once nothing lives there; a warning says so. */
#define GMLI_PLAN_JUDGED 6
#define GMLI_PLAN_GIVE_UP 4
#define GMLI_TRIM_WAIT_MAX 16 /* whole iterations in a row a give-back waits for at most (planned.h: reserved memory) */

typedef struct gmli_range {
  gml_block *blk; /* its block in the large region (GMLI_BLOCK_RANGE) */
  uintptr_t base;
  size_t size;             /* a whole number of chunks */
  uint64_t live;           /* planned blocks in it (paused ones too) */
  gml_stream *free_stream; /* per slot: the stream of the last free there (GML_STREAM_MIXED: several) */
  uint64_t *free_tick;     /* ... and its a->tick (0: never freed) */
  struct gmli_range *next; /* on the retired list: replaced, freed when its last block goes */
} gmli_range;

typedef struct gmli_planned {
  gml_plan_keeper kp;
  gmli_range *cur;        /* where the plan is served (NULL: none yet) */
  gmli_range *retired;    /* replaced ranges with live blocks still in them */
  const gml_plan *served; /* the plan cur was sized for */
  uint64_t steps, hits, lent, misses, refused, range_bytes;
  uint64_t step_hits, step_misses; /* of the iteration under way */
  uint64_t trimmed_chunks;         /* given back at iterations served whole (planned.h: reserved memory) */
  int cur_dirty;                   /* an iteration departed (or cur is new) since the last give-back */
  uint32_t whole_run, trim_wait;   /* iterations served whole in a row; how many a give-back waits for */
  uint64_t trim_at;                /* the iteration (steps) of the last give-back, 0: none */
  uint32_t departed_bits;          /* the last GMLI_PLAN_JUDGED iterations that had a plan: 1 where one departed */
  int off;                         /* planning given up (too many departures): served as without a plan */
} gmli_planned;

/* Departures of the last GMLI_PLAN_JUDGED planned iterations that give planning up (GMLI_PLAN_GIVE_UP;
 * tests that exercise departures at length set more than GMLI_PLAN_JUDGED: never). */
GML_HIDDEN extern int gmli_plan_give_up;
/* Planned placement on (take_at < 0: a plan whenever an iteration repeats,
 * one per pattern; else iteration take_at's only). GML_ENOMEM. */
GML_HIDDEN int gmli_planned_init(gml_allocator *a, int64_t take_at);
/* At destroy, before the regions' blocks go: the planned blocks' structs and the state. */
GML_HIDDEN void gmli_planned_destroy(gml_allocator *a);
/* A request of size bytes (rsize rounded to GML_ALIGN) on stream, a->lock
 * held: recorded, then served from the plan (0, *ptr set) or not (1: *g is
 * what the stitching allocator's block keeps; gmli_planned_unserved with
 * *hash_before when that fails after all); with no_grow, GML_EAGAIN
 * where it would lease (gmli_alloc_malloc_ex's GML_ALLOC_NO_GROW; nothing recorded). */
GML_HIDDEN int gmli_planned_malloc(gml_allocator *a, size_t size, size_t rsize, gml_stream stream, int no_grow,
                                   void **ptr, gml_plan_grant *g, uint64_t *hash_before);
/* The request gmli_planned_malloc passed on was not served at all: not recorded after all. */
GML_HIDDEN void gmli_planned_unserved(gml_allocator *a, const gml_plan_grant *g, uint64_t hash_before);
/* Free of a block that is not a planned one (its grant recorded). */
GML_HIDDEN void gmli_planned_note_free(gml_allocator *a, const gml_block *b);
/* Free of planned block b (out of the pointer map already): its slots released unless paused, then gone. */
GML_HIDDEN void gmli_planned_free(gml_allocator *a, gml_block *b, int slots_held);
/* An iteration ended (gml_step): GML_ENOMEM, else 0. */
GML_HIDDEN int gmli_planned_step(gml_allocator *a);
/* The live planned block holding addr, NULL if none (gml_block_of). */
GML_HIDDEN const gml_block *gmli_planned_block_at(const gml_allocator *a, uintptr_t addr);
/* gmli_alloc_check's part: counts the live planned blocks' slots into use, their bytes and number, and checks
 * that each lies in a range, none overlaps another and each range's count; 0 or 1 with why in a->last_error. */
GML_HIDDEN int gmli_planned_check(gml_allocator *a, uint32_t *use, uint64_t *allocated, uint64_t *live);
/* The numbers of gml_stats (a->lock held). */
GML_HIDDEN void gmli_planned_stats(const gml_allocator *a, gml_stats *st);
#endif
