/* gmlakectl: the operator's view of a gmlaked, over its nng control RPC.
 * Human tables by default, --json for scripts, `metrics` for Prometheus.
 *
 * Commands are rows of `commands` below (name, arguments, help, whether it
 * changes the lake, handler). The numbers are printed from the protobuf-c
 * descriptors of the reply's messages (statsview.c): --json lists every field
 * of LakeStats, ClientInfo and ChunkInfo under its name; `stats` fills text
 * templates and shows any other LakeStats field on an "other" line; `metrics`
 * exports a table of rows and any other LakeStats number by a naming rule. So
 * a new daemon counter is a field in LakeStats (proto/gmlake.proto) and the
 * line that counts it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "discover.h"
#include "gmlake.h"
#include "gpuname.h"
#include "options.h"
#include "gmlake.pb-c.h"
#include "ctl_endpoint.h"
#include "ctl_tables.h"
#include "ctl_node.h"
#include "ctl_paths.h"
#include "statsview.h"
#include "util.h"
#include "wire.h"
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------- the RPC ---------- */

typedef struct ctl {
  const char *url;
  const char *device; /* --device as given (paths: an index) */
  int json, pid;
  double interval;
  int interval_given; /* --interval, watch's option (--client, trim's: pid set) */
  char **args;
  int nargs;
  Gmlake__CtlReply *reply; /* freed after the command */
  const char *found_how;   /* how url was found when no --control named it: said when nothing is there */
  const char *group;       /* --group NAME: quota's name for the quota it sets */
} ctl;

/* An error: its text on stderr; with --json also {"error":{"code":..,"message":..}}
 * on stdout, so a script reading stdout sees why (code: a GML_E* code). */
static void ctl_error(const ctl *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ctl_error(const ctl *c, int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "gmlakectl: %s\n", msg);
  if (!c->json) return;
  printf("{\"error\":{\"code\":%d,\"message\":", code);
  gmli_print_json_string(stdout, msg);
  printf("}}\n");
  fflush(stdout);
}

/* A daemon that took the connection and closed it at once keeps its control slots (8 a user, 16 for
 * root): say so, since only its log says why (before: "Connection shutdown" or "Connection reset",
 * as the close reached nng, nothing more). */
static const char *slots_hint(int rv, const char *url) {
  if (rv != NNG_ECLOSED && rv != NNG_ECONNSHUT && rv != NNG_ECONNRESET) return "";
  size_t n = strlen(url);
  if (n > 5 && !strcmp(url + n - 5, ".sock")) /* the clients' socket closes what is no client's hello */
    return " (the daemon closed the connection: that is its clients' socket; gmlakectl talks to its control endpoint, "
           "gmlake-N.ctl)";
  return " (the daemon closed the connection: it answers at most 8 control connections of a user at once, 16 of root; "
         "close others, or see its log)";
}

static Gmlake__CtlReply *call(const ctl *c, Gmlake__CtlRequest *req) {
  const char *url = c->url;
  nng_socket s;
  int rv;
  if ((rv = nng_req0_open(&s)) != 0) {
    ctl_error(c, GML_ESYS, "%s", nng_strerror(rv));
    return NULL;
  }
  nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000);
  nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 5000);
  if ((rv = nng_dial(s, url, NULL, 0)) != 0) {
    /* refused by the control socket's mode: say who may use it, as the client library does */
    char hint[1024] = "";
    const char *path = !strncmp(url, "ipc://", 6) ? url + 6 : !strncmp(url, "unix://", 7) ? url + 7 : NULL;
    if (rv == NNG_EPERM && path && gmli_socket_access_hint(path, hint + 2, sizeof hint - 2) == 0) memcpy(hint, ": ", 2);
    /* nng says "Connection refused" for a path where nothing is */
    if (rv == NNG_ECONNREFUSED && path && access(path, F_OK) && errno == ENOENT)
      snprintf(hint, sizeof hint, " (%s does not exist: is the daemon running, with this control endpoint?%s)", path,
               c->found_how ? c->found_how : "");
    ctl_error(c, GML_EDAEMON, "cannot reach the daemon at %s: %s%s%s", url, nng_strerror(rv), hint,
              slots_hint(rv, url));
    nng_close(s);
    return NULL;
  }
  size_t n = gmlake__ctl_request__get_packed_size(req);
  uint8_t *buf = malloc(n ? n : 1);
  gmlake__ctl_request__pack(req, buf);
  rv = nng_send(s, buf, n, 0);
  free(buf);
  Gmlake__CtlReply *rep = NULL;
  if (rv == 0) {
    void *in;
    size_t len;
    if ((rv = nng_recv(s, &in, &len, NNG_FLAG_ALLOC)) == 0) {
      rep = gmlake__ctl_reply__unpack(NULL, len, in);
      nng_free(in, len);
      if (!rep) ctl_error(c, GML_EPROTO, "malformed reply");
    }
  }
  if (rv) ctl_error(c, GML_EDAEMON, "%s: %s%s", url, nng_strerror(rv), slots_hint(rv, url));
  nng_close(s);
  if (rep && rep->code) {
    /* the daemon's own words; the code's generic text only when it sent none
     * (it could be wrong: GML_ENOENT is "no such share" for a missing pid too) */
    if (rep->message && *rep->message) ctl_error(c, rep->code, "daemon says: %s", rep->message);
    else ctl_error(c, rep->code, "daemon says: %s", gml_strerror(rep->code));
    gmlake__ctl_reply__free_unpacked(rep, NULL);
    return NULL;
  }
  return rep;
}

/* A whole decimal number in [min, max], or exit 2 naming what was wrong
 * (atoi took "abc" as 0: trim --client abc trimmed everything). */
static long long parse_int_or_die(const ctl *c, const char *what, const char *s, long long min, long long max) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno || v < min || v > max) {
    ctl_error(c, GML_EINVAL, "bad %s '%s' (a number from %lld to %lld)", what, s, min, max);
    exit(2);
  }
  return v;
}

/* --device: nvidia-smi's index N (gmlake-N.ctl, a daemon's link) or a UUID
 * (gmlake-<UUID>.ctl: GPU-..., host-N), or exit 2. A PCI bus id needs the
 * driver to name: gmlaked takes one, gmlakectl does not. */
static const char *device_or_die(const ctl *c, const char *s) {
  if (gmli_device_name_ok(s)) return s;
  ctl_error(c, GML_EINVAL,
            "bad device '%s' (nvidia-smi's index 0 to %d, or a UUID as nvidia-smi -L prints it, GPU-..., "
            "or host-N)",
            s, GML_DEVICE_INDEX_MAX);
  exit(2);
}

/* watch's --interval: seconds, at least 0.1 and at most a day, or exit 2
 * (atof took "0" and "abc" as 0: a loop of RPCs with no pause; a negative
 * number became a huge usleep). */
static double parse_interval_or_die(const ctl *c, const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno || !(v >= 0.1 && v <= 86400)) {
    ctl_error(c, GML_EINVAL, "bad interval '%s' (seconds, from 0.1 to 86400)", s);
    exit(2);
  }
  return v;
}

/* ---------- commands ---------- */

/* One request of the kind that carries a bool (stats, clients, chunks, shares). */
static Gmlake__CtlReply *ask(ctl *c, Gmlake__CtlRequest__ReqCase kind) {
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  req.req_case = kind;
  req.stats = 1; /* the oneof's bools share one slot */
  return c->reply = call(c, &req);
}

static int cmd_stats(ctl *c) {
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_STATS)) return 1;
  if (c->json) gmli_print_json(&c->reply->stats->base), putchar('\n');
  else gmli_print_stats(c->reply->stats);
  return 0;
}

static int cmd_metrics(ctl *c) {
  if (c->json) { /* a scraper reads text exposition only; the same numbers as JSON are stats --json */
    ctl_error(c, GML_EINVAL,
              "metrics prints Prometheus text only; for JSON, use `gmlakectl --json stats` "
              "(and `--json clients`)");
    return 2;
  }
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_CLIENTS)) return 1;
  gmli_print_metrics(stdout, c->reply);
  return 0;
}

static int cmd_clients(ctl *c) {
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_CLIENTS)) return 1;
  if (c->json) gmli_print_json_list((ProtobufCMessage *const *)c->reply->clients, c->reply->n_clients), putchar('\n');
  else ctl_print_clients(c->reply);
  return 0;
}

static int cmd_chunks(ctl *c) {
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_CHUNKS)) return 1;
  if (c->json) gmli_print_json_list((ProtobufCMessage *const *)c->reply->chunks, c->reply->n_chunks), putchar('\n');
  else ctl_print_chunks(c->reply);
  return 0;
}

static int cmd_shares(ctl *c) {
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_SHARES)) return 1;
  ctl_print_shares(c->reply, c->json);
  return 0;
}

static int cmd_trim(ctl *c) {
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  Gmlake__TrimRequest trim = GMLAKE__TRIM_REQUEST__INIT;
  req.req_case = GMLAKE__CTL_REQUEST__REQ_TRIM;
  trim.client_pid = c->pid;
  req.trim = &trim;
  if (!(c->reply = call(c, &req))) return 1;
  if (c->json) {
    printf("{\"ok\":true,\"command\":\"trim\",\"trimmed_chunks\":%llu", (unsigned long long)c->reply->trimmed_chunks);
    if (c->pid) printf(",\"client_pid\":%d", c->pid);
    printf("}\n");
  } else
    printf("released %llu free chunk(s) to the driver%s\n", (unsigned long long)c->reply->trimmed_chunks,
           c->pid ? "; asked the client for its idle cache" : "");
  return 0;
}

/* A percentage is of the device's memory, 1-100%; bytes at most the device's
 * memory (the lake can never hold more: `limit 1TiB` on a 24 GiB device was
 * taken, and hid a typo). The daemon tells the device's size. */
static int cmd_limit(ctl *c) {
  uint64_t v, total = 0;
  const char *a = c->args[0];
  char *end;
  double num = strtod(a, &end);
  while (*end == ' ') end++;
  int pct = *end == '%';
  if (pct ? end == a || end[1] || !(num >= 1 && num <= 100) : gmli_parse_size(a, 0, &v)) {
    ctl_error(c, GML_EINVAL, "bad limit '%s' (a share of the device from 1%% to 100%%, or bytes: 60GiB, 64424509440)",
              a);
    return 2;
  }
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_STATS)) return 1;
  total = c->reply->stats->device_total_bytes;
  uint64_t cs = c->reply->stats->chunk_size;
  gmlake__ctl_reply__free_unpacked(c->reply, NULL);
  c->reply = NULL;
  if (pct && gmli_parse_size(a, total, &v)) {
    ctl_error(c, GML_EINVAL, "limit '%s': the daemon does not say the device's size; give the limit in bytes", a);
    return 2;
  }
  if (total && v > total) {
    char s1[32], s2[32];
    ctl_error(c, GML_EINVAL,
              "limit %s is more than the device's memory (%s): the lake can never hold it; give at most %s or 100%%",
              gmli_format_bytes(v, s1, sizeof s1), gmli_format_bytes(total, s2, sizeof s2), s2);
    return 2;
  }
  if (cs && v < cs) { /* the daemon said only "limit below one chunk", exit 1, not the chunk's size */
    char s1[32], s2[32];
    ctl_error(c, GML_EINVAL, "limit %s is less than one chunk (%s): the lake holds whole chunks; give at least %s",
              gmli_format_bytes(v, s1, sizeof s1), gmli_format_bytes(cs, s2, sizeof s2), s2);
    return 2;
  }
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  req.req_case = GMLAKE__CTL_REQUEST__REQ_SET_LIMIT_BYTES;
  req.set_limit_bytes = v;
  if (!(c->reply = call(c, &req))) return 1;
  const char *warning = c->reply->message && *c->reply->message ? c->reply->message : NULL; /* taken, and said */
  if (warning) fprintf(stderr, "gmlakectl: warning: the daemon says: %s\n", warning);
  if (c->json) {
    printf("{\"ok\":true,\"command\":\"limit\",\"limit_bytes\":%llu,",
           (unsigned long long)c->reply->stats->limit_bytes);
    if (warning) {
      printf("\"warning\":");
      gmli_print_json_string(stdout, warning);
      printf(",");
    }
    printf("\"stats\":");
    gmli_print_json(&c->reply->stats->base);
    printf("}\n");
  } else {
    printf("limit set to %llu bytes%s\n", (unsigned long long)c->reply->stats->limit_bytes,
           c->reply->stats->limit_bytes != v ? " (whole chunks)" : "");
  }
  return 0;
}

static void usage(FILE *f);

static int cmd_quota(ctl *c) {
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  Gmlake__QuotaRequest quota = GMLAKE__QUOTA_REQUEST__INIT;
  uint64_t v;
  if (gmli_parse_size(c->args[1], 0, &v)) {
    ctl_error(c, GML_EINVAL, "bad size '%s' (bytes: 8GiB, 8589934592; 0 clears the quota)", c->args[1]);
    return 2;
  }
  int kind;
  uint32_t key;
  const char *cgroup;
  if (gmli_parse_quota_holder(c->args[0], &kind, &key, &cgroup) || (kind == GML_QUOTA_GROUP && c->group)) {
    ctl_error(c, GML_EINVAL,
              "bad quota holder '%s' (PID, uid:UID, cgroup:/PATH or cgroup:CONTROLLER:/PATH as /proc/PID/cgroup "
              "shows it: no '.', '..', '//' or trailing '/'; or group:NAME, a named quota, without --group)",
              c->args[0]);
    return 2;
  }
  if (kind == GML_QUOTA_CGROUP) quota.cgroup = (char *)cgroup; /* protobuf-c's string fields are char * */
  else if (kind == GML_QUOTA_GROUP) quota.group = (char *)cgroup;
  else if (kind == GML_QUOTA_UID) quota.by_uid = 1, quota.uid = key;
  else quota.pid = (int)key;
  if (c->group) quota.group = (char *)c->group;
  quota.bytes = v;
  req.req_case = GMLAKE__CTL_REQUEST__REQ_SET_QUOTA;
  req.set_quota = &quota;
  if (!(c->reply = call(c, &req))) return 1;
  const Gmlake__QuotaInfo *q = c->reply->n_quotas ? c->reply->quotas[0] : NULL; /* named, or cleared: as it was */
  const char *uuid = c->reply->stats && c->reply->stats->gpu_uuid ? c->reply->stats->gpu_uuid : "";
  char b[32], h[32], p[32]; /* one line, for scripts too (the Slurm plugin reports it) */
  if (c->json) {
    printf("{\"ok\":true,\"command\":\"quota\",\"holder\":");
    gmli_print_json_string(stdout, c->args[0]);
    printf(",\"bytes\":%llu,\"cleared\":%s,\"gpu_uuid\":", (unsigned long long)v, v ? "false" : "true");
    gmli_print_json_string(stdout, uuid);
    printf(",\"quota\":%s", q ? "" : "null");
    if (q) gmli_print_json(&q->base);
    return printf("}\n") < 0;
  }
  printf(v ? "quota of %s set to %llu bytes" : "quota of %s cleared", c->args[0], (unsigned long long)v);
  if (q && q->group && *q->group)
    printf(" on %s: quota %s, held %s, peak %s", uuid, gmli_format_bytes(q->bytes, b, sizeof b),
           gmli_format_bytes(q->held_bytes, h, sizeof h), gmli_format_bytes(q->peak_bytes, p, sizeof p));
  putchar('\n');
  return 0;
}

static int cmd_quotas(ctl *c) {
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_QUOTAS)) return 1;
  gmli_print_quotas(c->reply, c->json);
  return 0;
}

/* Refreshes the screen; with --json, one line a refresh (NDJSON):
 * {"time":UNIX_S,"stats":{as stats --json},"clients":[as clients --json]}. */
static int cmd_watch(ctl *c) {
  for (;;) {
    if (!ask(c, GMLAKE__CTL_REQUEST__REQ_CLIENTS)) return 1;
    if (c->json) {
      struct timespec now;
      clock_gettime(CLOCK_REALTIME, &now);
      printf("{\"time\":%.3f,\"stats\":", (double)now.tv_sec + now.tv_nsec / 1e9);
      gmli_print_json(&c->reply->stats->base);
      printf(",\"clients\":");
      gmli_print_json_list((ProtobufCMessage *const *)c->reply->clients, c->reply->n_clients);
      printf("}\n");
    } else {
      printf("\033[H\033[2J");
      gmli_print_stats(c->reply->stats);
      putchar('\n');
      ctl_print_clients(c->reply);
    }
    if (fflush(stdout) != 0) return 1; /* the reader went away (a closed pipe) */
    gmlake__ctl_reply__free_unpacked(c->reply, NULL);
    c->reply = NULL;
    struct timespec pause = {(time_t)c->interval, (long)((c->interval - (double)(time_t)c->interval) * 1e9)};
    while (nanosleep(&pause, &pause) && errno == EINTR) {}
  }
}

static int cmd_node(ctl *c) { return gmli_ctl_node(c->json); }

/* paths: this node's copy paths to one GPU, probed here by the client library (no daemon asked). */
static int cmd_paths(ctl *c) {
  char *end, err[1200];
  long dev = c->device ? strtol(c->device, &end, 10) : 0;
  if (c->device && (*end || dev < 0 || dev > GML_DEVICE_INDEX_MAX)) {
    ctl_error(c, GML_EINVAL, "paths probes a GPU by its index (--device N): '%s' is not one", c->device);
    return 2;
  }
  int rc = gmli_ctl_paths((int)dev, c->json, err, sizeof err);
  if (rc) ctl_error(c, rc, "%s", err);
  return rc ? 1 : 0;
}

/* A new command: a handler above and a row here. `changes`: it changes the
 * lake (the daemon's control.c marks the same requests). */
static const struct command {
  const char *name, *args_help, *help;
  int nargs; /* arguments it takes, no more, no fewer */
  int changes;
  int (*run)(ctl *c);
} commands[] = {
    {"stats", "", "lake size and limit, chunk states, client totals, fragmentation, lease latency", 0, 0, cmd_stats},
    {"clients", "", "connected clients: pid, uid, name, leased, allocated, cached, since", 0, 0, cmd_clients},
    {"chunks", "", "a map of the lake: who holds which chunk", 0, 0, cmd_chunks},
    {"shares", "", "shared read-only memory: key, size, publisher, who may attach, who maps it", 0, 0, cmd_shares},
    {"trim", " [--client PID]", "release free chunks to the driver; ask that client for its idle cache", 0, 1,
     cmd_trim},
    {"limit", " BYTES|PCT%", "set the lake's limit (PCT of the device)", 1, 1, cmd_limit},
    {"quota", " PID|uid:UID|cgroup:PATH|group:NAME BYTES [--group NAME]",
     "set a quota of a process (all its connections), a user (all its processes) or a cgroup (0 clears it); a lease "
     "over it is "
     "refused; --group names it (a job: its peak is kept, metrics carry the name), group:NAME changes or clears it",
     2, 1, cmd_quota},
    {"quotas", "", "every quota: its name, bytes, what its clients hold and their peak, holder", 0, 0, cmd_quotas},
    {"metrics", "", "Prometheus text exposition of the same numbers (no --json: use stats --json)", 0, 0, cmd_metrics},
    {"node", "", "every lake of this node, one row each, nvidia-smi style (no command, or --device all, is this)", 0, 0,
     cmd_node},
    {"paths", "",
     "the host<->GPU copy paths of --device N (its own link, peers' links with a P2P hop), probed here: "
     "bandwidth alone, shares of a split copy (no daemon asked)",
     0, 0, cmd_paths},
    {"watch", " [--interval S]", "refresh stats and clients, like top (--json: one JSON object a line, each interval)",
     0, 0, cmd_watch},
};

static void usage(FILE *f) {
  fprintf(f, "usage: gmlakectl [--control URL | --device N|UUID] [--json] COMMAND\n"
             "       gmlakectl [--device all] [--json]   (every lake of this node: the node command)\n"
             "       gmlakectl --version | --help\n"
             "commands:\n");
  for (size_t i = 0; i < GML_ARRAY_LEN(commands); i++) {
    char left[64];
    snprintf(left, sizeof left, "%s%s", commands[i].name, commands[i].args_help);
    fprintf(f, "  %-26s%s%s\n", left, strlen(left) < 26 ? "" : "\n                            ", commands[i].help);
  }
}

int main(int argc, char **argv) {
  char url[300] = "";
  const char *device = "0";
  int device_given = 0, ch, help = 0, version = 0, device_all = 0;
  char *cmd = NULL, *args[4] = {0};
  ctl c = {.interval = 1.0, .args = args};
  /* --json anywhere makes every error, usage errors included, an error object on stdout too */
  for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
    if (!strcmp(argv[i], "--json") || !strcmp(argv[i], "-j")) c.json = 1;
  /* options may come before or after the command */
  optind = 1;
  opterr = 0; /* said by ctl_error, as JSON too */
  static const struct option all_opts[] = {{"control", required_argument, 0, 'c'},
                                           {"device", required_argument, 0, 'd'},
                                           {"json", no_argument, 0, 'j'},
                                           {"help", no_argument, 0, 'h'},
                                           {"client", required_argument, 0, 'p'},
                                           {"interval", required_argument, 0, 'i'},
                                           {"version", no_argument, 0, 'V'},
                                           {"group", required_argument, 0, 'g'},
                                           {0, 0, 0, 0}};
  while (optind < argc) {
    if ((ch = getopt_long(argc, argv, "+:c:d:jhp:i:Vg:", all_opts, NULL)) == -1) {
      if (!cmd) cmd = argv[optind];
      else if (c.nargs++ < 4) args[c.nargs - 1] = argv[optind]; /* counted past 4: too many is an error */
      optind++;
      continue;
    }
    switch (ch) {
    case 'c': snprintf(url, sizeof url, "%s", optarg); break;
    case 'd':
      device_all = !strcmp(optarg, "all"), device = device_all ? optarg : device_or_die(&c, optarg);
      c.device = device;
      device_given = 1;
      break;
    case 'j': c.json = 1; break;
    case 'p': c.pid = (int)parse_int_or_die(&c, "pid", optarg, 1, 0x7fffffff); break;
    case 'i': c.interval = parse_interval_or_die(&c, optarg), c.interval_given = 1; break;
    case 'g': c.group = optarg; break;
    case 'h': help = 1; break;
    case 'V': version = 1; break;
    case ':':
      ctl_error(&c, GML_EINVAL, "option '%s' needs an argument", argv[optind - 1]);
      usage(stderr);
      return 2;
    default:
      ctl_error(&c, GML_EINVAL, "unknown option '%s'", argv[optind - 1]);
      usage(stderr);
      return 2;
    }
  }
  /* --help and --version once the whole line is read: an unknown option is a usage error wherever it
   * stands (before, none after them was read: `--json --version --bogus` printed the version, exit 0) */
  if (help) {
    usage(stdout);
    return 0;
  }
  const char *extra = cmd ? cmd : c.pid ? "--client" : c.interval_given ? "--interval" : NULL;
  if (version && extra) { /* as a command's extra argument is: a mistake, not something to ignore */
    ctl_error(&c, GML_EINVAL, "--version takes no command nor a command's option ('%s' given)", extra);
    usage(stderr);
    return 2;
  }
  if (version) { /* with --json an object, as everything else it prints then */
    printf(c.json ? "{\"program\":\"gmlakectl\",\"version\":\"%d.%d.%d\",\"protocol\":%d}\n"
                  : "gmlakectl %d.%d.%d (protocol %d)\n",
           GML_VERSION_MAJOR, GML_VERSION_MINOR, GML_VERSION_PATCH, GML_PROTOCOL_VERSION);
    return 0;
  }
  /* the node view: no command and no lake named, or --device all (whose stats is every lake's) */
  if ((!cmd && !url[0] && !device_given) || (device_all && (!cmd || !strcmp(cmd, "stats")))) cmd = "node";
  if (device_all && strcmp(cmd, "node")) {
    ctl_error(&c, GML_EINVAL, "--device all shows every lake (node, stats); %s asks one: give --device N", cmd);
    return 2;
  }
  if (!cmd) {
    ctl_error(&c, GML_EINVAL, "no command given");
    usage(stderr);
    return 2;
  }
  if (url[0] && device_given) { /* one or the other: a limit meant for one device must not land on another */
    ctl_error(&c, GML_EINVAL, "--control and --device name the daemon both: give one");
    usage(stderr);
    return 2;
  }
  char how[700] = "", err[1024];
  int node = !strcmp(cmd, "node");           /* finds every lake itself */
  int local = node || !strcmp(cmd, "paths"); /* asks no daemon */
  if (node && url[0]) {
    ctl_error(&c, GML_EINVAL, "node shows every lake of this node; --control names one: give another command");
    return 2;
  }
  if (!local && !url[0] && ctl_find_endpoint(device, device_given, url, sizeof url, how, sizeof how, err, sizeof err)) {
    ctl_error(&c, GML_EDAEMON, "%s", err);
    return 1;
  }
  if (how[0]) c.found_how = how;
  if (!local && !strstr(url, "://")) { /* nng's answer to a bare path is "Invalid argument" */
    ctl_error(&c, GML_EINVAL, "bad control endpoint '%s': a URL, e.g. ipc://%s", url,
              url[0] == '/' ? url : "/run/gmlake/gmlake-0.ctl");
    return 2;
  }
  c.url = url;
  for (size_t i = 0; i < GML_ARRAY_LEN(commands); i++) {
    if (strcmp(commands[i].name, cmd)) continue;
    if (c.nargs != commands[i].nargs) { /* an extra argument is a mistake, not something to ignore */
      if (commands[i].nargs)
        ctl_error(&c, GML_EINVAL, "%s takes %d argument(s):%s", cmd, commands[i].nargs, commands[i].args_help);
      else ctl_error(&c, GML_EINVAL, "%s takes no arguments ('%s' given)", cmd, args[0]);
      usage(stderr);
      return 2;
    }
    /* --client is trim's, --interval watch's: given to another command they were ignored (`limit 8MiB
     * --client PID` set the whole lake's limit) */
    const char *stray = c.pid && strcmp(cmd, "trim")               ? "--client (trim --client PID)"
                        : c.interval_given && strcmp(cmd, "watch") ? "--interval (watch --interval S)"
                        : c.group && strcmp(cmd, "quota")          ? "--group (quota HOLDER BYTES --group NAME)"
                                                                   : NULL;
    if (stray) {
      ctl_error(&c, GML_EINVAL, "%s takes no %s", cmd, stray);
      usage(stderr);
      return 2;
    }
    int rc = commands[i].run(&c);
    if (c.reply) gmlake__ctl_reply__free_unpacked(c.reply, NULL);
    return rc;
  }
  ctl_error(&c, GML_EINVAL, "unknown command '%s'", cmd);
  usage(stderr);
  return 2;
}
