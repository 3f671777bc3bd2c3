/* fdkeep.h: fds kept by key (the cuda backend keeps the fd each imported
 * chunk came with: an imported handle cannot be exported again, so sharing
 * the chunk on, or handing it to a restarted daemon, hands out a dup).
 * A table keeps at most the fd limit less GML_FDKEEP_SPARE fds (it says once
 * when it must stop). A child made by fork() closes every kept fd at once
 * (pthread_atfork): it cannot use the parent's device memory, and its copies
 * would keep chunks allocated on the device after the lake released them. */
#ifndef GML_FDKEEP_H
#define GML_FDKEEP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define GML_FDKEEP_SPARE 4096 /* fds left for everything else the process opens */

typedef struct gml_fdkeep {
  pthread_mutex_t lock;
  uint64_t *keys; /* 0: an empty slot */
  int *vals;
  size_t cap, count, max;
  int warned;
  struct gml_fdkeep *next; /* the tables a fork must empty */
} gml_fdkeep;

/* max: fds kept at most (SIZE_MAX: the fd limit less GML_FDKEEP_SPARE). */
void gmli_fdkeep_init(gml_fdkeep *k, size_t max);
void gmli_fdkeep_destroy(gml_fdkeep *k); /* closes every kept fd */
/* Keep fd under key (nonzero); 0, or nonzero when it is not kept (the table
 * is full: the caller closes fd). */
int gmli_fdkeep_put(gml_fdkeep *k, uint64_t key, int fd);
/* A close-on-exec dup of key's fd, or -1 (errno ENOENT: none kept). */
int gmli_fdkeep_dup(gml_fdkeep *k, uint64_t key);
/* Forget key's fd and close it. */
void gmli_fdkeep_drop(gml_fdkeep *k, uint64_t key);
size_t gmli_fdkeep_count(gml_fdkeep *k);

#endif
