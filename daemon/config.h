/* config.h: gmlaked's settings, in one place. Built-in defaults, then the
 * config file (/etc/gmlake/gmlaked.conf, $GMLAKED_CONFIG or --config), then
 * the command line: flags win. The log level has no built-in default: set
 * by neither, gmlaked takes $GMLAKE_LOG, else info (main.c). One table of
 * options (config.c) drives the file parser, the flag parser and --help; a
 * bad value is an error at start that names its key. */
#ifndef GML_CONFIG_H
#define GML_CONFIG_H
#include "util.h"
#include <stdint.h>
#include <stdio.h>

#define GMLD_DEFAULT_CONFIG "/etc/gmlake/gmlaked.conf"

#define GMLD_MAX_CONFIG_QUOTAS 64

typedef struct config_quota {
  int kind;                          /* GML_QUOTA_PID, _UID or _CGROUP (util.h) */
  uint32_t key;                      /* pid or uid */
  char cgroup[GML_QUOTA_CGROUP_MAX]; /* GML_QUOTA_CGROUP: its path (GML_QUOTA_CGROUP_MAX) */
  uint64_t bytes;
  int line; /* the config file's line it is on (0: a flag) */
} config_quota;

typedef struct gmld_config {
  char device_spec[64]; /* --device as given: an index, a UUID, host-N or a PCI bus id */
  int device;           /* its index (nvidia-smi's; host: N): the spec's when it is one, else -1 until
                               * the backend resolved it at start (main.c) */
  char backend[16];
  char socket_path[256];
  char control_url[300];
  char limit[64];              /* bytes or PCT% of the device; "" = 90% (cuda) or 50% (host) */
  uint64_t prefetch_bytes;     /* created ahead of demand */
  uint64_t preallocate_bytes;  /* the lake holds at least this much, created at start */
  int creators;                /* worker threads creating chunks */
  int adopt_window_s;          /* hand-overs (Adopt) are taken this long after start, then refused */
  int lease_wait_ms;           /* a lease the lake cannot serve at once waits this long for reclaims */
  int meminfo_promise_ms;      /* a mem-info answer holds as a promise this long (meminfo.h) */
  int idle_release_s;          /* an idle lake gives its free chunks past the reserve back after this long (0: never) */
  uint64_t idle_reserve_bytes; /* what it keeps */
  int foreground;
  int check_config; /* --check-config: parse, say, exit */
  int log_level;    /* GML_LOG_*; 0: not set here (gmlaked takes $GMLAKE_LOG, else info) */
  unsigned socket_mode;
  char socket_group[64];
  char config_path[256];
  char instance_config_path[256]; /* --instance-config: read after config_path when it exists */
  char notify_socket[256];        /* $NOTIFY_SOCKET: systemd's readiness socket ("" = none) */
  config_quota
      quotas[GMLD_MAX_CONFIG_QUOTAS]; /* "quota = PID|uid:UID|cgroup:PATH BYTES" lines, in order, one a holder */
  int nquotas;
  /* bounds on what clients can make the daemon hold (issue 13, item 5) */
  uint64_t send_queue_max;  /* bytes queued to one client that does not read: it is closed */
  int hello_timeout_ms;     /* a connection that says no hello by then is closed */
  int frame_timeout_ms;     /* a frame begun must be whole by then */
  int max_clients;          /* connections in all */
  int max_clients_per_uid;  /* connections of one user */
  int read_budget;          /* frames read from one client per turn of the loop */
  int accept_backoff_ms;    /* accept() out of fds: pause accepting this long */
  int control_insecure_tcp; /* allow tcp:// control (unauthenticated) */
  char metrics_listen[128]; /* ADDR:PORT of the HTTP /metrics endpoint ("" = none) */
} gmld_config;

/* Fill c from the defaults, the config file and argv. Returns 0, 1 when
 * --help or --version was printed (exit 0), or GML_EINVAL after printing an
 * error to stderr. Called again on SIGHUP (a reload reads the same file and flags). */
int config_load(gmld_config *c, int argc, char **argv);
/* Quiet (a reload): config_load prints nothing; config_error() says why it refused ("" if not). */
void config_set_quiet(int on);
const char *config_error(void);
void config_usage(FILE *f);
/* The names of the settings a reload does not take (all but limit, quota and
 * log-level) that differ between was and now, into out; how many. */
int config_changed_at_start(const gmld_config *was, const gmld_config *now, char *out, size_t len);
#endif
