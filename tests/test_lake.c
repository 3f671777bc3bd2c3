/* Lake bookkeeping: ownership, generations, limit headroom, quotas, trim. */
#include "lake.h"
#include "gmlake.h"
#include "lake_fixture.h"
#include <check.h>

START_TEST(test_lease_and_ownership) {
  add_chunks(4);
  ck_assert_uint_eq(lake_headroom(&lk), 6);
  uint32_t idx[8];
  ck_assert_uint_eq(lake_take(&lk, 7, 3, idx), 3);
  ck_assert_uint_eq(lk.leased, 3);
  ck_assert_uint_eq(lk.nfree, 1);
  uint64_t id = lake_chunk_id(&lk, idx[0]);
  ck_assert_int_eq(lake_owned_index(&lk, id, 7), (long)idx[0]);
  ck_assert_int_eq(lake_owned_index(&lk, id, 8), GML_EBADPTR);  /* someone else's */
  ck_assert_int_eq(lake_owned_index(&lk, 999, 7), GML_EBADPTR); /* no such chunk */
  ck_assert_int_eq(lake_owned_index(&lk, 0, 7), GML_EBADPTR);
  lake_give_back(&lk, idx[0]);
  ck_assert_int_eq(lake_owned_index(&lk, id, 7), GML_EBADPTR); /* not leased any more */
  /* a destroyed and recreated slot gets a new generation: the old id is stale */
  ck_assert_uint_eq(lake_trim(&lk, 0), 2);
  add_chunks(1);
  uint32_t j;
  ck_assert_uint_eq(lake_take(&lk, 7, 1, &j), 1);
  if (j == idx[0]) ck_assert_int_eq(lake_owned_index(&lk, id, 7), GML_EBADPTR);
  ck_assert_int_ne(lake_chunk_id(&lk, j), id);
}
END_TEST

START_TEST(test_park_and_quota) {
  add_chunks(3);
  uint32_t idx[3];
  lake_take(&lk, 5, 3, idx);
  lake_park(&lk, idx[0]);
  ck_assert_uint_eq(lk.parked, 1);
  ck_assert_uint_eq(lk.leased, 2);
  lake_give_back(&lk, idx[0]);
  ck_assert_uint_eq(lk.parked, 0);
  ck_assert_uint_eq(lk.nfree, 1);
  ck_assert_int_eq(lake_set_quota(&lk, 1, 1000, 64), 0);
  ck_assert_int_eq(lake_set_quota(&lk, 0, 42, 32), 0);
  ck_assert_uint_eq(lake_quota_for(&lk, 42, 1000), 32); /* pid wins */
  ck_assert_uint_eq(lake_quota_for(&lk, 43, 1000), 64);
  ck_assert_uint_eq(lake_quota_for(&lk, 43, 1001), 0);
  ck_assert_int_eq(lake_set_quota(&lk, 0, 42, 0), 0); /* cleared */
  ck_assert_uint_eq(lake_quota_for(&lk, 42, 1000), 64);
}
END_TEST

Suite *lake_suite(void) {
  Suite *s = suite_create("lake");
  TCase *tc = tcase_create("lake");
  tcase_add_checked_fixture(tc, lake_setup, lake_teardown);
  tcase_add_test(tc, test_lease_and_ownership);
  tcase_add_test(tc, test_park_and_quota);
  suite_add_tcase(s, tc);
  return s;
}
