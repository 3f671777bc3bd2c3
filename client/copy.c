/* copy.c: the copy engine (gmlake.h's gml_copy*, copy.h). Each copy takes
 * one of three ways, chosen by its host side:
 *   direct: device to device, or a page-locked host side: the driver copies at
 *     the link's speed; many of them go to it in one batch where it has one;
 *   staged: a pageable host side larger than a slot: pipelined over the
 *     staging slots, taken in turn across copies and calls (H2D: the threads
 *     fill the oldest slot while the link moves the others; D2H: every such
 *     copy of a call as one run, the link filling up to every slot ahead
 *     while the threads empty the oldest);
 *   packed: small pageable ones, one after another in a slot, moved in one batch.
 * Decisions are here; the driver's calls are the backend's (copy_async,
 * copy_batch, host_pinned, event_*). */
#include "client_priv.h"
#include "copy.h"
#include "log.h"
#include "util.h"
#include <stdlib.h>
#include <string.h>

#define PACK_ALIGN 256 /* where packed copies start in a slot: the driver's fast alignment */

static pthread_mutex_t make_lock = PTHREAD_MUTEX_INITIALIZER;

gmli_copier *gmli_copier_get(gml_client *c) {
  gmli_copier *k = __atomic_load_n(&c->copier, __ATOMIC_ACQUIRE);
  if (k) return k;
  pthread_mutex_lock(&make_lock);
  if (!(k = c->copier) && (k = calloc(1, sizeof *k))) {
    gmli_staging_init(k, c->be);
    __atomic_store_n(&c->copier, k, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&make_lock);
  return k;
}

void gmli_copier_destroy(gml_client *c) {
  if (!c->copier) return;
  gmli_mpath_destroy(c->copier);
  gmli_staging_destroy(c->copier);
  free(c->copier);
  c->copier = NULL;
}

/* Copies on their way to the driver: addresses and sizes as it takes them;
 * out: where a packed D2H copy's bytes go from the slot (NULL otherwise). */
typedef struct pend {
  uintptr_t *dst, *src;
  size_t *n;
  char **out;
  size_t count, cap;
} pend;

static int pend_add(pend *p, uintptr_t dst, uintptr_t src, size_t n, char *out) {
  if (p->count == p->cap) {
    size_t cap = p->cap * 2 + 16;
    uintptr_t *d = realloc(p->dst, cap * sizeof *d), *s = d ? realloc(p->src, cap * sizeof *s) : NULL;
    if (d) p->dst = d;
    if (s) p->src = s;
    size_t *m = s ? realloc(p->n, cap * sizeof *m) : NULL;
    if (m) p->n = m;
    char **o = m ? realloc(p->out, cap * sizeof *o) : NULL;
    if (!o) return GML_ENOMEM;
    p->out = o, p->cap = cap;
  }
  p->dst[p->count] = dst, p->src[p->count] = src, p->n[p->count] = n, p->out[p->count] = out;
  p->count++;
  return 0;
}

static void pend_free(pend *p) { free(p->dst), free(p->src), free(p->n), free(p->out); }

/* The pending copies to the driver: one batch where it takes one, else one by one. */
static int issue(gmli_copier *k, pend *p, uintptr_t stream) {
  gml_backend *be = k->be;
  int rc = 0;
  if (p->count > 1 && (be->caps & GML_BACKEND_COPY_BATCH) && stream) {
    rc = be->ops->copy_batch(be, p->dst, p->src, p->n, p->count, stream);
    if (!rc) k->info.driver_batches++, k->info.batched_copies += p->count;
  } else {
    for (size_t i = 0; i < p->count && !rc; i++)
      if (!(rc = be->ops->copy_async(be, p->dst[i], p->src[i], p->n[i], stream))) k->info.driver_copies++;
  }
  return rc;
}

/* H2D from pageable memory larger than a slot: slot after slot, in turn (the oldest is waited for, then
 * filled by the threads while the link moves the others). The source is read before return. *done:
 * bytes handed to the driver before a failure. */
static int staged_h2d(gmli_copier *k, const gml_copy_desc *d, uintptr_t stream, size_t *done) {
  gml_backend *be = k->be;
  size_t ss = k->slot_size, n = d->size;
  int rc = 0;
  for (*done = 0; *done < n && !rc;) {
    size_t len = GML_MIN(ss, n - *done);
    int s = k->next_slot;
    char *sb = k->base + (size_t)s * ss;
    if ((rc = gmli_staging_slot_wait(k, s))) break;
    gmli_par_memcpy(k, sb, (const char *)d->src + *done, len);
    if ((rc = be->ops->copy_async(be, (uintptr_t)d->dst + *done, (uintptr_t)sb, len, stream))) break;
    k->info.driver_copies++;
    rc = gmli_staging_slot_mark(k, s, stream);
    k->next_slot = (s + 1) % GMLI_STAGING_SLOTS;
    *done += len;
  }
  return rc;
}

/* D2H into pageable memory, every such copy of the call as one run of slot-sized pieces, so the link
 * never waits between copies: up to every slot in flight, the oldest emptied by the threads, then
 * refilled. On a failure, *bad and *at: the first piece not written (those before it are). */
static int staged_d2h(gmli_copier *k, const gml_copy_desc **v, size_t count, uintptr_t stream, size_t *bad,
                      size_t *at) {
  gml_backend *be = k->be;
  size_t ss = k->slot_size, issued = 0, emptied = 0, iv = 0, ioff = 0, ev = 0, eoff = 0; /* (copy, offset) of each */
  int rc = 0, base = k->next_slot;
  for (;;) {
    while (!rc && iv < count && issued - emptied < GMLI_STAGING_SLOTS) {
      size_t len = GML_MIN(ss, v[iv]->size - ioff);
      int s = (int)((base + issued) % GMLI_STAGING_SLOTS);
      if ((rc = gmli_staging_slot_wait(k, s))) break;
      rc = be->ops->copy_async(be, (uintptr_t)k->base + (size_t)s * ss, (uintptr_t)v[iv]->src + ioff, len, stream);
      if (!rc) k->info.driver_copies++, rc = gmli_staging_slot_mark(k, s, stream), issued++;
      if ((ioff += len) == v[iv]->size) iv++, ioff = 0;
    }
    if (rc || emptied == issued) break;
    size_t len = GML_MIN(ss, v[ev]->size - eoff);
    int s = (int)((base + emptied) % GMLI_STAGING_SLOTS);
    if ((rc = gmli_staging_slot_wait(k, s))) break;
    gmli_par_memcpy(k, (char *)v[ev]->dst + eoff, k->base + (size_t)s * ss, len);
    emptied++;
    if ((eoff += len) == v[ev]->size) ev++, eoff = 0;
  }
  k->next_slot = (int)((base + issued) % GMLI_STAGING_SLOTS);
  *bad = ev, *at = eoff;
  return rc;
}

/* Packed copies: the slot's pending ones to the driver; D2H ones waited for and copied out. The next
 * slot is waited for (free) before the caller fills it. */
static int pack_flush(gmli_copier *k, pend *p, size_t *fill, uintptr_t stream) {
  if (!p->count) return 0;
  int rc = issue(k, p, stream), s = k->next_slot;
  if (!rc) rc = gmli_staging_slot_mark(k, s, stream);
  if (!rc && p->out[0]) { /* D2H: a pack is all one way */
    rc = gmli_staging_slot_wait(k, s);
    for (size_t i = 0; i < p->count && !rc; i++) memcpy(p->out[i], (const void *)p->dst[i], p->n[i]);
  }
  p->count = 0;
  *fill = 0;
  k->next_slot = (s + 1) % GMLI_STAGING_SLOTS;
  return rc ? rc : gmli_staging_slot_wait(k, k->next_slot);
}

static const char *kind_name(int kind) {
  return kind == GML_COPY_H2D ? "host to device" : kind == GML_COPY_D2H ? "device to host" : "device to device";
}

static int failed(gml_client *c, int rc, const char *fn, const gml_copy_desc *v, const gml_copy_desc *d, size_t at,
                  size_t count, const char *why) {
  char b[32];
  return gmli_fail(c, rc,
                   "%s: copy %zu of %zu (%s, %s) failed%s at byte %zu%s%s: %s; the destination is not written from "
                   "there%s",
                   fn, (size_t)(d - v), count, gmli_format_bytes(d->size, b, sizeof b), kind_name(d->kind),
                   count > 1 ? " or was not done" : "", at, *why ? " on " : "", why, gml_strerror(rc),
                   count > 1 ? " (nor the copies of the call not done)" : "");
}

/* Where one copy goes: the direct list, the H2D pipeline, the D2H run (at the end), or the slot being
 * packed (k->next_slot). */
typedef struct many {
  gmli_copier *k;
  pend direct, packed;
  const gml_copy_desc **d2h; /* large pageable D2H copies, run together at the end */
  size_t nd2h;
  size_t fill;   /* bytes packed in the slot */
  size_t at;     /* a staged copy's bytes done before a failure */
  char why[160]; /* a multi-path copy's failure: which path */
} many;

static int one(many *m, const gml_copy_desc *d, uintptr_t stream) {
  gmli_copier *k = m->k;
  gml_backend *be = k->be;
  const void *host = d->kind == GML_COPY_H2D ? d->src : d->kind == GML_COPY_D2H ? d->dst : NULL;
  int rc = 0;
  m->at = 0;
  if (!d->size) return 0;
  if (!host || be->ops->host_pinned(be, host, d->size) || gmli_staging_ready(k)) {
    if (host && gmli_mpath_wanted(k, d)) { /* several paths at once (mpath.c) */
      if (!(rc = gmli_mpath_copy(k, d, stream, &m->at, m->why, sizeof m->why))) k->info.bytes_direct += d->size;
      return rc;
    }
    rc = pend_add(&m->direct, (uintptr_t)d->dst, (uintptr_t)d->src, d->size, NULL);
    if (!rc) k->info.bytes_direct += d->size;
    return rc;
  }
  if (d->size > k->slot_size && d->kind == GML_COPY_D2H) {
    m->d2h[m->nd2h++] = d;
    k->info.bytes_staged += d->size;
    return 0;
  }
  if (d->size > k->slot_size) { /* the slots are the pipeline's: what is packed goes first */
    if (!(rc = pack_flush(k, &m->packed, &m->fill, stream)) && !(rc = staged_h2d(k, d, stream, &m->at)))
      k->info.bytes_staged += d->size;
    return rc;
  }
  if (!m->packed.count && !m->fill && (rc = gmli_staging_slot_wait(k, k->next_slot))) return rc; /* first use here */
  /* a pack is one way (a D2H one is waited for at its flush), within one slot */
  int other = m->packed.count && !!m->packed.out[0] != (d->kind == GML_COPY_D2H);
  if (other || gmli_round_up(m->fill, PACK_ALIGN) + d->size > k->slot_size)
    if ((rc = pack_flush(k, &m->packed, &m->fill, stream))) return rc;
  m->fill = gmli_round_up(m->fill, PACK_ALIGN);
  char *sb = k->base + (size_t)k->next_slot * k->slot_size + m->fill;
  if (d->kind == GML_COPY_H2D) {
    gmli_par_memcpy(k, sb, d->src, d->size);
    rc = pend_add(&m->packed, (uintptr_t)d->dst, (uintptr_t)sb, d->size, NULL);
  } else {
    rc = pend_add(&m->packed, (uintptr_t)sb, (uintptr_t)d->src, d->size, d->dst);
  }
  m->fill += d->size;
  if (!rc) k->info.bytes_staged += d->size;
  return rc;
}

int gmli_copy_many(gml_client *c, const gml_copy_desc *v, size_t count, uintptr_t stream, int sync, const char *fn) {
  many m = {.k = gmli_copier_get(c), .d2h = calloc(count ? count : 1, sizeof *m.d2h)};
  if (!m.k || !m.d2h) {
    free(m.d2h);
    return gmli_fail(c, GML_ENOMEM, "%s: no memory for the copy engine", fn);
  }
  gml_backend *be = c->be;
  const gml_copy_desc *bad = NULL;
  int rc = 0;
  pthread_mutex_lock(&m.k->lock);
  for (size_t i = 0; i < count && !rc; i++)
    if ((rc = one(&m, &v[i], stream))) bad = &v[i];
  if (!rc && !(rc = pack_flush(m.k, &m.packed, &m.fill, stream)) && m.nd2h) {
    size_t bi = 0;
    if ((rc = staged_d2h(m.k, m.d2h, m.nd2h, stream, &bi, &m.at))) bad = m.d2h[bi];
  }
  if (!rc) { /* what is left: reported against the last copy, at byte 0 (any of them may have failed) */
    bad = &v[count - 1], m.at = 0, m.why[0] = 0;
    if (!(rc = issue(m.k, &m.direct, stream)) && sync) {
      uintptr_t ev;
      if (!(rc = be->ops->event_record(be, stream, &ev))) {
        rc = be->ops->event_wait(be, ev);
        be->ops->event_destroy(be, ev);
      }
    }
  }
  if (rc) /* the slots' copies settled before the pool is used again */
    for (int s = 0; s < GMLI_STAGING_SLOTS; s++) gmli_staging_slot_wait(m.k, s);
  pthread_mutex_unlock(&m.k->lock);
  pend_free(&m.direct);
  pend_free(&m.packed);
  free(m.d2h);
  return rc ? failed(c, rc, fn, v, bad, m.at, count, m.why) : 0;
}

static int check_desc(gml_client *c, const gml_copy_desc *d, const char *fn, size_t i) {
  if (d->kind < GML_COPY_H2D || d->kind > GML_COPY_D2D)
    return gmli_fail(c, GML_EINVAL, "%s: copy %zu: kind %d (GML_COPY_H2D, _D2H or _D2D)", fn, i, d->kind);
  if (d->size && (!d->dst || !d->src))
    return gmli_fail(c, GML_EINVAL, "%s: copy %zu: %s is NULL", fn, i, !d->dst ? "dst" : "src");
  return 0;
}

int gml_copy_async(gml_client *c, void *dst, const void *src, size_t n, int kind, gml_stream stream) {
  if (!c) return GML_EINVAL;
  gml_copy_desc d = {dst, src, n, kind};
  int rc = check_desc(c, &d, "gml_copy_async", 0);
  return rc ? rc : gmli_copy_many(c, &d, 1, stream, 0, "gml_copy_async");
}

int gml_copy(gml_client *c, void *dst, const void *src, size_t n, int kind) {
  if (!c) return GML_EINVAL;
  gml_copy_desc d = {dst, src, n, kind};
  int rc = check_desc(c, &d, "gml_copy", 0);
  return rc ? rc : gmli_copy_many(c, &d, 1, 0, 1, "gml_copy");
}

int gml_copy_batch_async(gml_client *c, const gml_copy_desc *v, size_t count, gml_stream stream) {
  if (!c) return GML_EINVAL;
  if (!v && count) return gmli_fail(c, GML_EINVAL, "gml_copy_batch_async: v is NULL with count %zu", count);
  for (size_t i = 0; i < count; i++) {
    int rc = check_desc(c, &v[i], "gml_copy_batch_async", i);
    if (rc) return rc;
  }
  return count ? gmli_copy_many(c, v, count, stream, 0, "gml_copy_batch_async") : 0;
}

int gml_copy_probe(gml_client *c) {
  if (!c) return GML_EINVAL;
  gmli_copier *k = gmli_copier_get(c);
  if (!k) return GML_ENOMEM;
  pthread_mutex_lock(&k->lock);
  int rc = gmli_mpath_probe(k);
  pthread_mutex_unlock(&k->lock);
  return rc;
}

int gml_copy_info_get(gml_client *c, gml_copy_info *out) {
  if (!c || !out) return GML_EINVAL;
  gmli_copier *k = gmli_copier_get(c);
  if (!k) return GML_ENOMEM;
  pthread_mutex_lock(&k->lock);
  *out = k->info;
  pthread_mutex_unlock(&k->lock);
  return 0;
}
