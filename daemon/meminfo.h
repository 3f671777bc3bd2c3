/* meminfo.h: what a client could get now (MemInfoRequest: gml_mem_info, and
 * torch.cuda.mem_get_info under gmlake.enable()), decided free of I/O like
 * the broker's leases (dispatch.c answers the request with it). */
#ifndef GML_MEMINFO_H
#define GML_MEMINFO_H
#include "broker.h"
#include <stdint.h>

/* How long an answer holds as a promise: another client asking meanwhile is
 * told to ask again (wait_ms) until the one told leases (a lease started or
 * served since), asks again, leaves, or this long has passed. Two processes
 * that size themselves from their free memory at once then see each other's
 * share instead of both counting the same chunks. */
/* (MEMINFO_PROMISE_MS, broker.h: the default of --meminfo-promise-ms, the broker's promise_ns) */

typedef struct gmli_mem_answer {
  uint64_t limit_bytes;      /* the lake's */
  uint64_t quota_bytes;      /* the tightest quota covering the client (0: none) */
  uint64_t quota_room_bytes; /* what it leaves (with quota_bytes) */
  uint64_t free_bytes;       /* the lake's part: free, creatable (within device_free), idle clients' of its uid,
                              * less others' pending leases (no quota applied) */
  uint32_t wait_ms;          /* > 0: another client's promise is outstanding; nothing was promised to c */
} gmli_mem_answer;

/* c's answer at now_ns, device_free bytes free on the device (outside the
 * lake): a promise recorded in c unless out->wait_ms says to ask again. */
void gmli_broker_mem_info(const broker *b, broker_client *c, uint64_t now_ns, uint64_t device_free,
                          gmli_mem_answer *out);
#endif
