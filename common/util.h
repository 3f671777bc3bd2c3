/* util.h: small helpers shared by daemon, client and tools. */
#ifndef GML_UTIL_H
#define GML_UTIL_H
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define GML_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define GML_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GML_MAX(a, b) ((a) > (b) ? (a) : (b))
#define GML_MIB (1024ull * 1024ull)
#define GML_GIB (1024ull * GML_MIB)

static inline uint64_t gmli_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
static inline size_t gmli_round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* "123", "4K", "512MiB", "2G"... into bytes; "40%" into a fraction of total
 * (total 0: percentages are refused). Returns 0 or GML_EINVAL. */
int gmli_parse_size(const char *s, uint64_t total, uint64_t *out);
/* "1.50 GiB" style; buf of 32 bytes is enough. */
const char *gmli_format_bytes(uint64_t v, char *buf, size_t len);
/* Raise RLIMIT_NOFILE to its hard limit: every chunk is an fd. */
void gmli_raise_fd_limit(void);
/* Who a quota binds, as gmlakectl's `quota` and gmlaked's `quota` option
 * write it: "PID", "uid:UID" or "cgroup:/PATH" (the path as /proc/PID/cgroup
 * gives it, below GML_QUOTA_CGROUP_MAX bytes), or "cgroup:CONTROLLER:/PATH" on
 * a cgroup v1 hierarchy ("cgroup:freezer:/slurm/uid_0/job_7", as the line of
 * /proc/PID/cgroup that lists CONTROLLER gives it); or "group:NAME", a named
 * quota whatever it binds (gmlakectl only: to change or remove it). Sets
 * *kind, *key (the pid or uid) and *cgroup (into s: the cgroup, or the
 * group's name). Returns 0 or GML_EINVAL. */
enum { GML_QUOTA_PID = 0, GML_QUOTA_UID = 1, GML_QUOTA_CGROUP = 2, GML_QUOTA_GROUP = 3 };
#define GML_QUOTA_CGROUP_MAX 4096 /* PATH_MAX: any cgroup path (a Kubernetes pod's is 150-200 bytes; 128 stored none) */
#define GML_QUOTA_GROUP_MAX 64    /* a quota's name (a job's, a pod's), its NUL included */
int gmli_parse_quota_holder(const char *s, int *kind, uint32_t *key, const char **cgroup);
/* 1 when name may name a quota: 1-63 of letters, digits, '.', '_', '-' (a Prometheus label value as it is). */
int gmli_quota_group_ok(const char *name);
/* What to tell a user whom a Unix socket refused (connect's EACCES): "only
 * its owner (root) and group gmlake may use it; `id` lists this login's
 * groups" (a member added since logs in again). 0, or -1 when the socket
 * cannot be stat'ed or its group has no name. The client library and
 * gmlakectl say the same. */
int gmli_socket_access_hint(const char *path, char *buf, size_t len);
/* path's directory into dir ("." when path names none, "/" for one in the
 * root); returns path's last component (a pointer into path, "" after a
 * trailing '/'). */
const char *gmli_path_dir(const char *path, char *dir, size_t len);
/* Percentile (0..100) of an unsorted array of n values; sorts it in place. */
double gmli_percentile_u64(uint64_t *v, size_t n, double pct);
#endif
