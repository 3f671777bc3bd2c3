/* The library boundary: the error table, the version, the GML_E* codes that
 * common code returns where it used to return -errno or -1. */
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include "wire.h"
#include <check.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

START_TEST(test_error_table) {
  static const struct { int code; const char *name, *msg; } want[] = {
#define ROW(name, code, msg) {code, "GML_" #name, msg},
      GML_ERRNO_MAP(ROW)
#undef ROW
  };
  ck_assert_int_eq(GML_OK, 0);
  ck_assert_int_eq(GML_ENOMEM, -1); /* codes are ABI: they never move */
  ck_assert_int_eq(GML_ECLOSED, -10);
  for (size_t i = 0; i < GML_ARRAY_LEN(want); i++) {
    ck_assert_int_eq(want[i].code, -(int)i); /* dense: 0, -1, -2, ... in table order */
    ck_assert_str_eq(gml_errname(want[i].code), want[i].name);
    ck_assert_str_eq(gml_strerror(want[i].code), want[i].msg);
  }
  ck_assert_str_eq(gml_errname(GML_EQUOTA), "GML_EQUOTA");
  ck_assert_str_eq(gml_strerror(GML_ENOMEM), "out of memory");
  ck_assert_str_eq(gml_strerror(-(int)GML_ARRAY_LEN(want)), "unknown error");
  ck_assert_str_eq(gml_errname(1), "GML_EUNKNOWN");
}
END_TEST

START_TEST(test_version) {
  ck_assert_uint_eq(gml_version(), GML_VERSION);
  ck_assert_uint_eq(GML_VERSION, (GML_VERSION_MAJOR << 16) | (GML_VERSION_MINOR << 8) | GML_VERSION_PATCH);
  gml_client *c;
  gml_open_opts o = {.backend = "host", .mode = GML_MODE_EMBEDDED};
  ck_assert_int_eq(gml_open(&o, &c), 0);
  gml_stats st;
  memset(&st, 0xff, sizeof st);
  ck_assert_int_eq(gml_stats_get(c, &st), 0);
  ck_assert_uint_eq(st.version, GML_VERSION);
  gml_close(c);
}
END_TEST

/* Socket failures come back as codes a caller switches on, errno kept. */
START_TEST(test_wire_codes) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
  gml_rx rx = {0};
  ck_assert_int_eq(gml_rx_fill(&rx, sv[1]), GML_EAGAIN); /* nothing there yet */
  uint8_t b = 1;
  ck_assert_int_eq(gml_wire_sendmsg(sv[0], &b, 1, NULL, 0), 1);
  ck_assert_int_eq(gml_rx_fill(&rx, sv[1]), 1);
  int fds[GML_MAX_LEASE_CHUNKS + 1] = {0};
  ck_assert_int_eq(gml_wire_sendmsg(sv[0], &b, 1, fds, GML_MAX_LEASE_CHUNKS + 1), GML_EINVAL);
  close(sv[1]);
  ck_assert_int_eq(gml_wire_sendmsg(sv[0], &b, 1, NULL, 0), GML_EDAEMON); /* EPIPE: the peer is gone */
  ck_assert_int_eq(gml_wire_send(sv[0], &b, 1, NULL, 0), GML_EDAEMON);
  ck_assert_int_eq(gml_rx_fill(&rx, -1), GML_ESYS); /* EBADF */
  gml_rx_free(&rx);
  close(sv[0]);
}
END_TEST

START_TEST(test_parse_codes) {
  uint64_t v;
  ck_assert_int_eq(gml_parse_size("2MiB", 0, &v), 0);
  ck_assert_uint_eq(v, 2u << 20);
  ck_assert_int_eq(gml_parse_size("junk", 0, &v), GML_EINVAL);
  ck_assert_int_eq(gml_parse_size("5%", 0, &v), GML_EINVAL);
  ck_assert_int_eq(gml_log_parse_level("INFO"), GML_LOG_INFO);
  ck_assert_int_eq(gml_log_parse_level("loud"), GML_EINVAL);
}
END_TEST

Suite *api_suite(void) {
  Suite *s = suite_create("api");
  TCase *tc = tcase_create("api");
  tcase_add_test(tc, test_error_table);
  tcase_add_test(tc, test_version);
  tcase_add_test(tc, test_wire_codes);
  tcase_add_test(tc, test_parse_codes);
  suite_add_tcase(s, tc);
  return s;
}
