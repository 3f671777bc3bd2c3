/* Guard mode on the host backend: an overflow past an allocation's end
 * faults (in a child process, whose report on stderr the test reads),
 * gml_block_of names the block of any address in or around it, and a
 * randomized run keeps every block's guard inaccessible and every usable
 * byte accessible (no false report), at page grain and at whole-chunk grain
 * (what the cuda backend can do). */
#include "alloc.h"
#include "gmlake.h"
#include "rounds.h"
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024ul * 1024ul)

/* Can this byte be read? write(2) from it fails with EFAULT if not, without a fault. */
static int readable(const void *p) {
  int fd[2];
  ck_assert_int_eq(pipe(fd), 0);
  ssize_t n = write(fd[1], p, 1);
  int e = errno;
  close(fd[0]), close(fd[1]);
  ck_assert_msg(n == 1 || e == EFAULT, "probe: %s", strerror(e));
  return n == 1;
}

typedef struct overflow_case {
  int mode;     /* GML_GUARD_END or GML_GUARD_BOTH */
  size_t grain; /* 0: the backend's finest (a page); else whole chunks */
  size_t size;
  long at; /* the byte written, relative to the pointer */
  const char *want[3];
} overflow_case;

static const overflow_case cases[] = {
    {GML_GUARD_END, 0, 3072, 3072, {"size 3072", "0 bytes past the end", "allocation #4"}},
    {GML_GUARD_END, 0, 1000, 1024, {"size 1000", "24 bytes past the end", "allocation #4"}},
    {GML_GUARD_END, 2 * MiB, 5 * MiB + 1536, 5 * MiB + 1536, {"size 5244416", "0 bytes past the end", "allocation #4"}},
    {GML_GUARD_BOTH, 0, 8192, -1, {"size 8192", "1 bytes before its start", "allocation #4"}},
};

/* A child allocates three neighbours and the block, writes every byte it
 * may (and, for a size off the 512-byte alignment, the slack up to it),
 * then the one byte past; the test reads its stderr. */
START_TEST(test_guard_overflow_reported) {
  const overflow_case *oc = &cases[_i];
  int fd[2];
  ck_assert_int_eq(pipe(fd), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(fd[1], 2);
    close(fd[0]);
    gml_open_opts o = {0};
    o.backend = "host";
    o.mode = GML_MODE_EMBEDDED;
    o.guard = oc->mode;
    o.guard_grain = oc->grain;
    gml_client *c;
    if (gml_open(&o, &c)) _exit(3);
    void *n[3], *p;
    for (int i = 0; i < 3; i++)
      if (gml_alloc(c, 4096 << i, 0, &n[i])) _exit(4);
    if (gml_alloc(c, oc->size, 0, &p)) _exit(5);
    unsigned char *b = p;
    size_t usable = (oc->size + 511) / 512 * 512;
    memset(b, 0x5a, usable); /* all of it is ours: no fault */
    fprintf(stderr, "wrote %zu bytes\n", usable);
    fflush(stderr);
    ((volatile unsigned char *)b)[oc->at] = 1; /* faults */
    fprintf(stderr, "NO FAULT\n");
    _exit(0);
  }
  close(fd[1]);
  char out[8192];
  size_t len = 0;
  ssize_t k;
  while (len < sizeof out - 1 && (k = read(fd[0], out + len, sizeof out - 1 - len)) > 0) len += (size_t)k;
  out[len] = 0;
  close(fd[0]);
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(strstr(out, "wrote "), "the child did not get to the overflow: status %d, stderr:\n%s", status, out);
  ck_assert_msg(!strstr(out, "NO FAULT"), "the overflow did not fault:\n%s", out);
  /* re-raised: the default action kills the child; under ASan its handler, chained after ours, exits instead */
#ifdef __SANITIZE_ADDRESS__
  int asan = WIFEXITED(status) && WEXITSTATUS(status) && strstr(out, "AddressSanitizer: SEGV");
#else
  int asan = 0;
#endif
  ck_assert_msg((WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) || asan, "child status %#x, stderr:\n%s", status,
                out);
  for (int i = 0; i < 3; i++) ck_assert_msg(strstr(out, oc->want[i]), "report lacks '%s':\n%s", oc->want[i], out);
}
END_TEST

/* ---------- allocator level ---------- */

typedef struct gsrc {
  gml_backend *be;
  size_t live;
} gsrc;

static int g_acquire(void *ctx, size_t n, int optional, gml_phys *phys, uint64_t *ids) {
  gsrc *s = ctx;
  (void)optional;
  for (size_t k = 0; k < n; k++) {
    ck_assert_int_eq(s->be->ops->chunk_create(s->be, &phys[k], NULL), 0);
    ids[k] = ++s->live;
  }
  return (int)n;
}

static void g_release(void *ctx, size_t n, const gml_phys *phys, const uint64_t *ids) {
  gsrc *s = ctx;
  (void)ids;
  for (size_t i = 0; i < n; i++) s->be->ops->chunk_release(s->be, phys[i]);
  s->live -= n;
}

static gml_backend *gbe;
static gsrc gs;
static gml_allocator G;

static void gsetup(void) {
  char msg[256];
  ck_assert_int_eq(gmli_backend_open("host", 0, NULL, &gbe, msg, sizeof msg), 0);
  memset(&gs, 0, sizeof gs);
  gs.be = gbe;
  ck_assert_int_eq(gmli_alloc_init(&G, gbe, (gml_chunk_source){&gs, g_acquire, g_release, NULL}, 16ul << 30, NULL), 0);
}

static void gteardown(void) {
  gmli_alloc_destroy(&G);
  ck_assert_int_eq(gs.live, 0);
  gmli_backend_close(gbe);
}

static void *galloc(size_t n) {
  void *p = NULL;
  ck_assert_msg(gmli_alloc_malloc(&G, n, 0, &p) == 0, "alloc %zu: %s", n, G.last_error);
  return p;
}

/* _i: 0 page grain, 1 chunk grain; both with a guard in front too */
START_TEST(test_block_of) {
  size_t grain = _i ? gbe->chunk_size : 0;
  ck_assert_int_eq(gmli_alloc_set_guard(&G, GML_GUARD_BOTH, grain), 0);
  size_t g = grain ? grain : gmli_backend_guard_grain(gbe);
  char *a = galloc(1000), *b = galloc(3 * MiB), *c = galloc(4096);
  gml_block_info bi;
  ck_assert_int_eq(gmli_alloc_block_of(&G, (uintptr_t)b + 5, &bi), 0);
  ck_assert_uint_eq(bi.ptr, (uintptr_t)b);
  ck_assert_uint_eq(bi.size, 3 * MiB);
  ck_assert_int_eq(bi.where, GML_AT_INSIDE);
  ck_assert_uint_eq(bi.seq, 2);
  ck_assert_int_eq(gmli_alloc_block_of(&G, (uintptr_t)a + 1000, &bi), 0); /* past the size, inside the alignment */
  ck_assert_uint_eq(bi.ptr, (uintptr_t)a);
  ck_assert_int_eq(bi.where, GML_AT_SLACK_AFTER);
  ck_assert_int_eq(gmli_alloc_block_of(&G, (uintptr_t)a + 1024, &bi), 0); /* the first byte of the guard */
  ck_assert_uint_eq(bi.ptr, (uintptr_t)a);
  ck_assert_int_eq(bi.where, GML_AT_GUARD_AFTER);
  ck_assert_int_eq(bi.offset, 1024);
  ck_assert_int_eq(gmli_alloc_block_of(&G, (uintptr_t)a + 1024 + g - 1, &bi), 0); /* the guard's last byte */
  ck_assert_uint_eq(bi.ptr, (uintptr_t)a);
  ck_assert_int_eq(gmli_alloc_block_of(&G, (uintptr_t)c - 1, &bi), 0); /* before c: c's slack or front guard */
  ck_assert_uint_eq(bi.ptr, (uintptr_t)c);
  ck_assert_int_eq(bi.where, GML_AT_BEFORE);
  /* guards are inaccessible, every usable byte is */
  ck_assert(readable(a) && readable(a + 1023) && !readable(a + 1024));
  ck_assert(readable(b) && readable(b + 3 * MiB - 1) && !readable(b + 3 * MiB));
  ck_assert(readable(c) && !readable(c + 4096));
  /* the front guard ends where the whole grains holding the block begin */
  ck_assert(!readable(b + 3 * MiB - (3 * MiB + g - 1) / g * g - 1));
  ck_assert(!readable(c + 4096 - (4096 + g - 1) / g * g - 1));
  ck_assert(!readable(a + 1024 - (1024 + g - 1) / g * g - 1));
  ck_assert_int_eq(gmli_alloc_check(&G), 0);
  gmli_alloc_free(&G, b);
  ck_assert_int_eq(gmli_alloc_block_of(&G, (uintptr_t)b + 5, &bi), GML_EBADPTR);
  gml_block_info list[8];
  ck_assert_int_eq(gmli_alloc_block_list(&G, list, 8), 2);
  gmli_alloc_free(&G, a), gmli_alloc_free(&G, c);
  ck_assert_int_eq(gmli_alloc_block_list(&G, list, 8), 0);
}
END_TEST

/* _i: 0 page grain, 1 chunk grain. Random sizes, alloc and free; every
 * live block's first and last usable bytes accessible, the byte after its
 * usable end not, content intact, invariants hold. */
START_TEST(test_guard_randomized) {
  size_t grain = _i ? gbe->chunk_size : 0;
  ck_assert_int_eq(gmli_alloc_set_guard(&G, GML_GUARD_END, grain), 0);
  enum { N = 200 };
  struct {
    unsigned char *p;
    size_t size;
    unsigned char fill;
  } live[N];
  size_t nlive = 0;
  uint64_t rng = 99 + (uint64_t)_i;
  for (int step = 0; step < TEST_ROUNDS(4000); step++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(rng >> 33);
    if (nlive < N && (nlive == 0 || (r & 1))) {
      size_t size = (r >> 2) % 3 == 0   ? 1 + (r >> 4) % 8192
                    : (r >> 2) % 3 == 1 ? 4096 + (r >> 4) % MiB
                                        : MiB + (r >> 4) % (9 * MiB);
      unsigned char *p = galloc(size);
      size_t usable = (size + 511) / 512 * 512;
      ck_assert(!readable(p + usable));
      ck_assert(readable(p + usable - 1));
      live[nlive].p = p, live[nlive].size = size, live[nlive].fill = (unsigned char)step;
      memset(p, (unsigned char)step, size);
      nlive++;
    } else {
      size_t i = (r >> 2) % nlive;
      ck_assert_int_eq(live[i].p[0], live[i].fill);
      ck_assert_int_eq(live[i].p[live[i].size - 1], live[i].fill);
      ck_assert(!readable(live[i].p + (live[i].size + 511) / 512 * 512));
      ck_assert_int_eq(gmli_alloc_free(&G, live[i].p), 0);
      live[i] = live[--nlive];
    }
    if (step % 500 == 499) ck_assert_msg(gmli_alloc_check(&G) == 0, "%s", G.last_error);
  }
  gml_stats st;
  gmli_alloc_stats(&G, &st);
  printf("guard randomized (%s grain): peak allocated %.1f MiB, peak reserved %.1f MiB, maps %llu, unmaps %llu\n",
         _i ? "chunk" : "page", st.peak_allocated / (double)MiB, st.peak_reserved / (double)MiB,
         (unsigned long long)st.maps, (unsigned long long)st.unmaps);
  for (size_t i = 0; i < nlive; i++) gmli_alloc_free(&G, live[i].p);
  ck_assert_int_eq(gmli_alloc_check(&G), 0);
}
END_TEST

/* A new backend is its file and one table line: nothing else names it. A
 * backend outside the table (the host's operations under another name) gets
 * the capabilities of its entry, a flag no caller knows among them, and guard
 * mode honours them: its SIGSEGV report is installed where faults raise
 * signals, whatever the backend is called, and not where they do not. */
#define DUMMY_CAP (1u << 31)

static int dummy_open(int device, const gml_backend_opts *opts, gml_backend **out, char *msg, size_t msglen) {
  int rc = gmli_backend_find("host")->open(device, opts, out, msg, msglen);
  if (!rc) (*out)->name = "dummy";
  return rc;
}

/* The SIGSEGV handler now (NULL: none with SA_SIGINFO). Compared with the one before gml_open, not
 * with none: under AddressSanitizer the process starts with ASan's own (make check-san failed so). */
static void *segv_handler(void) {
  struct sigaction cur;
  ck_assert_int_eq(sigaction(SIGSEGV, NULL, &cur), 0);
  return (cur.sa_flags & SA_SIGINFO) ? (void *)cur.sa_sigaction : NULL;
}

START_TEST(test_backend_capability_honoured) {
  gml_backend_entry e = *gmli_backend_find("host");
  e.name = "dummy", e.open = dummy_open, e.caps = DUMMY_CAP | (_i ? GML_BACKEND_FAULT_SIGNALS : 0);
  ck_assert_int_eq(gmli_backend_register(&e), 0);
  ck_assert(gmli_backend_known("dummy"));
  ck_assert_str_eq(gmli_backend_names(), "auto, cuda, host, dummy");
  ck_assert_uint_eq(gmli_backend_caps_named("dummy"), e.caps);
  gml_open_opts o = {0};
  o.backend = "dummy", o.mode = GML_MODE_EMBEDDED, o.guard = GML_GUARD_END;
  gml_client *c = NULL;
  void *before = segv_handler();
  ck_assert_int_eq(gml_open(&o, &c), 0);
  gml_stats st;
  ck_assert_int_eq(gml_stats_get(c, &st), 0);
  ck_assert_str_eq(st.backend, "dummy");
  ck_assert_int_eq(segv_handler() != before, _i); /* the report, only where a fault is a signal */
  void *p = NULL;
  ck_assert_int_eq(gml_alloc(c, 4096, 0, &p), 0);
  ck_assert_int_eq(gml_free(c, p), 0);
  ck_assert_int_eq(gml_close(c), 0);
  ck_assert_ptr_eq(segv_handler(), before);
}
END_TEST

Suite *guard_suite(void) {
  Suite *s = suite_create("guard");
  TCase *tc = tcase_create("overflow");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_guard_overflow_reported, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_loop_test(tc, test_backend_capability_honoured, 0, 2);
  suite_add_tcase(s, tc);
  TCase *ta = tcase_create("guard");
  tcase_set_timeout(ta, 120);
  tcase_add_checked_fixture(ta, gsetup, gteardown);
  tcase_add_loop_test(ta, test_block_of, 0, 2);
  tcase_add_loop_test(ta, test_guard_randomized, 0, 2);
  suite_add_tcase(s, ta);
  return s;
}
