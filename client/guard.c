/* guard.c: guard mode (its setting, its fault report) and gml_block_of,
 * which names the allocation of any address from what the allocator
 * recorded. Where a guarded block's pointer goes is policy.h's; making its
 * guards (unmapping a slot, protecting a page) is slots.c's.
 *
 * The fault report, on the host backend: when the first
 * allocator turns guard mode on, a SIGSEGV handler is installed (chaining
 * to the one that was there). On a fault it looks the address up in every
 * guarded allocator and prints, on stderr, the allocation the access
 * overran: its pointer, size, where the address lies past its end (or before
 * its start), its allocation number, how long ago it was allocated and, with
 * GMLAKE_GUARD_BACKTRACE=1, where. Then it puts the previous handler back
 * and returns: the access faults again and that handler (or the default
 * action, which kills the process with SIGSEGV) runs with the real context.
 * On cuda a fault kills the CUDA context instead of raising a signal; there
 * gml_block_of, from the Python error path or a compute-sanitizer report,
 * names the block. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "alloc_internal.h"
#include "guard.h"
#include "planned.h"
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GUARD_MAX_ALLOCATORS 64

static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static gml_allocator *guarded[GUARD_MAX_ALLOCATORS];
static struct sigaction prev_action;
static int installed;

static void put_str(const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t k = write(2, s, n);
    if (k <= 0) return;
    s += k, n -= (size_t)k;
  }
}

/* Format one report line; snprintf allocates nothing for these formats. */
static void report(uintptr_t addr, const gml_block_info *bi, void *const *bt, int nbt) {
  char line[512];
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  uint64_t now_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
  double ago = now_ns > bi->alloc_ns ? (double)(now_ns - bi->alloc_ns) / 1e9 : 0;
  const char *where = bi->where == GML_AT_GUARD_AFTER ? "in its guard"
                      : bi->where == GML_AT_BEFORE    ? "before it"
                      : bi->where == GML_AT_INSIDE    ? "inside it"
                                                      : "past its end";
  if (bi->offset >= (int64_t)bi->size)
    snprintf(line, sizeof line,
             "gmlake: SIGSEGV at %#lx: %llu bytes past the end of allocation #%llu (ptr %#lx, size %zu, usable %zu; "
             "offset %lld, %s), "
             "allocated %.3f s ago (at %llu.%03llu) on stream %#lx\n",
             (unsigned long)addr, (unsigned long long)(bi->offset - (int64_t)bi->size), (unsigned long long)bi->seq,
             (unsigned long)bi->ptr, bi->size, bi->usable, (long long)bi->offset, where, ago,
             (unsigned long long)(bi->alloc_ns / 1000000000ull), (unsigned long long)(bi->alloc_ns / 1000000ull % 1000),
             (unsigned long)bi->stream);
  else
    snprintf(line, sizeof line,
             "gmlake: SIGSEGV at %#lx: %lld bytes before its start of allocation #%llu (ptr %#lx, size %zu, usable "
             "%zu; offset %lld, %s), "
             "allocated %.3f s ago (at %llu.%03llu) on stream %#lx\n",
             (unsigned long)addr, (long long)-bi->offset, (unsigned long long)bi->seq, (unsigned long)bi->ptr, bi->size,
             bi->usable, (long long)bi->offset, where, ago, (unsigned long long)(bi->alloc_ns / 1000000000ull),
             (unsigned long long)(bi->alloc_ns / 1000000ull % 1000), (unsigned long)bi->stream);
  put_str(line);
  if (nbt > 0) {
    put_str("gmlake: it was allocated at:\n");
    backtrace_symbols_fd(bt, nbt, 2);
  }
}

static void on_segv(int sig, siginfo_t *si, void *uc) {
  uintptr_t addr = (uintptr_t)si->si_addr;
  int named = 0;
  for (int i = 0; i < GUARD_MAX_ALLOCATORS && !named; i++) {
    gml_allocator *a = __atomic_load_n(&guarded[i], __ATOMIC_ACQUIRE);
    if (!a || !gmli_alloc_owns(a, addr)) continue;
    gml_block_info bi;
    void *bt[GML_GUARD_BT];
    int nbt = 0;
    if (gmli_alloc_block_of_crash(a, addr, &bi, bt, &nbt) == 0) {
      report(addr, &bi, bt, nbt);
    } else {
      char line[160];
      snprintf(line, sizeof line, "gmlake: SIGSEGV at %#lx: in the lake's range but in no live allocation (freed?)\n",
               (unsigned long)addr);
      put_str(line);
    }
    named = 1;
  }
  if (!named &&
      (prev_action.sa_flags & SA_SIGINFO ? prev_action.sa_sigaction != NULL
                                         : prev_action.sa_handler != SIG_DFL && prev_action.sa_handler != SIG_IGN)) {
    /* not ours: the previous handler's, and ours stays for the next one */
    if (prev_action.sa_flags & SA_SIGINFO) prev_action.sa_sigaction(sig, si, uc);
    else prev_action.sa_handler(sig);
    return;
  }
  /* ours (we are dying) or no handler before us: put the previous action
   * back and return; the access faults again and it runs with the real context */
  sigaction(SIGSEGV, &prev_action, NULL);
  if (si->si_code <= 0) raise(sig); /* sent by kill(): returning would not fault again */
}

int gmli_guard_register(gml_allocator *a) {
  pthread_mutex_lock(&guard_lock);
  int slot = -1;
  for (int i = 0; i < GUARD_MAX_ALLOCATORS; i++) {
    if (guarded[i] == a) slot = i;
    else if (slot < 0 && !guarded[i]) slot = i;
  }
  if (slot < 0) {
    pthread_mutex_unlock(&guard_lock);
    return GML_ENOMEM;
  }
  __atomic_store_n(&guarded[slot], a, __ATOMIC_RELEASE);
  int rc = 0;
  if (!installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    void *warm[1];
    backtrace(warm, 1); /* loads libgcc's unwinder now, not in the handler */
    if (sigaction(SIGSEGV, &sa, &prev_action) == 0) installed = 1;
    else rc = GML_ESYS;
  }
  pthread_mutex_unlock(&guard_lock);
  return rc;
}

void gmli_guard_unregister(gml_allocator *a) {
  pthread_mutex_lock(&guard_lock);
  int left = 0;
  for (int i = 0; i < GUARD_MAX_ALLOCATORS; i++) {
    if (guarded[i] == a) __atomic_store_n(&guarded[i], NULL, __ATOMIC_RELEASE);
    left |= guarded[i] != NULL;
  }
  if (!left && installed) { /* put the previous handler back, unless someone replaced ours meanwhile */
    struct sigaction cur;
    if (sigaction(SIGSEGV, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_segv)
      sigaction(SIGSEGV, &prev_action, NULL);
    installed = 0;
  }
  pthread_mutex_unlock(&guard_lock);
}

/* ---------- the setting ---------- */

int gmli_alloc_set_guard(gml_allocator *a, int mode, size_t grain) {
  if (mode != GML_GUARD_END && mode != GML_GUARD_BOTH) mode = 0;
  size_t finest = gmli_backend_guard_grain(a->be);
  if (!grain) grain = finest;
  if (mode && (grain % finest || a->cs % grain)) {
    snprintf(a->last_error, sizeof a->last_error,
             "guard grain %zu (GMLAKE_GUARD_GRAIN): a multiple of %zu that divides the chunk size %zu", grain, finest,
             a->cs);
    return GML_EINVAL;
  }
  pthread_mutex_lock(&a->lock);
  int rc = 0;
  if (a->alloc_count) { /* every block must be whole grains: only from the start */
    snprintf(a->last_error, sizeof a->last_error, "guard mode is set before the first allocation");
    rc = GML_EINVAL;
  } else {
    a->guard = mode, a->guard_grain = mode ? grain : 0;
  }
  pthread_mutex_unlock(&a->lock);
  if (!rc && mode && (a->be->caps & GML_BACKEND_FAULT_SIGNALS)) rc = gmli_guard_register(a);
  return rc;
}

/* ---------- where an address lies ---------- */

static void fill_info(gml_allocator *a, const gml_block *b, uintptr_t addr, int where, gml_block_info *bi) {
  memset(bi, 0, sizeof *bi);
  bi->ptr = b->ptr, bi->size = b->req, bi->usable = b->usable;
  bi->start = b->addr, bi->end = b->addr + b->size;
  bi->offset = (int64_t)(addr - b->ptr);
  bi->guarded = a->guard;
  bi->seq = b->seq, bi->alloc_ns = b->alloc_ns, bi->stream = b->stream;
  if (where >= 0) bi->where = where;
  else if (addr < b->ptr) bi->where = GML_AT_BEFORE;
  else if (addr < b->ptr + b->req) bi->where = GML_AT_INSIDE;
  else if (addr < b->ptr + b->usable) bi->where = GML_AT_SLACK_AFTER;
  else bi->where = a->guard ? GML_AT_GUARD_AFTER : GML_AT_PAST_END;
}

/* A walk of the region's blocks: no driver call, only what is recorded. A
 * guarded block's range holds its guards, so an overrun lands in it; with
 * no guard, an address in free memory within a chunk after a live block is
 * reported as past that block's end. */
static int block_of_locked(gml_allocator *a, uintptr_t addr, gml_block_info *bi, const gml_block **out) {
  if (!gmli_alloc_owns(a, addr)) return GML_EBADPTR;
  for (const gml_block *b = a->regions[addr >= a->regions[1].base].first; b && addr >= b->addr; b = b->next) {
    if (addr >= b->addr + b->size) continue;
    if (b->planned == GMLI_BLOCK_RANGE) { /* a planned range: the block served in it there, if any */
      const gml_block *pb = gmli_planned_block_at(a, addr);
      if (!pb) break;
      fill_info(a, pb, addr, -1, bi);
      *out = pb;
      return 0;
    }
    if (!b->is_free) {
      fill_info(a, b, addr, -1, bi);
      *out = b;
      return 0;
    }
    if (!a->guard && b->prev && !b->prev->is_free && addr - b->addr < a->cs) {
      fill_info(a, b->prev, addr, GML_AT_PAST_END, bi);
      *out = b->prev;
      return 0;
    }
    break;
  }
  return GML_EBADPTR;
}

int gmli_alloc_block_of(gml_allocator *a, uintptr_t addr, gml_block_info *info) {
  const gml_block *b;
  pthread_mutex_lock(&a->lock);
  int rc = block_of_locked(a, addr, info, &b);
  pthread_mutex_unlock(&a->lock);
  return rc;
}

int gmli_alloc_block_of_crash(gml_allocator *a, uintptr_t addr, gml_block_info *info, void **bt, int *nbt) {
  int locked = 0;
  for (int i = 0; i < 100000 && !(locked = pthread_mutex_trylock(&a->lock) == 0); i++) {}
  const gml_block *b = NULL; /* unlocked if another thread holds the lock: the process is dying anyway */
  int rc = block_of_locked(a, addr, info, &b);
  *nbt = 0;
  if (!rc && b->bt) {
    while (*nbt < GML_GUARD_BT && b->bt[*nbt]) (*nbt)++;
    memcpy(bt, b->bt, (size_t)*nbt * sizeof *bt);
  }
  if (locked) pthread_mutex_unlock(&a->lock);
  return rc;
}

int gmli_alloc_block_list(gml_allocator *a, gml_block_info *out, size_t max) {
  pthread_mutex_lock(&a->lock);
  size_t n = 0;
  for (int i = 0; i < 2; i++)
    for (const gml_block *b = a->regions[i].first; b; b = b->next) {
      if (b->is_free || b->planned == GMLI_BLOCK_RANGE) continue;
      if (n < max) fill_info(a, b, b->ptr, GML_AT_INSIDE, &out[n]);
      n++;
    }
  for (size_t i = 0; a->plan && i < a->live.cap; i++) { /* blocks served in planned ranges: in no region's list */
    const gml_block *b = a->live.vals[i];
    if (!a->live.keys[i] || !b || b->planned != GMLI_BLOCK_PLANNED) continue;
    if (n < max) fill_info(a, b, b->ptr, GML_AT_INSIDE, &out[n]);
    n++;
  }
  pthread_mutex_unlock(&a->lock);
  return n > INT32_MAX ? INT32_MAX : (int)n;
}
