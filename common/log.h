/* log.h: leveled logging to stderr (journald-friendly priority prefixes under systemd). */
#ifndef GML_LOG_H
#define GML_LOG_H
#include <stddef.h>
enum gmli_log_level { GML_LOG_ERROR = 3, GML_LOG_WARN = 4, GML_LOG_INFO = 6, GML_LOG_DEBUG = 7 };
/* -1: GMLAKE_LOG decides, read (and a bad value warned about) at the next line. */
void gmli_log_set_level(int level);
/* GMLAKE_LOG's level now, else def (unset or bad: a bad value is warned
 * about, naming the variable, the value, what it accepts and def); 1 when
 * GMLAKE_LOG gave it. The library's level is this with warn, gmlaked's (no
 * --log-level or log-level in its config) with info. */
int gmli_log_set_level_from_env(int def);
int gmli_log_level(void);                   /* the level lines are printed at now */
int gmli_log_parse_level(const char *s);    /* GML_EINVAL when unknown */
const char *gmli_log_level_name(int level); /* "warn" */
void gmli_log_set_ident(const char *ident);
void gmli_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Why the program cannot go on (a bad setting, a socket in use), whatever the level: "IDENT: why" on
 * stderr as before, with journald's error priority ("<3>") where stderr is the journal, so
 * `journalctl -p err` shows why a unit failed (it was info). */
void gmli_log_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A string that came from a client or another user (a process name, a share
 * key, a cgroup path, a control request's text), fit for a log line: bytes
 * below ' ' or past '~' as \xNN and '\' as \\, so no client writes a line,
 * an escape code or a fake escape of its own; cut with "..." to fit outlen
 * (at least 4). Returns out. GML_LOG_ESC(s) does it into a buffer of the
 * statement's own: every client string a log line holds goes through it. */
const char *gmli_log_escape(const char *s, char *out, size_t outlen);
#define GML_LOG_ESC_MAX 400
#define GML_LOG_ESC(s) gmli_log_escape((s), (char[GML_LOG_ESC_MAX]){0}, GML_LOG_ESC_MAX)

#define GML_ERR(...) gmli_log(GML_LOG_ERROR, __VA_ARGS__)
#define GML_WARN(...) gmli_log(GML_LOG_WARN, __VA_ARGS__)
#define GML_INFO(...) gmli_log(GML_LOG_INFO, __VA_ARGS__)
#define GML_DEBUG(...) gmli_log(GML_LOG_DEBUG, __VA_ARGS__)
#endif
