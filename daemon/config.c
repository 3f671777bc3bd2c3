/* config.c: gmlaked's options (see config.h). Adding a setting: a field in
 * gmld_config and one row in `options` below (name, type, where, default,
 * help, range); the config file, the flags and --help all follow. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "config.h"
#include "gmlake.h"
#include "backend.h"
#include "gpuname.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include "wire.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

enum opt_type {
  OPT_INT,     /* an int in [min, max], written in base `base` */
  OPT_SIZE,    /* bytes: "256MiB", "2G" (uint64_t), at least min */
  OPT_LIMIT,   /* bytes or PCT%, kept as text: the device's size is known later */
  OPT_STRING,  /* text of at most `max` bytes; min = 1: not empty */
  OPT_GROUP,   /* a group's name, which must exist (a socket nobody of the group can reach is no service) */
  OPT_CHOICE,  /* one of the words of `choices` */
  OPT_BACKEND, /* "auto" or a backend of common/backend.c's table */
  OPT_DEVICE,  /* an index, a UUID, host-N or a PCI bus id (common/gpuname.h); the backend resolves it at start */
  OPT_URL,     /* text with "://" */
  OPT_HOSTPORT, /* "ADDR:PORT" of a listener (ADDR a name, an IPv4 or [IPv6] address, or empty: all; PORT 1-65535), or "" */
  OPT_LOGLEVEL, /* error, warn, info, debug */
  OPT_FLAG,     /* no value; sets the int to 1 */
  OPT_CONFIG,   /* the config file (read before the other flags) */
  OPT_QUOTA, /* "PID|uid:UID|cgroup:PATH BYTES" (gmli_parse_quota_holder), may repeat (appended to quotas), once a holder */
  OPT_VERSION, /* print the version, exit */
};

typedef struct config_option {
  const char *name; /* long option and config-file key */
  const char *arg;  /* the value's name in --help (NULL: a flag) */
  enum opt_type type;
  size_t off, size; /* where in gmld_config */
  const char *def;  /* default, parsed like a value (NULL: none) */
  const char *help; /* --help text; "%D" is replaced by the default */
  long min, max;
  int base;
  const char *choices;
} config_option;

#define AT(field) offsetof(gmld_config, field), sizeof(((gmld_config *)0)->field)
#define SUN_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

static const config_option options[] = {
    {"device", "N|UUID|PCI", OPT_DEVICE, AT(device_spec), "0",
     "the GPU: nvidia-smi's index N, its UUID (GPU-...) or PCI bus id (0000:3b:00.0); host backend: N or host-N "
     "(default %D)",
     0, 0, 0, NULL},
    {"backend", "B", OPT_BACKEND, AT(backend), "auto", "auto (default: cuda when a GPU is usable), cuda or host", 0, 0,
     0, NULL},
    {"socket", "PATH", OPT_STRING, AT(socket_path), NULL,
     "client socket (default /run/gmlake/gmlake-<UUID>.sock, or in $XDG_RUNTIME_DIR, and gmlake-N.sock a link to it)",
     1, SUN_PATH_MAX, 0, NULL},
    {"control", "URL", OPT_URL, AT(control_url), NULL,
     "control RPC endpoint (default ipc://<the socket's dir>/gmlake-<UUID>.ctl and a link gmlake-N.ctl; beside a "
     "--socket: "
     "gmlake-N.ctl)",
     0, 0, 0, NULL},
    {"limit", "BYTES|PCT%", OPT_LIMIT, AT(limit), NULL,
     "the most the lake holds (default 90% of the device; host: 50% of RAM)", 0, 0, 0, NULL},
    {"prefetch", "BYTES", OPT_SIZE, AT(prefetch_bytes), "256MiB", "chunks created ahead of demand (default %D)", 0, 0,
     0, NULL},
    {"preallocate", "BYTES", OPT_SIZE, AT(preallocate_bytes), "0",
     "create this much at start and keep at least that much (default %D)", 0, 0, 0, NULL},
    {"creators", "N", OPT_INT, AT(creators), "4", "threads creating chunks (default %D)", 1, 64, 10, NULL},
    {"lease-wait", "MS", OPT_INT, AT(lease_wait_ms), "3000",
     "a lease the lake cannot serve at once waits this long for other clients' idle cache (default %D)", 0, 600000, 10,
     NULL},
    {"meminfo-promise-ms", "MS", OPT_INT, AT(meminfo_promise_ms), "2000",
     "a client told what it could get (gml_mem_info, torch.cuda.mem_get_info) holds that as a promise this long: "
     "others asking meanwhile wait until it leases (default %D; 0: no promise)",
     0, 600000, 10, NULL},
    {"idle-release", "S", OPT_INT, AT(idle_release_s), "30",
     "free chunks past --idle-reserve go back to the driver once nothing was leased or given back for this long "
     "(default %D; 0: never)",
     0, 86400, 10, NULL},
    {"idle-reserve", "BYTES", OPT_SIZE, AT(idle_reserve_bytes), "0",
     "free chunks an idle lake keeps, besides what keeps it at --preallocate (default %D)", 0, 0, 0, NULL},
    {"adopt-window", "S", OPT_INT, AT(adopt_window_s), "120",
     "clients hand over the chunks they hold this long after start, not later (default %D)", 0, 86400, 10, NULL},
    {"socket-mode", "OCTAL", OPT_INT, AT(socket_mode), "0660", "permissions of the socket (default %D)", 0, 0777, 8,
     NULL},
    {"socket-group", "NAME", OPT_GROUP, AT(socket_group), NULL, "group of the socket (default: the daemon's)", 0, 63, 0,
     NULL},
    {"log-level", "L", OPT_LOGLEVEL, AT(log_level), NULL,
     "error, warn, info or debug (default: $GMLAKE_LOG, else info)", 0, 0, 0, NULL},
    {"config", "PATH", OPT_CONFIG, AT(config_path), NULL,
     "config file (default " GMLD_DEFAULT_CONFIG " if present, read by root's daemon only)", 0, 0, 0, NULL},
    {"quota", "'PID|uid:UID|cgroup:PATH BYTES'", OPT_QUOTA, AT(quotas), NULL,
     "a quota, one argument (--quota 'uid:1000 8GiB'), as gmlakectl quota sets it (may repeat, once a holder: a flag's "
     "replaces the file's of the same holder; SIGHUP replaces every "
     "quota with the file's)",
     0, 0, 0, NULL},
    {"send-queue-max", "BYTES", OPT_SIZE, AT(send_queue_max), "4MiB",
     "replies queued to a client that does not read them, at most (default %D, at least 128KiB): over it, it is closed",
     /* two whole frames: below one, every client was closed at its hello as one "that does not read" */
     2 * GML_MAX_FRAME, 0, 0, NULL},
    {"hello-timeout-ms", "MS", OPT_INT, AT(hello_timeout_ms), "5000", "a connection must say hello within (default %D)",
     1, 3600000, 10, NULL},
    {"frame-timeout-ms", "MS", OPT_INT, AT(frame_timeout_ms), "5000", "a frame begun must be whole within (default %D)",
     1, 3600000, 10, NULL},
    {"max-clients", "N", OPT_INT, AT(max_clients), "1024", "connections in all, at most (default %D)", 1, 1000000, 10,
     NULL},
    {"max-clients-per-uid", "N", OPT_INT, AT(max_clients_per_uid), "256",
     "connections of one user, at most (default %D)", 1, 1000000, 10, NULL},
    {"read-budget", "N", OPT_INT, AT(read_budget), "64",
     "frames handled from one client per turn of the loop (default %D): fairness", 1, 1000000, 10, NULL},
    {"accept-backoff-ms", "MS", OPT_INT, AT(accept_backoff_ms), "100",
     "out of fds: accepting pauses this long (default %D)", 1, 60000, 10, NULL},
    {"control-insecure-tcp", NULL, OPT_FLAG, AT(control_insecure_tcp), NULL,
     "allow a tcp:// control URL: anyone who reaches it may change the lake (unauthenticated)", 0, 0, 0, NULL},
    {"metrics-listen", "ADDR:PORT", OPT_HOSTPORT, AT(metrics_listen), NULL,
     "serve Prometheus text on http://ADDR:PORT/metrics (default: off)", 0, 127, 0, NULL},
    {"foreground", NULL, OPT_FLAG, AT(foreground), NULL, "stay in the foreground (always true; kept for scripts)", 0, 0,
     0, NULL},
    {"instance-config", "PATH", OPT_CONFIG, AT(instance_config_path), NULL,
     "this GPU's own config file, read after --config when it exists: its settings win (the unit passes "
     "/etc/gmlake/gmlaked@N.conf)",
     0, 0, 0, NULL},
    {"check-config", NULL, OPT_FLAG, AT(check_config), NULL,
     "read the config file and the flags, say whether a start would take them (exit 0) or why not (exit 2), and exit: "
     "the unit's ExecReload runs it first, so a reload of a bad file fails",
     0, 0, 0, NULL},
    {"version", NULL, OPT_VERSION, 0, 0, NULL, "print the version and exit", 0, 0, 0, NULL},
};

void config_usage(FILE *f) {
  fprintf(f, "usage: gmlaked [options]\n"
             "  One daemon per GPU: owns the device's memory chunks and leases them to processes.\n");
  for (size_t i = 0; i < GML_ARRAY_LEN(options); i++) {
    const config_option *o = &options[i];
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    fprintf(f, "  %-22s%s", left,
            strlen(left) < 22 ? "" : "\n                        "); /* a long one: its help below */
    for (const char *h = o->help; *h; h++) {
      if (h[0] == '%' && h[1] == 'D') fputs(o->def ? o->def : "none", f), h++;
      else fputc(*h, f);
    }
    fputc('\n', f);
  }
  fprintf(
      f,
      "Config file: one 'key = value' per line, keys as the long options without '--', each once (quota may repeat,\n"
      "once a holder), '#' comments.\n");
}

static int has_word(const char *words, const char *w) {
  size_t n = strlen(w);
  if (!n) return 0;
  for (const char *p = words; (p = strstr(p, w)); p += n)
    if ((p == words || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
  return 0;
}

/* Parse val into o's field; 0, or -1 for a value it refuses. */
static int set_value(gmld_config *c, const config_option *o, const char *val) {
  void *at = (char *)c + o->off;
  uint64_t v;
  char *end;
  switch (o->type) {
  case OPT_INT: {
    long n = strtol(val, &end, o->base);
    if (!*val || *end || n < o->min || n > o->max) return -1; /* "socket-mode =" is no mode 0000 */
    if (o->size == sizeof(int)) *(int *)at = (int)n;
    else return -1;
    return 0;
  }
  case OPT_SIZE:
    if (gmli_parse_size(val, 0, &v) || v < (uint64_t)o->min) return -1;
    *(uint64_t *)at = v;
    return 0;
  case OPT_LIMIT:
    if (gmli_parse_size(val, 100, &v) || (strchr(val, '%') == NULL && v == 0) || strlen(val) >= o->size) return -1;
    break;
  case OPT_STRING:
    if (strlen(val) < (size_t)o->min || strlen(val) > (size_t)o->max || strlen(val) >= o->size) return -1;
    break;
  case OPT_GROUP:
    if (strlen(val) > (size_t)o->max || strlen(val) >= o->size || (*val && !getgrnam(val))) return -1;
    break;
  case OPT_CHOICE:
    if (!has_word(o->choices, val) || strlen(val) >= o->size) return -1;
    break;
  case OPT_BACKEND:
    if (!gmli_backend_known(val) || strlen(val) >= o->size) return -1;
    break;
  case OPT_DEVICE:
    if (!gmli_device_spec_valid(val) || strlen(val) >= o->size) return -1;
    c->device =
        gmli_device_spec_index(val) >= 0 ? gmli_device_spec_index(val) : gmli_host_device_of_name(val); /* a GPU's
                                             * UUID or PCI bus id: -1 until the backend says which index it is */
    break;
  case OPT_URL:
    if (!strstr(val, "://") || strlen(val) >= o->size) return -1;
    break;
  case OPT_HOSTPORT: {
    if (!*val) break; /* "": off (a flag that turns off the file's) */
    const char *colon = strrchr(val, ':');
    if (!colon || strlen(val) > (size_t)o->max || strlen(val) >= o->size || !isdigit((unsigned char)colon[1]))
      return -1;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535) return -1;
    size_t hl = (size_t)(colon - val);
    if (hl && (val[0] == '[') != (val[hl - 1] == ']')) return -1; /* [IPv6] */
    for (const char *h = val; h < colon; h++)
      if (!isalnum((unsigned char)*h) && !strchr(".-_:[]%", *h)) return -1;
    break;
  }
  case OPT_LOGLEVEL: {
    int l = gmli_log_parse_level(val);
    if (l < 0) return -1;
    *(int *)at = l;
    return 0;
  }
  case OPT_FLAG: /* the key alone, or a yes/no in the file (before, any value turned it on: "= no" too) */
    if (!*val || has_word("yes true on 1", val)) *(int *)at = 1;
    else if (has_word("no false off 0", val)) *(int *)at = 0;
    else return -1;
    return 0;
  case OPT_CONFIG: break;
  case OPT_QUOTA: {
    /* the holder, then the bytes after the last blank (a cgroup's path may hold blanks) */
    config_quota q = {0};
    char holder[sizeof q.cgroup + 8];
    const char *sep = val + strlen(val), *cg;
    while (sep > val && !isspace((unsigned char)sep[-1])) sep--;
    const char *bytes = sep;
    while (sep > val && isspace((unsigned char)sep[-1])) sep--;
    if (sep == val || (size_t)(sep - val) >= sizeof holder) return -1;
    snprintf(holder, sizeof holder, "%.*s", (int)(sep - val), val);
    if (gmli_parse_quota_holder(holder, &q.kind, &q.key, &cg) || q.kind == GML_QUOTA_GROUP ||
        gmli_parse_size(bytes, 0, &q.bytes) || c->nquotas >= GMLD_MAX_CONFIG_QUOTAS)
      return -1;
    if (cg) snprintf(q.cgroup, sizeof q.cgroup, "%s", cg);
    c->quotas[c->nquotas++] = q;
    return 0;
  }
  case OPT_VERSION: return 0;
  }
  snprintf(at, o->size, "%s", val);
  return 0;
}

static const config_option *find_option(const char *name) {
  for (size_t i = 0; i < GML_ARRAY_LEN(options); i++)
    if (!strcmp(options[i].name, name)) return &options[i];
  return NULL;
}

/* What o accepts, for the message that refuses a value (" (...)"). */
static void accepted(const config_option *o, const char *val, char *buf, size_t len) {
  switch (o->type) {
  case OPT_INT:
    if (o->base == 8) snprintf(buf, len, " (octal permissions, e.g. 0660)");
    else snprintf(buf, len, " (a number from %ld to %ld)", o->min, o->max);
    break;
  case OPT_SIZE:
    if (o->min) snprintf(buf, len, " (bytes, at least %ld: 256MiB, 2G, 1048576)", o->min);
    else snprintf(buf, len, " (bytes: 256MiB, 2G, 1048576)");
    break;
  case OPT_LIMIT: snprintf(buf, len, " (bytes, e.g. 60GiB, or a share of the device from 1%% to 100%%)"); break;
  case OPT_STRING: snprintf(buf, len, " (%ld to %ld bytes)", o->min, GML_MIN(o->max, (long)o->size - 1)); break;
  case OPT_CHOICE: snprintf(buf, len, " (one of: %s)", o->choices); break;
  case OPT_BACKEND: snprintf(buf, len, " (one of: %s)", gmli_backend_names()); break;
  case OPT_DEVICE:
    snprintf(buf, len,
             " (nvidia-smi's index 0 to %d, a UUID as nvidia-smi -L prints it, GPU-xxxxxxxx-..., a PCI bus id, "
             "0000:3b:00.0, or host-N)",
             GML_DEVICE_INDEX_MAX);
    break;
  case OPT_URL: snprintf(buf, len, " (a URL: ipc:///PATH, or tcp://HOST:PORT with control-insecure-tcp)"); break;
  case OPT_LOGLEVEL: snprintf(buf, len, " (error, warn, info or debug)"); break;
  case OPT_FLAG: snprintf(buf, len, " (a flag: the key alone, or yes / no)"); break;
  case OPT_QUOTA:
    snprintf(buf, len, "%s",
             !strchr(val, ' ') ? " (holder and bytes are one value: 'uid:1000 8GiB')"
                               : " (PID, uid:UID or cgroup:/PATH, then bytes: 'uid:1000 8GiB')");
    break;
  case OPT_HOSTPORT:
    snprintf(buf, len, " (ADDR:PORT, PORT 1-65535: 127.0.0.1:9400, [::1]:9400, :9400 for all addresses)");
    break;
  default: buf[0] = 0;
  }
}

/* Apply one setting; returns 0 or -1 with a message naming the key. */
static int apply_setting(gmld_config *c, const char *key, const char *val, char *err, size_t errlen) {
  const config_option *o = find_option(key);
  if (!o || o->type == OPT_CONFIG || o->type == OPT_VERSION) {
    snprintf(err, errlen, "unknown setting '%s'", key);
    return -1;
  }
  if (set_value(c, o, val)) {
    if (o->type == OPT_GROUP) /* the daemon would serve a socket nobody of the intended group can reach */
      snprintf(err, errlen,
               "bad value for %s: no group '%s' (create it first: groupadd %s; or leave %s out to keep the "
               "daemon's own group)",
               key, val, val, key);
    else {
      char what[128];
      accepted(o, val, what, sizeof what);
      snprintf(err, errlen, "bad value for %s: '%s'%s", key, val, what);
    }
    return -1;
  }
  return 0;
}

/* The index of a quota before the last one that has its holder, else -1. */
static int quota_holder_before(const gmld_config *c) {
  const config_quota *q = &c->quotas[c->nquotas - 1];
  for (int i = 0; i < c->nquotas - 1; i++)
    if (c->quotas[i].kind == q->kind && c->quotas[i].key == q->key && !strcmp(c->quotas[i].cgroup, q->cgroup)) return i;
  return -1;
}

/* A quota's holder as gmlakectl quota and the file write it: "42", "uid:1000", "cgroup:/x". */
static const char *quota_holder_name(const config_quota *q, char *buf, size_t len) {
  if (q->kind == GML_QUOTA_CGROUP) snprintf(buf, len, "cgroup:%s", q->cgroup);
  else snprintf(buf, len, "%s%u", q->kind == GML_QUOTA_UID ? "uid:" : "", q->key);
  return buf;
}

static int quiet;            /* a reload: say nothing, the caller logs config_error() */
static char last_error[640]; /* why the last config_load failed ("" when it did not) */
void config_set_quiet(int on) { quiet = on; }
const char *config_error(void) { return last_error; }

/* Why the configuration is refused: kept for config_error(), and on stderr unless quiet. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  if (!quiet) gmli_log_fatal("%s", last_error);
}

static const char *file_kind(mode_t m) {
  return S_ISFIFO(m)   ? "a FIFO"
         : S_ISDIR(m)  ? "a directory"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
                       : "not a file";
}

/* The config is opened without waiting (O_NONBLOCK) and looked at before it
 * is read: anything but a regular file is refused. Before, it was opened
 * first: open() of a FIFO waits for a writer, and a SIGHUP froze the daemon.
 * Symlinks are followed (a config kept in /etc, linked from elsewhere). */
static int load_config_file(gmld_config *c, const char *path, int must_exist) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    if (!must_exist && errno == ENOENT) return 0;
    say("cannot read config %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    say("config %s is not a regular file (%s)", path, file_kind(st.st_mode));
    close(fd);
    return -1;
  }
  FILE *f = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0 ? fdopen(fd, "r") : NULL;
  if (!f) {
    say("cannot read config %s: %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  char line[GML_QUOTA_CGROUP_MAX + 512];                        /* a quota of any cgroup path fits */
  int lineno = 0, rc = 0, set_at[GML_ARRAY_LEN(options)] = {0}; /* the line each key was given on */
  while (fgets(line, sizeof line, f)) {
    lineno++;
    size_t n = strlen(line);
    if (!strchr(line, '\n') && !feof(f) && n < sizeof line - 1) { /* fgets went on past a NUL: not text */
      say("%s:%d: a NUL byte: not a text file", path, lineno);
      rc = -1; /* before: "line longer than 510 bytes", of a line of 12 */
      break;
    }
    if (!strchr(line, '\n') && !feof(f)) { /* its rest would be read as the next line (a comment's tail as a key) */
      say("%s:%d: line longer than %zu bytes", path, lineno, sizeof line - 2);
      rc = -1;
      break;
    }
    char *p = line;
    char *hash = strchr(p, '#');
    if (hash) *hash = 0;
    while (isspace((unsigned char)*p)) p++;
    if (!*p) continue;
    char *eq = strchr(p, '=');
    char *end = p + strlen(p);
    while (end > p && isspace((unsigned char)end[-1])) *--end = 0;
    char *key = p, *val = (char *)"";
    if (eq) {
      *eq = 0;
      val = eq + 1;
      while (isspace((unsigned char)*val)) val++;
      char *ke = eq;
      while (ke > key && isspace((unsigned char)ke[-1])) *--ke = 0;
    }
    /* refused like any other mistake in the file (before, the last one won without a word): which
     * of the two was meant is not ours to guess; quota lines add up, each one a quota */
    const config_option *o = find_option(key);
    if (o && !strcmp(o->name, "check-config")) { /* a command, not a setting */
      say("%s:%d: unknown setting '%s'", path, lineno, key);
      rc = -1;
      break;
    }
    if (o && o->type != OPT_QUOTA && set_at[o - options]) {
      say("%s:%d: %s given twice (lines %d and %d): give it once", path, lineno, key, set_at[o - options], lineno);
      rc = -1;
      break;
    }
    char err[256];
    if (apply_setting(c, key, val, err, sizeof err)) {
      say("%s:%d: %s", path, lineno, err);
      rc = -1;
      break;
    }
    if (o) set_at[o - options] = lineno;
    if (o && o->type == OPT_QUOTA) { /* quota lines add up, but two for one holder are a key given twice */
      config_quota *q = &c->quotas[c->nquotas - 1];
      int was = quota_holder_before(c);
      q->line = lineno;
      if (was >= 0) { /* before: the last one won, and a reload said "2 quota(s)" */
        char h[sizeof q->cgroup + 8];
        say("%s:%d: quota of %s given twice (lines %d and %d): give one quota line a holder", path, lineno,
            quota_holder_name(q, h, sizeof h), c->quotas[was].line, lineno);
        rc = -1;
        break;
      }
    }
  }
  fclose(f);
  return rc;
}

int config_load(gmld_config *c, int argc, char **argv) {
  memset(c, 0, sizeof *c);
  last_error[0] = 0;
  for (size_t i = 0; i < GML_ARRAY_LEN(options); i++)
    if (options[i].def && set_value(c, &options[i], options[i].def)) abort(); /* a bad row in the table */
  const char *notify = gmli_env(GML_ENV_NOTIFY_SOCKET);
  if (notify) snprintf(c->notify_socket, sizeof c->notify_socket, "%s", notify);
  struct option opts[GML_ARRAY_LEN(options) + 2];
  for (size_t i = 0; i < GML_ARRAY_LEN(options); i++)
    opts[i] = (struct option){options[i].name, options[i].arg ? required_argument : no_argument, 0, 0};
  opts[GML_ARRAY_LEN(options)] = (struct option){"help", no_argument, 0, 'h'};
  opts[GML_ARRAY_LEN(options) + 1] = (struct option){0, 0, 0, 0};
  /* first pass: the config file, so that flags can override it */
  const char *cfg = NULL, *inst = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--config") && i + 1 < argc) cfg = argv[i + 1];
    else if (!strncmp(argv[i], "--config=", 9)) cfg = argv[i] + 9;
    else if (!strcmp(argv[i], "--instance-config") && i + 1 < argc) inst = argv[i + 1];
    else if (!strncmp(argv[i], "--instance-config=", 18)) inst = argv[i] + 18;
  }
  if (!cfg) cfg = gmli_env(GML_ENV_DAEMON_CONFIG);
  /* the system file is the system daemon's: a user's private daemon (not root) reads it only when named (it
   * failed on the system's settings, or took its quotas and metrics port) */
  if ((cfg || geteuid() == 0) && load_config_file(c, cfg ? cfg : GMLD_DEFAULT_CONFIG, cfg != NULL)) return GML_EINVAL;
  if (cfg) snprintf(c->config_path, sizeof c->config_path, "%s", cfg);
  /* one GPU's own file over the shared one, when it exists: its keys win (a metrics port each) */
  if (inst && load_config_file(c, inst, 0)) return GML_EINVAL;
  if (inst) snprintf(c->instance_config_path, sizeof c->instance_config_path, "%s", inst);
  int idx, ch;
  optind = 0; /* a full re-initialisation of getopt: config_load runs again on SIGHUP */
  while ((ch = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
    if (ch == 'h') {
      config_usage(stdout);
      return 1;
    }
    if (ch != 0) {
      config_usage(stderr);
      return GML_EINVAL;
    }
    if (options[idx].type == OPT_CONFIG) continue;
    if (options[idx].type == OPT_VERSION) {
      printf("gmlaked %d.%d.%d (protocol %d)\n", GML_VERSION_MAJOR, GML_VERSION_MINOR, GML_VERSION_PATCH,
             GML_PROTOCOL_VERSION);
      return 1;
    }
    char err[256];
    if (apply_setting(c, options[idx].name, optarg ? optarg : "", err, sizeof err)) {
      say("%s (option --%s)", err, options[idx].name);
      return GML_EINVAL;
    }
    int was = options[idx].type == OPT_QUOTA ? quota_holder_before(c) : -1;
    if (was >= 0) c->quotas[was] = c->quotas[--c->nquotas]; /* flags win over the file, the last flag over others */
  }
  if (optind < argc) {
    say("unexpected argument '%s'", argv[optind]);
    return GML_EINVAL;
  }
  return 0;
}

/* The settings that differ between was and now, but those a reload takes
 * (limit, quota, log-level, idle-release, idle-reserve) and config: "socket, creators" into out. 0 when
 * none differ (a reload said nothing of a changed socket or metrics-listen,
 * which keep their old values until the next start). */
int config_changed_at_start(const gmld_config *was, const gmld_config *now, char *out, size_t len) {
  int n = 0;
  out[0] = 0;
  for (size_t i = 0; i < GML_ARRAY_LEN(options); i++) {
    const config_option *o = &options[i];
    if (o->type == OPT_LIMIT || o->type == OPT_QUOTA || o->type == OPT_LOGLEVEL || o->type == OPT_CONFIG ||
        o->type == OPT_VERSION || !strcmp(o->name, "foreground") || !strncmp(o->name, "idle-", 5))
      continue;
    const char *a = (const char *)was + o->off, *b = (const char *)now + o->off;
    int text = o->type == OPT_STRING || o->type == OPT_GROUP || o->type == OPT_BACKEND || o->type == OPT_URL ||
               o->type == OPT_HOSTPORT || o->type == OPT_CHOICE || o->type == OPT_DEVICE;
    if (text ? !strncmp(a, b, o->size) : !memcmp(a, b, o->size)) continue;
    size_t used = strlen(out);
    snprintf(out + used, len - used, "%s%s", n++ ? ", " : "", o->name);
  }
  return n;
}
