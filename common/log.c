/* log.c: one place that decides what gets printed and how. Under systemd,
 * when stderr is the journal's stream (JOURNAL_STREAM names its device and
 * inode), lines carry "<prio>" prefixes so journald keeps levels. */
#include "log.h"
#include "gmlake.h"
#include "options.h"
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int log_level = -1;
static const char *log_ident = "gmlake";
static const char *const level_names[] = {"", "", "", "error", "warn", "", "info", "debug"};

void gmli_log_set_level(int level) { log_level = level; }
void gmli_log_set_ident(const char *ident) { log_ident = ident; }
const char *gmli_log_level_name(int level) { return level_names[level & 7]; }

int gmli_log_parse_level(const char *s) {
  static const struct {
    const char *name;
    int level;
  } names[] = {{"error", GML_LOG_ERROR}, {"warn", GML_LOG_WARN}, {"info", GML_LOG_INFO}, {"debug", GML_LOG_DEBUG}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcasecmp(s, names[i].name)) return names[i].level;
  return GML_EINVAL;
}

int gmli_log_set_level_from_env(int def) {
  const char *env = gmli_env(GML_ENV_LOG);
  int l = env ? gmli_log_parse_level(env) : -1;
  log_level = l >= 0 ? l : def; /* set before the warning below, which would come back here */
  if (env && l < 0)
    gmli_log(GML_LOG_WARN, "%s=%s: not a level (%s); using %s", gmli_env_name(GML_ENV_LOG), env,
             gmli_env_accepts(GML_ENV_LOG), gmli_log_level_name(def));
  return l >= 0;
}

static int effective_level(void) {
  if (log_level < 0) gmli_log_set_level_from_env(GML_LOG_WARN);
  return log_level;
}

/* systemd.exec(5): JOURNAL_STREAM is "DEVICE:INODE" of the stream it
 * connected stderr to. A shell started under systemd passes it on to what it
 * runs with stderr on a terminal or a file: prefixes only where stderr is
 * that stream still. */
static int to_journal;
static void check_journal_stream(void) {
  const char *js = gmli_env(GML_ENV_JOURNAL_STREAM);
  unsigned long long dev, ino;
  int end = 0;
  struct stat st;
  if (!js || sscanf(js, "%llu:%llu%n", &dev, &ino, &end) != 2 || js[end] || fstat(STDERR_FILENO, &st)) return;
  to_journal = (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

static pthread_once_t journal_once = PTHREAD_ONCE_INIT; /* to_journal, found once for every line */

int gmli_log_level(void) { return effective_level(); }

void gmli_log(int level, const char *fmt, ...) {
  if (level > effective_level()) return;
  pthread_once(&journal_once, check_journal_stream);
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (to_journal) {
    fprintf(stderr, "<%d>%s\n", level, line);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ld %s[%s] %s\n", when, ts.tv_nsec / 1000000, log_ident, level_names[level & 7], line);
  }
}

void gmli_log_fatal(const char *fmt, ...) {
  pthread_once(&journal_once, check_journal_stream);
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s%s: %s\n", to_journal ? "<3>" : "", log_ident, line);
}

/* How many bytes c stands for in a log line. */
static size_t escaped_len(unsigned char c) { return c == '\\' ? 2 : c < 32 || c > 126 ? 4 : 1; }

const char *gmli_log_escape(const char *s, char *out, size_t outlen) {
  static const char hex[] = "0123456789abcdef";
  if (outlen < 4) return outlen ? (out[0] = 0, out) : out;
  size_t need = 0, k = 0;
  for (const char *p = s; p && *p; p++) need += escaped_len((unsigned char)*p);
  size_t room = need < outlen ? outlen - 1 : outlen - 4; /* all of it, or what fits before "..." */
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    size_t n = escaped_len(c);
    if (k + n > room) break;
    if (n == 1) out[k] = (char)c;
    else if (n == 2) out[k] = out[k + 1] = '\\';
    else out[k] = '\\', out[k + 1] = 'x', out[k + 2] = hex[c >> 4], out[k + 3] = hex[c & 15];
    k += n;
  }
  if (need >= outlen) memcpy(out + k, "...", 3), k += 3;
  out[k] = 0;
  return out;
}
