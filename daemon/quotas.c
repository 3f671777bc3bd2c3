/* quotas.c: which clients a quota binds (a pid, a uid, a cgroup v2 or v1 path and the cgroups below it),
 * what they hold, the room a lease has under every quota that binds its client, and the peaks of named
 * quotas (a job's, a pod's: reported when it ends). Free of I/O, as broker.c, which calls it. */
#include "broker.h"
#include "gmlake.h"
#include <stdio.h>
#include <string.h>

/* Is cgroup path p (its first n bytes) cg or above it? */
static int under(const char *p, size_t n, const char *cg) {
  return cg[0] && n && !strncmp(p, cg, n) && (!cg[n] || cg[n] == '/' || p[n - 1] == '/');
}

/* A v1 quota "CONTROLLER:/PATH" and a client's v1 lines ("CONTROLLERS:PATH\n" each): does the line of the
 * hierarchy that has CONTROLLER name PATH or a cgroup below it? */
static int covers_v1(const char *quota, const char *lines) {
  const char *colon = strchr(quota, ':');
  if (!colon) return 0;
  size_t clen = (size_t)(colon - quota), plen = strlen(colon + 1);
  for (const char *l = lines; *l;) {
    const char *end = strchr(l, '\n'), *sep = strchr(l, ':');
    if (!end || !sep || sep > end) return 0;
    for (const char *c = l; c < sep;) { /* "cpu,cpuacct": each of them */
      const char *comma = memchr(c, ',', (size_t)(sep - c));
      const char *ce = comma ? comma : sep;
      if ((size_t)(ce - c) == clen && !strncmp(c, quota, clen)) {
        char cg[GML_QUOTA_CGROUP_MAX];
        snprintf(cg, sizeof cg, "%.*s", (int)(end - sep - 1), sep + 1);
        return under(colon + 1, plen, cg);
      }
      c = ce + 1;
    }
    l = end + 1;
  }
  return 0;
}

/* Does quota q cover client o? */
static int covers(const lake_quota *q, const broker_client *o) {
  switch (q->by_uid) {
  case LAKE_QUOTA_PID: return q->key == (uint32_t)o->pid;
  case LAKE_QUOTA_UID: return q->key == (uint32_t)o->uid;
  case LAKE_QUOTA_CGROUP: /* the cgroup and those below it: a process that may make cgroups (a delegated
                           * subtree: a container, a user's own systemd manager) moving into a child stays in */
    if (q->cgroup[0] != '/') return covers_v1(q->cgroup, o->cgroup_v1);
    return under(q->cgroup, strlen(q->cgroup), o->cgroup);
  }
  return 0;
}

/* Chunks q covers: every connection, parked chunk and published share. */
static uint64_t held_under(const broker *b, const lake_quota *q) {
  uint64_t held = 0;
  const broker_client *lists[3] = {b->clients, b->parked, b->published};
  for (int l = 0; l < 3; l++)
    for (const broker_client *o = lists[l]; o; o = o->next)
      if (covers(q, o)) held += o->leased_chunks;
  return held;
}

uint64_t gmli_broker_quota_held(const broker *b, size_t i) { return held_under(b, &b->lk->quotas[i]); }

/* c holds more: the named quotas that bind it may have a new peak (a job's, reported when it ends). */
void gmli_broker_note_peaks(broker *b, const broker_client *c) {
  for (size_t i = 0; i < b->lk->nquotas; i++) {
    lake_quota *q = &b->lk->quotas[i];
    if (!q->group[0] || !covers(q, c)) continue;
    uint64_t held = held_under(b, q);
    if (held > q->peak_chunks) q->peak_chunks = held;
  }
}

uint64_t broker_quota_room(const broker *b, const broker_client *c, uint64_t *quota, char *holder_name,
                           size_t holder_len) {
  uint64_t room = UINT64_MAX;
  if (quota) *quota = 0;
  for (size_t i = 0; i < b->lk->nquotas; i++) {
    const lake_quota *q = &b->lk->quotas[i];
    if (!covers(q, c)) continue;
    uint64_t held = held_under(b, q);
    uint64_t max = q->bytes / b->lk->cs, r = max > held ? max - held : 0;
    if (r < room || (quota && !*quota)) {
      room = GML_MIN(room, r);
      if (quota) *quota = q->bytes;
      if (holder_name) {
        int n = q->group[0] ? snprintf(holder_name, holder_len, "%s of ", q->group) : 0; /* a job's name says whose */
        if (n < 0 || (size_t)n >= holder_len) n = 0;
        if (q->by_uid == LAKE_QUOTA_CGROUP) snprintf(holder_name + n, holder_len - n, "cgroup %s", q->cgroup);
        else snprintf(holder_name + n, holder_len - n, "%s %u", q->by_uid == LAKE_QUOTA_UID ? "uid" : "pid", q->key);
      }
    }
  }
  return room;
}

uint32_t broker_adopt_room(const broker *b, const broker_client *c, uint32_t n) {
  uint64_t limit = b->lk->limit_bytes / b->lk->cs;
  uint64_t bound = 2 * limit + BROKER_MAX_LEASE;
  uint64_t held = b->lk->total + b->lk->creating;
  if (held >= bound) return 0;
  /* one user hands over at most the limit: all users together cannot have
   * held more than it before the restart, and one that hands over more (fds
   * it kept of chunks it returned) does not take the room of the others */
  const lake_quota user = {.by_uid = LAKE_QUOTA_UID, .key = (uint32_t)c->uid}; /* counted as a uid quota counts */
  uint64_t uid_held = held_under(b, &user);
  uint64_t room = GML_MIN(bound - held, uid_held >= limit ? 0 : limit - uid_held);
  return (uint32_t)GML_MIN((uint64_t)n, room);
}
