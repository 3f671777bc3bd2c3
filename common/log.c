/* log.c: one place that decides what gets printed and how. Under systemd
 * (JOURNAL_STREAM set) lines carry "<prio>" prefixes so journald keeps levels. */
#include "log.h"
#include "gmlake.h"
#include "options.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static int log_level = -1;
static const char *log_ident = "gmlake";

void gml_log_set_level(int level) { log_level = level; }
void gml_log_set_ident(const char *ident) { log_ident = ident; }

int gml_log_parse_level(const char *s) {
  static const struct { const char *name; int level; } names[] = {
      {"error", GML_LOG_ERROR}, {"warn", GML_LOG_WARN}, {"info", GML_LOG_INFO}, {"debug", GML_LOG_DEBUG}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcasecmp(s, names[i].name)) return names[i].level;
  return GML_EINVAL;
}

static int effective_level(void) {
  if (log_level < 0) {
    const char *env = gml_env(GML_ENV_LOG);
    int l = env ? gml_log_parse_level(env) : -1;
    log_level = l >= 0 ? l : GML_LOG_WARN;
    if (env && l < 0) gml_log(GML_LOG_WARN, "GMLAKE_LOG=%s: not a level (%s); using warn", env, gml_env_accepts(GML_ENV_LOG));
  }
  return log_level;
}

void gml_log(int level, const char *fmt, ...) {
  if (level > effective_level()) return;
  static const char *const tags[] = {"", "", "", "error", "warn", "", "info", "debug"};
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (gml_env(GML_ENV_JOURNAL_STREAM)) {
    fprintf(stderr, "<%d>%s\n", level, line);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ld %s[%s] %s\n", when, ts.tv_nsec / 1000000, log_ident, tags[level & 7], line);
  }
}
