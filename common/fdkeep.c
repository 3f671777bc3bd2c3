/* fdkeep.c: see fdkeep.h. Open addressing, backward-shift deletion. */
#include "fdkeep.h"
#include "log.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

/* Every live table, for the fork handlers. */
static pthread_mutex_t tables_lock = PTHREAD_MUTEX_INITIALIZER;
static gml_fdkeep *tables;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* Around fork(): every table locked, so the child's copies are whole; the
 * child closes what they hold and keeps nothing more. */
static void fork_prepare(void) {
  pthread_mutex_lock(&tables_lock);
  for (gml_fdkeep *k = tables; k; k = k->next) pthread_mutex_lock(&k->lock);
}

static void fork_parent(void) {
  for (gml_fdkeep *k = tables; k; k = k->next) pthread_mutex_unlock(&k->lock);
  pthread_mutex_unlock(&tables_lock);
}

static void fork_child(void) {
  for (gml_fdkeep *k = tables; k; k = k->next) {
    for (size_t i = 0; i < k->cap; i++)
      if (k->keys[i]) close(k->vals[i]), k->keys[i] = 0;
    k->count = 0;
    k->max = 0;
    k->warned = 1; /* the child has nothing to say about it */
    pthread_mutex_unlock(&k->lock);
  }
  pthread_mutex_unlock(&tables_lock);
}

static void atfork_register(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

void gmli_fdkeep_init(gml_fdkeep *k, size_t max) {
  *k = (gml_fdkeep){0};
  pthread_mutex_init(&k->lock, NULL);
  struct rlimit rl;
  if (max == SIZE_MAX && getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    max = rl.rlim_cur > GML_FDKEEP_SPARE ? (size_t)(rl.rlim_cur - GML_FDKEEP_SPARE) : 0;
  k->max = max;
  pthread_once(&atfork_once, atfork_register);
  pthread_mutex_lock(&tables_lock);
  k->next = tables;
  tables = k;
  pthread_mutex_unlock(&tables_lock);
}

void gmli_fdkeep_destroy(gml_fdkeep *k) {
  pthread_mutex_lock(&tables_lock);
  for (gml_fdkeep **p = &tables; *p; p = &(*p)->next)
    if (*p == k) {
      *p = k->next;
      break;
    }
  pthread_mutex_unlock(&tables_lock);
  for (size_t i = 0; i < k->cap; i++)
    if (k->keys[i]) close(k->vals[i]);
  free(k->keys), free(k->vals);
  pthread_mutex_destroy(&k->lock);
}

static inline size_t slot_of(uint64_t key, size_t cap) {
  return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

static int grow(gml_fdkeep *k) {
  size_t ncap = k->cap ? k->cap * 2 : 1024;
  uint64_t *nk = calloc(ncap, sizeof *nk);
  int *nv = calloc(ncap, sizeof *nv);
  if (!nk || !nv) {
    free(nk), free(nv);
    return -1;
  }
  for (size_t i = 0; i < k->cap; i++) {
    if (!k->keys[i]) continue;
    size_t j = slot_of(k->keys[i], ncap);
    while (nk[j]) j = (j + 1) & (ncap - 1);
    nk[j] = k->keys[i], nv[j] = k->vals[i];
  }
  free(k->keys), free(k->vals);
  k->keys = nk, k->vals = nv, k->cap = ncap;
  return 0;
}

int gmli_fdkeep_put(gml_fdkeep *k, uint64_t key, int fd) {
  pthread_mutex_lock(&k->lock);
  int rc = -1;
  if (key && k->count < k->max && ((k->count + 1) * 2 <= k->cap || grow(k) == 0)) {
    size_t j = slot_of(key, k->cap);
    while (k->keys[j]) j = (j + 1) & (k->cap - 1);
    k->keys[j] = key, k->vals[j] = fd;
    k->count++;
    rc = 0;
  } else if (key && k->count >= k->max && !k->warned++) {
    GML_WARN("the fd limit (RLIMIT_NOFILE) leaves room to keep %zu chunk fds: chunks beyond them cannot be "
             "shared with another process (torch.multiprocessing) nor handed to a restarted daemon; raise the "
             "limit (ulimit -n, LimitNOFILE=) to 65536 or more",
             k->max);
  }
  pthread_mutex_unlock(&k->lock);
  return rc;
}

/* The slot of key, or SIZE_MAX. Lock held. */
static size_t find(const gml_fdkeep *k, uint64_t key) {
  if (!k->cap || !key) return SIZE_MAX;
  size_t j = slot_of(key, k->cap);
  while (k->keys[j] && k->keys[j] != key) j = (j + 1) & (k->cap - 1);
  return k->keys[j] ? j : SIZE_MAX;
}

int gmli_fdkeep_dup(gml_fdkeep *k, uint64_t key) {
  pthread_mutex_lock(&k->lock);
  size_t j = find(k, key);
  int d = j == SIZE_MAX ? -1 : fcntl(k->vals[j], F_DUPFD_CLOEXEC, 0);
  int err = j == SIZE_MAX ? ENOENT : errno;
  pthread_mutex_unlock(&k->lock);
  errno = err;
  return d;
}

void gmli_fdkeep_drop(gml_fdkeep *k, uint64_t key) {
  pthread_mutex_lock(&k->lock);
  size_t j = find(k, key);
  int fd = -1;
  if (j != SIZE_MAX) {
    fd = k->vals[j];
    k->count--;
    size_t hole = j;
    for (size_t i = (j + 1) & (k->cap - 1); k->keys[i]; i = (i + 1) & (k->cap - 1)) {
      size_t home = slot_of(k->keys[i], k->cap);
      if (((i - home) & (k->cap - 1)) >= ((i - hole) & (k->cap - 1))) {
        k->keys[hole] = k->keys[i], k->vals[hole] = k->vals[i];
        hole = i;
      }
    }
    k->keys[hole] = 0;
  }
  pthread_mutex_unlock(&k->lock);
  if (fd >= 0) close(fd);
}

size_t gmli_fdkeep_count(gml_fdkeep *k) {
  pthread_mutex_lock(&k->lock);
  size_t n = k->count;
  pthread_mutex_unlock(&k->lock);
  return n;
}
