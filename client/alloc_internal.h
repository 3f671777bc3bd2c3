/* alloc_internal.h: what the allocator's files share (not for client.c).
 * blocks.h has the state (types, layout, treaps, pools, free-chunk lists),
 * alloc.h the entry points and the design, slots.h the slot ownership
 * helpers of the fast path and the chunk mechanism; this header gathers
 * them for the allocator's files. Which file holds what:
 *   blocks.c       block structs, best-fit treaps, pools, the pointer map
 *                  (blocks.h)
 *   policy.c       every decision, as a plan (policy.h), and the queries
 *                  the mechanism shares with it: does a window need driver
 *                  calls
 *   slots.c        slot mappings (map/unmap/rollback), leases, stream
 *                  fences and harvest: carries chunk plans out (slots.h)
 *   alloc.c        the entry points: fast path, slow paths (carries
 *                  placement plans out), init, stats
 *   planned.c      planned placement (planned.h): serving the plan keeper's
 *                  hits at their offset in a planned range
 *   alloc_check.c  the invariant checker
 *   guard.c        guard mode's setting and fault report, gml_block_of */
#ifndef GML_ALLOC_INTERNAL_H
#define GML_ALLOC_INTERNAL_H
#include "alloc.h"
#include "slots.h"
#include "util.h"
#endif
