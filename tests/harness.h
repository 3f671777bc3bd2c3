/* The harness of the multi-process suites (test_integration, test_elastic,
 * test_security): a real gmlaked in a temp dir, gml-testclient processes
 * driven line by line, gmlakectl, and raw connections on the client wire.
 * Each test runs in its own forked process (check's CK_FORK), so the state
 * below is per test; a suite's setup calls harness_setup() first. */
#ifndef GML_TESTS_HARNESS_H
#define GML_TESTS_HARNESS_H
#include "wire.h"
#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* Where the binaries are ($BUILD, default build) and the running daemon's
 * temp dir, client socket and control URL. */
extern char bindir[128], tmpdir[64], sock_path[100], ctl_url[128];
extern pid_t daemon_pid;
extern const char *backend;         /* gmlaked --backend: "host" unless the suite sets another */
extern const char *daemon_env;      /* shell text before gmlaked's exec, e.g. "GMLAKE_CHUNK_SIZE=4MiB " */
extern const char *tmpdir_template; /* mkdtemp's template for start_daemon's dir */
extern int tmpdir_mode;             /* non-zero: start_daemon chmods its dir to it (other uids reach the sockets) */
extern int ctl_quiet;               /* 1: gmlakectl's stderr to /dev/null */
extern int client_as_uid;           /* >= 0: the next client runs as that uid (setpriv; root only) */
extern const char
    *client_stderr; /* non-NULL: the next clients' stderr is appended to that file (its log, for log_wait_in) */

/* bindir from $BUILD, 2 MiB chunks in the environment (the tests count them), daemon_env "". */
void harness_setup(void);
void msleep(int ms);

/* Run a shell command (printf-style); its stdout into out (2>&1 in it for stderr too); its exit status. */
int sh(char *out, size_t outlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* gmlakectl with args (as uid when uid >= 0, stderr kept); stdout into out; its exit status. */
int ctl_as(int uid, char *out, size_t outlen, const char *args);
int ctl(char *out, size_t outlen, const char *args);
long long json_num(const char *json, const char *key); /* the number after "key": (-1: none) */
long long stat_num(const char *key);                   /* a field of `gmlakectl stats --json` (-1: none) */
/* Poll a stat every step_ms, at most tries times (20 s at least), until it equals want; its last value. */
long long stat_poll(const char *key, long long want, int tries, int step_ms);
long long stat_wait(const char *key, long long want, int ms); /* stat_poll every 20 ms, for up to ms (20 s at least) */

/* Waiting for a log line (a test waits for the event it needs, never a fixed sleep before an assert):
 * how many lines of the file at path (NULL: the daemon's daemon.log) hold the text needle, the first
 * of them into line (when not NULL, len > 0; "" when none). */
int log_count_in(const char *path, const char *needle, char *line, size_t len);
/* log_count_in every 20 ms, for up to ms, until at least n lines hold needle: their count (< n: timed out). */
int log_wait_in(const char *path, const char *needle, int n, int ms, char *line, size_t len);
int log_wait(const char *needle, int ms); /* daemon.log: 1 once a line holds needle (up to ms), else 0 */
int log_wait_either(const char *a, const char *b, int ms); /* a line holding a or b, waited for up to ms */

/* A fresh temp dir, then gmlaked with extra arguments on it; returns when it answers gmlakectl. */
void start_daemon(const char *extra);
void launch_daemon(void); /* (re)start gmlaked on the same dir with the last start_daemon's arguments */
/* SIGTERM, wait, remove the dir (its daemon.log to stderr first if it failed or GMLAKE_TEST_VERBOSE);
 * its exit status (128 + signal when killed). */
int stop_daemon(void);

/* A gml-testclient on sock_path, driven through its stdin and stdout. */
typedef struct proc {
  pid_t pid;
  FILE *in, *out;
} proc;
proc client_start(void);
proc client_start_env(const char *env); /* env ("NAME=value", may be NULL) put in its environment */
const char *client_cmd(proc *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3))); /* its reply line ("": EOF) */
const char *client_first_line(proc *p);    /* "": EOF */
int client_ready(proc *p);                 /* the first line must be "ready PID CHUNK BACKEND": the pid */
/* A client as uid 65534 (nobody), for tests of another user: its pid once it said ready; else 0,
 * after saying that test is skipped (e.g. the build tree is not readable by nobody) and finishing it. */
int client_start_nobody(proc *p, const char *test);
int client_finish(proc *p); /* "close", drain, wait: its exit status */
void client_kill(proc *p);  /* SIGKILL, wait, close its pipes */

/* Raw connections on the client socket. */
int raw_connect(void);       /* -1 when it cannot connect; 5 s receive timeout */
int closed_by_daemon(int s); /* 1 when the daemon closed it (EOF after draining replies) */
int send_env(int s, Gmlake__Envelope *env, const int *fds, int nfds); /* gmli_wire_send's result */
int send_hello(int s, const char *name);
/* A request on s that the daemon answers (a Detach of a share s does not map: an Error, nothing
 * changed), and its answer read (what came before it is read and dropped). The daemon handles a
 * connection's messages in order: once it answered, everything s sent before, a usage report too
 * (which has no reply), has been handled. 0, or -1 when no answer came. */
int raw_round_trip(int s, uint64_t seq);
/* SIGSTOP a child of the test (a client, the daemon) and return once it is stopped, every thread:
 * kill() returns before that. Only the thread chosen to take the signal is woken; the others run
 * on until it gets a CPU, and on a loaded machine a stopped client's reader still took a reclaim
 * request and gave its cache back (test_idle_hog_stopped_past_lease failed 2 of 10 beside two
 * busy loops). */
void stop_child(pid_t pid);

/* GMLAKE_TESTS=NAME[,NAME...]: a suite adds only those tests (tests/stress.sh runs one alone);
 * unset or empty: all. */
int harness_wanted(const char *name);
#undef tcase_add_test
#define tcase_add_test(tc, tf)                                                                                         \
  do {                                                                                                                 \
    if (harness_wanted((tf)->name)) tcase_add_test_raise_signal(tc, tf, 0);                                            \
  } while (0)
#endif
