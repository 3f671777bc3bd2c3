/* A test that cannot run where it is says so, and is counted: test_skip()
 * appends "skipped TEST: WHY" to $GMLAKE_SKIP_LOG (tests/run.sh sets it and
 * counts the lines in its summary) and, where the suite runs as root (as CI
 * does, and where everything these tests need can be had), fails the test:
 * a skip there hides a test that should have run. test_not_run() is for what
 * this machine lacks whoever runs the suite (no writable cgroup2, no torch):
 * counted as not run, never a failure. */
#ifndef GML_TESTS_SKIP_H
#define GML_TESTS_SKIP_H
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline void test_note_skip(const char *kind, const char *test, const char *why) {
  const char *log = getenv("GMLAKE_SKIP_LOG");
  FILE *f = log && *log ? fopen(log, "a") : NULL;
  if (f) fprintf(f, "%s %s: %s\n", kind, test, why), fclose(f);
  fprintf(stderr, "%s: %s (%s)\n", test, kind, why);
}

static inline void test_skip(const char *test, const char *why) {
  test_note_skip("skipped", test, why);
  ck_assert_msg(geteuid() != 0, "%s: skipped as root (%s): as root every test must run", test, why);
}

static inline void test_not_run(const char *test, const char *why) { test_note_skip("not-run", test, why); }
#endif
