/* Unit tests (check): allocator, lake bookkeeping, lease broker, allocator policy, daemon settings, wire framing,
 * growable ranges, the API boundary. */
#include <check.h>
#include <stdlib.h>

Suite *alloc_suite(void);
Suite *lake_suite(void);
Suite *broker_suite(void);
Suite *policy_suite(void);
Suite *config_suite(void);
Suite *wire_suite(void);
Suite *growable_suite(void);
Suite *api_suite(void);
Suite *pause_suite(void);
Suite *guard_suite(void);
Suite *borrow_suite(void);
Suite *layer_suite(void);
Suite *partial_suite(void);
Suite *snapshot_suite(void);
Suite *usage_suite(void);

int main(void) {
  SRunner *sr = srunner_create(alloc_suite());
  srunner_add_suite(sr, lake_suite());
  srunner_add_suite(sr, broker_suite());
  srunner_add_suite(sr, policy_suite());
  srunner_add_suite(sr, config_suite());
  srunner_add_suite(sr, wire_suite());
  srunner_add_suite(sr, growable_suite());
  srunner_add_suite(sr, api_suite());
  srunner_add_suite(sr, pause_suite());
  srunner_add_suite(sr, guard_suite());
  srunner_add_suite(sr, borrow_suite());
  srunner_add_suite(sr, layer_suite());
  srunner_add_suite(sr, partial_suite());
  srunner_add_suite(sr, snapshot_suite());
  srunner_add_suite(sr, usage_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
