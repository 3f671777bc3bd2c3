/* log.h: leveled logging to stderr (journald-friendly priority prefixes under systemd). */
#ifndef GML_LOG_H
#define GML_LOG_H
enum gml_log_level { GML_LOG_ERROR = 3, GML_LOG_WARN = 4, GML_LOG_INFO = 6, GML_LOG_DEBUG = 7 };
/* -1: GMLAKE_LOG decides, read (and a bad value warned about) at the next line. */
void gml_log_set_level(int level);
/* GMLAKE_LOG's level now, else def (unset or bad: a bad value is warned
 * about, naming the variable, the value, what it accepts and def); 1 when
 * GMLAKE_LOG gave it. The library's level is this with warn, gmlaked's (no
 * --log-level or log-level in its config) with info. */
int gml_log_set_level_from_env(int def);
int gml_log_level(void); /* the level lines are printed at now */
int gml_log_parse_level(const char *s); /* GML_EINVAL when unknown */
const char *gml_log_level_name(int level); /* "warn" */
void gml_log_set_ident(const char *ident);
void gml_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Why the program cannot go on (a bad setting, a socket in use), whatever the level: "IDENT: why" on
 * stderr as before, with journald's error priority ("<3>") where stderr is the journal, so
 * `journalctl -p err` shows why a unit failed (it was info). */
void gml_log_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define GML_ERR(...) gml_log(GML_LOG_ERROR, __VA_ARGS__)
#define GML_WARN(...) gml_log(GML_LOG_WARN, __VA_ARGS__)
#define GML_INFO(...) gml_log(GML_LOG_INFO, __VA_ARGS__)
#define GML_DEBUG(...) gml_log(GML_LOG_DEBUG, __VA_ARGS__)
#endif
