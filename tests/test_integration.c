/* Multi-process integration tests on the host backend: a real gmlaked, real
 * client processes (gml-testclient) and gmlakectl, all started as programs. */
#include "skip.h"
#include "gmlake.h"
#include "harness.h"
#include "util.h"
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void setup(void) {
  harness_setup(); /* the tests count 2 MiB chunks (the cuda backend's default is 4 MiB) */
  if (getenv("GMLAKE_TEST_BACKEND")) backend = getenv("GMLAKE_TEST_BACKEND"); /* cuda on a GPU machine */
}

/* (b) bytes written through one client's stitched range are read back by
 * another process through the chunks the lake handed it. */
START_TEST(test_share_between_processes) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start();
  ck_assert_str_eq(strtok((char *)client_first_line(&a), " "), "ready");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 6 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "tag 0 7"), "ok");
  ck_assert_str_eq(client_cmd(&a, "readtags 0"), "tags 7000 7001 7002");
  proc b = client_start();
  client_first_line(&b);
  /* both hold chunks at once */
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 2 << 20), "ok 0");
  ck_assert_int_eq(stat_num("clients"), 2);
  ck_assert_int_eq(client_finish(&a), 0); /* A's three chunks go back to the lake */
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 6 << 20), "ok 1");
  const char *tags = client_cmd(&b, "readtags 1");
  /* B's new range is stitched from A's three chunks, in some order */
  ck_assert_msg(strstr(tags, "7000") && strstr(tags, "7001") && strstr(tags, "7002"), "B read '%s'", tags);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A client maps the daemon's chunks, whatever chunk size it would pick alone
 * (here 2 MiB from the environment, the daemon 4 MiB). */
START_TEST(test_client_takes_daemon_chunk_size) {
  daemon_env = "GMLAKE_CHUNK_SIZE=4MiB ";
  start_daemon("--limit 64MiB --prefetch 0");
  ck_assert_int_eq(stat_num("chunk_size"), 4 << 20);
  proc a = client_start();
  const char *ready = client_first_line(&a);
  ck_assert_msg(strstr(ready, "ready ") == ready && strstr(ready, " 4194304 "), "client said '%s'", ready);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 6 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "tag 0 7"), "ok");
  ck_assert_str_eq(client_cmd(&a, "readtags 0"), "tags 7000 7001");
  ck_assert_int_eq(stat_num("chunks_leased"), 2);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* gml_open in this process with fd 2 in a file: its code, and what it said in said. */
static int open_saying(const char *said_path, char *said, size_t len) {
  gml_open_opts o = {.socket_path = sock_path};
  gml_client *c = NULL;
  fflush(stderr);
  int saved = dup(2), fd = open(said_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  dup2(fd, 2);
  close(fd);
  int rc = gml_open(&o, &c);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  FILE *f = fopen(said_path, "r");
  size_t n = f ? fread(said, 1, len - 1, f) : 0;
  said[n] = 0;
  if (f) fclose(f);
  if (rc == 0) gml_close(c);
  return rc;
}

/* Through a daemon, a backend that does not exist is said to be none (it was
 * "daemon runs the host backend, gpu was asked for"); a real one the daemon
 * does not run is still that; a bad mode or limit refuses before connecting. */
START_TEST(test_bad_environment_with_daemon) {
  start_daemon("--limit 64MiB --prefetch 0");
  char path[128], said[4096];
  snprintf(path, sizeof path, "%s/said", tmpdir);
  setenv("GMLAKE_BACKEND", "gpu", 1);
  ck_assert_int_eq(open_saying(path, said, sizeof said), GML_EINVAL);
  ck_assert_msg(strstr(said, "GMLAKE_BACKEND=gpu: not a backend; it accepts auto, cuda, host") &&
                    !strstr(said, "asked for"),
                "%s", said);
  const char *other = strcmp(backend, "host") ? "host" : "cuda"; /* a real backend the daemon does not run */
  setenv("GMLAKE_BACKEND", other, 1);
  ck_assert_int_eq(open_saying(path, said, sizeof said), GML_ENODEV);
  char want[96];
  snprintf(want, sizeof want, "daemon runs the %s backend, %s was asked for", backend, other);
  ck_assert_msg(strstr(said, want), "%s", said);
  unsetenv("GMLAKE_BACKEND");
  setenv("GMLAKE_MODE", "embeded", 1);
  ck_assert_int_eq(open_saying(path, said, sizeof said), GML_EINVAL);
  ck_assert_msg(strstr(said, "GMLAKE_MODE=embeded: not a mode"), "%s", said);
  unsetenv("GMLAKE_MODE");
  setenv("GMLAKE_LIMIT", "lots", 1);
  ck_assert_int_eq(open_saying(path, said, sizeof said), GML_EINVAL);
  ck_assert_msg(strstr(said, "GMLAKE_LIMIT=lots: not a limit"), "%s", said);
  unsetenv("GMLAKE_LIMIT");
  ck_assert_int_eq(stat_num("clients"), 0);                  /* none of them connected */
  ck_assert_int_eq(open_saying(path, said, sizeof said), 0); /* and with nothing wrong, it does */
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* gmlakectl clients shows what each client did. */
START_TEST(test_clients_numbers) {
  start_daemon("--limit 128MiB");
  proc a = client_start(), b = client_start();
  char ready[256];
  snprintf(ready, sizeof ready, "%s", client_first_line(&a));
  int pid_a = atoi(ready + 6);
  snprintf(ready, sizeof ready, "%s", client_first_line(&b));
  int pid_b = atoi(ready + 6);
  for (int i = 0; i < 3; i++) ck_assert_str_eq(strtok((char *)client_cmd(&a, "alloc %d", 5 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 1 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  ck_assert_str_eq(client_cmd(&b, "flush"), "ok");
  /* both reports handled (a flush only sends one): the lake's sum is all of both clients' */
  ck_assert_int_eq(stat_wait("allocated", (15 << 20) + (1 << 20), 20000), (15 << 20) + (1 << 20));
  char out[8192], key[64];
  ck_assert_int_eq(ctl(out, sizeof out, "clients --json"), 0);
  snprintf(key, sizeof key, "\"pid\":%d,", pid_a);
  const char *ra = strstr(out, key);
  ck_assert_msg(ra != NULL, "pid %d missing from %s", pid_a, out);
  ck_assert_int_eq(json_num(ra, "allocated"), 15 << 20);
  ck_assert_int_ge(json_num(ra, "leased_bytes"), 15 << 20);
  snprintf(key, sizeof key, "\"pid\":%d,", pid_b);
  const char *rb = strstr(out, key);
  ck_assert_ptr_nonnull(rb);
  ck_assert_int_eq(json_num(rb, "allocated"), 1 << 20);
  ck_assert_int_eq(ctl(out, sizeof out, "clients"), 0); /* the table names both */
  snprintf(key, sizeof key, "%d", pid_a);
  ck_assert_ptr_nonnull(strstr(out, key));
  ck_assert_int_eq(ctl(out, sizeof out, "stats --json"), 0);
  ck_assert_int_eq(json_num(out, "allocated"), (15 << 20) + (1 << 20));
  ck_assert_int_eq(ctl(out, sizeof out, "chunks"), 0);
  ck_assert_ptr_nonnull(strstr(out, "A = pid"));
  ck_assert_int_eq(ctl(out, sizeof out, "chunks --json"), 0);
  snprintf(key, sizeof key, "\"owner_pid\":%d}", pid_b);
  ck_assert_ptr_nonnull(strstr(out, key));
  /* watch refreshes stats and clients until stopped */
  char wcmd[512];
  snprintf(wcmd, sizeof wcmd, "timeout 1 %s/gmlakectl --control %s watch --interval 0.2", bindir, ctl_url);
  FILE *w = popen(wcmd, "r");
  size_t wn = fread(out, 1, sizeof out - 1, w);
  out[wn] = 0;
  pclose(w);
  ck_assert_msg(strstr(out, "host backend") || strstr(out, "cuda backend"), "watch printed: %.200s", out);
  snprintf(key, sizeof key, "%d", pid_a);
  ck_assert_ptr_nonnull(strstr(out, key));
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* (c) SIGKILL a client holding chunks: all come back. */
START_TEST(test_sigkill_returns_chunks) {
  start_daemon("--limit 128MiB --prefetch 4MiB");
  proc a = client_start();
  client_first_line(&a);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 20 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 3000), "ok 1");
  long long leased = stat_num("chunks_leased");
  ck_assert_int_ge(leased, 11);
  long long total = stat_num("chunks_total");
  client_kill(&a);
  ck_assert_int_eq(stat_poll("chunks_leased", 0, 200, 25), 0);
  ck_assert_int_eq(stat_num("chunks_parked"), 0);
  ck_assert_int_ge(stat_num("chunks_free"), leased);
  ck_assert_int_ge(stat_num("chunks_total"), total);
  ck_assert_int_eq(stat_num("clients"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A growable range in daemon mode: its chunks are leased as it grows (in
 * place: the base stays, the tags stay) and go back to the lake as it
 * shrinks, where another client gets them; SIGKILL returns the rest. */
START_TEST(test_growable_range) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start();
  client_first_line(&a);
  char base[64], line[256];
  snprintf(base, sizeof base, "%s", client_cmd(&a, "grow %d", 32 << 20));
  ck_assert_msg(!strncmp(base, "ok 0x", 5), "grow said '%s'", base);
  ck_assert_int_eq(stat_num("chunks_leased"), 0); /* reserving maps nothing */
  ck_assert_str_eq(client_cmd(&a, "gensure %d", (5 << 20) + 1), "ok");
  ck_assert_int_eq(stat_num("chunks_leased"), 3);
  for (int k = 0; k < 3; k++) ck_assert_str_eq(client_cmd(&a, "gtag %d 4", k), "ok");
  ck_assert_str_eq(client_cmd(&a, "gensure %d", 12 << 20), "ok");
  ck_assert_int_eq(stat_num("chunks_leased"), 6);
  snprintf(line, sizeof line, "ginfo %s %d %d %d stats 1 %d %d", base + 3, 32 << 20, 12 << 20, 12 << 20, 12 << 20,
           20 << 20);
  ck_assert_str_eq(client_cmd(&a, "ginfo"), line);
  for (int k = 0; k < 3; k++)
    ck_assert_str_eq(client_cmd(&a, "gread %d", k), k == 0 ? "tag 4000" : k == 1 ? "tag 4001" : "tag 4002");
  /* the daemon knows it from the usage report: gmlakectl stats and clients show it */
  ck_assert_int_eq(stat_poll("growable_mapped", 12 << 20, 40, 25), 12 << 20);
  ck_assert_int_eq(stat_num("growable_unmapped"), 20 << 20);
  char cout[4096];
  ck_assert_int_eq(ctl(cout, sizeof cout, "clients --json"), 0);
  ck_assert_int_eq(json_num(cout, "growable_mapped"), 12 << 20);
  ck_assert_int_eq(json_num(cout, "growable_unmapped"), 20 << 20);
  ck_assert_int_eq(ctl(cout, sizeof cout, "stats"), 0);
  ck_assert_msg(strstr(cout, "growable  12.00 MiB mapped, 20.00 MiB reserved but unmapped"), "stats: %s", cout);
  ck_assert_msg(strstr(cout, "fragmentation 0.00%"), "growable chunks are in use, not fragmentation: %s", cout);
  /* metrics: gauges in bytes (they were counters gmlake_growable_*_total, and they go down below) */
  static char mout[32768];
  ck_assert_int_eq(ctl(mout, sizeof mout, "metrics"), 0);
  ck_assert_msg(strstr(mout, "# TYPE gmlake_growable_mapped_bytes gauge\n") &&
                    strstr(mout, "# TYPE gmlake_growable_unmapped_bytes gauge\n") &&
                    !strstr(mout, "gmlake_growable_mapped_total"),
                "metrics: %s", mout);
  /* the label is the GPU's UUID on cuda, host-N on the host backend (a 32 KiB message is too long for check) */
  const char *gm = strstr(mout, "gmlake_growable_mapped_bytes{device=\"0\",gpu_uuid=\""),
             *gu = strstr(mout, "gmlake_growable_unmapped_bytes{device=\"0\",gpu_uuid=\"");
  ck_assert_msg(gm && gu && !strncmp(strchr(gm, '}'), "} 12582912\n", 11) &&
                    !strncmp(strchr(gu, '}'), "} 20971520\n", 11),
                "metrics: %.2000s", gm ? gm : mout);
  ck_assert_str_eq(client_cmd(&a, "gmap %d %d", 30 << 20, 2 << 20), "ok"); /* a chunk at the far end */
  ck_assert_int_eq(stat_num("chunks_leased"), 7);
  ck_assert_str_eq(client_cmd(&a, "gmap %d %d", 1, 2 << 20),
                   "err -3 growable range: offset 1 / length 2097152 not chunk-aligned (chunks of 2097152)");
  ck_assert_str_eq(client_cmd(&a, "gmap %d %d", 32 << 20, 2 << 20),
                   "err -3 growable range: offset 33554432 / length 2097152 past the end (33554432 bytes)");
  /* shrink to 2 chunks: the other 5 go back to the lake */
  ck_assert_str_eq(client_cmd(&a, "gshrink %d", 4 << 20), "ok");
  ck_assert_int_eq(stat_num("chunks_leased"), 2);
  ck_assert_int_eq(stat_num("chunks_free"), 5);
  ck_assert_str_eq(client_cmd(&a, "gread 2"), "unmapped");
  ck_assert_str_eq(client_cmd(&a, "gread 1"), "tag 4001");
  /* another client gets them, with A's bytes still in them */
  proc b = client_start();
  client_first_line(&b);
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 10 << 20), "ok 0");
  ck_assert_int_eq(stat_num("chunks_free"), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 7);
  ck_assert_int_eq(client_finish(&b), 0);
  /* the lake is full (64 MiB = 32 chunks) past what the limit allows: all or nothing */
  ck_assert_str_eq(client_cmd(&a, "gensure %d", 32 << 20), "ok");
  ck_assert_int_eq(stat_num("chunks_leased"), 16);
  ck_assert_str_eq(client_cmd(&a, "gread 1"), "tag 4001");
  client_kill(&a);
  ck_assert_int_eq(stat_poll("chunks_leased", 0, 200, 25), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* The lake's limit binds a range too: a map the lake cannot serve whole maps nothing. */
START_TEST(test_growable_over_limit) {
  start_daemon("--limit 8MiB --prefetch 0");
  proc a = client_start();
  client_first_line(&a);
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "grow %d", 64 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&a, "gensure %d", 6 << 20), "ok");
  const char *r = client_cmd(&a, "gensure %d", 12 << 20);
  ck_assert_msg(!strncmp(r, "err -1 ", 7), "gensure over the limit said '%s'", r);
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "ginfo"), " "), "ginfo");
  ck_assert_int_eq(stat_num("chunks_leased"), 3); /* the chunk it got was given back */
  ck_assert_str_eq(client_cmd(&a, "gdestroy"), "ok");
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

static void share_tags(proc *p, int n, int token) {
  for (int k = 0; k < n; k++) ck_assert_str_eq(client_cmd(p, "gtag %d %d", k, token), "ok");
}

/* gml_share / gml_attach across processes: the chunks move from the
 * publisher's lease to the share (counted once), an attacher reads the same
 * bytes read-only (a write kills the child that tries; the fd cannot be made
 * writable), the publisher's mapping is read-only too, and the chunks stay
 * while any process maps them: the publisher leaving does not free them, the
 * last mapper's SIGKILL does. */
START_TEST(test_share_attach) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start(), b = client_start(), c = client_start();
  int pid_a = client_ready(&a), pid_b = client_ready(&b);
  client_ready(&c);
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "grow %d", 16 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&a, "gensure %d", 8 << 20), "ok");
  share_tags(&a, 3, 5);
  ck_assert_int_eq(stat_num("chunks_leased"), 4);
  ck_assert_str_eq(client_cmd(&a, "share weights %d", (5 << 20) + 7), "ok"); /* 3 chunks; the 4th goes back */
  ck_assert_int_eq(stat_num("chunks_shared"), 3);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stat_num("shares"), 1);
  /* what the daemon would refuse as a protocol error (closing the connection: GML_EDAEMON, "daemon
   * unreachable or gone", the range's chunks parked) the library refuses first, saying what is wrong */
  ck_assert_str_eq(strtok((char *)client_cmd(&c, "grow %d", 4 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&c, "gensure %d", 2 << 20), "ok");
  char longkey[201];
  memset(longkey, 'k', 200), longkey[200] = 0;
  ck_assert_str_eq(client_cmd(&c, "share %s %d", longkey, 2 << 20),
                   "err -3 gml_share: a key of 200 bytes: a key is 1 to 127 bytes of '!' to '~'");
  ck_assert_str_eq(client_cmd(&c, "share many %d uids:65", 2 << 20),
                   "err -3 gml_share 'many': 65 allow_uids, at most 64 (or allow_any_uid)");
  ck_assert_str_eq(client_cmd(&c, "share big %d", 6 << 20),
                   "err -3 gml_share: size 6291456: 1 to the range's 4194304 bytes");
  ck_assert_str_eq(client_cmd(&c, "attach"), "err -3 gml_attach: key is NULL or empty");
  /* a published key has no '@': "weights@1001" would read as user 1001's share "weights" */
  ck_assert_str_eq(client_cmd(&c, "share weights@1001 %d", 2 << 20),
                   "err -3 gml_share: the key 'weights@1001' has a '@': NAME@UID names user UID's share NAME, so a "
                   "published key has none");
  /* an attach's key too, where the daemon said only "no share" (GML_ENOENT) for a key with a space or of
   * 200 bytes; NAME@UID (another user's share) passes with NAME up to 127 bytes, and the daemon answers */
  ck_assert_str_eq(client_cmd(&c, "attach %s", longkey), "err -3 gml_attach: a key of 200 bytes: a key is 1 to 127 "
                                                         "bytes of '!' to '~' (another user's share: NAME@UID)");
  ck_assert_str_eq(client_cmd(&c, "attach we ights"),
                   "err -3 gml_attach: the key's byte 2 is 0x20: a key is 1 to 127 "
                   "bytes of '!' to '~' (no space, tab or control) (another user's share: NAME@UID)");
  char named[160];
  snprintf(named, sizeof named, "%.127s@%u", longkey, (unsigned)getuid());
  ck_assert_msg(!strncmp(client_cmd(&c, "attach %s", named), "err -13 attach: no share ", 25), "%s",
                client_cmd(&c, "attach %s", named));
  ck_assert_int_eq(stat_num("protocol_errors"), 0);
  ck_assert_str_eq(client_cmd(&c, "share many %d uids:64", 2 << 20), "ok"); /* the same connection */
  ck_assert_str_eq(client_cmd(&c, "gdestroy"), "ok");
  ck_assert_str_eq(client_cmd(&a, "share again %d", 2 << 20), "err -3 range already shared as 'weights'");
  ck_assert_str_eq(client_cmd(&a, "gensure %d", 10 << 20),
                   "err -3 growable range: shared as 'weights': read-only, its chunks are the share's");
  ck_assert_str_eq(client_cmd(&a, "gwrite 0"), "fault"); /* the publisher cannot write it either */
  ck_assert_str_eq(client_cmd(&b, "attach weights"), "ok 5242887");
  for (int k = 0; k < 3; k++) {
    char want[32];
    snprintf(want, sizeof want, "tag %d", 5000 + k);
    ck_assert_str_eq(client_cmd(&b, "aread %d", k), want);
  }
  ck_assert_str_eq(client_cmd(&b, "awrite 1"), strcmp(backend, "host") ? "fault" : "fault protected");
  ck_assert_str_eq(client_cmd(&b, "aread 1"), "tag 5001");
  ck_assert_str_eq(strtok((char *)client_cmd(&c, "attach nothing"), " "), "err");
  char out[4096], key[64];
  ck_assert_int_eq(ctl(out, sizeof out, "shares --json"), 0);
  ck_assert_msg(strstr(out, "\"key\":\"weights\",\"size\":5242887,\"chunks\":3"), "shares: %s", out);
  snprintf(key, sizeof key, "%d", pid_b);
  ck_assert_msg(strstr(out, key), "pid %d not among the mappers: %s", pid_b, out);
  snprintf(key, sizeof key, "\"publisher_pid\":%d", pid_a);
  ck_assert_ptr_nonnull(strstr(out, key));
  ck_assert_int_eq(ctl(out, sizeof out, "shares"), 0);
  ck_assert_msg(strstr(out, "weights") && strstr(out, "same uid"), "shares table: %s", out);
  ck_assert_int_eq(ctl(out, sizeof out, "clients --json"), 0);
  snprintf(key, sizeof key, "\"pid\":%d,", pid_b);
  ck_assert_int_eq(json_num(strstr(out, key), "shared_bytes"), 6 << 20);
  /* the publisher leaves: B still maps them */
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stat_num("chunks_shared"), 3);
  ck_assert_str_eq(client_cmd(&b, "aread 2"), "tag 5002");
  /* the key stays the share's while B maps it, and the refusal says who holds it */
  ck_assert_str_eq(strtok((char *)client_cmd(&c, "grow %d", 4 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&c, "gensure %d", 2 << 20), "ok");
  const char *dup = client_cmd(&c, "share weights %d", 2 << 20);
  char want_pub[64], want_map[64];
  snprintf(want_pub, sizeof want_pub, "published by pid %d (which no longer maps it)", pid_a);
  snprintf(want_map, sizeof want_map, "mapped by pid %d", pid_b);
  ck_assert_msg(strstr(dup, "share 'weights' exists") && strstr(dup, want_pub) && strstr(dup, want_map), "%s", dup);
  ck_assert_str_eq(client_cmd(&c, "gdestroy"), "ok");
  /* a second attacher, then detach: still B */
  ck_assert_str_eq(client_cmd(&c, "attach weights"), "ok 5242887");
  ck_assert_str_eq(client_cmd(&c, "adetach"), "ok");
  ck_assert_int_eq(stat_num("chunks_shared"), 3);
  /* the last mapper is killed: the chunks go back to the lake */
  client_kill(&b);
  ck_assert_int_eq(stat_poll("chunks_shared", 0, 200, 25), 0);
  ck_assert_int_eq(stat_num("shares"), 0);
  ck_assert_int_ge(stat_num("chunks_free"), 4);
  /* and they serve a lease again */
  ck_assert_str_eq(client_cmd(&c, "alloc %d", 8 << 20), "ok 0");
  ck_assert_int_eq(client_finish(&c), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* gml_dedup publishes under a key of the whole hash: hashes that share their
 * first 32 bytes (and differ past them) are two shares, hex keys up to 60
 * bytes, base64url past them (the key was the hex of the first 32 bytes
 * only: the second's publish found that key taken and its dedup failed). */
START_TEST(test_dedup_key_whole_hash) {
  start_daemon("--limit 64MiB --prefetch 0");
  const char *p32 = "0123456789abcdef0123456789abcdef",
             *p63 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde";
  char hashes[4][80];
  snprintf(hashes[0], sizeof hashes[0], "%s-one", p32);
  snprintf(hashes[1], sizeof hashes[1], "%s-two", p32);
  snprintf(hashes[2], sizeof hashes[2], "%sX", p63); /* 64 bytes: the most a hash may have */
  snprintf(hashes[3], sizeof hashes[3], "%sY", p63);
  proc c[4];
  for (int i = 0; i < 4; i++) {
    c[i] = client_start();
    client_ready(&c[i]);
    ck_assert_str_eq(strtok((char *)client_cmd(&c[i], "grow %d", 8 << 20), " "), "ok");
    ck_assert_str_eq(client_cmd(&c[i], "gensure %d", 4 << 20), "ok");
    share_tags(&c[i], 2, 20 + i); /* four different contents */
    const char *r = client_cmd(&c[i], "dedup %d %s", 4 << 20, hashes[i]);
    ck_assert_msg(!strcmp(r, "ok deduped 0"), "dedup with hash %s: '%s'", hashes[i], r);
  }
  ck_assert_int_eq(stat_num("chunks_shared"), 8);
  char out[8192], key[160];
  ck_assert_int_eq(ctl(out, sizeof out, "shares --json"), 0);
  for (int i = 0; i < 2; i++) { /* hex of the whole 36 bytes */
    int k = snprintf(key, sizeof key, "\"key\":\"dedup-");
    for (const char *h = hashes[i]; *h; h++) k += snprintf(key + k, sizeof key - (size_t)k, "%02x", (unsigned char)*h);
    snprintf(key + k, sizeof key - (size_t)k, "\"");
    ck_assert_msg(strstr(out, key), "no share %s in %s", key, out);
  }
  /* base64url of the 64 bytes: 86 characters, the last two of 'X' and 'Y' differ */
  ck_assert_msg(strstr(out, "\"key\":\"dedup-b64-"
                            "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWYwMTIzNDU2Nzg5YWJjZGVmMDEyMzQ1Njc4OWFiY2RlWA\""),
                "no base64 key of hash 3 in %s", out);
  ck_assert_msg(strstr(out, "\"key\":\"dedup-b64-"
                            "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWYwMTIzNDU2Nzg5YWJjZGVmMDEyMzQ1Njc4OWFiY2RlWQ\""),
                "no base64 key of hash 4 in %s", out);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(client_finish(&c[i]), 0);
  ck_assert_int_eq(stat_num("chunks_shared"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* gml_dedup: the first publishes, a second with the same bytes maps the
 * first's chunks in place (its own go back), a third whose bytes differ
 * under the same hash (a forced collision) is refused and keeps its own. */
START_TEST(test_dedup) {
  start_daemon("--limit 64MiB --prefetch 0");
  proc a = client_start(), b = client_start(), c = client_start();
  client_ready(&a), client_ready(&b), client_ready(&c);
  proc *all[3] = {&a, &b, &c};
  for (int i = 0; i < 3; i++) {
    ck_assert_str_eq(strtok((char *)client_cmd(all[i], "grow %d", 8 << 20), " "), "ok");
    ck_assert_str_eq(client_cmd(all[i], "gensure %d", 4 << 20), "ok");
    share_tags(all[i], 2, i == 2 ? 8 : 7);
  }
  ck_assert_int_eq(stat_num("chunks_leased"), 6);
  ck_assert_str_eq(client_cmd(&a, "dedup %d hash-of-the-weights", 4 << 20), "ok deduped 0");
  ck_assert_int_eq(stat_num("chunks_shared"), 2);
  ck_assert_str_eq(client_cmd(&b, "dedup %d hash-of-the-weights", 4 << 20), "ok deduped 1");
  ck_assert_int_eq(stat_num("chunks_shared"), 2);
  ck_assert_int_eq(stat_num("chunks_leased"), 2); /* only C's: B's own copy went back */
  ck_assert_str_eq(client_cmd(&b, "gread 1"), "tag 7001");
  ck_assert_str_eq(client_cmd(&b, "gwrite 0"), strcmp(backend, "host") ? "fault" : "fault protected");
  const char *r = client_cmd(&c, "dedup %d hash-of-the-weights", 4 << 20);
  ck_assert_msg(!strncmp(r, "err -15 ", 8), "a collision was not refused: '%s'", r);
  ck_assert_str_eq(client_cmd(&c, "gread 0"), "tag 8000"); /* C keeps its own, writable */
  /* (the test client writes with the CPU: device memory faults on cuda whatever its access) */
  ck_assert_str_eq(client_cmd(&c, "gwrite 0"), strcmp(backend, "host") ? "fault" : "wrote");
  ck_assert_int_eq(stat_num("chunks_leased"), 2);
  char out[4096];
  ck_assert_int_eq(ctl(out, sizeof out, "shares --json"), 0);
  ck_assert_msg(strstr(out, "\"key\":\"dedup-"), "shares: %s", out);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(client_finish(all[i]), 0);
  ck_assert_int_eq(stat_num("chunks_shared"), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Only the publisher's uid may attach, unless it allows others: a process
 * of another user is refused, then let in by a share that allows any uid
 * (and still cannot write). Keys are per user: another user's share is
 * named NAME@UID, and a user who publishes a name first does not feed the
 * attachers of another user who use it. Needs root (to run a client as nobody). */
START_TEST(test_share_other_user) {
  if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
    test_skip("test_share_other_user", "needs root and setpriv");
    return;
  }
  start_daemon("--limit 64MiB --prefetch 0 --socket-mode 0666");
  ck_assert_int_eq(chmod(tmpdir, 0711), 0);
  proc a = client_start();
  client_ready(&a);
  proc n;
  int pid_n = client_start_nobody(&n, "test_share_other_user");
  if (!pid_n) {
    client_finish(&a), stop_daemon();
    return;
  }
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "grow %d", 8 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&a, "gensure %d", 2 << 20), "ok");
  share_tags(&a, 1, 3);
  ck_assert_str_eq(client_cmd(&a, "share mine %d", 2 << 20), "ok");
  { /* a share nobody may attach reads as one that does not exist: no user learns another's share
     * names by trying them (before: GML_EPERM for an existing name, GML_ENOENT for a made-up one) */
    char r[256], none[256];
    snprintf(r, sizeof r, "%s", client_cmd(&n, "attach mine@0")); /* root's 'mine' */
    snprintf(none, sizeof none, "%s", client_cmd(&n, "attach mina@0"));
    ck_assert_msg(!strncmp(r, "err -13 ", 8), "another user attached, or learnt the name exists: '%s'", r);
    ck_assert_msg(!strncmp(none, "err -13 ", 8) && strstr(r, "that uid 65534 may attach"), "'%s' / '%s'", r, none);
    char *m = strstr(r, "mine@0"), *x = strstr(none, "mina@0");
    ck_assert_msg(m && x && !strcmp(m + 6, x + 6), "the replies differ past the name: '%s' / '%s'", r, none);
    /* both logged (a tryout timed the refusal's log line: without one for a missing name, a refusal
     * took ~0.13 ms longer and told an existing name from a made-up one) */
    char out[1024];
    ck_assert_msg(!sh(out, sizeof out, "grep -q \"may not attach share 'mine' of uid 0\" %s/daemon.log", tmpdir),
                  "the refusal is not logged");
    ck_assert_msg(!sh(out, sizeof out, "grep -q \"attached no share 'mina@0'\" %s/daemon.log", tmpdir),
                  "a missing name is not logged as a refusal is");
  }
  proc b = client_start();
  client_ready(&b);
  ck_assert_str_eq(strtok((char *)client_cmd(&b, "grow %d", 8 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&b, "gensure %d", 2 << 20), "ok");
  share_tags(&b, 1, 4);
  ck_assert_str_eq(client_cmd(&b, "share open %d any", 2 << 20), "ok");
  { /* nobody's view of root's share: its publisher's pid is not named, '-' as in clients (it read 0) */
    char tab[4096], pub[16] = "";
    ck_assert_int_eq(ctl_as(65534, tab, sizeof tab, "shares"), 0);
    const char *row = strstr(tab, "\nopen ");
    ck_assert_msg(row && sscanf(row, " %*s %*s %*s %*s %15s", pub) == 1 && !strcmp(pub, "-"), "nobody's shares: %s",
                  tab);
  }
  /* keys are per user: a plain name is one's own; another user's share is named NAME@UID */
  const char *plain = client_cmd(&n, "attach open");
  ck_assert_msg(!strncmp(plain, "err -13 ", 8), "a plain key found another user's share");
  ck_assert_msg(strstr(plain, "no share open of this user (another user's is NAME@UID)"), "%s",
                plain); /* new-user trial 3 */
  ck_assert_str_eq(client_cmd(&n, "attach open@0"), "ok 2097152");
  { /* root publishing 'open' again is told who maps it: nobody's process by its uid, not its pid */
    proc c2 = client_start();
    client_ready(&c2);
    ck_assert_str_eq(strtok((char *)client_cmd(&c2, "grow %d", 4 << 20), " "), "ok");
    ck_assert_str_eq(client_cmd(&c2, "gensure %d", 2 << 20), "ok");
    char dup[512], pid_s[32];
    snprintf(dup, sizeof dup, "%s", client_cmd(&c2, "share open %d", 2 << 20));
    snprintf(pid_s, sizeof pid_s, "pid %d", pid_n);
    int named = 0; /* "pid N" not followed by a digit (another pid may begin with N's digits) */
    for (const char *q = dup; (q = strstr(q, pid_s));) q += strlen(pid_s), named |= *q < '0' || *q > '9';
    ck_assert_msg(!strncmp(dup, "err -12 ", 8) && strstr(dup, "a process of uid 65534") && !named, "%s", dup);
    ck_assert_int_eq(client_finish(&c2), 0);
  }
  ck_assert_str_eq(client_cmd(&n, "aread 0"), "tag 4000");
  ck_assert_str_eq(client_cmd(&n, "awrite 0"), strcmp(backend, "host") ? "fault" : "fault protected");
  /* nobody publishes its own 'mine' (allowing everyone): root's processes still attach root's */
  ck_assert_str_eq(strtok((char *)client_cmd(&n, "grow %d", 8 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&n, "gensure %d", 2 << 20), "ok");
  share_tags(&n, 1, 9);
  ck_assert_str_eq(client_cmd(&n, "share mine %d any", 2 << 20), "ok");
  ck_assert_str_eq(client_cmd(&b, "attach mine"), "ok 2097152");
  ck_assert_msg(!strcmp(client_cmd(&b, "aread 0"), "tag 3000"), "root attached another user's 'mine'");
  /* dedup finds only its own user's shares: nobody publishes a well-known hash allowing everyone (it
   * keeps write access through its lease); root's dedup of the same bytes publishes root's own copy
   * (before, it mapped nobody's chunks, which nobody then rewrote under it) */
  client_as_uid = 65534;
  proc n2 = client_start();
  client_as_uid = -1;
  client_ready(&n2);
  ck_assert_str_eq(strtok((char *)client_cmd(&n2, "grow %d", 8 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&n2, "gensure %d", 2 << 20), "ok");
  share_tags(&n2, 1, 6);
  ck_assert_str_eq(client_cmd(&n2, "share bait %d any public-weights-hash", 2 << 20), "ok");
  proc v = client_start();
  client_ready(&v);
  ck_assert_str_eq(strtok((char *)client_cmd(&v, "grow %d", 8 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&v, "gensure %d", 2 << 20), "ok");
  share_tags(&v, 1, 6); /* the same bytes */
  ck_assert_str_eq(client_cmd(&v, "dedup %d public-weights-hash", 2 << 20), "ok deduped 0");
  char sh_out[8192];
  ck_assert_int_eq(ctl(sh_out, sizeof sh_out, "shares --json"), 0);
  ck_assert_msg(strstr(sh_out, "\"key\":\"dedup-"), "root's dedup did not publish its own copy: %s", sh_out);
  ck_assert_int_eq(client_finish(&v), 0);
  ck_assert_int_eq(client_finish(&n2), 0);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stat_num("chunks_shared"), 2); /* nobody still maps 'open' and its own 'mine' */
  ck_assert_int_eq(client_finish(&n), 0);
  ck_assert_int_eq(stat_num("chunks_shared"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A key may hold any printable ASCII, '"' and '\\' too: `shares --json` escapes it (it printed
 * it raw, so a group member's share allowing everyone made every reader's JSON unparsable). */
START_TEST(test_share_key_json) {
  start_daemon("--limit 16MiB --prefetch 0");
  proc a = client_start();
  client_ready(&a);
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "grow %d", 4 << 20), " "), "ok");
  ck_assert_str_eq(client_cmd(&a, "gensure %d", 2 << 20), "ok");
  ck_assert_str_eq(client_cmd(&a, "share q\"k\\ %d any", 2 << 20), "ok");
  char out[4096];
  ck_assert_int_eq(ctl(out, sizeof out, "shares --json"), 0);
  ck_assert_msg(strstr(out, "[{\"key\":\"q\\\"k\\\\\",\"size\":2097152,"), "shares: %s", out);
  ck_assert_int_eq(sh(out, sizeof out,
                      "%s/gmlakectl --control %s --json shares | python3 -c 'import json,sys; "
                      "print(json.load(sys.stdin)[0][\"key\"])'",
                      bindir, ctl_url),
                   0);
  ck_assert_str_eq(out, "q\"k\\\n");
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

START_TEST(test_share_outlives_connection) {
  start_daemon("--limit 64MiB --prefetch 0");
  int ready[2];
  ck_assert_int_eq(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    int s = raw_connect(), fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
    ck_assert_int_ge(s, 0);
    Gmlake__Envelope *in;
    ck_assert_int_eq(send_hello(s, "attacker"), 0);
    if (gmli_wire_recv(s, &in, fds, &nfds, GML_MAX_LEASE_CHUNKS)) _exit(2);
    gmlake__envelope__free_unpacked(in, NULL);
    Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
    Gmlake__LeaseRequest lr = GMLAKE__LEASE_REQUEST__INIT;
    lr.count = 1;
    env.seq = 2, env.msg_case = GMLAKE__ENVELOPE__MSG_LEASE, env.lease = &lr;
    ck_assert_int_eq(send_env(s, &env, NULL, 0), 0);
    if (gmli_wire_recv(s, &in, fds, &nfds, GML_MAX_LEASE_CHUNKS) || in->msg_case != GMLAKE__ENVELOPE__MSG_LEASE_REPLY)
      _exit(3);
    uint64_t id = in->lease_reply->chunk_ids[0];
    gmlake__envelope__free_unpacked(in, NULL);
    Gmlake__ShareRequest sr = GMLAKE__SHARE_REQUEST__INIT;
    sr.key = "orphan";
    sr.n_chunk_ids = 1, sr.chunk_ids = &id, sr.size = 4096;
    Gmlake__Envelope env2 = GMLAKE__ENVELOPE__INIT;
    env2.seq = 3, env2.msg_case = GMLAKE__ENVELOPE__MSG_SHARE, env2.share = &sr;
    ck_assert_int_eq(send_env(s, &env2, NULL, 0), 0);
    if (gmli_wire_recv(s, &in, fds + 1, &nfds, GML_MAX_LEASE_CHUNKS - 1) ||
        in->msg_case != GMLAKE__ENVELOPE__MSG_SHARE_REPLY)
      _exit(4);
    gmlake__envelope__free_unpacked(in, NULL);
    close(s); /* the connection goes; the process (and the chunk's fd) stay */
    if (write(ready[1], "k", 1) != 1) _exit(5);
    for (;;) pause();
  }
  char k;
  ck_assert_int_eq(read(ready[0], &k, 1), 1);
  close(ready[0]), close(ready[1]);
  /* The daemon decides a share's fate when its connection goes in the same pass that drops the
   * client (session_close: the share's mappers, then the count): once clients is 0, a share dropped
   * with its connection would be gone already. Later only its process's exit (a pidfd) ends it. */
  ck_assert_int_eq(stat_wait("clients", 0, 20000), 0);
  ck_assert_int_eq(stat_num("chunks_shared"), 1); /* its process lives: kept */
  ck_assert_int_eq(stat_num("shares"), 1);
  kill(child, SIGKILL);
  int st;
  waitpid(child, &st, 0);
  ck_assert_int_eq(stat_wait("chunks_shared", 0, 20000), 0);
  ck_assert_int_eq(stat_num("shares"), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* (d) malformed frames close that connection only; others go on. */
START_TEST(test_malformed_frames) {
  start_daemon("--limit 128MiB");
  proc good = client_start();
  client_first_line(&good);
  ck_assert_str_eq(client_cmd(&good, "alloc %d", 4 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&good, "tag 0 42"), "ok");
  int s;
  /* truncated: a length of 100, then 10 bytes and a half-close */
  ck_assert_int_ge(s = raw_connect(), 0);
  uint8_t trunc[14] = {100, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  ck_assert_int_eq(send(s, trunc, sizeof trunc, 0), (ssize_t)sizeof trunc);
  shutdown(s, SHUT_WR);
  ck_assert(closed_by_daemon(s));
  close(s);
  /* oversize length */
  ck_assert_int_ge(s = raw_connect(), 0);
  uint8_t big[4] = {0, 0, 0x10, 0}; /* 1 MiB */
  ck_assert_int_eq(send(s, big, 4, 0), 4);
  ck_assert(closed_by_daemon(s));
  close(s);
  /* garbage body */
  ck_assert_int_ge(s = raw_connect(), 0);
  uint8_t junk[12] = {8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  ck_assert_int_eq(send(s, junk, sizeof junk, 0), (ssize_t)sizeof junk);
  ck_assert(closed_by_daemon(s));
  close(s);
  /* wrong fd count: a hello carrying an fd */
  ck_assert_int_ge(s = raw_connect(), 0);
  int devnull = open("/dev/null", O_RDONLY);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__Hello h = GMLAKE__HELLO__INIT;
  h.protocol_version = GML_PROTOCOL_VERSION;
  env.seq = 1;
  env.msg_case = GMLAKE__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  ck_assert_int_eq(send_env(s, &env, &devnull, 1), 0);
  close(devnull);
  ck_assert(closed_by_daemon(s));
  close(s);
  /* foreign chunk id: return a chunk this connection never leased */
  ck_assert_int_ge(s = raw_connect(), 0);
  ck_assert_int_eq(send_hello(s, "attacker"), 0);
  Gmlake__Envelope env2 = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReturnRequest rr = GMLAKE__RETURN_REQUEST__INIT;
  uint64_t ids[1] = {(1ull << 32) | 1};
  rr.n_chunk_ids = 1;
  rr.chunk_ids = ids;
  env2.seq = 2;
  env2.msg_case = GMLAKE__ENVELOPE__MSG_RET;
  env2.ret = &rr;
  ck_assert_int_eq(send_env(s, &env2, NULL, 0), 0);
  ck_assert(closed_by_daemon(s));
  close(s);
  /* a lease count out of range */
  ck_assert_int_ge(s = raw_connect(), 0);
  ck_assert_int_eq(send_hello(s, "attacker"), 0);
  Gmlake__Envelope env3 = GMLAKE__ENVELOPE__INIT;
  Gmlake__LeaseRequest lr = GMLAKE__LEASE_REQUEST__INIT;
  lr.count = 100000;
  env3.seq = 2;
  env3.msg_case = GMLAKE__ENVELOPE__MSG_LEASE;
  env3.lease = &lr;
  ck_assert_int_eq(send_env(s, &env3, NULL, 0), 0);
  ck_assert(closed_by_daemon(s));
  close(s);
  ck_assert_int_ge(stat_num("protocol_errors"), 6);
  /* the good client's data is intact and it can still lease */
  ck_assert_str_eq(client_cmd(&good, "readtags 0"), "tags 42000 42001");
  ck_assert_str_eq(client_cmd(&good, "alloc %d", 8 << 20), "ok 1");
  ck_assert_int_eq(stat_num("clients"), 1);
  ck_assert_int_eq(client_finish(&good), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A lease over quota is refused to that client, with its error code. */
START_TEST(test_quota_and_limit) {
  start_daemon("--limit 32MiB --prefetch 0");
  proc a = client_start();
  char ready[256];
  snprintf(ready, sizeof ready, "%s", client_first_line(&a));
  int pid_a = atoi(ready + 6);
  char out[4096], args[128];
  snprintf(args, sizeof args, "quota %d 8MiB", pid_a);
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 6 << 20), "ok 0");
  const char *r = client_cmd(&a, "alloc %d", 6 << 20);
  ck_assert_msg(!strncmp(r, "err -8 ", 7), "expected GML_EQUOTA, got '%s'", r);
  /* one warning for the refused allocation (the client asks again after giving
   * its cache back: that refusal is not logged again), with the count asked
   * (it said "lease of 0 chunk(s)", twice) */
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "grep -c '\\[warn\\] lease of [1-9][0-9]* chunk(s) refused to client .*quota of 8.00 MiB' %s/daemon.log",
           tmpdir);
  ck_assert_int_eq(sh(out, sizeof out, "%s", cmd), 0);
  ck_assert_msg(atoi(out) == 1, "refusal warnings: %s", out);
  ck_assert_int_ne(sh(out, sizeof out, "grep 'lease of 0 chunk' %s/daemon.log", tmpdir), 0);
  snprintf(args, sizeof args, "quota %d 0", pid_a);
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  ck_assert_msg(strstr(out, "cleared"), "quota 0: %s", out); /* it said "set to 0 bytes" */
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 6 << 20), "ok 1");
  /* past the lake's limit: a clear out-of-memory, and the daemon goes on */
  r = client_cmd(&a, "alloc %d", 40 << 20);
  ck_assert_msg(!strncmp(r, "err -1 ", 7) && strstr(r, "out of memory"), "expected GML_ENOMEM, got '%s'", r);
  /* the message says what was asked, what this process has, and what the lake holds */
  ck_assert_msg(strstr(r, "tried to allocate 40.00 MiB") && strstr(r, "12.00 MiB allocated") && strstr(r, "reserved") &&
                    strstr(r, "the lake (daemon) said:") && strstr(r, "lake holds"),
                "OOM message: '%s'", r);
  ck_assert_int_ge(stat_num("leases_refused"), 2);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 2 << 20), "ok 2");
  /* gmlakectl limit: lower the lake's limit at run time, in bytes and in percent */
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "trim"), " "), "ok"); /* holds its 7 live chunks only */
  ck_assert_int_eq(ctl(out, sizeof out, "limit 24MiB"), 0);
  ck_assert_int_eq(stat_num("limit_bytes"), 24 << 20);
  r = client_cmd(&a, "alloc %d", 12 << 20); /* 7 + 6 chunks > 12 */
  ck_assert_msg(!strncmp(r, "err -1 ", 7), "expected GML_ENOMEM under the new limit, got '%s'", r);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 8 << 20), "ok 3"); /* 7 + 4 <= 12 */
  ck_assert_int_eq(ctl(out, sizeof out, "limit 1%"), 0);
  long long total = stat_num("device_total_bytes"), lim = stat_num("limit_bytes");
  ck_assert_int_gt(total, 0);
  long long pct = (long long)(1 / 100.0 * (double)total), cs = stat_num("chunk_size");
  ck_assert_msg(lim == pct - pct % cs, "limit %lld of %lld", lim, total); /* whole chunks */
  ck_assert_int_ne(ctl(out, sizeof out, "limit lots 2>/dev/null"), 0);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* trim gives free chunks back to the driver; a client's idle cache comes back on request. */
START_TEST(test_trim) {
  start_daemon("--limit 64MiB --prefetch 8MiB");
  proc a = client_start();
  char ready[256];
  snprintf(ready, sizeof ready, "%s", client_first_line(&a));
  int pid_a = atoi(ready + 6);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 10 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  char out[4096], args[64];
  ck_assert_int_eq(ctl(out, sizeof out, "trim --json"), 0);
  ck_assert_int_eq(stat_num("chunks_free"), 0);
  long long leased = stat_num("chunks_leased");
  ck_assert_int_eq(leased, 5);
  snprintf(args, sizeof args, "trim --client %d", pid_a);
  ck_assert_int_eq(ctl(out, sizeof out, args), 0);
  /* the client serves the request at its next operation */
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  ck_assert_int_eq(stat_wait("chunks_leased", 0, 2000), 0);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* The global lake: when the lake is full, the daemon asks a client with
 * idle cache to give some back, and the waiting lease is served from it. */
START_TEST(test_reclaim_between_clients) {
  start_daemon("--limit 32MiB --prefetch 0");
  proc a = client_start(), b = client_start();
  client_first_line(&a);
  client_first_line(&b);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 24 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  ck_assert_int_eq(stat_wait("cached", 24 << 20, 20000), 24 << 20); /* the daemon now knows A caches 24 MiB */
  /* B needs 24 MiB: only 8 MiB are left under the limit */
  fprintf(b.in, "alloc %d\n", 24 << 20);
  fflush(b.in);
  ck_assert_msg(log_wait("asked client", 20000), "A was not asked for its idle cache"); /* B's lease got as far */
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");                                      /* A picks up the request... */
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok"); /* ...and gives its idle chunks back */
  char line[256];
  ck_assert_ptr_nonnull(fgets(line, sizeof line, b.out));
  ck_assert_msg(!strncmp(line, "ok 0", 4), "B got '%s'", line);
  ck_assert_int_le(stat_num("chunks_total"), 16);
  /* the lake is full again: a lease over the limit is refused (after at most the reclaim wait) */
  uint64_t t0 = (uint64_t)time(NULL);
  const char *r = client_cmd(&b, "alloc %d", 24 << 20);
  ck_assert_msg(!strncmp(r, "err -1 ", 7), "expected GML_ENOMEM, got '%s'", r);
  ck_assert_int_le((uint64_t)time(NULL) - t0, 3);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Headroom leases are optional: served from the lake's free chunks when it
 * has some, else declined at once and quietly (not a refusal, no waiting,
 * no other client asked to give cache back). */
static void headroom_sequence(proc *b) {
  /* x, y: 2 chunks each; x freed; z needs 3 slots: 1 leased for need, 2 as headroom (or x's) */
  ck_assert_str_eq(client_cmd(b, "alloc %d", 4 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(b, "alloc %d", 4 << 20), "ok 1");
  ck_assert_str_eq(client_cmd(b, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(b, "alloc %d", 6 << 20), "ok 0");
}
START_TEST(test_optional_headroom_leases) {
  /* an empty-handed lake: A caches 24 MiB, nothing free, prefetch off */
  start_daemon("--limit 40MiB --prefetch 0");
  proc a = client_start();
  client_first_line(&a);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 24 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  setenv("GMLAKE_HEADROOM", "100", 1);
  proc b = client_start();
  unsetenv("GMLAKE_HEADROOM");
  client_first_line(&b);
  uint64_t t0 = gmli_now_ns();
  headroom_sequence(&b);
  ck_assert_uint_lt(gmli_now_ns() - t0, 500000000ull);                      /* no reclaim wait (1 s) */
  ck_assert_str_eq(client_cmd(&b, "stats"), "stats 10485760 10485760 0 1"); /* y + z; 5 chunks: x's 2 restitched */
  ck_assert_int_eq(stat_num("optional_declined"), 1);
  ck_assert_int_eq(stat_num("leases_refused"), 0);
  /* after a no, B does not ask again at once: one more slot to map, from x's chunks */
  ck_assert_str_eq(client_cmd(&b, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 8 << 20), "ok 0");
  ck_assert_int_eq(stat_num("optional_declined"), 1);
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  ck_assert_str_eq(client_cmd(&a, "stats"), "stats 0 25165824 25165824 1"); /* A was not asked for its cache */
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
  /* a lake with free chunks serves them */
  start_daemon("--limit 64MiB --prefetch 16MiB");
  ck_assert_int_eq(stat_wait("chunks_free", 8, 20000), 8); /* the prefetch made */
  setenv("GMLAKE_HEADROOM", "100", 1);
  b = client_start();
  unsetenv("GMLAKE_HEADROOM");
  client_first_line(&b);
  headroom_sequence(&b);
  ck_assert_str_eq(client_cmd(&b, "stats"), "stats 10485760 14680064 4194304 1"); /* 7 chunks: 2 of headroom */
  ck_assert_int_eq(stat_num("optional_declined"), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A send that fails outside the client's own I/O (here a reclaim request to a
 * client that shut its reading side) marks it closing; when it then leaves,
 * the daemon closes it (it used to ignore every later event of that client:
 * its session and chunks stayed, and the loop spun on its readable socket). */
START_TEST(test_leave_after_failed_send) {
  start_daemon("--limit 8MiB --prefetch 0");
  proc a = client_start();
  client_first_line(&a);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 8 << 20), "ok 0"); /* the lake is full */
  proc b = client_start();                                       /* before r: it would inherit r's socket */
  client_first_line(&b);
  int r = raw_connect();
  ck_assert_int_ge(r, 0);
  ck_assert_int_eq(send_hello(r, "attacker"), 0);
  char buf[512];
  ck_assert_int_gt(recv(r, buf, sizeof buf, 0), 0); /* the hello reply */
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  u.cached = 4 << 20; /* idle cache: the daemon will ask it to give some back */
  env.seq = 2;
  env.msg_case = GMLAKE__ENVELOPE__MSG_USAGE;
  env.usage = &u;
  ck_assert_int_eq(send_env(r, &env, NULL, 0), 0);
  ck_assert_int_eq(raw_round_trip(r, 3), 0); /* its report handled before B asks */
  shutdown(r, SHUT_RD);                      /* sends to it fail from now on (EPIPE) */
  ck_assert_int_eq(stat_num("clients"), 3);
  /* waits for the lake, the daemon asks r for its cache (the send fails), then refuses */
  ck_assert_ptr_nonnull(strstr(client_cmd(&b, "alloc %d", 2 << 20), "err"));
  close(r);
  ck_assert_int_eq(stat_wait("clients", 2, 20000), 2);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stat_num("chunks_leased"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* Prometheus text, checked by a real parser. */
START_TEST(test_metrics_parse) {
  start_daemon("--limit 64MiB");
  proc a = client_start();
  client_first_line(&a);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 3 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  ck_assert_int_eq(stat_wait("allocated", 3 << 20, 20000), 3 << 20); /* its report handled */
  char cmd[2048];
  /* The counters are the numbers that only go up (each a d->counters field
   * the daemon only increments); anything else is a gauge (shares and growable
   * bytes were counters). The parser names a counter's family without _total. */
  snprintf(cmd, sizeof cmd,
           "%s/gmlakectl --control %s metrics | /usr/bin/python3 -c '"
           "import sys\nfrom prometheus_client.parser import text_string_to_metric_families as p\n"
           "fams = {f.name: f for f in p(sys.stdin.read())}\n"
           "s = {x.labels[\"state\"]: x.value for x in fams[\"gmlake_lake_bytes\"].samples}\n"
           "a = [x.value for x in fams[\"gmlake_allocated_bytes\"].samples][0]\n"
           "assert s[\"leased\"] >= 3 << 20, s\nassert a == 3 << 20, a\n"
           "counters = sorted(n for n, f in fams.items() if f.type == \"counter\")\n"
           "assert counters == [\"gmlake_chunks_released_idle\", \"gmlake_chunks_remade\", \"gmlake_chunks_scrubbed\", "
           "\"gmlake_connections_refused\", "
           "\"gmlake_leases\", \"gmlake_leases_refused\", \"gmlake_optional_leases_declined\", "
           "\"gmlake_protocol_errors\"], counters\n"
           "for g in (\"gmlake_shares\", \"gmlake_chunks_shared\", \"gmlake_growable_mapped_bytes\", "
           "\"gmlake_growable_unmapped_bytes\"):\n  assert fams[g].type == \"gauge\", (g, fams[g].type)\n"
           "assert not [n for n, f in fams.items() if f.type != \"counter\" and n.endswith(\"_total\")]\n"
           "print(\"parsed\", len(fams))'",
           bindir, ctl_url);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* --json: watch prints one JSON object a refresh (it printed the screen's
 * text), metrics is refused with a pointer to stats --json (it printed
 * Prometheus text as if --json were not there). */
START_TEST(test_ctl_json) {
  start_daemon("--limit 64MiB");
  proc a = client_start();
  int pid_a = client_ready(&a);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 3 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  ck_assert_int_eq(stat_poll("allocated", 3 << 20, 40, 25), 3 << 20);
  char out[16384];
  int rc = sh(out, sizeof out,
              "timeout 1 %s/gmlakectl --control %s --json watch --interval 0.1 | /usr/bin/python3 -c '"
              "import json, sys\nlines = sys.stdin.read().splitlines()\nassert len(lines) >= 2, lines\n"
              "for l in lines:\n  o = json.loads(l)\n  assert o[\"stats\"][\"allocated\"] == 3 << 20, o\n"
              "  assert [c[\"pid\"] for c in o[\"clients\"]] == [%d], o\n  assert o[\"time\"] > 1e9, o\n"
              "print(\"watch --json:\", len(lines), \"objects\")' 2>&1",
              bindir, ctl_url, pid_a);
  ck_assert_msg(rc == 0, "watch --json: %s", out);
  printf("  %s", out);
  rc = sh(out, sizeof out, "%s/gmlakectl --control %s --json metrics 2>&1", bindir, ctl_url);
  ck_assert_msg(rc == 2 && strstr(out, "metrics prints Prometheus text only") && strstr(out, "--json stats") &&
                    !strstr(out, "# TYPE"),
                "--json metrics: rc %d: %s", rc, out);
  /* --version with --json (before or after it) is a JSON object too (before: the plain line); plain without */
  for (int after = 0; after < 2; after++) {
    rc = sh(out, sizeof out,
            "%s/gmlakectl %s --version %s | /usr/bin/python3 -c '"
            "import json, sys\no = json.loads(sys.stdin.read())\n"
            "assert o[\"program\"] == \"gmlakectl\" and o[\"version\"].count(\".\") == 2 and o[\"protocol\"] >= 1, o\n"
            "print(json.dumps(o))' 2>&1",
            bindir, after ? "" : "--json", after ? "--json" : "");
    ck_assert_msg(rc == 0, "gmlakectl --json --version: %s", out);
  }
  printf("  gmlakectl --json --version: %s", out);
  rc = sh(out, sizeof out, "%s/gmlakectl --version", bindir);
  ck_assert_msg(rc == 0 && !strncmp(out, "gmlakectl ", 10) && !strchr(out, '{'), "gmlakectl --version: %s", out);
  /* --version and --help once the whole line is read: an unknown option is a usage error wherever it
   * stands (before: `--json --version --bogus` printed the version, exit 0, and `--json --bogus
   * --version` was a usage error), and so is --version with a command, as an argument too many is */
  static const char *const misuse[][2] = {
      {"--json --version --bogus", "unknown option '--bogus'"},
      {"--json --bogus --version", "unknown option '--bogus'"},
      {"--version --bogus", "unknown option '--bogus'"},
      {"--help --bogus", "unknown option '--bogus'"},
      {"--version stats", "--version takes no command"},
      {"stats --json --version", "--version takes no command"},
      {"--version --client 1", "('--client' given)"},
      {"--version --device x", "bad device 'x'"},
  };
  for (size_t i = 0; i < sizeof misuse / sizeof misuse[0]; i++) {
    rc = sh(out, sizeof out, "%s/gmlakectl %s 2>&1", bindir, misuse[i][0]);
    ck_assert_msg(rc == 2 && strstr(out, misuse[i][1]) && !strstr(out, "(protocol "), "gmlakectl %s: rc %d: %s",
                  misuse[i][0], rc, out);
    if (strstr(misuse[i][0], "--json"))
      ck_assert_msg(!strncmp(out, "{\"error\":", 9) || strstr(out, "\n{\"error\":"), "gmlakectl %s: %s", misuse[i][0],
                    out);
  }
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* The first daemon.log line that holds the text pat, waited for up to 20 s, into out ("": none). */
/* The first daemon.log line holding the string pat (no pattern), waited for up to 20 s; "" if none. */
static const char *log_line(char *out, size_t len, const char *pat) {
  log_wait_in(NULL, pat, 1, 20000, out, len);
  return out;
}

/* A FIFO (or any file but a regular one) at the config path is refused, never waited on: at start
 * the daemon exits 2 saying so; on SIGHUP the reload is refused, logged, and the daemon serves on.
 * Before, the config was opened before it was looked at: open() of a FIFO with no writer blocked
 * the loop, so one SIGHUP froze the daemon (no client, no gmlakectl, no SIGTERM answered). */
START_TEST(test_config_fifo_refused) {
  char conf[] = "/tmp/gmlake-test-conf.XXXXXX", args[128], out[4096];
  int cfd = mkstemp(conf);
  ck_assert_int_ge(cfd, 0);
  ck_assert_int_eq(write(cfd, "limit = 64MiB\n", 14), 14);
  close(cfd);
  snprintf(args, sizeof args, "--prefetch 0 --config %s", conf);
  start_daemon(args);
  ck_assert_int_eq(unlink(conf), 0);
  ck_assert_int_eq(mkfifo(conf, 0600), 0);
  kill(daemon_pid, SIGHUP);
  log_line(out, sizeof out, "nothing reloaded"); /* a string, not a pattern */
  char stats[4096];
  int served = sh(stats, sizeof stats, "timeout 5 %s/gmlakectl --control %s stats --json 2>&1", bindir, ctl_url) == 0;
  if (!out[0]) { /* frozen in open(): a writer lets it go, so the test leaves no daemon behind */
    int w = open(conf, O_WRONLY | O_NONBLOCK);
    if (w >= 0) close(w);
  }
  printf("  SIGHUP with a FIFO at the config path: %s", out[0] ? strstr(out, "SIGHUP") : "nothing logged\n");
  ck_assert_msg(strstr(out, "[error] SIGHUP: config ") && strstr(out, "is not a regular file"), "the reload: '%s'",
                out);
  ck_assert_msg(served && strstr(stats, "\"limit_bytes\":67108864"), "gmlakectl stats after the SIGHUP: '%s'", stats);
  ck_assert_int_eq(stop_daemon(), 0);
  /* at start: exit 2, said */
  int rc = sh(out, sizeof out,
              "timeout 5 %s/gmlaked --backend host --config %s --socket %s.sock --control ipc://%s.ctl 2>&1", bindir,
              conf, conf, conf);
  unlink(conf);
  ck_assert_msg(rc == 2 && strstr(out, "is not a regular file"), "a start with a FIFO for its config: exit %d, '%s'",
                rc, out);
}
END_TEST

/* A limit set below what clients hold, by a reload (SIGHUP) or gmlakectl limit, is said with how
 * much they hold and what the daemon does (before: taken without a word, the lake over its limit
 * and leases refused with nothing in the log to say why). What it says is what happens: nothing
 * is taken back, the free chunks are released, a lease is served only from what clients of its
 * own user give back (one past the limit with what its client holds is refused at once), another
 * user's lease is refused until the lake is within its limit, and chunks given back past the limit
 * are released. */
START_TEST(test_limit_below_held_said) {
  char conf[] = "/tmp/gmlake-test-conf.XXXXXX", args[128], out[4096];
  int cfd = mkstemp(conf);
  ck_assert_int_ge(cfd, 0);
  ck_assert_int_eq(write(cfd, "limit = 64MiB\n", 14), 14);
  close(cfd);
  snprintf(args, sizeof args, "--prefetch 0 --config %s", conf);
  start_daemon(args);
  proc a = client_start(), b = client_start();
  client_ready(&a);
  client_ready(&b);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 16 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 8 << 20), "ok 1");
  ck_assert_str_eq(client_cmd(&a, "free 1"), "ok"); /* a leases 24 MiB, 8 MiB of it idle in its cache */
  ck_assert_str_eq(client_cmd(&a, "flush"), "ok");
  ck_assert_str_eq(client_cmd(&b, "alloc %d", 4 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&b, "free 0"), "ok");
  ck_assert_str_eq(strtok((char *)client_cmd(&b, "trim"), " "), "ok"); /* 2 free chunks in the lake */
  ck_assert_int_eq(stat_wait("chunks_free", 2, 20000), 2);
  FILE *f = fopen(conf, "w");
  fprintf(f, "limit = 8MiB\n");
  fclose(f);
  kill(daemon_pid, SIGHUP);
  ck_assert_msg(log_line(out, sizeof out, "SIGHUP: reloaded")[0], "no reload logged");
  log_line(out, sizeof out, "SIGHUP: limit 8.00 MiB is below");
  printf("  %s", strstr(out, "SIGHUP") ? strstr(out, "SIGHUP") : out);
  ck_assert_msg(strstr(out,
                       "[warn] SIGHUP: limit 8.00 MiB is below the 24.00 MiB clients hold now (24.00 MiB leased, 0 B "
                       "parked, 0 B in shares): nothing is taken back from them"),
                "no warning of a limit below what clients hold: '%s'", out);
  /* what it says happens */
  ck_assert_int_eq(stat_num("limit_bytes"), 8 << 20);
  ck_assert_int_eq(stat_num("chunks_free"), 0);         /* released */
  ck_assert_int_eq(stat_num("chunks_leased"), 12);      /* none taken back */
  const char *r = client_cmd(&b, "alloc %d", 10 << 20); /* 5 chunks for b alone pass the limit of 4 */
  ck_assert_msg(!strncmp(r, "err -1 ", 7) && strstr(r, "would pass the lake's limit"), "expected GML_ENOMEM, got '%s'",
                r);
  r = client_cmd(&b, "alloc %d", 2 << 20); /* from a's idle cache, asked */
  ck_assert_msg(!strncmp(r, "ok ", 3), "a lease within the limit, a's idle cache to give: '%s'", r);
  /* what a gives back beside it (the rest of its idle cache, asked or trimmed) is released: 8 + 1 chunks held, none free */
  ck_assert_str_eq(strtok((char *)client_cmd(&a, "trim"), " "), "ok");
  ck_assert_int_eq(stat_wait("chunks_total", 9, 20000), 9);
  ck_assert_int_eq(stat_num("chunks_free"), 0);
  /* ... with the reason it is over (before: "handed over after the restart", with no restart) */
  log_line(out, sizeof out, "past its limit");
  ck_assert_msg(strstr(out, "the lake held past its limit (the limit was set below what it held, by SIGHUP)") &&
                    !strstr(out, "restart"),
                "chunks released past the limit, said as: '%s'", out);
  /* gmlakectl limit says it as well, in the log and to its caller (stderr, exit 0; before: the log only) */
  ck_assert_int_eq(ctl(out, sizeof out, "limit 6MiB 2>&1"), 0);
  ck_assert_msg(
      strstr(out, "gmlakectl: warning: the daemon says: limit 6.00 MiB is below the 18.00 MiB clients hold now") &&
          strstr(out, "another user's lease is refused") && strstr(out, "limit set to 6291456 bytes"),
      "gmlakectl limit below what clients hold: '%s'", out);
  log_line(out, sizeof out, "limit: limit 6.00 MiB is below");
  ck_assert_msg(
      strstr(out, "[warn] gmlakectl limit: limit 6.00 MiB is below the 18.00 MiB clients hold now (18.00 MiB leased"),
      "no warning for gmlakectl limit: '%s'", out);
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(client_finish(&b), 0);
  ck_assert_int_eq(stop_daemon(), 0);
  unlink(conf);
  /* Two users. A chunk one user gives back goes to another user's lease only released and made anew,
   * and none is made while the lake is over its limit: the other user's lease is refused until what
   * is given back brings the lake within it, while the same user's leases are served from the chunks
   * its clients give back (before, the warning said any lease was served from what clients give back). */
  if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
    test_skip("test_limit_below_held_said (another user's lease)", "needs root and setpriv");
    return;
  }
  start_daemon("--limit 64MiB --prefetch 0 --socket-mode 0666");
  ck_assert_int_eq(chmod(tmpdir, 0711), 0);
  proc r1 = client_start();
  client_ready(&r1);
  ck_assert_str_eq(client_cmd(&r1, "alloc %d", 16 << 20), "ok 0");
  ck_assert_str_eq(client_cmd(&r1, "alloc %d", 4 << 20), "ok 1");
  ck_assert_str_eq(client_cmd(&r1, "alloc %d", 4 << 20), "ok 2");
  ck_assert_str_eq(client_cmd(&r1, "free 1"), "ok"); /* root leases 24 MiB, 4 MiB of it idle in r1's cache */
  ck_assert_str_eq(client_cmd(&r1, "flush"), "ok");
  ck_assert_int_eq(
      sh(out, sizeof out,
         "%s/gmlakectl --control %s --json limit 8MiB 2>/dev/null | /usr/bin/python3 -c '"
         "import json, sys\no = json.load(sys.stdin)\nassert o[\"ok\"] and o[\"limit_bytes\"] == 8 << 20, o\n"
         "assert o[\"warning\"].startswith(\"limit 8.00 MiB is below the 24.00 MiB clients hold now\"), o' 2>&1",
         bindir, ctl_url),
      0);
  log_line(out, sizeof out, "limit: limit 8.00 MiB is below");
  ck_assert_msg(strstr(out, "[warn] gmlakectl limit: limit 8.00 MiB is below the 24.00 MiB clients hold now") &&
                    strstr(out, "a lease is served only from chunks that clients of its own user give back") &&
                    strstr(out, "another user's lease is refused until the lake is within its limit"),
                "the warning does not say what another user's lease gets: '%s'", out);
  ck_assert_int_eq(stat_num("chunks_total"), 12);
  proc n;
  if (!client_start_nobody(&n, "test_limit_below_held_said (another user)")) {
    client_finish(&r1), stop_daemon();
    return;
  }
  /* r1's idle cache, asked for n's lease, is released: 20 MiB held, still over the limit, n refused */
  r = client_cmd(&n, "alloc %d", 2 << 20);
  ck_assert_msg(!strncmp(r, "err -1 ", 7) && strstr(r, "the lake holds 20.00 MiB of limit 8.00 MiB"),
                "another user's lease on a lake over its limit: '%s'", r);
  /* r1 did give back (released): the refusal says the limit, not "no other client had idle cache" */
  ck_assert_msg(strstr(r, "the lake is over its limit: what other clients give back is released") &&
                    !strstr(r, "no other client had idle cache"),
                "'%s'", r);
  ck_assert_int_eq(stat_wait("chunks_total", 10, 20000), 10);
  ck_assert_int_eq(stat_num("chunks_free"), 0);
  /* root's second client is served from what r1 gives back (the rest released) */
  ck_assert_str_eq(client_cmd(&r1, "free 2"), "ok");
  ck_assert_str_eq(client_cmd(&r1, "flush"), "ok");
  proc r2 = client_start();
  client_ready(&r2);
  r = client_cmd(&r2, "alloc %d", 2 << 20);
  ck_assert_msg(!strcmp(r, "ok 0"), "the same user's lease, its other client's idle cache to give: '%s'", r);
  ck_assert_int_eq(stat_wait("chunks_total", 9, 20000), 9);
  log_line(out, sizeof out, "past its limit");
  ck_assert_msg(strstr(out, "past its limit (the limit was set below what it held, by gmlakectl limit)"), "'%s'", out);
  /* once what r1 gives back brings the lake within its limit, n's lease gets a chunk made anew */
  ck_assert_str_eq(client_cmd(&r1, "free 0"), "ok");
  ck_assert_str_eq(client_cmd(&r1, "flush"), "ok");
  r = client_cmd(&n, "alloc %d", 2 << 20);
  ck_assert_msg(!strcmp(r, "ok 0"), "another user's lease once the lake can come within its limit: '%s'", r);
  ck_assert_int_le(stat_num("chunks_total"), 4);
  /* a limit above what clients hold: no warning, nor a "warning" key */
  ck_assert_int_eq(ctl(out, sizeof out, "--json limit 64MiB 2>&1"), 0);
  ck_assert_msg(!strstr(out, "warning"), "a limit above what clients hold: '%s'", out);
  ck_assert_int_eq(client_finish(&n), 0);
  ck_assert_int_eq(client_finish(&r2), 0);
  ck_assert_int_eq(client_finish(&r1), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A thread of this process, for the quota on a tid. */
static pthread_mutex_t tid_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t tid_cond = PTHREAD_COND_INITIALIZER;
static int thread_tid, thread_stop;
static void *tid_thread(void *arg) {
  (void)arg;
  pthread_mutex_lock(&tid_lock);
  thread_tid = (int)syscall(SYS_gettid);
  pthread_cond_broadcast(&tid_cond);
  while (!thread_stop) pthread_cond_wait(&tid_cond, &tid_lock);
  pthread_mutex_unlock(&tid_lock);
  return NULL;
}

/* gmlakectl's errors: the daemon's message without a generic code text that
 * may be wrong (a missing pid said "(no such share)"); a quota on a thread
 * says it is one; --json also puts an error object on stdout (it stayed
 * empty); an extra argument is a usage error (stats extra ran stats); watch's
 * interval must be a positive number (0 or abc spun without a pause). */
/* A daemon given only --socket puts its control endpoint beside it, as
 * --help says (before: in /run/gmlake, beside or in place of the system
 * daemon's, so a private daemon on another device refused to start there). */
START_TEST(test_control_beside_socket) {
  char dir[] = "/tmp/gmlake-ctl.XXXXXX", out[512];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  int rc = sh(out, sizeof out,
              "%s/gmlaked --backend host --device 7 --socket %s/own.sock --log-level warn & p=$!; "
              "for i in $(seq 100); do [ -S %s/gmlake-7.ctl ] && break; sleep 0.05; done; "
              "%s/gmlakectl --control ipc://%s/gmlake-7.ctl stats --json | head -c 20; ls %s; kill $p; wait $p",
              bindir, dir, dir, bindir, dir, dir);
  ck_assert_int_eq(rc, 0);
  ck_assert_msg(strstr(out, "{\"device\":7") && strstr(out, "gmlake-7.ctl") && strstr(out, "own.sock"), "%s", out);
  rmdir(dir);
}
END_TEST

/* A connection the daemon refuses (max-clients-per-uid, max-clients) gets the
 * daemon's reason in one error frame before the close: the library says it.
 * Before, the frame was an "unexpected unsolicited message" and the failed
 * hello said "no hello reply: not a gmlaked's clients' socket? the control
 * endpoint is gmlakectl's", sending the user to check a path that was right. */
START_TEST(test_refused_connection_says_why) {
  start_daemon("--limit 16MiB --prefetch 0 --max-clients-per-uid 1");
  proc a = client_start();
  client_ready(&a);
  char out[8192];
  ck_assert_int_eq(sh(out, sizeof out, "GMLAKE_MODE=daemon %s/gml-testclient %s </dev/null 2>&1", bindir, sock_path),
                   1);
  ck_assert_msg(strstr(out, "too many connections of this user (max-clients-per-uid)"), "%s", out);
  ck_assert_msg(!strstr(out, "no hello reply") && !strstr(out, "gmlakectl"), "%s", out);
  /* again and again in this process: the daemon may close before the hello is
   * sent (EPIPE), its reason then waiting unread (CI saw "no hello reply") */
  char path[128], said[4096];
  snprintf(path, sizeof path, "%s/said", tmpdir);
  setenv("GMLAKE_MODE", "daemon", 1);
  for (int i = 0; i < 300; i++) {
    ck_assert_int_eq(open_saying(path, said, sizeof said), GML_EDAEMON);
    ck_assert_msg(strstr(said, "max-clients-per-uid") && !strstr(said, "no hello reply"), "try %d: %s", i, said);
  }
  unsetenv("GMLAKE_MODE");
  ck_assert_int_eq(client_finish(&a), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

START_TEST(test_ctl_errors) {
  start_daemon("--limit 16MiB --prefetch 0");
  char out[8192];
  ck_assert_int_eq(ctl_as(-1, out, sizeof out, "quota 999999 10MiB 2>&1"), 1);
  ck_assert_msg(strstr(out, "no process 999999") && !strstr(out, "no such share"), "%s", out);
  ctl_quiet = 1;
  ck_assert_int_eq(ctl(out, sizeof out, "--json quota 999999 10MiB"), 1);
  ctl_quiet = 0;
  ck_assert_int_eq(sh(out, sizeof out,
                      "%s/gmlakectl --control %s --json quota 999999 10MiB 2>/dev/null | /usr/bin/python3 -c '"
                      "import json, sys\no = json.load(sys.stdin)\nassert o[\"error\"][\"code\"] == %d, o\n"
                      "assert \"no process 999999\" in o[\"error\"][\"message\"], o' 2>&1",
                      bindir, ctl_url, GML_ENOENT),
                   0);
  /* trim, limit and quota: one outcome shape with --json (before: {"trimmed_chunks":N}, the stats
   * object alone, {"ok":true}) */
  ck_assert_int_eq(sh(out, sizeof out,
                      "c='%s/gmlakectl --control %s --json'; { $c trim; $c limit 16MiB; $c quota 'uid:4321' 1MiB; "
                      "$c quota uid:4321 0; } | /usr/bin/python3 -c '"
                      "import json, sys\nt, l, q, z = [json.loads(x) for x in sys.stdin]\n"
                      "assert all(o[\"ok\"] is True for o in (t, l, q, z)), (t, l, q, z)\n"
                      "assert [o[\"command\"] for o in (t, l, q, z)] == [\"trim\", \"limit\", \"quota\", \"quota\"]\n"
                      "assert t[\"trimmed_chunks\"] >= 0 and \"client_pid\" not in t, t\n"
                      "assert l[\"limit_bytes\"] == 16 << 20 == l[\"stats\"][\"limit_bytes\"], l\n"
                      "assert (q[\"holder\"], q[\"bytes\"], q[\"cleared\"]) == (\"uid:4321\", 1 << 20, False), q\n"
                      "assert (z[\"bytes\"], z[\"cleared\"]) == (0, True), z' 2>&1",
                      bindir, ctl_url),
                   0);
  /* a limit is whole chunks, as the default one (new-user trial: `limit 1%` was taken to the byte) */
  ck_assert_int_eq(ctl(out, sizeof out, "limit 17MiB"), 0);
  ck_assert_msg(strstr(out, "limit set to 16777216 bytes (whole chunks)"), "%s", out);
  ck_assert_int_eq(stat_num("limit_bytes"), 16 << 20);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, tid_thread, NULL), 0);
  pthread_mutex_lock(&tid_lock);
  while (!thread_tid) pthread_cond_wait(&tid_cond, &tid_lock);
  pthread_mutex_unlock(&tid_lock);
  char args[128], want[160];
  snprintf(args, sizeof args, "quota %d 10MiB 2>&1", thread_tid);
  ck_assert_int_eq(ctl(out, sizeof out, args), 1);
  snprintf(want, sizeof want, "%d is a thread of process %d: a pid quota is set for the process", thread_tid,
           (int)getpid());
  ck_assert_msg(strstr(out, want), "quota on a tid: %s", out);
  pthread_mutex_lock(&tid_lock);
  thread_stop = 1;
  pthread_cond_broadcast(&tid_cond);
  pthread_mutex_unlock(&tid_lock);
  pthread_join(th, NULL);
  /* the daemon named twice is an error; --device wins over GMLAKE_CONTROL */
  ck_assert_int_eq(sh(out, sizeof out, "%s/gmlakectl --control %s --device 3 stats 2>&1", bindir, ctl_url), 2);
  ck_assert_msg(strstr(out, "--control and --device name the daemon both"), "%s", out);
  ck_assert_int_eq(sh(out, sizeof out, "GMLAKE_CONTROL=%s XDG_RUNTIME_DIR=%s %s/gmlakectl --device 3 stats 2>&1",
                      ctl_url, tmpdir, bindir),
                   1);
  ck_assert_msg(strstr(out, "gmlake-3.ctl"), "GMLAKE_CONTROL won over --device: %s", out);
  ck_assert_int_eq(sh(out, sizeof out, "GMLAKE_CONTROL=%s %s/gmlakectl stats --json 2>&1", ctl_url, bindir), 0);
  /* an endpoint that is not one says what it is (before: "Invalid argument" for a bare path, "Connection
   * refused" where nothing is, and for the clients' socket a hint about the daemon's control slots) */
  ck_assert_int_eq(sh(out, sizeof out, "%s/gmlakectl --control %s/gmlake-0.ctl stats 2>&1", bindir, tmpdir), 2);
  ck_assert_msg(strstr(out, "bad control endpoint") && strstr(out, "a URL, e.g. ipc://"), "a bare path: %s", out);
  ck_assert_int_eq(sh(out, sizeof out, "%s/gmlakectl --control ipc://%s/none.ctl stats 2>&1", bindir, tmpdir), 1);
  ck_assert_msg(strstr(out, "none.ctl does not exist: is the daemon running"), "no such endpoint: %s", out);
  ck_assert_int_eq(sh(out, sizeof out, "%s/gmlakectl --control ipc://%s stats 2>&1", bindir, sock_path), 1);
  ck_assert_msg(strstr(out, "that is its clients' socket") && !strstr(out, "control connections"),
                "the clients' socket: %s", out);
  /* and a client given the control endpoint as its socket (before: "protocol error: " and nothing more) */
  ck_assert_int_eq(sh(out, sizeof out, "%s/gml-testclient %s </dev/null 2>&1", bindir, ctl_url + 6), 1);
  ck_assert_msg(strstr(out, "no hello reply") && strstr(out, "the control endpoint (gmlake-N.ctl) is gmlakectl's"),
                "%s", out);
  /* extra arguments, every command; then watch's interval */
  static const char *const bad[] = {"stats extra", "clients x", "chunks x", "shares x", "trim x", "limit 8MiB x",
                                    "quota 1 2MiB x", "metrics x", "watch x", "watch --interval 0",
                                    "watch --interval abc", "watch --interval -1", "watch --interval 0.01",
                                    /* trim's and watch's options given to another command (they were ignored:
                                     * limit 8MiB --client 1 set the whole lake's limit, exit 0) */
                                    "limit 8MiB --client 1", "stats --client 1", "trim --interval 2",
                                    "stats --interval 2", "trim --client 1 --interval 2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(args, sizeof args, "%s 2>&1", bad[i]);
    ck_assert_msg(sh(out, sizeof out, "timeout 2 %s/gmlakectl --control %s %s", bindir, ctl_url, args) == 2,
                  "gmlakectl %s: not a usage error: %.300s", bad[i], out);
  }
  ck_assert_msg(strstr(out, "trim takes no --interval (watch --interval S)"), "%s", out);
  ck_assert_int_eq(
      sh(out, sizeof out, "timeout 2 %s/gmlakectl --control %s watch --interval 0.01 2>&1", bindir, ctl_url), 2);
  ck_assert_msg(strstr(out, "bad interval '0.01'"), "%s", out);
  ck_assert_int_eq(stat_num("limit_bytes"), 16 << 20); /* limit 8MiB x changed nothing */
  /* --json anywhere: every usage error is an error object on stdout too, with the same exit status
   * (they printed nothing there: bogus, an extra argument, a missing one, a bad option value) */
  static const struct {
    const char *args, *says;
  } usage_json[] = {
      {"--json bogus", "unknown command 'bogus'"},
      {"--json stats extra", "stats takes no arguments"},
      {"--json quota", "quota takes 2 argument(s)"},
      {"--json --device x stats", "bad device 'x'"},
      {"--json watch --interval 0", "bad interval '0'"},
      {"stats --json --bogus", "unknown option '--bogus'"},
      {"--json", "no command given"},
      {"stats --interval --json", "bad interval '--json'"},
      {"--json limit 101%", "from 1% to 100%"},
      {"limit 1000TiB --json", "more than the device's memory"},
      {"limit 1MiB --json", "less than one chunk (2.00 MiB)"}, /* was the daemon's bare refusal, exit 1 */
  };
  for (size_t i = 0; i < sizeof usage_json / sizeof usage_json[0]; i++) {
    int urc =
        sh(out, sizeof out, "timeout 2 %s/gmlakectl --control %s %s 2>/dev/null", bindir, ctl_url, usage_json[i].args);
    ck_assert_msg(urc == 2, "gmlakectl %s: exit %d, not 2: %s", usage_json[i].args, urc, out);
    ck_assert_msg(!strncmp(out, "{\"error\":{\"code\":-3,\"message\":\"", 31) && strstr(out, usage_json[i].says) &&
                      strchr(out, '\n') == out + strlen(out) - 1,
                  "gmlakectl %s: stdout is not one error object saying \"%s\": %s", usage_json[i].args,
                  usage_json[i].says, out);
  }
  /* limit: a percentage is 1-100% and says so (it said only "bad size '101%'"); bytes over the
   * device's memory are refused (1TiB was taken on a host of 23.5 GiB); within both, set */
  ck_assert_int_eq(sh(out, sizeof out, "%s/gmlakectl --control %s limit 101%% 2>&1", bindir, ctl_url), 2);
  ck_assert_msg(strstr(out, "bad limit '101%' (a share of the device from 1% to 100%"), "%s", out);
  ck_assert_int_eq(sh(out, sizeof out, "%s/gmlakectl --control %s limit 0.5%% 2>&1", bindir, ctl_url), 2);
  ck_assert_int_eq(sh(out, sizeof out, "%s/gmlakectl --control %s limit 1000TiB 2>&1", bindir, ctl_url), 2);
  ck_assert_msg(strstr(out, "limit 1000.00 TiB is more than the device's memory (") && strstr(out, "give at most"),
                "%s", out);
  ck_assert_int_eq(stat_num("limit_bytes"), 16 << 20); /* none of them changed it */
  ck_assert_int_eq(ctl(out, sizeof out, "limit 24MiB"), 0);
  ck_assert_int_eq(stat_num("limit_bytes"), 24 << 20);
  ck_assert_int_eq(ctl(out, sizeof out, "limit 1%"), 0);
  ck_assert_int_gt(stat_num("limit_bytes"), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* A raw hello saying device `device` is `uuid` ("": an older client's hello); the reply, and the
 * connection in *sock. */
static Gmlake__Envelope *hello_as(const char *uuid, int device, int *sock) {
  int s = raw_connect(), fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
  ck_assert_int_ge(s, 0);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT, *in = NULL;
  Gmlake__Hello h = GMLAKE__HELLO__INIT;
  h.protocol_version = GML_PROTOCOL_VERSION;
  h.name = "uuid-test", h.gpu_uuid = (char *)uuid, h.device = device;
  env.seq = 1, env.msg_case = GMLAKE__ENVELOPE__MSG_HELLO, env.hello = &h;
  ck_assert_int_eq(send_env(s, &env, NULL, 0), 0);
  ck_assert_int_eq(gmli_wire_recv(s, &in, fds, &nfds, GML_MAX_LEASE_CHUNKS), 0);
  ck_assert_int_eq(nfds, 0);
  *sock = s;
  return in;
}

/* GPUs are named by UUID (issue 27). A job given physical GPU 1 (CUDA_VISIBLE_DEVICES=1) sees it as its
 * device 0: the daemon of GPU 1 serves it (before: refused, "serves device 1, not device 0", its
 * ordinals compared); one whose device 0 is GPU 0, forced to GPU 1's daemon (GMLAKE_SOCKET), is
 * refused, both GPUs named, and the client reports the daemon's words. On the wire: a hello naming
 * another device of the daemon's backend gets an Error (GML_ENODEV) and the connection closed; one
 * naming none (an older client) or a device of another backend (a client on auto whose driver has a
 * GPU, at a host daemon) is served, and the reply names the daemon's device for the client to compare.
 * The host backend's host-N stand in for GPUs' UUIDs, its CUDA_VISIBLE_DEVICES mapping for the
 * driver's. */
START_TEST(test_hello_names_gpu) {
  if (strcmp(backend, "host")) {
    test_not_run("test_hello_names_gpu", "it names the host backend's devices (host-N)");
    return;
  }
  start_daemon("--device 1 --limit 16MiB --prefetch 0");
  proc a = client_start_env("CUDA_VISIBLE_DEVICES=1");
  const char *line = client_first_line(&a);
  ck_assert_msg(!strncmp(line, "ready ", 6) && strstr(line, " daemon"), "CUDA_VISIBLE_DEVICES=1's device 0: '%s'",
                line);
  ck_assert_str_eq(client_cmd(&a, "alloc %d", 2 << 20), "ok 0");
  ck_assert_int_eq(stat_num("clients"), 1);
  ck_assert_int_eq(client_finish(&a), 0);
  char out[4096];
  ck_assert_int_eq(
      sh(out, sizeof out, "env -u CUDA_VISIBLE_DEVICES %s/gml-testclient %s </dev/null 2>&1", bindir, sock_path), 1);
  ck_assert_msg(strstr(out,
                       "this daemon serves host-1 (device 1); the client's device 0 is host-0: set GMLAKE_SOCKET to "
                       "host-0's daemon or unset it"),
                "device 0 at device 1's daemon: %s", out);
  int s;
  Gmlake__Envelope *r = hello_as("host-5", 2, &s);
  ck_assert_int_eq(r->msg_case, GMLAKE__ENVELOPE__MSG_ERROR);
  ck_assert_int_eq(r->error->code, GML_ENODEV);
  ck_assert_msg(strstr(r->error->message, "this daemon serves host-1 (device 1); the client's device 2 is host-5"),
                "%s", r->error->message);
  ck_assert(closed_by_daemon(s));
  gmlake__envelope__free_unpacked(r, NULL);
  close(s);
  static const char *const served[] = {"", "GPU-6f2b1c3e-8a4d-4e1f-9b2a-0c3d4e5f6a7b"};
  for (size_t i = 0; i < sizeof served / sizeof served[0]; i++) {
    r = hello_as(served[i], 0, &s);
    ck_assert_msg(r->msg_case == GMLAKE__ENVELOPE__MSG_HELLO_REPLY, "hello naming '%s': %d", served[i],
                  (int)r->msg_case);
    ck_assert_str_eq(r->hello_reply->gpu_uuid, "host-1");
    ck_assert_int_eq(r->hello_reply->device, 1);
    gmlake__envelope__free_unpacked(r, NULL);
    close(s);
  }
  ck_assert_int_eq(stat_wait("clients", 0, 2000), 0);
  ck_assert_int_eq(stop_daemon(), 0);
}
END_TEST

/* SIGTERM: clean exit, socket and control files gone; a bad config key is named. */
START_TEST(test_shutdown_and_config) {
  start_daemon("--limit 16MiB");
  char sock_copy[128];
  snprintf(sock_copy, sizeof sock_copy, "%s", sock_path);
  kill(daemon_pid, SIGTERM);
  int st;
  waitpid(daemon_pid, &st, 0);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ck_assert_int_ne(access(sock_copy, F_OK), 0);
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "printf 'backend = host\\nlimit = lots\\n' > %s/bad.conf; "
           "%s/gmlaked --config %s/bad.conf 2>&1 | grep -q 'bad value for limit'",
           tmpdir, bindir, tmpdir);
  ck_assert_int_eq(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("integration");
  TCase *tc = tcase_create("daemon");
  tcase_set_timeout(tc, 120); /* a guard against a hang, not a bound */
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, test_share_between_processes);
  tcase_add_test(tc, test_clients_numbers);
  tcase_add_test(tc, test_client_takes_daemon_chunk_size);
  tcase_add_test(tc, test_bad_environment_with_daemon);
  tcase_add_test(tc, test_sigkill_returns_chunks);
  tcase_add_test(tc, test_growable_range);
  tcase_add_test(tc, test_growable_over_limit);
  tcase_add_test(tc, test_share_attach);
  tcase_add_test(tc, test_dedup);
  tcase_add_test(tc, test_dedup_key_whole_hash);
  tcase_add_test(tc, test_share_other_user);
  tcase_add_test(tc, test_share_key_json);
  tcase_add_test(tc, test_share_outlives_connection);
  tcase_add_test(tc, test_malformed_frames);
  tcase_add_test(tc, test_quota_and_limit);
  tcase_add_test(tc, test_limit_below_held_said);
  tcase_add_test(tc, test_config_fifo_refused);
  tcase_add_test(tc, test_trim);
  tcase_add_test(tc, test_reclaim_between_clients);
  tcase_add_test(tc, test_optional_headroom_leases);
  tcase_add_test(tc, test_leave_after_failed_send);
  if (!getenv("GMLAKE_TEST_NO_PROMETHEUS")) tcase_add_test(tc, test_metrics_parse);
  else test_not_run("test_metrics_parse", "GMLAKE_TEST_NO_PROMETHEUS is set");
  tcase_add_test(tc, test_ctl_json);
  tcase_add_test(tc, test_ctl_errors);
  tcase_add_test(tc, test_refused_connection_says_why);
  tcase_add_test(tc, test_control_beside_socket);
  tcase_add_test(tc, test_hello_names_gpu);
  tcase_add_test(tc, test_shutdown_and_config);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
