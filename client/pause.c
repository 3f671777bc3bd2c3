/* pause.c: gml_pause / gml_resume (gmlake.h). Pause gives a process's
 * memory back to the lake while its pointers stay valid: the content of the
 * live blocks (all, or those allocated under one tag) is copied to host
 * memory (page-locked on cuda: the backend's host_alloc) or to a file, each
 * block lets go of its slots (its chunks become free and go back with the
 * rest of the idle cache), and the block itself stays live, so its virtual
 * range is never handed out again. Resume claims the slots again (chunks
 * leased or taken from the cache, mapped at the same addresses: the
 * allocator's own slot mapping) and copies the content back.
 *
 * While paused, the allocator goes on: new allocations lease chunks as
 * usual (they never land on a paused block's addresses); a paused block that
 * is freed becomes a free block at resume (gmli_alloc_free marks it); only a
 * second pause is refused until resume. Growable ranges are not paused.
 * Everything runs under the allocator's lock, after a device synchronize
 * (the streams' work on the content is done before it is copied).
 *
 * The content moves through the copy engine (copy.c), all blocks in one call
 * each way, never block by block: to pageable memory (GMLAKE_PAUSE_HOST=pageable,
 * the default: nothing to page-lock, the engine's staging pool and threads
 * carry it) or to page-locked memory that is kept after resume for the next
 * pause (=pinned: page-locking 40 GiB costs seconds, once). Overlapped (GMLAKE_PAUSE_OVERLAP, the default),
 * the driver's give-back and map calls run while the link moves other blocks: pause gives a group's chunks
 * back as soon as its copy is done, resume issues a block's copy as soon as it is mapped. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "alloc_internal.h"
#include "client_priv.h"
#include "copy.h"
#include "log.h"
#include "options.h"
#include "planned.h"
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAUSE_BOUNCE (64u << 20)                           /* copy buffer between the device and a file */
enum { HOST_BACKEND = 1, HOST_MAPPED = 2, HOST_KEPT = 3 }; /* host_alloc, mmap, host_alloc kept for the next pause */

typedef struct paused_block {
  gml_block *b; /* NULL once resumed */
  uintptr_t addr;
  size_t size, off; /* off: where its content is saved */
} paused_block;

struct gml_pause {
  unsigned flags;
  uint32_t tag;
  paused_block *v;
  size_t n;
  void *host; /* saved content (host memory), or the bounce buffer (file) */
  size_t host_size;
  int host_kind;  /* HOST_*: how host was taken, so how it goes */
  int fd;         /* GML_PAUSE_FILE: the file, -1 otherwise */
  int dirfd;      /* its directory, as it was at pause: removed there, whatever the cwd is then */
  char path[256]; /* as given (messages); base: its last component */
  const char *base;
  uint64_t saved; /* bytes of content saved */
};

static int fail(gml_client *c, int rc, const char *fmt, const char *arg) {
  snprintf(c->last_error, sizeof c->last_error, fmt, arg);
  GML_WARN("%s", c->last_error);
  return rc;
}

static void pause_free(gml_client *c, struct gml_pause *p) {
  if (p->host && p->host_kind == HOST_MAPPED) munmap(p->host, p->host_size);
  else if (p->host && p->host_kind == HOST_KEPT && !c->pause_kept)
    c->pause_kept = p->host, c->pause_kept_size = p->host_size;
  else if (p->host) c->be->ops->host_free(c->be, p->host);
  if (p->fd >= 0) {
    /* the file made at pause, if it is still there under its name (not a relative path resolved
     * against a later cwd: that removed another file of the same name and left this one) */
    struct stat a, b;
    if (!fstat(p->fd, &a) && !fstatat(p->dirfd, p->base, &b, AT_SYMLINK_NOFOLLOW) && a.st_ino == b.st_ino &&
        a.st_dev == b.st_dev)
      unlinkat(p->dirfd, p->base, 0);
    close(p->fd);
  }
  if (p->dirfd >= 0) close(p->dirfd);
  free(p->v);
  free(p);
}

/* Copy one block between the device and the file, through the bounce buffer (to_host: save). */
static int copy_block_file(gml_client *c, struct gml_pause *p, paused_block *pb, int to_host) {
  for (size_t done = 0; done < pb->size;) {
    size_t n = GML_MIN(pb->size - done, p->host_size);
    off_t at = (off_t)(pb->off + done);
    int rc = 0;
    if (to_host) {
      rc = gml_copy(c, p->host, (void *)(pb->addr + done), n, GML_COPY_D2H);
      if (!rc && pwrite(p->fd, p->host, n, at) != (ssize_t)n) rc = GML_ESYS;
    } else {
      if (pread(p->fd, p->host, n, at) != (ssize_t)n) rc = GML_ESYS;
      if (!rc) rc = gml_copy(c, (void *)(pb->addr + done), p->host, n, GML_COPY_H2D);
    }
    if (rc) return rc;
    done += n;
  }
  return 0;
}

/* Block pb's copy between the device and its saved place in host memory (to_host: save). */
static gml_copy_desc block_copy(const struct gml_pause *p, const paused_block *pb, int to_host) {
  char *h = (char *)p->host + pb->off;
  return to_host ? (gml_copy_desc){h, (void *)pb->addr, pb->size, GML_COPY_D2H}
                 : (gml_copy_desc){(void *)pb->addr, h, pb->size, GML_COPY_H2D};
}

/* The content of blocks v[from, to) (those with want set: not freed while paused) between the device and
 * its saved place, in one call to the copy engine (to_host: save). */
static int copy_blocks(gml_client *c, struct gml_pause *p, size_t from, size_t to, const char *want, int to_host) {
  if (p->fd >= 0) {
    for (size_t i = from; i < to; i++) {
      int rc = want && !want[i] ? 0 : copy_block_file(c, p, &p->v[i], to_host);
      if (rc) return rc;
    }
    return 0;
  }
  gml_copy_desc *d = calloc(to - from + 1, sizeof *d);
  if (!d) return GML_ENOMEM;
  size_t n = 0;
  uint64_t bytes = 0, t0 = gmli_now_ns();
  for (size_t i = from; i < to; i++) {
    if (want && !want[i]) continue;
    d[n++] = block_copy(p, &p->v[i], to_host);
    bytes += p->v[i].size;
  }
  int rc = n ? gmli_copy_many(c, d, n, 0, 1, to_host ? "pause" : "resume") : 0;
  free(d);
  double s = (gmli_now_ns() - t0) / 1e9;
  if (!rc && n)
    GML_INFO("%s: %zu block(s), %.2f GB copied in %.3f s (%.1f GB/s, %s host memory)", to_host ? "pause" : "resume", n,
             bytes / 1e9, s, s > 0 ? bytes / 1e9 / s : 0.0, p->host_kind == HOST_MAPPED ? "pageable" : "page-locked");
  return rc;
}

/* GMLAKE_PAUSE_OVERLAP: a pause to host memory gives each group of blocks' chunks back while later groups
 * copy, a resume copies a block back while it maps the next (pause.c's head). */
size_t gmli_pause_group = 256u << 20; /* bytes of blocks copied together before their chunks go back */

static int overlap_on(const struct gml_pause *p) {
  return p->fd < 0 && p->host && gmli_env_flag(GML_ENV_PAUSE_OVERLAP, gmli_env(GML_ENV_PAUSE_OVERLAP), 1);
}

/* Block i lets go of its slots: it stays live, its chunks become free; back: and go back to the source at
 * once (the device is done with them: the caller waited for their copy). Returns the chunks given back.
 * a->lock held. */
static size_t let_go(gml_allocator *a, struct gml_pause *p, size_t i, int back) {
  gml_block *b = p->v[i].b;
  uint32_t first, last;
  size_t n = 0;
  block_slots(a, b, &first, &last);
  for (uint32_t s = first; s <= last; s++)
    if (--a->slot_use[s] == 0) {
      int32_t ci = a->slot_chunk[s];
      slot_release(a, s);
      if (back && !gmli_chunk_give_back(a, ci)) n++; /* else kept (an unmap refused): the idle release retries */
    }
  a->allocated -= b->usable;
  if (b->stitched) a->stitched -= b->usable;
  a->paused_bytes += b->usable;
  b->paused = GML_PAUSED;
  a->chunks_released += n;
  return n;
}

/* Pause's save, overlapped: every group's copies issued (an event after each), then group after group
 * waited for and let go, its chunks given back while the link moves the next. A copy that fails to
 * start fails the pause whole (nothing let go); one that fails on the device leaves the groups before it
 * paused (content saved) and the rest not: *kept, the blocks paused. a->lock held. */
static int save_overlapped(gml_client *c, struct gml_pause *p, size_t *kept, size_t *back) {
  gml_allocator *a = &c->alloc;
  gml_backend *be = c->be;
  size_t ng = 0, *end = calloc(p->n + 1, sizeof *end);
  uintptr_t *ev = calloc(p->n + 1, sizeof *ev);
  gml_copy_desc *d = calloc(p->n + 1, sizeof *d);
  int rc = end && ev && d ? 0 : GML_ENOMEM;
  uint64_t t0 = gmli_now_ns();
  for (size_t i = 0; i < p->n && !rc;) {
    size_t j = i, bytes = 0;
    for (; j < p->n && (j == i || bytes < gmli_pause_group); j++) {
      d[j] = block_copy(p, &p->v[j], 1);
      bytes += p->v[j].size;
    }
    if (!(rc = gmli_copy_many(c, d + i, j - i, 0, 0, "pause")) && !(rc = be->ops->event_record(be, 0, &ev[ng])))
      end[ng++] = j;
    i = j;
  }
  if (rc) { /* nothing let go; what was issued settles before the host memory goes */
    be->ops->synchronize(be);
    for (size_t g = 0; g < ng; g++) be->ops->event_destroy(be, ev[g]);
    ng = 0;
  }
  size_t i = 0;
  uint64_t t1 = gmli_now_ns();
  for (size_t g = 0; g < ng; g++) {
    int wrc = rc ? rc : be->ops->event_wait(be, ev[g]);
    be->ops->event_destroy(be, ev[g]);
    if (wrc) {
      if (!rc) be->ops->synchronize(be); /* later groups' copies settle before the host memory can go */
      rc = wrc;
      continue;
    }
    for (; i < end[g]; i++) *back += let_go(a, p, i, 1);
  }
  *kept = i;
  double s = (gmli_now_ns() - t0) / 1e9;
  if (!rc && p->n)
    GML_INFO("pause: %zu block(s), %.2f GB copied in %.3f s (%.1f GB/s, %s host memory; chunks given back as "
             "copied, the last %.3f s after the copies were issued)",
             p->n, p->saved / 1e9, s, s > 0 ? p->saved / 1e9 / s : 0.0,
             p->host_kind == HOST_MAPPED ? "pageable" : "page-locked", (gmli_now_ns() - t1) / 1e9);
  free(end), free(ev), free(d);
  return rc;
}

/* The live blocks to pause (tag 0: all), their sizes summed. a->lock held. */
static int collect(gml_allocator *a, struct gml_pause *p, size_t *total) {
  size_t cap = a->live.count ? a->live.count : 1;
  p->v = calloc(cap, sizeof *p->v);
  if (!p->v) return GML_ENOMEM;
  *total = 0;
  for (size_t i = 0; i < a->live.cap; i++) {
    gml_block *b = a->live.vals[i];
    if (!a->live.keys[i] || !b || (p->tag && b->pause_tag != p->tag)) continue;
    p->v[p->n++] = (paused_block){b, b->ptr, b->usable, *total};
    *total += b->usable;
  }
  return 0;
}

static int save_storage(gml_client *c, struct gml_pause *p, size_t total, const char *path) {
  if (p->flags & GML_PAUSE_DISCARD || !total) return 0;
  if (p->flags & GML_PAUSE_FILE) {
    if (strlen(path) >= sizeof p->path) /* cut short, resume would remove another file */
      return fail(c, GML_EINVAL, "pause: a path of at most %s bytes", "255");
    snprintf(p->path, sizeof p->path, "%s", path);
    char dir[sizeof p->path];
    p->base = gmli_path_dir(p->path, dir, sizeof dir);
    if (!*p->base) return fail(c, GML_EINVAL, "pause: %s: a directory, not a file name", p->path);
    p->dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    /* a new file only: one that exists (another user may have made it, mode 0666, in a directory both
     * may write) or a symlink would get the content where someone else reads it */
    p->fd = p->dirfd < 0 ? -1 : openat(p->dirfd, p->base, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (p->fd < 0) {
      char why[sizeof p->path + 64];
      int e = errno;
      snprintf(why, sizeof why, "%s: %s%s", path, strerror(e),
               e == EEXIST || e == ELOOP ? " (a pause file must be new)" : "");
      return fail(c, GML_ESYS, "pause: cannot create %s", why);
    }
    p->host_size = GML_MIN(total, (size_t)PAUSE_BOUNCE);
  } else {
    p->host_size = total;
    const char *how = gmli_env(GML_ENV_PAUSE_HOST);
    if (how && strcmp(how, "pinned") && strcmp(how, "pageable"))
      GML_WARN("GMLAKE_PAUSE_HOST=%s ignored: pageable or pinned was expected; pageable", how);
    if (how && !strcmp(how, "pinned")) {
      p->host_kind = HOST_KEPT;
      if (c->pause_kept && c->pause_kept_size >= total) { /* the last pause's, page-locked already */
        p->host = c->pause_kept, p->host_size = c->pause_kept_size;
        c->pause_kept = NULL;
        return 0;
      }
      if (c->pause_kept) c->be->ops->host_free(c->be, c->pause_kept), c->pause_kept = NULL;
    } else {
      /* pageable: the engine stages it; huge pages, where the kernel has them, make its first touch cheap */
      void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m != MAP_FAILED) {
        madvise(m, total, MADV_HUGEPAGE);
        p->host = m, p->host_kind = HOST_MAPPED;
        return 0;
      }
      char what[32];
      return fail(c, GML_ENOMEM, "pause: no host memory for %s of content",
                  gmli_format_bytes(total, what, sizeof what));
    }
  }
  if (!p->host_kind) p->host_kind = HOST_BACKEND;
  int rc = c->be->ops->host_alloc(c->be, p->host_size, &p->host);
  if (rc) {
    p->host = NULL;
    char what[32];
    return fail(c, GML_ENOMEM, "pause: no host memory for %s of content",
                gmli_format_bytes(p->host_size, what, sizeof what));
  }
  return 0;
}

/* A path implies GML_PAUSE_FILE: gml_pause_file(c, 0, 0, path) saves to the
 * file (it was GML_EINVAL, with no message). With a NULL path it is gml_pause. */
static int pause_at(gml_client *c, unsigned flags, uint32_t tag, const char *path, const char *fn);

int gml_pause_file(gml_client *c, unsigned flags, uint32_t tag, const char *path) {
  if (path) flags |= GML_PAUSE_FILE;
  return pause_at(c, flags, tag, path, "gml_pause_file");
}

int gml_pause(gml_client *c, unsigned flags, uint32_t tag) { return pause_at(c, flags, tag, NULL, "gml_pause"); }

static int pause_at(gml_client *c, unsigned flags, uint32_t tag, const char *path, const char *fn) {
  if (!c) return GML_EINVAL;
  if (flags & ~(unsigned)(GML_PAUSE_DISCARD | GML_PAUSE_FILE))
    return gmli_fail(c, GML_EINVAL, "%s: flags %#x: unknown bits (GML_PAUSE_DISCARD, GML_PAUSE_FILE)", fn, flags);
  /* discard with a file: the path was ignored, nothing saved, and the caller told nothing */
  if ((flags & GML_PAUSE_DISCARD) && (flags & GML_PAUSE_FILE))
    return gmli_fail(c, GML_EINVAL, "%s: GML_PAUSE_DISCARD saves nothing, %s saves the content: one or the other", fn,
                     path ? "a path" : "GML_PAUSE_FILE");
  if ((flags & GML_PAUSE_FILE) && !path)
    return gmli_fail(c, GML_EINVAL, "%s: GML_PAUSE_FILE needs a path (gml_pause_file with a non-NULL path)", fn);
  if (path && !*path) /* was GML_ESYS from open(""), while Python's path="" was taken for none */
    return gmli_fail(c, GML_EINVAL, "%s: an empty path (NULL for none)", fn);
  gml_allocator *a = &c->alloc;
  if (a->guard) return fail(c, GML_EINVAL, "pause: %s", "refused in guard mode (a remap would drop the guards)");
  struct gml_pause *p = calloc(1, sizeof *p);
  if (!p) return GML_ENOMEM;
  p->flags = flags;
  p->tag = tag;
  p->fd = -1;
  p->dirfd = -1;
  pthread_mutex_lock(&a->lock);
  if (c->pause) {
    pthread_mutex_unlock(&a->lock);
    free(p);
    return fail(c, GML_EINVAL, "pause: %s", "already paused (resume first)");
  }
  c->last_error[0] = 0;
  size_t total = 0;
  int rc = a->be->ops->synchronize(a->be); /* the streams are done with the content */
  if (!rc) rc = collect(a, p, &total);
  if (!rc) rc = save_storage(c, p, total, path);
  int overlap = !rc && overlap_on(p);
  size_t kept = 0, given = 0;
  a->tick++;
  if (overlap) {
    p->saved = total;
    if ((rc = save_overlapped(c, p, &kept, &given)) && kept) { /* the blocks before the failure stay paused */
      p->n = kept;
      p->saved = p->v[kept - 1].off + p->v[kept - 1].size;
      c->pause = p;
      pthread_mutex_unlock(&a->lock);
      gmli_alloc_release_idle(a, 0);
      char s1[32];
      snprintf(c->last_error, sizeof c->last_error,
               "pause: copying content failed (%s) after %zu block(s) of %s were saved and paused: gml_resume "
               "brings them back",
               gml_strerror(rc), kept, gmli_format_bytes(p->saved, s1, sizeof s1));
      GML_WARN("%s", c->last_error);
      if (c->mode == GML_MODE_DAEMON) gmli_client_report(c);
      return rc;
    }
  } else if (!rc && p->host) rc = copy_blocks(c, p, 0, p->n, NULL, 1);
  if (rc) {
    pthread_mutex_unlock(&a->lock);
    pause_free(c, p);
    if (!c->last_error[0]) fail(c, rc, "pause: saving content failed (%s)", gml_strerror(rc));
    return rc;
  }
  p->saved = p->host ? total : 0;
  for (size_t i = kept; i < p->n; i++) let_go(a, p, i, 0); /* the blocks stay live, their chunks become free */
  c->pause = p;
  pthread_mutex_unlock(&a->lock);
  /* every free chunk goes back, the paused blocks' with them (overlapped: those went back as copied) */
  size_t back = gmli_alloc_release_idle(a, 0) + given * a->cs;
  char s1[32], s2[32];
  GML_INFO("paused %zu block(s) of %s (tag %u, %s saved%s%s); %s of chunks back to the lake", p->n,
           gmli_format_bytes(total, s1, sizeof s1), tag, p->saved ? "content" : "nothing", p->fd >= 0 ? " to " : "",
           p->fd >= 0 ? p->path : "", gmli_format_bytes(back, s2, sizeof s2));
  if (c->mode == GML_MODE_DAEMON) gmli_client_report(c);
  return 0;
}

/* A block freed while paused becomes an ordinary free block. a->lock held. */
static void free_paused(gml_allocator *a, gml_block *b) {
  if (b->planned == GMLI_BLOCK_PLANNED) { /* served in a planned range: no region's block (planned.c) */
    gmli_planned_free(a, b, 0);
    return;
  }
  gml_region *r = &a->regions[b->region];
  b->paused = GML_PAUSED_NO;
  b->is_free = 1;
  b->pool = (uint8_t)pool_index(a, r, b->stream, 1);
  b->has_event = 0;
  gmli_pool_add(r, b->pool, gmli_block_coalesce(a, r, b));
}

int gml_resume(gml_client *c) {
  if (!c) return GML_EINVAL;
  gml_allocator *a = &c->alloc;
  int rc = 0;
  pthread_mutex_lock(&a->lock);
  struct gml_pause *p = c->pause;
  if (!p) { /* as a second pause is refused: a resume meant for another client, or after a failed pause */
    pthread_mutex_unlock(&a->lock);
    return gmli_fail(c, GML_EINVAL, "gml_resume: not paused (gml_pause first)");
  }
  char *mapped = p->saved ? calloc(p->n ? p->n : 1, 1) : NULL; /* blocks mapped here: their content goes back */
  if (p->saved && !mapped) {
    pthread_mutex_unlock(&a->lock);
    return gmli_fail(c, GML_ENOMEM, "gml_resume: no memory");
  }
  /* the streams are done with the chunks the blocks will take before content is copied in on stream 0 */
  if ((rc = a->be->ops->synchronize(a->be))) {
    pthread_mutex_unlock(&a->lock);
    free(mapped);
    return gmli_fail(c, rc, "gml_resume: the device failed before resuming (%s): nothing resumed", gml_strerror(rc));
  }
  a->tick++;
  int overlap = mapped && overlap_on(p), crc = 0;
  uint64_t t0 = gmli_now_ns();
  /* a copy that failed to start stops the mapping: the blocks after it stay paused, content saved, for the
   * next gml_resume (the failed one's content is lost, and said so) */
  for (size_t i = 0; i < p->n && !rc && !crc; i++) {
    gml_block *b = p->v[i].b;
    if (!b) continue;
    a->paused_bytes -= b->usable;
    if (b->paused == GML_PAUSED_FREED) {
      free_paused(a, b);
      p->v[i].b = NULL;
      continue;
    }
    uint32_t first, last;
    block_slots(a, b, &first, &last);
    size_t need = 0;
    for (uint32_t s = first; s <= last; s++) need += (size_t)slot_claim(a, s, b->stream);
    int stole = 0;
    if (need && (rc = gmli_map_slots_slow(a, first, last, b->stream, &stole))) {
      gmli_slots_unclaim(a, first, last);
      a->paused_bytes += b->usable;
      char s1[32], s2[32];
      snprintf(c->last_error, sizeof c->last_error, "resume: no memory for a paused block of %s (%s still paused): %s",
               gmli_format_bytes(b->usable, s1, sizeof s1), gmli_format_bytes(a->paused_bytes, s2, sizeof s2),
               gml_strerror(rc));
      break;
    }
    b->paused = GML_PAUSED_NO;
    b->stitched = (uint8_t)stole;
    a->allocated += b->usable;
    if (b->stitched) a->stitched += b->usable;
    if (a->allocated > a->peak_allocated) a->peak_allocated = a->allocated;
    if (reserved_bytes(a) > a->peak_reserved) a->peak_reserved = reserved_bytes(a);
    if (mapped) mapped[i] = 1;
    p->v[i].b = NULL;
    if (overlap && !crc) { /* its content on its way while the next block maps */
      gml_copy_desc d = block_copy(p, &p->v[i], 0);
      crc = gmli_copy_many(c, &d, 1, 0, 0, "resume");
    }
  }
  /* every block mapped, then their content in one go (also where a later block found no memory);
   * overlapped: the copies issued as each block mapped, waited for here */
  uint64_t t1 = gmli_now_ns();
  if (!overlap) crc = mapped ? copy_blocks(c, p, 0, p->n, mapped, 0) : 0;
  else {
    uintptr_t ev;
    int wrc = c->be->ops->event_record(c->be, 0, &ev);
    if (!wrc) wrc = c->be->ops->event_wait(c->be, ev), c->be->ops->event_destroy(c->be, ev);
    else c->be->ops->synchronize(c->be);
    if (!crc) crc = wrc;
  }
  free(mapped);
  if (crc && !rc) {
    rc = crc;
    snprintf(c->last_error, sizeof c->last_error, "resume: restoring content failed (%s)%s", gml_strerror(rc),
             overlap ? ": the block where it failed lost its content; the blocks after it stay paused (gml_resume "
                       "again)"
                     : "");
  }
  if (overlap)
    GML_INFO("resume: blocks mapped and their content copied as each mapped in %.3f s, the last copies waited for "
             "%.3f s (%.1f GB/s)",
             (t1 - t0) / 1e9, (gmli_now_ns() - t1) / 1e9, p->saved / 1e9 / GML_MAX((gmli_now_ns() - t0) / 1e9, 1e-9));
  else GML_INFO("resume: blocks mapped in %.3f s, content back in %.3f s", (t1 - t0) / 1e9, (gmli_now_ns() - t1) / 1e9);
  if (!rc) c->pause = NULL;
  pthread_mutex_unlock(&a->lock);
  if (rc) { /* what is resumed stays so; gml_resume again takes the rest */
    GML_WARN("%s", c->last_error);
    return rc == GML_EQUOTA || rc == GML_EDAEMON || rc == GML_EBACKEND || rc == GML_ESYS ? rc : GML_ENOMEM;
  }
  GML_INFO("resumed %zu block(s) at their addresses", p->n);
  pause_free(c, p);
  if (c->mode == GML_MODE_DAEMON) gmli_client_report(c);
  return 0;
}

int gml_set_tag(gml_client *c, uint32_t tag) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->alloc.lock);
  c->alloc.tag = tag;
  pthread_mutex_unlock(&c->alloc.lock);
  return 0;
}

void gmli_pause_stats(gml_client *c, gml_stats *st) {
  pthread_mutex_lock(&c->alloc.lock);
  st->paused_bytes = c->alloc.paused_bytes;
  st->paused_saved = c->pause ? c->pause->saved : 0;
  pthread_mutex_unlock(&c->alloc.lock);
}

void gmli_pause_destroy(gml_client *c) {
  if (c->pause) pause_free(c, c->pause);
  c->pause = NULL;
  if (c->pause_kept) c->be->ops->host_free(c->be, c->pause_kept); /* GMLAKE_PAUSE_HOST=pinned's, kept */
  c->pause_kept = NULL;
}

const gml_holder_ops gmli_pause_holder = {.usage = gmli_pause_stats};
