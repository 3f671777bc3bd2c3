/* meminfo.c: what a client could get now (meminfo.h). The lake's part is
 * what a lease of it could be served from without waiting on anyone who
 * allocates: the free chunks, the chunks being made, what the limit still
 * lets the creators make (as far as the device has memory for them), and the
 * idle cache of its user's idle clients (which broker_lease asks back before
 * creating); less what other clients' pending leases will take. Quotas are
 * sent apart: the client applies them with its own cache and limit. Free of
 * I/O (the request's handler is dispatch.c's), so test_broker.c tests it. */
#include "meminfo.h"
#include "util.h"

/* Was o told memory it has not leased yet (meminfo.h)? The ms it still holds, else 0. */
static uint64_t promise_left_ms(const broker *b, const broker_client *o, uint64_t now_ns) {
  if (!o->promise_ns || o->closing || o->lease.pending || o->leased_chunks != o->promise_leased) return 0;
  uint64_t until = o->promise_ns + b->promise_ns;
  return now_ns < until ? (until - now_ns + 999999) / 1000000 : 0;
}

void gmli_broker_mem_info(const broker *b, broker_client *c, uint64_t now_ns, uint64_t device_free,
                          gmli_mem_answer *out) {
  const lake *lk = b->lk;
  uint64_t cs = lk->cs, owed = 0, wait = 0;
  uint64_t room = GML_MIN(lake_headroom(lk), device_free / cs); /* new chunks need the device's memory */
  uint64_t avail = (uint64_t)lk->nfree + lk->creating + room;
  for (const broker_client *o = b->clients; o; o = o->next) {
    if (o == c || o->closing) continue;
    avail += gmli_broker_idle_chunks(b, c, o, now_ns);
    if (o->lease.pending) owed += o->lease.count; /* what it still waits for (a stream: what is still to come) */
    uint64_t left = promise_left_ms(b, o, now_ns);
    wait = GML_MAX(wait, left);
  }
  uint64_t quota = 0, qroom = broker_quota_room(b, c, &quota, NULL, 0);
  *out = (gmli_mem_answer){.limit_bytes = lk->limit_bytes,
                           .quota_bytes = quota,
                           .quota_room_bytes = quota ? qroom * cs : 0,
                           .free_bytes = (avail - GML_MIN(avail, owed)) * cs,
                           .wait_ms = (uint32_t)GML_MIN(wait, b->promise_ns / 1000000)};
  if (!wait) c->promise_ns = out->free_bytes && b->promise_ns ? now_ns : 0, c->promise_leased = c->leased_chunks;
}
