/* The library boundary: the error table, the version, the GML_E* codes that
 * common code returns where it used to return -errno or -1; the options
 * table (environment read once, explicit options win); the backend table. */
#include "backend.h"
#include "client_priv.h"
#include "gmlake.h"
#include "gpuname.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include "wire.h"
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

START_TEST(test_error_table) {
  static const struct {
    int code;
    const char *name, *msg;
  } want[] = {
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
  ck_assert_int_eq(gmli_rx_fill(&rx, sv[1]), GML_EAGAIN); /* nothing there yet */
  uint8_t b = 1;
  ck_assert_int_eq(gmli_wire_sendmsg(sv[0], &b, 1, NULL, 0), 1);
  ck_assert_int_eq(gmli_rx_fill(&rx, sv[1]), 1);
  int fds[GML_MAX_LEASE_CHUNKS + 1] = {0};
  ck_assert_int_eq(gmli_wire_sendmsg(sv[0], &b, 1, fds, GML_MAX_LEASE_CHUNKS + 1), GML_EINVAL);
  close(sv[1]);
  ck_assert_int_eq(gmli_wire_sendmsg(sv[0], &b, 1, NULL, 0), GML_EDAEMON); /* EPIPE: the peer is gone */
  ck_assert_int_eq(gmli_wire_send(sv[0], &b, 1, NULL, 0), GML_EDAEMON);
  ck_assert_int_eq(gmli_rx_fill(&rx, -1), GML_ESYS); /* EBADF */
  gmli_rx_free(&rx);
  close(sv[0]);
}
END_TEST

START_TEST(test_parse_codes) {
  uint64_t v;
  ck_assert_int_eq(gmli_parse_size("2MiB", 0, &v), 0);
  ck_assert_uint_eq(v, 2u << 20);
  ck_assert_int_eq(gmli_parse_size("junk", 0, &v), GML_EINVAL);
  ck_assert_int_eq(gmli_parse_size("5%", 0, &v), GML_EINVAL);
  ck_assert_int_eq(gmli_log_parse_level("INFO"), GML_LOG_INFO);
  ck_assert_int_eq(gmli_log_parse_level("loud"), GML_EINVAL);
}
END_TEST

START_TEST(test_env_table) {
  ck_assert_str_eq(gmli_env_name(GML_ENV_BACKEND), "GMLAKE_BACKEND");
  ck_assert_str_eq(gmli_env_default(GML_ENV_BACKEND), "auto");
  ck_assert_str_eq(gmli_env_name(GML_ENV_DAEMON_CONFIG), "GMLAKED_CONFIG");
  for (int i = 0; i < GML_ENV_COUNT; i++)
    for (int j = 0; j < i; j++) ck_assert_str_ne(gmli_env_name((gml_env_id)i), gmli_env_name((gml_env_id)j));
  setenv("GMLAKE_REPLAY_COST", "1,2,3,4", 1);
  ck_assert_str_eq(gmli_env(GML_ENV_REPLAY_COST), "1,2,3,4");
  unsetenv("GMLAKE_REPLAY_COST");
  ck_assert_ptr_null(gmli_env(GML_ENV_REPLAY_COST));
}
END_TEST

START_TEST(test_options_from_env) {
  gml_options o;
  unsetenv("GMLAKE_BACKEND"), unsetenv("GMLAKE_MODE"), unsetenv("GMLAKE_LIBCUDA"), unsetenv("GMLAKE_TIMING");
  gmli_options_from_env(&o);
  ck_assert_str_eq(o.backend, "auto"); /* the one default, for gml_open and the PyTorch entry points */
  ck_assert_int_eq(o.backend_named, 0);
  ck_assert_int_eq(o.mode, 0);
  ck_assert_str_eq(o.libcuda, "libcuda.so.1");
  ck_assert_ptr_null(o.timing);
  setenv("GMLAKE_BACKEND", "host", 1);
  setenv("GMLAKE_MODE", "embedded", 1);
  setenv("GMLAKE_TIMING", "1", 1);
  setenv("GMLAKE_VA_SIZE", "70GiB", 1);
  gmli_options_from_env(&o);
  ck_assert_str_eq(o.backend, "host");
  ck_assert_int_eq(o.backend_named, 1);
  ck_assert_int_eq(o.mode, GML_MODE_EMBEDDED);
  ck_assert_str_eq(o.timing, "1");
  ck_assert_str_eq(o.va_size, "70GiB");
  setenv("GMLAKE_MODE", "sometimes", 1);
  gmli_options_from_env(&o);
  ck_assert_int_eq(o.mode, -1); /* not a mode: gml_open refuses it (test_env_refused) */
  ck_assert_str_eq(o.mode_text, "sometimes");
  setenv("GMLAKE_MODE", "", 1); /* empty is unset */
  gmli_options_from_env(&o);
  ck_assert_int_eq(o.mode, 0);
  setenv("GMLAKE_MODE", "embedded", 1);
  /* gml_open reads them, and explicit options win */
  gml_client *c;
  gml_open_opts oo = {.backend = "cuda", .mode = GML_MODE_EMBEDDED};
  setenv("GMLAKE_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  ck_assert_int_eq(gml_open(&oo, &c), GML_ENODEV); /* opts.backend beats GMLAKE_BACKEND=host */
  oo.backend = NULL;
  ck_assert_int_eq(gml_open(&oo, &c), 0); /* GMLAKE_BACKEND=host */
  gml_stats st;
  ck_assert_int_eq(gml_stats_get(c, &st), 0);
  ck_assert_str_eq(st.backend, "host");
  gml_close(c);
  unsetenv("GMLAKE_BACKEND"), unsetenv("GMLAKE_MODE"), unsetenv("GMLAKE_TIMING"), unsetenv("GMLAKE_VA_SIZE");
  unsetenv("GMLAKE_LIBCUDA");
}
END_TEST

/* What the library says on stderr meanwhile: begin_stderr, then end_stderr
 * fills the buffer. */
static int saved_stderr = -1;
static char stderr_path[64];
static void begin_stderr(void) {
  snprintf(stderr_path, sizeof stderr_path, "/tmp/gml-api-stderr.XXXXXX");
  int fd = mkstemp(stderr_path);
  ck_assert_int_ge(fd, 0);
  fflush(stderr);
  saved_stderr = dup(2);
  dup2(fd, 2);
  close(fd);
}
static const char *end_stderr(void) {
  static char text[8192];
  fflush(stderr);
  dup2(saved_stderr, 2);
  close(saved_stderr);
  FILE *f = fopen(stderr_path, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  unlink(stderr_path);
  return text;
}

static int open_saying(const gml_open_opts *o, gml_client **c, const char **said) {
  begin_stderr();
  int rc = gml_open(o, c);
  *said = end_stderr();
  return rc;
}

static void unset_all(void) {
  const char *vars[] = {"GMLAKE_MODE",           "GMLAKE_BACKEND",    "GMLAKE_LIMIT",  "GMLAKE_VA_SIZE",
                        "GMLAKE_TIMING",         "GMLAKE_LOG",        "GMLAKE_BORROW", "GMLAKE_BORROW_MAX",
                        "GMLAKE_BORROW_RATIO",   "GMLAKE_CHUNK_SIZE", "GMLAKE_SOCKET", "GMLAKE_STREAM_MAP",
                        "GMLAKE_GUARD_BACKTRACE"};
  for (size_t i = 0; i < GML_ARRAY_LEN(vars); i++) unsetenv(vars[i]);
  gmli_log_set_level(-1);
}

/* Where memory comes from and how much a process may take: a value that
 * cannot be read refuses gml_open, naming the variable, the value and what
 * it accepts, never a guess (a typo of embedded used to connect to the
 * daemon; a limit of "lots" ran without one). */
START_TEST(test_env_refused) {
  unset_all();
  setenv("GMLAKE_SOCKET", "/nonexistent/gmlake.sock", 1);
  gml_open_opts host = {.backend = "host"};
  gml_client *c = NULL;
  const char *said;
  const char *modes[] = {"sometimes", "embeded", "Daemon"};
  for (size_t i = 0; i < GML_ARRAY_LEN(modes); i++) {
    setenv("GMLAKE_MODE", modes[i], 1);
    ck_assert_int_eq(open_saying(&host, &c, &said), GML_EINVAL);
    char want[128];
    snprintf(want, sizeof want, "GMLAKE_MODE=%s: not a mode; it accepts daemon, embedded", modes[i]);
    ck_assert_msg(strstr(said, want), "%s", said);
    ck_assert_msg(!strstr(said, "running embedded"), "%s", said); /* it did not go on */
  }
  gml_open_opts mode5 = {.backend = "host", .mode = 5};
  unsetenv("GMLAKE_MODE");
  ck_assert_int_eq(open_saying(&mode5, &c, &said), GML_EINVAL);
  ck_assert_msg(strstr(said, "gml_open_opts.mode 5: not a mode"), "%s", said);
  /* guard and borrow too (guard 7 opened, guard mode off or on by the variable, silently) */
  gml_open_opts guard7 = {.backend = "host", .mode = GML_MODE_EMBEDDED, .guard = 7};
  ck_assert_int_eq(open_saying(&guard7, &c, &said), GML_EINVAL);
  ck_assert_msg(strstr(said, "gml_open_opts.guard 7: not a guard mode"), "%s", said);
  gml_open_opts borrow2 = {.backend = "host", .mode = GML_MODE_EMBEDDED, .borrow = 2};
  ck_assert_int_eq(open_saying(&borrow2, &c, &said), GML_EINVAL);
  ck_assert_msg(strstr(said, "gml_open_opts.borrow 2: 0 (as GMLAKE_BORROW says), 1 (on) or -1 (off)"), "%s", said);

  setenv("GMLAKE_MODE", "embedded", 1);
  const char *limits[] = {"lots", "8 GB of it", "150%", "-1", "0", "0%"}; /* 0 and 0%: no limit at all, silently */
  for (size_t i = 0; i < GML_ARRAY_LEN(limits); i++) {
    setenv("GMLAKE_LIMIT", limits[i], 1);
    ck_assert_int_eq(open_saying(&host, &c, &said), GML_EINVAL);
    char want[128];
    snprintf(want, sizeof want, "GMLAKE_LIMIT=%s: not a limit; it accepts bytes", limits[i]);
    ck_assert_msg(strstr(said, want) && strstr(said, "a share of the device from 1% to 100% (40%)"), "%s", said);
  }
  gml_open_opts host_limited = {.backend = "host",
                                .limit_bytes = 8 << 20}; /* explicit wins: the variable is not read */
  ck_assert_int_eq(open_saying(&host_limited, &c, &said), 0);
  gml_close(c);
  setenv("GMLAKE_LIMIT", "8MiB", 1); /* read right, it holds */
  ck_assert_int_eq(gml_open(&host, &c), 0);
  gml_mem_stats m;
  ck_assert_int_eq(gml_mem_stats_get(c, &m), 0);
  ck_assert_int_eq(m.limit_bytes, 8 << 20);
  void *p = NULL;
  ck_assert_int_eq(gml_alloc(c, 16 << 20, 0, &p), GML_ENOMEM);
  gml_close(c);
  unsetenv("GMLAKE_LIMIT");

  /* a backend that does not exist is said to be one, embedded or through a
   * daemon (it used to be "daemon runs the host backend, gpu was asked for") */
  gml_open_opts any = {0};
  setenv("GMLAKE_BACKEND", "gpu", 1);
  const char *mode_of[] = {"embedded", "daemon", NULL};
  for (size_t i = 0; i < GML_ARRAY_LEN(mode_of); i++) {
    if (mode_of[i]) setenv("GMLAKE_MODE", mode_of[i], 1);
    else unsetenv("GMLAKE_MODE");
    ck_assert_int_eq(open_saying(&any, &c, &said), GML_EINVAL);
    ck_assert_msg(strstr(said, "GMLAKE_BACKEND=gpu: not a backend; it accepts auto, cuda, host"), "%s", said);
    ck_assert_msg(!strstr(said, "was asked for") && !strstr(said, "no daemon"), "%s", said);
  }
  gml_open_opts gpu = {.backend = "gpu"};
  ck_assert_int_eq(open_saying(&gpu, &c, &said), GML_EINVAL);
  ck_assert_msg(strstr(said, "gml_open_opts.backend \"gpu\": not a backend; it accepts auto, cuda, host"), "%s", said);
  ck_assert_int_eq(open_saying(&host, &c, &said), 0); /* the explicit backend wins over a bad GMLAKE_BACKEND */
  gml_close(c);
  unset_all();
}
END_TEST

/* Tuning knobs: a bad value warns, naming the variable, the value and what
 * is used instead, and gml_open goes on. */
START_TEST(test_env_warned) {
  unset_all();
  gml_open_opts host = {.backend = "host", .mode = GML_MODE_EMBEDDED};
  gml_client *c = NULL;
  const char *said;
  void *p = NULL;
  setenv("GMLAKE_VA_SIZE", "junk", 1);
  ck_assert_int_eq(open_saying(&host, &c, &said), 0);
  ck_assert_msg(strstr(said, "GMLAKE_VA_SIZE=junk: not a size (bytes, e.g. 256GiB); using the default, "), "%s", said);
  gml_close(c);
  setenv("GMLAKE_VA_SIZE", "1MiB", 1); /* a size, but less than the 64 chunks the allocator needs: 64 chunks */
  ck_assert_int_eq(open_saying(&host, &c, &said), 0);
  ck_assert_msg(
      strstr(said, "GMLAKE_VA_SIZE=1MiB: less than the 64 chunks of 2.00 MiB the allocator needs; using 128.00 MiB"),
      "%s", said);
  ck_assert_int_eq(gml_alloc(c, 64 << 20, 0, &p), 0);
  ck_assert_int_eq(gml_free(c, p), 0);
  ck_assert_int_eq(gml_alloc(c, (64 << 20) + 512, 0, &p), GML_ENOMEM); /* over half of 128 MiB */
  gml_close(c);
  unsetenv("GMLAKE_VA_SIZE");

  struct {
    const char *var, *value, *said;
  } knobs[] = {
      {"GMLAKE_TIMING", "yes", "GMLAKE_TIMING=yes: 0 or 1 was expected; using 0"},
      {"GMLAKE_STREAM_MAP", "on", "GMLAKE_STREAM_MAP=on: 0 or 1 was expected; using 0"},
      {"GMLAKE_BORROW", "2", "GMLAKE_BORROW=2: 0 or 1 was expected; using 0"},
      {"GMLAKE_GUARD_BACKTRACE", "true", "GMLAKE_GUARD_BACKTRACE=true: 0 or 1 was expected; using 0"},
      {"GMLAKE_BORROW_MAX", "8x", "GMLAKE_BORROW_MAX=8x: 0 to 64 was expected; using 8"},
      {"GMLAKE_BORROW_MAX", "lots", "GMLAKE_BORROW_MAX=lots: 0 to 64 was expected; using 8"},
      {"GMLAKE_BORROW_RATIO", "2x", "GMLAKE_BORROW_RATIO=2x: a number >= 1 was expected; using 1.5"},
      {"GMLAKE_CHUNK_SIZE", "3000", "GMLAKE_CHUNK_SIZE=3000 ignored: a size that is a multiple of"},
  };
  for (size_t i = 0; i < GML_ARRAY_LEN(knobs); i++) {
    setenv(knobs[i].var, knobs[i].value, 1);
    ck_assert_int_eq(open_saying(&host, &c, &said), 0);
    ck_assert_msg(strstr(said, knobs[i].said), "%s=%s said: %s", knobs[i].var, knobs[i].value, said);
    gml_close(c);
    unsetenv(knobs[i].var);
  }
  /* the one read outside gml_options (client/link.c): the same parse */
  begin_stderr();
  ck_assert_int_eq(gmli_env_flag(GML_ENV_RECONNECT, "yes", 1), 1);
  ck_assert_int_eq(gmli_env_flag(GML_ENV_RECONNECT, "0", 1), 0);
  ck_assert_int_eq(gmli_env_flag(GML_ENV_RECONNECT, NULL, 1), 1);
  said = end_stderr();
  ck_assert_msg(strstr(said, "GMLAKE_RECONNECT=yes: 0 or 1 was expected; using 1"), "%s", said);
  ck_assert_msg(!strstr(said, "GMLAKE_RECONNECT=0"), "%s", said);

  /* GMLAKE_LOG: read at the first line logged */
  setenv("GMLAKE_LOG", "loud", 1);
  gmli_log_set_level(-1);
  begin_stderr();
  GML_WARN("first line");
  GML_INFO("not shown at warn");
  said = end_stderr();
  ck_assert_msg(strstr(said, "GMLAKE_LOG=loud: not a level (error, warn, info, debug); using warn") &&
                    strstr(said, "first line") && !strstr(said, "not shown"),
                "%s", said);
  unset_all();
}
END_TEST

/* An allocation over half the virtual range says which bound it hit and
 * which variable raises it (it said "invalid size 104857600"). */
START_TEST(test_va_size_bound_message) {
  unset_all();
  setenv("GMLAKE_VA_SIZE", "128MiB", 1);
  gml_open_opts host = {.backend = "host", .mode = GML_MODE_EMBEDDED};
  gml_client *c = NULL;
  ck_assert_int_eq(gml_open(&host, &c), 0);
  gml_trace_enable(c, 16);
  void *p = NULL, *q = NULL;
  ck_assert_int_eq(gml_alloc(c, 100 << 20, 0, &p), GML_ENOMEM);
  const char *e = gml_last_error(c);
  ck_assert_msg(strstr(e, "100.00 MiB is more than half the 128.00 MiB of virtual address space reserved "
                          "(GMLAKE_VA_SIZE raises it)"),
                "%s", e);
  ck_assert_msg(!strstr(e, "invalid size"), "%s", e);
  gml_mem_stats m;
  ck_assert_int_eq(gml_mem_stats_get(c, &m), 0);
  ck_assert_int_eq(m.num_ooms, 1); /* an OOM to PyTorch as before, with no retry: none can help */
  ck_assert_int_eq(m.num_alloc_retries, 0);
  gml_trace_entry t[16];
  size_t n;
  ck_assert_int_eq(gml_trace_read(c, t, 16, &n), 0);
  ck_assert_uint_ge(n, 1);
  ck_assert_int_eq(t[n - 1].action, GML_TRACE_OOM);
  ck_assert_int_eq(gml_alloc(c, 64 << 20, 0, &q), 0); /* half is allowed */
  gml_free(c, q);
  gml_close(c);
  setenv("GMLAKE_VA_SIZE", "256MiB", 1); /* raised, it fits */
  ck_assert_int_eq(gml_open(&host, &c), 0);
  ck_assert_int_eq(gml_alloc(c, 100 << 20, 0, &p), 0);
  gml_free(c, p);
  gml_close(c);
  unset_all();
}
END_TEST

/* Threads allocating on one client at once, each holding a block while it
 * asks for the next: num_ooms counts each failed allocation exactly once.
 * (gml_alloc_ex snapshots num_ooms to tell its own OOM from another cause;
 * that read, the compare and every increment are under track_lock.) */
enum { OOM_THREADS = 4, OOM_ROUNDS = 300 };
static gml_client *oom_client;
static int oom_failed;
static void *oom_worker(void *arg) {
  (void)arg;
  void *held = NULL; /* each thread holds a block while it asks for the next: 4 x 3-6 MiB > 8 MiB */
  for (int i = 0; i < OOM_ROUNDS; i++) {
    void *p = NULL;
    int rc = gml_alloc(oom_client, (size_t)(3 + i % 4) << 20, 0, &p);
    if (rc) {
      ck_assert_int_eq(rc, GML_ENOMEM);
      __atomic_fetch_add(&oom_failed, 1, __ATOMIC_RELAXED);
    }
    if (held) gml_free(oom_client, held);
    held = p;
  }
  if (held) gml_free(oom_client, held);
  return NULL;
}
START_TEST(test_oom_count_threads) {
  unset_all();
  gml_open_opts host = {.backend = "host", .mode = GML_MODE_EMBEDDED, .limit_bytes = 8 << 20};
  ck_assert_int_eq(gml_open(&host, &oom_client), 0);
  oom_failed = 0;
  pthread_t t[OOM_THREADS];
  for (int i = 0; i < OOM_THREADS; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, oom_worker, NULL), 0);
  for (int i = 0; i < OOM_THREADS; i++) pthread_join(t[i], NULL);
  gml_mem_stats m;
  ck_assert_int_eq(gml_mem_stats_get(oom_client, &m), 0);
  ck_assert_int_eq(m.num_ooms, oom_failed);
  ck_assert_int_gt(oom_failed, 0); /* the load did fail some */
  ck_assert_int_eq(m.allocation.current, 0);
  gml_close(oom_client);
}
END_TEST

/* Every error a call on a client returns comes with a message in
 * gml_last_error naming the call and what was wrong with which argument,
 * never the previous call's: gml_alloc(c, 0) showed the last OOM (a
 * virtual-address problem), growable create(0) / shrink past the end an
 * empty or stale message. Each expectation differs from the one before, so
 * a message left over from the previous call fails. */
#define SAYS(call, code, text)                                                                                         \
  do {                                                                                                                 \
    int rc_ = (call);                                                                                                  \
    ck_assert_msg(rc_ == (code), "%s: %s, expected %s", #call, gml_errname(rc_), gml_errname(code));                   \
    ck_assert_msg(strstr(gml_last_error(c), text), "%s: gml_last_error is \"%s\", expected \"%s\" in it", #call,       \
                  gml_last_error(c), text);                                                                            \
  } while (0)
START_TEST(test_error_messages_name_the_argument) {
  unset_all();
  setenv("GMLAKE_VA_SIZE", "128MiB", 1);
  gml_open_opts host = {.backend = "host", .mode = GML_MODE_EMBEDDED};
  gml_client *c = NULL;
  ck_assert_int_eq(gml_open(&host, &c), 0);
  void *p = NULL, *q = NULL;
  SAYS(gml_alloc(c, 100 << 20, 0, &p), GML_ENOMEM, "virtual address space");
  SAYS(gml_alloc(c, 0, 0, &p), GML_EINVAL, "gml_alloc: size 0");
  ck_assert_msg(!strstr(gml_last_error(c), "virtual"), "%s", gml_last_error(c));
  SAYS(gml_alloc(c, 4096, 0, NULL), GML_EINVAL, "gml_alloc: ptr");
  ck_assert_int_eq(gml_alloc(c, 4096, 0, &q), 0);
  SAYS(gml_free(c, (char *)q + 512), GML_EBADPTR, "free of");
  SAYS(gml_size_of(c, (char *)q + 512, NULL, NULL), GML_EBADPTR, "gml_size_of:");
  SAYS(gml_record_stream(c, (char *)q + 512, 1), GML_EBADPTR, "gml_record_stream:");
  SAYS(gml_stats_get(c, NULL), GML_EINVAL, "gml_stats_get: out is NULL");
  SAYS(gml_mem_stats_get(c, NULL), GML_EINVAL, "gml_mem_stats_get: out is NULL");
  SAYS(gml_device_memory(c, NULL, NULL), GML_EINVAL, "gml_device_memory: free_bytes");
  SAYS(gml_write(c, NULL, q, 1), GML_EINVAL, "gml_write: dst");
  SAYS(gml_read(c, q, NULL, 1), GML_EINVAL, "gml_read: src");
  gml_block_info bi;
  SAYS(gml_block_of(c, (void *)16, &bi), GML_EBADPTR, "gml_block_of:");
  SAYS(gml_block_of(c, q, NULL), GML_EINVAL, "gml_block_of: info");
  SAYS(gml_block_list(c, NULL, 3), GML_EINVAL, "gml_block_list:");
  size_t n;
  SAYS(gml_trace_read(c, NULL, 0, NULL), GML_EINVAL, "gml_trace_read: n");
  SAYS(gml_allocations(c, NULL, 4, &n), GML_EINVAL, "gml_allocations: out");
  SAYS(gml_segments(c, NULL, 0, NULL, NULL, 0, &n, NULL), GML_EINVAL, "gml_segments: nsegs");
  gml_pool_id pid = {7, 8};
  SAYS(gml_pool_end(c, pid), GML_EINVAL, "gml_pool_end: pool (7, 8) does not exist");
  SAYS(gml_pool_release(c, pid), GML_EINVAL, "gml_pool_release: pool (7, 8)");
  SAYS(gml_pool_use_count(c, pid), GML_EINVAL, "gml_pool_use_count: pool (7, 8)");
  SAYS(gml_pool_live(c, pid, NULL, 2, &n), GML_EINVAL, "gml_pool_live: ptrs");
  gml_pool_ckpt *k = NULL;
  SAYS(gml_pool_checkpoint(c, pid, &k), GML_EINVAL, "checkpoint: no pool (7, 8)");
  SAYS(gml_pool_checkpoint(c, pid, NULL), GML_EINVAL, "gml_pool_checkpoint: out");
  gml_ipc_handle h;
  memset(&h, 0, sizeof h);
  SAYS(gml_ipc_export(c, (char *)q + 512, &h), GML_EBADPTR, "gml_ipc_export:");
  SAYS(gml_ipc_open(c, &h, &p, NULL), GML_EINVAL, "gml_ipc_open: the handle is not");
  SAYS(gml_ipc_close(c, q), GML_EBADPTR, "gml_ipc_close:");
  SAYS(gml_pause(c, 8, 0), GML_EINVAL, "gml_pause: flags 0x8");
  SAYS(gml_pause(c, GML_PAUSE_FILE, 0), GML_EINVAL, "gml_pause: GML_PAUSE_FILE needs a path");
  gml_growable *g = NULL;
  SAYS(gml_growable_create(c, 0, &g), GML_EINVAL, "gml_growable_create: max_bytes 0");
  SAYS(gml_growable_create(c, 1 << 20, NULL), GML_EINVAL, "gml_growable_create: out");
  ck_assert_int_eq(gml_growable_create(c, 8 << 20, &g), 0);
  SAYS(gml_growable_shrink(g, 100 << 20), GML_EINVAL, "gml_growable_shrink: to 104857600 bytes, past the end");
  SAYS(gml_growable_ensure(g, 100 << 20), GML_EINVAL, "gml_growable_ensure:");
  SAYS(gml_growable_map(g, 1, 0), GML_EINVAL, "not chunk-aligned");
  SAYS(gml_growable_is_mapped(g, 8 << 20), GML_EINVAL, "gml_growable_is_mapped: offset 8388608");
  SAYS(gml_growable_info_get(g, NULL), GML_EINVAL, "gml_growable_info_get: out");
  ck_assert_int_eq(gml_growable_destroy(g), 0);
  ck_assert_int_eq(gml_free(c, q), 0);
  gml_close(c);
  unset_all();
}
END_TEST
#undef SAYS

/* Backends come from one table: names, auto's order, the daemon's default limit. */
START_TEST(test_backend_table) {
  ck_assert(gmli_backend_known("auto") && gmli_backend_known("cuda") && gmli_backend_known("host"));
  ck_assert(!gmli_backend_known("gpu") && !gmli_backend_known(NULL));
  ck_assert_str_eq(gmli_backend_names(), "auto, cuda, host");
  gml_backend *be = NULL;
  char msg[512];
  ck_assert_int_eq(gmli_backend_open("gpu", 0, NULL, &be, msg, sizeof msg), GML_EINVAL);
  ck_assert_msg(strstr(msg, "unknown backend 'gpu' (auto, cuda, host)"), "%s", msg);
  gml_backend_opts no_cuda = {.libcuda = "/nonexistent/libcuda.so.1"}; /* GMLAKE_LIBCUDA, passed down */
  ck_assert_int_eq(gmli_backend_open("cuda", 0, &no_cuda, &be, msg, sizeof msg), GML_ENODEV);
  ck_assert_msg(!strncmp(msg, "cannot load /nonexistent/libcuda.so.1 (", 39), "%s", msg);
  ck_assert_int_eq(gmli_backend_open("auto", 0, &no_cuda, &be, msg, sizeof msg), 0);
  ck_assert_str_eq(be->name, "host");
  ck_assert_msg(!strncmp(msg, "backend auto: picked host (no usable GPU: ", 42), "%s", msg);
  ck_assert_str_eq(gmli_backend_default_limit(be), "50%");
  gmli_backend_close(be);
}
END_TEST

/* Devices named without opening them (issue 27, common/gpuname.h): the host
 * backend maps a visible ordinal through CUDA_VISIBLE_DEVICES as the driver
 * does (so host tests take a GPU client's path), a daemon's --device resolves
 * N or host-N on the host and nothing else, auto passes over a cuda that is
 * not there, and PCI bus ids parse in nvidia-smi's and the driver's forms. */
START_TEST(test_device_names) {
  gml_backend_opts no_cuda = {.libcuda = "/nonexistent/libcuda.so.1"};
  char uuid[GML_UUID_MAX], msg[512];
  static const struct {
    const char *visible;
    int ordinal;
    const char *uuid;
  } maps[] = {
      {NULL, 0, "host-0"},           {NULL, 4, "host-4"},       {"3", 0, "host-3"},
      {"3,1", 1, "host-1"},          {"host-7,2", 0, "host-7"}, {"3", 1, "host-1"},
      {"GPU-6f2b1c3e", 0, "host-0"}, {"", 2, "host-2"},
  };
  for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++) {
    if (maps[i].visible) setenv("CUDA_VISIBLE_DEVICES", maps[i].visible, 1);
    else unsetenv("CUDA_VISIBLE_DEVICES");
    ck_assert_int_eq(gmli_backend_device_uuid("auto", maps[i].ordinal, &no_cuda, uuid), 0);
    ck_assert_msg(!strcmp(uuid, maps[i].uuid), "CUDA_VISIBLE_DEVICES=%s, ordinal %d: %s, not %s", maps[i].visible,
                  maps[i].ordinal, uuid, maps[i].uuid);
  }
  setenv("CUDA_VISIBLE_DEVICES", "3", 1); /* an embedded host client names its device the same */
  gml_backend *be = NULL;
  ck_assert_int_eq(gmli_backend_open("host", 0, NULL, &be, msg, sizeof msg), 0);
  ck_assert_str_eq(be->uuid, "host-3");
  ck_assert_int_eq(be->device, 0);
  gmli_backend_close(be);
  unsetenv("CUDA_VISIBLE_DEVICES");
  ck_assert_int_eq(gmli_backend_device_uuid("cuda", 0, &no_cuda, uuid), GML_ENODEV);
  ck_assert_str_eq(uuid, "");
  const char *picked = NULL;
  int dev = -1;
  ck_assert_int_eq(gmli_backend_resolve("host", "host-5", NULL, &picked, &dev, msg, sizeof msg), 0);
  ck_assert_str_eq(picked, "host");
  ck_assert_int_eq(dev, 5);
  ck_assert_int_eq(gmli_backend_resolve("auto", "2", &no_cuda, &picked, &dev, msg, sizeof msg), 0);
  ck_assert_str_eq(picked, "host");
  ck_assert_int_eq(dev, 2);
  ck_assert_msg(strstr(msg, "backend auto: picked host for device 2 (cuda: cannot load"), "%s", msg);
  ck_assert_int_eq(gmli_backend_resolve("host", "GPU-6f2b1c3e-8a4d", NULL, &picked, &dev, msg, sizeof msg), GML_ENODEV);
  ck_assert_msg(strstr(msg, "the host backend's devices are host-N or N"), "%s", msg);
  ck_assert_int_eq(gmli_backend_resolve("cuda", "GPU-6f2b1c3e-8a4d", &no_cuda, &picked, &dev, msg, sizeof msg),
                   GML_ENODEV);
  ck_assert_msg(strstr(msg, "no device GPU-6f2b1c3e-8a4d: cuda: cannot load"), "%s", msg);
  unsigned v[4];
  ck_assert(gmli_pci_bus_id_parse("00000000:3B:00.0", v) && v[0] == 0 && v[1] == 0x3b && v[2] == 0 && v[3] == 0);
  ck_assert(gmli_pci_bus_id_parse("0001:af:1f.7", v) && v[0] == 1 && v[1] == 0xaf && v[2] == 0x1f && v[3] == 7);
  ck_assert(gmli_pci_bus_id_parse("3b:00.0", v) && v[1] == 0x3b);
  ck_assert(!gmli_pci_bus_id_parse("3b:00", v) && !gmli_pci_bus_id_parse("GPU-3b", v) &&
            !gmli_pci_bus_id_parse("3b:20.0", v));
  ck_assert(gmli_uuid_same("GPU-6F2B1C3E", "gpu-6f2b1c3e") && !gmli_uuid_same("host-1", "host-10") &&
            !gmli_uuid_same("", ""));
  ck_assert_str_eq(gmli_uuid_backend("host-3"), "host");
  ck_assert_str_eq(gmli_uuid_backend("GPU-6f2b1c3e"), "cuda");
}
END_TEST

/* The PyTorch entry points open with the one default (auto) but take no host
 * memory they did not ask for: PyTorch would use it as device memory. */
START_TEST(test_torch_default_backend) {
  setenv("GMLAKE_LIBCUDA", "/nonexistent/libcuda.so.1", 1); /* no usable GPU, even on a GPU machine */
  setenv("GMLAKE_SOCKET", "/nonexistent/gmlake.sock", 1);
  unsetenv("GMLAKE_BACKEND");
  ck_assert_ptr_null(gml_device_client(5));         /* auto fell back to host: refused */
  ck_assert_ptr_null(gml_device_client_if_open(5)); /* and no client was kept */
  setenv("GMLAKE_BACKEND", "host", 1);
  gml_client *c = gml_device_client(6); /* named: taken */
  ck_assert_ptr_nonnull(c);
  void *p = NULL;
  ck_assert_int_eq(gml_alloc(c, 1 << 20, 0, &p), 0);
  gml_stats st;
  ck_assert_int_eq(gml_stats_get(c, &st), 0);
  ck_assert_str_eq(st.backend, "host");
  gml_free(c, p);
  unsetenv("GMLAKE_BACKEND"), unsetenv("GMLAKE_SOCKET"), unsetenv("GMLAKE_LIBCUDA");
}
END_TEST

/* gml_set_option: the library's options set in place of the environment,
 * which stays as it was; NULL gives it back, "" unsets; another program's
 * variable or an unknown one is refused. */
START_TEST(test_set_option) {
  ck_assert_int_eq(gml_set_option("GMLAKE_NOPE", "1"), GML_EINVAL);
  ck_assert_int_eq(gml_set_option("CUDA_VISIBLE_DEVICES", "1"), GML_EINVAL); /* the driver reads it too */
  ck_assert_int_eq(gml_set_option("GMLAKED_CONFIG", "/x"), GML_EINVAL);      /* the daemon's */
  ck_assert_int_eq(gml_set_option(NULL, "1"), GML_EINVAL);
  setenv("GMLAKE_MODE", "daemon", 1);
  setenv("GMLAKE_SOCKET", "/nonexistent/gmlake.sock", 1);
  unsetenv("GMLAKE_BACKEND");
  gml_client *c = NULL;
  ck_assert_int_ne(gml_open(NULL, &c), 0); /* the environment's: a daemon, and there is none */
  ck_assert_int_eq(gml_set_option("GMLAKE_MODE", "embedded"), 0);
  ck_assert_int_eq(gml_set_option("GMLAKE_BACKEND", "host"), 0);
  ck_assert_int_eq(gml_open(NULL, &c), 0);
  gml_stats st;
  ck_assert_int_eq(gml_stats_get(c, &st), 0);
  ck_assert_int_eq(st.mode, GML_MODE_EMBEDDED);
  ck_assert_str_eq(st.backend, "host");
  ck_assert_int_eq(gml_close(c), 0);
  ck_assert_str_eq(getenv("GMLAKE_MODE"), "daemon");
  ck_assert_ptr_null(getenv("GMLAKE_BACKEND"));
  ck_assert_int_eq(gml_set_option("GMLAKE_MODE", ""), 0); /* unset: the daemon if one answers, else embedded */
  ck_assert_int_eq(gml_open(NULL, &c), 0);
  ck_assert_int_eq(gml_close(c), 0);
  ck_assert_int_eq(gml_set_option("GMLAKE_MODE", NULL), 0); /* the environment's again */
  ck_assert_int_ne(gml_open(NULL, &c), 0);
  unsetenv("GMLAKE_MODE"), unsetenv("GMLAKE_SOCKET");
}
END_TEST

/* gml_mem_info embedded: total is the limit (not the host's memory), free what
 * is left of it with the cache counted; a lower limit (PyTorch's memory
 * fraction) lowers both; the daemon's answer: test_elastic's test_mem_info_*. */
START_TEST(test_mem_info_embedded) {
  unset_all();
  gml_client *c;
  gml_open_opts host = {.backend = "host", .mode = GML_MODE_EMBEDDED, .limit_bytes = 16 << 20};
  ck_assert_int_eq(gml_open(&host, &c), 0);
  size_t fr = 0, to = 0;
  ck_assert_int_eq(gml_mem_info(c, &fr, &to), 0);
  ck_assert_uint_eq(to, 16 << 20);
  ck_assert_uint_eq(fr, 16 << 20);
  void *p, *q;
  ck_assert_int_eq(gml_alloc(c, 3 << 20, 0, &p), 0);
  ck_assert_int_eq(gml_mem_info(c, &fr, &to), 0);
  ck_assert_uint_eq(fr, 13 << 20);              /* what it holds beyond 3 MiB is its cache: free too */
  ck_assert_int_eq(gml_alloc(c, fr, 0, &q), 0); /* all it said is free is there */
  ck_assert_int_eq(gml_mem_info(c, &fr, &to), 0);
  ck_assert_uint_eq(fr, 0);
  ck_assert_int_eq(gml_free(c, q), 0);
  ck_assert_int_eq(gml_set_limit(c, 8 << 20), 0);
  ck_assert_int_eq(gml_mem_info(c, &fr, &to), 0);
  ck_assert_uint_eq(to, 8 << 20);
  ck_assert_uint_le(fr, 8 << 20);
  ck_assert_int_eq(gml_mem_info(c, NULL, &to), GML_EINVAL);
  ck_assert_ptr_nonnull(strstr(gml_last_error(c), "gml_mem_info: free_bytes"));
  ck_assert_int_eq(gml_mem_info(NULL, &fr, &to), GML_EINVAL);
  gml_close(c);
}
END_TEST
Suite *api_suite(void) {
  Suite *s = suite_create("api");
  TCase *tc = tcase_create("api");
  tcase_add_test(tc, test_error_table);
  tcase_add_test(tc, test_version);
  tcase_add_test(tc, test_wire_codes);
  tcase_add_test(tc, test_parse_codes);
  tcase_add_test(tc, test_env_table);
  tcase_add_test(tc, test_options_from_env);
  tcase_add_test(tc, test_env_refused);
  tcase_add_test(tc, test_env_warned);
  tcase_add_test(tc, test_va_size_bound_message);
  tcase_add_test(tc, test_oom_count_threads);
  tcase_add_test(tc, test_error_messages_name_the_argument);
  tcase_add_test(tc, test_backend_table);
  tcase_add_test(tc, test_device_names);
  tcase_add_test(tc, test_torch_default_backend);
  tcase_add_test(tc, test_set_option);
  tcase_add_test(tc, test_mem_info_embedded);
  suite_add_tcase(s, tc);
  return s;
}
