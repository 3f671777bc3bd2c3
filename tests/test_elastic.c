/* The elastic lake (issue 12) with a real gmlaked, real client processes
 * (gml-testclient) and gmlakectl, on the host backend: an idle client's
 * cache goes to the client that needs it, a lease the lake cannot serve
 * fails with the lake-wide picture, pause/resume, the daemon killed and
 * restarted under its clients, quotas per process and per user. */
#include "skip.h"
#include "gmlake.h"
#include "harness.h"
#include "util.h"
#include <check.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* An idle client's cache goes to the client that needs it: A allocates,
 * frees and then makes no call at all; B's lease is served from what A's
 * library thread gives back on the daemon's request. */
START_TEST(test_idle_client_gives_back) {
  start_daemon("--limit 32MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  client_ready(&a);
  client_ready(&b);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 24 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok"); /* the daemon now knows A caches 24 MiB; A goes idle */
  ck_assert_int_eq(stat_wait("cached", 24 << 20, 4000), 24 << 20);
  double t0 = now_ms();
  const char *r = client_cmd(&b, "alloc %d", 24 << 20); /* only 8 MiB are left under the limit */
  double dt = now_ms() - t0;
  ck_assert_msg(!strcmp(r, "ok 0"), "B got '%s'", r);
  printf("  idle client's cache to another client: lease served %.1f ms after the request (goal <= 50 ms)\n", dt);
  ck_assert_msg(dt < 1000, "took %.1f ms", dt); /* bounded well under the daemon's lease wait */
  ck_assert_int_le(stat_num("chunks_total"), 16);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A caches bytes (allocated, freed) and the daemon knows it (its report). */
static void cache_and_report(proc *a, long long bytes) {
  ck_assert_str_eq(client_cmd(a, "alloc %lld", bytes), "ok 0");
  ck_assert_str_eq(client_cmd(a, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(a, "flush"), "ok");
  ck_assert_int_eq(stat_wait("cached", bytes, 20000), bytes);
}

/* The test client's "timing" line: where its leases' time went (gml_stats). */
typedef struct lease_timing {
  unsigned long long calls, streamed, wait_us, import_us, map_us, mapcall_us, access_us, maps, unmaps;
} lease_timing;

static lease_timing timing_of(proc *b) {
  lease_timing t;
  const char *r = client_cmd(b, "timing");
  ck_assert_int_eq(
      sscanf(r,
             "timing calls %llu streamed %llu wait_us %llu import_us %llu map_us %llu mapcall_us %llu access_us %llu "
             "maps %llu unmaps %llu",
             &t.calls, &t.streamed, &t.wait_us, &t.import_us, &t.map_us, &t.mapcall_us, &t.access_us, &t.maps,
             &t.unmaps),
      9);
  return t;
}

/* A field of the client with that pid in `gmlakectl clients --json` (-1: none). */
static long long client_num(int pid, const char *key) {
  static char out[65536];
  if (ctl(out, sizeof out, "clients --json") != 0) return -1;
  char k[32];
  snprintf(k, sizeof k, "\"pid\":%d,", pid);
  const char *p = strstr(out, k);
  if (!p) return -1;
  const char *end = strchr(p, '}');
  long long v = json_num(p, key);
  char kk[64];
  snprintf(kk, sizeof kk, "\"%s\":", key);
  const char *at = strstr(p, kk);
  return at && end && at < end ? v : -1;
}

/* Shares survive a daemon restart: the publisher hands the share's chunks
 * over with the rest and publishes them again (same key, size, hash and
 * permissions), an attacher is counted a mapper again once the share is
 * back, a new process attaches the same bytes, and every chunk is counted
 * once. Before, the restarted daemon knew no share: attach failed, the
 * publisher could not publish again and the mapped chunks went uncounted. */
START_TEST(test_daemon_restart_keeps_shares) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  int pid_a = client_ready(&a), pid_b = client_ready(&b);
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "grow %d", 16 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&a, "gensure %d", 6 << 20), "ok");
  for (int k = 0; k < 3; k++) ck_assert_str_eq(client_cmd(&a, "gtag %d 5", k), "ok");
  ck_assert_str_eq(client_cmd(&a, "share weights %d", (5 << 20) + 7), "ok");
  ck_assert_str_eq(client_cmd(&b, "attach weights"), "ok 5242887");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 4 << 20), "ok 0"); /* and plain memory beside it */
  ck_assert_int_eq(stat_num("chunks_shared"), 3);
  kill(daemon_pid, SIGKILL);
  int st;
  waitpid(daemon_pid, &st, 0);
  launch_daemon();
  ck_assert_int_eq(stat_wait("shares", 1, 20000), 1);
  ck_assert_int_eq(stat_wait("chunks_shared", 3, 20000), 3);
  ck_assert_int_eq(stat_wait("chunks_leased", 2, 20000), 2);
  ck_assert_int_eq(stat_num("chunks_total"), 5); /* each chunk once: 3 shared, 2 leased */
  /* B is a mapper again (it retries each second until the publisher is back) */
  char out[4096], want[64];
  snprintf(want, sizeof want, "\"mapper_pids\":[");
  int found = 0;
  for (int i = 0; i < 2000 && !found; i++) { /* up to 20 s */
    ctl(out, sizeof out, "shares --json");
    char *m = strstr(out, want);
    char pb[16];
    snprintf(pb, sizeof pb, "%d", pid_b);
    found = m && strstr(m, pb) != NULL;
    if (!found) usleep(10000);
  }
  ck_assert_msg(found, "pid %d not among the mappers after the restart: %s", pid_b, out);
  snprintf(want, sizeof want, "\"publisher_pid\":%d", pid_a);
  ck_assert_msg(strstr(out, want), "%s", out);
  ck_assert_msg(strstr(out, "\"key\":\"weights\",\"size\":5242887,\"chunks\":3"), "%s", out);
  /* a new process attaches the same bytes; the publisher's range is still its share */
  proc c = client_start();
  client_ready(&c);
  ck_assert_str_eq(client_cmd(&c, "attach weights"), "ok 5242887");
  ck_assert_str_eq(client_cmd(&c, "aread 1"), "tag 5001");
  ck_assert_str_eq(client_cmd(&b, "aread 2"), "tag 5002");
  ck_assert_str_eq(client_cmd(&a, "share again %d", 2 << 20), "err -3 range already shared as 'weights'");
  /* everyone leaves: nothing left over, no complaint */
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_str_eq(client_cmd(&b, "adetach"), "ok");
  ck_assert_int_eq(stat_num("chunks_shared"), 3); /* C maps it */
  ck_assert_int_eq(client_finish(&c), 0);
  ck_assert_int_eq(stat_wait("chunks_shared", 0, 20000), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stat_num("protocol_errors"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* An attacher whose publisher died with the old daemon is not counted a
 * mapper of a new share that took the key: it maps other chunks (before, the
 * count and size matched and it was, and the new share's chunks stayed held
 * for it after their publisher destroyed them). */
START_TEST(test_restart_new_share_same_key) {
  start_daemon("--limit 64MiB --prefetch 0");
  char qlog[128];
  snprintf(qlog, sizeof qlog, "%s/q.log", tmpdir);
  proc p = client_start();
  client_stderr = qlog; /* Q's log: what it made of the share it finds under its key */
  proc q = client_start();
  client_stderr = NULL;
  client_ready(&p);
  int pid_q = client_ready(&q);
  ck_assert_str_eq(strtok((char *)client_cmd(&p, "grow %d", 8 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&p, "gensure %d", 4 << 20), "ok");
  ck_assert_str_eq(client_cmd(&p, "gtag 0 1"), "ok");
  ck_assert_str_eq(client_cmd(&p, "share k %d", 4 << 20), "ok");
  ck_assert_str_eq(client_cmd(&q, "attach k"), "ok 4194304");
  kill(daemon_pid, SIGKILL);
  waitpid(daemon_pid, NULL, 0);
  client_kill(&p); /* the publisher dies with the old daemon */
  launch_daemon();
  proc t = client_start();
  client_ready(&t);
  ck_assert_str_eq(strtok((char *)client_cmd(&t, "grow %d", 8 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&t, "gensure %d", 4 << 20), "ok");
  ck_assert_str_eq(client_cmd(&t, "gtag 0 2"), "ok");
  ck_assert_str_eq(client_cmd(&t, "share k %d", 4 << 20), "ok");
  /* Q asks once a second whether its share is back; of the new share it says it is not, once its
   * attach of it is detached again (the library's call: answered before the line is written) */
  ck_assert_msg(log_wait_in(qlog, "share 'k' is not back in the restarted daemon as we map it", 1, 20000, NULL, 0) == 1,
                "Q said nothing of the new share in 20 s");
  char out[4096], pq[16];
  ck_assert_int_eq(ctl(out, sizeof out, "shares --json"), 0);
  snprintf(pq, sizeof pq, "%d", pid_q);
  const char *m = strstr(out, "\"mapper_pids\":[");
  ck_assert_msg(m && !strstr(m, pq), "Q (pid %d) counted a mapper of the new share: %s", pid_q, out);
  ck_assert_str_eq(client_cmd(&q, "aread 0"), "tag 1000"); /* it maps its own on */
  ck_assert_str_eq(client_cmd(&t, "gdestroy"), "ok");
  ck_assert_int_eq(stat_wait("chunks_shared", 0, 20000), 0); /* nobody holds the new share */
  ck_assert_int_eq(client_finish(&q), 0);
  ck_assert_int_eq(client_finish(&t), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A restarted daemon takes hand-overs only as a hand-over: within its
 * adopt-window after start and within the client's quotas. Past either, the
 * client keeps its chunks as its own, uncounted, and leases anew under its
 * quota (before: any client could send an adopting hello at any time, and
 * adoption ignored quotas: a user returned chunks, kept their fds, and had
 * them adopted back, holding 16 MiB against a 4 MiB quota and 12 chunks
 * against a limit of 4). Its usage report says how much it keeps so, and
 * gmlakectl clients and stats show it (before: allocated over leased, no
 * word of memory on the device outside the lake). */
START_TEST(test_adoption_bounded) {
  char conf[] = "/tmp/gmlake-test-conf.XXXXXX";
  int cfd = mkstemp(conf);
  ck_assert_int_ge(cfd, 0);
  close(cfd);
  char args[256];
  snprintf(args, sizeof args, "--limit 64MiB --prefetch 0 --adopt-window 2 --config %s", conf);
  start_daemon(args);
  proc a = client_start();
  int pid_a = client_ready(&a);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 12 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "tag 0 5"), "ok");
  ck_assert_int_eq(client_num(pid_a, "uncounted"), 0);
  long long held = client_num(pid_a, "leased_bytes");
  ck_assert_int_ge(held, 12 << 20);
  /* over the quota the restarted daemon starts with: refused, kept */
  FILE *f = fopen(conf, "w");
  fprintf(f, "quota = uid:%d 8MiB\n", (int)getuid());
  fclose(f);
  kill(daemon_pid, SIGKILL);
  waitpid(daemon_pid, NULL, 0);
  launch_daemon();
  ck_assert_int_eq(stat_wait("clients", 1, 20000), 1);
  /* its report after the hand-over was refused says it keeps all of it (on the same connection after
   * its Adopt: a chunk adopted would be in the lake by then) */
  long long got = -1;
  for (int i = 0; i < 1000 && (got = client_num(pid_a, "uncounted")) != held; i++) usleep(20000);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_str_eq(client_cmd(&a, "readtags 0"), "tags 5000 5001 5002 5003 5004 5005");
  /* what it keeps outside the lake, shown: its report, gmlakectl clients (--json and the table), stats */
  ck_assert_int_eq(got, held);
  ck_assert_int_eq(client_num(pid_a, "leased_bytes"), 0);
  ck_assert_int_eq(stat_num("uncounted"), held);
  char out[4096], want[96], hb[32];
  ck_assert_int_eq(ctl(out, sizeof out, "clients"), 0);
  snprintf(want, sizeof want, "uncounted %s", gmli_format_bytes((uint64_t)held, hb, sizeof hb));
  ck_assert_msg(strstr(out, want) && strstr(out, "not counted by the lake"), "gmlakectl clients: %s", out);
  const char *r = client_cmd(&a, "alloc %d", 10 << 20);
  ck_assert_msg(!strncmp(r, "err -8 ", 7), "a lease past the quota: '%s'", r);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 4 << 20), "ok 1");
  ck_assert_int_eq(client_num(pid_a, "uncounted"), held); /* new leases are the lake's */
  long long leased = client_num(pid_a, "leased_bytes");
  printf("  a hand-over over quota refused: %lld bytes kept outside the lake, %lld leased anew\n", held, leased);
  ck_assert_int_ge(leased, 4 << 20);
  /* past the window: the client was stopped while the daemon restarted */
  f = fopen(conf, "w");
  fclose(f);
  kill(daemon_pid, SIGKILL);
  waitpid(daemon_pid, NULL, 0);
  stop_child(a.pid);
  launch_daemon();
  usleep(2500000); /* past the adopt-window (2 s, from before launch_daemon returns): a time the daemon defines */
  kill(a.pid, SIGCONT);
  ck_assert_int_eq(stat_wait("clients", 1, 20000), 1);
  /* its report after the late hello says it keeps all it holds (a hand-over taken would be in the lake by then) */
  for (int i = 0; i < 1000 && (got = client_num(pid_a, "uncounted")) != held + leased; i++) usleep(20000);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  sh(out, sizeof out, "grep -c 'would hand over chunks' %s/daemon.log", tmpdir);
  ck_assert_int_ge(atoi(out), 1);
  ck_assert_int_eq(got, held + leased); /* all it holds, the last leases too */
  ck_assert_str_eq(client_cmd(&a, "readtags 0"), "tags 5000 5001 5002 5003 5004 5005");
  /* leases anew: more than its cache (all it leased after the first restart, less the 4 MiB block in
   * use) can serve, however much of the refused 10 MiB it kept (a fixed 8 MiB was served by the cache
   * alone when it had kept 12 MiB: CI, once) */
  long long more = leased + (4 << 20), need = (more - (leased - (4 << 20))) >> 21;
  ck_assert_str_eq(client_cmd(&a, "alloc %lld", more), "ok 2");
  ck_assert_int_ge(stat_wait("chunks_leased", need, 2000), 1);
  ck_assert_int_le(stat_num("chunks_leased"), more >> 21);
  /* the uncounted chunks let go (released locally, not returned): none left */
  for (int i = 0; i < 3; i++) ck_assert_str_eq(client_cmd(&a, "free %d", i), "ok");
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "trim"), " "), "ok");
  for (int i = 0; i < 1000 && (got = client_num(pid_a, "uncounted")) != 0; i++) usleep(20000);
  ck_assert_int_eq(got, 0);
  ck_assert_int_eq(stat_num("uncounted"), 0);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
  unlink(conf);
}
END_TEST

/* A daemon past its adopt-window takes no hand-over from a client that
 * publishes a share: the share's chunks are its own, uncounted, with the
 * allocator's; destroying the range and trimming lets them go, and the
 * report says none are left (the share's go by their handles, not returned). */
START_TEST(test_uncounted_let_go) {
  start_daemon("--limit 64MiB --prefetch 0 --adopt-window 1");
  proc p = client_start();
  int pid_p = client_ready(&p);
  ck_assert_str_eq(strtok((char *)client_cmd(&p, "grow %d", 8 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&p, "gensure %d", 4 << 20), "ok");
  ck_assert_str_eq(client_cmd(&p, "gtag 0 1"), "ok");
  ck_assert_str_eq(client_cmd(&p, "share k %d", 4 << 20), "ok");
  ck_assert_str_eq(client_cmd(&p, "alloc %d", 2 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&p, "flush"), "ok");
  long long leased = client_num(pid_p, "leased_bytes");
  ck_assert_int_ge(leased, 2 << 20);
  kill(daemon_pid, SIGKILL);
  waitpid(daemon_pid, NULL, 0);
  stop_child(p.pid); /* back after the new daemon's window */
  launch_daemon();
  usleep(1500000); /* past the adopt-window (1 s, from before launch_daemon returns): a time the daemon defines */
  kill(p.pid, SIGCONT);
  long long got = -1;
  for (int i = 0; i < 1000 && (got = client_num(pid_p, "uncounted")) != leased + (4 << 20); i++) usleep(20000);
  ck_assert_int_eq(got, leased + (4 << 20)); /* the allocator's chunks and the share's */
  ck_assert_str_eq(client_cmd(&p, "gread 0"), "tag 1000");
  ck_assert_str_eq(client_cmd(&p, "gdestroy"), "ok");
  for (int i = 0; i < 1000 && (got = client_num(pid_p, "uncounted")) != leased; i++) usleep(20000);
  ck_assert_int_eq(got, leased);
  ck_assert_str_eq(client_cmd(&p, "free 0"), "ok");
  ck_assert_str_eq(strtok((char *)client_cmd(&p, "trim"), " "), "ok");
  for (int i = 0; i < 1000 && (got = client_num(pid_p, "uncounted")) != 0; i++) usleep(20000);
  ck_assert_int_eq(got, 0);
  ck_assert_int_eq(client_finish(&p), 0);
  ck_assert_int_eq(stat_num("chunks_total"), 0); /* the new lake never held any of them */
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A client that allocates and then makes no call (a notebook between cells)
 * is shown as it is within a fraction of a second: the library's keeper
 * thread reports what changed; before, the numbers waited for the 256th
 * next allocator call ("allocated 0 B", fragmentation 100% in gmlakectl). */
START_TEST(test_idle_client_numbers_current) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start();
  int pid_a = client_ready(&a);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 10 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 3 << 20), "ok 1"); /* no flush: A idles from here */
  double t0 = now_ms();
  long long got = -1;
  while (now_ms() - t0 < 20000 && (got = client_num(pid_a, "allocated")) != (13 << 20)) usleep(10000);
  printf("  an idle client's allocation shown by the daemon after %.0f ms\n", now_ms() - t0);
  ck_assert_int_eq(got, 13 << 20);
  ck_assert_int_eq(stat_num("allocated"), 13 << 20);
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  t0 = now_ms();
  while (now_ms() - t0 < 20000 && (got = client_num(pid_a, "allocated")) != (3 << 20)) usleep(10000);
  ck_assert_int_eq(got, 3 << 20);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A lease the lake cannot serve fails, after the bounded wait, with what was
 * asked and who holds the lake (pid, name, leased, allocated, cached). */
START_TEST(test_full_lake_message) {
  start_daemon("--limit 16MiB --prefetch 0 --lease-wait 300");
  proc a = client_start(), b = client_start();
  int pid_a = client_ready(&a), pid_b = client_ready(&b);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 16 << 20), "ok 0"); /* all of it, allocated: nothing to reclaim */
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  double t0 = now_ms();
  const char *r = client_cmd(&b, "alloc %d", 4 << 20);
  double dt = now_ms() - t0;
  ck_assert_msg(!strncmp(r, "err -1 ", 7), "B got '%s'", r);
  char want[160];
  snprintf(want, sizeof want, "held by: pid %d (gml-testclient) leased 16.00 MiB allocated 16.00 MiB cached 0 B",
           pid_a);
  ck_assert_msg(strstr(r, want), "no lake-wide picture in '%s'", r);
  snprintf(want, sizeof want, "pid %d (gml-testclient, the asker)", pid_b);
  ck_assert_msg(strstr(r, want), "asker not named in '%s'", r);
  ck_assert_msg(strstr(r, "asked 4.00 MiB"), "'%s'", r);
  ck_assert_msg(dt < 2000, "refused after %.0f ms", dt); /* nobody to ask: at once, not after the wait */
  printf("  full lake: refused in %.1f ms: %s\n", dt, r + 7);
  /* with idle cache somewhere that does not come back in time: refused after --lease-wait */
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Pause keeps every byte at the same addresses, and the paused chunks serve
 * another client meanwhile; gmlakectl clients shows the paused bytes. */
START_TEST(test_pause_resume_across_clients) {
  start_daemon("--limit 32MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  int pid_a = client_ready(&a);
  client_ready(&b);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 4 << 20), "ok 0"); /* untagged: stays */
  ck_assert_str_eq(client_cmd(&a, "settag 5"), "ok");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 10 << 20), "ok 1");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 6 << 20), "ok 2");
  ck_assert_str_eq(client_cmd(&a, "settag 0"), "ok");
  char addr1[64], addr2[64];
  for (int i = 0; i < 3; i++) ck_assert_str_eq(client_cmd(&a, "tag %d %d", i, 11 + i), "ok");
  snprintf(addr1, sizeof addr1, "%s", client_cmd(&a, "addr 1"));
  snprintf(addr2, sizeof addr2, "%s", client_cmd(&a, "addr 2"));
  ck_assert_str_eq(client_cmd(&a, "pause 0 5"), "ok");
  ck_assert_int_eq(client_num(pid_a, "paused"), 16 << 20);
  ck_assert_int_eq(client_num(pid_a, "paused_saved"), 16 << 20);
  ck_assert_int_eq(client_num(pid_a, "leased_bytes"), 4 << 20);
  char out[4096];
  ck_assert_int_eq(ctl(out, sizeof out, "clients"), 0);
  ck_assert_msg(strstr(out, "paused 16.00 MiB (saved 16.00 MiB)"), "gmlakectl clients: %s", out);
  /* B takes what A paused: 28 MiB of a 32 MiB lake where A holds 4 */
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 28 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&b, "tag 0 99"), "ok");
  ck_assert_str_eq(client_cmd(&a, "readtags 0"), "tags 11000 11001"); /* untagged block untouched */
  ck_assert_str_eq(client_cmd(&b, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(&b, "trim"), "ok 29360128");
  ck_assert_str_eq(client_cmd(&a, "resume"), "ok");
  ck_assert_str_eq(client_cmd(&a, "addr 1"), addr1);
  ck_assert_str_eq(client_cmd(&a, "addr 2"), addr2);
  ck_assert_str_eq(client_cmd(&a, "readtags 1"), "tags 12000 12001 12002 12003 12004");
  ck_assert_str_eq(client_cmd(&a, "readtags 2"), "tags 13000 13001 13002");
  ck_assert_str_eq(client_cmd(&a, "readtags 0"), "tags 11000 11001");
  ck_assert_int_eq(client_num(pid_a, "paused"), 0);
  /* to a file, then discard */
  char cmd[160];
  snprintf(cmd, sizeof cmd, "pause 2 0 %s/pause.bin", tmpdir);
  ck_assert_str_eq(client_cmd(&a, "%s", cmd), "ok");
  ck_assert_int_eq(client_num(pid_a, "leased_bytes"), 0);
  ck_assert_str_eq(client_cmd(&a, "resume"), "ok");
  ck_assert_str_eq(client_cmd(&a, "readtags 1"), "tags 12000 12001 12002 12003 12004");
  ck_assert_str_eq(client_cmd(&a, "pause 1 0"), "ok");
  ck_assert_int_eq(client_num(pid_a, "paused_saved"), 0);
  ck_assert_str_eq(client_cmd(&a, "resume"), "ok");
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* The idle-hog case of the GPU (A caches 40 GiB and idles, B asks 40 GiB of
 * a 60 GiB lake), scaled down, with B's library spending a driver's import
 * time per chunk (400 us, the host backend's test cost), but A allocated
 * just before B asks (it is not idle to the daemon: a client that allocates
 * is not drained before the lake creates): B's allocation is one streamed
 * lease; the daemon asks A at once, in one request, for what creating new
 * chunks cannot cover, and A gives exactly that; B imports a reply's chunks
 * while the next ones come, so its time is the imports' and little else.
 * test_idle_hog_from_idle_cache is the same with A idle. */
START_TEST(test_idle_hog_streamed) {
  start_daemon("--limit 640MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  int pid_a = client_ready(&a);
  client_ready(&b);
  cache_and_report(&a, 512 << 20);
  ck_assert_str_eq(client_cmd(&a, "alloc 4096"), "ok 0"); /* A allocates (from its cache) and says so */
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  ck_assert_str_eq(client_cmd(&b, "cost 400 0 0"), "ok");
  double t0 = now_ms();
  const char *r = client_cmd(&b, "alloc %d", 512 << 20); /* 256 chunks: 64 new ones under the limit, 192 of A's */
  double dt = now_ms() - t0;
  ck_assert_msg(!strcmp(r, "ok 0"), "B got '%s'", r);
  lease_timing t = timing_of(&b);
  ck_assert_uint_eq(t.maps, 256); /* each slot mapped once, nothing mapped again */
  ck_assert_uint_eq(t.unmaps, 0);
  printf("  idle hog, 256 chunks at 400 us an import: B served in %.1f ms: waited for the daemon %.1f ms, imported "
         "%.1f ms, "
         "mapped %.1f ms (%llu request(s), %llu chunks streamed)\n",
         dt, t.wait_us / 1e3, t.import_us / 1e3, (t.map_us - t.wait_us - t.import_us) / 1e3, t.calls, t.streamed);
  ck_assert_uint_eq(t.calls, 1);
  ck_assert_uint_eq(t.streamed, 256);
  ck_assert_uint_ge(t.import_us, 256 * 400);
  /* The daemon's work (A's reclaim, creating 64 chunks) hides behind B's
   * imports: B waits less for replies than it spends importing. Not a
   * tighter ratio: on CI's 2 cores the daemon, A and B's spinning imports
   * share the CPUs (29 ms of waits beside 52 ms of imports there at 200 us an
   * import), and an unstreamed lease would wait for all 256 replies first. */
  ck_assert_msg(t.wait_us < t.import_us, "B waited %llu us for replies beside %llu us of imports", t.wait_us,
                t.import_us);
  /* one reclaim request, for exactly what creating could not cover; A keeps the rest */
  char out[256];
  sh(out, sizeof out, "grep -c 'asked client' %s/daemon.log", tmpdir);
  ck_assert_int_eq(atoi(out), 1);
  sh(out, sizeof out, "grep -c 'for %d bytes of idle cache' %s/daemon.log", 192 * (2 << 20), tmpdir);
  ck_assert_int_eq(atoi(out), 1);
  ck_assert_int_eq(client_num(pid_a, "leased_bytes"), 64 << 21);
  ck_assert_int_eq(stat_num("chunks_total"), 320);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A caches 256 chunks and idles for over a second (the daemon's
 * BROKER_IDLE_MS): it alone is asked, for all 256, and the daemon creates
 * nothing for B, though the limit allows 64 more (before: 64 created and
 * 192 asked of A, as in test_idle_hog_streamed: on the H100 the creators'
 * driver calls beside B's imports took B from 0.69-0.79 s to 1.32-1.40 s
 * for 40 GiB). */
START_TEST(test_idle_hog_from_idle_cache) {
  start_daemon("--limit 640MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  int pid_a = client_ready(&a);
  client_ready(&b);
  cache_and_report(&a, 512 << 20);
  /* A idles past BROKER_IDLE_MS (1 s) since its last allocation: a time the daemon defines, counted from
   * its report (handled before cache_and_report returns), so at least 1.2 s however slow the machine */
  msleep(1200);
  ck_assert_int_eq(stat_num("chunks_total"), 256);
  ck_assert_str_eq(client_cmd(&b, "cost 400 0 0"), "ok");
  double t0 = now_ms();
  const char *r = client_cmd(&b, "alloc %d", 512 << 20);
  double dt = now_ms() - t0;
  ck_assert_msg(!strcmp(r, "ok 0"), "B got '%s'", r);
  lease_timing t = timing_of(&b);
  printf("  idle hog, A idle: B served in %.1f ms from A's cache alone (waited for the daemon %.1f ms, imported %.1f "
         "ms)\n",
         dt, t.wait_us / 1e3, t.import_us / 1e3);
  ck_assert_uint_eq(t.calls, 1);
  ck_assert_uint_eq(t.streamed, 256);
  ck_assert_msg(t.wait_us < t.import_us, "B waited %llu us for replies beside %llu us of imports", t.wait_us,
                t.import_us);
  /* one request to A, for all of it; no chunk created: the lake holds A's 256, now B's */
  char out[256];
  sh(out, sizeof out, "grep -c 'asked client' %s/daemon.log", tmpdir);
  ck_assert_int_eq(atoi(out), 1);
  sh(out, sizeof out, "grep -c 'for %d bytes of idle cache' %s/daemon.log", 256 * (2 << 20), tmpdir);
  ck_assert_int_eq(atoi(out), 1);
  sh(out, sizeof out, "grep -c 'no chunk created for it' %s/daemon.log", tmpdir);
  ck_assert_int_eq(atoi(out), 1);
  ck_assert_int_eq(client_num(pid_a, "leased_bytes"), 0);
  ck_assert_int_eq(stat_num("chunks_total"), 256);
  ck_assert_int_eq(stat_num("chunks_leased"), 256);
  ck_assert_int_eq(stat_num("chunks_creating"), 0);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* An operator's `gmlakectl trim --client PID` asks that client for its idle
 * cache too, and the client counts every request it serves: the broker must
 * count that request as sent. Before, it did not: the client's answered count
 * ran one ahead of the broker's sent count for ever, so a later lease that
 * asked it took "every client asked has answered" as true at once, went on
 * as answered short and created chunks (here 64 beside what it asked of A).
 * restart: the same after a daemon restart: the library counted the reclaim
 * requests it served over its whole life, the new daemon's session from 0,
 * so a client that had served one was "answered" the moment the new daemon
 * asked it (found by an attacker trial). The counters are per connection now. */
static void idle_hog_after_operator_trim(int restart) {
  start_daemon("--limit 640MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  int pid_a = client_ready(&a);
  client_ready(&b);
  cache_and_report(&a, 64 << 20);
  char out[4096], arg[64];
  snprintf(arg, sizeof arg, "trim --client %d", pid_a);
  ck_assert_int_eq(ctl(out, sizeof out, arg), 0);
  long long leased = -1;
  for (int i = 0; i < 1000 && (leased = client_num(pid_a, "leased_bytes")) != 0; i++) usleep(20000);
  ck_assert_int_eq(leased, 0); /* A served the operator's request */
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 512 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  if (restart) {
    kill(daemon_pid, SIGKILL);
    waitpid(daemon_pid, NULL, 0);
    launch_daemon();
    ck_assert_int_eq(stat_wait("clients", 2, 20000), 2);
  }
  ck_assert_int_eq(stat_wait("cached", 512 << 20, 20000), 512 << 20); /* after a restart: A's cache handed over */
  msleep(
      1200); /* A idles past BROKER_IDLE_MS (1 s, a time the daemon defines), counted from its report handled above */
  int total = (int)stat_num("chunks_total");
  const char *r = client_cmd(&b, "alloc %d", 512 << 20);
  ck_assert_msg(!strcmp(r, "ok 0"), "B got '%s'", r);
  if (!restart) {
    sh(out, sizeof out, "grep -c 'no chunk created for it' %s/daemon.log", tmpdir);
    ck_assert_int_eq(atoi(out), 1);
  }
  sh(out, sizeof out, "grep -c 'answered short' %s/daemon.log", tmpdir);
  ck_assert_msg(atoi(out) == 0, "the lease went on as answered short: %s", out);
  ck_assert_int_eq(stat_num("chunks_total"), total); /* nothing created for B */
  if (!restart) ck_assert_int_eq(client_num(pid_a, "leased_bytes"), 0);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}

START_TEST(test_idle_hog_after_operator_trim) { idle_hog_after_operator_trim(0); }
END_TEST

START_TEST(test_idle_hog_after_restart) { idle_hog_after_operator_trim(1); }
END_TEST

/* The idle client asked does not answer (stopped): B is not held for it
 * past BROKER_IDLE_STALL_MS (0.5 s): the daemon creates what the limit
 * allows, and B gets all of it well within the lease wait. A running again
 * within the request's validity (twice the lease wait) serves it: its
 * chunks go back free. Stopped longer (long_stop), the lease is long over
 * when A reads the request: A answers it and keeps its cache (before, it
 * gave its 512 MiB back whenever it ran again, for a lease served long ago). */
static void idle_hog_stopped(int long_stop) {
  start_daemon(long_stop ? "--limit 1024MiB --prefetch 0 --lease-wait 1000" : "--limit 1024MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  int pid_a = client_ready(&a);
  client_ready(&b);
  cache_and_report(&a, 512 << 20);
  msleep(
      1200); /* A idles past BROKER_IDLE_MS (1 s, a time the daemon defines), counted from its report handled above */
  stop_child(pid_a);
  double t0 = now_ms();
  const char *r = client_cmd(&b, "alloc %d", 512 << 20);
  double dt = now_ms() - t0;
  if (long_stop)
    msleep(2500); /* the request is 2.5 s old past its 2 s (twice --lease-wait: a time the daemon defines) */
  kill(pid_a, SIGCONT);
  ck_assert_msg(!strcmp(r, "ok 0"), "B got '%s'", r);
  printf("  idle hog, A stopped: B served in %.1f ms (created after 500 ms without an answer)\n", dt);
  ck_assert_msg(dt >= 450 && dt < 2500, "B served in %.1f ms", dt);
  char out[256];
  sh(out, sizeof out, "grep -c 'gave nothing for a while' %s/daemon.log", tmpdir);
  ck_assert_int_eq(atoi(out), 1);
  ck_assert_int_eq(stat_num("chunks_total"), 512); /* 256 created for B */
  if (long_stop) {
    /* A runs again and has read the request: a reply read after it (its reader takes the daemon's
     * messages in order, and decides whether a reclaim request is moot as it takes it) */
    const char *att = client_cmd(&a, "attach gml-test-no-such-share");
    ck_assert_msg(!strncmp(att, "err ", 4), "an attach of no share: '%s'", att);
    /* Its keeper answers a moot request with a usage report that changes nothing the daemon shows:
     * no event marks that it is done. A keeper that gave the cache back would have begun within
     * this (it starts as soon as the reader hands it the request), so the sleep stays. */
    msleep(500);
    ck_assert_int_eq(stat_num("chunks_free"), 0);
    ck_assert_int_eq(client_num(pid_a, "leased_bytes"), 512 << 20);
    ck_assert_int_eq(client_num(pid_a, "cached"), 512 << 20);
    ck_assert_str_eq(client_cmd(&a, "alloc %d", 512 << 20), "ok 0"); /* from its cache: the lake is at its limit */
  } else {
    /* A, running again, serves the request it got: its chunks go back free */
    ck_assert_int_eq(stat_wait("chunks_free", 256, 20000), 256);
    ck_assert_int_eq(client_num(pid_a, "leased_bytes"), 0);
  }
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}

START_TEST(test_idle_hog_stopped) { idle_hog_stopped(0); }
END_TEST

START_TEST(test_idle_hog_stopped_past_lease) { idle_hog_stopped(1); }
END_TEST

/* GMLAKE_STREAM_MAP=1: the library's reader imports each reply's chunks and
 * the allocating thread maps them meanwhile. The allocation is the same:
 * every chunk-sized piece is its own chunk (a tag written to each reads
 * back), one request, nothing left leased after. */
START_TEST(test_idle_hog_stream_map) {
  start_daemon("--limit 640MiB --prefetch 0");
  proc a = client_start(), b = client_start_env("GMLAKE_STREAM_MAP=1");
  client_ready(&a);
  client_ready(&b);
  cache_and_report(&a, 512 << 20);
  /* set-access cheap beside an import: the allocating thread, done mapping a
   * batch, waits for the reader's next imports most of the time (a wide
   * margin for the check below on a loaded 2-core CI box) */
  ck_assert_str_eq(client_cmd(&b, "cost 100 0 10"), "ok");
  double t0 = now_ms();
  const char *r = client_cmd(&b, "alloc %d", 512 << 20);
  double dt = now_ms() - t0;
  ck_assert_msg(!strcmp(r, "ok 0"), "B got '%s'", r);
  lease_timing t = timing_of(&b);
  ck_assert_uint_eq(t.maps, 256); /* each slot mapped once, nothing mapped again */
  ck_assert_uint_eq(t.unmaps, 0);
  printf("  idle hog, mapped as it comes (GMLAKE_STREAM_MAP=1; 100 us an import, 10 us a set-access): %.1f ms; imports "
         "%.1f ms "
         "on the reader, map + set-access %.1f ms, the allocating thread waited %.1f ms\n",
         dt, t.import_us / 1e3, (t.mapcall_us + t.access_us) / 1e3, t.wait_us / 1e3);
  ck_assert_uint_eq(t.calls, 1);
  ck_assert_uint_eq(t.streamed, 256);
  ck_assert_uint_ge(t.import_us, 256 * 100);
  ck_assert_uint_ge(t.access_us, 256 * 10);
  /* the imports were the reader's: the allocating thread waited for them */
  ck_assert_msg(t.wait_us * 2 >= t.import_us, "waited %llu us beside %llu us of imports on the reader", t.wait_us,
                t.import_us);
  ck_assert_str_eq(client_cmd(&b, "tag 0 7"), "ok");
  char want[4096] = "tags";
  for (int k = 0; k < 256; k++) snprintf(want + strlen(want), sizeof want - strlen(want), " %d", 7000 + k);
  ck_assert_str_eq(client_cmd(&b, "readtags 0"), want);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A lease that fails because the daemon is gone says so in gml_last_error,
 * not in an earlier failure's words (before: after a quota refusal, every
 * later GML_EDAEMON still read "quota of 4.00 MiB reached").*/
START_TEST(test_error_after_daemon_gone) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start_env("GMLAKE_RECONNECT=0");
  client_ready(&a);
  char args[64], out[4096];
  snprintf(args, sizeof args, "quota uid:%u 4MiB", (unsigned)getuid());
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  const char *r = client_cmd(&a, "alloc %d", 8 << 20);
  ck_assert_msg(!strncmp(r, "err -8 ", 7) && strstr(r, "quota"), "a lease past the quota: '%s'", r);
  kill(daemon_pid, SIGKILL);
  int st;
  waitpid(daemon_pid, &st, 0);
  r = client_cmd(&a, "alloc %d", 8 << 20);
  ck_assert_msg(!strncmp(r, "err -2 ", 7), "expected GML_EDAEMON, got '%s'", r);
  ck_assert_msg(!strstr(r, "quota") && strstr(r, "daemon is gone"), "not why it failed now: '%s'", r);
  ck_assert_int_eq(client_finish(&a), 0);
  launch_daemon();
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A daemon that stops answering (SIGSTOP, a debugger, a frozen container)
 * while a lease is in flight: the lease fails with GML_EDAEMON after the
 * reply timeout (1 s here, 30 s by default), the client goes on on what it
 * holds and is back once the daemon runs again. Before, gml_alloc waited for
 * ever (for as long as the daemon was stopped), holding the allocator's lock. */
static const char *answer_within(proc *p, int ms) {
  struct pollfd pf = {.fd = fileno(p->out), .events = POLLIN};
  static char line[4096];
  if (poll(&pf, 1, ms) != 1 || !fgets(line, sizeof line, p->out)) return NULL;
  line[strcspn(line, "\n")] = 0;
  return line;
}

START_TEST(test_stopped_daemon_lease_times_out) {
  start_daemon("--limit 64MiB --prefetch 0 --lease-wait 500"); /* the client waits 1 s + 0.5 s (its lease-wait) */
  proc a = client_start();
  client_ready(&a);
  client_cmd(&a, "replytimeout 1000");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 4 << 20), "ok 0");
  stop_child(daemon_pid);
  uint64_t t0 = gmli_now_ns();
  fprintf(a.in, "alloc %d\n", 8 << 20);
  fflush(a.in);
  const char *r = answer_within(&a, 8000);
  double s = (double)(gmli_now_ns() - t0) / 1e9;
  if (!r) kill(daemon_pid, SIGCONT); /* the old code answers once the daemon runs: the check's timeout otherwise */
  ck_assert_msg(r, "a lease to a stopped daemon got no answer in 8 s");
  ck_assert_msg(!strncmp(r, "err -2 ", 7) && strstr(r, "daemon is gone"), "expected GML_EDAEMON, got '%s'", r);
  ck_assert_msg(s < 4, "the lease failed only after %.1f s", s);
  r = client_cmd(&a, "alloc %d", 8 << 20); /* at once while it is away */
  ck_assert_msg(!strncmp(r, "err -2 ", 7), "expected GML_EDAEMON, got '%s'", r);
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  kill(daemon_pid, SIGCONT);
  int ok = 0;
  for (int i = 0; i < 400 && !ok; i++, msleep(50)) ok = !strncmp(client_cmd(&a, "alloc %d", 8 << 20), "ok", 2);
  ck_assert_msg(ok, "no lease in 20 s after the daemon runs again");
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stat_wait("chunks_leased", 0, 20000), 0); /* what the dropped connection held comes back */
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Lines p writes within ms (read straight from its fd: its FILE may hold
 * none buffered), each counted where it starts with "ok" or not; stops at
 * want lines or when none comes for ms. */
static int answers_within(proc *p, int want, int ms, int *ok, int *err) {
  char buf[4096];
  int n = 0, bol = 1;
  *ok = *err = 0;
  struct pollfd pf = {.fd = fileno(p->out), .events = POLLIN};
  while (n < want && poll(&pf, 1, ms) == 1) {
    ssize_t r = read(pf.fd, buf, sizeof buf);
    if (r <= 0) break;
    for (ssize_t i = 0; i < r; i++) {
      if (bol) *(buf[i] == 'o' ? ok : err) += 1;
      bol = buf[i] == '\n';
      n += bol;
    }
  }
  return n;
}

/* A daemon stopped (SIGSTOP) while the client goes on sending what needs no
 * reply (usage reports: each gml_flush sends one): once the socket's buffer
 * is full, a send fails with GML_EDAEMON after the reply timeout (plus the
 * daemon's lease-wait) and the connection is dropped, as a reply that does
 * not come. Before, the send blocked for as long as the daemon was stopped,
 * holding conn_lock, so every allocator call that leases or reports hung. */
START_TEST(test_stopped_daemon_send_times_out) {
  start_daemon("--limit 64MiB --prefetch 0 --lease-wait 0");
  proc a = client_start();
  client_ready(&a);
  client_cmd(&a, "replytimeout 500");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 4 << 20), "ok 0");
  stop_child(daemon_pid);
  enum { FLUSHES = 4000 }; /* a unix socket's default buffer holds a few hundred reports */
  uint64_t t0 = gmli_now_ns();
  for (int i = 0; i < FLUSHES; i++) fputs("flush\n", a.in);
  fflush(a.in);
  int ok, err, n = answers_within(&a, FLUSHES, 5000, &ok, &err);
  double s = (double)(gmli_now_ns() - t0) / 1e9;
  printf("  %d flushes to a stopped daemon: %d ok, %d failed, in %.1f s\n", n, ok, err, s);
  if (n < FLUSHES)
    kill(daemon_pid, SIGCONT); /* the old code goes on once the daemon runs: the check's timeout otherwise */
  ck_assert_msg(n == FLUSHES, "flush %d of %d got no answer in 5 s: a send to the stopped daemon blocked", n + 1,
                FLUSHES);
  ck_assert_msg(ok > 0 && err > 0,
                "expected the first flushes to pass and the rest to fail (GML_EDAEMON): %d ok, %d failed", ok, err);
  ck_assert_msg(s < 4, "the send failed only after %.1f s", s);
  const char *r = client_cmd(&a, "alloc %d", 8 << 20); /* at once while it is away */
  ck_assert_msg(!strncmp(r, "err -2 ", 7), "expected GML_EDAEMON, got '%s'", r);
  kill(daemon_pid, SIGCONT);
  int back = 0;
  for (int i = 0; i < 400 && !back; i++, msleep(50)) back = !strncmp(client_cmd(&a, "alloc %d", 8 << 20), "ok", 2);
  ck_assert_msg(back, "no lease in 20 s after the daemon runs again");
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stat_wait("chunks_leased", 0, 20000), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* The reply timeout counts the daemon's --lease-wait in (HelloReply.lease_wait_ms): a lease
 * that rightly waits that long for other clients' idle cache (here a stopped holder's, at the
 * limit) gets the daemon's own answer, not a dropped connection. */
START_TEST(test_reply_timeout_past_lease_wait) {
  start_daemon("--limit 8MiB --prefetch 0 --lease-wait 2000");
  proc a = client_start(), b = client_start();
  client_ready(&a);
  client_ready(&b);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 8 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok"); /* 8 MiB idle in a's cache */
  stop_child(a.pid);
  client_cmd(&b, "replytimeout 500");
  uint64_t t0 = gmli_now_ns();
  const char *r = client_cmd(&b, "alloc %d", 4 << 20);
  double s = (double)(gmli_now_ns() - t0) / 1e9;
  kill(a.pid, SIGCONT);
  printf("  a lease waiting on a stopped holder, daemon lease-wait 2 s, reply timeout 0.5 s: '%.60s' in %.1f s\n", r,
         s);
  ck_assert_msg(strncmp(r, "err -2 ", 7), "the connection was dropped before the daemon's lease-wait passed: '%s'", r);
  ck_assert_int_eq(stat_num("clients"), 2); /* b still connected, not reconnecting */
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A uid: quota counts all the user's processes together. */
START_TEST(test_uid_quota_over_two_processes) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  client_ready(&a);
  client_ready(&b);
  char args[64], out[4096];
  snprintf(args, sizeof args, "quota uid:%u 10MiB", (unsigned)getuid());
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 6 << 20), "ok 0");
  const char *r = client_cmd(&b, "alloc %d", 6 << 20); /* 6 + 6 > 10 */
  ck_assert_msg(!strncmp(r, "err -8 ", 7), "expected GML_EQUOTA, got '%s'", r);
  char uidq[32];
  snprintf(uidq, sizeof uidq, "uid %u", (unsigned)getuid());
  ck_assert_msg(strstr(r, uidq), "'%s' does not name the user's quota", r);
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 4 << 20), "ok 0"); /* 6 + 4 = 10 */
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(&a, "trim"), "ok 6291456");
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 6 << 20), "ok 1"); /* what A gave back */
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* N connections of one process share its quota; so do chunks parked by a
 * connection it closed; the cgroup is shown and can carry a quota. */
/* A published share counts in its publisher's quotas while it lives:
 * sharing leased chunks and leasing again, over and over, took the whole
 * lake past a uid quota (20 MiB quota, 512 MiB held). */
START_TEST(test_quota_counts_shares) {
  start_daemon("--limit 64MiB --prefetch 0");
  char args[320], out[8192];
  snprintf(args, sizeof args, "quota uid:%d 12MiB", (int)getuid());
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  proc a = client_start();
  client_ready(&a);
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "grow %d", 16 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&a, "gensure %d", 8 << 20), "ok");
  ck_assert_str_eq(client_cmd(&a, "share hoard %d", 8 << 20), "ok");
  ck_assert_int_eq(stat_num("chunks_shared"), 4);
  const char *r = client_cmd(&a, "alloc %d", 6 << 20); /* 8 shared + 6 > 12 */
  ck_assert_msg(!strncmp(r, "err -8 ", 7) && strstr(r, "quota"), "a lease past the quota, shares uncounted: '%s'", r);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 2 << 20), "ok 0");
  ck_assert_int_eq(client_finish(&a), 0); /* the share ends with its last mapper: the quota is free again */
  ck_assert_int_eq(stat_num("chunks_shared"), 0);
  proc b = client_start();
  client_ready(&b);
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 12 << 20), "ok 0");
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A pid quota is the process's: refused for a pid no process has, dropped
 * when its process exits (the pid, reused, binds nobody: before, a later
 * process of another user with that pid inherited it). */
START_TEST(test_pid_quota_ends_with_process) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start();
  int pid_a = client_ready(&a);
  char args[320], out[8192];
  snprintf(args, sizeof args, "quota %d 10MiB", pid_a);
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  ck_assert_int_eq(client_num(pid_a, "quota_bytes"), 10 << 20);
  ck_assert_int_eq(client_finish(&a), 0);
  char said[128];
  snprintf(said, sizeof said, "process %d exited: its quota of %d bytes is dropped", pid_a, 10 << 20);
  ck_assert_msg(log_wait_in(NULL, said, 1, 20000, NULL, 0) == 1, "no line saying process %d's quota was dropped",
                pid_a);
  /* a pid that no process has: refused, with why */
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, NULL, 0);
  snprintf(args, sizeof args, "quota %d 10MiB 2>&1", (int)dead);
  ck_assert_int_ne(ctl(out, sizeof out, args), 0);
  ck_assert_msg(strstr(out, "no process") && strstr(out, "uid: or cgroup:"), "%s", out);
  snprintf(args, sizeof args, "quota %d 0", (int)dead); /* clearing is always fine */
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A named quota over the control RPC (a job's, as the Slurm plugin and the Kubernetes controller set it):
 * the set line names the lake and the quota, `quotas` lists it with what is held and its peak, a refusal
 * names it, group:NAME changes it and clears it (printing the peak); an unknown name or a bad one is refused. */
START_TEST(test_named_quota_rpc) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start();
  int pid_a = client_ready(&a);
  char args[320], out[8192];
  ck_assert_int_ne(ctl(out, sizeof out, "quota group:no-such-job 0 2>&1"), 0);
  ck_assert_msg(strstr(out, "no quota of that name"), "%s", out);
  snprintf(args, sizeof args, "quota %d 8MiB --group 'job/1' 2>&1", pid_a);
  ck_assert_int_ne(ctl(out, sizeof out, args), 0);
  ck_assert_msg(strstr(out, "bad quota holder") || strstr(out, "bad quota name"), "%s", out);
  ck_assert_int_ne(ctl(out, sizeof out, "trim --group job-1 2>&1"), 0); /* --group is quota's */
  snprintf(args, sizeof args, "quota %d 8MiB --group job-1", pid_a);
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  ck_assert_msg(strstr(out, " on host-0: quota 8.00 MiB, held 0 B, peak 0 B"), "%s", out);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 6 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  ck_assert_msg(!strncmp(client_cmd(&a, "trim"), "ok", 2), "trim"); /* its chunks back: held 0, the peak stays */
  ck_assert_int_eq(ctl(out, sizeof out, "--json quotas"), 0);
  ck_assert_msg(strstr(out, "\"group\":\"job-1\"") && json_num(out, "peak_bytes") == 6 << 20, "%s", out);
  const char *r = client_cmd(&a, "alloc %d", 10 << 20);
  ck_assert_msg(!strncmp(r, "err", 3) && strstr(r, "(job-1 of pid "), "over the quota: %s", r);
  ck_assert_int_eq(ctl(out, sizeof out, "quota group:job-1 16MiB"), 0);
  ck_assert_msg(strstr(out, "quota 16.00 MiB"), "%s", out);
  r = client_cmd(&a, "alloc %d", 10 << 20); /* the new bytes bind */
  ck_assert_msg(!strncmp(r, "ok", 2), "under the new 16 MiB: %s", r);
  ck_assert_int_eq(ctl(out, sizeof out, "quota group:job-1 0"), 0);
  ck_assert_msg(strstr(out, "cleared on host-0: quota 16.00 MiB") && strstr(out, "peak 10.00 MiB"), "%s", out);
  ck_assert_int_eq(ctl(out, sizeof out, "quotas"), 0);
  ck_assert_msg(!strstr(out, "job-1"), "%s", out);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

START_TEST(test_process_quota_over_connections) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start();
  int pid_a = client_ready(&a);
  char args[320], out[8192];
  snprintf(args, sizeof args, "quota %d 10MiB", pid_a);
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 4 << 20), "ok 0");
  /* three more connections of the same process, 2 MiB each: the third is over 10 MiB */
  ck_assert_str_eq(client_cmd(&a, "conns 4 %d", 2 << 20), "conns 0 0 0 -8");
  ck_assert_int_eq(stat_num("chunks_leased"), 5);
  /* the cgroup of the process, from /proc/PID/cgroup (v2) */
  char path[64], line[512], cg[256] = "";
  snprintf(path, sizeof path, "/proc/%d/cgroup", pid_a);
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "0::", 3)) snprintf(cg, sizeof cg, "%.*s", (int)strcspn(line + 3, "\n"), line + 3);
  if (f) fclose(f);
  /* the daemon takes a cgroup quota only where it sees the cgroup2 hierarchy (conn_cgroup_check): in a
   * chroot that mounted /proc but not /sys/fs/cgroup, /proc/PID/cgroup has its v2 line all the same */
  int v2_mounted = sh(line, sizeof line, "grep -q ' - cgroup2 ' /proc/self/mountinfo") == 0;
  if (cg[0] && !v2_mounted)
    test_not_run("test_process_quota_over_connections (cgroup attribution)", "no cgroup2 hierarchy mounted here");
  ck_assert_int_eq(ctl(out, sizeof out, "clients --json"), 0);
  if (cg[0] && v2_mounted) {
    char want[300];
    snprintf(want, sizeof want, "\"cgroup\":\"%s\"", cg);
    ck_assert_msg(strstr(out, want), "%s not in %s", want, out);
    /* a cgroup quota binds the process too (the pid quota gone) */
    snprintf(args, sizeof args, "quota %d 0", pid_a);
    ck_assert_int_eq(ctl(out, sizeof out, args), 0);
    snprintf(args, sizeof args, "quota cgroup:%s 12MiB", cg);
    ck_assert_int_eq(ctl(out, sizeof out, args), 0);
    ck_assert_str_eq(client_cmd(&a, "alloc %d", 2 << 20), "ok 1");
    const char *r = client_cmd(&a, "alloc %d", 2 << 20);
    ck_assert_msg(!strncmp(r, "err -8 ", 7) && strstr(r, "cgroup"), "expected the cgroup's GML_EQUOTA, got '%s'", r);
  } else if (!cg[0]) {
    test_not_run("test_process_quota_over_connections (cgroup attribution)", "no cgroup v2 line in /proc/self/cgroup");
  }
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* The daemon SIGKILLed and started again while two clients hold and use
 * memory: both go on (from what they hold; a lease fails meanwhile), hand
 * their chunks to the new daemon, lease again; the lake's numbers add up. */
START_TEST(test_daemon_restart_keeps_memory) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  int pid_a = client_ready(&a), pid_b = client_ready(&b);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 10 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "tag 0 21"), "ok");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 4 << 20), "ok 1");
  ck_assert_str_eq(client_cmd(&a, "free 1"), "ok"); /* 4 MiB cached */
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 6 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&b, "tag 0 22"), "ok");
  ck_assert_int_eq(stat_num("chunks_leased"), 10);
  kill(daemon_pid, SIGKILL);
  int st;
  waitpid(daemon_pid, &st, 0);
  /* no daemon: what they hold still works, the cache serves, a lease fails */
  ck_assert_str_eq(client_cmd(&a, "readtags 0"), "tags 21000 21001 21002 21003 21004");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 4 << 20), "ok 1");
  const char *r = client_cmd(&b, "alloc %d", 8 << 20);
  ck_assert_msg(!strncmp(r, "err ", 4), "a lease without a daemon: '%s'", r);
  double t0 = now_ms();
  launch_daemon();
  /* both reconnect and hand their 7 + 3 chunks over */
  ck_assert_int_eq(stat_wait("chunks_leased", 10, 4000), 10);
  printf("  daemon SIGKILLed and restarted: both clients' 10 chunks adopted %.0f ms after the restart began\n",
         now_ms() - t0);
  ck_assert_int_eq(stat_num("clients"), 2);
  ck_assert_int_eq(stat_num("chunks_total"), 10); /* no chunk twice, none lost */
  ck_assert_int_eq(stat_num("chunks_free"), 0);
  ck_assert_int_eq(client_num(pid_a, "uncounted"), 0); /* adopted: all counted */
  ck_assert_int_eq(client_num(pid_b, "uncounted"), 0);
  ck_assert_int_eq(stat_num("uncounted"), 0);
  /* they lease again and their bytes are where they were */
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 8 << 20), "ok 1");
  ck_assert_str_eq(client_cmd(&b, "tag 1 23"), "ok");
  ck_assert_int_eq(stat_num("chunks_leased"), 14);
  ck_assert_str_eq(client_cmd(&a, "readtags 0"), "tags 21000 21001 21002 21003 21004");
  ck_assert_str_eq(client_cmd(&b, "readtags 0"), "tags 22000 22001 22002");
  /* chunks go back under their new ids */
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(&a, "trim"), "ok 10485760");
  ck_assert_int_eq(stat_num("chunks_leased"), 9);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stat_num("protocol_errors"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A hand-over after a restart may take the lake past its limit (here 8 MiB the restarted daemon
 * preallocates, then the 8 MiB a client held): the free chunks past it are released, and the line
 * that says so gives the hand-over as the reason (a limit set below what the lake held says that
 * instead: test_limit_below_held_said). */
START_TEST(test_over_limit_after_restart_said) {
  char conf[] = "/tmp/gmlake-test-conf.XXXXXX", args[128], out[1024] = "";
  int cfd = mkstemp(conf);
  ck_assert_int_ge(cfd, 0);
  ck_assert_int_eq(write(cfd, "limit = 64MiB\n", 14), 14);
  close(cfd);
  snprintf(args, sizeof args, "--prefetch 0 --config %s", conf);
  start_daemon(args);
  proc a = client_start();
  client_ready(&a);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 8 << 20), "ok 0");
  kill(daemon_pid, SIGKILL);
  waitpid(daemon_pid, NULL, 0);
  FILE *f = fopen(conf, "w");
  fprintf(f, "limit = 8MiB\npreallocate = 8MiB\n");
  fclose(f);
  launch_daemon();
  ck_assert_int_eq(stat_wait("chunks_leased", 4, 20000), 4);
  ck_assert_int_eq(stat_wait("chunks_total", 4, 20000), 4); /* the preallocated ones released */
  log_wait_in(NULL, "past its limit", 1, 20000, out, sizeof out);
  ck_assert_msg(strstr(out, "free chunk(s) the lake held past its limit (handed over after the restart)"), "'%s'", out);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
  unlink(conf);
}
END_TEST

/* Two users' hand-overs keep the lake over its limit after a restart; a reload that leaves the limit
 * as it was is not the reason then (a tryout: the release line said "the limit was set below what it
 * held, by SIGHUP", though no limit was lowered). */
START_TEST(test_over_limit_reason_kept_by_reload) {
  if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
    test_skip("test_over_limit_reason_kept_by_reload", "needs root and setpriv");
    return;
  }
  char conf[] = "/tmp/gmlake-test-conf.XXXXXX", args[128], out[1024] = "";
  int cfd = mkstemp(conf);
  ck_assert_int_ge(cfd, 0);
  ck_assert_int_eq(write(cfd, "limit = 64MiB\n", 14), 14);
  close(cfd);
  chmod(conf, 0644);
  snprintf(args, sizeof args, "--prefetch 0 --socket-mode 0666 --config %s", conf);
  start_daemon(args);
  ck_assert_int_eq(chmod(tmpdir, 0711), 0);
  proc a = client_start();
  client_ready(&a);
  proc n;
  if (!client_start_nobody(&n, "test_over_limit_reason_kept_by_reload")) {
    client_finish(&a), stop_daemon(), unlink(conf);
    return;
  }
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 8 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&n, "alloc %d", 8 << 20), "ok 0");
  kill(daemon_pid, SIGKILL);
  waitpid(daemon_pid, NULL, 0);
  FILE *f = fopen(conf, "w");
  fprintf(f, "limit = 8MiB\n");
  fclose(f);
  launch_daemon();
  ck_assert_int_eq(stat_wait("chunks_leased", 8, 20000), 8); /* twice the limit, each user its limit */
  kill(daemon_pid, SIGHUP);
  ck_assert_msg(log_wait("SIGHUP: reloaded", 20000), "no reload logged");
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "trim"), " "), "ok");
  ck_assert_int_eq(stat_wait("chunks_total", 4, 20000), 4);
  log_wait_in(NULL, "past its limit", 1, 20000, out, sizeof out);
  ck_assert_msg(strstr(out, "past its limit (handed over after the restart)"), "after a reload of the same limit: '%s'",
                out);
  ck_assert_int_eq(client_finish(&n), 0);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
  unlink(conf);
}
END_TEST

/* One connection to a fake daemon listening on lfd (5 s at most for it),
 * answered as how says: 'r' refuses it as a full daemon does (an Error of
 * seq 0 before the close: max-clients), 'e' answers the hello with an Error
 * of its seq, 'c' with a HelloReply of another chunk size. */
static void fake_daemon_answer(int lfd, char how) {
  struct pollfd pf = {.fd = lfd, .events = POLLIN};
  ck_assert_int_eq(poll(&pf, 1, 5000), 1);
  int s = accept(lfd, NULL, NULL);
  ck_assert_int_ge(s, 0);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT, *in = NULL;
  Gmlake__Error e = GMLAKE__ERROR__INIT;
  Gmlake__HelloReply hr = GMLAKE__HELLO_REPLY__INIT;
  int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
  if (how != 'r') {
    ck_assert_int_eq(gmli_wire_recv(s, &in, fds, &nfds, GML_MAX_LEASE_CHUNKS), 0);
    ck_assert_int_eq(in->msg_case, GMLAKE__ENVELOPE__MSG_HELLO);
    ck_assert(in->hello->adopting);
    env.seq = in->seq;
  }
  if (how == 'c') {
    hr.protocol_version = GML_PROTOCOL_VERSION, hr.chunk_size = 4 << 20, hr.backend = "host";
    env.msg_case = GMLAKE__ENVELOPE__MSG_HELLO_REPLY, env.hello_reply = &hr;
  } else {
    e.code = how == 'r' ? GML_EDAEMON : GML_EPROTO;
    e.message =
        how == 'r' ? "too many connections (max-clients)" : "protocol version 1 not supported (daemon speaks 9)";
    env.msg_case = GMLAKE__ENVELOPE__MSG_ERROR, env.error = &e;
  }
  ck_assert_int_eq(send_env(s, &env, NULL, 0), 0);
  if (in) gmlake__envelope__free_unpacked(in, NULL);
  close(s);
}

/* The reconnection tests' start: a client whose stderr (its log) goes to
 * logpath holds 2 chunks, then its daemon is SIGKILLed and its socket gone. */
static proc client_then_daemon_killed(char *logpath, size_t len) {
  start_daemon("--limit 16MiB --prefetch 0");
  snprintf(logpath, len, "%s/client.log", tmpdir);
  int err = dup(2), lf = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ck_assert_int_ge(lf, 0);
  dup2(lf, 2); /* the client's stderr, its log */
  proc a = client_start();
  dup2(err, 2);
  close(err), close(lf);
  client_ready(&a);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 4 << 20), "ok 0");
  kill(daemon_pid, SIGKILL);
  waitpid(daemon_pid, NULL, 0);
  unlink(sock_path);
  return a;
}

/* A listener at the dead daemon's socket path, the file given to uid owner (-1: root's). */
static int listen_at_socket(int owner) {
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
  ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  if (owner >= 0) ck_assert_int_eq(chown(sock_path, (uid_t)owner, (gid_t)owner), 0);
  ck_assert_int_eq(listen(lfd, 4), 0);
  return lfd;
}

/* The listener gone, the real daemon back: the client reconnects and hands its 2 chunks over. */
static void real_daemon_back(int lfd) {
  close(lfd);
  unlink(sock_path);
  launch_daemon();
  ck_assert_int_eq(stat_wait("chunks_leased", 2, 4000), 2);
}

static void read_log(const char *path, char *said, size_t len) {
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  said[fread(said, 1, len - 1, f)] = 0;
  fclose(f);
}

/* The lake gives memory back (issue 27): a daemon whose last client left holds
 * no more than its reserve once --idle-release passed (30 s after its last
 * client exited one held 2.25 GiB until gmlakectl trim); a lease makes it
 * grow again. */
START_TEST(test_idle_lake_gives_back) {
  start_daemon("--limit 64MiB --prefetch 8MiB --idle-release 1 --idle-reserve 4MiB");
  proc a = client_start();
  client_ready(&a);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 32 << 20), "ok 0");
  ck_assert_int_ge(stat_num("chunks_total"), 16);
  ck_assert_int_eq(client_finish(&a), 0);
  /* 16 chunks back and the prefetch's 4: all but the reserve's 2 go */
  ck_assert_int_eq(stat_wait("chunks_total", 2, 20000), 2);
  ck_assert_int_eq(stat_num("chunks_free"), 2);
  ck_assert_int_ge(stat_num("chunks_released_idle"), 18);
  char out[4096];
  ck_assert_int_eq(sh(out, sizeof out,
                      "grep -c 'to the driver: nothing leased or given back for 1 s (--idle-release)' %s/daemon.log",
                      tmpdir),
                   0);
  proc b = client_start();
  client_ready(&b);
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 8 << 20), "ok 0"); /* the lake grows again */
  ck_assert_int_ge(stat_num("chunks_total"), 4);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A reconnection whose hello fails says why: refused as the daemon was full,
 * the hello answered by an error, a daemon of another chunk size. Before, a
 * refusal said nothing at all (its error frame, of seq 0, was dropped while
 * waiting for the hello's reply) and an error answer was logged as "not the
 * one we held chunks of (no hello reply): not reconnecting" (it was, there
 * was a reply, and it tried again); the real daemon back, it reconnects. */
START_TEST(test_reconnect_failure_says_why) {
  char logpath[128], said[16384] = "";
  proc a = client_then_daemon_killed(logpath, sizeof logpath);
  int lfd = listen_at_socket(-1);
  fake_daemon_answer(lfd, 'r');
  fake_daemon_answer(lfd, 'e');
  fake_daemon_answer(lfd, 'c');
  real_daemon_back(lfd);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 2 << 20), "ok 1");
  ck_assert_int_eq(client_finish(&a), 0);
  read_log(logpath, said, sizeof said);
  ck_assert_msg(strstr(said, "refused the connection: too many connections (max-clients)"), "%s", said);
  ck_assert_msg(strstr(said, "refused our hello: protocol version 1 not supported (daemon speaks 9)"), "%s", said);
  ck_assert_msg(strstr(said, "it serves host chunks of 4.00 MiB, we hold host chunks of 2.00 MiB"), "%s", said);
  ck_assert_msg(!strstr(said, "no hello reply") && !strstr(said, "not reconnecting"), "%s", said);
  for (char *line = strtok(said, "\n"); line; line = strtok(NULL, "\n"))
    if (strstr(line, "reconnecting to the daemon")) printf("  %s\n", strstr(line, "reconnecting"));
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* After a restart the client hands every chunk's fd to whoever serves the
 * socket's path: it must check that socket as at its first connection
 * (discover.c). Before, a plain connect: a socket of another user at the path
 * (here one owned by nobody) got the hello, and would have got the fds. */
START_TEST(test_reconnect_checks_the_socket) {
  char logpath[128], said[16384] = "";
  proc a = client_then_daemon_killed(logpath, sizeof logpath);
  int lfd = listen_at_socket(65534); /* another user's socket */
  struct pollfd pf = {.fd = lfd, .events = POLLIN};
  ck_assert_msg(poll(&pf, 1, 3000) == 0, "the client connected to a socket of uid 65534"); /* it retries every second */
  real_daemon_back(lfd);
  ck_assert_int_eq(client_finish(&a), 0);
  read_log(logpath, said, sizeof said);
  ck_assert_msg(strstr(said, "not trusted"), "%s", said);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Free memory as the lake sees it (gml_mem_info): two processes that start at
 * once and each allocate 90% of what it says is free both succeed, and
 * together stay within the lake's limit (the daemon holds an answer as a
 * promise until its client leased, and the other waits for it). */
START_TEST(test_mem_info_two_at_once) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  client_ready(&a);
  client_ready(&b);
  unsigned long long fr = 0, to = 0;
  const char *r = client_cmd(&a, "meminfo");
  ck_assert_msg(sscanf(r, "meminfo %llu %llu", &fr, &to) == 2, "A said '%s'", r);
  ck_assert_uint_eq(to, 64ull << 20); /* the lake's limit, not the host's memory */
  ck_assert_uint_eq(fr, 64ull << 20);
  /* both asked at once: each line is written before either reply is read */
  fprintf(a.in, "takefree 90\n"), fflush(a.in);
  fprintf(b.in, "takefree 90\n"), fflush(b.in);
  unsigned long long got[2] = {0, 0}, seen[2] = {0, 0};
  proc *p[2] = {&a, &b};
  for (int i = 0; i < 2; i++) {
    r = client_first_line(p[i]);
    ck_assert_msg(sscanf(r, "ok 0 %llu %llu", &got[i], &seen[i]) == 2, "client %c said '%s'", 'A' + i, r);
  }
  printf("  mem_info at once: A was told %llu MiB free and took %llu; B %llu and %llu (lake 64 MiB)\n", seen[0] >> 20,
         got[0] >> 20, seen[1] >> 20, got[1] >> 20);
  /* the one that asked second was told what the first left: the same chunks were not counted twice */
  unsigned long long cs = 2 << 20, held0 = (got[0] + cs - 1) / cs * cs, held1 = (got[1] + cs - 1) / cs * cs;
  ck_assert_msg(seen[1] + held0 <= 64ull << 20 || seen[0] + held1 <= 64ull << 20, "both were told the same memory");
  ck_assert_uint_le(held0 + held1, 64ull << 20);
  ck_assert_uint_le(stat_num("chunks_leased") * (2 << 20), 64ll << 20);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* The promise, in a set order: A is told, B asks before A allocates; B's
 * answer comes once A leased, and leaves A's allocation out. Without the
 * promise B hears the whole lake free (and the two over-commit). A quota
 * lowers total and free; an idle client's cache of the same user counts as
 * free (the lake would ask it back). */
START_TEST(test_mem_info_promise_and_quota) {
  /* A's promise holds until A leases, however slow the machine (the default 2 s ran out under the sanitizers
   * beside busy loops: B was answered before A's lease, 1 run in 20) */
  start_daemon("--limit 64MiB --prefetch 0 --log-level debug --meminfo-promise-ms 120000");
  proc a = client_start_env("GMLAKE_HEADROOM=0"), b = client_start_env("GMLAKE_HEADROOM=0"); /* leases of need only */
  client_ready(&a);
  int pb = client_ready(&b);
  unsigned long long fr = 0, to = 0, fb = 0, tb = 0;
  ck_assert_int_eq(sscanf(client_cmd(&a, "meminfo"), "meminfo %llu %llu", &fr, &to), 2);
  fprintf(b.in, "meminfo\n"), fflush(b.in); /* B asks now: held until A leases */
  ck_assert_msg(log_wait("another client's promise holds", 20000), "B's question was not held for A's promise");
  ck_assert_str_eq(client_cmd(&a, "alloc %llu", 40ull << 20), "ok 0");
  const char *r = client_first_line(&b);
  ck_assert_msg(sscanf(r, "meminfo %llu %llu", &fb, &tb) == 2, "B said '%s'", r);
  ck_assert_msg(fb == 24ull << 20, "B was told %llu bytes free after A took 40 MiB of 64", fb);
  /* A frees and goes idle: its cache is B's to get (the lake asks it back) */
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  ck_assert_int_eq(stat_wait("cached", 40 << 20, 4000), 40 << 20);
  long long waited = 0;
  for (; waited < 20000; waited += 50) { /* A counts as idle once it allocated nothing for a second */
    ck_assert_int_eq(sscanf(client_cmd(&b, "meminfo"), "meminfo %llu %llu", &fb, &tb), 2);
    if (fb == 64ull << 20) break;
    msleep(50);
  }
  ck_assert_msg(fb == 64ull << 20, "B was told %llu free with A idle on 40 MiB of cache", fb);
  char out[4096], args[64];
  snprintf(args, sizeof args, "quota %d 16MiB", pb);
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  ck_assert_int_eq(sscanf(client_cmd(&b, "meminfo"), "meminfo %llu %llu", &fb, &tb), 2);
  ck_assert_uint_eq(tb, 16ull << 20);
  ck_assert_uint_eq(fb, 16ull << 20);
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 6 << 20), "ok 0");
  ck_assert_int_eq(sscanf(client_cmd(&b, "meminfo"), "meminfo %llu %llu", &fb, &tb), 2);
  ck_assert_uint_eq(fb, 10ull << 20);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("elastic");
  TCase *tc = tcase_create("lake");
  tcase_set_timeout(tc, 120); /* a guard against a hang, not a bound */
  tcase_add_checked_fixture(tc, harness_setup, NULL);
  tcase_add_test(tc, test_idle_client_gives_back);
  tcase_add_test(tc, test_idle_client_numbers_current);
  tcase_add_test(tc, test_pid_quota_ends_with_process);
  tcase_add_test(tc, test_named_quota_rpc);
  tcase_add_test(tc, test_quota_counts_shares);
  tcase_add_test(tc, test_daemon_restart_keeps_shares);
  tcase_add_test(tc, test_restart_new_share_same_key);
  tcase_add_test(tc, test_adoption_bounded);
  tcase_add_test(tc, test_uncounted_let_go);
  tcase_add_test(tc, test_full_lake_message);
  tcase_add_test(tc, test_idle_hog_streamed);
  tcase_add_test(tc, test_idle_hog_from_idle_cache);
  tcase_add_test(tc, test_idle_hog_after_operator_trim);
  tcase_add_test(tc, test_idle_hog_after_restart);
  tcase_add_test(tc, test_idle_hog_stopped);
  tcase_add_test(tc, test_idle_hog_stopped_past_lease);
  tcase_add_test(tc, test_idle_hog_stream_map);
  tcase_add_test(tc, test_pause_resume_across_clients);
  tcase_add_test(tc, test_uid_quota_over_two_processes);
  tcase_add_test(tc, test_error_after_daemon_gone);
  tcase_add_test(tc, test_process_quota_over_connections);
  tcase_add_test(tc, test_daemon_restart_keeps_memory);
  tcase_add_test(tc, test_over_limit_after_restart_said);
  tcase_add_test(tc, test_over_limit_reason_kept_by_reload);
  tcase_add_test(tc, test_idle_lake_gives_back);
  tcase_add_test(tc, test_mem_info_two_at_once);
  tcase_add_test(tc, test_mem_info_promise_and_quota);
  suite_add_tcase(s, tc);
  TCase *rc = tcase_create("reconnect"); /* CK_RUN_CASE=reconnect runs it alone */
  tcase_set_timeout(rc, 120);
  tcase_add_checked_fixture(rc, harness_setup, NULL);
  tcase_add_test(rc, test_reconnect_failure_says_why);
  tcase_add_test(rc, test_reconnect_checks_the_socket);
  tcase_add_test(rc, test_stopped_daemon_lease_times_out);
  tcase_add_test(rc, test_reply_timeout_past_lease_wait);
  tcase_add_test(rc, test_stopped_daemon_send_times_out);
  suite_add_tcase(s, rc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
