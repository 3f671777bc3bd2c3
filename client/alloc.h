/* alloc.h: the stitching caching allocator, its interface for client.c
 * and its design. It decides which virtual range serves a request and which
 * physical chunk backs which slot (every such decision: policy.c); the
 * driver calls (map/unmap, events) are a gml_backend's and chunks come from
 * a gml_chunk_source (the daemon, or the backend directly when embedded).
 * Its files: alloc_internal.h says which holds what. They stand in layers,
 * each using only those below it: blocks.h, the state (types, layout,
 * treaps, pools); policy.h, which reads the state and answers with plans;
 * slots.h, the chunk mechanism, which carries chunk plans out; this file's
 * entry points (alloc.c), which carry placement plans out. A policy is
 * thus tested on a state built by hand (tests/test_policy.c).
 *
 * Layout: one large virtual reservation, split into a small-block region
 * (requests < GML_SMALL_LIMIT, packed 512 B apart into shared chunks) and a
 * large-block region. Each region is cut into blocks (address-ordered,
 * coalescing); free blocks sit in best-fit trees keyed (size, address), one
 * per stream. The region is divided into chunk-sized slots; a slot is backed
 * by a physical chunk while some live block touches it ("owned" by the
 * slot). When no live block touches a slot any more, its chunk becomes free
 * but stays mapped there, so a block placed on that slot again needs no
 * driver call. A free chunk may also be mapped into other slots that a
 * request needs: that is stitching, a new contiguous range built from chunks
 * freed anywhere, and the old mappings stay too. A chunk is therefore mapped
 * in several places (aliases) but owned by at most one slot at a time, so
 * nothing is counted twice and no two live blocks share memory; a slot whose
 * chunk is owned elsewhere gets remapped only when a block needs it. Repeated
 * layouts (the same step shapes again) find every mapping in place.
 *
 * Placement: always the best fit (smallest free block, then lowest address),
 * whatever its slots map. It depends only on the sizes and order of the
 * requests, so a repeated step lays out exactly as before and finds its
 * chunks where it left them; the conflicts left (a slot whose chunk another
 * slot of the same step holds) are remapped once and then stay settled.
 * Chunks for slots: the one mapped there if free; else a fresh chunk (mapped
 * nowhere, so no other layout loses it), leased while the held bytes stay
 * within the headroom (default 2%, GMLAKE_HEADROOM) of the peak allocated; else, of the
 * free chunks freed longest ago, the one mapped farthest from the slot.
 * (Placement that chased mapped chunks, tried in sessions 2-3, took chunks
 * other layouts needed and never settled.)
 *
 * Streams: a block freed on stream S serves S at once; other streams get it
 * once an event says S has passed the free (harvest). A chunk freed on S is
 * likewise ready for S, for any stream once a fence passed, for a stream
 * made to wait for S; else the device is synchronized. That holds for a
 * block joining a slot another stream's block holds, too. Borrowing (off by
 * default) replaces waiting on the CPU by waits on the device: a chunk freed
 * on S that T needs costs T a wait for S's event instead of a synchronize;
 * when T's best fit would need driver calls and S's pool holds a block of at
 * most borrow_ratio times the request that would not, T waits for S and
 * takes every block S freed so far into its own pool (split as usual); at
 * most borrow_max such waits pending. The client layer (streams.c) adds
 * frees that wait for recorded streams (record_stream): rather than lease
 * more, the block's stream is made to wait for those uses and the block is
 * freed at once.
 *
 * Guard mode (guard.c): every block is whole guard grains (host: a page;
 * cuda: a chunk), its pointer placed so its usable bytes end where a guard
 * begins: a page protected, or a slot never mapped. */
#ifndef GML_ALLOC_H
#define GML_ALLOC_H
#include "blocks.h"

#define GML_DEFAULT_HEADROOM_PCT 2.0
#define GML_DEFAULT_BORROW 0 /* off until the GPU measures its time cost (docs/pytorch.md, cross-stream borrowing) */
#define GML_DEFAULT_BORROW_RATIO 1.5
#define GML_DEFAULT_BORROW_MAX 8

/* The allocator's settings. It reads no environment: client.c fills this
 * from the library's options (gmli_alloc_config_from_options). */
typedef struct gml_alloc_config {
  double headroom_pct; /* fresh chunks leased past need, % of the peak allocated; 0: none */
  int timing;          /* the caller sums the time of every malloc in malloc_ns */
  int guard;           /* guard mode: 0 off, GML_GUARD_END or GML_GUARD_BOTH (gmli_alloc_set_guard) */
  size_t guard_grain;  /* bytes per guard; 0: the finest the backend can make */
  int guard_bt;        /* guard mode: keep each allocation's backtrace for the fault report */
  int borrow;          /* cross-stream borrowing (gmli_alloc_set_borrow) */
  double borrow_ratio; /* a stream waits for another for a block of at most this times the request */
  int borrow_max;      /* the most borrows waiting on a lender's event at once */
  int stream_map;      /* map a large lease's chunks as they come (src.acquire_stream), GMLAKE_STREAM_MAP */
  int plan;            /* planned placement (planned.h), GMLAKE_PLAN; not in guard mode */
  int64_t plan_at;     /* < 0: plan whenever an iteration repeats; else plan iteration plan_at only */
} gml_alloc_config;
#define GML_ALLOC_CONFIG_DEFAULT                                                                                       \
  {                                                                                                                    \
    GML_DEFAULT_HEADROOM_PCT, 0, 0, 0, 0, GML_DEFAULT_BORROW, GML_DEFAULT_BORROW_RATIO, GML_DEFAULT_BORROW_MAX, 0, 0,  \
        -1                                                                                                             \
  }

/* cfg NULL: GML_ALLOC_CONFIG_DEFAULT. */
int gmli_alloc_init(gml_allocator *a, gml_backend *be, gml_chunk_source src, size_t va_size,
                    const gml_alloc_config *cfg);
void gmli_alloc_destroy(gml_allocator *a); /* unmaps and releases everything */
int gmli_alloc_malloc(gml_allocator *a, size_t size, gml_stream stream, void **ptr);
/* With GML_ALLOC_NO_GROW: GML_EAGAIN (nothing changed) where the request
 * would need chunks leased from the source (borrowing, streams.c, first
 * frees memory that waits for other streams, then asks again). */
#define GML_ALLOC_NO_GROW 1
int gmli_alloc_malloc_ex(gml_allocator *a, size_t size, gml_stream stream, int flags, void **ptr);
int gmli_alloc_free(gml_allocator *a, void *ptr);
/* An iteration ends (gml_step): planned placement's mark; nothing when it is off. 0 or GML_ENOMEM. */
int gmli_alloc_step(gml_allocator *a);
/* Size of a live block (0 if ptr is not one). */
size_t gmli_alloc_size_of(gml_allocator *a, void *ptr);
void gmli_alloc_stats(gml_allocator *a, gml_stats *st);
/* Unmap idle chunks and give up to max_bytes (0 = all) back to the source. */
size_t gmli_alloc_release_idle(gml_allocator *a, size_t max_bytes);
/* Give up to max_bytes (0 = all) of free chunks back without waiting for the
 * device: those mapped nowhere, and mapped ones a fence says the streams are
 * done with (reclaim.c; for a thread other than the caller's). *free_left:
 * free chunks still held afterwards (a later call may give more once the
 * fence passes). */
size_t gmli_alloc_release_ready(gml_allocator *a, size_t max_bytes, size_t *free_left);
/* The chunks behind the live block at ptr, in address order (at most max):
 * *n of them, the block's offset in the first and its size. */
int gmli_alloc_block_phys(gml_allocator *a, void *ptr, gml_phys *phys, size_t max, size_t *n, size_t *offset,
                          size_t *size);
/* Wait for the device once: everything released so far becomes usable
 * from any stream without a wait (before a graph capture). */
int gmli_alloc_quiesce(gml_allocator *a);
/* Consistency check for tests: 0 when every invariant holds, else a GML_E*
 * code with the broken invariant in a->last_error. */
int gmli_alloc_check(gml_allocator *a);

/* Guard mode (guard.c), before the first allocation: GML_GUARD_END or
 * GML_GUARD_BOTH (anything else: off); grain 0 = the finest the backend can
 * guard, else a multiple of it that divides the chunk size. */
int gmli_alloc_set_guard(gml_allocator *a, int mode, size_t grain);
/* Cross-stream borrowing: on/off, the most a block waited for may exceed
 * the request (ratio >= 1), the most waits on a lender pending at once. */
void gmli_alloc_set_borrow(gml_allocator *a, int on, double ratio, int max_waits);
/* gml_block_of / gml_block_list (gmlake.h) on the allocator (guard.c). */
int gmli_alloc_block_of(gml_allocator *a, uintptr_t addr, gml_block_info *info);
int gmli_alloc_block_list(gml_allocator *a, gml_block_info *out, size_t max);
/* For the fault handler: block_of without blocking on the lock (a crash path), with the block's
 * allocation backtrace if one was recorded (bt: GML_GUARD_BT entries); gmli_alloc_owns (blocks.h)
 * says whether an address is this allocator's. */
int gmli_alloc_block_of_crash(gml_allocator *a, uintptr_t addr, gml_block_info *info, void **bt, int *nbt);
/* The settings from the library's options (common/options.h: GMLAKE_HEADROOM,
 * a percentage, 0 turns it off, anything else warns and keeps the default;
 * GMLAKE_TIMING). Defined in client.c: the environment is read once, at
 * gml_open, never inside the allocator. */
struct gml_options;
void gmli_alloc_config_from_options(const struct gml_options *opt, gml_alloc_config *cfg);
#endif
