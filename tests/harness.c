/* The multi-process suites' harness (see harness.h): one gmlaked per test in
 * a temp dir, gml-testclient processes, gmlakectl, raw wire connections. */
#include "harness.h"
#include "skip.h"
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

char bindir[128], tmpdir[64], sock_path[100], ctl_url[128];
pid_t daemon_pid;
const char *backend = "host";
const char *daemon_env = "";
const char *tmpdir_template = "/tmp/gmlake-test.XXXXXX";
int tmpdir_mode;
int ctl_quiet;
int client_as_uid = -1;
const char *client_stderr;
static char daemon_args[512]; /* the last start_daemon's, for launch_daemon */

void harness_setup(void) {
  const char *b = getenv("BUILD");
  snprintf(bindir, sizeof bindir, "%s", b ? b : "build");
  setenv("GMLAKE_CHUNK_SIZE", "2MiB", 1);
  daemon_env = "";
}

void stop_child(pid_t pid) {
  ck_assert_int_eq(kill(pid, SIGSTOP), 0);
  int st = 0;
  pid_t w;
  while ((w = waitpid(pid, &st, WUNTRACED)) < 0 && errno == EINTR) {}
  ck_assert_msg(w == pid && WIFSTOPPED(st), "pid %d did not stop (waitpid %d, status %#x)", (int)pid, (int)w, st);
}

int harness_wanted(const char *name) {
  const char *only = getenv("GMLAKE_TESTS");
  if (!only || !*only) return 1;
  size_t n = strlen(name);
  for (const char *p = only; (p = strstr(p, name)); p += n)
    if ((p == only || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
  return 0;
}

void msleep(int ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

int sh(char *out, size_t outlen, const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t n = fread(out, 1, outlen - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int ctl_as(int uid, char *out, size_t outlen, const char *args) {
  if (uid >= 0)
    return sh(out, outlen, "setpriv --reuid=%d --regid=%d --clear-groups %s/gmlakectl --control %s %s 2>&1", uid, uid,
              bindir, ctl_url, args);
  return sh(out, outlen, "%s/gmlakectl --control %s %s%s", bindir, ctl_url, args, ctl_quiet ? " 2>/dev/null" : "");
}

int ctl(char *out, size_t outlen, const char *args) { return ctl_as(-1, out, outlen, args); }

long long json_num(const char *json, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *p = strstr(json, k);
  return p ? atoll(p + strlen(k)) : -1;
}

long long stat_num(const char *key) {
  char out[4096];
  if (ctl(out, sizeof out, "stats --json") != 0) return -1;
  return json_num(out, key);
}

long long stat_poll(const char *key, long long want, int tries, int step_ms) {
  long long v = -1;
  if (step_ms > 0 && tries < 20000 / step_ms) tries = 20000 / step_ms; /* 20 s at least: it stops when want is there */
  for (int i = 0; i < tries && (v = stat_num(key)) != want; i++) msleep(step_ms);
  return v;
}

/* At least 20 s, whatever the caller says: it returns as soon as the value is there, and a wait of 2-5 s
 * ran out on a loaded 2-core machine under the sanitizers (leases_refused after 5 s: 1 of 20 runs). */
long long stat_wait(const char *key, long long want, int ms) {
  return stat_poll(key, want, (ms < 20000 ? 20000 : ms) / 20, 20);
}

int log_count_in(const char *path, const char *needle, char *line, size_t len) {
  char dpath[128], buf[4096];
  if (!path) snprintf(dpath, sizeof dpath, "%s/daemon.log", tmpdir), path = dpath;
  if (line && len) line[0] = 0;
  FILE *f = fopen(path, "r");
  int n = 0;
  while (f && fgets(buf, sizeof buf, f)) {
    if (!strstr(buf, needle)) continue;
    if (!n++ && line && len) snprintf(line, len, "%s", buf);
  }
  if (f) fclose(f);
  return n;
}

int log_wait_in(const char *path, const char *needle, int n, int ms, char *line, size_t len) {
  int got = 0;
  for (int waited = 0; (got = log_count_in(path, needle, line, len)) < n && waited < ms; waited += 20) msleep(20);
  return got;
}

int log_wait(const char *needle, int ms) { return log_wait_in(NULL, needle, 1, ms, NULL, 0) >= 1; }

int log_wait_either(const char *a, const char *b, int ms) {
  for (int waited = 0;; waited += 20) {
    if (log_count_in(NULL, a, NULL, 0) || log_count_in(NULL, b, NULL, 0)) return 1;
    if (waited >= ms) return 0;
    msleep(20);
  }
}

void launch_daemon(void) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "%sexec %s/gmlaked --backend %s --socket %s --control %s --log-level info %s 2>>%s/daemon.log", daemon_env,
           bindir, backend, sock_path, ctl_url, daemon_args, tmpdir);
  daemon_pid = fork();
  if (daemon_pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  int quiet = ctl_quiet; /* "not up yet" is no error */
  ctl_quiet = 1;
  for (int i = 0; i < 800; i++) { /* up to 20 s */
    if (stat_num("chunks_total") >= 0) {
      ctl_quiet = quiet;
      return;
    }
    msleep(25);
  }
  ck_abort_msg("daemon did not come up (see %s/daemon.log)", tmpdir);
}

void start_daemon(const char *extra) {
  snprintf(tmpdir, sizeof tmpdir, "%s", tmpdir_template);
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
  if (tmpdir_mode) chmod(tmpdir, (mode_t)tmpdir_mode);
  snprintf(sock_path, sizeof sock_path, "%s/lake.sock", tmpdir);
  snprintf(ctl_url, sizeof ctl_url, "ipc://%s/lake.ctl", tmpdir);
  snprintf(daemon_args, sizeof daemon_args, "%s", extra);
  launch_daemon();
}

int stop_daemon(void) {
  int st = 0;
  kill(daemon_pid, SIGTERM);
  waitpid(daemon_pid, &st, 0);
  char cmd[1024];
  if (getenv("GMLAKE_TEST_VERBOSE") || !WIFEXITED(st) || WEXITSTATUS(st))
    snprintf(cmd, sizeof cmd, "cat %s/daemon.log >&2; rm -rf %s", tmpdir, tmpdir);
  else snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) {}
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

proc client_start_env(const char *env) {
  int to[2], from[2];
  ck_assert_int_eq(pipe(to), 0);
  ck_assert_int_eq(pipe(from), 0);
  proc p;
  p.pid = fork();
  if (p.pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]), close(from[0]);
    if (env) putenv((char *)env);
    if (client_stderr) {
      int fd = open(client_stderr, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) dup2(fd, 2), close(fd);
    }
    char path[300];
    snprintf(path, sizeof path, "%s/gml-testclient", bindir);
    if (client_as_uid >= 0) { /* a copy in the test's dir (removed with it): the checkout may lie where
                               * another uid may not look (/root, mode 700) */
      char copy[200], cmd[1400];
      snprintf(copy, sizeof copy, "%s/uidbin/gml-testclient", tmpdir);
      snprintf(cmd, sizeof cmd, "[ -x '%s' ] || { mkdir -p -m 755 '%s/uidbin' && cp '%s' '%s' && chmod 755 '%s'; }",
               copy, tmpdir, path, copy, copy);
      if (tmpdir[0] && system(cmd) == 0) snprintf(path, sizeof path, "%s", copy);
      char id[32];
      snprintf(id, sizeof id, "%d", client_as_uid);
      execl("/usr/bin/setpriv", "setpriv", "--reuid", id, "--regid", id, "--clear-groups", path, sock_path,
            (char *)NULL);
      _exit(127);
    }
    execl(path, path, sock_path, (char *)NULL);
    _exit(127);
  }
  close(to[0]), close(from[1]);
  p.in = fdopen(to[1], "w");
  p.out = fdopen(from[0], "r");
  setvbuf(p.in, NULL, _IOLBF, 0);
  return p;
}

proc client_start(void) { return client_start_env(NULL); }

const char *client_cmd(proc *p, const char *fmt, ...) {
  static char line[4096];
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->in, fmt, ap);
  va_end(ap);
  fputc('\n', p->in);
  fflush(p->in);
  if (!fgets(line, sizeof line, p->out)) return "";
  line[strcspn(line, "\n")] = 0;
  return line;
}

const char *client_first_line(proc *p) {
  static char line[256];
  if (!fgets(line, sizeof line, p->out)) return "";
  line[strcspn(line, "\n")] = 0;
  return line;
}

int client_ready(proc *p) {
  const char *l = client_first_line(p);
  ck_assert_msg(!strncmp(l, "ready ", 6), "client said '%s'", l);
  return atoi(l + 6);
}

int client_start_nobody(proc *p, const char *test) {
  client_as_uid = 65534;
  *p = client_start();
  client_as_uid = -1;
  const char *ready = client_first_line(p);
  if (!strncmp(ready, "ready ", 6)) return atoi(ready + 6);
  char why[320];
  snprintf(why, sizeof why, "a client as uid 65534 said '%.256s'", ready);
  client_finish(p);
  test_skip(test, why); /* fails as root */
  return 0;
}

int client_finish(proc *p) {
  fprintf(p->in, "close\n");
  fclose(p->in);
  char line[256];
  while (fgets(line, sizeof line, p->out)) {}
  fclose(p->out);
  int st;
  waitpid(p->pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void client_kill(proc *p) {
  kill(p->pid, SIGKILL);
  int st;
  waitpid(p->pid, &st, 0);
  fclose(p->in), fclose(p->out);
}

int raw_connect(void) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(s);
    return -1;
  }
  struct timeval tv = {5, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return s;
}

int closed_by_daemon(int s) {
  char buf[4096];
  for (;;) {
    ssize_t r = recv(s, buf, sizeof buf, 0);
    if (r == 0) return 1;
    if (r < 0) return errno == ECONNRESET;
  }
}

int send_env(int s, Gmlake__Envelope *env, const int *fds, int nfds) {
  uint8_t *f;
  size_t len;
  ck_assert_int_eq(gmli_wire_encode(env, &f, &len), 0);
  int rc = gmli_wire_send(s, f, len, fds, nfds);
  free(f);
  return rc;
}

int raw_round_trip(int s, uint64_t seq) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT, *in = NULL;
  Gmlake__DetachRequest d = GMLAKE__DETACH_REQUEST__INIT;
  d.key = "gml-test-no-such-share";
  env.seq = seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_DETACH;
  env.detach = &d;
  if (send_env(s, &env, NULL, 0)) return -1;
  int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
  for (;;) { /* replies to earlier requests may come first */
    if (gmli_wire_recv(s, &in, fds, &nfds, GML_MAX_LEASE_CHUNKS)) return -1;
    for (int i = 0; i < nfds; i++) close(fds[i]);
    int done = in->seq == seq;
    gmlake__envelope__free_unpacked(in, NULL);
    if (done) return 0;
  }
}

int send_hello(int s, const char *name) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__Hello h = GMLAKE__HELLO__INIT;
  h.protocol_version = GML_PROTOCOL_VERSION;
  h.name = (char *)name;
  env.seq = 1;
  env.msg_case = GMLAKE__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  return send_env(s, &env, NULL, 0);
}
