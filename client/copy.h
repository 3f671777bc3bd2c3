/* copy.h: the copy engine's insides (the API is gmlake.h's gml_copy*).
 * staging.c: the page-locked staging pool, cut into slots, and the threads
 * that copy between pageable memory and it. copy.c: the copies themselves,
 * direct, staged (pipelined over the slots), packed and batched. */
#ifndef GML_COPY_H
#define GML_COPY_H
#include "backend.h"
#include "gmlake.h"
#include "paths.h"
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define GMLI_STAGING_SLOTS 4
#define GMLI_COPY_THREADS_MAX 64

typedef struct gmli_memcpy_job {
  char *dst;
  const char *src;
  size_t n, part;
  size_t next, parts, finished; /* parts handed out, in all, done */
} gmli_memcpy_job;

/* Multi-path copies (mpath.c). A peer path: GMLI_PEER_SLOTS slots of staging on the peer GPU, its
 * stream for the host hop (link), one of this GPU's for the P2P hop (hop), each slot's last use. */
#define GMLI_PEER_SLOTS 4
typedef struct gmli_peer_path {
  int device;
  int failed;
  uintptr_t staging, link, hop;
  uintptr_t ev[GMLI_PEER_SLOTS]; /* where has_ev: the slot's last second hop (it may be refilled after) */
  int has_ev[GMLI_PEER_SLOTS];
  int next; /* the slot to use next, the oldest */
} gmli_peer_path;
typedef struct gmli_mpath {
  int probed;         /* the paths and the plans below are known */
  size_t min_bytes;   /* a page-locked copy this large or more is split (64 MiB; tests lower it) */
  size_t slot_size;   /* of the peers' staging (16 MiB) */
  size_t probe_bytes; /* a timed probe's copy (256 MiB) */
  int npeers;         /* path i > 0 is peer[i - 1] */
  gmli_peer_path peer[GMLI_PATHS_MAX - 1];
  gmli_path_plan plan[2]; /* H2D, D2H */
  /* the probe's measure: NULL: copies timed (GML_BACKEND_COPY_TIMING), else a model of independent links */
  gmli_path_measure measure;
  void *measure_ctx;
} gmli_mpath;

/* One per client, made at its first copy (gmli_copier_get), gone at gml_close. */
typedef struct gmli_copier {
  gml_backend *be;
  pthread_mutex_t lock; /* one copy at a time uses the slots and the threads */
  /* the staging pool: size bytes of host_alloc (page-locked on cuda), slots of slot_size */
  char *base;
  size_t size, slot_size;
  int staging_failed;               /* host_alloc refused it: pageable copies go to the driver as they are */
  uintptr_t ev[GMLI_STAGING_SLOTS]; /* the last copy from or into each slot, where has_ev */
  int next_slot;                    /* the slot to use next: taken in turn, the oldest first */
  int has_ev[GMLI_STAGING_SLOTS];
  /* the copying threads */
  int nthreads;
  pthread_t threads[GMLI_COPY_THREADS_MAX];
  pthread_mutex_t wlock;
  pthread_cond_t work, done;
  gmli_memcpy_job job;
  int stop;
  gml_copy_info info; /* counters, under lock */
  gmli_mpath mp;
} gmli_copier;

struct gml_client;
/* The client's engine, made at first use (NULL: no memory for it). */
gmli_copier *gmli_copier_get(struct gml_client *c);
/* Waits for the copies still using slots, stops the threads, frees the pool. */
void gmli_copier_destroy(struct gml_client *c);

/* staging.c, under k->lock: the pool taken at first use (0; GML_ENOMEM where host_alloc
 * refused it, then never asked again), a slot free for reuse (its last copy waited for), and
 * memcpy split across the threads. */
int gmli_staging_ready(gmli_copier *k);
int gmli_staging_slot_wait(gmli_copier *k, int slot);
int gmli_staging_slot_mark(gmli_copier *k, int slot, uintptr_t stream);
void gmli_par_memcpy(gmli_copier *k, void *dst, const void *src, size_t n);
int gmli_staging_init(gmli_copier *k, gml_backend *be);
void gmli_staging_destroy(gmli_copier *k);

/* copy.c: what pause/resume and the API share. Copies v[0..count) (validated
 * kinds) on stream; sync: return once all are done. c->last_error says what
 * failed. */
int gmli_copy_many(struct gml_client *c, const gml_copy_desc *v, size_t count, uintptr_t stream, int sync,
                   const char *fn);
/* mpath.c, under k->lock. Whether d (validated) is split over several paths: probes at the first copy
 * that could be (GMLAKE_COPY_PATHS, backend, size, page-locked host side); 0: a single path. */
int gmli_mpath_wanted(gmli_copier *k, const gml_copy_desc *d);
/* d split as the probe planned, on stream: 0, or the error with *at the first byte of d not known to be
 * copied and what failed in why. A peer path failing has its part redone on the own link (the copy
 * succeeds; the path is not used again). */
int gmli_mpath_copy(gmli_copier *k, const gml_copy_desc *d, uintptr_t stream, size_t *at, char *why, size_t whylen);
/* The peers' staging and streams given back (the copies using them waited for). */
void gmli_mpath_destroy(gmli_copier *k);
/* gml_copy_probe: the paths probed now if they were not (k->lock held). */
int gmli_mpath_probe(gmli_copier *k);
#endif
