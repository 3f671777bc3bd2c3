/* gmlakectl: the operator's view of a gmlaked, over its nng control RPC.
 * Human tables by default, --json for scripts, `metrics` for Prometheus.
 *
 * Commands are rows of `commands` (name, arguments, help, whether it changes
 * the lake, handler). The numbers are printed from the protobuf-c descriptors
 * of the reply's messages: --json lists every field of LakeStats, ClientInfo
 * and ChunkInfo under its name; `stats` fills the templates of `stats_lines`
 * and shows any other LakeStats field on an "other" line; `metrics` exports
 * the rows of `metric_views` and any other numeric LakeStats field by a naming
 * rule (see metric_by_rule). So a new daemon counter is a field in LakeStats
 * (proto/gmlake.proto) and the line that counts it; a row here only gives it
 * another name, unit, label or help. */
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

/* ---------- reading a message through its descriptor ---------- */

static const ProtobufCFieldDescriptor *field_of(const ProtobufCMessage *m, const char *name) {
  return protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
}

static const void *value_at(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  return (const char *)m + f->offset;
}

static int is_number(const ProtobufCFieldDescriptor *f) {
  if (f->label == PROTOBUF_C_LABEL_REPEATED) return 0;
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE: case PROTOBUF_C_TYPE_FLOAT:
  case PROTOBUF_C_TYPE_BOOL: return 1;
  default: return 0;
  }
}

static int is_float(const ProtobufCFieldDescriptor *f) {
  return f->type == PROTOBUF_C_TYPE_DOUBLE || f->type == PROTOBUF_C_TYPE_FLOAT;
}

static double number(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  const void *p = value_at(m, f);
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32: return *(const int32_t *)p;
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: return *(const uint32_t *)p;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64: return (double)*(const int64_t *)p;
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: return (double)*(const uint64_t *)p;
  case PROTOBUF_C_TYPE_DOUBLE: return *(const double *)p;
  case PROTOBUF_C_TYPE_FLOAT: return *(const float *)p;
  case PROTOBUF_C_TYPE_BOOL: return *(const protobuf_c_boolean *)p;
  default: return 0;
  }
}

/* An integer field exactly (uint64 beyond 2^53 too), times `scale`. */
static void print_integer(FILE *o, const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, uint64_t scale) {
  const void *p = value_at(m, f);
  switch (f->type) {
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    fprintf(o, "%llu", (unsigned long long)(*(const uint64_t *)p * scale));
    break;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    fprintf(o, "%lld", (long long)(*(const int64_t *)p * (int64_t)scale));
    break;
  default: fprintf(o, "%lld", (long long)number(m, f) * (long long)scale); break;
  }
}

static uint64_t unsigned_of(const ProtobufCMessage *m, const char *name) {
  const ProtobufCFieldDescriptor *f = field_of(m, name);
  if (!f) return 0;
  if (f->type == PROTOBUF_C_TYPE_UINT64 || f->type == PROTOBUF_C_TYPE_FIXED64) return *(const uint64_t *)value_at(m, f);
  return (uint64_t)number(m, f);
}

/* JSON and Prometheus label text: quotes, backslashes and control bytes escaped. */
static void print_escaped(FILE *o, const char *s, int json) {
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(o, "\\%c", ch);
    else if (ch == '\n') fputs("\\n", o);
    else if (ch < 32 && json) fprintf(o, "\\u%04x", ch);
    else fputc(ch, o);
  }
}

/* ---------- --json: every field under its name ---------- */

/* printf formats of double fields in --json (others: "%.6f") */
static const struct { const char *field, *fmt; } json_formats[] = {
    {"lease_p50_us", "%.1f"}, {"lease_p99_us", "%.1f"}, {"since", "%.3f"},
};

static void print_json(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *desc = m->descriptor;
  int first = 1;
  putchar('{');
  for (unsigned i = 0; i < desc->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &desc->fields[i];
    int str = f->type == PROTOBUF_C_TYPE_STRING && f->label != PROTOBUF_C_LABEL_REPEATED;
    if (!str && !is_number(f)) continue;
    printf("%s\"%s\":", first ? "" : ",", f->name);
    first = 0;
    if (str) {
      putchar('"');
      print_escaped(stdout, *(char *const *)value_at(m, f), 1);
      putchar('"');
    } else if (f->type == PROTOBUF_C_TYPE_BOOL) {
      fputs(number(m, f) ? "true" : "false", stdout);
    } else if (is_float(f)) {
      const char *fmt = "%.6f";
      for (size_t k = 0; k < GML_ARRAY_LEN(json_formats); k++)
        if (!strcmp(json_formats[k].field, f->name)) fmt = json_formats[k].fmt;
      printf(fmt, number(m, f));
    } else {
      print_integer(stdout, m, f, 1);
    }
  }
  putchar('}');
}

static void print_json_list(ProtobufCMessage *const *items, size_t n) {
  putchar('[');
  for (size_t i = 0; i < n; i++) {
    if (i) putchar(',');
    print_json(items[i]);
  }
  printf("]\n");
}

/* ---------- stats: templates over LakeStats ---------- */

/* {field} prints the field; {field:bytes} as a size, {field:chunks} as the
 * size of that many chunks, {field:pct} as a percentage, {field:%.1f} with
 * that format. */
static const char *const stats_lines[] = {
    "device {device} ({backend} backend), chunks of {chunk_size:bytes}",
    "  lake      {chunks_total:chunks} held of limit {limit_bytes:bytes}",
    "  chunks    {chunks_total} total: {chunks_free} free, {chunks_leased} leased, {chunks_parked} parked, "
    "{chunks_creating} being created",
    "  clients   {clients}: allocated {allocated:bytes}, cached {cached:bytes}, stitched {stitched:bytes}",
    "  fragmentation {fragmentation:pct} (1 - allocated/leased)",
    "  leases    {lease_count} served (p50 {lease_p50_us:%.1f} us, p99 {lease_p99_us:%.1f} us), {leases_refused} refused, "
    "{optional_declined} optional ones declined; {protocol_errors} protocol errors",
};
/* LakeStats fields the human view leaves out on purpose (the rest appear) */
static const char *const stats_hidden[] = {"device_total_bytes"};

static void print_template_field(const ProtobufCMessage *m, const char *name, const char *spec) {
  const ProtobufCFieldDescriptor *f = field_of(m, name);
  char b[32];
  if (!f) {
    printf("?");
  } else if (f->type == PROTOBUF_C_TYPE_STRING) {
    printf("%s", *(char *const *)value_at(m, f));
  } else if (!strcmp(spec, "bytes")) {
    printf("%s", gml_format_bytes(unsigned_of(m, name), b, sizeof b));
  } else if (!strcmp(spec, "chunks")) {
    printf("%s", gml_format_bytes(unsigned_of(m, name) * unsigned_of(m, "chunk_size"), b, sizeof b));
  } else if (!strcmp(spec, "pct")) {
    printf("%.2f%%", number(m, f) * 100);
  } else if (spec[0] == '%') {
    printf(spec, number(m, f));
  } else if (is_float(f)) {
    printf("%g", number(m, f));
  } else {
    print_integer(stdout, m, f, 1);
  }
}

/* Prints line with its fields filled in (print), or tells whether it shows
 * `field` (field != NULL). */
static int template_uses(const char *line, const char *field, int print, const ProtobufCMessage *m) {
  for (const char *p = line; *p;) {
    const char *open = strchr(p, '{'), *close = open ? strchr(open, '}') : NULL;
    if (!open || !close) {
      if (print) fputs(p, stdout);
      break;
    }
    if (print) fwrite(p, 1, (size_t)(open - p), stdout);
    char name[64] = "", spec[16] = "";
    size_t len = (size_t)(close - open - 1);
    const char *colon = memchr(open + 1, ':', len);
    size_t nlen = colon ? (size_t)(colon - open - 1) : len;
    snprintf(name, sizeof name, "%.*s", (int)nlen, open + 1);
    if (colon) snprintf(spec, sizeof spec, "%.*s", (int)(close - colon - 1), colon + 1);
    if (field && !strcmp(name, field)) return 1;
    if (print) print_template_field(m, name, spec);
    p = close + 1;
  }
  return 0;
}

static void print_stats(const Gmlake__LakeStats *s) {
  const ProtobufCMessage *m = &s->base;
  for (size_t i = 0; i < GML_ARRAY_LEN(stats_lines); i++) {
    template_uses(stats_lines[i], NULL, 1, m);
    putchar('\n');
  }
  /* fields no template shows: one line, by name */
  int n = 0;
  for (unsigned i = 0; i < m->descriptor->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &m->descriptor->fields[i];
    int shown = !is_number(f);
    for (size_t k = 0; k < GML_ARRAY_LEN(stats_lines) && !shown; k++) shown = template_uses(stats_lines[k], f->name, 0, m);
    for (size_t k = 0; k < GML_ARRAY_LEN(stats_hidden) && !shown; k++) shown = !strcmp(stats_hidden[k], f->name);
    if (shown) continue;
    printf("%s%s ", n++ ? ", " : "  other     ", f->name);
    print_template_field(m, f->name, "");
  }
  if (n) putchar('\n');
}

/* ---------- metrics: Prometheus text ---------- */

enum metric_unit { AS_IS, PER_CHUNK, US_TO_S };

/* Rows of one family follow each other; the first gives type and help. A
 * row with no family keeps that field out of the metrics. */
static const struct metric_view {
  const char *field, *family, *type, *help, *label;
  enum metric_unit unit;
  const char *fmt; /* doubles */
} metric_views[] = {
    {"chunks_free", "gmlake_lake_bytes", "gauge", "Bytes of the lake's chunks by state.", "state=\"free\"", PER_CHUNK, NULL},
    {"chunks_leased", "gmlake_lake_bytes", NULL, NULL, "state=\"leased\"", PER_CHUNK, NULL},
    {"chunks_parked", "gmlake_lake_bytes", NULL, NULL, "state=\"parked\"", PER_CHUNK, NULL},
    {"chunks_creating", "gmlake_lake_bytes", NULL, NULL, "state=\"creating\"", PER_CHUNK, NULL},
    {"limit_bytes", "gmlake_lake_limit_bytes", "gauge", "The most the lake may hold.", NULL, AS_IS, NULL},
    {"allocated", "gmlake_allocated_bytes", "gauge", "Bytes in live blocks, all clients.", NULL, AS_IS, NULL},
    {"cached", "gmlake_cached_bytes", "gauge", "Bytes leased but not allocated, all clients.", NULL, AS_IS, NULL},
    {"fragmentation", "gmlake_fragmentation_ratio", "gauge", "1 - allocated/leased.", NULL, AS_IS, "%.6f"},
    {"clients", "gmlake_clients", "gauge", "Connected clients.", NULL, AS_IS, NULL},
    {"lease_count", "gmlake_leases_total", "counter", "Leases served.", NULL, AS_IS, NULL},
    {"leases_refused", "gmlake_leases_refused_total", "counter", "Leases refused (lake full or quota).", NULL, AS_IS, NULL},
    {"optional_declined", "gmlake_optional_leases_declined_total", "counter",
     "Optional (headroom) leases answered: nothing free now.", NULL, AS_IS, NULL},
    {"protocol_errors", "gmlake_protocol_errors_total", "counter", "Connections closed for a malformed message.", NULL,
     AS_IS, NULL},
    {"lease_p50_us", "gmlake_lease_latency_seconds", "gauge", "Lease round trip in the daemon, recent leases.",
     "quantile=\"0.5\"", US_TO_S, "%.9f"},
    {"lease_p99_us", "gmlake_lease_latency_seconds", NULL, NULL, "quantile=\"0.99\"", US_TO_S, "%.9f"},
    {"device", NULL, NULL, NULL, NULL, AS_IS, NULL}, /* the device="N" label */
    {"backend", NULL, NULL, NULL, NULL, AS_IS, NULL},
    {"chunk_size", NULL, NULL, NULL, NULL, AS_IS, NULL},
    {"chunks_total", NULL, NULL, NULL, NULL, AS_IS, NULL}, /* the sum of gmlake_lake_bytes */
    {"stitched", NULL, NULL, NULL, NULL, AS_IS, NULL},
    {"device_total_bytes", NULL, NULL, NULL, NULL, AS_IS, NULL},
};

static void print_sample(const ProtobufCMessage *m, const struct metric_view *v, int dev) {
  const ProtobufCFieldDescriptor *f = field_of(m, v->field);
  if (!f || !is_number(f)) return;
  if (v->type) printf("# HELP %s %s\n# TYPE %s %s\n", v->family, v->help, v->family, v->type);
  printf("%s{device=\"%d\"%s%s} ", v->family, dev, v->label ? "," : "", v->label ? v->label : "");
  if (v->unit == US_TO_S) printf(v->fmt ? v->fmt : "%.9f", number(m, f) / 1e6);
  else if (is_float(f)) printf(v->fmt ? v->fmt : "%.6f", number(m, f));
  else print_integer(stdout, m, f, v->unit == PER_CHUNK ? unsigned_of(m, "chunk_size") : 1);
  putchar('\n');
}

/* A LakeStats number without a row: gmlake_<name>, a gauge when the name
 * ends in _bytes or it is a double, else a counter gmlake_<name>_total. */
static void metric_by_rule(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, int dev) {
  size_t len = strlen(f->name);
  int gauge = is_float(f) || (len > 6 && !strcmp(f->name + len - 6, "_bytes"));
  char family[128], help[160];
  snprintf(family, sizeof family, "gmlake_%s%s", f->name, gauge ? "" : "_total");
  snprintf(help, sizeof help, "LakeStats.%s (proto/gmlake.proto).", f->name);
  struct metric_view v = {f->name, family, gauge ? "gauge" : "counter", help, NULL, AS_IS, NULL};
  print_sample(m, &v, dev);
}

static void print_metrics(const Gmlake__CtlReply *r) {
  const ProtobufCMessage *m = &r->stats->base;
  int dev = r->stats->device;
  for (size_t i = 0; i < GML_ARRAY_LEN(metric_views); i++)
    if (metric_views[i].family) print_sample(m, &metric_views[i], dev);
  for (unsigned i = 0; i < m->descriptor->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &m->descriptor->fields[i];
    int has_row = 0;
    for (size_t k = 0; k < GML_ARRAY_LEN(metric_views) && !has_row; k++) has_row = !strcmp(metric_views[k].field, f->name);
    if (!has_row && is_number(f)) metric_by_rule(m, f, dev);
  }
  static const struct { const char *field, *kind; } client_bytes[] = {
      {"leased_bytes", "leased"}, {"allocated", "allocated"}, {"cached", "cached"}, {"stitched", "stitched"}};
  printf("# HELP gmlake_client_bytes Bytes of one client by kind.\n# TYPE gmlake_client_bytes gauge\n");
  for (size_t i = 0; i < r->n_clients; i++) {
    const Gmlake__ClientInfo *c = r->clients[i];
    for (size_t k = 0; k < GML_ARRAY_LEN(client_bytes); k++) {
      printf("gmlake_client_bytes{device=\"%d\",pid=\"%d\",name=\"", dev, c->pid);
      print_escaped(stdout, c->name, 0);
      printf("\",kind=\"%s\"} %llu\n", client_bytes[k].kind, (unsigned long long)unsigned_of(&c->base, client_bytes[k].field));
    }
  }
}

/* ---------- the RPC ---------- */

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

/* ---------- human tables ---------- */

static void print_clients(const Gmlake__CtlReply *r) {
  time_t now = time(NULL);
  printf("%-8s %-6s %-16s %12s %12s %12s %12s %8s\n", "PID", "UID", "NAME", "LEASED", "ALLOCATED", "CACHED", "QUOTA", "SINCE");
  for (size_t i = 0; i < r->n_clients; i++) {
    const Gmlake__ClientInfo *c = r->clients[i];
    char a[32], b[32], d[32], q[32];
    long age = (long)(now - (time_t)c->since);
    char since[32];
    if (age < 3600) snprintf(since, sizeof since, "%ldm%02lds", age / 60, age % 60);
    else snprintf(since, sizeof since, "%ldh%02ldm", age / 3600, age % 3600 / 60);
    printf("%-8d %-6u %-16.16s %12s %12s %12s %12s %8s\n", c->pid, c->uid, c->name, gml_format_bytes(c->leased_bytes, a, 32),
           gml_format_bytes(c->allocated, b, 32), gml_format_bytes(c->cached, d, 32),
           c->quota_bytes ? gml_format_bytes(c->quota_bytes, q, 32) : "-", since);
  }
  if (!r->n_clients) printf("(no clients)\n");
}

static void print_chunks(const Gmlake__CtlReply *r) {
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

/* ---------- commands ---------- */

typedef struct ctl {
  const char *url;
  int json, pid;
  double interval;
  char **args;
  int nargs;
  Gmlake__CtlReply *reply; /* freed after the command */
} ctl;

/* One request of the kind that carries a bool (stats, clients, chunks). */
static Gmlake__CtlReply *ask(ctl *c, Gmlake__CtlRequest__ReqCase kind) {
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  req.req_case = kind;
  req.stats = 1; /* the oneof's bools share one slot */
  return c->reply = call(c->url, &req);
}

static int cmd_stats(ctl *c) {
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_STATS)) return 1;
  if (c->json) print_json(&c->reply->stats->base), putchar('\n');
  else print_stats(c->reply->stats);
  return 0;
}

static int cmd_metrics(ctl *c) {
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_CLIENTS)) return 1;
  print_metrics(c->reply);
  return 0;
}

static int cmd_clients(ctl *c) {
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_CLIENTS)) return 1;
  if (c->json) print_json_list((ProtobufCMessage *const *)c->reply->clients, c->reply->n_clients);
  else print_clients(c->reply);
  return 0;
}

static int cmd_chunks(ctl *c) {
  if (!ask(c, GMLAKE__CTL_REQUEST__REQ_CHUNKS)) return 1;
  if (c->json) print_json_list((ProtobufCMessage *const *)c->reply->chunks, c->reply->n_chunks);
  else print_chunks(c->reply);
  return 0;
}

static int cmd_trim(ctl *c) {
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  Gmlake__TrimRequest trim = GMLAKE__TRIM_REQUEST__INIT;
  req.req_case = GMLAKE__CTL_REQUEST__REQ_TRIM;
  trim.client_pid = c->pid;
  req.trim = &trim;
  if (!(c->reply = call(c->url, &req))) return 1;
  if (c->json) printf("{\"trimmed_chunks\":%llu}\n", (unsigned long long)c->reply->trimmed_chunks);
  else printf("released %llu free chunk(s) to the driver%s\n", (unsigned long long)c->reply->trimmed_chunks,
              c->pid ? "; asked the client for its idle cache" : "");
  return 0;
}

static int cmd_limit(ctl *c) {
  uint64_t v, total = 0;
  if (strchr(c->args[0], '%')) { /* a percentage of the device: the daemon tells its size */
    if (!ask(c, GMLAKE__CTL_REQUEST__REQ_STATS)) return 1;
    total = c->reply->stats->device_total_bytes;
    gmlake__ctl_reply__free_unpacked(c->reply, NULL);
    c->reply = NULL;
  }
  if (gml_parse_size(c->args[0], total, &v)) {
    fprintf(stderr, "gmlakectl: bad size '%s'\n", c->args[0]);
    return 2;
  }
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  req.req_case = GMLAKE__CTL_REQUEST__REQ_SET_LIMIT_BYTES;
  req.set_limit_bytes = v;
  if (!(c->reply = call(c->url, &req))) return 1;
  if (c->json) print_json(&c->reply->stats->base), putchar('\n');
  else printf("limit set to %llu bytes\n", (unsigned long long)v);
  return 0;
}

static void usage(FILE *f);

static int cmd_quota(ctl *c) {
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  Gmlake__QuotaRequest quota = GMLAKE__QUOTA_REQUEST__INIT;
  uint64_t v;
  if (gml_parse_size(c->args[1], 0, &v)) {
    usage(stderr);
    return 2;
  }
  if (!strncmp(c->args[0], "uid:", 4)) {
    quota.by_uid = 1;
    quota.uid = (uint32_t)strtoul(c->args[0] + 4, NULL, 10);
  } else {
    quota.pid = atoi(c->args[0]);
    if (quota.pid <= 0) {
      fprintf(stderr, "gmlakectl: bad pid '%s'\n", c->args[0]);
      return 2;
    }
  }
  quota.bytes = v;
  req.req_case = GMLAKE__CTL_REQUEST__REQ_SET_QUOTA;
  req.set_quota = &quota;
  if (!(c->reply = call(c->url, &req))) return 1;
  if (c->json) printf("{\"ok\":true}\n");
  else printf("quota of %s set to %llu bytes\n", c->args[0], (unsigned long long)v);
  return 0;
}

static int cmd_watch(ctl *c) {
  for (;;) {
    if (!ask(c, GMLAKE__CTL_REQUEST__REQ_CLIENTS)) return 1;
    printf("\033[H\033[2J");
    print_stats(c->reply->stats);
    putchar('\n');
    print_clients(c->reply);
    fflush(stdout);
    gmlake__ctl_reply__free_unpacked(c->reply, NULL);
    c->reply = NULL;
    usleep((useconds_t)(c->interval * 1e6));
  }
}

/* A new command: a handler above and a row here. `changes`: it changes the
 * lake (the daemon's control.c marks the same requests). */
static const struct command {
  const char *name, *args_help, *help;
  int nargs; /* arguments it needs (-1: any) */
  int changes;
  int (*run)(ctl *c);
} commands[] = {
    {"stats", "", "lake size and limit, chunk states, client totals, fragmentation, lease latency", -1, 0, cmd_stats},
    {"clients", "", "connected clients: pid, uid, name, leased, allocated, cached, since", -1, 0, cmd_clients},
    {"chunks", "", "a map of the lake: who holds which chunk", -1, 0, cmd_chunks},
    {"trim", " [--client PID]", "release free chunks to the driver; ask that client for its idle cache", -1, 1, cmd_trim},
    {"limit", " BYTES|PCT%", "set the lake's limit (PCT of the device)", 1, 1, cmd_limit},
    {"quota", " PID|uid:UID BYTES", "set a quota (0 clears it); a lease over it is refused to that client", 2, 1, cmd_quota},
    {"metrics", "", "Prometheus text exposition of the same numbers", -1, 0, cmd_metrics},
    {"watch", " [--interval S]", "refresh stats and clients, like top", -1, 0, cmd_watch},
};

static void usage(FILE *f) {
  fprintf(f, "usage: gmlakectl [--control URL | --device N] [--json] COMMAND\n"
             "       gmlakectl --version\n"
             "commands:\n");
  for (size_t i = 0; i < GML_ARRAY_LEN(commands); i++) {
    char left[64];
    snprintf(left, sizeof left, "%s%s", commands[i].name, commands[i].args_help);
    fprintf(f, "  %-26s%s\n", left, commands[i].help);
  }
}

int main(int argc, char **argv) {
  char url[300] = "";
  int device = 0, ch;
  char *cmd = NULL, *args[4] = {0};
  ctl c = {.interval = 1.0, .args = args};
  /* options may come before or after the command */
  optind = 1;
  static const struct option all_opts[] = {
      {"control", required_argument, 0, 'c'}, {"device", required_argument, 0, 'd'}, {"json", no_argument, 0, 'j'},
      {"help", no_argument, 0, 'h'},          {"client", required_argument, 0, 'p'}, {"interval", required_argument, 0, 'i'},
      {"version", no_argument, 0, 'V'},       {0, 0, 0, 0}};
  while (optind < argc) {
    if ((ch = getopt_long(argc, argv, "+c:d:jhp:i:V", all_opts, NULL)) == -1) {
      if (!cmd) cmd = argv[optind];
      else if (c.nargs < 4) args[c.nargs++] = argv[optind];
      optind++;
      continue;
    }
    switch (ch) {
    case 'c': snprintf(url, sizeof url, "%s", optarg); break;
    case 'd': device = atoi(optarg); break;
    case 'j': c.json = 1; break;
    case 'p': c.pid = atoi(optarg); break;
    case 'i': c.interval = atof(optarg); break;
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
  c.url = url;
  for (size_t i = 0; i < GML_ARRAY_LEN(commands); i++) {
    if (strcmp(commands[i].name, cmd)) continue;
    if (commands[i].nargs >= 0 && c.nargs != commands[i].nargs) {
      usage(stderr);
      return 2;
    }
    int rc = commands[i].run(&c);
    if (c.reply) gmlake__ctl_reply__free_unpacked(c.reply, NULL);
    return rc;
  }
  fprintf(stderr, "gmlakectl: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
