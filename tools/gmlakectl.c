/* gmlakectl: the operator's view of a gmlaked, over its nng control RPC.
 * Human tables by default, --json for scripts, `metrics` for Prometheus. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "gmlake.h"
#include "options.h"
#include "gmlake.pb-c.h"
#include "util.h"
#include "wire.h"
#include <getopt.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f) {
  fprintf(f, "usage: gmlakectl [--control URL | --device N] [--json] COMMAND\n"
             "       gmlakectl --version\n"
             "commands:\n"
             "  stats                     lake size and limit, chunk states, client totals, fragmentation, lease latency\n"
             "  clients                   connected clients: pid, uid, name, leased, allocated, cached, since\n"
             "  chunks                    a map of the lake: who holds which chunk\n"
             "  trim [--client PID]       release free chunks to the driver; ask that client for its idle cache\n"
             "  limit BYTES|PCT%%          set the lake's limit (PCT of the device)\n"
             "  quota PID|uid:UID BYTES   set a quota (0 clears it); a lease over it is refused to that client\n"
             "  metrics                   Prometheus text exposition of the same numbers\n"
             "  watch [--interval S]      refresh stats and clients, like top\n");
}

static Gmlake__CtlReply *call(const char *url, Gmlake__CtlRequest *req) {
  nng_socket s;
  int rv;
  if ((rv = nng_req0_open(&s)) != 0) {
    fprintf(stderr, "gmlakectl: %s\n", nng_strerror(rv));
    return NULL;
  }
  nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000);
  nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 5000);
  if ((rv = nng_dial(s, url, NULL, 0)) != 0) {
    fprintf(stderr, "gmlakectl: cannot reach the daemon at %s: %s\n", url, nng_strerror(rv));
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
      if (!rep) fprintf(stderr, "gmlakectl: malformed reply\n");
    }
  }
  if (rv) fprintf(stderr, "gmlakectl: %s: %s\n", url, nng_strerror(rv));
  nng_close(s);
  if (rep && rep->code) {
    fprintf(stderr, "gmlakectl: daemon says: %s (%s)\n", rep->message && *rep->message ? rep->message : "error",
            gml_strerror(rep->code));
    gmlake__ctl_reply__free_unpacked(rep, NULL);
    return NULL;
  }
  return rep;
}

static const char *B(uint64_t v, char *buf) { return gml_format_bytes(v, buf, 32); }

static void json_stats(const Gmlake__LakeStats *s) {
  printf("{\"device\":%d,\"backend\":\"%s\",\"chunk_size\":%llu,\"limit_bytes\":%llu,\"chunks_total\":%llu,"
         "\"chunks_free\":%llu,\"chunks_leased\":%llu,\"chunks_creating\":%llu,\"chunks_parked\":%llu,"
         "\"allocated\":%llu,\"cached\":%llu,\"stitched\":%llu,\"fragmentation\":%.6f,\"lease_count\":%llu,"
         "\"lease_p50_us\":%.1f,\"lease_p99_us\":%.1f,\"leases_refused\":%llu,\"protocol_errors\":%llu,\"clients\":%llu,"
         "\"device_total_bytes\":%llu,\"optional_declined\":%llu}",
         s->device, s->backend, (unsigned long long)s->chunk_size, (unsigned long long)s->limit_bytes,
         (unsigned long long)s->chunks_total, (unsigned long long)s->chunks_free, (unsigned long long)s->chunks_leased,
         (unsigned long long)s->chunks_creating, (unsigned long long)s->chunks_parked,
         (unsigned long long)s->allocated, (unsigned long long)s->cached, (unsigned long long)s->stitched,
         s->fragmentation, (unsigned long long)s->lease_count, s->lease_p50_us, s->lease_p99_us,
         (unsigned long long)s->leases_refused, (unsigned long long)s->protocol_errors, (unsigned long long)s->clients,
         (unsigned long long)s->device_total_bytes, (unsigned long long)s->optional_declined);
}

static void print_stats(const Gmlake__LakeStats *s) {
  char a[32], b[32], c2[32];
  uint64_t cs = s->chunk_size;
  printf("device %d (%s backend), chunks of %s\n", s->device, s->backend, B(cs, a));
  printf("  lake      %s held of limit %s\n", B(s->chunks_total * cs, a), B(s->limit_bytes, b));
  printf("  chunks    %llu total: %llu free, %llu leased, %llu parked, %llu being created\n",
         (unsigned long long)s->chunks_total, (unsigned long long)s->chunks_free, (unsigned long long)s->chunks_leased,
         (unsigned long long)s->chunks_parked, (unsigned long long)s->chunks_creating);
  printf("  clients   %llu: allocated %s, cached %s, stitched %s\n", (unsigned long long)s->clients, B(s->allocated, a),
         B(s->cached, b), B(s->stitched, c2));
  printf("  fragmentation %.2f%% (1 - allocated/leased)\n", s->fragmentation * 100);
  printf("  leases    %llu served (p50 %.1f us, p99 %.1f us), %llu refused, %llu optional ones declined; %llu protocol errors\n",
         (unsigned long long)s->lease_count, s->lease_p50_us, s->lease_p99_us, (unsigned long long)s->leases_refused,
         (unsigned long long)s->optional_declined, (unsigned long long)s->protocol_errors);
}

static void print_clients(const Gmlake__CtlReply *r, int json) {
  time_t now = time(NULL);
  if (json) {
    printf("[");
    for (size_t i = 0; i < r->n_clients; i++) {
      const Gmlake__ClientInfo *c = r->clients[i];
      printf("%s{\"client_id\":%llu,\"pid\":%d,\"uid\":%u,\"name\":\"%s\",\"leased_bytes\":%llu,\"leased_chunks\":%llu,"
             "\"allocated\":%llu,\"cached\":%llu,\"stitched\":%llu,\"largest_free\":%llu,\"quota_bytes\":%llu,"
             "\"since\":%.3f,\"leases_refused\":%llu}",
             i ? "," : "", (unsigned long long)c->client_id, c->pid, c->uid, c->name, (unsigned long long)c->leased_bytes,
             (unsigned long long)c->leased_chunks, (unsigned long long)c->allocated, (unsigned long long)c->cached,
             (unsigned long long)c->stitched, (unsigned long long)c->largest_free, (unsigned long long)c->quota_bytes,
             c->since, (unsigned long long)c->leases_refused);
    }
    printf("]\n");
    return;
  }
  printf("%-8s %-6s %-16s %12s %12s %12s %12s %8s\n", "PID", "UID", "NAME", "LEASED", "ALLOCATED", "CACHED", "QUOTA", "SINCE");
  for (size_t i = 0; i < r->n_clients; i++) {
    const Gmlake__ClientInfo *c = r->clients[i];
    char a[32], b[32], d[32], q[32];
    long age = (long)(now - (time_t)c->since);
    char since[32];
    if (age < 3600) snprintf(since, sizeof since, "%ldm%02lds", age / 60, age % 60);
    else snprintf(since, sizeof since, "%ldh%02ldm", age / 3600, age % 3600 / 60);
    printf("%-8d %-6u %-16.16s %12s %12s %12s %12s %8s\n", c->pid, c->uid, c->name, B(c->leased_bytes, a),
           B(c->allocated, b), B(c->cached, d), c->quota_bytes ? B(c->quota_bytes, q) : "-", since);
  }
  if (!r->n_clients) printf("(no clients)\n");
}

static void print_chunks(const Gmlake__CtlReply *r, int json) {
  if (json) {
    printf("[");
    for (size_t i = 0; i < r->n_chunks; i++)
      printf("%s{\"chunk_id\":%llu,\"owner_pid\":%d}", i ? "," : "", (unsigned long long)r->chunks[i]->chunk_id,
             r->chunks[i]->owner_pid);
    printf("]\n");
    return;
  }
  /* one character a chunk, 64 a row: '.' free, a letter per client, '#' parked */
  int pids[52], npids = 0;
  printf("%zu chunks of %llu MiB ('.' free, '#' parked by a process that left, letters: clients)\n", r->n_chunks,
         (unsigned long long)(r->stats ? r->stats->chunk_size >> 20 : 0));
  for (size_t i = 0; i < r->n_chunks; i++) {
    int pid = r->chunks[i]->owner_pid;
    char ch = '.';
    if (pid < 0) ch = '#';
    else if (pid > 0) {
      int k = 0;
      while (k < npids && pids[k] != pid) k++;
      if (k == npids && npids < 52) pids[npids++] = pid;
      ch = k < 26 ? (char)('A' + k) : k < 52 ? (char)('a' + k - 26) : '?';
    }
    putchar(ch);
    if (i % 64 == 63 || i + 1 == r->n_chunks) putchar('\n');
  }
  for (int k = 0; k < npids; k++) printf("  %c = pid %d\n", k < 26 ? 'A' + k : 'a' + k - 26, pids[k]);
}

static void print_metrics(const Gmlake__CtlReply *r) {
  const Gmlake__LakeStats *s = r->stats;
  int dev = s->device;
  uint64_t cs = s->chunk_size;
  printf("# HELP gmlake_lake_bytes Bytes of the lake's chunks by state.\n# TYPE gmlake_lake_bytes gauge\n");
  printf("gmlake_lake_bytes{device=\"%d\",state=\"free\"} %llu\n", dev, (unsigned long long)(s->chunks_free * cs));
  printf("gmlake_lake_bytes{device=\"%d\",state=\"leased\"} %llu\n", dev, (unsigned long long)(s->chunks_leased * cs));
  printf("gmlake_lake_bytes{device=\"%d\",state=\"parked\"} %llu\n", dev, (unsigned long long)(s->chunks_parked * cs));
  printf("gmlake_lake_bytes{device=\"%d\",state=\"creating\"} %llu\n", dev, (unsigned long long)(s->chunks_creating * cs));
  printf("# HELP gmlake_lake_limit_bytes The most the lake may hold.\n# TYPE gmlake_lake_limit_bytes gauge\n");
  printf("gmlake_lake_limit_bytes{device=\"%d\"} %llu\n", dev, (unsigned long long)s->limit_bytes);
  printf("# HELP gmlake_allocated_bytes Bytes in live blocks, all clients.\n# TYPE gmlake_allocated_bytes gauge\n");
  printf("gmlake_allocated_bytes{device=\"%d\"} %llu\n", dev, (unsigned long long)s->allocated);
  printf("# HELP gmlake_cached_bytes Bytes leased but not allocated, all clients.\n# TYPE gmlake_cached_bytes gauge\n");
  printf("gmlake_cached_bytes{device=\"%d\"} %llu\n", dev, (unsigned long long)s->cached);
  printf("# HELP gmlake_fragmentation_ratio 1 - allocated/leased.\n# TYPE gmlake_fragmentation_ratio gauge\n");
  printf("gmlake_fragmentation_ratio{device=\"%d\"} %.6f\n", dev, s->fragmentation);
  printf("# HELP gmlake_clients Connected clients.\n# TYPE gmlake_clients gauge\n");
  printf("gmlake_clients{device=\"%d\"} %llu\n", dev, (unsigned long long)s->clients);
  printf("# HELP gmlake_leases_total Leases served.\n# TYPE gmlake_leases_total counter\n");
  printf("gmlake_leases_total{device=\"%d\"} %llu\n", dev, (unsigned long long)s->lease_count);
  printf("# HELP gmlake_leases_refused_total Leases refused (lake full or quota).\n# TYPE gmlake_leases_refused_total counter\n");
  printf("gmlake_leases_refused_total{device=\"%d\"} %llu\n", dev, (unsigned long long)s->leases_refused);
  printf("# HELP gmlake_optional_leases_declined_total Optional (headroom) leases answered: nothing free now.\n"
         "# TYPE gmlake_optional_leases_declined_total counter\n");
  printf("gmlake_optional_leases_declined_total{device=\"%d\"} %llu\n", dev, (unsigned long long)s->optional_declined);
  printf("# HELP gmlake_protocol_errors_total Connections closed for a malformed message.\n"
         "# TYPE gmlake_protocol_errors_total counter\n");
  printf("gmlake_protocol_errors_total{device=\"%d\"} %llu\n", dev, (unsigned long long)s->protocol_errors);
  printf("# HELP gmlake_lease_latency_seconds Lease round trip in the daemon, recent leases.\n"
         "# TYPE gmlake_lease_latency_seconds gauge\n");
  printf("gmlake_lease_latency_seconds{device=\"%d\",quantile=\"0.5\"} %.9f\n", dev, s->lease_p50_us / 1e6);
  printf("gmlake_lease_latency_seconds{device=\"%d\",quantile=\"0.99\"} %.9f\n", dev, s->lease_p99_us / 1e6);
  printf("# HELP gmlake_client_bytes Bytes of one client by kind.\n# TYPE gmlake_client_bytes gauge\n");
  for (size_t i = 0; i < r->n_clients; i++) {
    const Gmlake__ClientInfo *c = r->clients[i];
    const char *kinds[] = {"leased", "allocated", "cached", "stitched"};
    uint64_t vals[] = {c->leased_bytes, c->allocated, c->cached, c->stitched};
    for (int k = 0; k < 4; k++)
      printf("gmlake_client_bytes{device=\"%d\",pid=\"%d\",name=\"%s\",kind=\"%s\"} %llu\n", dev, c->pid, c->name, kinds[k],
             (unsigned long long)vals[k]);
  }
}

int main(int argc, char **argv) {
  char url[300] = "";
  int json = 0, device = 0, ch;
  /* options may come before or after the command */
  int pidopt = 0;
  double interval = 1.0;
  char *cmd = NULL, *args[4] = {0};
  int nargs = 0;
  optind = 1;
  static const struct option all_opts[] = {
      {"control", required_argument, 0, 'c'}, {"device", required_argument, 0, 'd'}, {"json", no_argument, 0, 'j'},
      {"help", no_argument, 0, 'h'},          {"client", required_argument, 0, 'p'}, {"interval", required_argument, 0, 'i'},
      {"version", no_argument, 0, 'V'},       {0, 0, 0, 0}};
  while (optind < argc) {
    if ((ch = getopt_long(argc, argv, "+c:d:jhp:i:V", all_opts, NULL)) == -1) {
      if (!cmd) cmd = argv[optind];
      else if (nargs < 4) args[nargs++] = argv[optind];
      optind++;
      continue;
    }
    switch (ch) {
    case 'c': snprintf(url, sizeof url, "%s", optarg); break;
    case 'd': device = atoi(optarg); break;
    case 'j': json = 1; break;
    case 'p': pidopt = atoi(optarg); break;
    case 'i': interval = atof(optarg); break;
    case 'h': usage(stdout); return 0;
    case 'V': printf("gmlakectl %d.%d.%d (protocol %d)\n", GML_VERSION_MAJOR, GML_VERSION_MINOR, GML_VERSION_PATCH, GML_PROTOCOL_VERSION); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (!cmd) {
    usage(stderr);
    return 2;
  }
  if (!url[0]) {
    if (gml_env(GML_ENV_CONTROL)) snprintf(url, sizeof url, "%s", gml_env(GML_ENV_CONTROL));
    else gml_client_control_url(device, url, sizeof url);
  }
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  Gmlake__TrimRequest trim = GMLAKE__TRIM_REQUEST__INIT;
  Gmlake__QuotaRequest quota = GMLAKE__QUOTA_REQUEST__INIT;
  Gmlake__CtlReply *r;
  if (!strcmp(cmd, "stats") || !strcmp(cmd, "metrics")) {
    req.req_case = !strcmp(cmd, "stats") ? GMLAKE__CTL_REQUEST__REQ_STATS : GMLAKE__CTL_REQUEST__REQ_CLIENTS;
    req.stats = req.clients = 1;
    if (!(r = call(url, &req))) return 1;
    if (!strcmp(cmd, "metrics")) print_metrics(r);
    else if (json) json_stats(r->stats), putchar('\n');
    else print_stats(r->stats);
  } else if (!strcmp(cmd, "clients")) {
    req.req_case = GMLAKE__CTL_REQUEST__REQ_CLIENTS;
    req.clients = 1;
    if (!(r = call(url, &req))) return 1;
    print_clients(r, json);
  } else if (!strcmp(cmd, "chunks")) {
    req.req_case = GMLAKE__CTL_REQUEST__REQ_CHUNKS;
    req.chunks = 1;
    if (!(r = call(url, &req))) return 1;
    print_chunks(r, json);
  } else if (!strcmp(cmd, "trim")) {
    req.req_case = GMLAKE__CTL_REQUEST__REQ_TRIM;
    trim.client_pid = pidopt;
    req.trim = &trim;
    if (!(r = call(url, &req))) return 1;
    if (json) printf("{\"trimmed_chunks\":%llu}\n", (unsigned long long)r->trimmed_chunks);
    else printf("released %llu free chunk(s) to the driver%s\n", (unsigned long long)r->trimmed_chunks,
                pidopt ? "; asked the client for its idle cache" : "");
  } else if (!strcmp(cmd, "limit")) {
    if (nargs != 1) {
      usage(stderr);
      return 2;
    }
    uint64_t v, total = 0;
    if (strchr(args[0], '%')) {
      /* a percentage of the device: the daemon tells its size */
      req.req_case = GMLAKE__CTL_REQUEST__REQ_STATS;
      req.stats = 1;
      if (!(r = call(url, &req))) return 1;
      total = r->stats->device_total_bytes;
      gmlake__ctl_reply__free_unpacked(r, NULL);
      req.stats = 0;
    }
    if (gml_parse_size(args[0], total, &v)) {
      fprintf(stderr, "gmlakectl: bad size '%s'\n", args[0]);
      return 2;
    }
    req.req_case = GMLAKE__CTL_REQUEST__REQ_SET_LIMIT_BYTES;
    req.set_limit_bytes = v;
    if (!(r = call(url, &req))) return 1;
    if (json) json_stats(r->stats), putchar('\n');
    else printf("limit set to %llu bytes\n", (unsigned long long)v);
  } else if (!strcmp(cmd, "quota")) {
    uint64_t v;
    if (nargs != 2 || gml_parse_size(args[1], 0, &v)) {
      usage(stderr);
      return 2;
    }
    if (!strncmp(args[0], "uid:", 4)) {
      quota.by_uid = 1;
      quota.uid = (uint32_t)strtoul(args[0] + 4, NULL, 10);
    } else {
      quota.pid = atoi(args[0]);
      if (quota.pid <= 0) {
        fprintf(stderr, "gmlakectl: bad pid '%s'\n", args[0]);
        return 2;
      }
    }
    quota.bytes = v;
    req.req_case = GMLAKE__CTL_REQUEST__REQ_SET_QUOTA;
    req.set_quota = &quota;
    if (!(r = call(url, &req))) return 1;
    if (json) printf("{\"ok\":true}\n");
    else printf("quota of %s set to %llu bytes\n", args[0], (unsigned long long)v);
  } else if (!strcmp(cmd, "watch")) {
    for (;;) {
      req.req_case = GMLAKE__CTL_REQUEST__REQ_CLIENTS;
      req.clients = 1;
      if (!(r = call(url, &req))) return 1;
      printf("\033[H\033[2J");
      print_stats(r->stats);
      putchar('\n');
      print_clients(r, 0);
      fflush(stdout);
      gmlake__ctl_reply__free_unpacked(r, NULL);
      usleep((useconds_t)(interval * 1e6));
    }
  } else {
    fprintf(stderr, "gmlakectl: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
  }
  gmlake__ctl_reply__free_unpacked(r, NULL);
  return 0;
}
