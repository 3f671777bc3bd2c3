/* Issue 13's hostile-client tests on the host backend: a real gmlaked, raw
 * clients that misbehave on the wire (stop reading, half-close, flood, never
 * say hello), clients of another uid (the tests run as root; a child
 * setuid()s), and gmlakectl as a non-root user. Each test fails on the code
 * before the fix it covers (see the commit that added it). */
#include "skip.h"
#include "backend.h"
#include "gmlake.h"
#include "harness.h"
#include "util.h"
#include "wire.h"
#include <check.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <grp.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <dirent.h>
#include <errno.h>
#include <linux/capability.h>
#include <time.h>
#include <unistd.h>

#define NOBODY 65534
#define ALICE_UID 1001 /* in the group gmlake (CI's test users) */

/* The daemon's CPU time (user + system), in seconds. */
static double daemon_cpu(void) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)daemon_pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  unsigned long long ut = 0, stt = 0;
  /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &stt) != 2) return -1;
  return (double)(ut + stt) / (double)sysconf(_SC_CLK_TCK);
}

static long daemon_rss_kib(void) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)daemon_pid);
  FILE *f = fopen(path, "r");
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
  if (f) fclose(f);
  return kib;
}

/* The daemon's open fds (/proc/PID/fd). */
static int daemon_fds(void) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)daemon_pid);
  DIR *dir = opendir(path);
  int n = 0;
  for (struct dirent *e; dir && (e = readdir(dir));) n += e->d_name[0] != '.';
  if (dir) closedir(dir);
  return n;
}

/* daemon_fds once three reads 50 ms apart agree (10 s at most): a baseline. Right after start the
 * daemon may still hold a passing fd (the harness's readiness probe until its next loop turn, a
 * chunk being made): a baseline one higher than the settled count failed "fds == fds0" (23 vs 24)
 * in 1 of 20 runs beside two busy loops. */
static int daemon_fds_settled(void) {
  int n = daemon_fds(), same = 0;
  for (int i = 0; i < 200 && same < 2; i++) {
    msleep(50);
    int m = daemon_fds();
    same = m == n ? same + 1 : 0;
    n = m;
  }
  return n;
}

static int count_log(const char *needle) {
  char path[128], line[1024];
  snprintf(path, sizeof path, "%s/daemon.log", tmpdir);
  FILE *f = fopen(path, "r");
  int n = 0;
  while (f && fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
  if (f) fclose(f);
  return n;
}

/* ---------- a raw client on the wire ---------- */

/* The next frame's envelope (NULL on EOF/timeout); fds received into fds. */
static Gmlake__Envelope *recv_env(int s, int *fds, int *nfds) {
  Gmlake__Envelope *env = NULL;
  int n = 0;
  if (gmli_wire_recv(s, &env, fds ? fds : (int[GML_MAX_LEASE_CHUNKS]){0}, &n, GML_MAX_LEASE_CHUNKS)) return NULL;
  if (nfds) *nfds = n;
  return env;
}

/* Connect, hello, its reply: a session ready to lease (-1 when refused). */
static int raw_session(const char *name) {
  int s = raw_connect();
  if (s < 0) return -1;
  send_hello(s, name);
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  int ok = r && r->msg_case == GMLAKE__ENVELOPE__MSG_HELLO_REPLY;
  if (r) gmlake__envelope__free_unpacked(r, NULL);
  if (!ok) {
    close(s);
    return -1;
  }
  return s;
}

static uint8_t *frame_of(Gmlake__Envelope *env, size_t *len) {
  uint8_t *f;
  ck_assert_int_eq(gmli_wire_encode(env, &f, len), 0);
  return f;
}

static void send_lease(int s, uint64_t seq, uint32_t count, int optional) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__LeaseRequest lr = GMLAKE__LEASE_REQUEST__INIT;
  lr.count = count;
  lr.optional = optional;
  env.seq = seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_LEASE;
  env.lease = &lr;
  send_env(s, &env, NULL, 0);
}

static void send_return_ex(int s, uint64_t seq, const uint64_t *ids, size_t n, int tainted) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReturnRequest rr = GMLAKE__RETURN_REQUEST__INIT;
  rr.tainted = tainted != 0;
  rr.n_chunk_ids = n;
  rr.chunk_ids = (uint64_t *)ids;
  env.seq = seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_RET;
  env.ret = &rr;
  send_env(s, &env, NULL, 0);
}

static void send_return(int s, uint64_t seq, const uint64_t *ids, size_t n) { send_return_ex(s, seq, ids, n, 0); }

/* Lease count chunks and wait for the reply: ids and fds out; how many. */
static int lease_now(int s, uint64_t seq, uint32_t count, uint64_t *ids, int *fds) {
  send_lease(s, seq, count, 0);
  int nfds = 0;
  Gmlake__Envelope *r = recv_env(s, fds, &nfds);
  if (!r) return -1;
  int n = -1;
  if (r->msg_case == GMLAKE__ENVELOPE__MSG_LEASE_REPLY) {
    n = (int)r->lease_reply->n_chunk_ids;
    for (int i = 0; i < n; i++) ids[i] = r->lease_reply->chunk_ids[i];
  }
  gmlake__envelope__free_unpacked(r, NULL);
  return n == nfds ? n : -1;
}

static void setup(void) {
  harness_setup();
  tmpdir_template = "/tmp/gmlake-sec.XXXXXX";
  tmpdir_mode = 0755; /* other uids reach the sockets in some tests */
  ctl_quiet = 1;
  signal(SIGPIPE, SIG_IGN);
}

/* ---------- item 1: a queued fd is the queue's own reference ---------- */

/* A client stops reading; its lease reply (with the chunk's fd) waits in the
 * daemon's queue while the client returns the chunk and the operator trims
 * it, and new connections take the freed fd numbers. What the client gets
 * with the reply must still be the chunk (a memfd of the chunk's size), never
 * another file (another user's socket). */
START_TEST(test_queued_fd_owned) {
  start_daemon("--limit 4MiB --prefetch 0");
  int s = raw_session("stops-reading");
  ck_assert_int_ge(s, 0);
  /* nothing is free: each optional lease gets a quick "no", which we do not read */
  for (int i = 0; i < 3000; i++) send_lease(s, 10 + (uint64_t)i, 1, 1);
  send_lease(s, 99999, 1, 0); /* served once the chunk is made: its reply queues behind the "no"s */
  ck_assert_int_eq(stat_wait("chunks_leased", 1, 20000), 1);
  uint64_t id = (1ull << 32) | 1; /* the lake's first chunk: ids are predictable */
  send_return(s, 100000, &id, 1);
  ck_assert_int_eq(stat_wait("chunks_leased", 0, 20000), 0);
  char out[4096];
  ck_assert_int_eq(ctl(out, sizeof out, "trim"), 0);
  ck_assert_int_eq(stat_num("chunks_total"), 0);
  int others[4];
  for (int i = 0; i < 4; i++) others[i] = raw_connect(); /* they take the lowest free fd numbers */
  ck_assert_int_eq(stat_wait("clients", 5, 20000),
                   5); /* once the daemon accepted them (a session each, hello or not) */
  int got = 0;
  for (;;) {
    int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
    Gmlake__Envelope *r = recv_env(s, fds, &nfds);
    ck_assert_msg(r != NULL, "connection closed before the lease reply came");
    int is_lease = r->msg_case == GMLAKE__ENVELOPE__MSG_LEASE_REPLY;
    gmlake__envelope__free_unpacked(r, NULL);
    if (!is_lease) continue;
    ck_assert_int_eq(nfds, 1);
    struct stat st;
    ck_assert_int_eq(fstat(fds[0], &st), 0);
    ck_assert_msg(S_ISREG(st.st_mode) && st.st_size == 2 << 20, "received fd: mode %o size %lld (a socket: %d)",
                  (unsigned)st.st_mode, (long long)st.st_size, S_ISSOCK(st.st_mode));
    close(fds[0]);
    got = 1;
    break;
  }
  ck_assert(got);
  close(s);
  for (int i = 0; i < 4; i++) close(others[i]);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* ---------- item 4: a send that fails outside the session's own callback ---------- */

/* A client half-closes (shutdown SHUT_RD) holding chunks; a reclaim request
 * (gmlakectl trim --client) fails to send. The session must be closed: its
 * chunks parked while its process lives, back when it exits, and the daemon
 * must not spin. */
START_TEST(test_half_closed_client) {
  start_daemon("--limit 16MiB --prefetch 4MiB");
  ck_assert_int_eq(stat_wait("chunks_free", 2, 3000), 2); /* both chunks there: one reply carries them */
  int go[2], ready[2];
  ck_assert_int_eq(pipe(go), 0);
  ck_assert_int_eq(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    int s = raw_session("half-closed");
    uint64_t ids[4];
    int fds[4];
    int n = s >= 0 ? lease_now(s, 2, 2, ids, fds) : -1;
    shutdown(s, SHUT_RD);
    char c = n == 2 ? 'y' : 'n';
    if (write(ready[1], &c, 1)) {}
    if (read(go[0], &c, 1)) {} /* then exit: the socket closes */
    _exit(0);
  }
  char c = 0;
  ck_assert_int_eq(read(ready[0], &c, 1), 1);
  ck_assert_int_eq(c, 'y');
  ck_assert_int_eq(stat_num("chunks_leased"), 2);
  char out[4096], args[64];
  snprintf(args, sizeof args, "trim --client %d", (int)child);
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  ck_assert_int_eq(stat_wait("clients", 0, 2000), 0);       /* closed... */
  ck_assert_int_eq(stat_wait("chunks_parked", 2, 2000), 2); /* ...its chunks wait for its process */
  ck_assert_int_eq(write(go[1], "x", 1), 1);
  int st;
  waitpid(child, &st, 0);
  ck_assert_int_eq(stat_wait("chunks_leased", 0, 2000), 0);
  ck_assert_int_eq(stat_wait("chunks_parked", 0, 2000), 0);
  ck_assert_int_ge(stat_num("chunks_free"), 2);
  /* What is tested is the CPU an idle daemon uses over a time: the sleep is that time. On a loaded
   * machine it may be longer, never shorter, and an idle daemon's CPU stays near 0 */
  double t0 = daemon_cpu();
  msleep(1000);
  double used = daemon_cpu() - t0;
  ck_assert_msg(used < 0.3, "daemon used %.2f s of CPU in 1 s while idle", used);
  close(go[0]), close(go[1]), close(ready[0]), close(ready[1]);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* ---------- item 5: bounds ---------- */

/* A client that asks and never reads: the daemon closes it at its send-queue
 * bound (default 4 MiB) and does not grow far past it. */
START_TEST(test_send_queue_bound) {
  start_daemon("--limit 4MiB --prefetch 0");
  int s = raw_session("never-reads");
  ck_assert_int_ge(s, 0);
  long rss0 = daemon_rss_kib();
  /* 300,000 optional leases, each answered "no" (nothing free): ~100 bytes of reply each, unread */
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__LeaseRequest lr = GMLAKE__LEASE_REQUEST__INIT;
  lr.count = 1;
  lr.optional = 1;
  env.seq = 7;
  env.msg_case = GMLAKE__ENVELOPE__MSG_LEASE;
  env.lease = &lr;
  size_t flen;
  uint8_t *f = frame_of(&env, &flen);
  size_t batch = 4096;
  uint8_t *buf = malloc(flen * batch);
  for (size_t i = 0; i < batch; i++) memcpy(buf + i * flen, f, flen);
  long peak = rss0;
  int refused = 0;
  for (int i = 0; i < 300000 / (int)batch && !refused; i++) {
    size_t off = 0;
    while (off < flen * batch) {
      ssize_t w = send(s, buf + off, flen * batch - off, MSG_NOSIGNAL);
      if (w <= 0) {
        refused = 1;
        break;
      }
      off += (size_t)w;
    }
    long r = daemon_rss_kib();
    if (r > peak) peak = r;
  }
  free(buf);
  free(f);
  /* the daemon reads what is left and closes the client at its bound: its memory sampled until then */
  long long clients = -1;
  for (int i = 0; i < 1000 && clients != 0; i++) {
    long r = daemon_rss_kib();
    if (r > peak) peak = r;
    if ((clients = stat_num("clients")) != 0) msleep(20);
  }
  long r = daemon_rss_kib();
  if (r > peak) peak = r;
  ck_assert_msg(peak - rss0 < 48 * 1024, "daemon grew from %ld to %ld KiB for one client that does not read", rss0,
                peak);
  ck_assert_msg(refused || closed_by_daemon(s), "the client was not closed");
  close(s);
  ck_assert_int_eq(stat_wait("clients", 0, 20000), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* No hello within hello-timeout-ms, or half a frame for frame-timeout-ms: closed. */
START_TEST(test_idle_and_partial_timeouts) {
  start_daemon("--limit 4MiB --hello-timeout-ms 300 --frame-timeout-ms 300");
  uint64_t t0 = gmli_now_ns();
  int s = raw_connect();
  ck_assert(closed_by_daemon(s));
  ck_assert_uint_lt(gmli_now_ns() - t0, 2000000000ull);
  close(s);
  s = raw_session("slow");
  ck_assert_int_ge(s, 0);
  uint8_t half[2] = {20, 0};
  ck_assert_int_eq(send(s, half, 2, 0), 2);
  t0 = gmli_now_ns();
  ck_assert(closed_by_daemon(s));
  ck_assert_uint_lt(gmli_now_ns() - t0, 2000000000ull);
  close(s);
  ck_assert_int_ge(count_log("no hello within"), 1);
  ck_assert_int_ge(count_log("partial frame"), 1);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Fork a child that runs fn as uid (after setgid/setuid); its exit status. */
static int as_uid(int uid, int (*fn)(void *), void *arg) {
  pid_t p = fork();
  if (p == 0) {
    if (setgroups(0, NULL) || setgid((gid_t)uid) || setuid((uid_t)uid)) _exit(99);
    _exit(fn(arg));
  }
  int st;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Of n connections, how many get a hello reply (kept open until exit). */
static int connect_n(void *arg) {
  int n = *(int *)arg, ok = 0;
  for (int i = 0; i < n; i++) ok += raw_session("many") >= 0;
  return ok;
}

/* max-clients-per-uid and max-clients. */
START_TEST(test_connection_limits) {
  start_daemon("--limit 4MiB --socket-mode 0666 --max-clients 5 --max-clients-per-uid 3");
  int mine[4];
  for (int i = 0; i < 3; i++) ck_assert_int_ge(mine[i] = raw_session("root"), 0);
  mine[3] = raw_session("root-4th");
  ck_assert_int_eq(mine[3], -1); /* over the per-uid bound */
  int three = 3;
  /* another user: 2 more fit under the total of 5, the third does not */
  ck_assert_int_eq(as_uid(NOBODY, connect_n, &three), 2);
  ck_assert_int_ge(count_log("max-clients-per-uid"), 1);
  for (int i = 0; i < 3; i++) close(mine[i]);
  ck_assert_int_eq(stat_wait("clients", 0, 2000), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Flood usage reports (no reply) until killed; a byte on ready once the first batch is sent. */
static void flood(int ready) {
  int s = raw_session("flood");
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  env.seq = 3;
  env.msg_case = GMLAKE__ENVELOPE__MSG_USAGE;
  env.usage = &u;
  size_t flen;
  uint8_t *f = frame_of(&env, &flen);
  size_t n = 65536 / flen;
  uint8_t *buf = malloc(flen * n);
  for (size_t i = 0; i < n; i++) memcpy(buf + i * flen, f, flen);
  for (int sent = 0;; sent = 1) {
    if (send(s, buf, flen * n, MSG_NOSIGNAL) < 0) _exit(0);
    if (!sent && write(ready, "f", 1) != 1) _exit(0);
  }
}

/* Lease+return round trips for ms: per second. */
static double ops_per_s(int s, int ms) {
  uint64_t end = gmli_now_ns() + (uint64_t)ms * 1000000ull, seq = 100;
  int n = 0;
  uint64_t t0 = gmli_now_ns();
  while (gmli_now_ns() < end) {
    uint64_t id;
    int fd;
    if (lease_now(s, seq++, 1, &id, &fd) != 1) return -1;
    close(fd);
    send_return(s, seq++, &id, 1);
    Gmlake__Envelope *r = recv_env(s, NULL, NULL);
    if (!r) return -1;
    gmlake__envelope__free_unpacked(r, NULL);
    n++;
  }
  return n / ((double)(gmli_now_ns() - t0) / 1e9);
}

static void spin(int ready) {
  if (write(ready, "s", 1) != 1) _exit(0);
  for (volatile unsigned long i = 0;; i++) {}
}

/* ops_per_s beside two processes running fn (killed after), measured once both say they run */
static double ops_beside(int s, void (*fn)(int ready)) {
  pid_t f[2];
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  for (int i = 0; i < 2; i++)
    if ((f[i] = fork()) == 0) close(p[0]), fn(p[1]);
  close(p[1]);
  char c[2];
  int got = 0;
  struct pollfd pf = {.fd = p[0], .events = POLLIN};
  for (ssize_t r; got < 2 && poll(&pf, 1, 20000) == 1 && (r = read(p[0], c + got, (size_t)(2 - got))) > 0;)
    got += (int)r;
  close(p[0]);
  if (got < 2)
    for (int i = 0; i < 2; i++) kill(f[i], SIGKILL), waitpid(f[i], NULL, 0);
  ck_assert_msg(got == 2, "%d of 2 processes beside the client started in 20 s", got);
  double ops = ops_per_s(s, 1000);
  for (int i = 0; i < 2; i++) kill(f[i], SIGKILL), waitpid(f[i], NULL, 0);
  return ops;
}

/* Two clients flood; a third keeps a fair share of the daemon (the read budget). The baseline is
 * the same client beside two processes that only spin, taken in the same run: what the floods take
 * beyond the CPU they burn is the daemon's doing (against the rate alone, on a loaded 2-core
 * machine the CPU they took made it 7%: 26771 ops/s alone, 1896 beside the floods). Without the
 * budget (--read-budget 1000000 as the default) the floods left it 31 ops/s of 11024 beside the
 * spinners (0.28%, and this test failed); with it, 24-79% beside two busy loops, and 6-8% on a
 * 2-core machine at load 11 (builds and suites beside it: a daemon that never sleeps waits for its
 * turn among eleven), so the bound is 2%: 7 times what starvation gives. */
START_TEST(test_read_budget_fairness) {
  start_daemon("--limit 16MiB --prefetch 4MiB");
  int s = raw_session("legit");
  ck_assert_int_ge(s, 0);
  ck_assert_int_eq(stat_wait("chunks_free", 2, 20000), 2);
  double alone = ops_per_s(s, 500), spun = ops_beside(s, spin), flooded = ops_beside(s, flood);
  printf("  fairness: %.0f lease+return/s alone, %.0f beside two spinning processes, %.0f beside two flooding clients "
         "(%.1f%% of that)\n",
         alone, spun, flooded, 100 * flooded / spun);
  ck_assert_double_gt(alone, 0);
  ck_assert_double_gt(spun, 0);
  ck_assert_msg(flooded >= spun * 0.02,
                "legitimate client: %.0f ops/s beside two spinning processes, %.0f beside two floods", spun, flooded);
  close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A flood of connections at the daemon's fd limit: no busy loop, no log flood, and it serves again
 * once they go. The fd budget (daemon/fdbudget.c) refuses connections past its share of the limit
 * before accept() runs out of fds, so what the daemon meets is one of the two: accept() out of fds
 * (it pauses) or the budget's refusal (it accepts and closes); either is waited for. */
START_TEST(test_accept_at_fd_limit) {
  daemon_env = "ulimit -n 48; ";
  start_daemon("--limit 4MiB --prefetch 0");
  int s[80], n = 0;
  for (int i = 0; i < 80; i++) s[n++] = raw_connect(); /* connects succeed into the backlog */
  ck_assert_msg(log_wait_either("accept paused", "for the daemon's fd limit", 20000),
                "the daemon did not reach its fd limit");
  /* the CPU it uses there over a time (the sleep): on a loaded machine longer, never shorter */
  double t0 = daemon_cpu();
  msleep(1000);
  double used = daemon_cpu() - t0;
  int lines = count_log("accept") + count_log("for the daemon's fd limit");
  for (int i = 0; i < n; i++)
    if (s[i] >= 0) close(s[i]);
  ck_assert_msg(used < 0.3, "daemon used %.2f s of CPU in 1 s at its fd limit", used);
  ck_assert_msg(lines <= 5, "%d log lines about accept", lines);
  ck_assert_int_eq(stat_wait("clients", 0, 20000), 0); /* and it serves again */
  int ok = raw_session("after");
  ck_assert_int_ge(ok, 0);
  close(ok);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* ---------- item 7: the control socket ---------- */

/* A stray connect-and-close, or garbage, does not wedge the control socket. */
START_TEST(test_control_stray_connect) {
  start_daemon("--limit 8MiB");
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, ctl_url + 6, strlen(ctl_url + 6) + 1); /* tmpdir paths are short */
  for (int i = 0; i < 30; i++) { /* libnng 1.5.2's listener died when a peer closed mid-handshake: a race, so many */
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_eq(connect(s, (struct sockaddr *)&sa, sizeof sa), 0);
    if (i % 3 == 1) ck_assert_int_eq(send(s, "garbage!garbage!", 16, 0), 16);
    if (i % 3 == 2)
      ck_assert_int_eq(send(s, "\0SP\0\0\x30\0\0\x01\xff\xff\xff\xff\xff\xff\xff\xff", 17, 0), 17); /* a huge length */
    close(s);
  }
  char out[4096];
  uint64_t t0 = gmli_now_ns();
  ck_assert_int_eq(ctl(out, sizeof out, "stats --json"), 0);
  ck_assert_int_eq(json_num(out, "limit_bytes"), 8 << 20);
  ck_assert_uint_lt(gmli_now_ns() - t0, 2000000000ull);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Reading for the socket's group, changing for root: a member of the group
 * (nobody:nogroup, the control socket given to nogroup by --socket-group)
 * reads stats and cannot set the limit or trim. */
START_TEST(test_control_authorization) {
  struct group *g = getgrnam("nogroup");
  ck_assert_ptr_nonnull(g);
  start_daemon("--limit 8MiB --prefetch 4MiB --socket-group nogroup");
  struct stat st;
  ck_assert_int_eq(stat(ctl_url + 6, &st), 0);
  ck_assert_int_eq(st.st_gid, g->gr_gid); /* the group setting reaches the control socket */
  ck_assert_int_eq(st.st_mode & 0777, 0660);
  ck_assert_int_eq(stat_wait("chunks_free", 2, 2000), 2);
  char out[4096];
  ck_assert_msg(ctl_as(NOBODY, out, sizeof out, "stats --json") == 0, "stats as nobody: %s", out);
  ck_assert_int_eq(json_num(out, "limit_bytes"), 8 << 20);
  ck_assert_int_ne(ctl_as(NOBODY, out, sizeof out, "limit 2MiB"), 0);
  ck_assert_msg(strstr(out, "permission denied"), "limit as nobody said: %s", out);
  ck_assert_int_ne(ctl_as(NOBODY, out, sizeof out, "trim"), 0);
  ck_assert_int_ne(ctl_as(NOBODY, out, sizeof out, "quota uid:0 2MiB"), 0);
  ck_assert_int_eq(stat_num("limit_bytes"), 8 << 20);
  ck_assert_int_eq(stat_num("chunks_free"), 2);
  ck_assert_int_eq(ctl(out, sizeof out, "limit 6MiB"), 0); /* root may */
  ck_assert_int_eq(stat_num("limit_bytes"), 6 << 20);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Another user reading the lake (nobody, through the group) sees root's
 * client by its numbers only: no pid, name or cgroup in `clients`, its
 * chunks as another user's ('o', owner_pid -3) in `chunks`; root sees all.
 * Before, every group member read every user's pids, process names and
 * cgroups (new-user trial). */
START_TEST(test_control_hides_other_users) {
  start_daemon("--limit 8MiB --prefetch 0 --socket-group nogroup");
  int s = raw_session("root-secret-job");
  ck_assert_int_ge(s, 0);
  uint64_t ids[1];
  int fds[1];
  ck_assert_int_eq(lease_now(s, 2, 1, ids, fds), 1);
  close(fds[0]);
  ck_assert_int_eq(stat_wait("chunks_leased", 1, 2000), 1);
  char out[8192], pid[32];
  snprintf(pid, sizeof pid, "\"pid\":%d,", (int)getpid());
  ck_assert_int_eq(ctl(out, sizeof out, "clients --json"), 0);
  ck_assert_msg(strstr(out, "root-secret-job") && strstr(out, pid), "root's view: %s", out);
  ck_assert_msg(ctl_as(NOBODY, out, sizeof out, "clients --json") == 0, "clients as nobody: %s", out);
  ck_assert_msg(!strstr(out, "root-secret-job") && !strstr(out, pid) && !strstr(out, "cgroup\":\"/"),
                "nobody's view: %s", out);
  ck_assert_msg(strstr(out, "\"leased_chunks\":1"), "nobody's view keeps the numbers: %s", out);
  ck_assert_msg(ctl_as(NOBODY, out, sizeof out, "clients") == 0 && strstr(out, "(another user)"), "table: %s", out);
  ck_assert_msg(ctl_as(NOBODY, out, sizeof out, "chunks --json") == 0, "chunks as nobody: %s", out);
  snprintf(pid, sizeof pid, "\"owner_pid\":%d", (int)getpid());
  ck_assert_msg(strstr(out, "\"owner_pid\":-3") && !strstr(out, pid), "nobody's chunks: %s", out);
  ck_assert_int_eq(ctl(out, sizeof out, "chunks --json"), 0);
  ck_assert_msg(strstr(out, pid), "root's chunks: %s", out);
  /* metrics: root's bytes under cgroup "(other users)", not "unknown" (nor under root's cgroup's name) */
  ck_assert_msg(ctl_as(NOBODY, out, sizeof out, "metrics") == 0, "metrics as nobody: %s", out);
  ck_assert_msg(strstr(out, "cgroup=\"(other users)\",kind=\"leased\"} 2097152") && !strstr(out, "cgroup=\"unknown\""),
                "nobody's metrics: %.400s",
                strstr(out, "gmlake_cgroup_bytes{") ? strstr(out, "gmlake_cgroup_bytes{") : out);
  close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A second daemon on the same control URL or client socket refuses to
 * start, saying why, and leaves the first one's files alone; tcp:// control
 * only with --control-insecure-tcp. */
START_TEST(test_second_daemon_refused) {
  start_daemon("--limit 8MiB");
  char out[4096];
  ck_assert_int_ne(sh(out, sizeof out, "timeout 5 %s/gmlaked --backend host --socket %s/other.sock --control %s 2>&1",
                      bindir, tmpdir, ctl_url),
                   0);
  ck_assert_msg(strstr(out, "another daemon already serves"), "second daemon said: %s", out);
  ck_assert_int_ne(access(sock_path, F_OK), 1);
  ck_assert_int_ne(sh(out, sizeof out,
                      "timeout 5 %s/gmlaked --backend host --socket %s --control ipc://%s/other.ctl 2>&1", bindir,
                      sock_path, tmpdir),
                   0);
  ck_assert_msg(strstr(out, "another daemon already serves"), "second daemon said: %s", out);
  ck_assert_int_eq(stat_num("limit_bytes"), 8 << 20); /* the first still answers, on both */
  int s = raw_session("still-there");
  ck_assert_int_ge(s, 0);
  close(s);
  ck_assert_int_ne(sh(out, sizeof out,
                      "timeout 5 %s/gmlaked --backend host --socket %s/t.sock --control tcp://127.0.0.1:0 2>&1", bindir,
                      tmpdir),
                   0);
  ck_assert_msg(strstr(out, "--control-insecure-tcp"), "tcp control said: %s", out);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* ---------- item 8: inputs ---------- */

/* gmlaked's command line and config: each bad input refused with exit 2 or 1 and a message. */
START_TEST(test_daemon_bad_inputs) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/gmlake-sec.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
  static const struct {
    const char *args, *says;
  } bad[] = {
      {"--limit nan", "bad value for limit"},
      {"--limit inf", "bad value for limit"},
      {"--prefetch 1e300", "bad value for prefetch"},
      {"--preallocate 1e30TiB", "bad value for preallocate"},
      {"--device abc", "bad value for device"},
      {"--config %s", "not a regular file"},
      {"--socket %s/file", "is not a socket"},
      {"--limit 1MiB", "at least one chunk, 2097152 bytes"}, /* below one chunk: it said only "bad value" */
  };
  char out[4096], args[256], path[128];
  snprintf(path, sizeof path, "%s/file", tmpdir);
  FILE *f = fopen(path, "w");
  fputs("precious\n", f);
  fclose(f);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(args, sizeof args, bad[i].args, tmpdir);
    int rc =
        sh(out, sizeof out, "timeout 5 %s/gmlaked --backend host --socket %s/d.sock --control ipc://%s/d.ctl %s 2>&1",
           bindir, tmpdir, tmpdir, args);
    ck_assert_msg(rc == 1 || rc == 2, "gmlaked %s: exit %d (%s)", args, rc, out);
    ck_assert_msg(strstr(out, bad[i].says), "gmlaked %s said: %s", args, out);
  }
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0); /* --socket on a regular file left it alone */
  ck_assert_int_eq(st.st_size, 9);
  snprintf(args, sizeof args, "rm -rf %s", tmpdir);
  ck_assert_int_eq(system(args), 0);
}
END_TEST

/* gmlakectl: bad numbers refused before anything is sent (trim --client abc
 * used to trim everything; quota uid:abc capped root). */
START_TEST(test_ctl_bad_inputs) {
  start_daemon("--limit 8MiB --prefetch 4MiB");
  ck_assert_int_eq(stat_wait("chunks_free", 2, 2000), 2);
  static const char *const bad[] = {"trim --client abc", "trim --client 12x", "quota uid:abc 2MiB",
                                    "quota uid:-1 2MiB", "quota 12abc 2MiB",  "--device abc stats"};
  char out[4096];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(ctl(out, sizeof out, bad[i]) == 2, "gmlakectl %s was not refused", bad[i]);
  ck_assert_int_eq(stat_num("chunks_free"), 2); /* nothing trimmed */
  int s = raw_session("quota-check");
  ck_assert_int_ge(s, 0);
  uint64_t ids[4];
  int fds[4];
  ck_assert_int_eq(lease_now(s, 2, 3, ids, fds), 2); /* no quota on root: the 2 free chunks */
  for (int i = 0; i < 2; i++) close(fds[i]);
  close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A lease count of 2^32 + 1 is refused, not served as 1. */
START_TEST(test_lease_count_64bit) {
  start_daemon("--limit 8MiB --prefetch 4MiB");
  ck_assert_int_eq(stat_wait("chunks_free", 2, 2000), 2);
  int s = raw_session("big-count");
  ck_assert_int_ge(s, 0);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__LeaseRequest lr = GMLAKE__LEASE_REQUEST__INIT;
  lr.count = (1ull << 32) + 1;
  env.seq = 2;
  env.msg_case = GMLAKE__ENVELOPE__MSG_LEASE;
  env.lease = &lr;
  send_env(s, &env, NULL, 0);
  int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
  Gmlake__Envelope *r = recv_env(s, fds, &nfds);
  ck_assert_msg(!r || r->msg_case != GMLAKE__ENVELOPE__MSG_LEASE_REPLY, "a lease of 2^32+1 chunks was served %zu",
                r ? r->lease_reply->n_chunk_ids : 0);
  if (r) gmlake__envelope__free_unpacked(r, NULL);
  close(s);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A usage report is bounded by what its client can hold: a client that never
 * reconnected reports no uncounted bytes, no number passes the device's
 * memory, cached (and idle) at most what it leases. Before: uncounted 16 EiB
 * in stats and metrics from any group member, allocated near 2^64 wrapped
 * the lake's sum (an honest client's 3 MiB hidden), a cache of chunks outside
 * the lake shown as the lake's reclaimable idle cache. */
START_TEST(test_usage_report_bounded) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc honest = client_start();
  client_ready(&honest);
  ck_assert_str_eq(client_cmd(&honest, "alloc %d", 3 << 20), "ok 0");
  int s = raw_session("liar");
  ck_assert_int_ge(s, 0);
  uint64_t ids[4];
  int fds[4];
  ck_assert_int_eq(lease_now(s, 2, 1, ids, fds), 1);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  u.uncounted = UINT64_MAX;
  u.allocated = UINT64_MAX - (100ull << 20);
  u.cached = u.idle_bytes = 1ull << 40;
  env.seq = 3, env.msg_case = GMLAKE__ENVELOPE__MSG_USAGE, env.usage = &u;
  send_env(s, &env, NULL, 0);
  ck_assert_int_eq(raw_round_trip(s, 4), 0); /* the liar's report handled */
  long long cs = stat_num("chunk_size");
  for (int i = 0; i < 1000 && stat_num("allocated") < (3 << 20); i++) usleep(20000); /* and the honest client's */
  ck_assert_int_eq(stat_num("uncounted"), 0);
  long long alloc = stat_num("allocated");
  ck_assert_msg(alloc >= (3 << 20), "the lake's allocated sum %lld hides the honest client's 3 MiB", alloc);
  ck_assert_int_le(stat_num("cached"), 4 * cs);      /* the liar's at most its one chunk, the honest one's rest */
  ck_assert_int_eq(stat_num("idle_cache_bytes"), 0); /* its one chunk is "allocated": nothing of it is idle */
  char out[65536];
  ck_assert_int_eq(ctl(out, sizeof out, "metrics"), 0);
  ck_assert_msg(!strstr(out, "18446744073709551615") && !strstr(out, "e+19"), "metrics: %s", out);
  /* its allocated counts at most its one chunk in the lake's fragmentation: the honest client's free
   * part stays visible (before: used > leased, fragmentation shown as 0) */
  ck_assert_int_eq(ctl(out, sizeof out, "stats --json"), 0);
  const char *fr = strstr(out, "\"fragmentation\":");
  ck_assert_ptr_nonnull(fr);
  double frag = strtod(fr + strlen("\"fragmentation\":"), NULL);
  ck_assert_msg(frag > 0.05, "fragmentation %.3f: %s", frag, out);
  close(s);
  ck_assert_int_eq(client_finish(&honest), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A client's growable ranges map chunks it leases: a report of more is bounded
 * by its lease, as its other figures are. Before, a client that leased one
 * chunk and said it mapped 64 MiB in growable ranges was shown (gmlakectl
 * clients, stats, metrics) with 64 MiB mapped. */
START_TEST(test_growable_mapped_bounded) {
  start_daemon("--limit 16MiB --prefetch 0");
  int s = raw_session("growable-liar");
  ck_assert_int_ge(s, 0);
  uint64_t id;
  int fd;
  ck_assert_int_eq(lease_now(s, 2, 1, &id, &fd), 1);
  close(fd);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  u.growable_mapped = 64ull << 20;
  u.growable_unmapped = 1ull << 30; /* address space only: no bound but the device's */
  env.seq = 3, env.msg_case = GMLAKE__ENVELOPE__MSG_USAGE, env.usage = &u;
  send_env(s, &env, NULL, 0);
  char out[8192] = "";
  long long mapped = 0;
  for (int i = 0; i < 250 && json_num(out, "growable_unmapped") <= 0; i++) /* the report is taken */
    if (ctl(out, sizeof out, "clients --json") != 0 || json_num(out, "growable_unmapped") <= 0) msleep(20);
  mapped = json_num(out, "growable_mapped");
  printf("  a client leasing one chunk says it maps 64 MiB in growable ranges: shown %lld\n", mapped);
  ck_assert_int_eq(json_num(out, "growable_unmapped"), 1ll << 30);
  ck_assert_int_eq(mapped, 2 << 20);
  ck_assert_int_eq(stat_num("growable_mapped"), 2 << 20);
  close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Any client may say adopting: past the window, a burst of such hellos logs
 * one warning a second, not one each (before: one line per connection, a
 * log flood from any group member). */
static int adopting_session(void);
START_TEST(test_late_adopting_hellos_log_bounded) {
  start_daemon("--limit 8MiB --adopt-window 1");
  msleep(
      1200); /* past the adopt-window (1 s from the daemon's start, before start_daemon returns): a time it defines */
  int s[20];
  /* each hello's line (or its debug line) is written before its reply, which adopting_session waits for: no
   * more can come after */
  for (int i = 0; i < 20; i++) ck_assert_int_ge(s[i] = adopting_session(), 0);
  int n = count_log("would hand over chunks");
  ck_assert_msg(n >= 1 && n <= 2, "%d warnings for 20 late adopting hellos", n);
  for (int i = 0; i < 20; i++) close(s[i]);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A process name with " and \ comes out as valid JSON and valid Prometheus text. */
START_TEST(test_names_escaped) {
  start_daemon("--limit 8MiB");
  int s = raw_session("ev\"il\\name");
  ck_assert_int_ge(s, 0);
  char out[8192];
  ck_assert_int_eq(sh(out, sizeof out,
                      "%s/gmlakectl --control %s clients --json | /usr/bin/python3 -c 'import json,sys; "
                      "print([c[\"name\"] for c in json.load(sys.stdin)])' 2>&1",
                      bindir, ctl_url),
                   0);
  ck_assert_msg(strstr(out, "ev\"il\\\\name"), "clients --json gave names %s", out);
  if (!getenv("GMLAKE_TEST_NO_PROMETHEUS"))
    ck_assert_msg(sh(out, sizeof out,
                     "%s/gmlakectl --control %s metrics | /usr/bin/python3 -c 'import sys\n"
                     "from prometheus_client.parser import text_string_to_metric_families as p\n"
                     "print(len(list(p(sys.stdin.read()))))' 2>&1",
                     bindir, ctl_url) == 0,
                  "metrics did not parse: %s", out);
  close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A control request over 64 KiB gets an error reply (it used to get none: gmlakectl waited). */
START_TEST(test_control_oversize_request) {
  start_daemon("--limit 8MiB");
  nng_socket req;
  ck_assert_int_eq(nng_req0_open(&req), 0);
  nng_socket_set_ms(req, NNG_OPT_RECVTIMEO, 3000);
  nng_socket_set_size(req, NNG_OPT_RECVMAXSZ, 1 << 20);
  ck_assert_int_eq(nng_dial(req, ctl_url, NULL, 0), 0);
  size_t n = 100 * 1024;
  uint8_t *big = malloc(n);
  memset(big, 0x0a, n);
  ck_assert_int_eq(nng_send(req, big, n, 0), 0);
  free(big);
  void *in;
  size_t len;
  ck_assert_int_eq(nng_recv(req, &in, &len, NNG_FLAG_ALLOC), 0);
  Gmlake__CtlReply *rep = gmlake__ctl_reply__unpack(NULL, len, in);
  nng_free(in, len);
  ck_assert_ptr_nonnull(rep);
  ck_assert_int_ne(rep->code, 0);
  ck_assert_msg(rep->message && strstr(rep->message, "64 KiB"), "reply: %s", rep->message ? rep->message : "");
  gmlake__ctl_reply__free_unpacked(rep, NULL);
  nng_close(req);
  char out[4096];
  ck_assert_int_eq(ctl(out, sizeof out, "stats"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* ---------- item 2: no memory crosses uids with content ---------- */

/* Lease one chunk and map it: its fd's inode, the mapping (NULL on failure). */
static uint8_t *lease_map(int s, uint64_t seq, uint64_t *id, int *fd, ino_t *ino) {
  if (lease_now(s, seq, 1, id, fd) != 1) return NULL;
  struct stat st;
  if (fstat(*fd, &st)) return NULL;
  *ino = st.st_ino;
  void *p = mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  return p == MAP_FAILED ? NULL : p;
}

static int all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

/* As nobody: lease a chunk, fill it with 0xAB, give it back, exit. */
static int fill_return_exit(void *arg) {
  (void)arg;
  int s = raw_session("uid-a");
  uint64_t id;
  int fd;
  ino_t ino;
  uint8_t *p = s >= 0 ? lease_map(s, 2, &id, &fd, &ino) : NULL;
  if (!p) return 1;
  memset(p, 0xAB, 2 << 20);
  munmap(p, 2 << 20);
  close(fd);
  send_return(s, 3, &id, 1);
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  if (!r) return 2;
  gmlake__envelope__free_unpacked(r, NULL);
  return 0;
}

/* A chunk returned by uid A (its processes all gone) and leased to uid B reads as zeros. */
START_TEST(test_other_uid_reads_zeros) {
  start_daemon("--limit 2MiB --prefetch 0 --socket-mode 0666"); /* one chunk: B must get A's, scrubbed, or a new one */
  ck_assert_int_eq(as_uid(NOBODY, fill_return_exit, NULL), 0);
  ck_assert_int_eq(stat_wait("chunks_leased", 0, 2000), 0);
  int s = raw_session("uid-b");
  ck_assert_int_ge(s, 0);
  uint64_t id;
  int fd;
  ino_t ino;
  uint8_t *p = lease_map(s, 2, &id, &fd, &ino);
  ck_assert_ptr_nonnull(p);
  ck_assert_msg(all_zero(p, 2 << 20), "uid 0 read uid %d's bytes: %#x", NOBODY, p[0]);
  munmap(p, 2 << 20);
  close(fd);
  close(s);
  ck_assert_int_ge(stat_num("chunks_scrubbed") + stat_num("chunks_remade"), 1);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* As nobody: lease a chunk, fill it, hand its fd over *(int *)arg (a
 * socket), return the chunk and exit. */
static int fill_pass_return_exit(void *arg) {
  int to = *(int *)arg;
  int s = raw_session("uid-a-passes");
  uint64_t id;
  int fd;
  ino_t ino;
  uint8_t *p = s >= 0 ? lease_map(s, 2, &id, &fd, &ino) : NULL;
  if (!p) return 1;
  memset(p, 0xAB, 2 << 20);
  char byte = 0, cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {&byte, 1};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET, cm->cmsg_type = SCM_RIGHTS, cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  if (sendmsg(to, &m, 0) != 1) return 2;
  send_return(s, 3, &id, 1);
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  if (!r) return 3;
  gmlake__envelope__free_unpacked(r, NULL);
  return 0;
}

/* uid A hands a chunk's fd to a process of a third uid (a second account,
 * a user namespace's subuid) and every process of A exits. The chunk goes
 * to uid B: B's bytes must not reach that holder (a chunk for another uid
 * is made anew; scrubbing it once A had no process left was not enough). */
START_TEST(test_passed_fd_holder_reads_nothing) {
  start_daemon("--limit 2MiB --prefetch 0 --socket-mode 0666"); /* one chunk: B gets A's or a new one */
  int sp[2], rep[2], go[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  ck_assert_int_eq(pipe(rep), 0);
  ck_assert_int_eq(pipe(go), 0);
  pid_t h = fork();
  if (h == 0) { /* the holder: uid 65533, never a client */
    if (setgroups(0, NULL) || setgid(65533) || setuid(65533)) _exit(99);
    char byte, cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    if (recvmsg(sp[1], &m, 0) != 1 || !CMSG_FIRSTHDR(&m)) _exit(2);
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    volatile uint8_t *p = mmap(NULL, 2 << 20, PROT_READ, MAP_SHARED, fd, 0);
    char c;
    if (p == MAP_FAILED || read(go[0], &c, 1) != 1) _exit(3);
    uint8_t seen = p[0];
    _exit(write(rep[1], &seen, 1) == 1 ? 0 : 4);
  }
  ck_assert_int_eq(as_uid(NOBODY, fill_pass_return_exit, &sp[0]), 0);
  ck_assert_int_eq(stat_wait("chunks_leased", 0, 2000), 0);
  int s = raw_session("uid-b");
  ck_assert_int_ge(s, 0);
  uint64_t id;
  int fd;
  ino_t ino;
  uint8_t *p = lease_map(s, 2, &id, &fd, &ino);
  ck_assert_ptr_nonnull(p);
  ck_assert_msg(all_zero(p, 2 << 20), "uid 0 read uid %d's bytes: %#x", NOBODY, p[0]);
  memset(p, 0x5A, 2 << 20);
  ck_assert_int_eq(write(go[1], "g", 1), 1);
  uint8_t seen = 0;
  ck_assert_int_eq(read(rep[0], &seen, 1), 1);
  ck_assert_msg(seen != 0x5A, "uid 65533, handed uid %d's chunk, read what uid 0 wrote after", NOBODY);
  ck_assert_uint_eq(seen, 0xAB);
  ck_assert_int_eq(stat_num("chunks_remade"), 1);
  waitpid(h, NULL, 0);
  munmap(p, 2 << 20);
  close(fd);
  close(s);
  for (int i = 0; i < 2; i++) close(sp[i]), close(rep[i]), close(go[i]);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* As nobody: lease a chunk, fill it, return it but keep it mapped (as a
 * client that dup'ed the fd, or a forked child, would); tell the parent its
 * inode; when told, write into it again; then wait to be killed. */
static int keep_after_return(void *arg) {
  int *pipes = arg; /* to parent, from parent */
  int s = raw_session("uid-a-keeps");
  uint64_t id;
  int fd;
  ino_t ino;
  uint8_t *p = s >= 0 ? lease_map(s, 2, &id, &fd, &ino) : NULL;
  if (!p) return 1;
  memset(p, 0xAB, 2 << 20);
  send_return(s, 3, &id, 1);
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  if (r) gmlake__envelope__free_unpacked(r, NULL);
  unsigned long long n = (unsigned long long)ino;
  if (write(pipes[0], &n, sizeof n) != sizeof n) return 3;
  char c;
  if (read(pipes[1], &c, 1) != 1) return 4;
  memset(p, 0xCD, 2 << 20); /* after B got its chunk */
  if (write(pipes[0], "w", 1) != 1) return 5;
  pause();
  return 0;
}

/* A chunk uid A returned while a process of A lives (and maps it) is not
 * leased to uid B: B gets another chunk (here the lake is full, so A's is
 * released and a new one made), and nothing A writes reaches B. */
START_TEST(test_reachable_chunk_not_leased) {
  start_daemon("--limit 2MiB --prefetch 0 --socket-mode 0666");
  int to_parent[2], to_child[2];
  ck_assert_int_eq(pipe(to_parent), 0);
  ck_assert_int_eq(pipe(to_child), 0);
  pid_t a = fork();
  if (a == 0) {
    int ends[2] = {to_parent[1], to_child[0]};
    if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY)) _exit(99);
    _exit(keep_after_return(ends));
  }
  unsigned long long a_ino = 0;
  ck_assert_int_eq(read(to_parent[0], &a_ino, sizeof a_ino), (ssize_t)sizeof a_ino);
  ck_assert_int_eq(stat_wait("chunks_leased", 0, 2000), 0);
  int s = raw_session("uid-b");
  ck_assert_int_ge(s, 0);
  uint64_t id;
  int fd;
  ino_t ino;
  uint8_t *p = lease_map(s, 2, &id, &fd, &ino);
  ck_assert_ptr_nonnull(p);
  ck_assert_msg((unsigned long long)ino != a_ino, "uid 0 was leased the chunk uid %d still maps", NOBODY);
  ck_assert_msg(all_zero(p, 2 << 20), "uid 0 read uid %d's bytes: %#x", NOBODY, p[0]);
  char c;
  ck_assert_int_eq(write(to_child[1], "g", 1), 1);
  ck_assert_int_eq(read(to_parent[0], &c, 1), 1);
  ck_assert_msg(all_zero(p, 2 << 20), "uid %d wrote into uid 0's chunk: %#x", NOBODY, p[0]);
  ck_assert_int_eq(stat_num("chunks_remade"), 1);
  kill(a, SIGKILL);
  waitpid(a, NULL, 0);
  munmap(p, 2 << 20);
  close(fd);
  close(s);
  for (int i = 0; i < 2; i++) close(to_parent[i]), close(to_child[i]);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* ---------- item 11: /metrics over HTTP ---------- */

/* A free TCP port on 127.0.0.1 (bound and released: the daemon binds it next). */
static int free_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  ck_assert_int_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(getsockname(s, (struct sockaddr *)&a, &l), 0);
  close(s);
  return ntohs(a.sin_port);
}

/* gmlaked --metrics-listen: GET /metrics parses with prometheus_client; the
 * lease latency is a histogram; gmlake_build_info has the version; every
 * sample has the device's UUID label; clients are summed per uid (no pid
 * label); idle cache (whole free chunks) and fragmentation (free bytes in
 * chunks in use) come apart, as the client's allocator reports them. */
START_TEST(test_metrics_http) {
  int port = free_port();
  char extra[128];
  snprintf(extra, sizeof extra, "--limit 32MiB --metrics-listen 127.0.0.1:%d", port);
  start_daemon(extra);
  proc c = client_start();
  ck_assert_str_ne(client_first_line(&c), ""); /* ready */
  /* 3 MiB live in two 2 MiB chunks (1 MiB free inside), then 4 MiB freed: two whole chunks idle */
  const char *cmds[] = {"alloc 3145728", "alloc 4194304", "free 1", "flush", "flush"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    const char *r = client_cmd(&c, "%s", cmds[i]);
    ck_assert_msg(!strncmp(r, "ok", 2), "%s: %s", cmds[i], r);
  }
  /* the report after the free handled: 3 MiB allocated, the two freed chunks idle (one before it said
   * 3 MiB with none idle, or 7 MiB) */
  char o[8192];
  for (int i = 0; i < 1000; i++, msleep(20))
    if (ctl(o, sizeof o, "stats --json") == 0 && json_num(o, "allocated") == 3 << 20 &&
        json_num(o, "idle_cache_bytes") >= 4 << 20)
      break;
  int rc = sh(
      o, sizeof o,
      "/usr/bin/python3 -c '\n"
      "import urllib.request\n"
      "from prometheus_client.parser import text_string_to_metric_families as p\n"
      "t = urllib.request.urlopen(\"http://127.0.0.1:%d/metrics\", timeout=5).read().decode()\n"
      "fams = {f.name: f for f in p(t)}\n"
      "h = fams[\"gmlake_lease_duration_seconds\"]\n"
      "assert h.type == \"histogram\", h.type\n"
      "b = [s for s in h.samples if s.name.endswith(\"_bucket\")]\n"
      "assert [x.value for x in b] == sorted(x.value for x in b), b\n"
      "cnt = [s.value for s in h.samples if s.name.endswith(\"_count\")][0]\n"
      "assert cnt >= 1 and b[-1].labels[\"le\"] == \"+Inf\" and b[-1].value == cnt, (cnt, b[-1])\n"
      "bi = fams[\"gmlake_build_info\"].samples[0]\n"
      "assert bi.labels[\"version\"].count(\".\") == 2 and bi.value == 1, bi\n"
      "allsamples = [s for f in fams.values() for s in f.samples]\n"
      "assert all(s.labels.get(\"gpu_uuid\") == \"host-0\" for s in allsamples)\n"
      "assert not any(\"pid\" in s.labels for s in allsamples)\n"
      "v = lambda n: fams[n].samples[0].value\n"
      "u = {s.labels[\"kind\"]: s.value for s in fams[\"gmlake_user_bytes\"].samples if s.labels[\"uid\"] == \"0\"}\n"
      "assert u[\"allocated\"] == 3 << 20, u\n"
      "print(\"idle\", v(\"gmlake_idle_cache_bytes\"), \"fragment\", v(\"gmlake_fragment_bytes\"), \"cached\", "
      "v(\"gmlake_cached_bytes\"))\n"
      "assert v(\"gmlake_idle_cache_bytes\") >= 4 << 20 and v(\"gmlake_idle_cache_bytes\") %% (2 << 20) == 0\n"
      "assert v(\"gmlake_fragment_bytes\") >= 1 << 20\n"
      "assert v(\"gmlake_idle_cache_bytes\") + v(\"gmlake_fragment_bytes\") == v(\"gmlake_cached_bytes\")\n"
      "' 2>&1",
      port);
  ck_assert_msg(rc == 0, "/metrics: %s", o);
  printf("  /metrics: %s", o);
  ck_assert_int_eq(sh(o, sizeof o, "%s/gmlakectl --control %s stats", bindir, ctl_url), 0);
  ck_assert_msg(strstr(o, "idle ") && strstr(o, "fragmented "), "stats: %s", o);
  /* anything but /metrics: 404 */
  ck_assert_int_eq(
      sh(o, sizeof o,
         "/usr/bin/python3 -c 'import urllib.request, urllib.error\ntry:\n"
         "  urllib.request.urlopen(\"http://127.0.0.1:%d/\", timeout=5)\nexcept urllib.error.HTTPError as e:\n"
         "  print(e.code)' 2>&1",
         port),
      0);
  ck_assert_msg(strstr(o, "404"), "GET /: %s", o);
  client_finish(&c);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* ---------- tryout 2: the /metrics listener against slow and many clients ---------- */

/* A TCP connection to 127.0.0.1:port (blocking, 3 s timeouts), or -1. */
static int tcp_connect(int port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {
      .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct timeval tv = {.tv_sec = 3};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(s, (struct sockaddr *)&a, sizeof a)) {
    close(s);
    return -1;
  }
  return s;
}

/* One HTTP request: the reply's status (200, 404), 0 when the connection
 * closed without one, -1 when none came within 3 s or it did not connect. */
static int http_status(int port, const char *req) {
  int s = tcp_connect(port);
  if (s < 0) return -1;
  char buf[256] = "";
  size_t n = 0;
  ssize_t r = send(s, req, strlen(req), MSG_NOSIGNAL);
  while (r >= 0 && n < sizeof buf - 1 && (r = recv(s, buf + n, sizeof buf - 1 - n, 0)) > 0) n += (size_t)r;
  close(s);
  buf[n] = 0;
  if (r < 0 && n == 0) return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : 0;
  int code = 0;
  return sscanf(buf, "HTTP/1.%*d %d", &code) == 1 ? code : 0;
}

/* 16 connections that never finish their request (a slow client, or any
 * local user, uid nobody too, reopening them every 5 s) left every scrape
 * refused: a connection past the 16 was closed at once. Now the oldest makes
 * room. Garbage, a request over 8 KiB and 100 connections at once leave the
 * daemon serving, over HTTP and the control socket. */
START_TEST(test_metrics_http_slow_clients) {
  int port = free_port();
  char extra[128];
  snprintf(extra, sizeof extra, "--limit 8MiB --prefetch 0 --metrics-listen 127.0.0.1:%d", port);
  start_daemon(extra);
  const char *get = "GET /metrics HTTP/1.0\r\n\r\n";
  int slow[16], fds0 = daemon_fds_settled(), fds = fds0; /* before any HTTP connection */
  ck_assert_int_eq(http_status(port, get), 200);
  /* the daemon closes that connection once its answer is sent (http_status reads only its start) */
  for (int i = 0; i < 1000 && (fds = daemon_fds()) > fds0; i++) msleep(20);
  ck_assert_int_le(fds, fds0);
  for (int i = 0; i < 16; i++) {
    slow[i] = tcp_connect(port);
    ck_assert_int_ge(slow[i], 0);
    ck_assert_int_eq(send(slow[i], "GET /metr", 9, MSG_NOSIGNAL), 9);
  }
  for (int i = 0; i < 1000 && (fds = daemon_fds()) < fds0 + 16; i++) msleep(20); /* the daemon took all 16 */
  ck_assert_int_ge(fds, fds0 + 16);
  ck_assert_msg(http_status(port, get) == 200, "a scrape beside 16 slow connections was refused");
  for (int i = 0; i < 16; i++) close(slow[i]);
  ck_assert_int_eq(http_status(port, "\x01\x02garbage\r\n\r\n"), 404);
  char *big = malloc(9000);
  memset(big, 'a', 8999);
  memcpy(big, "GET /metrics?", 13);
  big[8999] = 0;
  ck_assert_int_eq(http_status(port, big), 0); /* over 8 KiB: closed, no answer */
  free(big);
  int many[100];
  for (int i = 0; i < 100; i++) many[i] = tcp_connect(port);
  ck_assert_msg(http_status(port, get) == 200, "a scrape beside 100 idle connections was refused");
  for (int i = 0; i < 100; i++)
    if (many[i] >= 0) close(many[i]);
  char out[4096];
  ck_assert_int_eq(ctl(out, sizeof out, "stats --json"), 0);
  ck_assert_int_eq(json_num(out, "limit_bytes"), 8 << 20);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* The metrics listener beside sessions flooding at the fd limit: accept() out of fds spun (a CPU at
 * 100% for as long as connections waited in its backlog), then paused until the next tick. With the
 * fd budget the sessions no longer use up the daemon's fds (the daemon refuses them past its share):
 * the listener serves (HTTP 200) while the flood is held, with no busy loop. Where it does meet
 * accept() out of fds ("metrics accept: ", at debug), it pauses as before. */
START_TEST(test_metrics_accept_at_fd_limit) {
  int port = free_port();
  char extra[128];
  /* debug: the metrics listener's accept out of fds is a debug line, the event waited for below */
  snprintf(extra, sizeof extra, "--limit 4MiB --prefetch 0 --metrics-listen 127.0.0.1:%d --log-level debug", port);
  daemon_env = "ulimit -n 48; ";
  start_daemon(extra);
  int s[60], t[20];
  for (int i = 0; i < 60; i++) s[i] = raw_connect(); /* sessions at the daemon's fd limit */
  ck_assert_msg(log_wait_either("accept paused", "for the daemon's fd limit", 20000),
                "the daemon did not reach its fd limit");
  for (int i = 0; i < 20; i++) t[i] = tcp_connect(port); /* into the metrics listener's backlog */
  int held = -1; /* the flood held: sessions and 20 waiting metrics connections; one more scrape is answered */
  for (int i = 0; i < 200 && held != 200; i++, msleep(100)) held = http_status(port, "GET /metrics HTTP/1.0\r\n\r\n");
  ck_assert_msg(held == 200 || log_wait("metrics accept: ", 1), "the metrics listener neither served nor paused: %d",
                held);
  /* the CPU it uses there over a time (the sleep): on a loaded machine longer, never shorter */
  double t0 = daemon_cpu();
  msleep(1000);
  double used = daemon_cpu() - t0;
  for (int i = 0; i < 20; i++)
    if (t[i] >= 0) close(t[i]);
  for (int i = 0; i < 60; i++)
    if (s[i] >= 0) close(s[i]);
  ck_assert_msg(used < 0.3, "daemon used %.2f s of CPU in 1 s with the metrics listener at its fd limit", used);
  ck_assert_int_eq(stat_wait("clients", 0, 20000), 0);
  int code = -1;
  for (int i = 0; i < 200 && code != 200; i++, msleep(100)) code = http_status(port, "GET /metrics HTTP/1.0\r\n\r\n");
  ck_assert_int_eq(code, 200);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* ---------- after issue 13: daemon-restart hand-over, shares ---------- */

/* A connection that says hello as a client after a restart (adopting): the
 * socket, or -1 when it got no hello reply (closed: it is then closed here). */
static int adopting_session(void) {
  int s = raw_connect();
  if (s < 0) return -1;
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__Hello h = GMLAKE__HELLO__INIT;
  h.protocol_version = GML_PROTOCOL_VERSION;
  h.name = "adopter";
  h.adopting = 1;
  env.seq = 1, env.msg_case = GMLAKE__ENVELOPE__MSG_HELLO, env.hello = &h;
  send_env(s, &env, NULL, 0);
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  int ok = r && r->msg_case == GMLAKE__ENVELOPE__MSG_HELLO_REPLY;
  if (r) gmlake__envelope__free_unpacked(r, NULL);
  if (!ok) close(s);
  return ok ? s : -1;
}

static void send_usage(int s, uint64_t seq, const int *fds, int nfds) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  env.seq = seq, env.msg_case = GMLAKE__ENVELOPE__MSG_USAGE, env.usage = &u;
  send_env(s, &env, fds, nfds);
}

/* An adopting connection hands over fd; 1 when the daemon adopted it, 0
 * when it answered with an error and closed the connection. */
static int adopt_one(int fd) {
  int s = adopting_session();
  if (s < 0) return -2;
  Gmlake__Envelope *r;
  Gmlake__Envelope env2 = GMLAKE__ENVELOPE__INIT;
  Gmlake__AdoptRequest a = GMLAKE__ADOPT_REQUEST__INIT;
  uint64_t old = (1ull << 32) | 7;
  a.n_old_ids = 1, a.old_ids = &old;
  env2.seq = 2, env2.msg_case = GMLAKE__ENVELOPE__MSG_ADOPT, env2.adopt = &a;
  send_env(s, &env2, &fd, 1);
  r = recv_env(s, NULL, NULL);
  int adopted = r && r->msg_case == GMLAKE__ENVELOPE__MSG_ADOPT_REPLY;
  int refused = r && r->msg_case == GMLAKE__ENVELOPE__MSG_ERROR && closed_by_daemon(s);
  if (r) gmlake__envelope__free_unpacked(r, NULL);
  if (adopted) { /* the usage report completes the hand-over: it is ours then (handled: a reply after it) */
    send_usage(s, 3, NULL, 0);
    if (raw_round_trip(s, 4)) adopted = 0;
  }
  close(s);
  return adopted ? 1 : refused ? 0 : -3;
}

/* As nobody: hand over what is not a chunk of the lake's; each must be
 * refused. Returns 0, or 10 + which one the daemon adopted. */
static int adopt_foreign(void *arg) {
  (void)arg;
  char path[] = "/tmp/gmlake-sec-file.XXXXXX";
  int file = mkstemp(path); /* a file of its own that it could read again later (after others' data went in) */
  if (file < 0 || ftruncate(file, 2 << 20)) return 2;
  unlink(path);
  char self[64];
  snprintf(self, sizeof self, "/proc/self/fd/%d", file);
  int ro = open(self, O_RDONLY);
  int mfd = memfd_create("gmlake-chunk", MFD_CLOEXEC); /* its own memfd, named as the daemon names chunks */
  if (mfd < 0 || ftruncate(mfd, 2 << 20)) return 3;
  int small = memfd_create("gmlake-chunk", MFD_CLOEXEC);
  if (small < 0 || ftruncate(small, 1 << 20)) return 4;
  int pfd[2];
  if (pipe(pfd)) return 5;
  int cands[] = {file, mfd, small, pfd[0], ro};
  for (int i = 0; i < 5; i++)
    if (adopt_one(cands[i]) != 0) return 10 + i;
  /* a chunk the lake holds (leased to this very process): the lake would count it twice, and lease it twice */
  int s = raw_session("holder");
  uint64_t id;
  int fd;
  if (s < 0 || lease_now(s, 2, 1, &id, &fd) != 1) return 6;
  if (adopt_one(fd) != 0) return 15;
  close(s);
  return 0;
}

/* A client's Adopt hands over only the lake's chunks (a memfd the daemon's
 * uid made, of the chunk size, read-write), none the lake holds already. */
/* A client cannot mint chunks to hand over: a tainted Return of a chunk
 * it was leased (not handed over) is a plain return, and a chunk the lake
 * released to the driver (trimmed, remade) whose fd the client kept is
 * refused as a hand-over (before: lease, return tainted, keep the fd,
 * repeat; then adopt them all: 288 MiB held of a 16 MiB limit, every other
 * user's hand-over refused for the window). */
START_TEST(test_no_minted_adoptions) {
  start_daemon("--limit 16MiB --prefetch 0");
  int s = raw_session("minter");
  ck_assert_int_ge(s, 0);
  uint64_t ids[4];
  int fds[4];
  for (int i = 0; i < 4; i++) ck_assert_int_eq(lease_now(s, 10 + i, 1, ids + i, fds + i), 1);
  send_return_ex(s, 3, ids, 2, 1); /* tainted, though never handed over */
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->msg_case, GMLAKE__ENVELOPE__MSG_RET_REPLY);
  gmlake__envelope__free_unpacked(r, NULL);
  ck_assert_int_eq(stat_num("chunks_remade"), 0); /* a plain return: kept in the lake */
  ck_assert_int_eq(stat_num("chunks_total"), 4);
  ck_assert_int_eq(adopt_one(fds[0]), 0); /* in the lake: refused */
  send_return(s, 4, ids + 2, 2);
  r = recv_env(s, NULL, NULL);
  gmlake__envelope__free_unpacked(r, NULL);
  char out[4096];
  ck_assert_int_eq(ctl(out, sizeof out, "trim"), 0); /* released to the driver; the client kept the fds */
  ck_assert_int_eq(stat_num("chunks_total"), 0);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(adopt_one(fds[i]), 0); /* retired: refused */
  ck_assert_int_eq(stat_num("chunks_total"), 0);
  ck_assert_int_ge(count_log("whose fd the client kept"), 4);
  for (int i = 0; i < 4; i++) close(fds[i]);
  close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

START_TEST(test_adopt_only_lake_chunks) {
  start_daemon("--limit 4MiB --prefetch 0 --socket-mode 0666");
  ck_assert_int_eq(as_uid(NOBODY, adopt_foreign, NULL), 0);
  ck_assert_int_le(stat_num("chunks_total"), 1);       /* the one it leased, nothing adopted */
  ck_assert_int_eq(stat_wait("clients", 0, 20000), 0); /* each refused connection closed (not left spinning the loop) */
  ck_assert_int_ge(count_log("of its adoption"), 6);
  /* a real chunk of a dead daemon's (held by a client: made by this uid, not in the new lake) is adopted */
  ck_assert_int_eq(stop_daemon(), 0);
  start_daemon("--limit 4MiB --prefetch 0 --socket-mode 0666");
  gml_backend *be;
  char msg[256];
  ck_assert_int_eq(gmli_backend_open("host", 0, NULL, &be, msg, sizeof msg), 0);
  gml_phys ph;
  int fd;
  ck_assert_int_eq(be->ops->chunk_create(be, &ph, &fd), 0);
  char self[64];
  snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
  int ro = open(self, O_RDONLY); /* as a share's attacher holds it: read-only */
  ck_assert_int_ge(ro, 0);
  ck_assert_int_eq(adopt_one(ro), 0);
  close(ro);
  ck_assert_int_eq(adopt_one(fd), 1);
  ck_assert_int_eq(stat_num("chunks_total"), 1);
  close(fd);
  be->ops->chunk_release(be, ph);
  gmli_backend_close(be);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* As nobody, allowed to attach the share "ro": its fds must not become
 * writable (not by mmap, not by opening /proc/self/fd/N again). */
static int attach_try_write(void *arg) {
  (void)arg;
  int s = raw_session("attacher");
  if (s < 0) return 2;
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__AttachRequest a = GMLAKE__ATTACH_REQUEST__INIT;
  a.key = "ro@0", a.first = 0, a.count = 1; /* root's share 'ro' */
  env.seq = 2, env.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH, env.attach = &a;
  send_env(s, &env, NULL, 0);
  int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
  Gmlake__Envelope *r = recv_env(s, fds, &nfds);
  if (!r || r->msg_case != GMLAKE__ENVELOPE__MSG_ATTACH_REPLY || nfds != 1) return 3;
  gmlake__envelope__free_unpacked(r, NULL);
  if (mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0) != MAP_FAILED) return 4;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fds[0]);
  int rw = open(path, O_RDWR);
  if (rw >= 0) {
    char *p = mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
    if (p != MAP_FAILED) p[0] = 'X';
    return 5;
  }
  return 0;
}

/* Read-only shares stay read-only for an attacher of another uid. */
START_TEST(test_share_readonly_reopen) {
  start_daemon("--limit 8MiB --prefetch 0 --socket-mode 0666");
  proc p = client_start();
  ck_assert_int_gt(client_ready(&p), 0);
  ck_assert_str_eq(strtok((char *)client_cmd(&p, "grow %d", 4 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&p, "gmap 0 %d", 2 << 20), "ok");
  ck_assert_str_eq(client_cmd(&p, "gtag 0 4242"), "ok");
  ck_assert_str_eq(client_cmd(&p, "share ro %d any", 2 << 20), "ok");
  int rc = as_uid(NOBODY, attach_try_write, NULL);
  ck_assert_msg(rc == 0, "uid %d made the share writable (%d: 4 mmap, 5 reopened read-write)", NOBODY, rc);
  ck_assert_str_eq(client_cmd(&p, "gread 0"), "tag 4242000"); /* gtag K T writes T * 1000 + K everywhere */
  client_finish(&p);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* As nobody: attach "w", detach at once but keep its fd mapped; tell the
 * parent; when told, send back the first word the chunk holds then. */
static int attach_detach_keep(void *arg) {
  int *pipes = arg; /* to parent, from parent */
  int s = raw_session("keeps-after-detach");
  if (s < 0) return 2;
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__AttachRequest a = GMLAKE__ATTACH_REQUEST__INIT;
  a.key = "w@0", a.first = 0, a.count = 1; /* root's share 'w' */
  env.seq = 2, env.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH, env.attach = &a;
  send_env(s, &env, NULL, 0);
  int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
  Gmlake__Envelope *r = recv_env(s, fds, &nfds);
  if (!r || r->msg_case != GMLAKE__ENVELOPE__MSG_ATTACH_REPLY || nfds != 1) return 3;
  gmlake__envelope__free_unpacked(r, NULL);
  Gmlake__Envelope env2 = GMLAKE__ENVELOPE__INIT;
  Gmlake__DetachRequest dq = GMLAKE__DETACH_REQUEST__INIT;
  dq.key = "w@0";
  env2.seq = 3, env2.msg_case = GMLAKE__ENVELOPE__MSG_DETACH, env2.detach = &dq;
  send_env(s, &env2, NULL, 0);
  r = recv_env(s, NULL, NULL);
  if (!r || r->msg_case != GMLAKE__ENVELOPE__MSG_DETACH_REPLY) return 4;
  gmlake__envelope__free_unpacked(r, NULL);
  volatile uint64_t *m = mmap(NULL, 2 << 20, PROT_READ, MAP_SHARED, fds[0], 0);
  if (m == MAP_FAILED) return 5;
  char c;
  if (write(pipes[0], "a", 1) != 1 || read(pipes[1], &c, 1) != 1) return 6;
  uint64_t v = m[0];
  if (write(pipes[0], &v, sizeof v) != sizeof v) return 7;
  return 0;
}

/* An attacher of another uid that detached may still map the share's
 * chunks: when the share ends they are released, never leased again (here
 * the publisher's next chunk would have been that one, with its new bytes
 * visible to the attacher). */
/* restart: the daemon is SIGKILLed and started again between the detach and
 * the share's end: the publisher hands the share's chunks over and publishes
 * them again ("restored"), and the new daemon, which never saw the other
 * user's attach, must still never lease them again (before: the restored
 * share ended like an unshared one and the publisher's next bytes went to
 * the chunk the other user kept) */
static void detached_share_case(int restart) {
  start_daemon("--limit 4MiB --prefetch 0 --socket-mode 0666");
  proc p = client_start();
  ck_assert_int_gt(client_ready(&p), 0);
  ck_assert_str_eq(strtok((char *)client_cmd(&p, "grow %d", 4 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&p, "gmap 0 %d", 2 << 20), "ok");
  ck_assert_str_eq(client_cmd(&p, "gtag 0 1"), "ok");
  ck_assert_str_eq(client_cmd(&p, "share w %d any", 2 << 20), "ok");
  int to_parent[2], to_child[2];
  ck_assert_int_eq(pipe(to_parent), 0);
  ck_assert_int_eq(pipe(to_child), 0);
  pid_t a = fork();
  if (a == 0) {
    int ends[2] = {to_parent[1], to_child[0]};
    if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY)) _exit(99);
    _exit(attach_detach_keep(ends));
  }
  char c;
  ck_assert_int_eq(read(to_parent[0], &c, 1), 1);
  if (restart) {
    kill(daemon_pid, SIGKILL);
    waitpid(daemon_pid, NULL, 0);
    launch_daemon();
    ck_assert_int_eq(stat_wait("shares", 1, 4000), 1); /* published again */
  }
  ck_assert_str_eq(client_cmd(&p, "gdestroy"), "ok"); /* the last mapper the daemon knows of: the share ends */
  ck_assert_int_eq(stat_wait("shares", 0, 2000), 0);
  ck_assert_str_eq(strtok((char *)client_cmd(&p, "grow %d", 4 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&p, "gmap 0 %d", 2 << 20), "ok");
  ck_assert_str_eq(client_cmd(&p, "gtag 0 77"), "ok");
  ck_assert_int_eq(write(to_child[1], "g", 1), 1);
  uint64_t seen = 0;
  ck_assert_int_eq(read(to_parent[0], &seen, sizeof seen), (ssize_t)sizeof seen);
  int st;
  ck_assert_int_eq(waitpid(a, &st, 0), a);
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  ck_assert_msg(seen != 77000, "uid %d read the publisher's new bytes through a share it had detached", NOBODY);
  ck_assert_uint_eq(seen, 1000); /* the share's bytes, which it was allowed to read */
  ck_assert_int_ge(stat_num("chunks_remade"), 1);
  client_finish(&p);
  for (int i = 0; i < 2; i++) close(to_parent[i]), close(to_child[i]);
  ck_assert_int_eq(stop_daemon(), 0);
}

START_TEST(test_detached_share_not_reused) { detached_share_case(0); }
END_TEST

START_TEST(test_detached_share_not_reused_after_restart) { detached_share_case(1); }
END_TEST

/* A share that names one chunk 8,000 times (a 48 KiB frame) is a protocol
 * error, answered at once: the connection is closed (before: ~9 ms of the
 * loop a frame, an "out of memory" reply, and the client went on). */
START_TEST(test_share_duplicate_ids) {
  start_daemon("--limit 4MiB --prefetch 0");
  int s = raw_session("dups");
  ck_assert_int_ge(s, 0);
  uint64_t id;
  int fd;
  ck_assert_int_eq(lease_now(s, 2, 1, &id, &fd), 1);
  close(fd);
  enum { N = 8000 };
  uint64_t *ids = malloc(N * sizeof *ids);
  for (int i = 0; i < N; i++) ids[i] = id;
  double cpu0 = daemon_cpu();
  for (int f = 0; f < 20; f++) {
    Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
    Gmlake__ShareRequest q = GMLAKE__SHARE_REQUEST__INIT;
    q.key = "dups", q.n_chunk_ids = N, q.chunk_ids = ids, q.size = (uint64_t)N << 21;
    env.seq = 3 + (uint64_t)f, env.msg_case = GMLAKE__ENVELOPE__MSG_SHARE, env.share = &q;
    if (send_env(s, &env, NULL, 0)) break; /* closed after the first: fine */
  }
  ck_assert(closed_by_daemon(s));
  double cpu = daemon_cpu() - cpu0;
  printf("  share naming one chunk %d times: connection closed, daemon CPU %.3f s\n", N, cpu);
  ck_assert_int_ge(count_log("share of more chunks than the client holds"), 1);
  free(ids);
  close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A limit over the device's memory starts the daemon (a lake may be sized
 * for a device shared with others) but is said in the log: gmlakectl
 * refuses it, and before, the daemon took it silently. */
START_TEST(test_limit_over_device_said) {
  start_daemon("--limit 4096TiB --prefetch 0");
  ck_assert_int_ge(count_log("is more than the device's memory"), 1);
  ck_assert_int_eq(stop_daemon(), 0);
  start_daemon("--limit 4MiB --prefetch 0");
  ck_assert_int_eq(count_log("is more than the device's memory"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A process that attaches a share, closes its connection and connects again
 * is watched once for that share, not once a connection: each closed
 * connection left a dup of its pidfd in the daemon while the process lived
 * (before: 20,000 attach-and-close connections of one process filled the
 * daemon's fd table, accept paused on EMFILE and no user could connect). */
START_TEST(test_share_mapper_watch_per_process) {
  start_daemon("--limit 4MiB --prefetch 0");
  int s = raw_session("publisher");
  ck_assert_int_ge(s, 0);
  uint64_t id;
  int fd;
  ck_assert_int_eq(lease_now(s, 2, 1, &id, &fd), 1);
  close(fd);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ShareRequest q = GMLAKE__SHARE_REQUEST__INIT;
  q.key = "w", q.n_chunk_ids = 1, q.chunk_ids = &id, q.size = 4096;
  env.seq = 3, env.msg_case = GMLAKE__ENVELOPE__MSG_SHARE, env.share = &q;
  send_env(s, &env, NULL, 0);
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  ck_assert(r && r->msg_case == GMLAKE__ENVELOPE__MSG_SHARE_REPLY);
  gmlake__envelope__free_unpacked(r, NULL);
  int base = daemon_fds_settled();
  for (int i = 0; i < 300; i++) {
    int a = raw_session("attach-and-go");
    ck_assert_int_ge(a, 0);
    Gmlake__Envelope e2 = GMLAKE__ENVELOPE__INIT;
    Gmlake__AttachRequest at = GMLAKE__ATTACH_REQUEST__INIT;
    at.key = "w", at.first = 0, at.count = 1;
    e2.seq = 2, e2.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH, e2.attach = &at;
    send_env(a, &e2, NULL, 0);
    int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
    r = recv_env(a, fds, &nfds);
    ck_assert(r && r->msg_case == GMLAKE__ENVELOPE__MSG_ATTACH_REPLY && nfds == 1);
    gmlake__envelope__free_unpacked(r, NULL);
    close(fds[0]);
    close(a);
  }
  int n = 0;
  for (int t = 0; t < 1000 && (n = daemon_fds()) > base + 8; t++) msleep(20);
  printf("  300 attach-and-close connections of one process: daemon fds %d -> %d\n", base, n);
  ck_assert_msg(n <= base + 8, "the daemon holds %d more fds after 300 connections of one process", n - base);
  close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* The child: connects, hands the connection to the parent (socket sv) and exits. */
static void connect_hand_over_exit(int sv) {
  int c = raw_connect();
  char b = 'x';
  struct iovec iov = {&b, 1};
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET, cm->cmsg_type = SCM_RIGHTS, cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &c, sizeof c);
  _exit(c < 0 || sendmsg(sv, &m, 0) != 1);
}

/* A connection whose connecting process exited before its hello is refused:
 * the daemon reads the pid and cgroup that pid and cgroup quotas bind from
 * that process (before: a process in a cgroup with a quota forked a child
 * that connected, handed it the socket and exited; its cgroup read as "",
 * no cgroup quota covered it and it leased 12 chunks past a quota of 4). */
START_TEST(test_exited_connector_refused) {
  start_daemon("--limit 8MiB --prefetch 0");
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  pid_t pid = fork();
  if (pid == 0) connect_hand_over_exit(sv[1]);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char b;
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {&b, 1};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  ck_assert_int_eq(recvmsg(sv[0], &m, 0), 1);
  int s;
  memcpy(&s, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof s);
  struct timeval tv = {5, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  send_hello(s, "handed-over");
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  ck_assert_msg(!r || r->msg_case != GMLAKE__ENVELOPE__MSG_HELLO_REPLY, "a connection of an exited process was served");
  if (r) {
    ck_assert_int_eq(r->msg_case, GMLAKE__ENVELOPE__MSG_ERROR);
    ck_assert_int_eq(r->error->code, GML_EPERM);
    gmlake__envelope__free_unpacked(r, NULL);
  }
  ck_assert(closed_by_daemon(s));
  ck_assert_int_ge(count_log("the process that connected has exited"), 1);
  int ok = raw_session("alive"); /* a connection of a living process is served as before */
  ck_assert_int_ge(ok, 0);
  close(ok), close(s), close(sv[0]), close(sv[1]);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* One connection of another user: hello, its reply, gone. */
static int one_session(void *arg) {
  (void)arg;
  int s = raw_session("other-user");
  if (s >= 0) close(s);
  return s >= 0 ? 0 : 1;
}

/* A group member connects and breaks the protocol 300 times as fast as it
 * can: the daemon logs at most 40 lines about that user's connections at
 * once and 10 a second after, then one line saying how many it left out;
 * another user's connection is still logged. Before: three lines per
 * connection (connected, the protocol error, left), 900 here, and ~20 MB in
 * 3 s when an attacker tried (attacker trial). */
START_TEST(test_log_budget_per_user) {
  start_daemon("--limit 8MiB --socket-mode 0666");
  double t0 = (double)gmli_now_ns() / 1e6;
  for (int i = 0; i < 300; i++) {
    int s = raw_session("noisy");
    ck_assert_int_ge(s, 0);
    Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
    Gmlake__HelloReply hr = GMLAKE__HELLO_REPLY__INIT; /* the daemon's message, not a client's */
    env.seq = 2;
    env.msg_case = GMLAKE__ENVELOPE__MSG_HELLO_REPLY;
    env.hello_reply = &hr;
    size_t len;
    uint8_t *f = frame_of(&env, &len);
    ck_assert_int_eq(send(s, f, len, MSG_NOSIGNAL), (ssize_t)len);
    free(f);
    ck_assert(closed_by_daemon(s));
    close(s);
  }
  double secs = ((double)gmli_now_ns() / 1e6 - t0) / 1000;
  ck_assert_int_eq(as_uid(NOBODY, one_session, NULL), 0);
  /* a second after the noisy user's last line (dropped), the count of those left out: waited for */
  log_wait("uid 0: ", 20000);
  log_wait("left out", 20000);
  int lines = count_log("noisy") + count_log("protocol error") + count_log("(pid ");
  int allowed = 40 + (int)(10 * (secs + 1.5)) + 1;
  printf("  300 broken connections in %.1f s: %d log lines about them (at most %d)\n", secs, lines, allowed);
  ck_assert_msg(lines <= 3 * allowed, "%d lines", lines); /* each line matches at most three needles */
  ck_assert_msg(count_log("uid 0: ") >= 1 && count_log("left out") >= 1, "no line says how many were left out");
  char want[64];
  snprintf(want, sizeof want, "uid %d (other-user)", NOBODY);
  ck_assert_int_eq(count_log(want), 1); /* another user's connection: logged */
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* n control requests that change the lake (trim) on one connection, as fast
 * as the replies come: 0 when every one was refused (GML_EPERM). */
static int refused_control_requests(void *arg) {
  int n = *(int *)arg, refused = 0;
  nng_socket req;
  if (nng_req0_open(&req) != 0) return 100;
  nng_socket_set_ms(req, NNG_OPT_RECVTIMEO, 3000);
  if (nng_dial(req, ctl_url, NULL, 0) != 0) {
    nng_close(req);
    return 101;
  }
  Gmlake__CtlRequest r = GMLAKE__CTL_REQUEST__INIT;
  Gmlake__TrimRequest t = GMLAKE__TRIM_REQUEST__INIT;
  r.req_case = GMLAKE__CTL_REQUEST__REQ_TRIM;
  r.trim = &t;
  uint8_t buf[64];
  size_t len = gmlake__ctl_request__pack(&r, buf);
  for (int i = 0; i < n; i++) {
    void *in;
    size_t inlen;
    if (nng_send(req, buf, len, 0) != 0 || nng_recv(req, &in, &inlen, NNG_FLAG_ALLOC) != 0) break;
    Gmlake__CtlReply *rep = gmlake__ctl_reply__unpack(NULL, inlen, in);
    nng_free(in, inlen);
    refused += rep && rep->code == GML_EPERM;
    if (rep) gmlake__ctl_reply__free_unpacked(rep, NULL);
  }
  nng_close(req);
  return refused == n ? 0 : 1;
}

/* Refusals in a user's share of the log too: a lease over the limit on a new
 * connection each time (refused at once; the once-a-second bound was per
 * connection), and a group member's control requests that change the lake
 * on one connection. Before, each was a line, however many: 200 + 200 here
 * (new-user trial). */
START_TEST(test_log_budget_refusals) {
  start_daemon("--limit 8MiB --socket-mode 0666");
  double t0 = (double)gmli_now_ns() / 1e6;
  for (int i = 0; i < 200; i++) {
    int s = raw_session("over-the-limit");
    ck_assert_int_ge(s, 0);
    send_lease(s, 2, 64, 0); /* 128 MiB of a lake limited to 8 */
    Gmlake__Envelope *r = recv_env(s, NULL, NULL);
    ck_assert(r && r->msg_case == GMLAKE__ENVELOPE__MSG_ERROR);
    gmlake__envelope__free_unpacked(r, NULL);
    close(s);
  }
  int n = 200;
  ck_assert_int_eq(as_uid(NOBODY, refused_control_requests, &n), 0);
  double secs = ((double)gmli_now_ns() / 1e6 - t0) / 1000;
  /* a second after each user's last line (dropped), the counts of those left out: waited for */
  char nob[32];
  snprintf(nob, sizeof nob, "uid %d: ", NOBODY);
  log_wait("uid 0: ", 20000);
  log_wait(nob, 20000);
  int allowed = 40 + (int)(10 * (secs + 1.5)) + 1;
  int leases = count_log("refused to client"), ctl_lines = count_log("refused: it changes the lake");
  printf("  200 refused leases and 200 refused control requests in %.1f s: %d and %d log lines (at most %d each)\n",
         secs, leases, ctl_lines, allowed);
  ck_assert_msg(leases <= allowed, "%d lines about refused leases", leases);
  ck_assert_msg(ctl_lines <= allowed, "%d lines about refused control requests", ctl_lines);
  ck_assert_int_ge(ctl_lines, 1); /* logged, naming the user */
  char want[64];
  snprintf(want, sizeof want, "of uid %d refused", NOBODY);
  ck_assert_int_ge(count_log(want), 1);
  snprintf(want, sizeof want, "uid %d: ", NOBODY);
  ck_assert_msg(count_log("uid 0: ") >= 1 && count_log(want) >= 1, "no line says how many were left out");
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* The child: moves itself into cgroup dir arg, then as a client leases
 * 2 chunks (its quota) and one more; 0 when the third was refused. */
static int lease_in_cgroup(void *arg) {
  char procs[256];
  snprintf(procs, sizeof procs, "%s/cgroup.procs", (const char *)arg);
  FILE *f = fopen(procs, "w");
  if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f)) return 2;
  int s = raw_session("in-a-child-cgroup");
  uint64_t ids[2];
  int fds[2];
  if (s < 0 || lease_now(s, 2, 2, ids, fds) != 2) return 3;
  send_lease(s, 3, 1, 0);
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  int refused = r && r->msg_case == GMLAKE__ENVELOPE__MSG_ERROR && r->error->code == GML_EQUOTA;
  if (r) gmlake__envelope__free_unpacked(r, NULL);
  return refused ? 0 : 4;
}

/* A cgroup's quota covers the cgroups below it: a process that makes a
 * child cgroup and moves into it (a container or a user's delegated
 * subtree may) stays under its quota. Needs root and a writable cgroup2. */
START_TEST(test_cgroup_quota_covers_children) {
  const char *roots[] = {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"};
  char top[200] = "", inner[256];
  for (int i = 0; i < 2 && !top[0]; i++) {
    char probe[200];
    snprintf(probe, sizeof probe, "%s/cgroup.procs", roots[i]);
    if (geteuid() == 0 && access(probe, W_OK) == 0) {
      snprintf(top, sizeof top, "%s/gmlake-test-%d", roots[i], (int)getpid());
      if (mkdir(top, 0755) != 0) top[0] = 0;
    }
  }
  if (!top[0]) {
    test_not_run("test_cgroup_quota_covers_children", "no writable cgroup2 here");
    return;
  }
  snprintf(inner, sizeof inner, "%s/inner", top);
  ck_assert_int_eq(mkdir(inner, 0755), 0);
  start_daemon("--limit 16MiB --prefetch 8MiB");
  ck_assert_int_eq(stat_wait("chunks_free", 4, 3000), 4); /* a lease of 2 is served whole */
  char args[300], out[1024];
  snprintf(args, sizeof args, "quota cgroup:%s 4MiB", strrchr(top, '/')); /* the v2 path: /gmlake-test-PID */
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  int rc = as_uid(0, lease_in_cgroup, inner);
  int stopped = stop_daemon(), gone = rmdir(inner) == 0 && rmdir(top) == 0; /* before any assertion: no cgroup left */
  ck_assert_msg(rc == 0, "a client in a child cgroup escaped its parent's quota (%d)", rc);
  ck_assert_int_eq(stopped, 0);
  ck_assert(gone);
}
END_TEST

/* The fds an adopting connection sends wait in the daemon for its Adopt: a
 * client may send them with nothing else, and one user's connections may
 * hold only so many hand-overs at once (before: 158 connections of one user,
 * 128 fds each, held 19,907 of the daemon's 20,000 fds). */
START_TEST(test_adopting_fds_bounded) {
  start_daemon("--limit 4MiB --prefetch 0");
  int nul[4];
  for (int i = 0; i < 4; i++) nul[i] = open("/dev/null", O_RDONLY);
  int s = adopting_session();
  ck_assert_int_ge(s, 0);
  send_usage(s, 2, nul, 4); /* fds, and no Adopt: closed */
  ck_assert(closed_by_daemon(s));
  close(s);
  int many[16];
  for (int i = 0; i < 16; i++) ck_assert_msg((many[i] = adopting_session()) >= 0, "hand-over %d refused", i);
  ck_assert_int_eq(adopting_session(), -1); /* the 17th of this user at once */
  ck_assert_int_ge(count_log("too many hand-overs of this user at once"), 1);
  send_usage(many[0], 2, NULL, 0);                 /* its hand-over is over (it had nothing to hand over) */
  ck_assert_int_eq(raw_round_trip(many[0], 3), 0); /* and that is handled */
  int again = adopting_session();
  ck_assert_int_ge(again, 0);
  send_usage(many[0], 3, nul, 1); /* after its hand-over: no fds at all */
  ck_assert(closed_by_daemon(many[0]));
  close(again);
  for (int i = 0; i < 16; i++) close(many[i]);
  for (int i = 0; i < 4; i++) close(nul[i]);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* ---------- the control socket and queued fds: what one client can hold ---------- */

/* A control connection on the socket's raw SP wire (ipc), greeted: the
 * daemon's 8-byte header read, ours sent. -1 when refused or closed. */
static int ctl_raw(int greet) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, ctl_url + 6, strlen(ctl_url + 6) + 1);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct timeval tv = {2, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(s, (struct sockaddr *)&sa, sizeof sa)) {
    close(s);
    return -1;
  }
  uint8_t hdr[8];
  if (greet && (send(s, "\0SP\0\0\x30\0\0", 8, MSG_NOSIGNAL) != 8 || recv(s, hdr, 8, MSG_WAITALL) != 8)) {
    close(s);
    return -1;
  }
  return s;
}

/* Whether the daemon closed s (EOF or reset; what it sent first is drained), waiting up to ms. */
static int ctl_closed_within(int s, int ms) {
  uint64_t end = gmli_now_ns() + (uint64_t)ms * 1000000ull;
  do {
    struct pollfd p = {s, POLLIN, 0};
    if (poll(&p, 1, ms ? 20 : 0) == 1) {
      uint8_t b[256];
      ssize_t r = recv(s, b, sizeof b, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN)) return 1;
    }
  } while (gmli_now_ns() < end);
  return 0;
}

/* As nobody: pipeline `clients` requests on one control connection for
 * 1.5 s and read nothing; then say so on pipe arg[0] and hold the
 * connection until arg[1] closes. Exit: 0, or 2 when it could not connect. */
static int ctl_pipeline(void *arg) {
  int *p = arg;
  int s = ctl_raw(1);
  if (s < 0) return 2;
  /* ipc frame: type 1, 64-bit BE length 6, backtrace 0x80000001, body {field 2 varint 1} (`clients`) */
  static const uint8_t req[15] = {1, 0, 0, 0, 0, 0, 0, 0, 6, 0x80, 0, 0, 1, 0x10, 0x01};
  uint8_t buf[15 * 1024];
  for (size_t i = 0; i < sizeof buf; i += 15) memcpy(buf + i, req, 15);
  uint64_t end = gmli_now_ns() + 1500000000ull;
  long sent = 0;
  while (gmli_now_ns() < end) {
    ssize_t w = send(s, buf, sizeof buf, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) sent += w;
    else if (errno == EAGAIN) msleep(1);
    else break;
  }
  printf("  control pipeline: %ld requests sent, none read\n", sent / 15);
  fflush(stdout);
  char c;
  if (write(p[0], "d", 1) != 1 || read(p[1], &c, 1) < 0) return 3;
  return 0;
}

/* A reader of the control socket (a group member) pipelines requests and
 * reads no reply: the daemon holds one reply at a time for it, its memory
 * stays put, and root is served meanwhile. Before: every request was
 * answered into an unbounded queue (the daemon grew by hundreds of MiB in
 * 1.5 s; 3 GB in 20 s in the report). */
START_TEST(test_control_pipelined_requests) {
  start_daemon("--limit 8MiB --socket-group nogroup");
  long rss0 = daemon_rss_kib(), peak = rss0;
  int done[2], hold[2];
  ck_assert_int_eq(pipe(done), 0);
  ck_assert_int_eq(pipe(hold), 0);
  pid_t child = fork();
  if (child == 0) {
    if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY)) _exit(99);
    close(done[0]), close(hold[1]);
    int p[2] = {done[1], hold[0]};
    _exit(ctl_pipeline(p));
  }
  close(done[1]), close(hold[0]);
  for (;;) { /* sample the daemon's memory until the child has sent all it could */
    struct pollfd pf = {done[0], POLLIN, 0};
    long r = daemon_rss_kib();
    if (r > peak) peak = r;
    if (poll(&pf, 1, 50) == 1) break;
  }
  char c;
  ck_assert_int_eq(read(done[0], &c, 1), 1);
  uint64_t t0 = gmli_now_ns();
  char out[4096];
  ck_assert_int_eq(ctl(out, sizeof out, "stats --json"), 0); /* others are served beside it */
  ck_assert_int_eq(json_num(out, "limit_bytes"), 8 << 20);
  ck_assert_int_eq(ctl(out, sizeof out, "limit 6MiB"), 0);
  double ms = (double)(gmli_now_ns() - t0) / 1e6;
  long r = daemon_rss_kib();
  if (r > peak) peak = r;
  printf("  control pipeline: daemon RSS %ld -> peak %ld KiB; root's stats+limit beside it in %.0f ms\n", rss0, peak,
         ms);
  ck_assert_msg(peak - rss0 < 32 * 1024,
                "daemon grew from %ld to %ld KiB for one control connection that reads nothing", rss0, peak);
  close(hold[1]);
  int st;
  waitpid(child, &st, 0);
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  close(done[0]);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* As nobody: open 70 greeted control connections and hold them; say how
 * many the daemon kept (on pipe arg[0]) after arg[1] says go. */
static int ctl_hold_many(void *arg) {
  int *p = arg, s[70], n = 0;
  for (int i = 0; i < 70; i++) s[n++] = ctl_raw(1);
  char c = 0;
  if (write(p[0], "o", 1) != 1 || read(p[1], &c, 1) != 1) return 2;
  int kept = 0;
  for (int i = 0; i < n; i++) kept += s[i] >= 0 && !ctl_closed_within(s[i], 0);
  uint8_t k = (uint8_t)kept;
  if (write(p[0], &k, 1) != 1 || read(p[1], &c, 1) < 0) return 3;
  return 0;
}

/* A reader holds control connections: at most 8 of one user, and root's
 * gmlakectl gets through; a connection with no SP greeting, or none but a
 * greeting, is closed after hello-timeout-ms. Before: 64 connections in
 * all for everyone, kept forever: nobody's 70 locked root out of
 * gmlakectl stats/limit ("cannot reach the daemon"). */
START_TEST(test_control_slots) {
  start_daemon("--limit 8MiB --socket-group nogroup --hello-timeout-ms 1000");
  int to_parent[2], to_child[2];
  ck_assert_int_eq(pipe(to_parent), 0);
  ck_assert_int_eq(pipe(to_child), 0);
  pid_t child = fork();
  if (child == 0) {
    if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY)) _exit(99);
    close(to_parent[0]), close(to_child[1]);
    int p[2] = {to_parent[1], to_child[0]};
    _exit(ctl_hold_many(p));
  }
  char c;
  ck_assert_int_eq(read(to_parent[0], &c, 1), 1); /* nobody holds its connections */
  char out[4096];
  int stats = ctl(out, sizeof out, "stats --json");
  int limit = ctl(out, sizeof out, "limit 6MiB");
  /* nobody's own gmlakectl, its slots taken: told why (before: "Object closed", nothing more) */
  int own = ctl_as(NOBODY, out, sizeof out, "stats");
  ck_assert_msg(own != 0 && strstr(out, "at most 8 control connections of a user"), "rc %d: %s", own, out);
  ck_assert_int_eq(write(to_child[1], "g", 1), 1);
  uint8_t kept = 0;
  ck_assert_int_eq(read(to_parent[0], &kept, 1), 1);
  printf("  control slots: nobody kept %u of 70 connections; root's stats %d, limit %d\n", kept, stats, limit);
  ck_assert_msg(stats == 0 && limit == 0, "root locked out of gmlakectl (stats %d, limit %d)", stats, limit);
  ck_assert_int_eq(stat_num("limit_bytes"), 6 << 20);
  ck_assert_int_le(kept, 8);
  close(to_child[1]);
  int st;
  waitpid(child, &st, 0);
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  /* silent connections: one says nothing, one only its greeting */
  int mute = ctl_raw(0), greeted = ctl_raw(1);
  ck_assert_int_ge(mute, 0);
  ck_assert_int_ge(greeted, 0);
  uint64_t t0 = gmli_now_ns();
  ck_assert_msg(ctl_closed_within(mute, 3000), "an un-greeted control connection was kept 3 s");
  ck_assert_msg(ctl_closed_within(greeted, 1000), "a control connection with no request was kept");
  printf("  control slots: silent connections closed after %.2f s (hello-timeout-ms 1000)\n",
         (double)(gmli_now_ns() - t0) / 1e9);
  close(mute), close(greeted);
  close(to_parent[0]), close(to_parent[1]), close(to_child[0]);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* As alice: a session, one chunk leased and returned; 0 when served. */
static int lease_one(void *arg) {
  (void)arg;
  int s = raw_session("victim");
  uint64_t id;
  int fd;
  if (s < 0) return 2;
  if (lease_now(s, 2, 1, &id, &fd) != 1) return 3;
  close(fd);
  close(s);
  return 0;
}

/* A client pipelines attaches of its own share (up to 126 fds a reply) and
 * reads nothing, each attach sized to leave the daemon 2 fds at most: the
 * fds the daemon holds for it stay bounded (256 a connection; a quarter of
 * the fd limit for all) and another user is served beside it. Before: each
 * reply dup'ed its fds into the queue (counted as 4 bytes each against
 * send-queue-max), the daemon's fd table filled to its limit, and alice's
 * lease could not be sent (her connection was closed). */
START_TEST(test_queued_fds_bounded) {
  prctl(PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0); /* the daemon cannot raise its fd limit past the one below */
  daemon_env = "ulimit -n 4096; ";
  start_daemon("--limit 300MiB --prefetch 0 --socket-mode 0666");
  char path[64], line[256];
  long limit = 0;
  snprintf(path, sizeof path, "/proc/%d/limits", (int)daemon_pid);
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Max open files", 14)) limit = atol(line + 14);
  if (f) fclose(f);
  ck_assert_int_gt(limit, 1000);
  enum { N = 126 };
  int s = raw_session("sharer");
  ck_assert_int_ge(s, 0);
  uint64_t ids[N];
  int fds[N];
  for (int got = 0, k; got < N; got += k) { /* a lease gets what is made by then */
    ck_assert_int_gt(k = lease_now(s, 2 + (uint64_t)got, (uint32_t)(N - got), ids + got, fds), 0);
    for (int i = 0; i < k; i++) close(fds[i]);
  }
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ShareRequest q = GMLAKE__SHARE_REQUEST__INIT;
  q.key = "mine", q.n_chunk_ids = N, q.chunk_ids = ids, q.size = (uint64_t)N << 21;
  env.seq = 1000, env.msg_case = GMLAKE__ENVELOPE__MSG_SHARE, env.share = &q;
  send_env(s, &env, NULL, 0);
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  ck_assert_msg(r && r->msg_case == GMLAKE__ENVELOPE__MSG_SHARE_REPLY, "share refused");
  gmlake__envelope__free_unpacked(r, NULL);
  int hog = raw_session("hog");
  ck_assert_int_ge(hog, 0);
  int base = daemon_fds_settled(), peak = base, sent = 0;
  Gmlake__Envelope a = GMLAKE__ENVELOPE__INIT;
  Gmlake__AttachRequest ar = GMLAKE__ATTACH_REQUEST__INIT;
  ar.key = "mine", ar.first = 0;
  a.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH, a.attach = &ar;
  for (;;) { /* one attach at a time, until the daemon takes no more of them (or its fds are all but gone) */
    int inq0 = 0, n0 = daemon_fds(), n = n0;
    ioctl(hog, FIONREAD, &inq0);
    int inq = inq0;
    if (limit - n0 <= 2) break;
    ar.count = limit - n0 - 2 < N ? (uint32_t)(limit - n0 - 2) : N;
    a.seq = 2000 + (uint64_t)sent++;
    ck_assert_int_eq(send_env(hog, &a, NULL, 0), 0);
    uint64_t until = gmli_now_ns() + 200000000ull; /* its reply is in our socket, or in the daemon's queue */
    while (gmli_now_ns() < until && n == n0 && inq == inq0) {
      n = daemon_fds();
      ioctl(hog, FIONREAD, &inq);
    }
    if (n == n0 && inq == inq0) break; /* not read any more */
    for (int m = -1; m != n;) {        /* the daemon may be half-way through its dups: until they stand still */
      m = n;
      msleep(2);
      n = daemon_fds();
    }
    if (n > peak) peak = n;
  }
  int victim = as_uid(ALICE_UID, lease_one, NULL);
  printf("  queued fds: limit %ld; %d attaches unread; daemon fds %d before them, peak %d; alice's lease %s\n", limit,
         sent, base, peak, victim == 0 ? "served" : "failed");
  ck_assert_msg(peak - base <= limit / 4, "the daemon held %d fds for a client that does not read (limit %ld)",
                peak - base, limit);
  ck_assert_msg(victim == 0, "another user's lease failed beside it (%d)", victim);
  close(hog);
  close(s);
  ck_assert_int_eq(stat_wait("clients", 0, 3000), 0);
  ck_assert_int_le(daemon_fds(), base); /* the queue's dups closed with it */
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

static int call_env(int s, Gmlake__Envelope *env, Gmlake__Envelope__MsgCase want, char *msg, size_t msglen);

/* Attach key's share on each of the hogs in turn, one attach of 126 chunks at a time, never reading: each
 * until the daemon takes no more of its attaches (neither its fds nor what waits in our socket grows). The
 * peak of the daemon's fds into *peak; how many attaches were sent. */
static int hog_attaches(const int *hogs, int nhogs, const char *key, long limit, int *peak) {
  Gmlake__Envelope a = GMLAKE__ENVELOPE__INIT;
  Gmlake__AttachRequest ar = GMLAKE__ATTACH_REQUEST__INIT;
  ar.key = (char *)key, ar.first = 0;
  a.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH, a.attach = &ar;
  int sent = 0;
  for (int h = 0; h < nhogs; h++) {
    for (;;) {
      int inq0 = 0, n0 = daemon_fds(), n = n0;
      ioctl(hogs[h], FIONREAD, &inq0);
      int inq = inq0;
      if (limit - n0 <= 2) return sent; /* the daemon's fd table is full: no more from anyone */
      ar.count = limit - n0 - 2 < 126 ? (uint32_t)(limit - n0 - 2) : 126;
      a.seq = 2000 + (uint64_t)sent++;
      ck_assert_int_eq(send_env(hogs[h], &a, NULL, 0), 0);
      uint64_t until =
          gmli_now_ns() + 2000000000ull; /* its reply is in our socket, or in the daemon's queue (2 s: 0.2 s ran out
                                                       * on a loaded machine, the budget was not filled and the lease below was served) */
      while (gmli_now_ns() < until && n == n0 && inq == inq0) {
        n = daemon_fds();
        ioctl(hogs[h], FIONREAD, &inq);
      }
      if (n == n0 && inq == inq0) break; /* this one is not served any more: the next hog */
      for (int m = -1; m != n;) {        /* the daemon may be half-way through its dups: until they stand still */
        m = n;
        msleep(2);
        n = daemon_fds();
      }
      if (n > *peak) *peak = n;
    }
  }
  return sent;
}

/* The first Error on s (replies with fds read and closed on the way): its message into msg; 0 when found. */
static int next_error(int s, char *msg, size_t len) {
  for (;;) {
    int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
    Gmlake__Envelope *r = recv_env(s, fds, &nfds);
    for (int i = 0; i < nfds; i++) close(fds[i]);
    if (!r) return -1;
    int err = r->msg_case == GMLAKE__ENVELOPE__MSG_ERROR;
    if (err) snprintf(msg, len, "%s", r->error->message);
    gmlake__envelope__free_unpacked(r, NULL);
    if (err) return 0;
  }
}

/* The queued-fd budgets come from the daemon's real fd limit, and no number of
 * connections passes them: a group member's connections each attach 126
 * chunks and read nothing, and another user's lease is still served; the
 * attaches past the budget are refused with a message that names the limit.
 * Before: a connection with no fd queued was read whatever all queues held,
 * so each of a user's connections queued one more reply past the budget (a
 * quarter of the limit): with a limit of 20,000 the daemon's fd table filled,
 * another user's client was disconnected, its allocations failed, and the log
 * said "device full?". */
START_TEST(test_fd_budget_many_connections) {
  prctl(PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0); /* the daemon cannot raise its fd limit past the one below */
  daemon_env = "ulimit -n 1024; ";
  start_daemon("--limit 300MiB --prefetch 0 --socket-mode 0666");
  char path[64], line[256];
  long limit = 0;
  snprintf(path, sizeof path, "/proc/%d/limits", (int)daemon_pid);
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Max open files", 14)) limit = atol(line + 14);
  if (f) fclose(f);
  ck_assert_int_eq(limit, 1024);
  enum { N = 126, HOGS = 6 };
  int s = raw_session("sharer");
  ck_assert_int_ge(s, 0);
  uint64_t ids[N];
  int fds[N];
  for (int got = 0, k; got < N; got += k) { /* a lease gets what is made by then */
    ck_assert_int_gt(k = lease_now(s, 2 + (uint64_t)got, (uint32_t)(N - got), ids + got, fds), 0);
    for (int i = 0; i < k; i++) close(fds[i]);
  }
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ShareRequest q = GMLAKE__SHARE_REQUEST__INIT;
  q.key = "mine", q.n_chunk_ids = N, q.chunk_ids = ids, q.size = (uint64_t)N << 21;
  env.seq = 1000, env.msg_case = GMLAKE__ENVELOPE__MSG_SHARE, env.share = &q;
  ck_assert_int_eq(call_env(s, &env, GMLAKE__ENVELOPE__MSG_SHARE_REPLY, NULL, 0), 0);
  int hogs[HOGS];
  for (int i = 0; i < HOGS; i++) ck_assert_int_ge(hogs[i] = raw_session("hog"), 0);
  int base = daemon_fds_settled(), peak = base;
  int sent = hog_attaches(hogs, HOGS, "mine", limit, &peak);
  int victim = as_uid(ALICE_UID, lease_one, NULL);
  printf(
      "  fd limit %ld, %d connections attaching: %d attaches unread; daemon fds %d before them, peak %d; alice's lease "
      "%s\n",
      limit, HOGS, sent, base, peak, victim == 0 ? "served" : "failed");
  ck_assert_msg(victim == 0, "another user's lease failed beside them (%d)", victim);
  ck_assert_msg(peak - base <= limit / 4, "the daemon held %d fds for clients that do not read (limit %ld)",
                peak - base, limit);
  /* a lease of theirs is served, but its reply has no room either: its chunks go back unsent */
  long long leased = stat_num("chunks_leased");
  send_lease(hogs[0], 9000, 8, 0);
  /* refused, or not read at all where that connection's unread replies hold its queue (1 or 2 runs of 10
   * beside two busy loops: the number of attaches sent, and so of Errors queued, depends on timing);
   * either way no chunk of it is leased past the budget */
  int lease_refused = stat_wait("leases_refused", 1, 20000) == 1;
  /* served in part is a third outcome (fresh-debian-check's chroot: 2 of the 8 leased, where the
   * budget had room for their fds at that moment): what must hold is that the fds the daemon keeps
   * for these clients stay within their budget, the lease's included */
  long long now_leased = stat_num("chunks_leased");
  int fds_now = daemon_fds();
  ck_assert_msg(now_leased == leased || fds_now - base <= limit / 4,
                "hog 0's lease took %lld chunk(s) and the daemon holds %d fds past its %d before the hogs (limit %ld)",
                now_leased - leased, fds_now - base, base, limit);
  char msg[1024] = "", lease_msg[1024] = "";
  int refused = 0;
  for (int i = 0; i < HOGS && !refused; i++) refused = next_error(hogs[i], msg, sizeof msg) == 0;
  ck_assert_msg(refused, "no attach was refused");
  printf("  refused: %s\n", msg);
  while (lease_refused && !strstr(lease_msg, "chunk(s) refused") &&
         next_error(hogs[0], lease_msg, sizeof lease_msg) == 0) {}
  snprintf(line, sizeof line, "RLIMIT_NOFILE %ld", limit);
  ck_assert_msg(strstr(msg, line), "the refusal does not name the fd limit: %s", msg);
  ck_assert_msg(!lease_refused || (!strncmp(lease_msg, "lease of ", 9) && strstr(lease_msg, line)),
                "the lease's refusal: %s", lease_msg);
  if (!lease_refused) printf("  (hog 0's lease was not read: its unread replies hold its connection)\n");
  ck_assert_int_eq(count_log("device full"), 0);
  /* the connections' share of the table (two fds each): the one past it is refused, naming the limit */
  int conns[100], nconns = 0, last = 0;
  char why[256] = "";
  while (!last && nconns < 100) {
    int c = conns[nconns++] = raw_connect();
    ck_assert_int_ge(c, 0);
    send_hello(c, "many");
    Gmlake__Envelope *r = recv_env(c, NULL, NULL);
    ck_assert_ptr_nonnull(r);
    if ((last = r->msg_case == GMLAKE__ENVELOPE__MSG_ERROR)) snprintf(why, sizeof why, "%s", r->error->message);
    gmlake__envelope__free_unpacked(r, NULL);
  }
  printf("  connection %d refused: %s\n", nconns, why);
  ck_assert_msg(strstr(why, line), "%d connections, the last said: '%s'", nconns, why);
  for (int i = 0; i < nconns; i++) close(conns[i]);
  for (int i = 0; i < HOGS; i++) close(hogs[i]);
  close(s);
  ck_assert_int_eq(stat_wait("clients", 0, 3000), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Whether the daemon's log holds a line that starts with prefix, or any of the bytes in bytes. */
static int log_has_line_start(const char *prefix) {
  char path[128], line[4096];
  snprintf(path, sizeof path, "%s/daemon.log", tmpdir);
  FILE *f = fopen(path, "r");
  int n = 0;
  while (f && fgets(line, sizeof line, f)) n += !strncmp(line, prefix, strlen(prefix));
  if (f) fclose(f);
  return n;
}

static int log_has_byte(int byte) {
  char path[128];
  snprintf(path, sizeof path, "%s/daemon.log", tmpdir);
  FILE *f = fopen(path, "r");
  int c, n = 0;
  while (f && (c = fgetc(f)) != EOF) n += c == byte;
  if (f) fclose(f);
  return n;
}

/* A key that is no share key (a newline, a forged log line, escape codes) is
 * refused as invalid (GML_EINVAL), and what the daemon logs of it, of a
 * process name or of any other client's string, is escaped: no line of its
 * own, no control byte. Before: an attach of "NAME@UID" that named no share
 * was logged raw, so a group member wrote "gmlaked[error] ..." lines of its
 * choosing, and terminal escape codes, into the daemon's log. */
START_TEST(test_attach_key_logged_escaped) {
  start_daemon("--limit 4MiB --prefetch 0");
  int s = raw_session("forger\n12:00:00.000 gmlaked[error] forged name\x1b[31m");
  ck_assert_int_ge(s, 0);
  const char *key = "k\n12:00:00.000 gmlaked[error] forged key line\x1b[2K\x1b]0;title\x07@0";
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__AttachRequest a = GMLAKE__ATTACH_REQUEST__INIT;
  a.key = (char *)key;
  env.seq = 2, env.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH, env.attach = &a;
  char msg[512] = "";
  int rc = call_env(s, &env, GMLAKE__ENVELOPE__MSG_ATTACH_REPLY, msg, sizeof msg);
  printf("  attach of a key with a newline and escape codes: %d, '%s'\n", rc, msg);
  for (int i = 0; i < 1000 && count_log("forged key line") < 1; i++) msleep(20); /* its log line */
  ck_assert_int_ge(count_log("forged key line"), 1);
  ck_assert_msg(!log_has_line_start("12:00:00.000 gmlaked[error] forged"), "a forged line in the log");
  ck_assert_msg(!log_has_byte(0x1b) && !log_has_byte(0x07), "a control byte in the log");
  ck_assert_int_ge(count_log("k\\x0a12:00:00.000 gmlaked[error] forged key line\\x1b[2K"), 1); /* escaped, said */
  ck_assert_msg(rc == GML_EINVAL, "an attach of a key with control bytes: %d '%s'", rc, msg);
  Gmlake__DetachRequest dt = GMLAKE__DETACH_REQUEST__INIT;
  dt.key = (char *)key;
  env.seq = 3, env.msg_case = GMLAKE__ENVELOPE__MSG_DETACH, env.detach = &dt;
  ck_assert_int_eq(call_env(s, &env, GMLAKE__ENVELOPE__MSG_DETACH_REPLY, msg, sizeof msg), GML_EINVAL);
  close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Attach [first, first+count) of key on s: its reply's chunk fds closed; 0 or the error code. */
static int attach_range(int s, uint64_t seq, const char *key, uint32_t first, uint32_t count) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__AttachRequest a = GMLAKE__ATTACH_REQUEST__INIT;
  a.key = (char *)key, a.first = first, a.count = count;
  env.seq = seq, env.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH, env.attach = &a;
  return call_env(s, &env, GMLAKE__ENVELOPE__MSG_ATTACH_REPLY, NULL, 0);
}

/* Detach key on s: the mappers its reply says are left, or -1. */
static long detach_left(int s, uint64_t seq, const char *key) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__DetachRequest d = GMLAKE__DETACH_REQUEST__INIT;
  d.key = (char *)key;
  env.seq = seq, env.msg_case = GMLAKE__ENVELOPE__MSG_DETACH, env.detach = &d;
  send_env(s, &env, NULL, 0);
  Gmlake__Envelope *r = recv_env(s, NULL, NULL);
  long left = r && r->msg_case == GMLAKE__ENVELOPE__MSG_DETACH_REPLY ? (long)r->detach_reply->mappers_left : -1;
  if (r) gmlake__envelope__free_unpacked(r, NULL);
  return left;
}

/* An attacher is a mapper of the share from its first attach that takes
 * chunks, whichever chunk it asks for first: the share lives while it maps
 * them. Before, only an attach from chunk 0 counted one: a client that took
 * chunk 1 alone was no mapper, its publisher's detach ended the share and
 * the chunk it maps went back to the lake, to be leased to another client. */
START_TEST(test_attach_past_chunk0_counts_mapper) {
  start_daemon("--limit 8MiB --prefetch 0");
  int pub = raw_session("publisher"), att = raw_session("attacher");
  ck_assert_int_ge(pub, 0);
  ck_assert_int_ge(att, 0);
  uint64_t ids[2];
  int fds[2];
  for (int got = 0, k; got < 2; got += k) { /* a lease gets what is made by then */
    ck_assert_int_gt(k = lease_now(pub, 10 + (uint64_t)got, (uint32_t)(2 - got), ids + got, fds), 0);
    for (int i = 0; i < k; i++) close(fds[i]);
  }
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ShareRequest q = GMLAKE__SHARE_REQUEST__INIT;
  q.key = "two", q.n_chunk_ids = 2, q.chunk_ids = ids, q.size = 4 << 20;
  env.seq = 3, env.msg_case = GMLAKE__ENVELOPE__MSG_SHARE, env.share = &q;
  ck_assert_int_eq(call_env(pub, &env, GMLAKE__ENVELOPE__MSG_SHARE_REPLY, NULL, 0), 0);
  ck_assert_int_eq(attach_range(att, 2, "two", 1, 1), 0); /* chunk 1 alone */
  long left = detach_left(pub, 4, "two");
  printf("  the publisher detaches beside an attacher of chunk 1 alone: %ld mapper(s) left\n", left);
  ck_assert_msg(left == 1, "the attacher of chunk 1 is no mapper: %ld left after the publisher's detach", left);
  ck_assert_int_eq(stat_num("shares"), 1);
  ck_assert_int_eq(stat_num("chunks_shared"), 2);
  ck_assert_int_eq(detach_left(att, 3, "two"), 0); /* its own detach ends it */
  ck_assert_int_eq(stat_wait("shares", 0, 3000), 0);
  close(att), close(pub);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* ---------- attacker trial 2: other users' pids, the log's per-user share ---------- */

/* The reply to env on s: 0 for a reply of kind want, an Error's code (its message into msg), or -1. */
static int call_env(int s, Gmlake__Envelope *env, Gmlake__Envelope__MsgCase want, char *msg, size_t msglen) {
  send_env(s, env, NULL, 0);
  int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
  Gmlake__Envelope *r = recv_env(s, fds, &nfds);
  for (int i = 0; i < nfds; i++) close(fds[i]);
  int rc = !r ? -1 : r->msg_case == want ? 0 : r->msg_case == GMLAKE__ENVELOPE__MSG_ERROR ? r->error->code : -1;
  if (r && r->msg_case == GMLAKE__ENVELOPE__MSG_ERROR && msg) snprintf(msg, msglen, "%s", r->error->message);
  if (r) gmlake__envelope__free_unpacked(r, NULL);
  return rc;
}

/* Lease a chunk on s and publish it as key (any uid may attach it); 0 or the share's error code. */
static int share_one(int s, uint64_t seq, const char *key, char *msg, size_t msglen) {
  uint64_t id;
  int fd;
  if (lease_now(s, seq, 1, &id, &fd) != 1) return -1;
  close(fd);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ShareRequest r = GMLAKE__SHARE_REQUEST__INIT;
  r.key = (char *)key, r.size = 2 << 20, r.n_chunk_ids = 1, r.chunk_ids = &id, r.allow_any_uid = 1;
  env.seq = seq + 1, env.msg_case = GMLAKE__ENVELOPE__MSG_SHARE, env.share = &r;
  return call_env(s, &env, GMLAKE__ENVELOPE__MSG_SHARE_REPLY, msg, msglen);
}

/* A share key with a '@' is refused by the daemon too (the library refuses it
 * first): "weights@1001" published by another user would read as user
 * 1001's share "weights" in every listing. */
START_TEST(test_share_key_with_at_refused) {
  start_daemon("--limit 4MiB --prefetch 0");
  int s = raw_session("at");
  ck_assert_int_ge(s, 0);
  char key[32];
  snprintf(key, sizeof key, "weights@%u", (unsigned)getuid() + 1);
  ck_assert_int_eq(share_one(s, 2, key, NULL, 0), -1); /* no reply: the connection closed */
  ck_assert(closed_by_daemon(s));
  ck_assert_int_ge(count_log("share key has a '@'"), 1);
  ck_assert_int_eq(stat_num("shares"), 0);
  close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

static int attach_key(int s, uint64_t seq, const char *key) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__AttachRequest a = GMLAKE__ATTACH_REQUEST__INIT;
  a.key = (char *)key, a.first = 0, a.count = 1;
  env.seq = seq, env.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH, env.attach = &a;
  return call_env(s, &env, GMLAKE__ENVELOPE__MSG_ATTACH_REPLY, NULL, 0);
}

static int detach_key(int s, uint64_t seq, const char *key) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__DetachRequest d = GMLAKE__DETACH_REQUEST__INIT;
  d.key = (char *)key;
  env.seq = seq, env.msg_case = GMLAKE__ENVELOPE__MSG_DETACH, env.detach = &d;
  return call_env(s, &env, GMLAKE__ENVELOPE__MSG_DETACH_REPLY, NULL, 0);
}

/* As nobody: attach root's share "pub", say so on arg[0], hold it until arg[1] closes. */
static int attach_and_hold(void *arg) {
  int *p = arg, s = raw_session("other-users-attacher");
  if (s < 0 || attach_key(s, 2, "pub@0")) return 2;
  char c;
  if (write(p[0], "a", 1) != 1 || read(p[1], &c, 1) < 0) return 3;
  return 0;
}

/* Whether text holds the number n as a whole number (not inside another). */
static int has_number(const char *text, long n) {
  char want[24];
  int len = snprintf(want, sizeof want, "%ld", n);
  for (const char *p = text; (p = strstr(p, want)); p++)
    if ((p == text || p[-1] < '0' || p[-1] > '9') && (p[len] < '0' || p[len] > '9')) return 1;
  return 0;
}

/* A publisher that publishes its key again is told who maps the share:
 * its own user's processes by pid, another user's attachers only counted
 * (as the control socket's `shares` shows them). Before: "mapped by pid
 * P1, P2" named every attacher's pid, other users' too (attacker trial 2). */
START_TEST(test_share_exists_hides_other_users) {
  start_daemon("--limit 8MiB --prefetch 0 --socket-mode 0666");
  int s = raw_session("publisher");
  ck_assert_int_ge(s, 0);
  char msg[1024] = "";
  ck_assert_int_eq(share_one(s, 2, "pub", msg, sizeof msg), 0);
  int up[2], down[2];
  ck_assert_int_eq(pipe(up), 0);
  ck_assert_int_eq(pipe(down), 0);
  pid_t child = fork();
  if (child == 0) {
    if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY)) _exit(99);
    close(up[0]), close(down[1]);
    int p[2] = {up[1], down[0]};
    _exit(attach_and_hold(p));
  }
  close(up[1]), close(down[0]);
  char c;
  ck_assert_int_eq(read(up[0], &c, 1), 1);
  ck_assert_int_eq(share_one(s, 4, "pub", msg, sizeof msg), GML_EEXIST);
  printf("  publishing 'pub' again: %s\n", msg);
  ck_assert_msg(!has_number(msg, child), "the error names pid %d of uid %d: %s", (int)child, NOBODY, msg);
  ck_assert_msg(has_number(msg, getpid()) && strstr(msg, "a process of uid 65534"), "%s", msg);
  close(down[1]);
  int st;
  waitpid(child, &st, 0);
  ck_assert_int_eq(WEXITSTATUS(st), 0);
  close(up[0]), close(s);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* As nobody, as fast as it can: publish a chunk and detach it (the share
 * ends) for 1 s; ask the control socket to change the limit 500 times; hand
 * over a file that is no chunk 60 times. Prints what it did on stdout. */
static int log_flooder(void *arg) {
  (void)arg;
  int s = raw_session("flooder"), cycles = 0, asks = 0, adopts = 0;
  if (s < 0) return 2;
  uint64_t seq = 10, end = gmli_now_ns() + 1000000000ull;
  while (gmli_now_ns() < end && share_one(s, seq, "k", NULL, 0) == 0 && detach_key(s, seq + 2, "k") == 0)
    seq += 3, cycles++;
  int c = ctl_raw(1);
  /* ipc frame: type 1, 64-bit BE length 6, backtrace 0x80000001, body {field 5 varint 1} (`limit 1`) */
  static const uint8_t req[15] = {1, 0, 0, 0, 0, 0, 0, 0, 6, 0x80, 0, 0, 1, 0x28, 0x01};
  for (; c >= 0 && asks < 500; asks++) {
    uint8_t hdr[9], body[512];
    if (send(c, req, sizeof req, MSG_NOSIGNAL) != sizeof req || recv(c, hdr, 9, MSG_WAITALL) != 9) break;
    uint64_t n = 0;
    for (int i = 1; i < 9; i++) n = n << 8 | hdr[i];
    if (n > sizeof body || recv(c, body, n, MSG_WAITALL) != (ssize_t)n) break;
  }
  char path[] = "/tmp/gmlake-sec-flood.XXXXXX";
  int file = mkstemp(path);
  unlink(path);
  if (file < 0 || ftruncate(file, 2 << 20)) return 3;
  for (; adopts < 60 && adopt_one(file) == 0; adopts++) {}
  printf("  flooder (uid %d): %d shares published and ended, %d control changes asked, %d foreign hand-overs\n", NOBODY,
         cycles, asks, adopts);
  fflush(stdout);
  return cycles > 50 && asks == 500 && adopts == 60 ? 0 : 4;
}

/* Every line a group member's requests make the daemon write counts in its
 * share of the log (40 at once, 10 a second): a share that ends, a mapper
 * that exits, a control request refused, a hand-over refused. Before, those
 * were written whatever the rate: nobody made ~one line per publish and
 * detach (thousands a second), one per control request refused and one per
 * hand-over of what is no chunk (attacker trial 2). */
START_TEST(test_log_budget_covers_every_line) {
  start_daemon("--limit 8MiB --prefetch 0 --socket-mode 0666");
  double t0 = (double)gmli_now_ns() / 1e9;
  ck_assert_int_eq(as_uid(NOBODY, log_flooder, NULL), 0);
  double secs = (double)gmli_now_ns() / 1e9 - t0;
  /* a second after its last line (dropped), the count of those left out: waited for */
  char nob[32];
  snprintf(nob, sizeof nob, "uid %d: ", NOBODY);
  log_wait(nob, 20000);
  log_wait("left out", 20000);
  int ended = count_log("has no mapper left"), refused = count_log("it changes the lake"),
      adopts = count_log("of its adoption"), shared = count_log("shares 'k'");
  int lines = ended + refused + adopts + shared, allowed = 40 + (int)(10 * (secs + 1.5)) + 1;
  printf("  in %.1f s: %d log lines (%d shares ended, %d shared, %d control refusals, %d hand-overs; at most %d)\n",
         secs, lines, ended, shared, refused, adopts, allowed);
  ck_assert_msg(lines <= allowed, "%d lines about one user's requests in %.1f s (at most %d)", lines, secs, allowed);
  char want[64];
  snprintf(want, sizeof want, "uid %d: ", NOBODY);
  ck_assert_msg(count_log(want) >= 1 && count_log("left out") >= 1, "no line says how many were left out");
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

int main(void) {
  Suite *su = suite_create("security");
  TCase *tc = tcase_create("hostile");
  tcase_set_timeout(tc,
                    120); /* a guard against a hang, not a bound: 60 s ran out beside two busy loops and a make test */
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, test_queued_fd_owned);
  tcase_add_test(tc, test_other_uid_reads_zeros);
  tcase_add_test(tc, test_reachable_chunk_not_leased);
  tcase_add_test(tc, test_passed_fd_holder_reads_nothing);
  tcase_add_test(tc, test_half_closed_client);
  tcase_add_test(tc, test_send_queue_bound);
  tcase_add_test(tc, test_idle_and_partial_timeouts);
  tcase_add_test(tc, test_connection_limits);
  tcase_add_test(tc, test_read_budget_fairness);
  tcase_add_test(tc, test_accept_at_fd_limit);
  tcase_add_test(tc, test_control_stray_connect);
  tcase_add_test(tc, test_control_authorization);
  tcase_add_test(tc, test_second_daemon_refused);
  tcase_add_test(tc, test_daemon_bad_inputs);
  tcase_add_test(tc, test_ctl_bad_inputs);
  tcase_add_test(tc, test_lease_count_64bit);
  tcase_add_test(tc, test_names_escaped);
  tcase_add_test(tc, test_usage_report_bounded);
  tcase_add_test(tc, test_growable_mapped_bounded);
  tcase_add_test(tc, test_late_adopting_hellos_log_bounded);
  tcase_add_test(tc, test_control_oversize_request);
  tcase_add_test(tc, test_adopt_only_lake_chunks);
  tcase_add_test(tc, test_no_minted_adoptions);
  tcase_add_test(tc, test_adopting_fds_bounded);
  tcase_add_test(tc, test_control_pipelined_requests);
  tcase_add_test(tc, test_control_slots);
  tcase_add_test(tc, test_queued_fds_bounded);
  tcase_add_test(tc, test_fd_budget_many_connections);
  tcase_add_test(tc, test_attach_key_logged_escaped);
  tcase_add_test(tc, test_share_readonly_reopen);
  tcase_add_test(tc, test_detached_share_not_reused);
  tcase_add_test(tc, test_detached_share_not_reused_after_restart);
  tcase_add_test(tc, test_share_duplicate_ids);
  tcase_add_test(tc, test_attach_past_chunk0_counts_mapper);
  tcase_add_test(tc, test_share_key_with_at_refused);
  tcase_add_test(tc, test_limit_over_device_said);
  tcase_add_test(tc, test_cgroup_quota_covers_children);
  tcase_add_test(tc, test_share_mapper_watch_per_process);
  tcase_add_test(tc, test_exited_connector_refused);
  tcase_add_test(tc, test_control_hides_other_users);
  tcase_add_test(tc, test_log_budget_per_user);
  tcase_add_test(tc, test_log_budget_refusals);
  if (!getenv("GMLAKE_TEST_NO_PROMETHEUS")) tcase_add_test(tc, test_metrics_http);
  else test_not_run("test_metrics_http", "GMLAKE_TEST_NO_PROMETHEUS is set");
  suite_add_tcase(su, tc);
  TCase *tc2 = tcase_create("trial2"); /* attacker trial 2: CK_RUN_CASE=trial2 runs these alone */
  tcase_set_timeout(tc2, 120);
  tcase_add_checked_fixture(tc2, setup, NULL);
  tcase_add_test(tc2, test_share_exists_hides_other_users);
  tcase_add_test(tc2, test_log_budget_covers_every_line);
  suite_add_tcase(su, tc2);
  TCase *tc3 = tcase_create("try2"); /* tryout 2: CK_RUN_CASE=try2 runs these alone */
  tcase_set_timeout(tc3, 120);
  tcase_add_checked_fixture(tc3, setup, NULL);
  tcase_add_test(tc3, test_metrics_http_slow_clients);
  tcase_add_test(tc3, test_metrics_accept_at_fd_limit);
  suite_add_tcase(su, tc3);
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
