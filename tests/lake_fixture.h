/* The unit tests' lake (test_lake.c, test_broker.c): a host backend and a
 * lake limited to 10 of its chunks, made before each test and destroyed
 * after; add_chunks() creates chunks into it as the daemon's creator does.
 * Static: each suite that includes it has its own. */
#ifndef GML_TESTS_LAKE_FIXTURE_H
#define GML_TESTS_LAKE_FIXTURE_H
#include "lake.h"
#include <check.h>

static gml_backend *be;
static lake lk;

static inline void lake_setup(void) {
  char msg[256];
  ck_assert_int_eq(gmli_backend_open("host", 0, NULL, &be, msg, sizeof msg), 0);
  lake_init(&lk, be, 10 * be->chunk_size);
}

static inline void lake_teardown(void) {
  lake_destroy(&lk);
  gmli_backend_close(be);
}

static inline void add_chunks(int n) {
  for (int i = 0; i < n; i++) {
    gml_phys p;
    int fd;
    ck_assert_int_eq(be->ops->chunk_create(be, &p, &fd), 0);
    ck_assert_int_eq(lake_add_created(&lk, p, fd), 0);
  }
}
#endif
