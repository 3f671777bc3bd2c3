/* client.c: the client handle's base, below every part that uses it: why a
 * call failed (gmli_fail, gml_last_error), the handle's plain accessors, the
 * count of chunks no lake counts and the chunk holders' registry. struct gml_client and the map of the
 * library's internal functions are in client_priv.h; gml_open and gml_close,
 * which put the parts together, are in open.c; the conversation with the
 * daemon is link.c's, lease.c's, report.c's and keeper.c's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "gmlake.h"
#include "log.h"
#include <stdarg.h>
#include <stdio.h>

int gmli_fail(gml_client *c, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
  va_end(ap);
  return rc;
}

const char *gml_last_error(gml_client *c) { return c ? c->last_error : "no client"; }

int gml_write(gml_client *c, void *dst, const void *src, size_t n) {
  if (!c) return GML_EINVAL;
  if (!dst || !src) return gmli_fail(c, GML_EINVAL, "gml_write: %s is NULL", !dst ? "dst" : "src");
  return c->be->ops->write(c->be, (uintptr_t)dst, src, n);
}

int gml_read(gml_client *c, void *dst, const void *src, size_t n) {
  if (!c) return GML_EINVAL;
  if (!dst || !src) return gmli_fail(c, GML_EINVAL, "gml_read: %s is NULL", !dst ? "dst" : "src");
  return c->be->ops->read(c->be, (uintptr_t)src, dst, n);
}

int gml_block_of(gml_client *c, const void *addr, gml_block_info *info) {
  if (!c) return GML_EINVAL;
  if (!info) return gmli_fail(c, GML_EINVAL, "gml_block_of: info is NULL");
  int rc = gmli_alloc_block_of(&c->alloc, (uintptr_t)addr, info);
  return rc ? gmli_fail(c, rc, "gml_block_of: %p is in, just past or in the guard of no live allocation", addr) : 0;
}

int gml_block_list(gml_client *c, gml_block_info *out, size_t max) {
  if (!c) return GML_EINVAL;
  if (!out && max) return gmli_fail(c, GML_EINVAL, "gml_block_list: out is NULL with max %zu", max);
  return gmli_alloc_block_list(&c->alloc, out, max);
}

void gmli_client_uncounted_gone(gml_client *c) { __atomic_fetch_sub(&c->uncounted_chunks, 1, __ATOMIC_RELAXED); }

void gmli_holder_add(gml_client *c, const gml_holder_ops *ops) {
  if (c->nholders < GML_MAX_HOLDERS) c->holders[c->nholders++] = ops;
  else GML_ERR("more than %d chunk holders: one is left out of reconnections and usage reports", GML_MAX_HOLDERS);
}
