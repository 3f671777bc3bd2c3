/* lakesize.c: how big the lake is, the broker's other half (no I/O: see broker.h):
 * chunks to order for waiting leases and the prefetch, the back-off after a failed
 * creation, trim and the limit. The lease policy itself is broker.c. */
#include "broker.h"
#include "gmlake.h"
#include "util.h"

uint64_t broker_refill(broker *b, uint64_t now_ns) {
  lake *lk = b->lk;
  if (now_ns < b->create_backoff_until_ns) return 0;
  uint64_t order = 0;
  if (!b->prefetch_suspended && b->preallocate_chunks > lk->total + lk->creating) {
    /* keep the lake at its preallocated size at least */
    order = GML_MIN(b->preallocate_chunks - (lk->total + lk->creating), lake_headroom(lk));
    lk->creating += order;
  }
  /* a waiting lease is served from its own uid's free chunks or clean ones:
   * clean ones (and the prefetch) are what must be made */
  uint64_t waiting = 0;
  int from_idle = 0; /* a lease served from idle clients waits: nothing made for it, no prefetch it would take */
  for (broker_client *c = b->clients; c; c = c->next)
    if (c->lease.pending && c->lease.from_idle) {
      from_idle = 1;
    } else if (c->lease.pending) {
      uint32_t own = lake_free_of(lk, c->uid);
      waiting += c->lease.count > own ? c->lease.count - own : 0;
    }
  uint64_t want = (b->prefetch_suspended || from_idle ? 0 : b->prefetch_chunks) + waiting;
  uint64_t have = lk->nfree_clean + lk->creating;
  if (want > have) {
    uint64_t more = GML_MIN(want - have, lake_headroom(lk));
    lk->creating += more;
    order += more;
  }
  return order;
}

int broker_creation_failed(broker *b, uint64_t now_ns) {
  int starts = now_ns >= b->create_backoff_until_ns;
  b->create_backoff_until_ns = now_ns + BROKER_CREATE_BACKOFF_MS * 1000000ull;
  return starts;
}

void broker_trimmed(broker *b) { b->prefetch_suspended = 1; }

uint32_t broker_keep_free(const broker *b) { return b->prefetch_suspended ? 0 : UINT32_MAX; }

uint32_t broker_trim_over_limit(broker *b) {
  lake *lk = b->lk;
  uint64_t limit = lk->limit_bytes / lk->cs;
  if (lk->total <= limit || !lk->nfree) return 0;
  uint64_t over = lk->total - limit;
  return lake_trim(lk, lk->nfree > over ? (uint32_t)(lk->nfree - over) : 0);
}

int broker_set_limit(broker *b, uint64_t limit_bytes) {
  lake *lk = b->lk;
  if (limit_bytes < lk->cs) return GML_EINVAL;
  lk->limit_bytes = limit_bytes;
  uint64_t limit_chunks = limit_bytes / lk->cs;
  while (lk->total > limit_chunks && lk->nfree) lake_trim(lk, lk->nfree - 1);
  return 0;
}

uint32_t broker_idle_release(broker *b, uint64_t now_ns) {
  lake *lk = b->lk;
  if (!b->idle_since_ns || lk->leased != b->idle_leased) { /* a lease or a return: the idle time starts again */
    b->idle_leased = lk->leased;
    b->idle_since_ns = now_ns;
    return 0;
  }
  if (!b->idle_release_ns || now_ns - b->idle_since_ns < b->idle_release_ns) return 0;
  uint64_t held = lk->total - lk->nfree, keep = b->idle_reserve_chunks; /* leased, parked, shared: not ours to give */
  if (b->preallocate_chunks > held && b->preallocate_chunks - held > keep) keep = b->preallocate_chunks - held;
  if (lk->nfree <= keep) return 0;
  b->prefetch_suspended = 1; /* not made again until demand comes back */
  uint32_t n = lake_trim(lk, (uint32_t)keep);
  b->counters->chunks_released_idle += n;
  return n;
}
