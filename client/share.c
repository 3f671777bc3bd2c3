/* share.c: shared read-only memory, the client's side (gmlake.h:
 * gml_share / gml_attach / gml_dedup; the daemon's side is daemon/shares.c).
 * The unit is a whole growable range: its chunks are the client's own and
 * nothing else maps them, so they can leave the client for the share. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "log.h"
#include "util.h"
#include "wire.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(gml_client *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(gml_client *c, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
  va_end(ap);
  return rc;
}

static void close_fds(int *fds, int n) {
  for (int i = 0; i < n; i++) close(fds[i]);
}

/* One call; an Error reply becomes its code (and last_error). */
static int call(gml_client *c, Gmlake__Envelope *env, Gmlake__Envelope **reply, int *fds, int *nfds, const char *what) {
  *nfds = 0;
  int rc = gmli_client_call(c, env, reply, fds, nfds);
  if (rc) return fail(c, rc, "%s: the daemon: %s", what, gml_strerror(rc));
  if ((*reply)->msg_case == GMLAKE__ENVELOPE__MSG_ERROR) {
    rc = (*reply)->error->code < 0 ? (*reply)->error->code : GML_EPROTO;
    fail(c, rc, "%s: %s", what, (*reply)->error->message);
    gmlake__envelope__free_unpacked(*reply, NULL);
    close_fds(fds, *nfds);
    return rc;
  }
  return 0;
}

static void send_detach(gml_client *c, const char *key) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT, *r;
  Gmlake__DetachRequest d = GMLAKE__DETACH_REQUEST__INIT;
  d.key = (char *)key;
  env.msg_case = GMLAKE__ENVELOPE__MSG_DETACH;
  env.detach = &d;
  int fds[GML_MAX_LEASE_CHUNKS], nfds;
  if (call(c, &env, &r, fds, &nfds, "detach") == 0) {
    close_fds(fds, nfds);
    gmlake__envelope__free_unpacked(r, NULL);
  } else {
    GML_WARN("%s", c->last_error);
  }
}

static void pub_forget(gml_growable *g) {
  free(g->pub.meta), free(g->pub.allow);
  memset(&g->pub, 0, sizeof g->pub);
}

static void set_lost(gml_growable *g, int lost) {
  int was = g->lost == GML_SHARE_PUBLISH || g->lost == GML_SHARE_REGISTER;
  int now = lost == GML_SHARE_PUBLISH || lost == GML_SHARE_REGISTER;
  __atomic_fetch_add(&g->c->grow.lost_shares, now - was, __ATOMIC_RELAXED); /* read without grow.lock by the keeper */
  g->lost = lost;
}

/* A shared range's chunks at close or destroy: unmapped, released, detached
 * (growable.c calls it as c->grow.release_shared). grow.lock held. */
static int release_range(gml_growable *g) {
  gml_client *c = g->c;
  gml_backend *be = c->be;
  /* adopted by a restarted daemon and not (yet) published again: leased to us, returned like our own */
  int ours = g->lost == GML_SHARE_OWNED || g->lost == GML_SHARE_PUBLISH;
  if (g->nmapped && be->ops->synchronize(be)) GML_WARN("share '%s': synchronize failed before unmapping", g->key);
  for (size_t s = 0; s < g->nslots; s++) {
    if (!g->mapped[s]) continue;
    if (be->ops->unmap(be, g->base + s * g->cs, g->cs)) return GML_EBACKEND;
    if (ours) c->alloc.src.release(c->alloc.src.ctx, 1, &g->phys[s], &g->ids[s]);
    else be->ops->chunk_release(be, g->phys[s]); /* the share's: not returned, only our handle goes */
    if (!ours && (g->ids[s] & GML_ID_UNCOUNTED))
      gmli_client_uncounted_gone(c); /* orphaned by a daemon that took none */
    g->mapped[s] = 0;
    g->nmapped--;
    c->grow.shared -= g->cs;
  }
  if (g->lost == GML_SHARE_OK) send_detach(c, g->key); /* else the daemon does not count us its mapper */
  set_lost(g, GML_SHARE_OK);
  pub_forget(g);
  g->shared = GML_GROW_OWN;
  return 0;
}

/* The ShareRequest of n chunks of g (g->ids) as g->pub says; grow.lock held. */
static int publish(gml_client *c, gml_growable *g, size_t n, const char *key, const char *what, int restored) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT, *r;
  Gmlake__ShareRequest q = GMLAKE__SHARE_REQUEST__INIT;
  q.key = (char *)key;
  q.n_chunk_ids = n;
  q.chunk_ids = g->ids;
  q.size = g->pub.size;
  q.content_hash.data = g->pub.hash, q.content_hash.len = g->pub.hash_len;
  q.meta.data = g->pub.meta, q.meta.len = g->pub.meta_len;
  q.allow_uids = g->pub.allow, q.n_allow_uids = g->pub.n_allow;
  q.allow_any_uid = g->pub.any != 0;
  q.restored = restored != 0;
  env.msg_case = GMLAKE__ENVELOPE__MSG_SHARE;
  env.share = &q;
  int fds[GML_MAX_LEASE_CHUNKS], nfds;
  int rc = call(c, &env, &r, fds, &nfds, what);
  if (!rc) {
    close_fds(fds, nfds);
    if (r->msg_case != GMLAKE__ENVELOPE__MSG_SHARE_REPLY) rc = fail(c, GML_EPROTO, "%s: unexpected reply", what);
    gmlake__envelope__free_unpacked(r, NULL);
  }
  return rc;
}

/* What the daemon takes (wire.h): checked here, since a request it refuses
 * is a protocol error there, which closes the connection (the caller got
 * GML_EDAEMON, "daemon unreachable or gone", and its chunks were parked);
 * an attach's key too (attach: NAME@UID allowed), which the daemon answered
 * "no share" whatever was wrong with it */
static int check_key(gml_client *c, const char *what, const char *key, int attach) {
  if (!key) return fail(c, GML_EINVAL, "%s: key is NULL", what);
  size_t bad;
  int ok = gmli_share_key_ok(key, &bad);
  if (ok && (attach || !strchr(key, '@'))) return 0;
  char name[GML_SHARE_KEY_MAX + 1];
  uint32_t uid;
  if (attach && gmli_share_key_owner(key, name, &uid)) return 0; /* NAME@UID (wire.c) */
  if (ok) /* a published key: no '@', which would read as another user's share */
    return fail(c, GML_EINVAL,
                "%s: the key '%s' has a '@': NAME@UID names user UID's share NAME, so a published key has none", what,
                key);
  const char *other = attach ? " (another user's share: NAME@UID)" : "";
  if (bad != SIZE_MAX)
    return fail(c, GML_EINVAL,
                "%s: the key's byte %zu is 0x%02x: a key is 1 to %d bytes of '!' to '~' (no space, tab or control)%s",
                what, bad, (unsigned char)key[bad], GML_SHARE_KEY_MAX, other);
  return fail(c, GML_EINVAL, "%s: a key of %zu bytes: a key is 1 to %d bytes of '!' to '~'%s", what, strlen(key),
              GML_SHARE_KEY_MAX, other);
}

int gml_share(gml_growable *g, size_t size, const char *key, const gml_share_opts *o) {
  if (!g) return GML_EINVAL;
  gml_client *c = g->c;
  if (!size || size > g->size)
    return fail(c, GML_EINVAL, "gml_share: size %zu: 1 to the range's %zu bytes", size, g->size);
  int krc = check_key(c, "gml_share", key, 0);
  if (krc) return krc;
  if (o && o->meta_len > GML_SHARE_META_MAX)
    return fail(c, GML_EINVAL, "gml_share '%s': meta of %zu bytes, at most %d", key, o->meta_len, GML_SHARE_META_MAX);
  if (o && o->hash && o->hash_len > GML_SHARE_HASH_MAX)
    return fail(c, GML_EINVAL, "gml_share '%s': a hash of %zu bytes, at most %d", key, o->hash_len, GML_SHARE_HASH_MAX);
  if (o && o->n_allow_uids > GML_SHARE_UIDS_MAX)
    return fail(c, GML_EINVAL, "gml_share '%s': %zu allow_uids, at most %d (or allow_any_uid)", key, o->n_allow_uids,
                GML_SHARE_UIDS_MAX);
  if (c->mode != GML_MODE_DAEMON) return fail(c, GML_EDAEMON, "sharing needs the daemon (this client is embedded)");
  size_t n = (size + g->cs - 1) / g->cs;
  pthread_mutex_lock(&c->grow.lock);
  int rc = 0;
  if (g->shared) rc = fail(c, GML_EINVAL, "range already shared as '%s'", g->key);
  if (g->broken) rc = fail(c, GML_EBACKEND, "share: the range is unusable (a failed rollback): destroy it");
  for (size_t s = 0; s < n && !rc; s++)
    if (!g->mapped[s]) rc = fail(c, GML_EINVAL, "share '%s': chunk %zu of the range is not mapped", key, s);
  if (!rc) rc = gmli_grow_unmap_slots(g, n, g->nslots); /* past the content: back to the lake */
  if (rc) {
    pthread_mutex_unlock(&c->grow.lock);
    return rc;
  }
  /* kept: a restarted daemon is asked the same (gml_share_restore) */
  pub_forget(g);
  g->pub.size = size;
  if (o && o->hash && o->hash_len) {
    if (o->hash_len > sizeof g->pub.hash) rc = fail(c, GML_EINVAL, "share '%s': a hash of more than 64 bytes", key);
    else memcpy(g->pub.hash, o->hash, g->pub.hash_len = o->hash_len);
  }
  if (!rc && o && o->meta && o->meta_len) {
    if (!(g->pub.meta = malloc(o->meta_len))) rc = GML_ENOMEM;
    else memcpy(g->pub.meta, o->meta, g->pub.meta_len = o->meta_len);
  }
  if (!rc && o && o->allow_uids && o->n_allow_uids) {
    if (!(g->pub.allow = malloc(o->n_allow_uids * sizeof *g->pub.allow))) rc = GML_ENOMEM;
    else memcpy(g->pub.allow, o->allow_uids, (g->pub.n_allow = o->n_allow_uids) * sizeof *g->pub.allow);
  }
  g->pub.any = o && o->allow_any_uid;
  if (!rc) rc = publish(c, g, n, key, "share", 0);
  if (rc) pub_forget(g);
  if (!rc) {
    g->shared = GML_GROW_PUBLISHED;
    c->grow.release_shared = release_range;
    snprintf(g->key, sizeof g->key, "%s", key);
    __atomic_fetch_sub(&c->grow.mapped, n * g->cs, __ATOMIC_RELAXED);
    c->grow.shared += n * g->cs;
    /* the publisher may not write it either: no process corrupts another's copy */
    if (c->be->ops->synchronize(c->be) || c->be->ops->set_access(c->be, g->base, n * g->cs, GML_ACCESS_READ_ONLY))
      GML_WARN("share '%s': could not make the publisher's mapping read-only", key);
  }
  pthread_mutex_unlock(&c->grow.lock);
  gml_flush(c);
  return rc;
}

/* Look a share up (by key, or by hash when key is NULL), and with count > 0
 * also take chunks [first, first+count) (their fds in fds). *reply to free. */
static int attach_call(gml_client *c, const char *key, const void *hash, size_t hash_len, uint32_t first,
                       uint32_t count, Gmlake__Envelope **reply, int *fds, int *nfds) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__AttachRequest a = GMLAKE__ATTACH_REQUEST__INIT;
  a.key = (char *)(key ? key : "");
  a.content_hash.data = (uint8_t *)hash;
  a.content_hash.len = key ? 0 : hash_len;
  a.first = first;
  a.count = count;
  env.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH;
  env.attach = &a;
  int rc = call(c, &env, reply, fds, nfds, "attach");
  if (rc) return rc;
  Gmlake__AttachReply *ar = (*reply)->attach_reply;
  if ((*reply)->msg_case != GMLAKE__ENVELOPE__MSG_ATTACH_REPLY || ar->n_chunk_ids != count || *nfds != (int)count ||
      !ar->nchunks || ar->size > (uint64_t)ar->nchunks * c->be->chunk_size) {
    close_fds(fds, *nfds);
    gmlake__envelope__free_unpacked(*reply, NULL);
    return fail(c, GML_EPROTO, "attach: unexpected reply");
  }
  return 0;
}

int gml_attach(gml_client *c, const char *key, gml_growable **out, size_t *size, void *meta, size_t *meta_len) {
  if (!c) return GML_EINVAL;
  if (!key || !*key || !out)
    return fail(c, GML_EINVAL, "gml_attach: %s", !out ? "out is NULL" : "key is NULL or empty");
  int krc = check_key(c, "gml_attach", key, 1); /* nothing sent: the connection stays as it was */
  if (krc) return krc;
  if (c->mode != GML_MODE_DAEMON) return fail(c, GML_EDAEMON, "sharing needs the daemon (this client is embedded)");
  Gmlake__Envelope *r;
  int fds[GML_MAX_LEASE_CHUNKS], nfds;
  int rc = attach_call(c, key, NULL, 0, 0, 0, &r, fds, &nfds);
  if (rc) return rc;
  uint32_t n = r->attach_reply->nchunks;
  uint64_t sz = r->attach_reply->size;
  if (meta && meta_len) {
    size_t m = GML_MIN(*meta_len, r->attach_reply->meta.len);
    if (m) memcpy(meta, r->attach_reply->meta.data, m);
    *meta_len = r->attach_reply->meta.len;
  }
  gmlake__envelope__free_unpacked(r, NULL);
  gml_growable *g;
  if ((rc = gml_growable_create(c, (size_t)n * c->be->chunk_size, &g))) return rc;
  gml_backend *be = c->be;
  int mapper = 0;
  pthread_mutex_lock(&c->grow.lock);
  for (uint32_t first = 0; first < n && !rc;) {
    uint32_t k = GML_MIN(n - first, (uint32_t)GML_MAX_LEASE_CHUNKS);
    rc = attach_call(c, key, NULL, 0, first, k, &r, fds, &nfds);
    if (rc) break;
    mapper = 1;
    if (r->attach_reply->nchunks != n || r->attach_reply->size != sz)
      rc = fail(c, GML_EPROTO, "attach: the share changed");
    for (uint32_t i = 0; i < k; i++) {
      size_t s = first + i;
      if (rc) {
        close(fds[i]);
        continue;
      }
      rc = be->ops->chunk_import(be, fds[i], &g->phys[s]); /* takes the fd */
      if (!rc && (rc = be->ops->map(be, g->base + s * g->cs, g->phys[s]))) be->ops->chunk_release(be, g->phys[s]);
      if (rc) break;
      g->ids[s] = r->attach_reply->chunk_ids[i];
      g->mapped[s] = 1;
      g->nmapped++;
      c->grow.shared += g->cs;
    }
    gmlake__envelope__free_unpacked(r, NULL);
    first += k;
  }
  if (!rc) rc = be->ops->set_access(be, g->base, (size_t)n * g->cs, GML_ACCESS_READ_ONLY);
  if (mapper) { /* from here on, releasing the range detaches */
    g->shared = GML_GROW_ATTACHED;
    c->grow.release_shared = release_range;
    snprintf(g->key, sizeof g->key, "%s", key);
  }
  pthread_mutex_unlock(&c->grow.lock);
  if (rc) {
    char why[sizeof c->last_error];
    snprintf(why, sizeof why, "%s", c->last_error);
    gml_growable_destroy(g);
    return fail(c, rc, "%s", why[0] ? why : gml_strerror(rc));
  }
  if (size) *size = sz;
  *out = g;
  gml_flush(c);
  return 0;
}

/* Compare [0, size) of two ranges through the backend (host memory or device copies). */
static int same_bytes(gml_client *c, uintptr_t a, uintptr_t b, size_t size) {
  size_t piece = c->be->chunk_size;
  uint8_t *x = malloc(piece), *y = malloc(piece);
  int same = x && y ? 1 : -1;
  for (size_t off = 0; off < size && same == 1; off += piece) {
    size_t k = GML_MIN(piece, size - off);
    if (c->be->ops->read(c->be, a + off, x, k) || c->be->ops->read(c->be, b + off, y, k)) same = -1;
    else if (memcmp(x, y, k)) same = 0;
  }
  free(x), free(y);
  return same;
}

/* t's range goes without a detach: its place among the share's mappers is g's now. grow.lock held. */
static void forget_range(gml_growable *t) {
  gml_client *c = t->c;
  c->be->ops->unmap(c->be, t->base, t->size);
  c->be->ops->va_free(c->be, t->base, t->size);
  if (t->prev) t->prev->next = t->next;
  else c->grow.head = t->next;
  if (t->next) t->next->prev = t->prev;
  c->grow.ranges--;
  c->grow.reserved -= t->size;
  free(t->phys), free(t->ids), free(t->mapped), free(t);
}

/* g (own, [0, n) mapped) takes t's chunks (attached, same n) in place, all
 * or nothing: g->phys/ids keep its own chunks until every slot maps t's and
 * the range is read-only; only then do its own go back to the lake and t
 * go. A backend error before that puts its own chunks back where they were
 * (bytes intact, writable) and leaves t to the caller (who destroys it: a
 * detach). Where even that fails (the backend refuses the map back too),
 * the slots it failed for stay unmapped, their own chunks go back to the
 * lake (counted once: no longer the range's), and the range is marked
 * broken: map/ensure/share/dedup refuse it with an error, a read there
 * faults (never other bytes), destroy works. Slots past n went back first
 * (as gml_share does). grow.lock held. */
static int remap_onto(gml_growable *g, gml_growable *t, size_t n) {
  gml_client *c = g->c;
  gml_backend *be = c->be;
  int rc = gmli_grow_unmap_slots(g, n, g->nslots);
  if (rc || (rc = be->ops->synchronize(be)))
    return fail(c, rc, "dedup: unmapping past the content failed (%s): nothing remapped", gml_strerror(rc));
  size_t done = 0; /* slots [0, done) map t's chunks */
  int hole = 0;    /* slot done maps nothing (its own chunk unmapped, t's map failed) */
  for (; done < n; done++) {
    uintptr_t va = g->base + done * g->cs;
    if ((rc = be->ops->unmap(be, va, g->cs))) break; /* cuda: unmapped before another chunk maps there */
    if ((rc = be->ops->map(be, va, t->phys[done]))) {
      hole = 1;
      break;
    }
  }
  if (!rc && (rc = be->ops->set_access(be, g->base, n * g->cs, GML_ACCESS_READ_ONLY))) done = n; /* all to undo */
  if (!rc) {
    for (size_t i = 0; i < n; i += GML_MAX_LEASE_CHUNKS) /* our own copies go back to the lake */
      c->alloc.src.release(c->alloc.src.ctx, GML_MIN(n - i, (size_t)GML_MAX_LEASE_CHUNKS), g->phys + i, g->ids + i);
    memcpy(g->phys, t->phys, n * sizeof *g->phys);
    memcpy(g->ids, t->ids, n * sizeof *g->ids);
    __atomic_fetch_sub(&c->grow.mapped, n * g->cs, __ATOMIC_RELAXED); /* t's shared bytes are g's now */
    g->shared = GML_GROW_ATTACHED;
    c->grow.release_shared = release_range;
    snprintf(g->key, sizeof g->key, "%s", t->key);
    forget_range(t);
    return 0;
  }
  size_t at = done, lost = 0;
  for (size_t s = 0; s < done + (size_t)hole; s++) { /* roll back: each slot its own chunk again */
    uintptr_t va = g->base + s * g->cs;
    int r = s < done ? be->ops->unmap(be, va, g->cs) : 0;
    if (!r) r = be->ops->map(be, va, g->phys[s]);
    if (!r) continue;
    c->alloc.src.release(c->alloc.src.ctx, 1, &g->phys[s], &g->ids[s]);
    g->mapped[s] = 0;
    g->nmapped--;
    __atomic_fetch_sub(&c->grow.mapped, g->cs, __ATOMIC_RELAXED);
    lost++;
  }
  for (size_t s = 0; s < n; s++) /* writable as before (per slot: a hole fails cuda's set_access) */
    if (g->mapped[s] && be->ops->set_access(be, g->base + s * g->cs, g->cs, 0)) lost += !lost;
  if (!lost)
    return fail(
        c, rc, "dedup: the backend failed remapping chunk %zu of %zu (%s): rolled back, the range keeps its own chunks",
        at, n, gml_strerror(rc));
  g->broken = 1;
  GML_ERR("dedup: the backend failed remapping chunk %zu of %zu and again putting the range's own chunks back", at, n);
  return fail(
      c, rc,
      "dedup: the backend failed remapping chunk %zu of %zu (%s), and putting %zu of the range's own chunks back: "
      "the range is unusable (those slots unmapped, their chunks back in the lake); destroy it",
      at, n, gml_strerror(rc), lost);
}

/* The key a dedup publishes under: the whole hash, so two hashes that differ
 * anywhere get two keys (the first 32 bytes only, two hashes sharing them
 * took one key: the second's publish was GML_EEXIST, its dedup failed).
 * "dedup-<hex>" while that fits a key (hashes up to 60 bytes: SHA-256's key
 * as before), else "dedup-b64-<base64url>" (61 to 64 bytes: SHA-512), which
 * no hex key can equal ('-' is no hex digit). */
#define DEDUP_HEX_MAX ((GML_SHARE_KEY_MAX - 6) / 2)
_Static_assert(10 + (GML_SHARE_HASH_MAX * 4 + 2) / 3 <= GML_SHARE_KEY_MAX, "a dedup key holds the whole hash");
static void dedup_key(char key[GML_SHARE_KEY_MAX + 1], const uint8_t *h, size_t n) {
  static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  if (n <= DEDUP_HEX_MAX) {
    size_t k = (size_t)sprintf(key, "dedup-");
    for (size_t i = 0; i < n; i++) k += (size_t)sprintf(key + k, "%02x", h[i]);
    return;
  }
  size_t k = (size_t)sprintf(key, "dedup-b64-");
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)h[i] << 16 | (i + 1 < n ? (uint32_t)h[i + 1] << 8 : 0) | (i + 2 < n ? h[i + 2] : 0);
    for (size_t j = 0; j < 4 && j <= GML_MIN(n - i, (size_t)3); j++) key[k++] = b64[(v >> (18 - 6 * j)) & 63];
  }
  key[k] = 0;
}

int gml_dedup(gml_growable *g, size_t size, const void *hash, size_t hash_len, int *deduped) {
  if (!g) return GML_EINVAL;
  gml_client *c = g->c;
  if (!size || size > g->size)
    return fail(c, GML_EINVAL, "gml_dedup: size %zu: 1 to the range's %zu bytes", size, g->size);
  if (!hash || !hash_len || hash_len > GML_SHARE_HASH_MAX)
    return fail(c, GML_EINVAL, "gml_dedup: a hash of %zu bytes (1 to %d)", hash ? hash_len : (size_t)0,
                GML_SHARE_HASH_MAX);
  if (!deduped) return fail(c, GML_EINVAL, "gml_dedup: deduped is NULL");
  if (c->mode != GML_MODE_DAEMON) return fail(c, GML_EDAEMON, "sharing needs the daemon (this client is embedded)");
  if (g->shared) return fail(c, GML_EINVAL, "range already shared as '%s'", g->key);
  if (g->broken) return fail(c, GML_EBACKEND, "dedup: the range is unusable (a failed rollback): destroy it");
  size_t n = (size + g->cs - 1) / g->cs;
  *deduped = 0;
  for (int attempt = 0; attempt < 2; attempt++) {
    Gmlake__Envelope *r;
    int fds[GML_MAX_LEASE_CHUNKS], nfds;
    int rc = attach_call(c, NULL, hash, hash_len, 0, 0, &r, fds, &nfds);
    if (rc == GML_ENOENT) { /* nobody has it: publish ours, for the next ones */
      char key[GML_SHARE_KEY_MAX + 1];
      dedup_key(key, hash, hash_len);
      gml_share_opts o = {.hash = hash, .hash_len = hash_len};
      rc = gml_share(g, size, key, &o);
      if (rc == GML_EEXIST) continue; /* another process published it meanwhile: compare with theirs */
      return rc;
    }
    if (rc) return rc;
    char key[144]; /* NAME@UID when another user published it */
    snprintf(key, sizeof key, "%s", r->attach_reply->key);
    uint64_t their = r->attach_reply->size;
    gmlake__envelope__free_unpacked(r, NULL);
    if (their != size)
      return fail(c, GML_EMISMATCH, "dedup: share '%s' has that hash but %llu bytes, not %zu", key,
                  (unsigned long long)their, size);
    gml_growable *t;
    if ((rc = gml_attach(c, key, &t, NULL, NULL, NULL))) return rc;
    int same = same_bytes(c, g->base, t->base, size);
    if (same != 1) {
      gml_growable_destroy(t);
      return same < 0 ? fail(c, GML_EBACKEND, "dedup: reading the ranges to compare failed")
                      : fail(c, GML_EMISMATCH, "dedup: share '%s' has an equal hash but different bytes: refused", key);
    }
    pthread_mutex_lock(&c->grow.lock);
    rc = remap_onto(g, t, n);
    pthread_mutex_unlock(&c->grow.lock);
    if (rc) { /* t still maps the share: it goes, and the daemon counts us as its mapper no more */
      char why[sizeof c->last_error];
      snprintf(why, sizeof why, "%s", c->last_error);
      gml_growable_destroy(t);
      fail(c, rc, "%s", why);
    }
    gml_flush(c);
    if (!rc) *deduped = 1;
    return rc;
  }
  return fail(c, GML_EEXIST, "dedup: publishing and finding the hash both failed");
}

/* ---------- a daemon restart: shares handed over and restored ---------- */

/* Reconnecting to a restarted daemon (every holder's lock held): every chunk
 * of a published range to fn, and every shared range marked for restore.
 * adopted: fn hands them over with the rest, to be published again; else (a
 * daemon that takes no hand-over) fn keeps them local and the published ranges
 * are mapped on uncounted. Attached ones wait for their share either way. */
static void handover(gml_client *c, gml_chunk_fn fn, void *ctx, int adopted) {
  for (gml_growable *g = c->grow.head; g; g = g->next) {
    if (g->shared == GML_GROW_ATTACHED) {
      if (g->lost != GML_SHARE_ORPHAN) set_lost(g, GML_SHARE_REGISTER);
      continue;
    }
    if (g->shared != GML_GROW_PUBLISHED) continue;
    /* the new daemon knows nothing of the share: its chunks go to fn as ours,
     * then are published again (or, published again in vain, kept as ours);
     * not adopted, they are mapped on uncounted (not the new lake's) */
    for (size_t k = 0; k < g->nslots; k++)
      if (g->mapped[k]) fn(ctx, g->phys[k], &g->ids[k]);
    if (!adopted) set_lost(g, GML_SHARE_ORPHAN);
    else if (g->lost != GML_SHARE_OWNED) set_lost(g, GML_SHARE_PUBLISH);
  }
  c->grow.lost_since_ns = gmli_now_ns();
}

/* Count us a mapper of g's share again: the share under its key must be the
 * same size and chunks as what we map. 0: done; GML_ENOENT: not back yet. */
static int reregister(gml_client *c, gml_growable *g) {
  Gmlake__Envelope *r;
  int fds[GML_MAX_LEASE_CHUNKS], nfds;
  int rc = attach_call(c, g->key, NULL, 0, 0, 0, &r, fds, &nfds);
  if (rc) return rc;
  uint32_t n = r->attach_reply->nchunks;
  uint64_t sz = r->attach_reply->size;
  gmlake__envelope__free_unpacked(r, NULL);
  size_t ours = 0;
  while (ours < g->nslots && g->mapped[ours]) ours++;
  if (n != ours || n != g->nmapped)
    return fail(c, GML_EMISMATCH, "share '%s' came back with %u chunks, we map %zu", g->key, n, ours);
  int mapper = 0;
  for (uint32_t first = 0; first < n && !rc;) { /* taking its chunks makes us a mapper; we keep our own mappings */
    uint32_t k = GML_MIN(n - first, (uint32_t)GML_MAX_LEASE_CHUNKS);
    if ((rc = attach_call(c, g->key, NULL, 0, first, k, &r, fds, &nfds))) break;
    mapper = 1;
    if (r->attach_reply->nchunks != n || r->attach_reply->size != sz)
      rc = fail(c, GML_EPROTO, "attach: the share changed");
    /* the same chunks, not only as many: a new share under the key (its
     * publisher gone, another process of the user published it again) is
     * other memory than ours (where the backend can tell) */
    for (uint32_t i = 0; i < k && !rc && c->be->ops->chunk_same; i++)
      if (c->be->ops->chunk_same(c->be, g->phys[first + i], fds[i]) != 1)
        rc = fail(c, GML_EMISMATCH, "share '%s' came back as other chunks than those we map", g->key);
    close_fds(fds, nfds);
    gmlake__envelope__free_unpacked(r, NULL);
    first += k;
  }
  if (rc && mapper) send_detach(c, g->key); /* not its mapper after all */
  return rc;
}

/* After a hand-over: published ranges marked GML_SHARE_PUBLISH are published
 * again, attached ones registered as mappers once their share is back. Takes grow.lock. */
static void restore(gml_client *c) {
  pthread_mutex_lock(&c->grow.lock);
  c->grow.restore_ns = gmli_now_ns();
  int waited_long = c->grow.restore_ns - c->grow.lost_since_ns > GML_SHARE_REGISTER_FOR_NS;
  for (gml_growable *g = c->grow.head; g && c->grow.lost_shares; g = g->next) {
    if (g->lost == GML_SHARE_PUBLISH) {
      size_t n = (g->pub.size + g->cs - 1) / g->cs;
      int rc = publish(c, g, n, g->key, "share again", 1);
      int others = g->pub.any != 0;
      for (size_t i = 0; i < g->pub.n_allow; i++) others |= g->pub.allow[i] != (uint32_t)geteuid();
      if (!rc) {
        GML_INFO("share '%s' published again to the restarted daemon", g->key);
        set_lost(g, GML_SHARE_OK);
      } else if (others) {
        /* other users may have attached it and may map it still: these chunks
         * must never be leased again; we keep mapping them (our handles keep
         * the memory), the lake no longer counts them */
        gmli_client_return_tainted(c, g->ids, n);
        GML_WARN("share '%s' not published again to the restarted daemon: %s; we map it on, its chunks left the lake "
                 "(other users may map them)",
                 g->key, c->last_error);
        set_lost(g, GML_SHARE_ORPHAN);
      } else {
        GML_WARN("share '%s' not published again to the restarted daemon: %s; we keep it, as our own memory", g->key,
                 c->last_error);
        set_lost(g, GML_SHARE_OWNED);
      }
    } else if (g->lost == GML_SHARE_REGISTER) {
      int rc = reregister(c, g);
      if (!rc) {
        GML_INFO("share '%s': counted its mapper again by the restarted daemon", g->key);
        set_lost(g, GML_SHARE_OK);
      } else if ((rc != GML_ENOENT && rc != GML_EDAEMON) || waited_long) {
        GML_WARN("share '%s' is not back in the restarted daemon as we map it (%s): we map it on; the lake does not "
                 "count it",
                 g->key, rc == GML_ENOENT ? "its publisher did not publish it again" : c->last_error);
        set_lost(g, GML_SHARE_ORPHAN);
      }
    }
  }
  pthread_mutex_unlock(&c->grow.lock);
}

static void holder_handover(gml_client *c, gml_chunk_fn fn, void *ctx, int how) {
  if (how != GML_HANDOVER_PARKED) handover(c, fn, ctx, how == GML_HANDOVER_ADOPT); /* the same daemon kept the shares */
}

static void holder_reconnected(gml_client *c, int how) {
  if (how == GML_HANDOVER_ADOPT && __atomic_load_n(&c->grow.lost_shares, __ATOMIC_RELAXED)) restore(c);
}

/* attached ranges wait for their publishers to publish again after a restart */
static void holder_tick(gml_client *c) {
  if (__atomic_load_n(&c->grow.lost_shares, __ATOMIC_RELAXED) && gmli_now_ns() - c->grow.restore_ns > 1000000000ull)
    restore(c);
}

const gml_holder_ops gmli_share_holder = {
    .handover = holder_handover, .reconnected = holder_reconnected, .tick = holder_tick};
