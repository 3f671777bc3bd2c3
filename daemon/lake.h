/* lake.h: the lake's bookkeeping, free of I/O so it can be unit-tested:
 * every chunk the daemon created, who holds it, the lake's limit and the
 * per-client quotas. The event loop (daemon.c) drives it. */
#ifndef GML_LAKE_H
#define GML_LAKE_H
#include "backend.h"
#include "util.h"
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* CHUNK_SHARED: published read-only memory (daemon/shares.c); owner is the share's id. */
#define LAKE_RETIRED_MAX 65536

enum lake_chunk_state { CHUNK_UNUSED = 0, CHUNK_FREE, CHUNK_LEASED, CHUNK_PARKED, CHUNK_SHARED };

typedef struct lake_chunk {
  gml_phys phys;
  int fd;       /* exported shareable handle, kept for the chunk's life */
  uint32_t gen; /* bumped when the slot is reused, so stale ids are refused */
  uint8_t state;
  uint8_t tainted; /* it has been leased: it may hold tenant's data, and tenant's processes may still reach it */
  uint8_t adopted; /* leased by a hand-over after a restart, not returned since (a tainted Return applies to it only) */
  uint32_t tenant; /* the uid it was last leased to (when tainted) */
  uint64_t owner;  /* client id while leased or parked */
  uint64_t ident;  /* the backend's chunk_ident of fd (0: it cannot tell): no chunk is in the lake twice */
} lake_chunk;

enum { LAKE_QUOTA_PID = 0, LAKE_QUOTA_UID = 1, LAKE_QUOTA_CGROUP = 2 };
typedef struct lake_quota {
  int by_uid;                        /* LAKE_QUOTA_*: 0 pid, 1 uid, 2 cgroup */
  uint32_t key;                      /* pid or uid */
  char cgroup[GML_QUOTA_CGROUP_MAX]; /* LAKE_QUOTA_CGROUP: the cgroup's path, "/PATH" (v2) or "CONTROLLER:/PATH" (v1) */
  uint64_t bytes;
  char group[GML_QUOTA_GROUP_MAX]; /* its name ("" none): a job's, a pod's (metrics, gmlakectl quotas) */
  uint64_t peak_chunks;            /* named: the most its clients held at once since it was set (broker.c keeps it) */
} lake_quota;

typedef struct lake {
  gml_backend *be;
  size_t cs;
  uint64_t limit_bytes; /* the most the lake may hold (created chunks) */
  lake_chunk *chunks;
  uint32_t nslots, cap;
  uint32_t *free_stack; /* indices of CHUNK_FREE chunks */
  uint32_t nfree;
  uint32_t nfree_clean;   /* of them never leased since made or scrubbed: anyone's */
  uint32_t *unused_stack; /* indices of CHUNK_UNUSED slots */
  uint32_t nunused;
  uint64_t total, leased, parked, creating, shared;
  lake_quota *quotas;
  size_t nquotas;
  /* idents of chunks released to the driver, a ring: whoever kept their fds
   * keeps their memory, and may not hand them over as lake chunks (host: inode
   * numbers, which the kernel counts up and does not reuse before 2^32 files;
   * cuda: none, the driver cannot tell a chunk) */
  uint64_t retired[LAKE_RETIRED_MAX];
  uint32_t retired_next, nretired;
} lake;

int lake_init(lake *lk, gml_backend *be, uint64_t limit_bytes);
void lake_destroy(lake *lk); /* releases every chunk the lake holds */
static inline uint64_t lake_chunk_id(const lake *lk, uint32_t idx) {
  return ((uint64_t)lk->chunks[idx].gen << 32) | (uint64_t)(idx + 1);
}
/* Index of the chunk with this id if `owner` holds it (leased), else GML_EBADPTR. */
long lake_owned_index(const lake *lk, uint64_t id, uint64_t owner);
/* Chunks that may still be created under the limit (creating counted). */
uint64_t lake_headroom(const lake *lk);
int lake_add_created(lake *lk, gml_phys phys, int fd); /* a new free chunk */
/* Index of a chunk the lake holds whose ident is this (non-zero), else -1. */
long lake_find_ident(const lake *lk, uint64_t ident);
/* Whether a chunk with this ident was released to the driver by this lake (among the last LAKE_RETIRED_MAX). */
int lake_retired(const lake *lk, uint64_t ident);
/* Take up to n free chunks for owner; fills idx[]; returns how many.
 * lake_take takes any (tests); the daemon uses lake_take_for: only chunks
 * that are clean or were last leased to uid (the trust model: no chunk with
 * one uid's content, or that one uid's process may still map, goes to another). */
uint32_t lake_take(lake *lk, uint64_t owner, uint32_t n, uint32_t *idx);
uint32_t lake_take_for(lake *lk, uint64_t owner, uint32_t uid, uint32_t n, uint32_t *idx);
/* Free chunks last leased to uid (tainted by it). */
uint32_t lake_free_of(const lake *lk, uint32_t uid);
/* Free chunk idx is clean again (its content was scrubbed). */
void lake_mark_clean(lake *lk, uint32_t idx);
void lake_give_back(lake *lk, uint32_t idx); /* leased/parked -> free */
/* A chunk a client held before the daemon restarted: leased to owner at
 * once (a new id). Returns its index, or GML_ENOMEM. */
long lake_adopt(lake *lk, uint64_t owner, uint32_t uid, gml_phys phys, int fd);
/* An adopted chunk leased to its client leaves the lake again (the hand-over
 * failed: daemon/adopt.c): our handle released, not counted anywhere. */
void lake_unadopt(lake *lk, uint32_t idx);
void lake_park(lake *lk, uint32_t idx);                     /* leased -> parked (owner's process lives on) */
void lake_share(lake *lk, uint32_t idx, uint64_t share_id); /* leased -> shared (give_back frees it) */
void lake_destroy_chunk(lake *lk, uint32_t idx);            /* free -> released to the driver */
/* Release free chunks to the driver until at most keep_free are left; returns how many. */
uint32_t lake_trim(lake *lk, uint32_t keep_free);
/* Quota of a client (0 = none): a pid quota wins over a uid quota. */
uint64_t lake_quota_for(const lake *lk, pid_t pid, uid_t uid);
int lake_set_quota(lake *lk, int by_uid, uint32_t key, uint64_t bytes);
/* A quota for the processes of one cgroup (path as /proc/PID/cgroup gives it). */
int lake_set_quota_cgroup(lake *lk, const char *cgroup, uint64_t bytes);
/* Index of the quota named group, or -1. */
long gmli_lake_quota_named(const lake *lk, const char *group);
/* Index of the quota of that holder (by_uid: LAKE_QUOTA_*; cgroup "" but for a cgroup's), or -1. */
long gmli_lake_quota_of(const lake *lk, int by_uid, uint32_t key, const char *cgroup);
/* Name the quota at index i group (a quota has at most one name, a name at most one quota: another quota of
 * that name loses it). Its peak is kept when it had that name, else it starts at what its clients hold (held). */
void gmli_lake_name_quota(lake *lk, size_t i, const char *group, uint64_t held);
/* Remove the quota at index i. */
void gmli_lake_remove_quota(lake *lk, size_t i);
#endif
