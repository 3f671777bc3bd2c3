/* meminfo.c: gml_mem_info, free and total memory as the lake sees it for
 * this client (include/gmlake.h): its cache and limits here, the lake's part
 * from the daemon (MemInfoRequest, daemon/meminfo.c), or the device's when
 * embedded. */
#include "client_priv.h"
#include "alloc.h"
#include "util.h"
#include <time.h>

#define MEMINFO_WAIT_MAX_MS 5000 /* another process's promises, waited for in all (the daemon holds one 2 s) */

/* The lake's part for c (bytes it could lease now, its quota applied) and
 * *total lowered to the lake's limit and c's quota. 0, or an error. */
static int lake_part(gml_client *c, uint64_t *part, uint64_t *total) {
  for (uint64_t waited = 0;;) {
    Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT, *reply = NULL;
    Gmlake__MemInfoRequest q = GMLAKE__MEM_INFO_REQUEST__INIT;
    env.msg_case = GMLAKE__ENVELOPE__MSG_MEM_INFO;
    env.mem_info = &q;
    int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
    int rc = gmli_client_call(c, &env, &reply, fds, &nfds);
    if (rc) return rc;
    if (reply->msg_case != GMLAKE__ENVELOPE__MSG_MEM_INFO_REPLY || nfds) {
      rc = reply->msg_case == GMLAKE__ENVELOPE__MSG_ERROR && reply->error->code < 0 ? reply->error->code : GML_EPROTO;
      gmli_link_free(reply, fds, nfds);
      return rc;
    }
    const Gmlake__MemInfoReply *r = reply->mem_info_reply;
    if (r->wait_ms && waited < MEMINFO_WAIT_MAX_MS) { /* another process was told memory a moment ago */
      uint64_t ms = GML_MIN(r->wait_ms, 20u);
      gmli_link_free(reply, fds, nfds);
      struct timespec ts = {0, (long)(ms * 1000000)};
      nanosleep(&ts, NULL);
      waited += ms;
      continue;
    }
    *total = GML_MIN(*total, r->limit_bytes);
    *part = r->free_bytes;
    if (r->quota_bytes) *total = GML_MIN(*total, r->quota_bytes), *part = GML_MIN(*part, r->quota_room_bytes);
    gmli_link_free(reply, fds, nfds);
    return 0;
  }
}

int gml_mem_info(gml_client *c, size_t *free_bytes, size_t *total_bytes) {
  if (!c) return GML_EINVAL;
  if (!free_bytes || !total_bytes)
    return gmli_fail(c, GML_EINVAL, "gml_mem_info: %s is NULL", !free_bytes ? "free_bytes" : "total_bytes");
  uint64_t dev_free = 0, total = 0, part = 0;
  int rc = c->be->ops->mem_info(c->be, &dev_free, &total);
  if (rc) return gmli_fail(c, rc, "gml_mem_info: the %s backend cannot say the device's memory", c->be->name);
  part = dev_free;
  if (c->mode == GML_MODE_DAEMON && __atomic_load_n(&c->daemon_mem_info, __ATOMIC_RELAXED) &&
      (rc = lake_part(c, &part, &total)))
    return gmli_fail(c, rc, "gml_mem_info: the daemon did not answer: %s", gml_strerror(rc));
  gml_stats st;
  gmli_alloc_stats(&c->alloc, &st);
  uint64_t held = st.reserved + __atomic_load_n(&c->grow.mapped, __ATOMIC_RELAXED);
  uint64_t limit = __atomic_load_n(&c->alloc.limit_bytes, __ATOMIC_RELAXED);
  if (limit) total = GML_MIN(total, limit), part = GML_MIN(part, limit - GML_MIN(limit, held));
  *total_bytes = (size_t)total;
  *free_bytes = (size_t)GML_MIN(st.cached + part, total);
  return 0;
}
