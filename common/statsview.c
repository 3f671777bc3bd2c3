/* statsview.c: the printers of the daemon's numbers that gmlakectl and the
 * daemon's /metrics share, driven by the protobuf-c descriptors of the
 * reply's messages (see statsview.h): a field
 * added to LakeStats in proto/gmlake.proto appears in --json, in `stats` and
 * in `metrics` with no edit here; the tables below only give a field another
 * name, unit, label, help or place. */
#include "statsview.h"
#include "wire.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32:
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32:
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
  case PROTOBUF_C_TYPE_DOUBLE:
  case PROTOBUF_C_TYPE_FLOAT:
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
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32: return *(const int32_t *)p;
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: return *(const uint32_t *)p;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64: return (double)*(const int64_t *)p;
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64: return (double)*(const uint64_t *)p;
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
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64: fprintf(o, "%llu", (unsigned long long)(*(const uint64_t *)p * scale)); break;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64: fprintf(o, "%lld", (long long)(*(const int64_t *)p * (int64_t)scale)); break;
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

void gmli_print_json_string(FILE *o, const char *s) {
  fputc('"', o);
  print_escaped(o, s, 1);
  fputc('"', o);
}

/* ---------- --json: every field under its name ---------- */

/* printf formats of double fields in --json (others: "%.6f") */
static const struct {
  const char *field, *fmt;
} json_formats[] = {
    {"lease_p50_us", "%.1f"},
    {"lease_p99_us", "%.1f"},
    {"since", "%.3f"},
};

/* A message field's numbers (ClientInfo.reported: a client's report as it
 * sent it) under their own names, but those the outer message has a field
 * of (whose value is the one shown: the daemon's, bounded); 0 when unset. */
static void print_json_inner(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, int *first) {
  const ProtobufCMessage *in = *(ProtobufCMessage *const *)value_at(m, f);
  const ProtobufCMessageDescriptor *d = f->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *g = &d->fields[i];
    if (!is_number(g) || field_of(m, g->name)) continue;
    printf("%s\"%s\":", *first ? "" : ",", g->name);
    *first = 0;
    if (in) print_integer(stdout, in, g, 1);
    else putchar('0');
  }
}

void gmli_print_json(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *desc = m->descriptor;
  int first = 1;
  putchar('{');
  for (unsigned i = 0; i < desc->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &desc->fields[i];
    if (f->type == PROTOBUF_C_TYPE_MESSAGE && f->label != PROTOBUF_C_LABEL_REPEATED) {
      print_json_inner(m, f, &first);
      continue;
    }
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

void gmli_print_json_list(ProtobufCMessage *const *items, size_t n) {
  putchar('[');
  for (size_t i = 0; i < n; i++) {
    if (i) putchar(',');
    gmli_print_json(items[i]);
  }
  putchar(']');
}

/* ---------- stats: templates over LakeStats ---------- */

/* {field} prints the field; {field:bytes} as a size, {field:chunks} as the
 * size of that many chunks, {field:pct} as a percentage, {field:%.1f} with
 * that format. */
static const char *const stats_lines[] = {
    "device {device} ({gpu_uuid}, {backend} backend), chunks of {chunk_size:bytes}",
    "  lake      {chunks_total:chunks} held of limit {limit_bytes:bytes}",
    "  chunks    {chunks_total} total: {chunks_free} free, {chunks_leased} leased, {chunks_parked} parked, "
    "{chunks_creating} being created",
    "  clients   {clients}: allocated {allocated:bytes}, cached {cached:bytes}, stitched {stitched:bytes}; "
    "uncounted {uncounted:bytes} (theirs, outside the lake)",
    "  growable  {growable_mapped:bytes} mapped, {growable_unmapped:bytes} reserved but unmapped; shared: "
    "{chunks_shared} "
    "chunk(s) in {shares} share(s), counted once",
    "  cached    idle {idle_cache_bytes:bytes} (whole chunks, reclaimable), fragmented {fragment_bytes:bytes} "
    "(free inside chunks in use)",
    "  fragmentation {fragmentation:pct} (1 - (allocated + growable mapped)/leased)",
    "  leases    {lease_count} served (p50 {lease_p50_us:%.1f} us, p99 {lease_p99_us:%.1f} us), {leases_refused} "
    "refused, "
    "{optional_declined} optional ones declined; {protocol_errors} protocol errors",
};
/* LakeStats fields the human view leaves out on purpose (the rest appear) */
static const char *const stats_hidden[] = {"device_total_bytes", "lease_latency_sum_s", "lease_latency_count"};

static void print_template_field(const ProtobufCMessage *m, const char *name, const char *spec) {
  const ProtobufCFieldDescriptor *f = field_of(m, name);
  char b[32];
  if (!f) {
    printf("?");
  } else if (f->type == PROTOBUF_C_TYPE_STRING) {
    printf("%s", *(char *const *)value_at(m, f));
  } else if (!strcmp(spec, "bytes")) {
    printf("%s", gmli_format_bytes(unsigned_of(m, name), b, sizeof b));
  } else if (!strcmp(spec, "chunks")) {
    printf("%s", gmli_format_bytes(unsigned_of(m, name) * unsigned_of(m, "chunk_size"), b, sizeof b));
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

void gmli_print_stats(const Gmlake__LakeStats *s) {
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
    for (size_t k = 0; k < GML_ARRAY_LEN(stats_lines) && !shown; k++)
      shown = template_uses(stats_lines[k], f->name, 0, m);
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
    {"chunks_free", "gmlake_lake_bytes", "gauge", "Bytes of the lake's chunks by state.", "state=\"free\"", PER_CHUNK,
     NULL},
    {"chunks_leased", "gmlake_lake_bytes", NULL, NULL, "state=\"leased\"", PER_CHUNK, NULL},
    {"chunks_parked", "gmlake_lake_bytes", NULL, NULL, "state=\"parked\"", PER_CHUNK, NULL},
    {"chunks_creating", "gmlake_lake_bytes", NULL, NULL, "state=\"creating\"", PER_CHUNK, NULL},
    /* the chunks of shares are the lake's too (in chunks_total): without them the states did not add up */
    {"chunks_shared", "gmlake_lake_bytes", NULL, NULL, "state=\"shared\"", PER_CHUNK, NULL},
    {"limit_bytes", "gmlake_lake_limit_bytes", "gauge", "The most the lake may hold.", NULL, AS_IS, NULL},
    {"allocated", "gmlake_allocated_bytes", "gauge", "Bytes in live blocks, all clients.", NULL, AS_IS, NULL},
    {"cached", "gmlake_cached_bytes", "gauge", "Bytes leased but not allocated, all clients.", NULL, AS_IS, NULL},
    {"fragmentation", "gmlake_fragmentation_ratio", "gauge", "1 - (allocated + growable mapped)/leased.", NULL, AS_IS,
     "%.6f"},
    {"clients", "gmlake_clients", "gauge", "Connected clients.", NULL, AS_IS, NULL},
    {"lease_count", "gmlake_leases_total", "counter", "Leases served.", NULL, AS_IS, NULL},
    {"leases_refused", "gmlake_leases_refused_total", "counter", "Leases refused (lake full or quota).", NULL, AS_IS,
     NULL},
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
    {"chunks_total", NULL, NULL, NULL, NULL, AS_IS, NULL}, /* the sum of gmlake_lake_bytes, but creating */
    {"stitched", NULL, NULL, NULL, NULL, AS_IS, NULL},
    {"device_total_bytes", NULL, NULL, NULL, NULL, AS_IS, NULL},
    {"idle_cache_bytes", "gmlake_idle_cache_bytes", "gauge",
     "Whole chunks clients cache with nothing allocated in them: reclaimable.", NULL, AS_IS, NULL},
    {"fragment_bytes", "gmlake_fragment_bytes", "gauge",
     "Free bytes inside chunks clients use in part: fragmentation, not reclaimable.", NULL, AS_IS, NULL},
    {"uncounted", "gmlake_uncounted_bytes", "gauge",
     "Bytes clients hold on the device that the lake does not count (a restarted daemon took no hand-over of them).",
     NULL, AS_IS, NULL},
    /* numbers that go up and down: gauges, named for what they count */
    {"shares", "gmlake_shares", "gauge", "Shares published (gml_share) and not yet withdrawn.", NULL, AS_IS, NULL},
    {"chunks_shared", "gmlake_chunks_shared", "gauge", "Chunks of shares, each counted once whoever maps it.", NULL,
     AS_IS, NULL},
    {"growable_mapped", "gmlake_growable_mapped_bytes", "gauge", "Bytes backed in clients' growable ranges.", NULL,
     AS_IS, NULL},
    {"growable_unmapped", "gmlake_growable_unmapped_bytes", "gauge",
     "Bytes reserved but not backed in clients' growable ranges.", NULL, AS_IS, NULL},
    /* numbers that only go up (d->counters, reset only by a restart): counters */
    {"connections_refused", "gmlake_connections_refused_total", "counter",
     "Connections refused: over max-clients or max-clients-per-uid.", NULL, AS_IS, NULL},
    {"chunks_scrubbed", "gmlake_chunks_scrubbed_total", "counter", "Free chunks zeroed before another uid got them.",
     NULL, AS_IS, NULL},
    {"chunks_remade", "gmlake_chunks_remade_total", "counter",
     "Free chunks another uid's process could still map: released and made anew.", NULL, AS_IS, NULL},
    {"chunks_released_idle", "gmlake_chunks_released_idle_total", "counter",
     "Free chunks past --idle-reserve given back to the driver once the lake was idle for --idle-release.", NULL, AS_IS,
     NULL},
    {"lease_latency_sum_s", NULL, NULL, NULL, NULL, AS_IS, NULL}, /* in the histogram */
    {"lease_latency_count", NULL, NULL, NULL, NULL, AS_IS, NULL},
};

/* Every sample's labels: the device index (nvidia-smi's, as gmlaked --device N) and its UUID (a GPU's, as
 * nvidia-smi and DCGM name it, or host-N). */
typedef struct labels {
  int dev;
  const char *uuid;
} labels;

static void print_sample(FILE *o, const ProtobufCMessage *m, const struct metric_view *v, const labels *l) {
  const ProtobufCFieldDescriptor *f = field_of(m, v->field);
  if (!f || !is_number(f)) return;
  if (v->type) fprintf(o, "# HELP %s %s\n# TYPE %s %s\n", v->family, v->help, v->family, v->type);
  fprintf(o, "%s{device=\"%d\",gpu_uuid=\"", v->family, l->dev);
  print_escaped(o, l->uuid, 0);
  fprintf(o, "\"%s%s} ", v->label ? "," : "", v->label ? v->label : "");
  if (v->unit == US_TO_S) fprintf(o, v->fmt ? v->fmt : "%.9f", number(m, f) / 1e6);
  else if (is_float(f)) fprintf(o, v->fmt ? v->fmt : "%.6f", number(m, f));
  else print_integer(o, m, f, v->unit == PER_CHUNK ? unsigned_of(m, "chunk_size") : 1);
  fputc('\n', o);
}

/* A LakeStats number without a row: a gauge gmlake_<name>. Never a counter:
 * a number that goes down typed as a counter makes rate() see resets that
 * are not there (shares and growable bytes were such counters), while a
 * counter typed as a gauge is still read right; a counter gets its row. */
static void metric_by_rule(FILE *o, const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, const labels *l) {
  char family[128], help[160];
  snprintf(family, sizeof family, "gmlake_%s", f->name);
  snprintf(help, sizeof help, "LakeStats.%s (proto/gmlake.proto).", f->name);
  struct metric_view v = {f->name, family, "gauge", help, NULL, AS_IS, NULL};
  print_sample(o, m, &v, l);
}

/* Per cgroup (containers, units, jobs): a bounded label, 16 cgroups, the rest summed as "other". */
static void print_labels(FILE *o, const labels *l);
static void print_cgroup_metrics(FILE *o, const Gmlake__CtlReply *r, const labels *l) {
  enum { MAXCG = 16 };
  const char *cg[MAXCG + 1];
  uint64_t cgv[MAXCG + 1][3];
  memset(cgv, 0, sizeof cgv);
  size_t ncg = 0;
  int other = 0;
  for (size_t i = 0; i < r->n_clients; i++) {
    const Gmlake__ClientInfo *c = r->clients[i];
    /* another user's client as a reader other than root and the daemon's user
     * gets it (pid 0, no name, no cgroup: daemon/control.c): its bytes under
     * "(other users)", not "unknown" beside its real cgroup's row, which then
     * counted only the reader's own processes */
    int hidden = !c->pid && !(c->name && c->name[0]) && !(c->cgroup && c->cgroup[0]);
    const char *name = hidden ? "(other users)" : c->cgroup && c->cgroup[0] ? c->cgroup : "unknown";
    size_t k = 0;
    while (k < ncg && strcmp(cg[k], name)) k++;
    if (k == ncg) {
      if (ncg < MAXCG) cg[ncg++] = name;
      else k = MAXCG, other = 1;
    }
    cgv[k][0] += c->leased_bytes, cgv[k][1] += c->allocated, cgv[k][2] += c->paused;
  }
  cg[MAXCG] = "other";
  fprintf(o,
          "# HELP gmlake_cgroup_bytes Bytes of the clients of one cgroup by kind (16 cgroups, the rest as \"other\").\n"
          "# TYPE gmlake_cgroup_bytes gauge\n");
  for (size_t k = 0; k <= MAXCG; k++) {
    if (k >= ncg && !(k == MAXCG && other)) continue;
    for (int j = 0; j < 3; j++) {
      fprintf(o, "gmlake_cgroup_bytes{");
      print_labels(o, l);
      fprintf(o, ",cgroup=\"");
      print_escaped(o, cg[k], 0);
      fprintf(o, "\",kind=\"%s\"} %llu\n",
              j == 0   ? "leased"
              : j == 1 ? "allocated"
                       : "paused",
              (unsigned long long)cgv[k][j]);
    }
  }
}

/* Named quotas (a job's, a pod's): a label the quota's setter chose, as many as quotas were named. */
static void print_group_metrics(FILE *o, const Gmlake__CtlReply *r, const labels *l) {
  int head = 0;
  for (size_t i = 0; i < r->n_quotas; i++) {
    const Gmlake__QuotaInfo *q = r->quotas[i];
    if (!q->group || !*q->group) continue;
    if (!head++)
      fprintf(
          o,
          "# HELP gmlake_quota_bytes A named quota (a job's, a pod's): its bytes, what its clients hold, their peak.\n"
          "# TYPE gmlake_quota_bytes gauge\n");
    const uint64_t v[3] = {q->bytes, q->held_bytes, q->peak_bytes};
    for (int j = 0; j < 3; j++) {
      fprintf(o, "gmlake_quota_bytes{");
      print_labels(o, l);
      fprintf(o, ",group=\"");
      print_escaped(o, q->group, 0);
      fprintf(o, "\",kind=\"%s\"} %llu\n", j == 0 ? "quota" : j == 1 ? "held" : "peak", (unsigned long long)v[j]);
    }
  }
}

void gmli_print_quotas(const Gmlake__CtlReply *r, int json) {
  char b[32], h[32], p[32];
  if (json) {
    gmli_print_json_list((ProtobufCMessage *const *)r->quotas, r->n_quotas);
    putchar('\n');
    return;
  }
  printf("%-24s %10s %10s %10s  %s\n", "NAME", "QUOTA", "HELD", "PEAK", "HOLDER");
  for (size_t i = 0; i < r->n_quotas; i++) {
    const Gmlake__QuotaInfo *q = r->quotas[i];
    printf("%-24s %10s %10s %10s  %s\n", q->group && *q->group ? q->group : "-",
           gmli_format_bytes(q->bytes, b, sizeof b), gmli_format_bytes(q->held_bytes, h, sizeof h),
           gmli_format_bytes(q->peak_bytes, p, sizeof p), q->holder);
  }
}

static void print_labels(FILE *o, const labels *l) {
  fprintf(o, "device=\"%d\",gpu_uuid=\"", l->dev);
  print_escaped(o, l->uuid, 0);
  fputc('"', o);
}

/* Lease latency as a Prometheus histogram (all leases since start; the
 * quantile gauges above are over the recent ones). */
static void print_latency_histogram(FILE *o, const Gmlake__LakeStats *s, const labels *l) {
  static const uint64_t bounds_us[GML_LEASE_LAT_NBOUNDS] = GML_LEASE_LAT_BOUNDS_US;
  fprintf(o, "# HELP gmlake_lease_duration_seconds Lease round trip in the daemon, every lease since start.\n"
             "# TYPE gmlake_lease_duration_seconds histogram\n");
  for (size_t i = 0; i < GML_LEASE_LAT_NBOUNDS; i++) {
    fprintf(o, "gmlake_lease_duration_seconds_bucket{");
    print_labels(o, l);
    fprintf(o, ",le=\"%g\"} %llu\n", (double)bounds_us[i] / 1e6,
            (unsigned long long)(i < s->n_lease_latency_bucket ? s->lease_latency_bucket[i] : 0));
  }
  fprintf(o, "gmlake_lease_duration_seconds_bucket{");
  print_labels(o, l);
  fprintf(o, ",le=\"+Inf\"} %llu\ngmlake_lease_duration_seconds_sum{", (unsigned long long)s->lease_latency_count);
  print_labels(o, l);
  fprintf(o, "} %.9f\ngmlake_lease_duration_seconds_count{", s->lease_latency_sum_s);
  print_labels(o, l);
  fprintf(o, "} %llu\n", (unsigned long long)s->lease_latency_count);
}

/* Per-client numbers are summed per user: a series per pid would grow
 * without bound (every job a new one). At most MAXU users, the rest as
 * uid="other": uid's row among those seen (uids, *nu of them), MAXU for the
 * rest (*other then set). */
enum { MAXU = 64 };
static size_t user_row(uint32_t uids[MAXU], size_t *nu, size_t *other, uint32_t uid) {
  size_t k = 0;
  while (k < *nu && uids[k] != uid) k++;
  if (k == *nu && *nu < MAXU) uids[(*nu)++] = uid;
  if (k == MAXU) *other = 1;
  return k;
}

static void print_per_user(FILE *o, const Gmlake__CtlReply *r, const labels *l) {
  static const struct {
    const char *field, *kind;
  } client_bytes[] = {
      {"leased_bytes", "leased"}, {"allocated", "allocated"}, {"cached", "cached"}, {"stitched", "stitched"}};
  uint32_t uids[MAXU];
  uint64_t sums[MAXU + 1][4] = {{0}}, nclients[MAXU + 1] = {0};
  size_t nu = 0, other = 0;
  for (size_t i = 0; i < r->n_clients; i++) {
    const Gmlake__ClientInfo *c = r->clients[i];
    size_t k = user_row(uids, &nu, &other, c->uid);
    nclients[k]++;
    for (size_t j = 0; j < 4; j++) sums[k][j] += unsigned_of(&c->base, client_bytes[j].field);
  }
  fprintf(o, "# HELP gmlake_user_bytes Bytes of one user's clients by kind.\n# TYPE gmlake_user_bytes gauge\n");
  for (size_t k = 0; k < nu + other; k++)
    for (size_t j = 0; j < 4; j++) {
      fprintf(o, "gmlake_user_bytes{");
      print_labels(o, l);
      if (k < nu) fprintf(o, ",uid=\"%u\"", uids[k]);
      else fprintf(o, ",uid=\"other\"");
      fprintf(o, ",kind=\"%s\"} %llu\n", client_bytes[j].kind, (unsigned long long)sums[k][j]);
    }
  fprintf(o, "# HELP gmlake_user_clients Connected clients of one user.\n# TYPE gmlake_user_clients gauge\n");
  for (size_t k = 0; k < nu + other; k++) {
    fprintf(o, "gmlake_user_clients{");
    print_labels(o, l);
    if (k < nu) fprintf(o, ",uid=\"%u\"} %llu\n", uids[k], (unsigned long long)nclients[k]);
    else fprintf(o, ",uid=\"other\"} %llu\n", (unsigned long long)nclients[k]);
  }
}

/* A number a client reports as --json shows it: ClientInfo's field of its
 * name where there is one, else its report's (0 before the first). */
static uint64_t client_reported(const Gmlake__ClientInfo *c, const ProtobufCFieldDescriptor *g) {
  if (field_of(&c->base, g->name)) return unsigned_of(&c->base, g->name);
  return c->reported ? unsigned_of(&c->reported->base, g->name) : 0;
}

/* Every number of UsageReport summed per user (as gmlake_user_bytes), a
 * series per field: a field added there is exported with no line here. */
static void print_user_reported(FILE *o, const Gmlake__CtlReply *r, const labels *l) {
  const ProtobufCMessageDescriptor *d = &gmlake__usage_report__descriptor;
  uint32_t uids[MAXU];
  size_t nu = 0, other = 0;
  uint64_t *sums = calloc((MAXU + 1) * d->n_fields, sizeof *sums);
  if (!sums) return;
  for (size_t i = 0; i < r->n_clients; i++) {
    const Gmlake__ClientInfo *c = r->clients[i];
    size_t k = user_row(uids, &nu, &other, c->uid);
    for (unsigned j = 0; j < d->n_fields; j++) sums[k * d->n_fields + j] += client_reported(c, &d->fields[j]);
  }
  fprintf(o, "# HELP gmlake_user_reported What one user's clients report (UsageReport in proto/gmlake.proto: its "
             "field), summed.\n# TYPE gmlake_user_reported gauge\n");
  for (size_t k = 0; k < nu + other; k++)
    for (unsigned j = 0; j < d->n_fields; j++) {
      fprintf(o, "gmlake_user_reported{");
      print_labels(o, l);
      if (k < nu) fprintf(o, ",uid=\"%u\"", uids[k]);
      else fprintf(o, ",uid=\"other\"");
      fprintf(o, ",field=\"%s\"} %llu\n", d->fields[j].name, (unsigned long long)sums[k * d->n_fields + j]);
    }
  free(sums);
}

/* UsageReport fields `gmlakectl clients` leaves out on purpose (--json and
 * the metrics have them); ClientInfo's own fields are the table's columns. */
static const char *const clients_hidden[] = {"alloc_count", "idle_bytes", "fragment_bytes", "reclaims_served"};

void gmli_print_client_other(const Gmlake__ClientInfo *c) {
  const ProtobufCMessageDescriptor *d = &gmlake__usage_report__descriptor;
  char b[32];
  for (unsigned j = 0; j < d->n_fields; j++) {
    const ProtobufCFieldDescriptor *g = &d->fields[j];
    int shown = field_of(&c->base, g->name) != NULL;
    for (size_t k = 0; k < GML_ARRAY_LEN(clients_hidden) && !shown; k++) shown = !strcmp(clients_hidden[k], g->name);
    if (!shown) printf("  %s %s", g->name, gmli_format_bytes(client_reported(c, g), b, sizeof b));
  }
}

void gmli_print_metrics(FILE *o, const Gmlake__CtlReply *r) {
  const ProtobufCMessage *m = &r->stats->base;
  labels l = {r->stats->device, r->stats->gpu_uuid && *r->stats->gpu_uuid ? r->stats->gpu_uuid : "unknown"};
  fprintf(o, "# HELP gmlake_build_info The daemon's version and backend.\n# TYPE gmlake_build_info gauge\n"
             "gmlake_build_info{");
  print_labels(o, &l);
  fprintf(o, ",version=\"");
  print_escaped(o, r->stats->version && *r->stats->version ? r->stats->version : "unknown", 0);
  fprintf(o, "\",backend=\"");
  print_escaped(o, r->stats->backend, 0);
  fprintf(o, "\"} 1\n");
  for (size_t i = 0; i < GML_ARRAY_LEN(metric_views); i++)
    if (metric_views[i].family) print_sample(o, m, &metric_views[i], &l);
  for (unsigned i = 0; i < m->descriptor->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &m->descriptor->fields[i];
    int has_row = 0;
    for (size_t k = 0; k < GML_ARRAY_LEN(metric_views) && !has_row; k++)
      has_row = !strcmp(metric_views[k].field, f->name);
    if (!has_row && is_number(f)) metric_by_rule(o, m, f, &l);
  }
  print_cgroup_metrics(o, r, &l);
  print_group_metrics(o, r, &l);
  print_latency_histogram(o, r->stats, &l);
  print_per_user(o, r, &l);
  print_user_reported(o, r, &l);
}
