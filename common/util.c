/* util.c: size parsing/formatting, fd limits, percentiles,
 * and the library's error strings (from GML_ERRNO_MAP in gmlake.h). */
#include "util.h"
#include "gmlake.h"
#include "options.h"
#include <ctype.h>
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <grp.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

int gmli_parse_size(const char *s, uint64_t total, uint64_t *out) {
  if (!s || !*s) return GML_EINVAL;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || end == s || !isfinite(v) || v < 0) return GML_EINVAL; /* nan, inf: refused */
  while (isspace((unsigned char)*end)) end++;
  if (*end == '%') {
    if (!total || end[1] || v > 100) return GML_EINVAL;
    *out = (uint64_t)(v / 100.0 * (double)total);
    return 0;
  }
  static const struct {
    const char *suffix;
    uint64_t mult;
  } units[] = {{"", 1},
               {"b", 1},
               {"k", 1ull << 10},
               {"kib", 1ull << 10},
               {"kb", 1000},
               {"m", 1ull << 20},
               {"mib", 1ull << 20},
               {"mb", 1000000},
               {"g", 1ull << 30},
               {"gib", 1ull << 30},
               {"gb", 1000000000ull},
               {"t", 1ull << 40},
               {"tib", 1ull << 40}};
  for (size_t i = 0; i < GML_ARRAY_LEN(units); i++) {
    if (!strcasecmp(end, units[i].suffix)) {
      if (v * (double)units[i].mult >= 18446744073709551616.0) return GML_EINVAL; /* over 2^64: no defined conversion */
      *out = (uint64_t)(v * (double)units[i].mult);
      return 0;
    }
  }
  return GML_EINVAL;
}

const char *gmli_format_bytes(uint64_t v, char *buf, size_t len) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double d = (double)v;
  int i = 0;
  while (d >= 1024 && i < 4) {
    d /= 1024;
    i++;
  }
  if (i == 0) snprintf(buf, len, "%llu B", (unsigned long long)v);
  else snprintf(buf, len, "%.2f %s", d, u[i]);
  return buf;
}

/* Soft fd limit up to the hard one; a process allowed to (root with
 * CAP_SYS_RESOURCE: the daemon, containers' jobs) takes the kernel's
 * ceiling (fs.nr_open) up to 1M: a client keeps one fd per chunk it holds. */
void gmli_raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  rlim_t want = 1 << 20;
  FILE *f = fopen("/proc/sys/fs/nr_open", "r");
  unsigned long long nr = 0;
  if (f) {
    if (fscanf(f, "%llu", &nr) == 1 && nr < want) want = (rlim_t)nr;
    fclose(f);
  }
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
    struct rlimit up = {want, want};
    if (setrlimit(RLIMIT_NOFILE, &up) == 0) return;
  }
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

double gmli_percentile_u64(uint64_t *v, size_t n, double pct) {
  if (!n) return 0;
  qsort(v, n, sizeof *v, cmp_u64);
  size_t i = (size_t)(pct / 100.0 * (double)(n - 1) + 0.5);
  return (double)v[i < n ? i : n - 1];
}

const char *gml_strerror(int err) {
  switch (err) {
#define GML_ERROR_MESSAGE(name, code, msg)                                                                             \
  case GML_##name: return msg;
    GML_ERRNO_MAP(GML_ERROR_MESSAGE)
#undef GML_ERROR_MESSAGE
  default: return "unknown error";
  }
}

const char *gml_errname(int err) {
  switch (err) {
#define GML_ERROR_NAME(name, code, msg)                                                                                \
  case GML_##name: return "GML_" #name;
    GML_ERRNO_MAP(GML_ERROR_NAME)
#undef GML_ERROR_NAME
  default: return "GML_EUNKNOWN";
  }
}

uint32_t gml_version(void) { return GML_VERSION; }

/* A cgroup's path as /proc/PID/cgroup gives it: "/" or "/a/b", no empty,
 * "." or ".." part, no trailing "/" (another spelling never matches a
 * process, so its quota would bind nothing). */
static int cgroup_path_canonical(const char *p) {
  if (*p != '/' || strlen(p) >= GML_QUOTA_CGROUP_MAX) return 0;
  if (!p[1]) return 1;
  for (const char *c = p; *c;) {
    const char *e = strchr(c + 1, '/');
    size_t n = e ? (size_t)(e - c - 1) : strlen(c + 1);
    if (!n || (n == 1 && c[1] == '.') || (n == 2 && c[1] == '.' && c[2] == '.')) return 0;
    if (!e) break;
    c = e;
  }
  return 1;
}

int gmli_quota_group_ok(const char *name) {
  size_t n = strlen(name);
  if (!n || n >= GML_QUOTA_GROUP_MAX) return 0;
  for (const char *c = name; *c; c++)
    if (!isalnum((unsigned char)*c) && !strchr("._-", *c)) return 0;
  return 1;
}

/* "/PATH" (v2), or "CONTROLLER:/PATH" for a v1 hierarchy ("freezer", "name=systemd": as /proc/PID/cgroup lists it). */
static int cgroup_holder_ok(const char *s) {
  if (*s == '/') return cgroup_path_canonical(s);
  const char *colon = strchr(s, ':');
  if (!colon || colon == s || colon - s > 64) return 0;
  for (const char *c = s; c < colon; c++)
    if (!isalnum((unsigned char)*c) && !strchr("_=", *c)) return 0;
  return cgroup_path_canonical(colon + 1);
}

int gmli_parse_quota_holder(const char *s, int *kind, uint32_t *key, const char **cgroup) {
  *key = 0, *cgroup = NULL;
  if (!strncmp(s, "cgroup:", 7)) {
    *kind = GML_QUOTA_CGROUP, *cgroup = s + 7;
    return cgroup_holder_ok(s + 7) ? 0 : GML_EINVAL;
  }
  if (!strncmp(s, "group:", 6)) { /* a named quota, whatever it binds */
    *kind = GML_QUOTA_GROUP, *cgroup = s + 6;
    return gmli_quota_group_ok(s + 6) ? 0 : GML_EINVAL;
  }
  *kind = strncmp(s, "uid:", 4) ? GML_QUOTA_PID : GML_QUOTA_UID;
  const char *p = *kind == GML_QUOTA_UID ? s + 4 : s;
  if (!isdigit((unsigned char)*p)) return GML_EINVAL;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(p, &end, 10);
  /* a pid from 1 to INT32_MAX; a uid short of (uid_t)-1, which means "none" */
  if (*end || errno || (*kind == GML_QUOTA_PID ? v < 1 || v > INT32_MAX : v > 0xfffffffeull)) return GML_EINVAL;
  *key = (uint32_t)v;
  return 0;
}

int gmli_socket_access_hint(const char *path, char *buf, size_t len) {
  struct stat st;
  struct group gr, *g = NULL;
  struct passwd pw, *u = NULL;
  char gbuf[1024], pbuf[1024], owner[32];
  if (stat(path, &st) != 0 || getgrgid_r(st.st_gid, &gr, gbuf, sizeof gbuf, &g) != 0 || !g) return -1;
  if (getpwuid_r(st.st_uid, &pw, pbuf, sizeof pbuf, &u) == 0 && u) snprintf(owner, sizeof owner, "%s", u->pw_name);
  else snprintf(owner, sizeof owner, "uid %u", (unsigned)st.st_uid);
  snprintf(buf, len, "only its owner (%s) and group %s may use it; `id` lists this login's groups", owner, g->gr_name);
  return 0;
}

const char *gmli_path_dir(const char *path, char *dir, size_t len) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, len, ".");
  else snprintf(dir, len, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  return slash ? slash + 1 : path;
}
