/* ipc_fds.c: an allocation's chunks as fds of this process, for receivers
 * that take them themselves with pidfd_getfd (gml_ipc_export_fds): the format
 * PyTorch's expandable segments share in, which any PyTorch process's own
 * allocator opens. The fds stay open while the allocation lives (the
 * receiver fetches them when it opens the handle, which PyTorch does while
 * the sender keeps the storage alive); its free or the client's close (via
 * gmli_ipc_forget) closes them. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "alloc.h"
#include "client_priv.h"
#include "log.h"
#include "util.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define FDS_MAX_CHUNKS 65536

typedef struct kept_fds {
  gml_client *c;
  uintptr_t ptr;
  size_t n, offset;
  int *fds;
  struct kept_fds *next;
} kept_fds;

static kept_fds *kept;
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

/* Under Yama's ptrace_scope 1 only a process's ancestors may take its fds, and torch.multiprocessing's
 * receivers are its children: let this user's processes take them (scope 0 is Linux's rule without
 * Yama; 2 and 3 forbid it whatever is asked, and the receiver says so). */
static void allow_fetchers(void) {
  static int done;
  if (__atomic_exchange_n(&done, 1, __ATOMIC_RELAXED)) return;
  FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  int scope = -1;
  if (f) {
    if (fscanf(f, "%d", &scope) != 1) scope = -1;
    fclose(f);
  }
  if (scope != 1) return;
  if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0)
    GML_INFO("ipc: kernel.yama.ptrace_scope is 1: processes of this user may now take this process's shared "
             "chunks' fds (pidfd_getfd), as PyTorch's receivers of expandable-segment handles do");
  else
    GML_WARN("ipc: prctl(PR_SET_PTRACER): %s; receivers that are not this process's ancestors cannot open its "
             "shared tensors (kernel.yama.ptrace_scope is 1)",
             strerror(errno));
}

static void drop(kept_fds *k) {
  for (size_t i = 0; i < k->n; i++) close(k->fds[i]);
  free(k->fds);
  free(k);
}

void gmli_ipc_fds_forget(gml_client *c, uintptr_t ptr) {
  pthread_mutex_lock(&kept_lock);
  for (kept_fds **pp = &kept; *pp;) {
    kept_fds *k = *pp;
    if (k->c == c && (!ptr || k->ptr == ptr)) *pp = k->next, drop(k);
    else pp = &k->next;
  }
  pthread_mutex_unlock(&kept_lock);
}

static int give(const kept_fds *k, int *fds, size_t max, size_t *n, size_t *offset) {
  if (max) memcpy(fds, k->fds, GML_MIN(max, k->n) * sizeof *fds);
  *n = k->n, *offset = k->offset;
  return 0;
}

int gml_ipc_export_fds(gml_client *c, void *ptr, int *fds, size_t max, size_t *n, size_t *offset, size_t *chunk_size) {
  if (!c) return GML_EINVAL;
  if ((max && !fds) || !n || !offset || !chunk_size)
    return gmli_fail(c, GML_EINVAL, "gml_ipc_export_fds: %s is NULL",
                     !n            ? "n"
                     : !offset     ? "offset"
                     : !chunk_size ? "chunk_size"
                                   : "fds");
  *chunk_size = c->alloc.cs;
  pthread_mutex_lock(&c->track_lock);
  gml_rec *r = gmli_recmap_get(&c->recs, (uintptr_t)ptr, 0);
  if (!r || r->state != GML_BLOCK_ALLOCATED) {
    pthread_mutex_unlock(&c->track_lock);
    return gmli_fail(c, GML_EBADPTR, "gml_ipc_export_fds: %p is not the start of a live allocation of this client",
                     ptr);
  }
  pthread_mutex_lock(&kept_lock);
  for (kept_fds *k = kept; k; k = k->next)
    if (k->c == c && k->ptr == (uintptr_t)ptr) { /* exported before: the same fds */
      give(k, fds, max, n, offset);
      pthread_mutex_unlock(&kept_lock);
      pthread_mutex_unlock(&c->track_lock);
      return 0;
    }
  pthread_mutex_unlock(&kept_lock);
  int rc = GML_ENOMEM;
  size_t got = 0, off = 0, size = 0;
  gml_phys *phys = malloc(FDS_MAX_CHUNKS * sizeof *phys);
  kept_fds *k = calloc(1, sizeof *k);
  if (phys && k) rc = gmli_alloc_block_phys(&c->alloc, ptr, phys, FDS_MAX_CHUNKS, &got, &off, &size);
  if (!rc && !(k->fds = malloc(got * sizeof *k->fds))) rc = GML_ENOMEM;
  for (size_t i = 0; !rc && i < got; i++, k->n++)
    if ((rc = c->be->ops->chunk_export(c->be, phys[i], &k->fds[i]))) break;
  free(phys);
  if (rc) {
    if (k) k->fds ? drop(k) : free(k);
    pthread_mutex_unlock(&c->track_lock);
    return gmli_fail(c, rc, "gml_ipc_export_fds: the chunks of %p could not be exported: %s", ptr, gml_strerror(rc));
  }
  k->c = c, k->ptr = (uintptr_t)ptr, k->offset = off;
  r->exported = 1; /* its free calls gmli_ipc_forget, which closes them */
  pthread_mutex_lock(&kept_lock);
  k->next = kept, kept = k;
  give(k, fds, max, n, offset);
  pthread_mutex_unlock(&kept_lock);
  pthread_mutex_unlock(&c->track_lock);
  allow_fetchers();
  return 0;
}
