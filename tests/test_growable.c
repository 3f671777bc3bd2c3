/* Growable ranges on the host backend, embedded: growing maps in place (the
 * bytes already there stay where they were), shrinking gives the chunks back
 * (their memfds are closed and the limit sees the room), an unmapped part
 * faults, mapping is all or nothing, and the client's stats count it apart. */
#include "gmlake.h"
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static gml_client *C;
static size_t CS;

static void open_client(size_t limit) {
  gml_open_opts o = {0};
  o.mode = GML_MODE_EMBEDDED;
  o.backend = "host";
  o.limit_bytes = limit;
  ck_assert_int_eq(gml_open(&o, &C), 0);
  gml_stats st;
  ck_assert_int_eq(gml_stats_get(C, &st), 0);
  CS = st.chunk_size;
}

static void setup(void) {
  unsetenv("GMLAKE_CHUNK_SIZE");
  unsetenv("GMLAKE_LIMIT");
  open_client(0);
}

static void teardown(void) {
  if (C) gml_close(C);
  C = NULL;
}

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  while (d && readdir(d)) n++;
  if (d) closedir(d);
  return n;
}

/* every word of chunk k of the range gets token*1000+k */
static void tag_chunk(char *base, size_t k, uint64_t token) {
  uint64_t *w = (uint64_t *)(base + k * CS);
  for (size_t i = 0; i < CS / 8; i++) w[i] = token * 1000 + k;
}

static int chunk_has_tag(const char *base, size_t k, uint64_t token) {
  const uint64_t *w = (const uint64_t *)(base + k * CS);
  for (size_t i = 0; i < CS / 8; i += 4093)
    if (w[i] != token * 1000 + k) return 0;
  return w[CS / 8 - 1] == token * 1000 + k;
}

static void on_fault(int sig) {
  (void)sig;
  _exit(97);
}

/* 1 when reading base[off] in a child process faults (SIGSEGV/SIGBUS: the
 * child's handler exits 97; where a sanitizer keeps the signal, its report
 * exits non-zero), 0 when the read worked. */
static int read_faults(const char *base, size_t off) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    volatile const char *p = base + off;
    char v = *p;
    (void)v;
    _exit(0);
  }
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  if (WIFSIGNALED(st)) return WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS;
  if (WEXITSTATUS(st) == 97) return 1;
#if defined(__SANITIZE_ADDRESS__)
  return WEXITSTATUS(st) != 0;
#else
  return 0;
#endif
}

START_TEST(test_grows_in_place) {
  gml_growable *g;
  ck_assert_int_eq(gml_growable_create(C, 32 * CS - 100, &g), 0);
  gml_growable_info in;
  ck_assert_int_eq(gml_growable_info_get(g, &in), 0);
  ck_assert_uint_eq(in.reserved, 32 * CS);
  ck_assert_uint_eq(in.mapped, 0);
  char *base = in.base;
  ck_assert_int_eq(gml_growable_ensure(g, 3 * CS - 1), 0); /* rounds up to 3 chunks */
  for (size_t k = 0; k < 3; k++) tag_chunk(base, k, 7);
  gml_stats st;
  ck_assert_int_eq(gml_stats_get(C, &st), 0);
  ck_assert_uint_eq(st.growable_ranges, 1);
  ck_assert_uint_eq(st.growable_mapped, 3 * CS);
  ck_assert_uint_eq(st.growable_unmapped, 29 * CS);
  ck_assert_uint_eq(st.reserved, 0); /* the allocator's numbers do not include them */
  /* grow: 3 -> 10 chunks; the range does not move and the first 3 keep their bytes */
  ck_assert_int_eq(gml_growable_ensure(g, 10 * CS), 0);
  ck_assert_int_eq(gml_growable_info_get(g, &in), 0);
  ck_assert_ptr_eq(in.base, base);
  ck_assert_uint_eq(in.mapped, 10 * CS);
  ck_assert_uint_eq(in.mapped_prefix, 10 * CS);
  for (size_t k = 0; k < 3; k++) ck_assert_msg(chunk_has_tag(base, k, 7), "chunk %zu lost its bytes", k);
  for (size_t k = 3; k < 10; k++) tag_chunk(base, k, 8);
  /* ensure of what is mapped maps nothing */
  ck_assert_int_eq(gml_growable_ensure(g, 5 * CS), 0);
  ck_assert_int_eq(gml_growable_info_get(g, &in), 0);
  ck_assert_uint_eq(in.mapped, 10 * CS);
  /* a chunk at an offset of its own, leaving a hole */
  ck_assert_int_eq(gml_growable_map(g, 20 * CS, CS), 0);
  ck_assert_int_eq(gml_growable_is_mapped(g, 20 * CS + 5), 1);
  ck_assert_int_eq(gml_growable_is_mapped(g, 15 * CS), 0);
  ck_assert_int_eq(gml_growable_is_mapped(g, 32 * CS), GML_EINVAL);
  ck_assert_int_eq(gml_growable_info_get(g, &in), 0);
  ck_assert_uint_eq(in.mapped, 11 * CS);
  ck_assert_uint_eq(in.mapped_prefix, 10 * CS);
  tag_chunk(base, 20, 9);
  for (size_t k = 0; k < 10; k++) ck_assert(chunk_has_tag(base, k, k < 3 ? 7 : 8));
  ck_assert(chunk_has_tag(base, 20, 9));
  /* an unmapped part faults, the mapped parts read */
  ck_assert_int_eq(read_faults(base, 9 * CS + CS - 1), 0);
  ck_assert_int_eq(read_faults(base, 20 * CS), 0);
  ck_assert_int_eq(read_faults(base, 10 * CS), 1);
  ck_assert_int_eq(read_faults(base, 31 * CS + 7), 1);
  ck_assert_int_eq(gml_growable_destroy(g), 0);
  ck_assert_int_eq(gml_stats_get(C, &st), 0);
  ck_assert_uint_eq(st.growable_ranges, 0);
  ck_assert_uint_eq(st.growable_mapped, 0);
  ck_assert_uint_eq(st.growable_unmapped, 0);
}
END_TEST

START_TEST(test_shrink_gives_chunks_back) {
  int fds0 = open_fds();
  gml_growable *g;
  ck_assert_int_eq(gml_growable_create(C, 16 * CS, &g), 0);
  gml_growable_info in;
  gml_growable_info_get(g, &in);
  char *base = in.base;
  ck_assert_int_eq(gml_growable_ensure(g, 8 * CS), 0);
  ck_assert_int_eq(open_fds(), fds0 + 8); /* a memfd a chunk */
  for (size_t k = 0; k < 8; k++) tag_chunk(base, k, 3);
  ck_assert_int_eq(gml_growable_shrink(g, 2 * CS + 1), 0); /* keeps 3 chunks */
  ck_assert_int_eq(open_fds(), fds0 + 3);
  gml_growable_info_get(g, &in);
  ck_assert_uint_eq(in.mapped, 3 * CS);
  for (size_t k = 0; k < 3; k++) ck_assert(chunk_has_tag(base, k, 3));
  ck_assert_int_eq(read_faults(base, 3 * CS), 1);
  gml_stats st;
  gml_stats_get(C, &st);
  ck_assert_uint_eq(st.growable_mapped, 3 * CS);
  ck_assert_uint_eq(st.growable_unmapped, 13 * CS);
  /* grow again: fresh chunks behind the 3 that stayed */
  ck_assert_int_eq(gml_growable_ensure(g, 5 * CS), 0);
  for (size_t k = 0; k < 3; k++) ck_assert(chunk_has_tag(base, k, 3));
  ck_assert_int_eq(gml_growable_unmap(g, CS, CS), 0); /* a hole in the middle */
  ck_assert_int_eq(gml_growable_is_mapped(g, CS), 0);
  ck_assert_int_eq(read_faults(base, CS + 10), 1);
  ck_assert(chunk_has_tag(base, 0, 3) && chunk_has_tag(base, 2, 3));
  ck_assert_int_eq(open_fds(), fds0 + 4);
  ck_assert_int_eq(gml_growable_destroy(g), 0);
  ck_assert_int_eq(open_fds(), fds0);
}
END_TEST

START_TEST(test_bad_arguments) {
  gml_growable *g;
  ck_assert_int_eq(gml_growable_create(C, 0, &g), GML_EINVAL);
  ck_assert_int_eq(gml_growable_create(C, 4 * CS, &g), 0);
  ck_assert_int_eq(gml_growable_map(g, 1, CS), GML_EINVAL);
  ck_assert_int_eq(gml_growable_map(g, 0, CS + 1), GML_EINVAL);
  ck_assert_int_eq(gml_growable_map(g, 3 * CS, 2 * CS), GML_EINVAL);
  ck_assert_int_eq(gml_growable_ensure(g, 4 * CS + 1), GML_EINVAL);
  ck_assert_int_eq(gml_growable_unmap(g, CS / 2, CS), GML_EINVAL);
  ck_assert_int_eq(gml_growable_ensure(g, 4 * CS), 0); /* the whole range */
  ck_assert_int_eq(gml_growable_shrink(g, 0), 0);
  gml_growable_info in;
  gml_growable_info_get(g, &in);
  ck_assert_uint_eq(in.mapped, 0);
  /* left for gml_close to clean up (LeakSanitizer checks it does) */
  ck_assert_int_eq(gml_growable_ensure(g, CS), 0);
}
END_TEST

/* The embedded limit counts the allocator's chunks and the ranges' together;
 * a map that cannot have every chunk maps none, and the allocator's idle
 * cache goes back to make room. */
START_TEST(test_limit_all_or_nothing) {
  gml_close(C);
  open_client(4 * CS);
  void *p;
  ck_assert_int_eq(gml_alloc(C, 2 * CS, 0, &p), 0); /* 2 chunks to the allocator */
  gml_growable *g;
  ck_assert_int_eq(gml_growable_create(C, 8 * CS, &g), 0);
  int fds0 = open_fds();
  ck_assert_int_eq(gml_growable_ensure(g, 3 * CS), GML_ENOMEM);
  gml_growable_info in;
  gml_growable_info_get(g, &in);
  ck_assert_uint_eq(in.mapped, 0);
  ck_assert_int_eq(open_fds(), fds0); /* nothing held back */
  ck_assert_int_eq(gml_growable_ensure(g, 2 * CS), 0);
  ck_assert_int_eq(gml_growable_ensure(g, 3 * CS), GML_ENOMEM);
  ck_assert_int_eq(gml_free(C, p), 0); /* its 2 chunks now idle in the cache */
  ck_assert_int_eq(gml_growable_ensure(g, 4 * CS), 0);
  gml_stats st;
  gml_stats_get(C, &st);
  ck_assert_uint_eq(st.reserved, 0); /* the cache gave its chunks back */
  ck_assert_uint_eq(st.growable_mapped, 4 * CS);
  ck_assert_int_eq(gml_alloc(C, CS, 0, &p), GML_ENOMEM);
  ck_assert_int_eq(gml_growable_shrink(g, CS), 0);
  ck_assert_int_eq(gml_alloc(C, CS, 0, &p), 0);
  ck_assert_int_eq(gml_free(C, p), 0);
  ck_assert_int_eq(gml_growable_destroy(g), 0);
}
END_TEST

Suite *growable_suite(void) {
  Suite *s = suite_create("growable");
  TCase *tc = tcase_create("growable");
  tcase_set_timeout(tc, 60); /* children that fault: slow under the sanitizers on a loaded machine */
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_grows_in_place);
  tcase_add_test(tc, test_shrink_gives_chunks_back);
  tcase_add_test(tc, test_bad_arguments);
  tcase_add_test(tc, test_limit_all_or_nothing);
  suite_add_tcase(s, tc);
  return s;
}
