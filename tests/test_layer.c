/* Tests of the C API a framework layer uses (track.c, streams.c, pools.c),
 * through gml_open on the host backend, embedded: PyTorch's counters,
 * recorded streams, private pools, the retry before an out-of-memory and
 * its message, the history ring, the block list. Events are gated by the
 * test (host events are otherwise done at once). */
#include "skip.h"
#include "client_priv.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024ul * 1024ul)

static gml_client *C;
static struct gml_backend_ops gated_ops;
static const struct gml_backend_ops *real_ops;
static int gate_open, syncs;

static int gated_event_done(gml_backend *b, uintptr_t ev) {
  (void)b, (void)ev;
  return gate_open;
}

static int counted_synchronize(gml_backend *b) {
  syncs++;
  gate_open = 1; /* the device is idle: every event is done */
  return real_ops->synchronize(b);
}

static void setup(void) {
  gml_open_opts o = {0};
  o.backend = "host";
  o.mode = GML_MODE_EMBEDDED;
  setenv("GMLAKE_CHUNK_SIZE", "2MiB", 1);
  ck_assert_int_eq(gml_open(&o, &C), 0);
  real_ops = C->be->ops;
  gated_ops = *real_ops;
  gated_ops.event_done = gated_event_done;
  gated_ops.synchronize = counted_synchronize;
  C->be->ops = &gated_ops;
  gate_open = 1;
  syncs = 0;
}

static void teardown(void) {
  ck_assert_int_eq(gmli_alloc_check(&C->alloc), 0);
  C->be->ops = real_ops;
  gml_close(C);
}

static void *xalloc(size_t n, gml_stream s) {
  void *p = NULL;
  int rc = gml_alloc(C, n, s, &p);
  ck_assert_msg(rc == 0, "alloc %zu: %s", n, gml_last_error(C));
  return p;
}

START_TEST(test_torch_counters) {
  gml_mem_stats m;
  void *a = xalloc(1000, 0), *b = xalloc(3 * MiB, 0);
  ck_assert_int_eq(gml_mem_stats_get(C, &m), 0);
  ck_assert_int_eq(m.allocated_bytes.current, 1024 + 3 * MiB);
  ck_assert_int_eq(m.requested_bytes.current, 1000 + 3 * MiB);
  ck_assert_int_eq(m.allocation.current, 2);
  ck_assert_int_eq(m.active_bytes.current, m.allocated_bytes.current);
  ck_assert_int_eq(m.reserved_bytes.current, 6 * MiB); /* a small chunk and two large ones */
  ck_assert_int_eq(m.segment.current, 3);
  ck_assert_int_eq(m.num_device_alloc, 3);
  gml_free(C, b);
  ck_assert_int_eq(gml_mem_stats_get(C, &m), 0);
  ck_assert_int_eq(m.allocated_bytes.current, 1024);
  ck_assert_int_eq(m.allocated_bytes.peak, 1024 + 3 * MiB);
  ck_assert_int_eq(m.allocated_bytes.allocated, 1024 + 3 * MiB);
  ck_assert_int_eq(m.allocated_bytes.freed, 3 * MiB);
  ck_assert_int_eq(m.reserved_bytes.peak, 6 * MiB);
  /* 2 MiB of the small chunk minus the live 1 KiB cannot go back: inactive split */
  ck_assert_int_eq(m.inactive_split_bytes.current, 2 * MiB - 1024);
  ck_assert_int_eq(gml_reset_peak(C), 0);
  ck_assert_int_eq(gml_reset_accumulated(C), 0);
  ck_assert_int_eq(gml_mem_stats_get(C, &m), 0);
  ck_assert_int_eq(m.allocated_bytes.peak, 1024);
  ck_assert_int_eq(m.allocated_bytes.allocated, 0);
  ck_assert_int_eq(m.allocated_bytes.freed, 0);
  ck_assert_int_eq(m.num_device_alloc, 0);
  size_t released = 0;
  ck_assert_int_eq(gml_trim(C, &released), 0);
  ck_assert_uint_eq(released, 4 * MiB);
  ck_assert_int_eq(gml_mem_stats_get(C, &m), 0);
  ck_assert_int_eq(m.reserved_bytes.current, 2 * MiB);
  ck_assert_int_eq(m.reserved_bytes.peak, 6 * MiB); /* reset kept the level then */
  ck_assert_int_eq(m.num_device_free, 2);
  size_t req, sz;
  ck_assert_int_eq(gml_size_of(C, a, &req, &sz), 0);
  ck_assert_uint_eq(req, 1000);
  ck_assert_uint_eq(sz, 1024);
  ck_assert(gml_contains(C, a));
  ck_assert(!gml_contains(C, &m));
  gml_free(C, a);
  ck_assert_int_eq(gml_free(C, a), GML_EBADPTR);
}
END_TEST

/* A block used on stream 2 and freed is not handed out again until stream 2
 * has passed the free, whatever stream asks; then it is. */
START_TEST(test_record_stream_defers_reuse) {
  void *a = xalloc(6 * MiB, 1);
  gml_free(C, a);
  ck_assert_ptr_eq(xalloc(6 * MiB, 1), a); /* no recorded stream: reused at once on its stream */
  ck_assert_int_eq(gml_record_stream(C, a, 2), 0);
  gate_open = 0;
  gml_free(C, a);
  gml_mem_stats m;
  ck_assert_int_eq(gml_mem_stats_get(C, &m), 0);
  ck_assert_int_eq(m.allocated_bytes.current, 0);
  ck_assert_int_eq(m.active_bytes.current, 6 * MiB); /* freed, still in use on stream 2 */
  void *b = xalloc(6 * MiB, 1);
  ck_assert_ptr_ne(b, a);
  gml_free(C, b);
  gate_open = 1;
  void *c = xalloc(6 * MiB, 1); /* the pending free completes first: both are free */
  void *d = xalloc(6 * MiB, 1);
  ck_assert_msg((c == a && d == b) || (c == b && d == a), "a %p b %p, got %p %p", a, b, c, d);
  ck_assert_int_eq(gml_mem_stats_get(C, &m), 0);
  ck_assert_int_eq(m.active_bytes.current, 12 * MiB);
  ck_assert_int_eq(syncs, 0);
  gml_free(C, c);
  gml_free(C, d);
  ck_assert_int_eq(gml_record_stream(C, d, 2), GML_EBADPTR);
}
END_TEST

/* More recorded streams than a record keeps: the free waits for the device. */
START_TEST(test_record_stream_overflow_synchronizes) {
  void *a = xalloc(4 * MiB, 1);
  for (gml_stream s = 2; s < 2 + GML_REC_STREAMS + 1; s++) ck_assert_int_eq(gml_record_stream(C, a, s), 0);
  gate_open = 0;
  gml_free(C, a);
  ck_assert_int_eq(syncs, 1);
  ck_assert_ptr_eq(xalloc(4 * MiB, 1), a);
  gml_free(C, a);
}
END_TEST

/* Before an out-of-memory, frees waiting for streams are waited for. */
START_TEST(test_oom_waits_for_pending_frees) {
  ck_assert_int_eq(gml_set_limit(C, 8 * MiB), 0);
  void *a = xalloc(8 * MiB, 1);
  ck_assert_int_eq(gml_record_stream(C, a, 2), 0);
  gate_open = 0;
  gml_free(C, a);
  void *b = xalloc(8 * MiB, 1); /* fails first: a is still in use on 2; then waits, retries */
  ck_assert_ptr_eq(b, a);
  gml_mem_stats m;
  ck_assert_int_eq(gml_mem_stats_get(C, &m), 0);
  ck_assert_int_eq(m.num_alloc_retries, 1);
  ck_assert_int_eq(m.num_ooms, 0);
  ck_assert_int_eq(m.limit_bytes, 8 * MiB);
  ck_assert_int_ge(syncs, 1);
  gml_free(C, b);
}
END_TEST

START_TEST(test_oom_message_and_recovery) {
  gml_trace_enable(C, 64);
  ck_assert_int_eq(gml_set_limit(C, 8 * MiB), 0);
  void *a = xalloc(6 * MiB, 0), *p = NULL;
  ck_assert_int_eq(gml_alloc(C, 6 * MiB, 0, &p), GML_ENOMEM);
  const char *e = gml_last_error(C);
  ck_assert_msg(strstr(e, "out of memory") && strstr(e, "tried to allocate 6.00 MiB") &&
                    strstr(e, "6.00 MiB allocated") && strstr(e, "6.00 MiB reserved") &&
                    strstr(e, "limit is 8.00 MiB") && strstr(e, "embedded"),
                "%s", e);
  gml_mem_stats m;
  ck_assert_int_eq(gml_mem_stats_get(C, &m), 0);
  ck_assert_int_eq(m.num_ooms, 1);
  ck_assert_int_eq(m.num_alloc_retries, 1);
  gml_trace_entry t[64];
  size_t n;
  ck_assert_int_eq(gml_trace_read(C, t, 64, &n), 0);
  ck_assert_int_eq(t[n - 1].action, GML_TRACE_OOM);
  ck_assert_uint_eq(t[n - 1].size, 6 * MiB);
  gml_free(C, a);
  p = xalloc(6 * MiB, 0); /* the program goes on */
  gml_free(C, p);
}
END_TEST

static int only_stream_5(void *ctx, gml_stream s) {
  ++*(int *)ctx;
  return s == 5;
}

START_TEST(test_private_pool) {
  gml_pool_id id = {7, 0}, other = {8, 0};
  int calls = 0;
  ck_assert_int_eq(gml_pool_begin(C, id, only_stream_5, &calls), 0);
  ck_assert_int_eq(gml_pool_begin(C, id, only_stream_5, &calls), GML_EINVAL); /* already capturing */
  void *g = xalloc(4 * MiB, 5), *o = xalloc(4 * MiB, 1);
  ck_assert_int_ge(calls, 2);
  void *live[4];
  size_t n;
  ck_assert_int_eq(gml_pool_live(C, id, live, 4, &n), 0);
  ck_assert_uint_eq(n, 1);
  ck_assert_ptr_eq(live[0], g);
  gml_free(C, g);                          /* stays the pool's */
  ck_assert_ptr_eq(xalloc(3 * MiB, 5), g); /* reused inside the pool */
  gml_free(C, g);
  ck_assert_int_eq(gml_pool_end(C, id), 0);
  void *x = xalloc(4 * MiB, 5); /* outside the pool: never the pool's block */
  ck_assert_ptr_ne(x, g);
  gml_alloc_info bi[8];
  ck_assert_int_eq(gml_allocations(C, bi, 8, &n), 0);
  ck_assert_uint_eq(n, 3);
  int pool_free = 0;
  for (size_t i = 0; i < n; i++)
    pool_free += bi[i].addr == (uintptr_t)g && bi[i].state == GML_BLOCK_FREE && bi[i].pool.a == 7;
  ck_assert_int_eq(pool_free, 1);
  ck_assert_int_eq(gml_pool_create(C, id), 0); /* a second use (a graph sharing it) */
  ck_assert_int_eq(gml_pool_use_count(C, id), 2);
  ck_assert_int_eq(gml_pool_release(C, id), 0);
  ck_assert_int_eq(gml_pool_use_count(C, id), 1);
  ck_assert_int_eq(gml_pool_use_count(C, other), GML_EINVAL);
  /* a live pool block survives the pool's release, and goes back when freed */
  ck_assert_int_eq(gml_pool_begin(C, id, NULL, NULL), 0);
  void *h = xalloc(4 * MiB, 1);
  ck_assert_int_eq(gml_pool_end(C, id), 0);
  ck_assert_int_eq(gml_pool_release(C, id), 0);
  ck_assert_int_eq(gml_pool_release(C, id), 0);
  ck_assert_int_eq(gml_pool_release(C, id), GML_EINVAL);
  gml_free(C, h);
  ck_assert_int_eq(gml_allocations(C, bi, 8, &n), 0);
  ck_assert_uint_eq(n, 2);                 /* o and x; g and h went back to the allocator */
  ck_assert_ptr_eq(xalloc(4 * MiB, 5), g); /* the allocator hands g's memory out again */
  gml_free(C, o);
  gml_free(C, x);
  gml_free(C, g);
}
END_TEST

/* While a pool captures, no event is recorded; the free completes after. */
START_TEST(test_record_stream_during_capture) {
  gml_pool_id id = {9, 1};
  ck_assert_int_eq(gml_pool_begin(C, id, NULL, NULL), 0);
  void *a = xalloc(2 * MiB, 1);
  ck_assert_int_eq(gml_record_stream(C, a, 3), 0);
  gml_free(C, a);
  ck_assert_uint_eq(C->npending, 1);
  ck_assert_ptr_ne(xalloc(2 * MiB, 1), a); /* not reused inside the capture either */
  ck_assert_int_eq(gml_pool_end(C, id), 0);
  ck_assert_uint_eq(C->npending, 0); /* events recorded and done (host) at the end */
  ck_assert_int_eq(gml_pool_release(C, id), 0);
}
END_TEST

START_TEST(test_trace_ring) {
  ck_assert_int_eq(gml_trace_enable(C, 4), 0);
  void *p = NULL;
  ck_assert_int_eq(gml_alloc_ex(C, 4 * MiB, 3, 11, &p), 0); /* segment_map + alloc */
  ck_assert_int_eq(gml_free_ex(C, p, 12), 0);               /* free_requested + free_completed */
  gml_trace_entry t[8];
  size_t n;
  ck_assert_int_eq(gml_trace_read(C, t, 8, &n), 0);
  ck_assert_uint_eq(n, 4);
  int want[] = {GML_TRACE_SEGMENT_MAP, GML_TRACE_ALLOC, GML_TRACE_FREE_REQUESTED, GML_TRACE_FREE_COMPLETED};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(t[i].action, want[i]);
  ck_assert_uint_eq(t[0].size, 4 * MiB);
  ck_assert_uint_eq(t[0].addr, (uintptr_t)p); /* the range its chunks are shown at: the block's own */
  ck_assert_uint_eq(t[1].addr, (uintptr_t)p);
  ck_assert_uint_eq(t[1].tag, 11);
  ck_assert_uint_eq(t[1].stream, 3);
  ck_assert_uint_eq(t[3].tag, 12);
  ck_assert_uint_lt(t[0].seq, t[3].seq);
  uint64_t first = t[0].seq;
  ck_assert_int_eq(gml_alloc_ex(C, 1000, 3, 13, &p), 0); /* the ring keeps the newest 4 */
  ck_assert_int_eq(gml_trace_read(C, t, 8, &n), 0);
  ck_assert_uint_eq(n, 4);
  ck_assert_uint_gt(t[0].seq, first);
  ck_assert_int_eq(t[2].action, GML_TRACE_SEGMENT_MAP); /* a chunk now shown in the small region (test_snapshot.c) */
  ck_assert(t[2].addr <= (uintptr_t)p && (uintptr_t)p + 1000 <= t[2].addr + t[2].size);
  ck_assert_int_eq(t[3].action, GML_TRACE_ALLOC);
  ck_assert_uint_eq(t[3].tag, 13);
  gml_free(C, p);
  ck_assert_int_eq(gml_trace_enable(C, 0), 0);
  ck_assert_int_eq(gml_trace_read(C, t, 8, &n), 0);
  ck_assert_uint_eq(n, 0);
}
END_TEST

START_TEST(test_device_clients) {
  setenv("GMLAKE_BACKEND", "host", 1);
  setenv("GMLAKE_MODE", "embedded", 1);
  ck_assert_ptr_null(gml_device_client_if_open(3));
  gml_client *d = gml_device_client(3);
  ck_assert_ptr_nonnull(d);
  ck_assert_ptr_eq(gml_device_client(3), d);
  ck_assert_ptr_eq(gml_device_client_if_open(3), d);
  ck_assert_ptr_null(gml_device_client(-1));
  uint64_t f = 0, t = 0;
  ck_assert_int_eq(gml_device_memory(d, &f, &t), 0);
  ck_assert_uint_gt(t, 0);
}
END_TEST

/* An allocation exported by this process is mapped by another one: the same
 * bytes, writes seen both ways; after the free no new receiver gets it, and
 * the receiver's mapping keeps the memory after the exporter gave its chunks
 * back. */
START_TEST(test_ipc_between_processes) {
  size_t n = 5 * MiB + 4096;
  uint32_t *pat = malloc(n);
  for (size_t i = 0; i < n / 4; i++) pat[i] = (uint32_t)(i * 2654435761u);
  void *p = xalloc(n, 0);
  ck_assert_int_eq(gml_write(C, p, pat, n), 0);
  gml_ipc_handle h;
  ck_assert_int_eq(gml_ipc_export(C, p, &h), 0);
  ck_assert_int_eq(gml_ipc_device(&h), 0);
  gml_ipc_handle junk = h;
  junk.bytes[0] ^= 1;
  ck_assert_int_eq(gml_ipc_device(&junk), GML_EINVAL);
  int to_child[2], to_parent[2];
  ck_assert_int_eq(pipe(to_child), 0);
  ck_assert_int_eq(pipe(to_parent), 0);
  pid_t pid = fork();
  if (pid == 0) {
    gml_open_opts o = {0};
    o.backend = "host";
    o.mode = GML_MODE_EMBEDDED;
    gml_client *r;
    char b;
    if (gml_open(&o, &r)) _exit(10);
    void *q;
    size_t sz;
    if (gml_ipc_open(r, &h, &q, &sz)) _exit(11);
    if (sz != n) _exit(12);
    uint32_t *got = malloc(n);
    if (gml_read(r, got, q, n) || memcmp(got, pat, n)) _exit(13);
    uint32_t mark = 0xabcdef01;
    if (gml_write(r, q, &mark, 4)) _exit(14);
    if (write(to_parent[1], "w", 1) != 1 || read(to_child[0], &b, 1) != 1) _exit(15);
    pat[0] = mark; /* the exporter's chunks are gone by now: the mapping kept them */
    if (gml_read(r, got, q, n) || memcmp(got, pat, n)) _exit(16);
    if (gml_ipc_close(r, q) || gml_ipc_close(r, q) != GML_EBADPTR) _exit(17);
    gml_close(r);
    _exit(0);
  }
  char b;
  ck_assert_int_eq(read(to_parent[0], &b, 1), 1);
  uint32_t first = 0;
  ck_assert_int_eq(gml_read(C, &first, p, 4), 0);
  ck_assert_uint_eq(first, 0xabcdef01); /* the receiver's write, seen here */
  gml_free(C, p);
  void *q;
  ck_assert_int_eq(gml_ipc_open(C, &h, &q, NULL), GML_EBADPTR); /* freed: no longer served */
  size_t released = 0;
  ck_assert_int_eq(gml_trim(C, &released), 0);
  ck_assert_uint_ge(released, 6 * MiB);
  ck_assert_int_eq(write(to_child[1], "g", 1), 1);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "receiver failed with %d", WEXITSTATUS(st));
  free(pat);
}
END_TEST

/* gml_ipc_export_fds: the chunks behind an allocation as fds of this process,
 * which another process takes itself with pidfd_getfd (PyTorch's
 * expandable-segment handles carry them): mapped there in order, the bytes at
 * offset are the allocation's; the same fds for a second call; the free closes
 * them (a fetch after it fails). The receiver is a child: under Yama's
 * ptrace_scope 1 only the export's prctl lets it take its parent's fds. */
START_TEST(test_ipc_export_fds_pidfd) {
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
  int probe = (int)syscall(SYS_pidfd_open, getpid(), 0);
  if (probe < 0) {
    test_skip("test_ipc_export_fds_pidfd", "no pidfd_open in this kernel");
    return;
  }
  close(probe);
  size_t n = 5 * MiB + 4096;
  uint32_t *pat = malloc(n);
  for (size_t i = 0; i < n / 4; i++) pat[i] = (uint32_t)(i * 2654435761u);
  void *pad = xalloc(3 * MiB, 0), *p = xalloc(n, 0); /* p need not start a chunk */
  ck_assert_int_eq(gml_write(C, p, pat, n), 0);
  int fds[8], fds2[8];
  size_t nf = 0, off = 0, cs = 0, nf2 = 0, off2 = 0;
  ck_assert_int_eq(gml_ipc_export_fds(C, p, fds, 8, &nf, &off, &cs), 0);
  ck_assert_uint_eq(cs, 2 * MiB);
  ck_assert_uint_eq(nf, (off + n + cs - 1) / cs);
  ck_assert_int_eq(gml_ipc_export_fds(C, p, fds2, 8, &nf2, &off2, &cs), 0);
  ck_assert_uint_eq(nf2, nf);
  ck_assert_int_eq(memcmp(fds, fds2, nf * sizeof *fds), 0);
  ck_assert_int_eq(gml_ipc_export_fds(C, (char *)p + 512, fds, 8, &nf2, &off2, &cs), GML_EBADPTR);
  int to_child[2], to_parent[2];
  ck_assert_int_eq(pipe(to_child), 0);
  ck_assert_int_eq(pipe(to_parent), 0);
  pid_t pid = fork();
  if (pid == 0) {
    char b;
    int pidfd = (int)syscall(SYS_pidfd_open, getppid(), 0);
    if (pidfd < 0) _exit(10);
    char *va = mmap(NULL, nf * cs, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (va == MAP_FAILED) _exit(11);
    for (size_t i = 0; i < nf; i++) {
      int fd = (int)syscall(SYS_pidfd_getfd, pidfd, fds[i], 0);
      if (fd < 0) _exit(12);
      if (mmap(va + i * cs, cs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) _exit(13);
      close(fd);
    }
    if (memcmp(va + off, pat, n)) _exit(14);
    uint32_t mark = 0xabcdef01;
    memcpy(va + off, &mark, 4);
    if (write(to_parent[1], "w", 1) != 1 || read(to_child[0], &b, 1) != 1) _exit(15);
    /* freed there: the fds are closed, a new fetch fails (its own mapping still holds the memory) */
    int again = (int)syscall(SYS_pidfd_getfd, pidfd, fds[0], 0);
    if (again >= 0) _exit(16); /* nothing opened a file there since the free closed it */
    _exit(0);
  }
  char b;
  ck_assert_int_eq(read(to_parent[0], &b, 1), 1);
  uint32_t first = 0;
  ck_assert_int_eq(gml_read(C, &first, p, 4), 0);
  ck_assert_uint_eq(first, 0xabcdef01); /* the receiver's write, through the fds it took */
  gml_free(C, p);
  ck_assert_int_eq(write(to_child[1], "g", 1), 1);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "receiver failed with %d (12: pidfd_getfd refused)",
                WEXITSTATUS(st));
  gml_free(C, pad);
  free(pat);
}
END_TEST

/* The exporter is gone and a process of another user bound its socket's
 * name (abstract names are public in /proc/net/unix): the receiver must not
 * map what that process sends. Needs root (the squatter setuid()s). */
START_TEST(test_ipc_refuses_other_uid) {
  if (geteuid() != 0) {
    test_skip("test_ipc_refuses_other_uid", "needs root");
    return;
  }
  int hp[2], ready[2];
  ck_assert_int_eq(pipe(hp), 0);
  ck_assert_int_eq(pipe(ready), 0);
  pid_t ex = fork();
  if (ex == 0) { /* the exporter: exports, hands the handle over, exits */
    gml_open_opts o = {0};
    o.backend = "host";
    o.mode = GML_MODE_EMBEDDED;
    gml_client *e;
    void *p;
    gml_ipc_handle h;
    if (gml_open(&o, &e) || gml_alloc(e, 4096, 0, &p) || gml_ipc_export(e, p, &h)) _exit(1);
    _exit(write(hp[1], &h, sizeof h) == sizeof h ? 0 : 2);
  }
  gml_ipc_handle h;
  ck_assert_int_eq(read(hp[0], &h, sizeof h), (ssize_t)sizeof h);
  int st;
  ck_assert_int_eq(waitpid(ex, &st, 0), ex);
  int32_t pid;
  uint64_t nonce;
  memcpy(&pid, h.bytes + 8, sizeof pid); /* the handle: magic, version, pid, device, nonce, ... */
  memcpy(&nonce, h.bytes + 16, sizeof nonce);
  pid_t sq = fork();
  if (sq == 0) { /* the squatter: nobody, serves a memfd of its own under the exporter's name */
    if (setgroups(0, NULL) || setgid(65534) || setuid(65534)) _exit(99);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int len =
        snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "gmlake-ipc-%d-%016llx", (int)pid, (unsigned long long)nonce);
    int ls = socket(AF_UNIX, SOCK_STREAM, 0);
    if (bind(ls, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len)) ||
        listen(ls, 1))
      _exit(3);
    if (write(ready[1], "r", 1) != 1) _exit(4);
    int c = accept(ls, NULL, NULL);
    uint64_t token;
    if (c < 0 || read(c, &token, sizeof token) != sizeof token) _exit(0); /* refused before asking: fine */
    struct {
      int32_t status;
      uint32_t n;
      uint64_t offset, size, chunk_size;
    } rep = {0, 1, 0, 4096, 2 * MiB};
    int mfd = memfd_create("squat", 0);
    if (ftruncate(mfd, 2 * MiB) || write(c, &rep, sizeof rep) != sizeof rep) _exit(5);
    char byte = 0, cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET, cm->cmsg_type = SCM_RIGHTS, cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &mfd, sizeof mfd);
    sendmsg(c, &m, 0);
    char b;
    (void)!read(c, &b, 1); /* until the receiver is done */
    _exit(0);
  }
  char r;
  ck_assert_int_eq(read(ready[0], &r, 1), 1);
  void *q = NULL;
  size_t sz = 0;
  int rc = gml_ipc_open(C, &h, &q, &sz);
  ck_assert_msg(rc == GML_EPERM, "mapped what a process of another user sent (rc %d, %zu bytes)", rc, sz);
  kill(sq, SIGKILL);
  waitpid(sq, NULL, 0);
  for (int i = 0; i < 2; i++) close(hp[i]), close(ready[i]);
}
END_TEST

/* Guard mode: an exported allocation's pointer lies past its block's start
 * (the end abuts the guard). The receiver got the block's start and its size
 * with the guards: it read and wrote other bytes than the exporter's. */
START_TEST(test_ipc_guard_mode_pointer) {
  gml_open_opts o = {0};
  o.backend = "host", o.mode = GML_MODE_EMBEDDED, o.guard = GML_GUARD_END;
  gml_client *g;
  ck_assert_int_eq(gml_open(&o, &g), 0);
  char pat[1000], got[1000] = {0};
  memset(pat, 0x5a, sizeof pat);
  void *p, *q = NULL;
  size_t sz = 0;
  ck_assert_int_eq(gml_alloc(g, sizeof pat, 0, &p), 0);
  ck_assert_int_eq(gml_write(g, p, pat, sizeof pat), 0);
  gml_ipc_handle h;
  ck_assert_int_eq(gml_ipc_export(g, p, &h), 0);
  ck_assert_int_eq(gml_ipc_open(C, &h, &q, &sz), 0); /* the same process: its own socket answers */
  ck_assert_uint_eq(sz, 1024);
  ck_assert_int_eq(gml_read(C, got, q, sizeof got), 0);
  ck_assert_msg(!memcmp(got, pat, sizeof got), "the receiver's pointer is not the allocation's (first byte %#x)",
                (unsigned char)got[0]);
  ck_assert_int_eq(gml_ipc_close(C, q), 0);
  gml_free(g, p);
  gml_close(g);
}
END_TEST

/* An answer for a handle (a process of ours: a stale pid's, or buggy) whose
 * offset or size lies past the chunks it sent: gml_ipc_open gave a pointer
 * a TiB past its 2 MiB mapping and a size of a PiB. */
static int fake_ls;
static uint64_t fake_reply[4]; /* status|n, offset, size, chunk_size */

static void *fake_exporter(void *arg) {
  (void)arg;
  int c = accept(fake_ls, NULL, NULL);
  uint64_t token;
  if (c < 0 || read(c, &token, sizeof token) != sizeof token ||
      send(c, fake_reply, sizeof fake_reply, MSG_NOSIGNAL) != sizeof fake_reply)
    return NULL;
  int mfd = memfd_create("fake", MFD_CLOEXEC);
  char byte = 0, cbuf[CMSG_SPACE(sizeof(int))], b;
  struct iovec iov = {&byte, 1};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET, cm->cmsg_type = SCM_RIGHTS, cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &mfd, sizeof mfd);
  if (!ftruncate(mfd, 2 * MiB))
    (void)!sendmsg(c, &m, MSG_NOSIGNAL); /* the client may have refused and closed: no SIGPIPE */
  close(mfd);
  (void)!read(c, &b, 1);
  close(c);
  return NULL;
}

START_TEST(test_ipc_reply_out_of_range) {
  ck_assert_uint_eq(C->alloc.cs, 2 * MiB);
  const uint64_t bad[][2] = {{1ull << 40, 4096}, {0, 1ull << 50}, {2 * MiB - 512, 4096}, {0, 512}};
  for (int i = 0; i < 4; i++) {
    uint64_t nonce = 0xa77ac3000 + (uint64_t)i;
    struct {
      uint32_t magic, version;
      int32_t pid, device;
      uint64_t nonce, token, size, chunk_size;
    } w = {0x4b4c4d47u, 1, getpid(), 0, nonce, 77, 4096, 2 * MiB};
    gml_ipc_handle h;
    memset(&h, 0, sizeof h);
    memcpy(h.bytes, &w, sizeof w);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int len = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "gmlake-ipc-%d-%016llx", (int)getpid(),
                       (unsigned long long)nonce);
    fake_ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_eq(
        bind(fake_ls, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len)),
        0);
    ck_assert_int_eq(listen(fake_ls, 1), 0);
    fake_reply[0] = 1ull << 32, fake_reply[1] = bad[i][0], fake_reply[2] = bad[i][1], fake_reply[3] = 2 * MiB;
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, fake_exporter, NULL), 0);
    void *q = NULL;
    size_t sz = 0;
    int rc = gml_ipc_open(C, &h, &q, &sz);
    pthread_join(t, NULL);
    close(fake_ls);
    ck_assert_msg(rc == GML_EPROTO, "offset %llu size %llu: rc %d, pointer %p, %zu bytes",
                  (unsigned long long)bad[i][0], (unsigned long long)bad[i][1], rc, q, sz);
  }
}
END_TEST

/* Any user may connect to an exporter's socket (an abstract name has no
 * mode): each refusal was a line in the exporter's log, so another user
 * wrote as many lines there as it liked. Needs root (the peer setuid()s). */
START_TEST(test_ipc_refusals_bounded_in_log) {
  if (geteuid() != 0) {
    test_skip("test_ipc_refusals_bounded_in_log", "needs root");
    return;
  }
  void *p = xalloc(4096, 0);
  gml_ipc_handle h;
  ck_assert_int_eq(gml_ipc_export(C, p, &h), 0);
  int32_t pid;
  uint64_t nonce;
  memcpy(&pid, h.bytes + 8, sizeof pid);
  memcpy(&nonce, h.bytes + 16, sizeof nonce);
  char path[] = "/tmp/gml-ipc-log-XXXXXX";
  int lf = mkstemp(path), saved = dup(2);
  ck_assert_int_ge(lf, 0);
  fflush(stderr);
  dup2(lf, 2);
  pid_t m = fork();
  if (m == 0) { /* nobody, connecting again and again */
    if (setgroups(0, NULL) || setgid(65534) || setuid(65534)) _exit(99);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int len =
        snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "gmlake-ipc-%d-%016llx", (int)pid, (unsigned long long)nonce);
    for (int i = 0; i < 300; i++) {
      int s = socket(AF_UNIX, SOCK_STREAM, 0);
      if (connect(s, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len)))
        _exit(1);
      char b;
      (void)!read(s, &b, 1); /* until refused */
      close(s);
    }
    _exit(0);
  }
  int st;
  ck_assert_int_eq(waitpid(m, &st, 0), m);
  void *q;
  ck_assert_int_eq(gml_ipc_open(C, &h, &q, NULL), 0); /* answered after every refusal */
  ck_assert_int_eq(gml_ipc_close(C, q), 0);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the peer failed: %d", st);
  char buf[65536];
  ssize_t n = pread(lf, buf, sizeof buf - 1, 0);
  close(lf);
  unlink(path);
  buf[n > 0 ? n : 0] = 0;
  int lines = 0;
  for (char *at = buf; (at = strstr(at, "refused a peer of another user")); at++) lines++;
  ck_assert_msg(lines >= 1 && lines <= 3, "%d lines for 300 refusals", lines);
  gml_free(C, p);
}
END_TEST

/* ---------- pool checkpoints (cudagraph trees) ---------- */

static int has_ptr(void *const *v, size_t n, const void *p) {
  for (size_t i = 0; i < n; i++)
    if (v[i] == p) return 1;
  return 0;
}

/* No two allocated blocks the client tracks overlap. */
static void assert_no_overlap(void) {
  gml_alloc_info bi[64];
  size_t n;
  ck_assert_int_eq(gml_allocations(C, bi, 64, &n), 0);
  ck_assert_uint_le(n, 64);
  for (size_t i = 1; i < n; i++) ck_assert_uint_le(bi[i - 1].addr + bi[i - 1].size, bi[i].addr);
}

/* A pool checkpointed with live and freed blocks, changed (blocks freed, one
 * reused at the same address, new ones, a free waiting for a recorded
 * stream), restored: exactly the checkpoint's live set at its addresses,
 * the exact lists of what was freed and made live, counters as at the
 * checkpoint, and every block freeable as usual afterwards. */
START_TEST(test_pool_checkpoint_restore) {
  gml_pool_id id = {11, 4};
  ck_assert_int_eq(gml_pool_begin(C, id, NULL, NULL), 0);
  void *a = xalloc(4 * MiB, 1), *b = xalloc(1 * MiB, 1), *c = xalloc(3 * MiB, 1), *d = xalloc(100 * 1024, 1);
  void *p = xalloc(2 * MiB, 1);
  gml_free(C, b); /* free in the checkpoint: the pool keeps it */
  ck_assert_int_eq(gml_pool_end(C, id), 0);
  void *o = xalloc(5 * MiB, 1); /* not the pool's */
  gml_pool_ckpt *k = NULL;
  ck_assert_int_eq(gml_pool_checkpoint(C, id, &k), 0);
  gml_alloc_info kb[8];
  size_t n = 0;
  ck_assert_int_eq(gml_pool_checkpoint_blocks(k, kb, 8, &n), 0);
  ck_assert_uint_eq(n, 4);
  void *want[] = {a, c, d, p};
  for (size_t i = 0; i < n; i++) {
    ck_assert(has_ptr(want, 4, (void *)kb[i].addr));
    ck_assert_int_eq(kb[i].state, GML_BLOCK_ALLOCATED);
    ck_assert_uint_eq(kb[i].stream, 1);
    ck_assert(kb[i].pool.a == 11 && kb[i].pool.b == 4);
    if (i) ck_assert_uint_lt(kb[i - 1].addr, kb[i].addr);
    if (kb[i].addr == (uintptr_t)c) ck_assert(kb[i].size == 3 * MiB && kb[i].requested == 3 * MiB);
    if (kb[i].addr == (uintptr_t)d) ck_assert(kb[i].size == 100 * 1024 && kb[i].requested == 100 * 1024);
  }
  gml_mem_stats m0, m;
  ck_assert_int_eq(gml_mem_stats_get(C, &m0), 0);

  /* another branch of the tree records: the pool changes */
  ck_assert_int_eq(gml_pool_begin(C, id, NULL, NULL), 0);
  gml_free(C, a);
  ck_assert_ptr_eq(xalloc(4 * MiB, 1), a); /* a's block, live again under another tensor */
  gml_free(C, c);
  void *h = xalloc(600 * 1024, 1);
  ck_assert_ptr_eq(h, b); /* b's block: not live in the checkpoint */
  void *f = xalloc(8 * MiB, 1);
  ck_assert_int_eq(gml_pool_end(C, id), 0);
  ck_assert_int_eq(gml_record_stream(C, p, 3), 0);
  gate_open = 0;
  gml_free(C, p); /* waits for stream 3 */
  ck_assert_uint_eq(C->npending, 1);

  void *freed[8], *allocd[8];
  size_t nf = 99, na = 99;
  int s0 = syncs;
  ck_assert_int_eq(gml_pool_restore(C, k, freed, 8, &nf, allocd, 8, &na), 0);
  ck_assert_int_eq(syncs, s0 + 1); /* p's free had to complete first */
  ck_assert_uint_eq(nf, 2);
  ck_assert(has_ptr(freed, nf, h) && has_ptr(freed, nf, f));
  ck_assert_uint_eq(na, 2);
  ck_assert(has_ptr(allocd, na, c) && has_ptr(allocd, na, p));
  void *live[8];
  ck_assert_int_eq(gml_pool_live(C, id, live, 8, &n), 0);
  ck_assert_uint_eq(n, 4);
  for (size_t i = 0; i < 4; i++) ck_assert(has_ptr(live, n, want[i]));
  assert_no_overlap();
  ck_assert_int_eq(gml_mem_stats_get(C, &m), 0);
  ck_assert_int_eq(m.allocated_bytes.current, m0.allocated_bytes.current);
  ck_assert_int_eq(m.requested_bytes.current, m0.requested_bytes.current);
  ck_assert_int_eq(m.allocation.current, m0.allocation.current);
  ck_assert_int_eq(m.allocation.current, 5); /* a, c, d, p and o */
  size_t req, sz;
  ck_assert_int_eq(gml_size_of(C, c, &req, &sz), 0);
  ck_assert(req == 3 * MiB && sz == 3 * MiB);
  char pat[64], back[64];
  memset(pat, 0x5a, sizeof pat);
  ck_assert_int_eq(gml_write(C, (char *)c + 3 * MiB - 64, pat, 64), 0);
  ck_assert_int_eq(gml_read(C, back, (char *)c + 3 * MiB - 64, 64), 0);
  ck_assert_mem_eq(back, pat, 64);

  /* restoring again changes nothing */
  ck_assert_int_eq(gml_pool_restore(C, k, freed, 8, &nf, allocd, 8, &na), 0);
  ck_assert(nf == 0 && na == 0);
  /* the restored blocks are ordinary allocations of the pool */
  ck_assert_int_eq(gml_free(C, c), 0);
  ck_assert_int_eq(gml_free(C, p), 0);
  ck_assert_int_eq(gml_free(C, c), GML_EBADPTR);
  ck_assert_int_eq(gml_pool_live(C, id, live, 8, &n), 0);
  ck_assert_uint_eq(n, 2);
  gml_free(C, a);
  gml_free(C, d);
  gml_free(C, o);
  ck_assert_int_eq(gml_mem_stats_get(C, &m), 0);
  ck_assert_int_eq(m.allocated_bytes.current, 0);
  ck_assert_int_eq(m.allocation.current, 0);
  ck_assert_int_eq(gml_pool_release(C, id), 0);
  ck_assert_int_eq(gml_pool_release(C, id), 0);
  ck_assert_int_eq(gml_allocations(C, NULL, 0, &n), 0);
  ck_assert_uint_eq(n, 0); /* the pool's free blocks went back to the allocator */
  gml_pool_checkpoint_free(k);
}
END_TEST

/* What a restore refuses, changing nothing: too little room, a pool not in
 * use or capturing, a checkpoint whose memory went back (GML_ESTALE). */
START_TEST(test_pool_restore_refusals) {
  gml_pool_id id = {12, 0}, none = {13, 0};
  gml_pool_ckpt *k = (gml_pool_ckpt *)&k;
  ck_assert_int_eq(gml_pool_checkpoint(C, none, &k), GML_EINVAL);
  ck_assert_ptr_null(k);
  ck_assert_int_eq(gml_pool_begin(C, id, NULL, NULL), 0);
  void *x = xalloc(4 * MiB, 1);
  ck_assert_int_eq(gml_pool_end(C, id), 0);
  ck_assert_int_eq(gml_pool_checkpoint(C, id, &k), 0);
  gml_free(C, x);
  ck_assert_int_eq(gml_pool_begin(C, id, NULL, NULL), 0);
  void *y = xalloc(8 * MiB, 1), *freed[4], *allocd[4];
  size_t nf, na, n;
  ck_assert_int_eq(gml_pool_restore(C, k, freed, 4, &nf, allocd, 4, &na), GML_EINVAL); /* capturing */
  ck_assert_int_eq(gml_pool_end(C, id), 0);
  ck_assert_int_eq(gml_pool_restore(C, k, freed, 0, &nf, allocd, 4, &na), GML_EINVAL); /* no room for y */
  ck_assert(nf == 1 && na == 1);
  ck_assert_int_eq(gml_size_of(C, x, NULL, NULL), GML_EBADPTR); /* unchanged */
  ck_assert_int_eq(gml_size_of(C, y, NULL, NULL), 0);
  /* the pool's uses end: its free block x goes back to the allocator */
  ck_assert_int_eq(gml_pool_release(C, id), 0);
  ck_assert_int_eq(gml_pool_release(C, id), 0);
  ck_assert_int_eq(gml_pool_restore(C, k, freed, 4, &nf, allocd, 4, &na), GML_EINVAL); /* not in use */
  ck_assert_int_eq(gml_pool_begin(C, id, NULL, NULL), 0);
  void *z = xalloc(2 * MiB, 1); /* x's memory, in part */
  ck_assert_ptr_eq(z, x);
  ck_assert_int_eq(gml_pool_end(C, id), 0);
  ck_assert_int_eq(gml_pool_restore(C, k, freed, 4, &nf, allocd, 4, &na), GML_ESTALE);
  ck_assert_ptr_nonnull(strstr(gml_last_error(C), "live in the checkpoint"));
  ck_assert(nf == 0 && na == 0);
  ck_assert_int_eq(gml_pool_live(C, id, freed, 4, &n), 0);
  ck_assert_uint_eq(n, 2); /* y and z, as before */
  ck_assert_int_eq(gml_size_of(C, z, NULL, NULL), 0);
  gml_free(C, z);
  gml_free(C, y);
  ck_assert_int_eq(gml_pool_release(C, id), 0);
  gml_pool_checkpoint_free(k);
  gml_pool_checkpoint_free(NULL);
}
END_TEST

Suite *layer_suite(void) {
  Suite *s = suite_create("layer");
  TCase *tc = tcase_create("layer");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_torch_counters);
  tcase_add_test(tc, test_record_stream_defers_reuse);
  tcase_add_test(tc, test_record_stream_overflow_synchronizes);
  tcase_add_test(tc, test_oom_waits_for_pending_frees);
  tcase_add_test(tc, test_oom_message_and_recovery);
  tcase_add_test(tc, test_private_pool);
  tcase_add_test(tc, test_record_stream_during_capture);
  tcase_add_test(tc, test_pool_checkpoint_restore);
  tcase_add_test(tc, test_pool_restore_refusals);
  tcase_add_test(tc, test_trace_ring);
  tcase_add_test(tc, test_device_clients);
  tcase_add_test(tc, test_ipc_between_processes);
  tcase_add_test(tc, test_ipc_export_fds_pidfd);
  tcase_add_test(tc, test_ipc_refuses_other_uid);
  tcase_add_test(tc, test_ipc_guard_mode_pointer);
  tcase_add_test(tc, test_ipc_reply_out_of_range);
  tcase_add_test(tc, test_ipc_refusals_bounded_in_log);
  suite_add_tcase(s, tc);
  return s;
}
