/* lake.c: chunk ownership, limit and quotas (no I/O: see lake.h). */
#include "lake.h"
#include "gmlake.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int lake_init(lake *lk, gml_backend *be, uint64_t limit_bytes) {
  memset(lk, 0, sizeof *lk);
  lk->be = be;
  lk->cs = be->chunk_size;
  lk->limit_bytes = limit_bytes;
  return 0;
}

static void release_chunk(lake *lk, lake_chunk *c) {
  lk->be->ops->chunk_release(lk->be, c->phys);
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

void lake_destroy(lake *lk) {
  for (uint32_t i = 0; i < lk->nslots; i++)
    if (lk->chunks[i].state != CHUNK_UNUSED) release_chunk(lk, &lk->chunks[i]);
  free(lk->chunks), free(lk->free_stack), free(lk->unused_stack), free(lk->quotas);
  memset(lk, 0, sizeof *lk);
}

long lake_owned_index(const lake *lk, uint64_t id, uint64_t owner) {
  uint64_t idx = (id & 0xffffffffu);
  if (idx == 0 || idx > lk->nslots) return GML_EBADPTR;
  idx--;
  const lake_chunk *c = &lk->chunks[idx];
  if (c->state != CHUNK_LEASED || c->owner != owner || c->gen != (uint32_t)(id >> 32)) return GML_EBADPTR;
  return (long)idx;
}

uint64_t lake_headroom(const lake *lk) {
  uint64_t limit_chunks = lk->limit_bytes / lk->cs;
  uint64_t held = lk->total + lk->creating;
  return limit_chunks > held ? limit_chunks - held : 0;
}

int lake_add_created(lake *lk, gml_phys phys, int fd) {
  uint32_t idx;
  if (lk->nunused) {
    idx = lk->unused_stack[--lk->nunused];
  } else {
    if (lk->nslots == lk->cap) {
      uint32_t cap = lk->cap ? lk->cap * 2 : 256;
      lake_chunk *c = realloc(lk->chunks, cap * sizeof *c);
      if (!c) return GML_ENOMEM;
      lk->chunks = c;
      uint32_t *f = realloc(lk->free_stack, cap * sizeof *f);
      if (!f) return GML_ENOMEM;
      lk->free_stack = f;
      uint32_t *u = realloc(lk->unused_stack, cap * sizeof *u);
      if (!u) return GML_ENOMEM;
      lk->unused_stack = u;
      lk->cap = cap;
    }
    idx = lk->nslots++;
    lk->chunks[idx].gen = 0;
  }
  lake_chunk *c = &lk->chunks[idx];
  c->phys = phys;
  c->fd = fd;
  c->gen++;
  c->state = CHUNK_FREE;
  c->owner = 0;
  c->tainted = 0;
  c->tenant = 0;
  c->ident = 0;
  c->adopted = 0;
  if (fd >= 0 && lk->be->ops->chunk_ident && lk->be->ops->chunk_ident(lk->be, fd, &c->ident)) c->ident = 0;
  lk->free_stack[lk->nfree++] = idx;
  lk->nfree_clean++;
  lk->total++;
  return 0;
}

int lake_retired(const lake *lk, uint64_t ident) {
  for (uint32_t k = 0; ident && k < lk->nretired; k++)
    if (lk->retired[k] == ident) return 1;
  return 0;
}

long lake_find_ident(const lake *lk, uint64_t ident) {
  for (uint32_t i = 0; ident && i < lk->nslots; i++)
    if (lk->chunks[i].state != CHUNK_UNUSED && lk->chunks[i].ident == ident) return (long)i;
  return -1;
}

uint32_t lake_take(lake *lk, uint64_t owner, uint32_t n, uint32_t *idx) {
  uint32_t k = 0;
  while (k < n && lk->nfree) {
    uint32_t i = lk->free_stack[--lk->nfree];
    lk->nfree_clean -= !lk->chunks[i].tainted;
    lk->chunks[i].state = CHUNK_LEASED;
    lk->chunks[i].owner = owner;
    idx[k++] = i;
  }
  lk->leased += k;
  return k;
}

uint32_t lake_take_for(lake *lk, uint64_t owner, uint32_t uid, uint32_t n, uint32_t *idx) {
  uint32_t k = 0;
  /* from the top (most recently freed first); a chunk taken is replaced by the
   * top one, which was looked at already */
  for (uint32_t j = lk->nfree; j-- > 0 && k < n;) {
    uint32_t i = lk->free_stack[j];
    lake_chunk *c = &lk->chunks[i];
    if (c->tainted && c->tenant != uid) continue;
    lk->free_stack[j] = lk->free_stack[--lk->nfree];
    lk->nfree_clean -= !c->tainted;
    c->state = CHUNK_LEASED;
    c->owner = owner;
    c->tainted = 1;
    c->tenant = uid;
    idx[k++] = i;
  }
  lk->leased += k;
  return k;
}

long lake_adopt(lake *lk, uint64_t owner, uint32_t uid, gml_phys phys, int fd) {
  if (lake_add_created(lk, phys, fd)) return GML_ENOMEM;
  uint32_t idx = 0; /* the free stack's top, the chunk just added (clean: any uid takes it; it is uid's now) */
  if (lake_take_for(lk, owner, uid, 1, &idx) != 1) return GML_ENOMEM;
  lk->chunks[idx].adopted = 1;
  return (long)idx;
}

void lake_unadopt(lake *lk, uint32_t idx) {
  lake_chunk *c = &lk->chunks[idx];
  if (c->state != CHUNK_LEASED) return;
  release_chunk(lk, c); /* our imported handle: the client's keeps the memory */
  c->state = CHUNK_UNUSED;
  c->owner = 0;
  c->tainted = 0;
  lk->unused_stack[lk->nunused++] = idx;
  lk->leased--;
  lk->total--;
}

uint32_t lake_free_of(const lake *lk, uint32_t uid) {
  uint32_t n = 0;
  if (lk->nfree == lk->nfree_clean) return 0; /* no tainted free chunk: no scan (the lease paths ask often) */
  for (uint32_t j = 0; j < lk->nfree; j++) {
    const lake_chunk *c = &lk->chunks[lk->free_stack[j]];
    n += c->tainted && c->tenant == uid;
  }
  return n;
}

void lake_mark_clean(lake *lk, uint32_t idx) {
  lake_chunk *c = &lk->chunks[idx];
  if (c->state != CHUNK_FREE || !c->tainted) return;
  c->tainted = 0;
  lk->nfree_clean++;
}

void lake_give_back(lake *lk, uint32_t idx) {
  lake_chunk *c = &lk->chunks[idx];
  if (c->state == CHUNK_LEASED) lk->leased--;
  else if (c->state == CHUNK_PARKED) lk->parked--;
  else if (c->state == CHUNK_SHARED) lk->shared--;
  else return;
  c->state = CHUNK_FREE; /* still tainted by its tenant: lake_take_for decides who may have it */
  c->owner = 0;
  c->adopted = 0;
  lk->free_stack[lk->nfree++] = idx;
  lk->nfree_clean += !c->tainted;
}

void lake_park(lake *lk, uint32_t idx) {
  lake_chunk *c = &lk->chunks[idx];
  if (c->state != CHUNK_LEASED) return;
  c->state = CHUNK_PARKED;
  lk->leased--;
  lk->parked++;
}

void lake_share(lake *lk, uint32_t idx, uint64_t share_id) {
  lake_chunk *c = &lk->chunks[idx];
  if (c->state != CHUNK_LEASED) return;
  c->state = CHUNK_SHARED;
  c->owner = share_id;
  lk->leased--;
  lk->shared++;
}

void lake_destroy_chunk(lake *lk, uint32_t idx) {
  lake_chunk *c = &lk->chunks[idx];
  if (c->state != CHUNK_FREE) return;
  for (uint32_t k = 0; k < lk->nfree; k++) {
    if (lk->free_stack[k] == idx) {
      lk->free_stack[k] = lk->free_stack[--lk->nfree];
      break;
    }
  }
  lk->nfree_clean -= !c->tainted;
  if (c->ident) { /* whoever kept its fd keeps the memory: never a lake chunk again */
    lk->retired[lk->retired_next] = c->ident;
    lk->retired_next = (lk->retired_next + 1) % LAKE_RETIRED_MAX;
    if (lk->nretired < LAKE_RETIRED_MAX) lk->nretired++;
  }
  release_chunk(lk, c);
  c->state = CHUNK_UNUSED;
  lk->unused_stack[lk->nunused++] = idx;
  lk->total--;
}

uint32_t lake_trim(lake *lk, uint32_t keep_free) {
  uint32_t n = 0;
  while (lk->nfree > keep_free) {
    uint32_t idx = lk->free_stack[lk->nfree - 1];
    lake_destroy_chunk(lk, idx);
    n++;
  }
  return n;
}

uint64_t lake_quota_for(const lake *lk, pid_t pid, uid_t uid) {
  uint64_t by_uid = 0;
  for (size_t i = 0; i < lk->nquotas; i++) {
    const lake_quota *q = &lk->quotas[i];
    if (q->by_uid == LAKE_QUOTA_PID && q->key == (uint32_t)pid) return q->bytes;
    if (q->by_uid == LAKE_QUOTA_UID && q->key == (uint32_t)uid) by_uid = q->bytes;
  }
  return by_uid;
}

static int set_quota(lake *lk, int by_uid, uint32_t key, const char *cgroup, uint64_t bytes) {
  for (size_t i = 0; i < lk->nquotas; i++) {
    lake_quota *q = &lk->quotas[i];
    if (q->by_uid == by_uid && q->key == key && !strcmp(q->cgroup, cgroup)) {
      if (bytes) q->bytes = bytes;
      else lk->quotas[i] = lk->quotas[--lk->nquotas];
      return 0;
    }
  }
  if (!bytes) return 0;
  lake_quota *q = realloc(lk->quotas, (lk->nquotas + 1) * sizeof *q);
  if (!q) return GML_ENOMEM;
  lk->quotas = q;
  lake_quota *n = &lk->quotas[lk->nquotas++];
  memset(n, 0, sizeof *n);
  n->by_uid = by_uid;
  n->key = key;
  snprintf(n->cgroup, sizeof n->cgroup, "%s", cgroup);
  n->bytes = bytes;
  return 0;
}

int lake_set_quota(lake *lk, int by_uid, uint32_t key, uint64_t bytes) {
  return set_quota(lk, by_uid ? LAKE_QUOTA_UID : LAKE_QUOTA_PID, key, "", bytes);
}

int lake_set_quota_cgroup(lake *lk, const char *cgroup, uint64_t bytes) {
  if (!cgroup || !*cgroup || strlen(cgroup) >= sizeof lk->quotas[0].cgroup) return GML_EINVAL;
  return set_quota(lk, LAKE_QUOTA_CGROUP, 0, cgroup, bytes);
}

long gmli_lake_quota_named(const lake *lk, const char *group) {
  if (!group || !*group) return -1;
  for (size_t i = 0; i < lk->nquotas; i++)
    if (!strcmp(lk->quotas[i].group, group)) return (long)i;
  return -1;
}

long gmli_lake_quota_of(const lake *lk, int by_uid, uint32_t key, const char *cgroup) {
  for (size_t i = 0; i < lk->nquotas; i++) {
    const lake_quota *q = &lk->quotas[i];
    if (q->by_uid == by_uid && q->key == key && !strcmp(q->cgroup, cgroup)) return (long)i;
  }
  return -1;
}

void gmli_lake_name_quota(lake *lk, size_t i, const char *group, uint64_t held) {
  lake_quota *q = &lk->quotas[i];
  if (!strcmp(q->group, group)) return;
  long other = gmli_lake_quota_named(lk, group);
  if (other >= 0) lk->quotas[other].group[0] = '\0';
  snprintf(q->group, sizeof q->group, "%s", group);
  q->peak_chunks = held;
}

void gmli_lake_remove_quota(lake *lk, size_t i) {
  if (i < lk->nquotas) lk->quotas[i] = lk->quotas[--lk->nquotas];
}
