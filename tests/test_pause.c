/* gml_pause / gml_resume on an embedded client (host backend): content kept
 * at the same addresses, chunks given back while paused, tags, discard, the
 * file option, frees and allocations while paused, and the allocator's
 * invariants (gmli_alloc_check) at every step. */
#include "client_priv.h"
#include "gmlake.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static gml_client *open_embedded(void) {
  gml_client *c;
  gml_open_opts o = {.backend = "host", .mode = GML_MODE_EMBEDDED};
  ck_assert_int_eq(gml_open(&o, &c), 0);
  return c;
}

static void fill(void *p, size_t n, uint64_t seed) {
  uint64_t *w = p;
  for (size_t i = 0; i < n / 8; i++) w[i] = seed * 0x9E3779B97F4A7C15ull + i;
}

static int same(const void *p, size_t n, uint64_t seed) {
  const uint64_t *w = p;
  for (size_t i = 0; i < n / 8; i++)
    if (w[i] != seed * 0x9E3779B97F4A7C15ull + i) return 0;
  return 1;
}

static uint64_t reserved(gml_client *c) {
  gml_stats st;
  gml_stats_get(c, &st);
  return st.reserved;
}

/* _i: GMLAKE_PAUSE_OVERLAP (0: every copy, then every give-back; 1: blocks in groups of 1 MiB, each
 * group's chunks given back while the next copies, resume copying as it maps) */
static void overlap(int on) {
  setenv("GMLAKE_PAUSE_OVERLAP", on ? "1" : "0", 1);
  gmli_pause_group = 1 << 20;
}

START_TEST(test_pause_keeps_bytes_at_same_addresses) {
  overlap(_i);
  gml_client *c = open_embedded();
  size_t sizes[] = {3 << 20, 4096, 10 << 20, 700 << 10, 1 << 20};
  void *p[5];
  for (int i = 0; i < 5; i++) {
    ck_assert_int_eq(gml_alloc(c, sizes[i], 0, &p[i]), 0);
    fill(p[i], sizes[i], (uint64_t)i + 1);
  }
  void *idle;
  ck_assert_int_eq(gml_alloc(c, 8 << 20, 0, &idle), 0);
  ck_assert_int_eq(gml_free(c, idle), 0); /* idle cache goes back too */
  gml_stats st;
  gml_stats_get(c, &st);
  uint64_t allocated = st.allocated;
  ck_assert_int_eq(gml_pause(c, 0, 0), 0);
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  gml_stats_get(c, &st);
  ck_assert_uint_eq(st.reserved, 0); /* every chunk went back */
  ck_assert_uint_eq(st.allocated, 0);
  ck_assert_uint_eq(st.paused_bytes, allocated);
  ck_assert_uint_eq(st.paused_saved, allocated);
  ck_assert_int_eq(gml_pause(c, 0, 0), GML_EINVAL); /* once */
  ck_assert_int_eq(gml_resume(c), 0);
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  for (int i = 0; i < 5; i++) ck_assert_msg(same(p[i], sizes[i], (uint64_t)i + 1), "block %d differs after resume", i);
  gml_stats_get(c, &st);
  ck_assert_uint_eq(st.allocated, allocated);
  ck_assert_uint_eq(st.paused_bytes, 0);
  for (int i = 0; i < 5; i++) ck_assert_int_eq(gml_free(c, p[i]), 0);
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  /* nothing paused: refused, saying so (it returned 0, so a resume meant for another client, or
   * after a pause that failed, passed unnoticed), as a second pause is */
  ck_assert_int_eq(gml_resume(c), GML_EINVAL);
  ck_assert_str_eq(gml_last_error(c), "gml_resume: not paused (gml_pause first)");
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  gml_close(c);
  unsetenv("GMLAKE_PAUSE_OVERLAP");
}
END_TEST

START_TEST(test_pause_tag_discard_file_and_frees) {
  gml_client *c = open_embedded();
  void *keep, *kv, *kv2, *w;
  ck_assert_int_eq(gml_alloc(c, 5 << 20, 0, &keep), 0); /* untagged: stays */
  ck_assert_int_eq(gml_set_tag(c, 7), 0);
  ck_assert_int_eq(gml_alloc(c, 6 << 20, 0, &kv), 0);
  ck_assert_int_eq(gml_alloc(c, 2 << 20, 0, &kv2), 0);
  ck_assert_int_eq(gml_set_tag(c, 9), 0);
  ck_assert_int_eq(gml_alloc(c, 4 << 20, 0, &w), 0);
  ck_assert_int_eq(gml_set_tag(c, 0), 0);
  fill(keep, 5 << 20, 1), fill(kv, 6 << 20, 2), fill(kv2, 2 << 20, 3), fill(w, 4 << 20, 4);
  uint64_t before = reserved(c);
  /* tag 7 to a file: only kv and kv2 go */
  char path[64];
  snprintf(path, sizeof path, "/tmp/gmlake-pause-%d", (int)getpid());
  ck_assert_int_eq(gml_pause(c, GML_PAUSE_FILE, 7), GML_EINVAL); /* a file needs a path */
  ck_assert_msg(strstr(gml_last_error(c), "GML_PAUSE_FILE needs a path"), "%s", gml_last_error(c));
  /* a file that exists (another user's, made for the content to land in) or a symlink: refused, untouched */
  char link[80];
  snprintf(link, sizeof link, "%s.link", path);
  FILE *pre = fopen(path, "w");
  ck_assert_ptr_nonnull(pre);
  fclose(pre);
  ck_assert_int_eq(symlink(path, link), 0);
  ck_assert_int_eq(gml_pause_file(c, GML_PAUSE_FILE, 7, path), GML_ESYS);
  ck_assert_int_eq(gml_pause_file(c, GML_PAUSE_FILE, 7, link), GML_ESYS);
  struct stat pst;
  ck_assert_int_eq(stat(path, &pst), 0);
  ck_assert_int_eq(pst.st_size, 0);
  ck_assert_int_eq(unlink(link), 0);
  /* a path too long to be kept whole: refused (resume removed the path cut short: another file) */
  char dir[300], longp[420], cut[300];
  snprintf(dir, sizeof dir, "%s.d", path);
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  size_t dl = strlen(dir);
  memset(dir + dl, 'a', 200), dir[dl] = '/', dir[dl + 200] = 0; /* PATH.d/aaa...: one component of 199 */
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  snprintf(longp, sizeof longp, "%s/%0100d", dir, 0); /* over 255 bytes, each component under */
  snprintf(cut, sizeof cut, "%.255s", longp);
  FILE *victim = fopen(cut, "w"); /* where the path cut at 255 bytes lands */
  ck_assert_ptr_nonnull(victim);
  fclose(victim);
  ck_assert_int_eq(gml_pause_file(c, GML_PAUSE_FILE, 7, longp), GML_EINVAL);
  ck_assert_int_eq(access(cut, F_OK), 0);
  ck_assert_int_ne(access(longp, F_OK), 0);
  ck_assert_int_eq(unlink(cut), 0);
  ck_assert_int_eq(rmdir(dir), 0);
  dir[dl] = 0;
  ck_assert_int_eq(rmdir(dir), 0);
  ck_assert_int_eq(unlink(path), 0);
  /* a path implies GML_PAUSE_FILE: flags 0 saves to the file (it was GML_EINVAL, with no message) */
  ck_assert_int_eq(gml_pause_file(c, 0, 7, path), 0);
  ck_assert_int_eq(access(path, F_OK), 0);
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  ck_assert_uint_lt(reserved(c), before);
  ck_assert(same(keep, 5 << 20, 1) && same(w, 4 << 20, 4)); /* the others are untouched and usable */
  /* allocations go on while paused, never on a paused block's addresses */
  void *n1;
  ck_assert_int_eq(gml_alloc(c, 6 << 20, 0, &n1), 0);
  ck_assert((char *)n1 + (6 << 20) <= (char *)kv || (char *)n1 >= (char *)kv + (6 << 20));
  fill(n1, 6 << 20, 5);
  ck_assert_int_eq(gml_free(c, kv2), 0); /* freed while paused: not restored, free at resume */
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  ck_assert_int_eq(gml_resume(c), 0);
  ck_assert_int_ne(access(path, F_OK), 0); /* the file is gone */
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  ck_assert(same(kv, 6 << 20, 2));
  ck_assert(same(keep, 5 << 20, 1) && same(w, 4 << 20, 4) && same(n1, 6 << 20, 5));
  /* discard saves nothing: with a path (or GML_PAUSE_FILE) it contradicts itself, refused and named
   * (the path was ignored: a caller who meant to save got nothing saved, no error) */
  ck_assert_int_eq(gml_pause_file(c, GML_PAUSE_DISCARD, 9, path), GML_EINVAL);
  ck_assert_msg(strstr(gml_last_error(c), "gml_pause_file: GML_PAUSE_DISCARD saves nothing, a path saves the content"),
                "%s", gml_last_error(c));
  ck_assert_int_ne(access(path, F_OK), 0); /* no file made */
  ck_assert_int_eq(gml_pause(c, GML_PAUSE_DISCARD | GML_PAUSE_FILE, 9), GML_EINVAL);
  ck_assert_msg(
      strstr(gml_last_error(c), "gml_pause: GML_PAUSE_DISCARD saves nothing, GML_PAUSE_FILE saves the content"), "%s",
      gml_last_error(c));
  /* an empty path is no file name (was GML_ESYS from open("")) */
  ck_assert_int_eq(gml_pause_file(c, 0, 0, ""), GML_EINVAL);
  ck_assert_msg(strstr(gml_last_error(c), "gml_pause_file: an empty path"), "%s", gml_last_error(c));
  gml_stats st;
  gml_stats_get(c, &st);
  ck_assert_uint_eq(st.paused_bytes, 0); /* nothing paused */
  /* discard: the chunks go, nothing is saved (a NULL path is gml_pause) */
  ck_assert_int_eq(gml_pause_file(c, GML_PAUSE_DISCARD, 9, NULL), 0);
  gml_stats_get(c, &st);
  ck_assert_uint_eq(st.paused_bytes, 4 << 20);
  ck_assert_uint_eq(st.paused_saved, 0);
  ck_assert_int_eq(gml_resume(c), 0);
  fill(w, 4 << 20, 6); /* mapped again: writable */
  ck_assert(same(w, 4 << 20, 6));
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  ck_assert_int_eq(gml_free(c, keep), 0);
  ck_assert_int_eq(gml_free(c, kv), 0);
  ck_assert_int_eq(gml_free(c, w), 0);
  ck_assert_int_eq(gml_free(c, n1), 0);
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  gml_stats_get(c, &st);
  ck_assert_uint_eq(st.allocated, 0);
  gml_close(c);
}
END_TEST

/* A resume the limit cannot serve fails clearly and can be retried. */
START_TEST(test_resume_over_limit_retries) {
  overlap(_i);
  gml_client *c;
  gml_open_opts o = {.backend = "host", .mode = GML_MODE_EMBEDDED, .limit_bytes = 16 << 20};
  ck_assert_int_eq(gml_open(&o, &c), 0);
  void *p, *q;
  ck_assert_int_eq(gml_alloc(c, 10 << 20, 0, &p), 0);
  fill(p, 10 << 20, 3);
  ck_assert_int_eq(gml_pause(c, 0, 0), 0);
  ck_assert_int_eq(gml_alloc(c, 12 << 20, 0, &q), 0); /* takes what the paused block gave back */
  int rc = gml_resume(c);
  ck_assert_int_eq(rc, GML_ENOMEM);
  ck_assert_msg(strstr(gml_last_error(c), "resume: no memory"), "%s", gml_last_error(c));
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  ck_assert_int_eq(gml_free(c, q), 0);
  ck_assert_int_eq(gml_resume(c), 0);
  ck_assert(same(p, 10 << 20, 3));
  ck_assert_int_eq(gmli_alloc_check(&c->alloc), 0);
  gml_close(c);
  unsetenv("GMLAKE_PAUSE_OVERLAP");
}
END_TEST

/* Guard mode refuses a pause (a remap would drop the guards). */
START_TEST(test_pause_refused_in_guard_mode) {
  setenv("GMLAKE_GUARD", "1", 1);
  gml_client *c = open_embedded();
  unsetenv("GMLAKE_GUARD");
  void *p;
  ck_assert_int_eq(gml_alloc(c, 3 << 20, 0, &p), 0);
  ck_assert_int_eq(gml_pause(c, 0, 0), GML_EINVAL);
  /* it said "not in guard mode", as if guard mode were what pause lacked */
  ck_assert_str_eq(gml_last_error(c), "pause: refused in guard mode (a remap would drop the guards)");
  /* a pause file that cannot be made says why; "must be new" only where it exists */
  gml_close(c);
  c = open_embedded();
  ck_assert_int_eq(gml_alloc(c, 3 << 20, 0, &p), 0);
  ck_assert_int_eq(gml_pause_file(c, 0, 0, "/nonexistent-dir/save.bin"), GML_ESYS);
  ck_assert_str_eq(gml_last_error(c), "pause: cannot create /nonexistent-dir/save.bin: No such file or directory");
  ck_assert_int_eq(gml_pause_file(c, 0, 0, "/dev/null"), GML_ESYS);
  ck_assert_str_eq(gml_last_error(c), "pause: cannot create /dev/null: File exists (a pause file must be new)");
  ck_assert_int_eq(gml_free(c, p), 0);
  gml_close(c);
}
END_TEST

/* A relative pause file is the one made at pause, whatever the cwd is at
 * resume: before, resume unlinked the name against the new cwd (another file
 * of the same name, a user's own data, went) and left the pause file behind. */
START_TEST(test_pause_file_relative_path) {
  char top[] = "/tmp/gmlake-pause.XXXXXX", d1[64], d2[64], cwd[4096], f1[96], f2[96];
  ck_assert_ptr_nonnull(mkdtemp(top));
  snprintf(d1, sizeof d1, "%s/d1", top), snprintf(d2, sizeof d2, "%s/d2", top);
  snprintf(f1, sizeof f1, "%s/save.bin", d1), snprintf(f2, sizeof f2, "%s/save.bin", d2);
  ck_assert_int_eq(mkdir(d1, 0700), 0);
  ck_assert_int_eq(mkdir(d2, 0700), 0);
  FILE *f = fopen(f2, "w");
  ck_assert_ptr_nonnull(f);
  fputs("precious", f);
  fclose(f);
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  gml_client *c = open_embedded();
  void *p;
  ck_assert_int_eq(gml_alloc(c, 4 << 20, 0, &p), 0);
  fill(p, 4 << 20, 3);
  ck_assert_int_eq(chdir(d1), 0);
  ck_assert_int_eq(gml_pause_file(c, 0, 0, "save.bin"), 0);
  ck_assert_int_eq(access(f1, F_OK), 0);
  ck_assert_int_eq(chdir(d2), 0);
  ck_assert_int_eq(gml_resume(c), 0);
  ck_assert(same(p, 4 << 20, 3));
  ck_assert_msg(access(f2, F_OK) == 0, "resume removed d2/save.bin, a file it did not make");
  ck_assert_msg(access(f1, F_OK) != 0, "resume left the pause file d1/save.bin");
  ck_assert_int_eq(chdir(cwd), 0);
  ck_assert_int_eq(gml_free(c, p), 0);
  gml_close(c);
  unlink(f2), rmdir(d1), rmdir(d2), rmdir(top);
}
END_TEST

Suite *pause_suite(void) {
  Suite *s = suite_create("pause");
  TCase *tc = tcase_create("pause");
  tcase_add_loop_test(tc, test_pause_keeps_bytes_at_same_addresses, 0, 2);
  tcase_add_test(tc, test_pause_tag_discard_file_and_frees);
  tcase_add_loop_test(tc, test_resume_over_limit_retries, 0, 2);
  tcase_add_test(tc, test_pause_refused_in_guard_mode);
  tcase_add_test(tc, test_pause_file_relative_path);
  suite_add_tcase(s, tc);
  return s;
}
