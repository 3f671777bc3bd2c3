/* Framing: round trip with fds, over-long frames, truncation. */
#include "gmlake.h"
#include "fdkeep.h"
#include "log.h"
#include "wire.h"
#include <errno.h>
#include <sys/wait.h>
#include <check.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

START_TEST(test_round_trip_with_fds) {
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__LeaseReply lr = GMLAKE__LEASE_REPLY__INIT;
  uint64_t ids[2] = {11, 12};
  lr.n_chunk_ids = 2;
  lr.chunk_ids = ids;
  env.seq = 9;
  env.msg_case = GMLAKE__ENVELOPE__MSG_LEASE_REPLY;
  env.lease_reply = &lr;
  uint8_t *f;
  size_t len;
  ck_assert_int_eq(gmli_wire_encode(&env, &f, &len), 0);
  int fds[2] = {open("/dev/null", O_RDONLY), open("/dev/zero", O_RDONLY)};
  ck_assert_int_eq(gmli_wire_send(sv[0], f, len, fds, 2), 0);
  free(f);
  Gmlake__Envelope *in;
  int got[8], n = 0;
  ck_assert_int_eq(gmli_wire_recv(sv[1], &in, got, &n, 8), 0);
  ck_assert_int_eq(n, 2);
  ck_assert_uint_eq(in->seq, 9);
  ck_assert_uint_eq(in->lease_reply->chunk_ids[1], 12);
  char c;
  ck_assert_int_eq(read(got[1], &c, 1), 1); /* /dev/zero came through */
  ck_assert_int_eq(c, 0);
  gmlake__envelope__free_unpacked(in, NULL);
  for (int i = 0; i < 2; i++) close(fds[i]), close(got[i]);
  close(sv[0]), close(sv[1]);
}
END_TEST

START_TEST(test_rx_limits) {
  gml_rx rx = {0};
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  uint8_t partial[6] = {10, 0, 0, 0, 1, 2};
  ck_assert_int_eq(write(sv[0], partial, 6), 6);
  ck_assert_int_gt(gmli_rx_fill(&rx, sv[1]), 0);
  const uint8_t *body;
  size_t blen;
  ck_assert_int_eq(gmli_rx_next(&rx, &body, &blen), 0); /* incomplete */
  uint8_t big[4] = {0, 0, 0, 1};                        /* 16 MiB */
  gml_rx rx2 = {0};
  ck_assert_int_eq(write(sv[0], big, 4), 4);
  ck_assert_int_gt(gmli_rx_fill(&rx2, sv[1]), 0);
  /* rx2 got the rest of "partial"'s stream? no: rx already read it; this read sees big */
  ck_assert_int_eq(gmli_rx_next(&rx2, &body, &blen), GML_EPROTO);
  gmli_rx_free(&rx), gmli_rx_free(&rx2);
  close(sv[0]);
  Gmlake__Envelope *in;
  int fds[1], n;
  ck_assert_int_eq(gmli_wire_recv(sv[1], &in, fds, &n, 1), GML_EDAEMON); /* EOF */
  close(sv[1]);
}
END_TEST

/* fdkeep.h: kept fds by key, dups that outlive the kept one, a bound, and a
 * forked child that holds none of them (it would keep the chunks allocated). */
static int fd_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

START_TEST(test_fdkeep) {
  gml_fdkeep k;
  gmli_fdkeep_init(&k, 3000);
  int fds[2500];
  for (int i = 0; i < 2500; i++) { /* past a few table growths */
    fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(fds[i], 0);
    ck_assert_int_eq(gmli_fdkeep_put(&k, 1000 + (uint64_t)i * 7, fds[i]), 0);
  }
  ck_assert_uint_eq(gmli_fdkeep_count(&k), 2500);
  ck_assert_int_ne(gmli_fdkeep_put(&k, 0, fds[0]), 0); /* key 0: never */
  int d = gmli_fdkeep_dup(&k, 1000 + 7 * 1234);
  ck_assert_int_ge(d, 0);
  ck_assert_int_ne(d, fds[1234]);
  ck_assert_int_eq(fcntl(d, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  close(d);
  errno = 0;
  ck_assert_int_eq(gmli_fdkeep_dup(&k, 5), -1);
  ck_assert_int_eq(errno, ENOENT);
  for (int i = 0; i < 2500; i += 2) gmli_fdkeep_drop(&k, 1000 + (uint64_t)i * 7); /* closes them */
  ck_assert_uint_eq(gmli_fdkeep_count(&k), 1250);
  for (int i = 0; i < 2500; i++) { /* the rest still found after the backward shifts */
    ck_assert_int_eq(fd_open(fds[i]), i % 2);
    if (i % 2) {
      int e = gmli_fdkeep_dup(&k, 1000 + (uint64_t)i * 7);
      ck_assert_int_ge(e, 0);
      close(e);
    }
  }
  pid_t pid = fork();
  if (pid == 0) { /* the child: every kept fd closed, and nothing more is kept */
    int open_ones = 0;
    for (int i = 1; i < 2500; i += 2) open_ones += fd_open(fds[i]);
    int x = open("/dev/null", O_RDONLY);
    int kept = gmli_fdkeep_put(&k, 99, x) == 0;
    _exit(open_ones == 0 && gmli_fdkeep_count(&k) == 0 && !kept ? 0 : 1);
  }
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the forked child still held kept fds");
  for (int i = 1; i < 2500; i += 2) ck_assert(fd_open(fds[i])); /* the parent keeps them */
  ck_assert_uint_eq(gmli_fdkeep_count(&k), 1250);
  gmli_fdkeep_destroy(&k);
  for (int i = 1; i < 2500; i += 2) ck_assert(!fd_open(fds[i]));
}
END_TEST

/* The bound: past it nothing more is kept (the caller closes), and it says so once. */
START_TEST(test_fdkeep_bound) {
  gml_fdkeep k;
  gmli_fdkeep_init(&k, 2);
  int a = open("/dev/null", O_RDONLY), b = open("/dev/null", O_RDONLY), c = open("/dev/null", O_RDONLY);
  ck_assert_int_eq(gmli_fdkeep_put(&k, 1, a), 0);
  ck_assert_int_eq(gmli_fdkeep_put(&k, 2, b), 0);
  ck_assert_int_ne(gmli_fdkeep_put(&k, 3, c), 0);
  ck_assert(fd_open(c)); /* not taken */
  close(c);
  gmli_fdkeep_drop(&k, 1);
  int e = open("/dev/null", O_RDONLY);
  ck_assert_int_eq(gmli_fdkeep_put(&k, 3, e), 0); /* room again */
  gmli_fdkeep_destroy(&k);
}
END_TEST

/* What a client sends reaches the log escaped (common/log.c): control bytes and bytes past '~' as \xNN,
 * '\' doubled (a literal "\x0a" in a key cannot pass for an escaped newline), cut with "..." to fit. */
START_TEST(test_log_escape) {
  char out[16];
  ck_assert_str_eq(gmli_log_escape("a\nb\x1b[0m\\\xff", out, sizeof out), "a\\x0ab\\x1b[0...");
  ck_assert_str_eq(gmli_log_escape("k\\x0a", out, sizeof out), "k\\\\x0a");
  ck_assert_str_eq(gmli_log_escape("0123456789abcde", out, sizeof out), "0123456789abcde"); /* fits whole */
  ck_assert_str_eq(gmli_log_escape("0123456789abcdef", out, sizeof out), "0123456789ab...");
  ck_assert_str_eq(GML_LOG_ESC("\t"), "\\x09");
  ck_assert_uint_eq(strlen(GML_LOG_ESC((char[1000]){[0 ... 998] = '\n'})), GML_LOG_ESC_MAX - 1);
}
END_TEST

Suite *wire_suite(void) {
  Suite *s = suite_create("wire");
  TCase *tc = tcase_create("wire");
  tcase_add_test(tc, test_round_trip_with_fds);
  tcase_add_test(tc, test_log_escape);
  tcase_add_test(tc, test_rx_limits);
  tcase_add_test(tc, test_fdkeep);
  tcase_add_test(tc, test_fdkeep_bound);
  suite_add_tcase(s, tc);
  return s;
}
