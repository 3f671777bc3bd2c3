/* swap_use.c: swapping's setting and numbers (GMLAKE_SWAP; the planner is
 * swap.c, the carrying out is the framework layer's: python/gmlake/swap.py).
 * gml_swap_target says whether swapping is on and what cap a plan must fit;
 * gml_swap_note takes what the layer copied, for gml_stats and the usage
 * report (`gmlakectl clients`). */
#include "client_priv.h"
#include "options.h"
#include "util.h"
#include <string.h>

/* What the allocator holds beyond its allocations (chunk rounding, fragmentation: reserved/allocated measured
 * at 1.02 on the trainings), taken off a limit so that a plan of allocated bytes fits the limit's reserved ones. */
#define SWAP_MARGIN_PCT 3

int gml_swap_target(gml_client *c, uint64_t *cap_bytes) {
  if (!cap_bytes) return c ? gmli_fail(c, GML_EINVAL, "gml_swap_target: cap_bytes is NULL") : GML_EINVAL;
  *cap_bytes = 0;
  const char *v = gmli_env(GML_ENV_SWAP);
  if (!v || !strcmp(v, "0")) return 0;
  uint64_t total = 0, freeb = 0, cap = 0;
  int share = strchr(v, '%') != NULL;
  if (c && c->be->ops->mem_info(c->be, &freeb, &total)) total = 0;
  if (!strcmp(v, "1")) {
    if (c) {
      pthread_mutex_lock(&c->alloc.lock);
      cap = c->alloc.limit_bytes;
      pthread_mutex_unlock(&c->alloc.lock);
    }
    if (!cap) cap = total;
  } else if (gmli_parse_size(v, share ? (total ? total : 100) : 0, &cap) || (!cap && (!share || total))) {
    return c ? gmli_fail(c, GML_EINVAL, "GMLAKE_SWAP=%s: not 0, 1, a size in bytes or a share of the device (N%%)", v)
             : GML_EINVAL;
  } else if (share && !total) {
    cap = 0; /* a share of a device whose size is not known here (no client): said once there is one */
  }
  *cap_bytes = cap - cap / 100 * SWAP_MARGIN_PCT;
  return 1;
}

int gml_swap_note(gml_client *c, uint64_t out_bytes, uint64_t in_bytes, uint64_t copy_ns, uint64_t host_bytes) {
  if (!c) return GML_EINVAL;
  __atomic_add_fetch(&c->swap_out, out_bytes, __ATOMIC_RELAXED);
  __atomic_add_fetch(&c->swap_in, in_bytes, __ATOMIC_RELAXED);
  __atomic_add_fetch(&c->swap_ns, copy_ns, __ATOMIC_RELAXED);
  __atomic_store_n(&c->swap_host, host_bytes, __ATOMIC_RELAXED);
  return 0;
}
