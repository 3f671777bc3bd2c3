/* plan.h: placement planned from a recorded iteration (SmartPool, issue 29
 * item 2), pure C with no allocator in it, so that it can arrive as one more
 * policy of the allocator and be measured by gmlake-replay --plan alone.
 *
 * Training repeats one iteration. Record it (a recording: every allocation's
 * size, stream, and the index of its alloc and free event in the iteration),
 * plan it (every allocation an offset in one range; allocations whose
 * lifetimes overlap never overlap in address, those whose lifetimes are
 * disjoint share memory), then serve later iterations from the plan (the
 * k-th allocation gets the k-th offset, an index lookup) while they match,
 * and say "miss" where they depart so the caller falls back to the
 * stitching allocator. The keeper ties the three together: it records every
 * iteration, takes a plan when an iteration repeats one of the last few, and
 * keeps one per repeating pattern (plan_keep.c, with the server).
 *
 * The planner: greedy offset assignment (TFLite's and SmartPool-like
 * planners). Blocks in an order; each goes into a gap, among the already
 * placed blocks whose lifetimes overlap its own, that holds it, else above
 * the highest of them. The lower bound for any placement is the largest sum
 * of live bytes at one event of the iteration (sizes rounded to the
 * alignment): at that event all those blocks are live at once and may not
 * overlap. Two orders, each with the best-fitting and the lowest gap, and
 * the smallest range kept: by size (large blocks first claim the lifetimes
 * they span, small ones fill their holes) and by breadth (a block's key:
 * the most bytes live at one event of its lifetime; the blocks of the
 * busiest moments, which decide the peak, are placed first). Measured on
 * the traces' plans (gmlake-replay --plan): 64 of the 79 plans the five
 * traces give meet the lower bound exactly, the others are within 0.7%;
 * by breadth, best fit, met it on the 8 plans of three traces compared
 * one by one, by size alone was 0.8-1.0% above it on two of them. On
 * synthetic iterations (tests/test_plan.c) the kept one averages 0.1% above
 * the bound on training-like ones, 1% on random interleavings. Each order
 * costs O(n^2) for n allocations (each block scans the placed ones):
 * milliseconds for the few thousand allocations of a training step.
 *
 * Serving safely: the recording's lifetimes hold only for an iteration that
 * is the recording. A departing one (another shape, frees out of order, an
 * iteration's block freed in the next) may still hold a block at an address
 * that the plan gives the next request. So the plan cuts its range into
 * atoms at every planned block's offset and end (two planned blocks share
 * bytes exactly when they share an atom), and the server counts the live
 * blocks on each atom in a tree (range add, range max): this plan's hits on
 * their own atoms, blocks of an earlier plan (stragglers) and lent blocks on
 * every atom they touch. A hit requires the most live blocks on one of its
 * atoms to be 0: O(log atoms), where a list of the planned blocks sharing
 * its bytes cost 16 to 272 entries per hit on the traces (and a scan of the
 * stragglers on top). */
#ifndef GML_PLAN_H
#define GML_PLAN_H
#include <stddef.h>
#include <stdint.h>

#define GML_PLAN_ALIGN 512        /* the allocator's GML_ALIGN (client/alloc.h): sizes are recorded rounded to it */
#define GML_PLAN_NEVER UINT32_MAX /* free_at of an allocation still live at the iteration's end */
#define GML_PLAN_NONE UINT64_MAX  /* offset of an allocation that is not planned (live past its iteration) */
#define GML_PLAN_REMEMBERED 8     /* past iterations the keeper compares a new one with */

/* One recorded allocation. */
typedef struct gml_plan_rec {
  uint64_t size; /* rounded up to the alignment (at least one unit) */
  uint64_t stream;
  uint32_t alloc_at, free_at; /* event indices within the iteration; free_at GML_PLAN_NEVER: live past its end */
  /* live past its end: the index of its free in the next iteration (GML_PLAN_NEVER: not freed there) */
  uint32_t wrap_free;
} gml_plan_rec;

/* One iteration as the recorder saw it. */
typedef struct gml_plan_recording {
  gml_plan_rec *a;
  uint32_t n, cap;
  uint32_t events; /* allocs and frees recorded so far: the next event's index */
  uint64_t align;
  uint64_t hash; /* of the (size, stream) sequence: two recordings compare in O(1) when they differ */
} gml_plan_recording;

void gmli_plan_rec_init(gml_plan_recording *r, uint64_t align);
void gmli_plan_rec_destroy(gml_plan_recording *r);
void gmli_plan_rec_reset(gml_plan_recording *r); /* empty, keeping its memory */
/* Records an allocation of the iteration; *k: its index. -ENOMEM. */
int gmli_plan_rec_alloc(gml_plan_recording *r, uint64_t size, uint64_t stream, uint32_t *k);
void gmli_plan_rec_free(gml_plan_recording *r, uint32_t k);
/* 1: the same sequence of (rounded size, stream) allocations. */
int gmli_plan_rec_same(const gml_plan_recording *x, const gml_plan_recording *y);
int gmli_plan_rec_copy(gml_plan_recording *dst, const gml_plan_recording *src); /* -ENOMEM */

/* A plan: for each recorded allocation, its offset in one range. */
typedef struct gml_plan {
  uint64_t align;
  uint32_t n;                       /* recorded allocations, planned or not */
  uint64_t hash;                    /* the recording's */
  uint64_t *size, *stream, *offset; /* offset GML_PLAN_NONE: not planned */
  /* atoms: the planned blocks' offsets and ends, sorted and distinct (nbound); atom a is [bound[a], bound[a + 1]);
   * planned block i covers atoms [atom[2i], atom[2i + 1]) and shares bytes with exactly the blocks sharing one */
  uint64_t *bound;
  uint32_t nbound;
  uint32_t *atom;
  uint64_t range;       /* bytes the plan needs: the highest planned end */
  uint64_t lower_bound; /* max live planned bytes at one event: no placement needs less */
  uint32_t planned;     /* allocations with an offset */
  uint64_t bytes;       /* the plan's own memory: what the keeper's byte bound counts */
  uint32_t from_iter;   /* the keeper's: the iteration it was planned from */
  uint32_t used_iter;   /* the keeper's: the last iteration that matched it (or when it was taken) */
} gml_plan;

/* Plans recording r into p (any previous content of p is not freed). -ENOMEM.
 * A block live past the iteration's end and freed in the next one (a
 * gradient freed by the next step's zero_grad) is planned with a lifetime
 * that wraps around: from its allocation to the end, and from the start to
 * its free, the steady state of a repeating iteration; it is not planned
 * where its free comes after its own allocation's index (it would overlap
 * its next instance), nor where it was not freed in the next iteration
 * (weights, optimizer state: the stitching allocator keeps those). */
int gmli_plan_build(gml_plan *p, const gml_plan_recording *r);
void gmli_plan_destroy(gml_plan *p);
int gmli_plan_matches(const gml_plan *p, const gml_plan_recording *r); /* 1: planned from this sequence */
/* The atoms of p that bytes [offset, offset + size) touch, [*a0, *a1): a
 * planned block's own exactly; any other span rounded out. */
void gmli_plan_atoms_of(const gml_plan *p, uint64_t offset, uint64_t size, uint32_t *a0, uint32_t *a1);

/* What serving one allocation gave: keep it with the block, hand it back on its free. */
typedef struct gml_plan_grant {
  uint64_t offset, size; /* offset in the plan's range (a hit) */
  uint32_t index;        /* the planned block, GML_PLAN_NEVER on a miss */
  uint32_t lent;  /* a miss lent whole granules of the range (offset and size say which): its lent slot + 1; else 0 */
  uint32_t epoch; /* the plan that served it */
  uint32_t rec_iter, rec_k; /* the keeper's iteration and recording index, for recording its free */
} gml_plan_grant;

enum gml_plan_verdict {
  GML_PLAN_HIT = 0,
  GML_PLAN_MISS_NOPLAN,    /* no plan yet */
  GML_PLAN_MISS_SHAPE,     /* the k-th allocation departs: size, stream, or past the recording's end */
  GML_PLAN_MISS_UNPLANNED, /* matches, but the recording's was live past its iteration */
  GML_PLAN_MISS_OCCUPIED,  /* matches, but a live block holds some of its bytes */
  GML_PLAN_VERDICTS
};

typedef struct gml_plan_span {
  uint64_t offset, size;
} gml_plan_span;

/* Serves iterations from one plan at a time. */
typedef struct gml_plan_server {
  const gml_plan *plan;     /* NULL: none */
  uint32_t epoch;           /* which plan: grants of an earlier one are stragglers */
  uint8_t *live;            /* per planned block: served and not freed */
  uint32_t next;            /* allocations of the current iteration so far */
  gml_plan_span *straggler; /* live blocks of earlier plans, in the same range */
  uint32_t nstraggler, straggler_cap;
  uint64_t verdicts[GML_PLAN_VERDICTS];
  /* live blocks per atom of the plan (hits, stragglers, lent blocks rounded out to atoms): a tree of
   * 2 * tree_leaves nodes, each the max over its atoms and an add pending for all of them */
  int32_t *tmax, *tadd;
  uint32_t tree_leaves, tree_cap;
  uint64_t tree_visits;     /* nodes visited by hits (the check and the count): the hit path's cost */
  gml_plan_span *lent_span; /* the live lent blocks (size 0: a free slot; a lent grant's lent - 1 names its slot) */
  uint32_t nlent_span, lent_span_cap;
  /* Lending: the unit (the allocator's chunk; 0, the default: never lent), and per granule of the range the
   * live blocks in it (hits, stragglers, lent misses) */
  uint64_t granule;
  uint32_t *occ;
  uint32_t ngranules;
  uint64_t lends, lent_bytes; /* misses lent bytes of the range, and their bytes (in all) */
} gml_plan_server;

void gmli_plan_server_init(gml_plan_server *s);
void gmli_plan_server_destroy(gml_plan_server *s);
/* Serves from p from now on (the allocation index k goes on); the old
 * plan's live blocks stay occupied as stragglers. p must outlive its use.
 * -ENOMEM (nothing changed). */
int gmli_plan_server_install(gml_plan_server *s, const gml_plan *p);
void gmli_plan_server_step(gml_plan_server *s); /* an iteration begins: k back to 0 */
enum gml_plan_verdict gmli_plan_serve_alloc(gml_plan_server *s, uint64_t size, uint64_t stream, gml_plan_grant *g);
/* A departing iteration need not hold the whole range on top of its
 * misses: a miss of at least one granule may be lent whole granules of the
 * plan's range that nothing live touches (g->lent, g->offset, g->size: the
 * caller places the block there, as it places a hit). A lent granule is
 * occupied: no planned slot over it is handed out until the lent block is
 * freed. 1: lent; 0: not (lending off, no plan, too small, no room). */
int gmli_plan_server_lend(gml_plan_server *s, uint64_t size, gml_plan_grant *g);
void gmli_plan_serve_free(gml_plan_server *s, const gml_plan_grant *g);

/* Records every iteration, keeps a plan per repeating pattern, serves.
 *
 * Shapes vary (a few batch shapes cycling, sequence lengths that come
 * back), so one plan at a time is rebuilt over and over. The keeper keeps
 * up to GML_PLAN_KEPT plans, one per pattern (a pattern: the sequence of
 * rounded sizes and streams; its hash plus a full compare tell two apart),
 * and picks the plan of a new iteration from its first allocations: the
 * plans whose prefix matches what the iteration allocated so far are the
 * candidates; while the one being served is among them it stays, otherwise
 * the most recently used candidate is installed in its place (the blocks
 * the old one served stay occupied as stragglers). Plans no iteration
 * matched for GML_PLAN_STALE iterations are dropped, and the least recently
 * used go first when the count or the byte bound (max_bytes, of the plans'
 * own memory) would be passed; the plan being served is never dropped. */
#define GML_PLAN_KEPT 8                   /* plans kept at most */
#define GML_PLAN_STALE 64                 /* iterations without a match after which a plan is dropped */
#define GML_PLAN_KEPT_BYTES (64ull << 20) /* default byte bound of the kept plans */

typedef struct gml_plan_keeper {
  /* < 0: plan when an iteration repeats; else plan that iteration only (once the next one ended: its wrap
   * frees are known), never rebuild */
  int64_t take_at;
  uint32_t iteration; /* the current one, from 0 */
  gml_plan_recording cur;
  gml_plan_recording past[GML_PLAN_REMEMBERED]; /* the last ones, a ring; planned from, as their wrap frees are known */
  uint32_t past_iter[GML_PLAN_REMEMBERED];
  uint32_t npast;
  /* the ring's slot of the previous iteration (its blocks' frees in this one are its wrap frees); -1: none */
  int32_t prev;
  gml_plan *kept[GML_PLAN_KEPT]; /* on the heap, NULL: a free slot; the server's old one stays valid while a new one
                                  * is installed */
  uint32_t nkept;
  uint64_t kept_bytes, max_bytes; /* max_bytes: GML_PLAN_KEPT_BYTES unless changed after init */
  uint32_t cand;                  /* kept slots whose prefix matches the current iteration so far (bit i: kept[i]) */
  /* the iteration departed from every kept plan: its misses may be lent the range's free granules (srv.granule) */
  int departed;
  gml_plan *plan;        /* the one being served, one of kept; NULL: none yet */
  uint32_t plans_taken;  /* plans built: the first and each new pattern's */
  uint32_t planned_from; /* the iteration the served plan was taken from */
  uint32_t switches;     /* plans installed in place of another (at an iteration's start or early in it) */
  uint32_t dropped;      /* plans dropped: stale, or over the count or byte bound */
  double plan_seconds, plan_seconds_max; /* time spent planning (gmli_plan_build), in all and the longest */
  gml_plan_server srv;
} gml_plan_keeper;

void gmli_plan_keeper_init(gml_plan_keeper *kp, uint64_t align, int64_t take_at);
void gmli_plan_keeper_destroy(gml_plan_keeper *kp);
/* Serves and records one allocation: GML_PLAN_HIT (g->offset in the plan's
 * range) or a miss (the caller allocates elsewhere, or at g->offset where
 * g->lent). May switch to another kept plan first, when this iteration so
 * far matches it and not the one served. Once the iteration departs from
 * every kept plan, its misses are lent the range's free granules where
 * srv.granule is set (a matching iteration's are not: they would take the
 * slots its later allocations are planned in). -ENOMEM from recording or
 * switching. */
int gmli_plan_keeper_alloc(gml_plan_keeper *kp, uint64_t size, uint64_t stream, gml_plan_grant *g);
void gmli_plan_keeper_free(gml_plan_keeper *kp, const gml_plan_grant *g);
/* The iteration ended: 1 when a new plan was taken (serving it from the next), 0, or -ENOMEM.
 * Automatic: when this iteration matched a kept plan, that plan is the
 * most recently used; else when it repeats a remembered one (the same
 * sequence), a plan is built from the remembered one, whose wrap frees the
 * iteration after it gave, kept, and served from the next iteration. */
int gmli_plan_keeper_step(gml_plan_keeper *kp);
/* Takes back the allocation gmli_plan_keeper_alloc just served and recorded
 * (g; hash_before: kp->cur.hash before that call), as if it had not come:
 * the allocator found it could not serve the request after all (a request
 * that must not lease, GML_ALLOC_NO_GROW, asked again later; out of memory).
 * Only the latest allocation, with nothing recorded since. */
void gmli_plan_keeper_undo(gml_plan_keeper *kp, const gml_plan_grant *g, uint64_t hash_before);

/* Grows *v (elements of elem bytes, *cap of them) to hold need, doubling from 64: 0 or -ENOMEM
 * (plan.c; plan_keep.c uses it too). */
int gmli_plan_grow(void **v, uint32_t *cap, uint32_t need, size_t elem);

#endif
