/* gmlaked's settings (daemon/config.c): defaults, the config file, flags over
 * the file, values refused with the key named, --help from the same table. */
#include "config.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char conf[64];

static void setup(void) {
  snprintf(conf, sizeof conf, "/tmp/gml-config-test.XXXXXX");
  int fd = mkstemp(conf);
  ck_assert_int_ge(fd, 0);
  close(fd);
}
static void teardown(void) { unlink(conf); }

static void write_conf(const char *text) {
  FILE *f = fopen(conf, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* config_load with "--config <conf>" and up to 4 more arguments; what it
 * says on stderr (the refusals under test) goes to /dev/null. */
static int load(gmld_config *c, const char *a1, const char *a2, const char *a3, const char *a4) {
  char *argv[8] = {"gmlaked", "--config", conf};
  int argc = 3;
  const char *more[] = {a1, a2, a3, a4};
  for (int i = 0; i < 4 && more[i]; i++) argv[argc++] = (char *)more[i];
  fflush(stderr);
  int saved = dup(2), null = open("/dev/null", O_WRONLY);
  dup2(null, 2);
  int rc = config_load(c, argc, argv);
  fflush(stderr);
  dup2(saved, 2);
  close(saved), close(null);
  return rc;
}

START_TEST(test_defaults) {
  gmld_config c;
  write_conf("# nothing set\n\n");
  ck_assert_int_eq(load(&c, NULL, NULL, NULL, NULL), 0);
  ck_assert_int_eq(c.device, 0);
  ck_assert_str_eq(c.backend, "auto");
  ck_assert_uint_eq(c.prefetch_bytes, 256ull << 20);
  ck_assert_uint_eq(c.preallocate_bytes, 0);
  ck_assert_int_eq(c.creators, 4);
  ck_assert_uint_eq(c.socket_mode, 0660);
  ck_assert_int_eq(c.log_level, 0); /* not set: gmlaked takes GMLAKE_LOG, else info (tests/logging.sh) */
  ck_assert_str_eq(c.limit, "");
  ck_assert_str_eq(c.socket_path, "");
  ck_assert_int_eq(c.foreground, 0);
  ck_assert_str_eq(c.config_path, conf);
}
END_TEST

START_TEST(test_file_then_flags) {
  gmld_config c;
  write_conf("device = 2\n"
             "  creators=8   # comment\n"
             "socket-mode = 0600\n"
             "limit = 40%\n"
             "prefetch = 64MiB\n"
             "backend = host\n"
             "foreground\n"
             "quota = uid:1000 1GiB\n");
  ck_assert_int_eq(load(&c, "--creators", "3", "--log-level=debug", NULL), 0);
  ck_assert_int_eq(c.device, 2);
  ck_assert_int_eq(c.creators, 3);        /* the flag wins */
  ck_assert_uint_eq(c.socket_mode, 0600); /* octal */
  ck_assert_str_eq(c.limit, "40%");
  ck_assert_uint_eq(c.prefetch_bytes, 64ull << 20);
  ck_assert_str_eq(c.backend, "host");
  ck_assert_int_eq(c.foreground, 1);
  ck_assert_int_eq(c.log_level, GML_LOG_DEBUG);
  ck_assert_int_eq(c.nquotas, 1);
  ck_assert_int_eq(c.quotas[0].kind, GML_QUOTA_UID);
  ck_assert_uint_eq(c.quotas[0].key, 1000);
  ck_assert_uint_eq(c.quotas[0].bytes, 1ull << 30);
  /* loaded again (SIGHUP): the same result, nothing left over from before */
  ck_assert_int_eq(load(&c, "--creators", "3", NULL, NULL), 0);
  ck_assert_int_eq(c.creators, 3);
  ck_assert_int_eq(c.nquotas, 1);
  ck_assert_int_eq(c.log_level, 0); /* the flag's debug is gone: not set */
}
END_TEST

START_TEST(test_bad_values) {
  gmld_config c;
  write_conf("");
  static const char *const bad[][2] = {
      {"--creators", "65"},
      {"--creators", "0"},
      {"--device", "-1"},
      {"--device", "1024"},
      {"--socket-mode", "0800"},
      {"--backend", "gpu"},
      {"--limit", "0"},
      {"--limit", "lots"},
      {"--prefetch", "lots"},
      {"--control", "/no/scheme"},
      {"--log-level", "loud"},
      {"--socket", ""},
      /* less than two frames: every client was closed at its hello reply, "the client does not read" */
      {"--send-queue-max", "0"},
      {"--send-queue-max", "64KiB"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(load(&c, bad[i][0], bad[i][1], NULL, NULL) == GML_EINVAL, "%s %s accepted", bad[i][0], bad[i][1]);
  ck_assert_int_eq(load(&c, "--creators", "64", "--device", "1023"), 0); /* the ends of the ranges */
  ck_assert_int_eq(load(&c, "--send-queue-max", "128KiB", NULL, NULL), 0);
  ck_assert_uint_eq(c.send_queue_max, 128 << 10);
  ck_assert_int_eq(load(&c, "--no-such-flag", NULL, NULL, NULL), GML_EINVAL);
  ck_assert_int_eq(load(&c, "extra", NULL, NULL, NULL), GML_EINVAL);
  write_conf("no-such-key = 1\n");
  ck_assert_int_eq(load(&c, NULL, NULL, NULL, NULL), GML_EINVAL);
  write_conf("config = /elsewhere\n"); /* only a flag */
  ck_assert_int_eq(load(&c, NULL, NULL, NULL, NULL), GML_EINVAL);
  write_conf("quota = 0 1GiB\n"); /* pid 0 */
  ck_assert_int_eq(load(&c, NULL, NULL, NULL, NULL), GML_EINVAL);
}
END_TEST

/* metrics-listen is ADDR:PORT, checked with the other settings: a value
 * without a port passed, and gmlaked set up its sockets before it failed
 * on it, exit 1 where a bad option is 2 (man gmlaked). */
START_TEST(test_metrics_listen) {
  gmld_config c;
  write_conf("");
  const char *bad[] = {"nohost",   "host:",   ":",         "host:0",    "host:65536", "host:http",
                       "host:94x", "host:-1", "[::1:9400", "::1]:9400", "a b:9400",   "host/x:9400"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(load(&c, "--metrics-listen", bad[i], NULL, NULL) == GML_EINVAL, "--metrics-listen '%s' accepted",
                  bad[i]);
  write_conf("metrics-listen = nohost\n");
  ck_assert_int_eq(load(&c, NULL, NULL, NULL, NULL), GML_EINVAL);
  const char *good[] = {"127.0.0.1:9400", "[::1]:9400", ":9400", "localhost:1", "metrics-host.example_1:65535", ""};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    write_conf("");
    ck_assert_msg(load(&c, "--metrics-listen", good[i], NULL, NULL) == 0, "--metrics-listen '%s' refused", good[i]);
    ck_assert_str_eq(c.metrics_listen, good[i]);
  }
}
END_TEST

/* quota takes the holders gmlakectl quota takes: PID, uid:UID and
 * cgroup:PATH (it refused cgroup:, so a reload could not keep a cgroup's
 * quota); a cgroup's path may hold blanks, the bytes are the last word. */
START_TEST(test_quota_holders) {
  gmld_config c;
  write_conf("quota = 42 1MiB\n"
             "quota = uid:4294967294 2MiB\n"
             "quota = cgroup:/ 1GiB\n"
             "quota =   cgroup:/system.slice/job one.service\t 3GiB  \n");
  ck_assert_int_eq(load(&c, "--quota", "cgroup:/user.slice 4MiB", NULL, NULL), 0);
  ck_assert_int_eq(c.nquotas, 5);
  ck_assert_int_eq(c.quotas[0].kind, GML_QUOTA_PID);
  ck_assert_uint_eq(c.quotas[0].key, 42);
  ck_assert_uint_eq(c.quotas[0].bytes, 1ull << 20);
  ck_assert_int_eq(c.quotas[1].kind, GML_QUOTA_UID);
  ck_assert_uint_eq(c.quotas[1].key, 4294967294u);
  ck_assert_int_eq(c.quotas[2].kind, GML_QUOTA_CGROUP);
  ck_assert_str_eq(c.quotas[2].cgroup, "/");
  ck_assert_uint_eq(c.quotas[2].bytes, 1ull << 30);
  ck_assert_int_eq(c.quotas[3].kind, GML_QUOTA_CGROUP);
  ck_assert_str_eq(c.quotas[3].cgroup, "/system.slice/job one.service");
  ck_assert_uint_eq(c.quotas[3].bytes, 3ull << 30);
  ck_assert_int_eq(c.quotas[4].kind, GML_QUOTA_CGROUP); /* the flag's, after the file's */
  ck_assert_str_eq(c.quotas[4].cgroup, "/user.slice");
  ck_assert_uint_eq(c.quotas[4].bytes, 4ull << 20);
  static char longpath[GML_QUOTA_CGROUP_MAX + 16] = "cgroup:/", longq[GML_QUOTA_CGROUP_MAX + 32];
  memset(longpath + 8, 'a', GML_QUOTA_CGROUP_MAX - 1); /* a path of GML_QUOTA_CGROUP_MAX bytes: one over */
  longpath[8 + GML_QUOTA_CGROUP_MAX - 1] = 0;
  snprintf(longq, sizeof longq, "%s 1GiB", longpath);
  const char *bad[] = {"cgroup:relative 1GiB", "cgroup: 1GiB", "cgroup:/ lots", "cgroup:/", "1GiB",
                       "uid:4294967295 1GiB", "uid: 1GiB", "uid:x 1GiB", "-1 1GiB", "2147483648 1GiB", "42x 1GiB",
                       longq,
                       /* another spelling of a cgroup never matches /proc/PID/cgroup: refused, not a quota
                        * that binds nothing (new-user trial: cgroup:/a/../b was taken) */
                       "cgroup:/a/../b 1GiB", "cgroup:/a/./b 1GiB", "cgroup://a 1GiB", "cgroup:/a/ 1GiB",
                       "cgroup:/.. 1GiB", "cgroup:/a/.. 1GiB"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_conf("");
    ck_assert_msg(load(&c, "--quota", bad[i], NULL, NULL) == GML_EINVAL, "--quota '%s' accepted", bad[i]);
  }
  longpath[strlen(longpath) - 1] = 0; /* 127 bytes: fits */
  snprintf(longq, sizeof longq, "%s 1GiB", longpath);
  ck_assert_int_eq(load(&c, "--quota", longq, NULL, NULL), 0);
  ck_assert_int_eq(c.quotas[0].kind, GML_QUOTA_CGROUP);
  ck_assert_uint_eq(strlen(c.quotas[0].cgroup), GML_QUOTA_CGROUP_MAX - 1);
}
END_TEST

/* --help comes from the same table: every option, its argument, its default. */
START_TEST(test_usage_from_table) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ck_assert_ptr_nonnull(f);
  config_usage(f);
  fclose(f);
  static const char *const lines[] = {
      "  --device N|UUID|PCI   the GPU: nvidia-smi's index N, its UUID (GPU-...) or PCI bus id (0000:3b:00.0); host "
      "backend: N "
      "or host-N (default 0)\n",
      "  --prefetch BYTES      chunks created ahead of demand (default 256MiB)\n",
      "  --creators N          threads creating chunks (default 4)\n",
      "  --socket-mode OCTAL   permissions of the socket (default 0660)\n",
      "  --limit BYTES|PCT%    the most the lake holds (default 90% of the device; host: 50% of RAM)\n",
      "  --foreground          stay in the foreground (always true; kept for scripts)\n",
      /* a name longer than the column: its help on the next line, not run into it */
      "  --max-clients-per-uid N\n                        connections of one user, at most (default 256)\n",
  };
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
    ck_assert_msg(strstr(text, lines[i]) != NULL, "--help lacks: %s", lines[i]);
  free(text);
  gmld_config c;
  write_conf("");
  FILE *saved = stdout;
  stdout = fopen("/dev/null", "w");
  int rc = load(&c, "--help", NULL, NULL, NULL);
  fclose(stdout);
  stdout = saved;
  ck_assert_int_eq(rc, 1);
}
END_TEST

/* What config_load says on stderr for these arguments (config file conf). */
static int load_said(gmld_config *c, const char *a1, const char *a2, char *said, size_t len) {
  char *argv[8] = {"gmlaked", "--config", conf, (char *)a1, (char *)a2};
  int argc = 3 + (a1 != NULL) + (a1 && a2);
  FILE *f = tmpfile();
  ck_assert_ptr_nonnull(f);
  fflush(stderr);
  int saved = dup(2);
  dup2(fileno(f), 2);
  int rc = config_load(c, argc, argv);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(f);
  size_t n = fread(said, 1, len - 1, f);
  said[n] = 0;
  fclose(f);
  return rc;
}

/* --device names a GPU by nvidia-smi's index, its UUID or its PCI bus id, and
 * the host backend's devices by N or host-N (issue 27); the form is checked
 * here, which GPU it is once the backend is open (gmlaked refused all but a
 * number before). */
START_TEST(test_device_forms) {
  gmld_config c;
  write_conf("");
  static const struct {
    const char *spec;
    int index;
  } good[] = {
      {"3", 3},
      {"host-7", 7},
      {"GPU-6f2b1c3e-8a4d-4e1f-9b2a-0c3d4e5f6a7b", -1},
      {"gpu-6F2B1C3E-8A4D", -1},
      {"0000:3b:00.0", -1},
      {"00000000:3B:00.0", -1},
      {"3b:00.0", -1},
      {"cuda-2", -1},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    ck_assert_msg(load(&c, "--device", good[i].spec, NULL, NULL) == 0, "--device %s refused", good[i].spec);
    ck_assert_str_eq(c.device_spec, good[i].spec);
    ck_assert_int_eq(c.device, good[i].index);
  }
  static const char *const bad[] = {"x",  "abc",  "GPU-",      "GPU-xyz",      "host-", "host-1024", "1024",
                                    "-1", "../x", "GPU-12/..", "0000:3b:00.9", "3b:00", "0x3b:00.0", " 1"};
  char said[512];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_msg(load_said(&c, "--device", bad[i], said, sizeof said) == GML_EINVAL, "--device '%s' taken", bad[i]);
    ck_assert_msg(strstr(said, "a UUID as nvidia-smi -L prints it"), "--device %s: %s", bad[i], said);
  }
}
END_TEST

/* A flag in the file takes its key alone or yes/no: before, any value turned
 * it on, so "control-insecure-tcp = no" allowed an unauthenticated tcp://
 * control. An empty number is refused: "socket-mode =" made the socket 0000. */
START_TEST(test_flag_values) {
  gmld_config c;
  static const struct {
    const char *line;
    int rc, on;
  } cases[] = {
      {"control-insecure-tcp\n", 0, 1},      {"control-insecure-tcp = yes\n", 0, 1},
      {"control-insecure-tcp = no\n", 0, 0}, {"control-insecure-tcp = off\n", 0, 0},
      {"control-insecure-tcp = 0\n", 0, 0},  {"control-insecure-tcp = maybe\n", GML_EINVAL, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_conf(cases[i].line);
    ck_assert_msg(load(&c, NULL, NULL, NULL, NULL) == cases[i].rc, "%s: not %d", cases[i].line, cases[i].rc);
    if (!cases[i].rc) ck_assert_msg(c.control_insecure_tcp == cases[i].on, "%s: not %d", cases[i].line, cases[i].on);
  }
  write_conf("control-insecure-tcp = no\n"); /* the flag still wins over the file */
  ck_assert_int_eq(load(&c, "--control-insecure-tcp", NULL, NULL, NULL), 0);
  ck_assert_int_eq(c.control_insecure_tcp, 1);
  write_conf("socket-mode =\n");
  ck_assert_int_eq(load(&c, NULL, NULL, NULL, NULL), GML_EINVAL);
  write_conf("device =\n");
  ck_assert_int_eq(load(&c, NULL, NULL, NULL, NULL), GML_EINVAL);
}
END_TEST

/* A refused value is told with what the setting accepts (before: only
 * "bad value for creators: '0'", the range in no message). */
START_TEST(test_bad_value_says_what_is_accepted) {
  gmld_config c;
  char said[512];
  write_conf("");
  static const char *const cases[][3] = {
      {"--creators", "0", "(a number from 1 to 64)"},
      {"--lease-wait", "-1", "(a number from 0 to 600000)"},
      {"--socket-mode", "999", "(octal permissions, e.g. 0660)"},
      {"--log-level", "loud", "(error, warn, info or debug)"},
      {"--backend", "gpu", "(one of: auto, "},
      {"--limit", "lots", "(bytes, e.g. 60GiB, or a share of the device from 1% to 100%)"},
      {"--prefetch", "lots", "(bytes: 256MiB"},
      {"--send-queue-max", "1KiB", "(bytes, at least 131072: 256MiB"},
      {"--control", "/run/gmlake/gmlake-0.ctl", "(a URL: ipc:///PATH"},
      {"--quota", "uid:1000", "(holder and bytes are one value"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_assert_int_eq(load_said(&c, cases[i][0], cases[i][1], said, sizeof said), GML_EINVAL);
    ck_assert_msg(strstr(said, cases[i][2]) && strstr(said, cases[i][0] + 2), "%s %s: '%s'", cases[i][0], cases[i][1],
                  said);
  }
  /* a line past the reader's buffer is refused as such: its tail was read as a line of its own, a
   * long comment's last words as a key ("unknown setting", on a line 2 the file did not have) */
  static char longline[GML_QUOTA_CGROUP_MAX + 700];
  snprintf(longline, sizeof longline, "# %0*d limit = 1GiB\nlimit = 2GiB", GML_QUOTA_CGROUP_MAX + 600, 0);
  write_conf(longline);
  ck_assert_int_eq(load_said(&c, NULL, NULL, said, sizeof said), GML_EINVAL);
  char want[64];
  snprintf(want, sizeof want, ":1: line longer than %d bytes", GML_QUOTA_CGROUP_MAX + 510);
  ck_assert_msg(strstr(said, want), "%s", said);
  write_conf("limit = 2GiB"); /* a last line without a newline is whole */
  ck_assert_int_eq(load(&c, NULL, NULL, NULL, NULL), 0);
  ck_assert_str_eq(c.limit, "2GiB");
  write_conf("control-insecure-tcp = maybe\n");
  ck_assert_int_eq(load_said(&c, NULL, NULL, said, sizeof said), GML_EINVAL);
  ck_assert_msg(strstr(said, ":1: bad value for control-insecure-tcp: 'maybe' (a flag: the key alone, or yes / no)"),
                "%s", said);
}
END_TEST

/* A NUL byte in the file was called "line longer than 510 bytes" (of a line
 * of 12); and a reload said nothing of settings it does not take: a changed
 * socket, metrics-listen or creators kept their old values without a word
 * (only socket-group and socket-mode were said). Found by the second tryout. */
START_TEST(test_nul_byte_and_changed_at_start) {
  gmld_config was, now;
  char said[512], changed[512];
  FILE *f = fopen(conf, "w");
  ck_assert_ptr_nonnull(f);
  fwrite("limit = 64MiB\0junk\nlog-level = info\n", 1, 36, f);
  fclose(f);
  ck_assert_int_eq(load_said(&now, NULL, NULL, said, sizeof said), GML_EINVAL);
  ck_assert_msg(strstr(said, ":1: a NUL byte: not a text file"), "%s", said);
  write_conf("limit = 64MiB\nsocket = /tmp/a.sock\ncreators = 2\n");
  ck_assert_int_eq(load(&was, NULL, NULL, NULL, NULL), 0);
  write_conf("limit = 32MiB\nlog-level = debug\nquota = uid:1000 8MiB\nsocket = /tmp/a.sock\ncreators = 2\n");
  ck_assert_int_eq(load(&now, NULL, NULL, NULL, NULL), 0);
  ck_assert_int_eq(config_changed_at_start(&was, &now, changed, sizeof changed), 0); /* all a reload takes */
  ck_assert_str_eq(changed, "");
  write_conf("limit = 32MiB\nsocket = /tmp/b.sock\ncreators = 3\nmetrics-listen = 127.0.0.1:9400\n");
  ck_assert_int_eq(load(&now, NULL, NULL, NULL, NULL), 0);
  ck_assert_int_eq(config_changed_at_start(&was, &now, changed, sizeof changed), 3);
  ck_assert_str_eq(changed, "socket, creators, metrics-listen");
}
END_TEST

/* A key given twice in the file is refused, naming the key and both lines:
 * before, the last one won without a word ("limit = 40%" appended under an
 * old "limit = 90%" and the other way round look alike). quota may repeat
 * (each line a quota), once a holder: two lines for one holder are refused
 * as a key given twice (before, the last won and a reload said "2
 * quota(s)"); a flag over the file's value is no repeat, nor is a --quota
 * over the file's quota of its holder (the flag's replaces it). */
/* A reload (SIGHUP) loads quietly and logs why it refused in its own line, with a time and a
 * level: before, the reason went to stderr bare (journald: info priority, no time) and the
 * logged line only said "(see above)". At start the reason still goes to stderr. */
START_TEST(test_reload_error_in_log_line) {
  gmli_log_set_ident("gmlaked"); /* as gmlaked's main says it */
  gmld_config c;
  char said[512];
  write_conf("limit = 90%\nlimit = 40%\n");
  config_set_quiet(1);
  ck_assert_int_eq(load_said(&c, NULL, NULL, said, sizeof said), GML_EINVAL);
  config_set_quiet(0);
  ck_assert_msg(!said[0], "a quiet load wrote '%s'", said);
  ck_assert_msg(strstr(config_error(), ":2: limit given twice (lines 1 and 2): give it once"), "'%s'", config_error());
  ck_assert_int_eq(load_said(&c, NULL, NULL, said, sizeof said), GML_EINVAL);
  ck_assert_msg(strstr(said, "gmlaked: ") && strstr(said, ":2: limit given twice"), "at start: '%s'", said);
  write_conf("limit = 40%\n");
  ck_assert_int_eq(load(&c, NULL, NULL, NULL, NULL), 0);
  ck_assert_str_eq(config_error(), "");
}
END_TEST

START_TEST(test_key_twice_refused) {
  gmld_config c;
  char said[512];
  write_conf("limit = 90%\n# later\ncreators = 2\n  limit=40%   # lower\n");
  ck_assert_int_eq(load_said(&c, NULL, NULL, said, sizeof said), GML_EINVAL);
  ck_assert_msg(strstr(said, ":4: limit given twice (lines 1 and 4): give it once"), "%s", said);
  write_conf("foreground\nforeground = no\n"); /* a flag too */
  ck_assert_int_eq(load_said(&c, NULL, NULL, said, sizeof said), GML_EINVAL);
  ck_assert_msg(strstr(said, ":2: foreground given twice (lines 1 and 2)"), "%s", said);
  write_conf("quota = uid:1000 1GiB\nquota = uid:1001 2GiB\nlimit = 40%\n");
  ck_assert_int_eq(load(&c, "--limit", "50%", NULL, NULL), 0);
  ck_assert_int_eq(c.nquotas, 2);
  ck_assert_str_eq(c.limit, "50%");
  /* one holder twice: each holder kind, the lines named */
  static const char *const twice[][2] = {
      {"quota = uid:1001 4MiB\nquota = uid:1000 1GiB\n# more\nquota = uid:1001 64MiB\n",
       ":4: quota of uid:1001 given twice (lines 1 and 4): give one quota line a holder"},
      {"quota = 42 4MiB\nquota = uid:42 4MiB\nquota = 42 0\n", ":3: quota of 42 given twice (lines 1 and 3)"},
      {"quota = cgroup:/a b 1GiB\nquota = cgroup:/a 1GiB\nquota = cgroup:/a b 2GiB\n",
       ":3: quota of cgroup:/a b given twice (lines 1 and 3)"},
  };
  for (size_t i = 0; i < sizeof twice / sizeof twice[0]; i++) {
    write_conf(twice[i][0]);
    ck_assert_int_eq(load_said(&c, NULL, NULL, said, sizeof said), GML_EINVAL);
    ck_assert_msg(strstr(said, twice[i][1]), "%s: '%s'", twice[i][0], said);
  }
  /* a flag replaces the file's quota of its holder: one quota, the flag's */
  write_conf("quota = uid:1001 4MiB\nquota = uid:1000 1GiB\n");
  ck_assert_int_eq(load(&c, "--quota", "uid:1001 64MiB", NULL, NULL), 0);
  ck_assert_int_eq(c.nquotas, 2);
  ck_assert_int_eq(c.quotas[0].kind, GML_QUOTA_UID);
  ck_assert_uint_eq(c.quotas[0].key, 1001);
  ck_assert_uint_eq(c.quotas[0].bytes, 64ull << 20);
  ck_assert_uint_eq(c.quotas[1].key, 1000);
}
END_TEST

/* A config path that is no regular file is refused at once, saying so: before, a FIFO was opened
 * before it was looked at, and open() waited for a writer (a SIGHUP froze the daemon). A symlink to
 * a regular file is followed (a config kept in /etc, linked from elsewhere). */
START_TEST(test_config_not_regular_refused) {
  gmld_config c;
  char said[512], link[80];
  ck_assert_int_eq(unlink(conf), 0);
  ck_assert_int_eq(mkfifo(conf, 0600), 0);
  ck_assert_int_eq(load_said(&c, NULL, NULL, said, sizeof said), GML_EINVAL);
  ck_assert_msg(strstr(said, conf) && strstr(said, "is not a regular file (a FIFO)"), "%s", said);
  ck_assert_int_eq(unlink(conf), 0);
  ck_assert_int_eq(mkdir(conf, 0700), 0);
  ck_assert_int_eq(load_said(&c, NULL, NULL, said, sizeof said), GML_EINVAL);
  ck_assert_msg(strstr(said, "is not a regular file (a directory)"), "%s", said);
  ck_assert_int_eq(rmdir(conf), 0);
  snprintf(link, sizeof link, "%s.real", conf);
  FILE *f = fopen(link, "w");
  ck_assert_ptr_nonnull(f);
  fputs("limit = 40%\n", f);
  fclose(f);
  ck_assert_int_eq(symlink(link, conf), 0);
  ck_assert_int_eq(load(&c, NULL, NULL, NULL, NULL), 0);
  ck_assert_str_eq(c.limit, "40%");
  unlink(link);
}
END_TEST

Suite *config_suite(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("config");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_file_then_flags);
  tcase_add_test(tc, test_bad_values);
  tcase_add_test(tc, test_device_forms);
  tcase_add_test(tc, test_quota_holders);
  tcase_add_test(tc, test_metrics_listen);
  tcase_add_test(tc, test_usage_from_table);
  tcase_add_test(tc, test_flag_values);
  tcase_add_test(tc, test_bad_value_says_what_is_accepted);
  tcase_add_test(tc, test_nul_byte_and_changed_at_start);
  tcase_add_test(tc, test_key_twice_refused);
  tcase_add_test(tc, test_reload_error_in_log_line);
  tcase_add_test(tc, test_config_not_regular_refused);
  suite_add_tcase(s, tc);
  return s;
}
