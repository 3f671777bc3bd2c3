/* Failures halfway, on the host backend with a real gmlaked: a dedup whose
 * remap the backend refuses after some chunks were switched (all or
 * nothing: the range keeps its own chunks, or is marked unusable where even
 * the rollback fails), a daemon restart whose hand-over fails after the
 * new daemon took a first batch (nothing counted twice, nothing lost), and
 * two restarts with the middle daemon closing the connection between. The
 * faults are injected in this process: the client's backend ops are
 * replaced by a copy whose map or chunk_export fails on cue. */
#include "client_priv.h"
#include "gmlake.h"
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024ul * 1024ul)

static char bindir[128], tmpdir[64], sock_path[100], ctl_url[128];
static pid_t daemon_pid;

static void msleep(int ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* gmlakectl's stdout for args ("" when it fails). */
static const char *ctl(const char *args) {
  static char out[8192];
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s/gmlakectl --control %s %s 2>/dev/null", bindir, ctl_url, args);
  out[0] = 0;
  FILE *p = popen(cmd, "r");
  if (!p) return out;
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  if (pclose(p) != 0) out[0] = 0;
  return out;
}

static long long num(const char *json, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(json, k);
  return p ? atoll(p + strlen(k)) : -1;
}

typedef struct lake_stats {
  long long total, free, leased, parked, shared, creating;
} lake_stats;

/* The daemon's chunk numbers; they must add up (no chunk lost or counted twice in the lake). */
static lake_stats stats(void) {
  const char *j = ctl("stats --json");
  lake_stats s = {num(j, "chunks_total"),  num(j, "chunks_free"),   num(j, "chunks_leased"),
                  num(j, "chunks_parked"), num(j, "chunks_shared"), num(j, "chunks_creating")};
  ck_assert_msg(s.total >= 0, "no stats from the daemon");
  ck_assert_msg(s.total == s.free + s.leased + s.parked + s.shared + s.creating,
                "stats do not add up: total %lld = free %lld + leased %lld + parked %lld + shared %lld + creating %lld",
                s.total, s.free, s.leased, s.parked, s.shared, s.creating);
  return s;
}

static void daemon_up(const char *extra) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "exec %s/gmlaked --backend host --socket %s --control %s --log-level info %s 2>>%s/daemon.log", bindir,
           sock_path, ctl_url, extra, tmpdir);
  daemon_pid = fork();
  if (daemon_pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 400; i++) {
    if (ctl("stats --json")[0]) return;
    msleep(25);
  }
  ck_abort_msg("daemon did not come up (see %s/daemon.log)", tmpdir);
}

static void daemon_down(int sig) {
  int st;
  if (daemon_pid <= 0) return;
  kill(daemon_pid, sig);
  waitpid(daemon_pid, &st, 0);
  daemon_pid = 0;
}

static void setup(void) {
  const char *b = getenv("BUILD");
  snprintf(bindir, sizeof bindir, "%s", b ? b : "build");
  snprintf(tmpdir, sizeof tmpdir, "/tmp/gmlake-partial.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
  snprintf(sock_path, sizeof sock_path, "%s/lake.sock", tmpdir);
  snprintf(ctl_url, sizeof ctl_url, "ipc://%s/lake.ctl", tmpdir);
}

static void teardown(void) {
  daemon_down(SIGKILL); /* a test that failed halfway */
  char cmd[256];
  snprintf(cmd, sizeof cmd, "%s%s/daemon.log; rm -rf %s", getenv("GMLAKE_TEST_VERBOSE") ? "cat >&2 " : "true ", tmpdir,
           tmpdir);
  if (system(cmd)) {}
}

static gml_client *open_client(void) {
  gml_open_opts o = {.backend = "host", .socket_path = sock_path, .mode = GML_MODE_DAEMON};
  gml_client *c;
  ck_assert_int_eq(gml_open(&o, &c), 0);
  return c;
}

/* ---------- fault injection: a copy of the backend's ops ---------- */

static struct gml_backend_ops faulty;
static const struct gml_backend_ops *real;
static uintptr_t fault_lo, fault_hi;              /* maps into [lo, hi) are counted */
static int map_seen, map_fail_at, map_fail_after; /* fail the map_fail_at-th (1-based); and every later one if after */
static int export_seen, export_fail_at;

static int faulty_map(gml_backend *be, uintptr_t va, gml_phys phys) {
  if (va >= fault_lo && va < fault_hi) {
    int k = ++map_seen;
    if (k == map_fail_at || (map_fail_after && k > map_fail_at)) return GML_EBACKEND;
  }
  return real->map(be, va, phys);
}

static int faulty_export(gml_backend *be, gml_phys phys, int *fd) {
  if (export_fail_at && ++export_seen == export_fail_at) return GML_EBACKEND;
  return real->chunk_export(be, phys, fd);
}

/* The keeper thread runs the backend's ops (a hand-over's exports): the ops
 * and the counters are set under the allocator's lock, which its reconnect
 * takes before it exports (the daemon's kill that starts it orders them too,
 * but no thread sanitizer sees that). */
static void inject(gml_client *c) {
  real = c->be->ops;
  faulty = *real;
  faulty.map = faulty_map;
  faulty.chunk_export = faulty_export;
  c->be->ops = &faulty;
}

static void heal(gml_client *c) { c->be->ops = real; }

/* ---------- dedup ---------- */

static void fill(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 7 + i / 4096);
}

static int same(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (uint8_t)(i * 7 + i / 4096)) return 0;
  return 1;
}

/* The share's mappers (one a connection): the pids listed for key. */
static int mappers(void) {
  const char *j = ctl("shares --json"), *p = strstr(j, "\"mapper_pids\":[");
  if (!p) return -1;
  p += strlen("\"mapper_pids\":[");
  if (*p == ']') return 0;
  int n = 1;
  for (; *p && *p != ']'; p++) n += *p == ',';
  return n;
}

/* A publishes 4 MiB (2 chunks); B has the same bytes in a range of 8 MiB. */
static void dedup_setup(gml_client **a, gml_client **b, gml_growable **gb, uint8_t **pb) {
  daemon_up("--limit 64MiB --prefetch 0");
  *a = open_client(), *b = open_client();
  gml_growable *ga;
  gml_growable_info info;
  int deduped = -1;
  ck_assert_int_eq(gml_growable_create(*a, 4 * MiB, &ga), 0);
  ck_assert_int_eq(gml_growable_ensure(ga, 4 * MiB), 0);
  ck_assert_int_eq(gml_growable_info_get(ga, &info), 0);
  fill(info.base, 4 * MiB);
  ck_assert_int_eq(gml_dedup(ga, 4 * MiB, "weights", 7, &deduped), 0);
  ck_assert_int_eq(deduped, 0); /* published */
  ck_assert_int_eq(gml_growable_create(*b, 8 * MiB, gb), 0);
  ck_assert_int_eq(gml_growable_ensure(*gb, 4 * MiB), 0);
  ck_assert_int_eq(gml_growable_info_get(*gb, &info), 0);
  *pb = info.base;
  fill(*pb, 4 * MiB);
  fault_lo = (uintptr_t)info.base, fault_hi = fault_lo + info.reserved;
  map_seen = 0;
  lake_stats s = stats();
  ck_assert_int_eq(s.shared, 2);
  ck_assert_int_eq(s.leased, 2);
  ck_assert_int_eq(mappers(), 1);
}

/* The backend refuses the second chunk's remap: the first was switched
 * already. All or nothing: B keeps its own chunks (bytes, writable), the
 * attach is undone at the daemon, the error is B's to see; then, the
 * backend well again, the same dedup succeeds. */
START_TEST(test_dedup_remap_fails_halfway) {
  gml_client *a, *b;
  gml_growable *gb;
  uint8_t *pb;
  dedup_setup(&a, &b, &gb, &pb);
  inject(b);
  map_fail_at = 2, map_fail_after = 0;
  int deduped = -1;
  int rc = gml_dedup(gb, 4 * MiB, "weights", 7, &deduped);
  ck_assert_int_eq(rc, GML_EBACKEND);
  ck_assert_int_eq(deduped, 0);
  ck_assert_msg(strstr(gml_last_error(b), "rolled back"), "last error: %s", gml_last_error(b));
  ck_assert_int_eq(map_seen, 4); /* slot 0 theirs, slot 1 refused, slot 0 ours again, slot 1 ours again */
  heal(b);
  ck_assert(same(pb, 4 * MiB));
  pb[0] ^= 0xff, pb[4 * MiB - 1] ^= 0xff; /* writable (a read-only share chunk would be SIGSEGV) */
  pb[0] ^= 0xff, pb[4 * MiB - 1] ^= 0xff;
  gml_stats st;
  ck_assert_int_eq(gml_stats_get(b, &st), 0);
  ck_assert_uint_eq(st.growable_mapped, 4 * MiB);
  ck_assert_uint_eq(st.shared_mapped, 0);
  ck_assert_int_eq(gml_growable_is_mapped(gb, 0), 1);
  ck_assert_int_eq(gml_growable_is_mapped(gb, 2 * MiB), 1);
  lake_stats s = stats();
  ck_assert_int_eq(s.leased, 2); /* B's own, once */
  ck_assert_int_eq(s.shared, 2);
  ck_assert_int_eq(mappers(), 1); /* B's attach was detached */
  /* and the same dedup now goes through */
  ck_assert_int_eq(gml_dedup(gb, 4 * MiB, "weights", 7, &deduped), 0);
  ck_assert_int_eq(deduped, 1);
  ck_assert(same(pb, 4 * MiB));
  s = stats();
  ck_assert_int_eq(s.leased, 0);
  ck_assert_int_eq(mappers(), 2);
  ck_assert_int_eq(gml_close(b), 0);
  ck_assert_int_eq(gml_close(a), 0);
  s = stats(); /* the share stays while this process lives (it mapped it) */
  ck_assert_int_eq(s.leased + s.parked, 0);
  daemon_down(SIGTERM);
}
END_TEST

/* The backend refuses the remap and then the map back too: no rollback.
 * The range is marked unusable (an error says so; ensure refuses it, so no
 * fresh zeroed chunk fills the hole silently), its own chunks are back in
 * the lake (counted once), the attach is undone, destroy works. */
START_TEST(test_dedup_rollback_fails) {
  gml_client *a, *b;
  gml_growable *gb;
  uint8_t *pb;
  dedup_setup(&a, &b, &gb, &pb);
  inject(b);
  map_fail_at = 2, map_fail_after = 1;
  int deduped = -1;
  ck_assert_int_eq(gml_dedup(gb, 4 * MiB, "weights", 7, &deduped), GML_EBACKEND);
  ck_assert_int_eq(deduped, 0);
  ck_assert_msg(strstr(gml_last_error(b), "unusable"), "last error: %s", gml_last_error(b));
  heal(b);
  ck_assert_int_eq(gml_growable_is_mapped(gb, 0), 0);
  ck_assert_int_eq(gml_growable_is_mapped(gb, 2 * MiB), 0);
  ck_assert_int_eq(gml_growable_ensure(gb, 4 * MiB), GML_EBACKEND);
  ck_assert_msg(strstr(gml_last_error(b), "unusable"), "last error: %s", gml_last_error(b));
  ck_assert_int_eq(gml_dedup(gb, 4 * MiB, "weights", 7, &deduped), GML_EBACKEND);
  gml_stats st;
  ck_assert_int_eq(gml_stats_get(b, &st), 0);
  ck_assert_uint_eq(st.growable_mapped, 0);
  ck_assert_uint_eq(st.shared_mapped, 0);
  lake_stats s = stats();
  ck_assert_int_eq(s.leased, 0); /* B's own chunks went back */
  ck_assert_int_eq(s.shared, 2);
  ck_assert_int_eq(mappers(), 1);
  ck_assert_int_eq(gml_growable_destroy(gb), 0);
  ck_assert_int_eq(gml_close(b), 0);
  ck_assert_int_eq(gml_close(a), 0);
  daemon_down(SIGTERM);
}
END_TEST

/* ---------- a daemon restart whose hand-over fails halfway ---------- */

#define HELD 150 /* more than one Adopt batch (128) */

static int reconnects(gml_client *c, long long want_leased) {
  for (int i = 0; i < 600; i++) {
    if (!__atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE) && stats().leased == want_leased) return 1;
    msleep(10);
  }
  return 0;
}

/* The client holds HELD chunks; the daemon is SIGKILLed and started again;
 * the first hand-over fails (how: fail_how) after the daemon took the first
 * batch of 128. Then: nothing of it is parked or counted (the lake adds up,
 * no chunk twice); the client's memory is intact; the next hand-over gives
 * the daemon every chunk once, and the client leases and returns again. */
static void restart_fails_halfway(int fail_how) {
  daemon_up("--limit 1GiB --prefetch 0");
  gml_client *c = open_client();
  void *p;
  ck_assert_int_eq(gml_alloc(c, HELD * 2 * MiB, 0, &p), 0);
  fill(p, HELD * 2 * MiB);
  ck_assert_int_eq(stats().leased, HELD);
  pthread_mutex_lock(&c->alloc.lock);
  inject(c);
  export_seen = 0;
  export_fail_at = fail_how == 0 ? 140 : 0; /* the second batch's 12th chunk cannot be exported */
  pthread_mutex_unlock(&c->alloc.lock);
  daemon_down(SIGKILL);
  /* refused: a daemon whose quota takes the first batch and not the second
   * (128 chunks of 2 MiB); refused, the client keeps its chunks uncounted
   * while that daemon runs, and hands them over to the next one */
  char quota[128];
  snprintf(quota, sizeof quota, "--limit 1GiB --prefetch 0 --quota 'uid:%d 256MiB'", (int)getuid());
  daemon_up(fail_how == 0 ? "--limit 1GiB --prefetch 0" : quota);
  if (fail_how == 1) {
    /* the first hand-over was refused after the daemon took 128; it is
     * tried again every second (and refused again): whatever the moment,
     * nothing of it is parked and the lake holds only a hand-over in flight */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "grep -q 'before its hand-over\\|parked until its process exits' %s/daemon.log", tmpdir);
    int refused = 0;
    for (int i = 0; i < 2000 && !(refused = system(cmd) == 0); i++) msleep(10);
    ck_assert_msg(refused, "the small daemon never saw the refused client leave");
    for (int i = 0; i < 20; i++, msleep(50)) {
      lake_stats s = stats();
      ck_assert_msg(s.parked == 0 && s.total == s.leased && s.leased <= 128,
                    "after the refused hand-over: %lld parked, %lld leased, %lld total (held %d)", s.parked, s.leased,
                    s.total, HELD);
    }
    ck_assert(same(p, HELD * 2 * MiB)); /* the client's memory is all there */
    /* refused, then connected without a hand-over: it says it keeps all of it outside the lake */
    long long uncounted = -1;
    for (int i = 0; i < 2000 && (uncounted = num(ctl("clients --json"), "uncounted")) != (long long)(HELD * 2 * MiB);
         i++)
      msleep(10);
    ck_assert_int_eq(uncounted, HELD * 2 * MiB);
    daemon_down(SIGTERM);
    daemon_up("--limit 1GiB --prefetch 0"); /* a daemon that takes them all */
  }
  ck_assert_msg(reconnects(c, HELD), "the client did not hand its %d chunks over (leased %lld)", HELD, stats().leased);
  lake_stats s = stats();
  ck_assert_int_eq(s.total, HELD); /* each chunk once */
  ck_assert_int_eq(s.parked, 0);
  ck_assert_int_eq(num(ctl("clients --json"), "uncounted"), 0); /* handed over: all counted again */
  if (fail_how == 0) ck_assert_int_ge(export_seen, 140 + HELD); /* the failed hand-over, then a whole one */
  heal(c);
  ck_assert(same(p, HELD * 2 * MiB));
  ck_assert_int_eq(gml_free(c, p), 0);
  size_t released = 0;
  ck_assert_int_eq(gml_trim(c, &released), 0); /* they go back under their new ids: the daemon knows each */
  ck_assert_uint_eq(released, HELD * 2 * MiB);
  s = stats();
  ck_assert_int_eq(s.leased, 0);
  ck_assert_int_eq(s.free, HELD);
  ck_assert_int_eq(gml_close(c), 0);
  daemon_down(SIGTERM);
}

START_TEST(test_restart_export_fails_halfway) { restart_fails_halfway(0); }
END_TEST

START_TEST(test_restart_batch_refused) { restart_fails_halfway(1); }
END_TEST

/* ---------- a running daemon closes a live client's connection ---------- */

#define KEPT 20

/* The client's part, in a child process (its chunks are parked under its
 * pid, freed when it exits): 0 when all went as it should, else the step
 * that failed. It holds KEPT chunks, sends the daemon a frame over the
 * bounds (the daemon closes the connection: a protocol error), reconnects to
 * the same daemon and must not hand its chunks over again: the lake counts
 * them once, parked; its bytes stay; it leases and frees again. */
static int closed_client(void) {
  gml_client *c = open_client();
  void *p, *q;
  if (gml_alloc(c, KEPT * 2 * MiB, 0, &p)) return 2;
  fill(p, KEPT * 2 * MiB);
  if (stats().leased != KEPT) return 3;
  uint8_t bad[4] = {0xff, 0xff, 0xff, 0xff}; /* a frame length over GML_MAX_FRAME */
  pthread_mutex_lock(&c->conn_lock);
  ssize_t w = write(c->sock, bad, sizeof bad);
  pthread_mutex_unlock(&c->conn_lock);
  if (w != (ssize_t)sizeof bad) return 4;
  int back = 0;
  for (int i = 0; i < 600 && !back; i++) { /* the daemon closed it (parked KEPT) and we are connected again */
    msleep(10);
    back = c->link && !__atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE) && stats().parked == KEPT;
  }
  if (!back) return 5;
  msleep(200); /* a hand-over, were one made, is done by now */
  lake_stats s = stats();
  if (s.parked != KEPT || s.leased != 0 || s.total != KEPT) {
    fprintf(stderr, "after the reconnect: %lld parked, %lld leased, %lld total (held %d)\n", s.parked, s.leased,
            s.total, KEPT);
    return 6;
  }
  if (!same(p, KEPT * 2 * MiB)) return 7;
  if (gml_alloc(c, 12 * MiB, 0, &q)) return 8;
  s = stats();
  if (s.leased != 6 || s.total != KEPT + 6) return 9; /* new leases, on the new connection */
  if (gml_free(c, p) || gml_free(c, q)) return 10;
  size_t released = 0;
  if (gml_trim(c, &released) || released != (KEPT + 6) * 2 * MiB) return 11; /* the parked ones: released locally */
  s = stats();
  if (s.leased != 0 || s.parked != KEPT || s.total != KEPT + 6) return 12;
  if (gml_close(c)) return 13;
  return 0;
}

START_TEST(test_closed_by_running_daemon) {
  daemon_up("--limit 1GiB --prefetch 0");
  pid_t pid = fork();
  if (pid == 0) _exit(closed_client());
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the client failed at step %d (see stderr)", WEXITSTATUS(st));
  lake_stats s = stats();
  for (int i = 0; i < 2000 && s.parked; i++, msleep(10)) s = stats();
  ck_assert_int_eq(s.parked, 0); /* the client exited: its parked chunks are back */
  ck_assert_int_eq(s.leased, 0);
  ck_assert_int_eq(s.free, s.total);
  daemon_down(SIGTERM);
}
END_TEST

/* ---------- two restarts, the middle daemon closing the connection ---------- */

/* Connected again after the daemon closed our connection (old_id: our id
 * before; the same daemon gives the next) or after it was killed (old_id 0:
 * the client saw it go, a new daemon's ids start again at 1). */
static int connected_anew(gml_client *c, uint64_t old_id) {
  for (int i = 0; i < 600; i++) {
    if ((!old_id || __atomic_load_n(&c->client_id, __ATOMIC_ACQUIRE) != old_id) &&
        !__atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE))
      return 1;
    msleep(10);
  }
  return 0;
}

/* The daemon SIGKILLed; 1 once the client saw it go. */
static int daemon_killed(gml_client *c) {
  daemon_down(SIGKILL);
  for (int i = 0; i < 600; i++, msleep(10))
    if (__atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE)) return 1;
  return 0;
}

/* `gmlakectl clients --json`'s uncounted of our one client, once it is want (else what it is after 2 s). */
static long long uncounted_is(long long want) {
  long long got = -1;
  for (int i = 0; i < 2000 && (got = num(ctl("clients --json"), "uncounted")) != want; i++) msleep(10);
  return got;
}

/* Daemon A is SIGKILLed under a client holding KEPT chunks and B starts:
 * B adopts them (how 0: B then closes our connection within its
 * adopt-window; 1: past it), or refuses them over a quota (how 2: we keep
 * them uncounted and lease 6 more from B). Then B closes our connection (a
 * frame over the bounds: it parks what it counted under our pid), and B is
 * SIGKILLed and C starts. After each step the lake adds up: B's reconnected
 * client hands nothing over again and says uncounted only what B never
 * counted; C adopts every chunk once. Before, the client compared B's
 * instance with A's (the first hello's): it took B for a restarted daemon
 * and, within the window, handed B the chunks B held parked ("a chunk the
 * lake holds already": refused and closed, again every second, the client
 * never connected); past it, or refused by B before, it reported all it
 * held uncounted, B's parked chunks too (counted twice). */
static void second_restart(int how) {
  daemon_up("--limit 1GiB --prefetch 0");
  gml_client *c = open_client();
  void *p, *q = NULL, *r;
  ck_assert_int_eq(gml_alloc(c, KEPT * 2 * MiB, 0, &p), 0);
  fill(p, KEPT * 2 * MiB);
  ck_assert_int_eq(stats().leased, KEPT);
  ck_assert(daemon_killed(c));
  char b_args[160];
  snprintf(b_args, sizeof b_args, "--limit 1GiB --prefetch 0 %s", how == 1 ? "--adopt-window 1" : "");
  if (how == 2) snprintf(b_args, sizeof b_args, "--limit 1GiB --prefetch 0 --quota 'uid:%d 16MiB'", (int)getuid());
  daemon_up(b_args);
  ck_assert_msg(connected_anew(c, 0), "the client did not connect to B");
  long long b_leased = 0; /* what B counts of ours */
  if (how == 2) {
    ck_assert_int_eq(uncounted_is(KEPT * 2 * MiB), KEPT * 2 * MiB); /* refused: all ours, uncounted */
    ck_assert_int_eq(stats().total, 0);
    ck_assert_int_eq(gml_alloc(c, 12 * MiB, 0, &q), 0); /* leased anew, under the quota */
    b_leased = 6;
  } else {
    ck_assert_msg(reconnects(c, KEPT), "B did not adopt our %d chunks (leased %lld)", KEPT, stats().leased);
    ck_assert_int_eq(uncounted_is(0), 0);
    b_leased = KEPT;
    if (how == 1) msleep(1500); /* past B's adopt-window */
  }
  lake_stats s = stats();
  ck_assert_int_eq(s.leased, b_leased);
  ck_assert_int_eq(s.total, b_leased);
  /* B closes our connection: it parks what it counts under our pid; we come back to B, hand nothing over */
  uint64_t id = c->client_id;
  uint8_t bad[4] = {0xff, 0xff, 0xff, 0xff}; /* a frame length over GML_MAX_FRAME */
  pthread_mutex_lock(&c->conn_lock);
  ck_assert_int_eq(write(c->sock, bad, sizeof bad), (ssize_t)sizeof bad);
  pthread_mutex_unlock(&c->conn_lock);
  ck_assert_msg(connected_anew(c, id), "the client did not connect to B again after B closed its connection");
  msleep(200); /* a hand-over, were one made, is done by now */
  s = stats();
  ck_assert_msg(s.parked == b_leased && s.leased == 0 && s.total == b_leased,
                "B closed our connection: %lld parked, %lld leased, %lld total (B counted %lld)", s.parked, s.leased,
                s.total, b_leased);
  long long kept_out = how == 2 ? (long long)(KEPT * 2 * MiB) : 0; /* what B never counted */
  ck_assert_int_eq(uncounted_is(kept_out), kept_out);
  ck_assert_int_eq(num(ctl("stats --json"), "uncounted"), kept_out);
  ck_assert(same(p, KEPT * 2 * MiB));
  ck_assert_int_eq(gml_alloc(c, 4 * MiB, 0, &r), 0); /* leases on the new connection */
  ck_assert_int_eq(stats().leased, 2);
  /* the second restart: C adopts every chunk we hold, once */
  long long held = KEPT + (how == 2 ? 6 : 0) + 2;
  ck_assert(daemon_killed(c));
  daemon_up("--limit 1GiB --prefetch 0");
  ck_assert_msg(connected_anew(c, 0), "the client did not connect to C");
  ck_assert_msg(reconnects(c, held), "C did not adopt our %lld chunks (leased %lld)", held, stats().leased);
  s = stats();
  ck_assert_int_eq(s.total, held); /* each chunk once, none lost */
  ck_assert_int_eq(s.parked, 0);
  ck_assert_int_eq(uncounted_is(0), 0); /* adopted: all counted again */
  ck_assert_int_eq(num(ctl("stats --json"), "uncounted"), 0);
  ck_assert(same(p, KEPT * 2 * MiB));
  ck_assert_int_eq(gml_free(c, p), 0);
  if (q) ck_assert_int_eq(gml_free(c, q), 0);
  ck_assert_int_eq(gml_free(c, r), 0);
  size_t released = 0;
  ck_assert_int_eq(gml_trim(c, &released), 0); /* they go back under C's ids */
  ck_assert_uint_eq(released, (size_t)held * 2 * MiB);
  s = stats();
  ck_assert_int_eq(s.leased, 0);
  ck_assert_int_eq(s.free, held);
  ck_assert_int_eq(gml_close(c), 0);
  daemon_down(SIGTERM);
}

START_TEST(test_second_restart_closed_in_window) { second_restart(0); }
END_TEST

START_TEST(test_second_restart_closed_past_window) { second_restart(1); }
END_TEST

START_TEST(test_second_restart_after_refusal) { second_restart(2); }
END_TEST

Suite *partial_suite(void) {
  Suite *s = suite_create("partial");
  TCase *tc = tcase_create("failures halfway");
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_dedup_remap_fails_halfway);
  tcase_add_test(tc, test_dedup_rollback_fails);
  tcase_add_test(tc, test_restart_export_fails_halfway);
  tcase_add_test(tc, test_restart_batch_refused);
  tcase_add_test(tc, test_closed_by_running_daemon);
  tcase_add_test(tc, test_second_restart_closed_in_window);
  tcase_add_test(tc, test_second_restart_closed_past_window);
  tcase_add_test(tc, test_second_restart_after_refusal);
  suite_add_tcase(s, tc);
  return s;
}
