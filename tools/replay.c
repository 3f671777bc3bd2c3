/* gmlake-replay: replays PyTorch allocation traces (shared/traces format)
 * through the real client library (embedded, or through a daemon), writing
 * into every allocation so overlapping blocks would be caught, and prints
 * peak allocated / reserved, fragmentation at peak beside PyTorch's numbers,
 * and allocator latency. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "backend.h"
#include "gmlake.h"
#include "options.h"
#include "replay.h"
#include "statsview.h"
#include "util.h"
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef struct trace_result {
  const char *trace;
  uint64_t peak_allocated, peak_reserved;
  uint64_t torch_default_reserved, torch_default_allocated, torch_expandable_reserved, torch_expandable_allocated;
  double frag, ops_per_s, wall_s;
  double alloc_p50, alloc_p99, free_p50, free_p99;
  uint64_t allocs, frees, maps, unmaps, chunks_leased, chunk_size;
  int mode;
  const char *backend;
} trace_result;

typedef struct live_slot {
  uint64_t id;
  void *ptr; /* NULL: not live */
  uint64_t size;
  size_t line;  /* the line that allocated it (live) or freed it (not live); 0: an empty slot of the table */
  size_t event; /* --plan: the index of its allocation's event */
} live_slot;

/* A trace's ids, any 64-bit number, to their blocks: open addressing, at most
 * half full. The recorders number allocations 0, 1, 2, ..., but an id is only
 * a name: a table indexed by it grew to the largest id, by doubling, and a
 * line "a 9223372036854775808 4096 0" made it ask for 2^63 slots (a crash,
 * or all the machine's memory, before any refusal). Ids seen stay in the
 * table after their free, to name the line of a second free. */
typedef struct id_table {
  live_slot *slot;
  size_t cap, used; /* cap: a power of two */
} id_table;

static size_t id_hash(uint64_t id) { /* splitmix64's finalizer: sequential ids spread over the table */
  id = (id ^ (id >> 30)) * 0xBF58476D1CE4E5B9ull;
  id = (id ^ (id >> 27)) * 0x94D049BB133111EBull;
  return (size_t)(id ^ (id >> 31));
}

/* id's slot, or the empty one where it would go. */
static live_slot *id_find(const id_table *t, uint64_t id) {
  for (size_t i = id_hash(id) & (t->cap - 1);; i = (i + 1) & (t->cap - 1))
    if (!t->slot[i].line || t->slot[i].id == id) return &t->slot[i];
}

/* id's slot, made (line set, nothing live) where it has none; NULL: out of memory. */
static live_slot *id_slot(id_table *t, uint64_t id, size_t line) {
  live_slot *e = id_find(t, id);
  if (e->line) return e;
  if ((t->used + 1) * 2 > t->cap) {
    if (t->cap > SIZE_MAX / 2 / sizeof *t->slot) return NULL;
    id_table g = {calloc(t->cap * 2, sizeof *t->slot), t->cap * 2, t->used};
    if (!g.slot) return NULL;
    for (size_t i = 0; i < t->cap; i++)
      if (t->slot[i].line) *id_find(&g, t->slot[i].id) = t->slot[i];
    free(t->slot);
    *t = g;
    e = id_find(t, id);
  }
  t->used++;
  *e = (live_slot){.id = id, .line = line};
  return e;
}

static int verify_tag(gml_client *c, void *p, uint64_t size, uint64_t id, int write);

static uint64_t header_num(const char *line, const char *key) {
  const char *k = strstr(line, key);
  return k ? strtoull(k + strlen(key), NULL, 10) : 0;
}

/* A trace's lines: "# ..." (a header or comment), "a ID SIZE STREAM",
 * "f ID", "s" (a step begins), or blank. Anything else is no trace: a file
 * of junk replayed as zero events printed an all-zero row and exit 0. So is
 * a free of an id that is not live or an allocation of one that is
 * (replay_one): the recorders write neither (they drop the frees of blocks
 * allocated before recording began); skipped, or overwriting the live
 * block, they replayed what no program did. */
static int trace_line_ok(const char *line) {
  const char *p = line + 1;
  int nums = line[0] == 'a' ? 3 : line[0] == 'f' ? 1 : 0;
  if (line[0] == '#') return 1;
  if (!nums && line[0] != 's') p = line;
  for (int i = 0; i < nums;
       i++) { /* a number of 64 bits: digits only ("-1" read as 2^64 - 1, 2^64 and up as 2^64 - 1) */
    p += strspn(p, " \t");
    if (!isdigit((unsigned char)*p)) return 0;
    char *end;
    errno = 0;
    (void)strtoull(p, &end, 10);
    if (errno == ERANGE) return 0;
    p = end;
    if (*p && !strchr(" \t\r\n", *p)) return 0;
  }
  return p[strspn(p, " \t\r\n")] == 0;
}

static int replay_one(const char *path, const gml_open_opts *oo, trace_result *res, int check_every, int steps,
                      long plan, int json) {
  gzFile f = gzopen(path, "rb");
  if (!f) {
    fprintf(stderr, "gmlake-replay: cannot open %s\n", path);
    return 1;
  }
  gzbuffer(f, 1 << 20);
  gml_client *c;
  int rc = gml_open(oo, &c);
  if (rc) {
    fprintf(stderr, "gmlake-replay: gml_open: %s%s\n", gml_strerror(rc),
            rc == GML_ENODEV && oo->mode == GML_MODE_DAEMON ? " (--device N names the daemon's device)" : "");
    gzclose(f);
    return 1;
  }
  memset(res, 0, sizeof *res);
  res->trace = path;
  size_t nlat_a = 0, nlat_f = 0, lat_cap = 1 << 16;
  id_table live = {calloc(1 << 16, sizeof *live.slot), 1 << 16, 0};
  uint64_t *lat_a = malloc(lat_cap * sizeof *lat_a), *lat_f = malloc(lat_cap * sizeof *lat_f);
  if (!live.slot || !lat_a || !lat_f) {
    fprintf(stderr, "gmlake-replay: %s: out of memory for the replay's tables\n", path);
    free(live.slot), free(lat_a), free(lat_f);
    gml_close(c);
    gzclose(f);
    return 1;
  }
  uint64_t allocated = 0, total_ns = 0;
  char line[512];
  int failed = 0;
  step_sample *samples = NULL;
  size_t nsamples = 0, samples_cap = 0, *marks = NULL, nmarks = 0;
  replay_event *evs = NULL, ev = {0};            /* --plan: the events, as samples are */
  int collect = steps || plan != REPLAY_NO_PLAN; /* samples and step marks */
  gml_stats st;
  gml_stats_get(c, &st);
  uint64_t wall0 = gmli_now_ns();
  size_t lineno = 0, events = 0;
  int cont = 0; /* this read is the rest of a line longer than the buffer (a long comment) */
  for (;;) {
    memset(line, 1, sizeof line); /* behind gzgets' terminator: a NUL before it is one of the line's */
    if (!gzgets(f, line, sizeof line)) break;
    int rest = cont;
    size_t len = strlen(line), end = sizeof line - 1;
    while (end > len && line[end] != 0) end--;
    if (end > len) { /* a NUL byte in the line: strlen saw part of it, the rest was taken for the next read */
      fprintf(stderr, "gmlake-replay: %s is not a trace: line %zu has a NUL byte\n", path, lineno + 1);
      failed = 1;
      break;
    }
    cont = len && line[len - 1] != '\n';
    if (rest) continue;
    lineno++;
    if (!trace_line_ok(line)) {
      char shown[81]; /* printable: the file may be binary */
      size_t n = 0;
      for (; n < 80 && line[n] && line[n] != '\n' && line[n] != '\r'; n++)
        shown[n] = isprint((unsigned char)line[n]) ? line[n] : '?';
      shown[n] = 0;
      fprintf(stderr,
              "gmlake-replay: %s is not a trace: line %zu is \"%s\" (a trace has lines 'a ID SIZE STREAM', 'f ID', "
              "'s' and '# ...')\n",
              path, lineno, shown);
      failed = 1;
      break;
    }
    events += line[0] == 'a' || line[0] == 'f';
    if (line[0] == '#') {
      if (strstr(line, "torch_default")) {
        res->torch_default_reserved = header_num(line, "peak_reserved=");
        res->torch_default_allocated = header_num(line, "peak_allocated=");
      } else if (strstr(line, "torch_expandable")) {
        res->torch_expandable_reserved = header_num(line, "peak_reserved=");
        res->torch_expandable_allocated = header_num(line, "peak_allocated=");
      }
      continue;
    }
    unsigned long long id, size, stream;
    if (line[0] == 's' && collect) { /* a training step begins after the events so far */
      size_t *m = realloc(marks, (nmarks + 1) * sizeof *m);
      if (!m) {
        fprintf(stderr, "gmlake-replay: out of memory for step marks\n");
        failed = 1;
        break;
      }
      marks = m;
      marks[nmarks++] = nsamples;
      continue;
    }
    if (line[0] == 'a' && sscanf(line + 1, "%llu %llu %llu", &id, &size, &stream) == 3) {
      live_slot *e = id_slot(&live, id, lineno);
      if (!e) {
        fprintf(stderr, "gmlake-replay: %s: out of memory for the ids at line %zu (%zu ids)\n", path, lineno,
                live.used);
        failed = 1;
        break;
      }
      if (e->ptr) {
        fprintf(stderr, "gmlake-replay: %s is not a trace: line %zu allocates id %llu, live since line %zu\n", path,
                lineno, id, e->line);
        failed = 1;
        break;
      }
      if (nlat_a == lat_cap || nlat_f == lat_cap) {
        uint64_t *na = lat_cap <= SIZE_MAX / 2 / sizeof *na ? realloc(lat_a, lat_cap * 2 * sizeof *na) : NULL;
        if (na) lat_a = na;
        uint64_t *nf = na ? realloc(lat_f, lat_cap * 2 * sizeof *nf) : NULL;
        if (nf) lat_f = nf;
        if (!nf) {
          fprintf(stderr, "gmlake-replay: %s: out of memory for the latencies at line %zu\n", path, lineno);
          failed = 1;
          break;
        }
        lat_cap *= 2;
      }
      gml_stream s = gmli_backend_caps_named(st.backend) & GML_BACKEND_DRIVER_STREAMS ? 0 : (gml_stream)stream;
      void *p;
      uint64_t t0 = gmli_now_ns();
      rc = gml_alloc(c, size, s, &p);
      uint64_t dt = gmli_now_ns() - t0;
      if (rc) {
        fprintf(stderr, "gmlake-replay: %s: alloc %llu of %llu bytes failed: %s (%s)\n", path, id, size,
                gml_strerror(rc), gml_last_error(c));
        failed = 1;
        break;
      }
      lat_a[nlat_a++] = dt;
      total_ns += dt;
      e->ptr = p;
      e->size = size;
      e->line = lineno;
      e->event = nsamples, ev = (replay_event){.size = size, .stream = stream, .is_alloc = 1};
      if (verify_tag(c, p, size, id, 1)) {
        failed = 1;
        break;
      }
      allocated += size;
      res->allocs++;
      if (allocated > res->peak_allocated) res->peak_allocated = allocated;
    } else if (line[0] == 'f' && sscanf(line + 1, "%llu", &id) == 1) {
      live_slot *e = id_find(&live, id);
      if (!e->ptr) {
        if (e->line)
          fprintf(stderr, "gmlake-replay: %s is not a trace: line %zu frees id %llu, freed already at line %zu\n", path,
                  lineno, id, e->line);
        else
          fprintf(stderr, "gmlake-replay: %s is not a trace: line %zu frees id %llu, never allocated\n", path, lineno,
                  id);
        failed = 1;
        break;
      }
      if (verify_tag(c, e->ptr, e->size, id, 0)) {
        failed = 1;
        break;
      }
      uint64_t t0 = gmli_now_ns();
      rc = gml_free(c, e->ptr);
      uint64_t dt = gmli_now_ns() - t0;
      if (rc) {
        fprintf(stderr, "gmlake-replay: free %llu failed: %s\n", id, gml_strerror(rc));
        failed = 1;
        break;
      }
      lat_f[nlat_f++] = dt;
      total_ns += dt;
      allocated -= e->size;
      ev = (replay_event){.alloc_event = e->event};
      e->ptr = NULL;
      e->line = lineno;
      res->frees++;
    }
    if (collect && (line[0] == 'a' || line[0] == 'f')) {
      if (nsamples == samples_cap) {
        size_t cap2 = samples_cap ? samples_cap * 2 : 1 << 16;
        step_sample *v = realloc(samples, cap2 * sizeof *v);
        if (v) samples = v;
        replay_event *ve = v && plan != REPLAY_NO_PLAN ? realloc(evs, cap2 * sizeof *ve) : NULL;
        if (ve) evs = ve;
        if (!v || (plan != REPLAY_NO_PLAN && !ve)) {
          fprintf(stderr, "gmlake-replay: out of memory for --steps samples\n");
          failed = 1;
          break;
        }
        samples_cap = cap2;
      }
      gml_stats s4;
      gml_stats_get(c, &s4);
      if (evs) evs[nsamples] = ev;
      samples[nsamples++] = (step_sample){allocated, s4.maps,          s4.unmaps,          s4.access_calls,
                                          s4.syncs,  s4.mapped_allocs, s4.headroom_leased, s4.chunks_leased};
    }
    if ((res->allocs + res->frees) % 10000 == 0 && gmli_env(GML_ENV_REPLAY_PROGRESS)) {
      gml_stats s3;
      gml_stats_get(c, &s3);
      fprintf(stderr, "  ops %llu maps %llu unmaps %llu reserved %.2f GiB\n",
              (unsigned long long)(res->allocs + res->frees), (unsigned long long)s3.maps,
              (unsigned long long)s3.unmaps, s3.reserved / (double)GML_GIB);
    }
    if (check_every && (res->allocs + res->frees) % (uint64_t)check_every == 0) {
      gml_stats s2;
      gml_stats_get(c, &s2);
      if (s2.allocated < allocated) {
        fprintf(stderr, "gmlake-replay: accounting: allocator says %llu allocated, trace says >= %llu\n",
                (unsigned long long)s2.allocated, (unsigned long long)allocated);
        failed = 1;
        break;
      }
    }
  }
  int zerr = 0;
  const char *zmsg = gzerror(f, &zerr);
  if (!failed && zerr && zerr != Z_STREAM_END) {
    fprintf(stderr, "gmlake-replay: %s: read error after line %zu: %s\n", path, lineno, zmsg);
    failed = 1;
  } else if (!failed && !events) {
    fprintf(stderr, "gmlake-replay: %s is not a trace: no allocation or free in its %zu line(s)\n", path, lineno);
    failed = 1;
  }
  res->wall_s = (double)(gmli_now_ns() - wall0) / 1e9;
  gml_stats_get(c, &st);
  res->peak_reserved = st.peak_reserved;
  res->frag = res->peak_reserved ? 1.0 - (double)res->peak_allocated / (double)res->peak_reserved : 0;
  res->ops_per_s = total_ns ? (double)(res->allocs + res->frees) / ((double)total_ns / 1e9) : 0;
  res->alloc_p50 = gmli_percentile_u64(lat_a, nlat_a, 50);
  res->alloc_p99 = gmli_percentile_u64(lat_a, nlat_a, 99);
  res->free_p50 = gmli_percentile_u64(lat_f, nlat_f, 50);
  res->free_p99 = gmli_percentile_u64(lat_f, nlat_f, 99);
  res->maps = st.maps;
  res->unmaps = st.unmaps;
  res->chunks_leased = st.chunks_leased;
  res->chunk_size = st.chunk_size;
  res->mode = st.mode;
  res->backend = st.backend;
  const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  if (steps && !failed) failed = print_steps(name, samples, nsamples, marks, nmarks);
  if (plan != REPLAY_NO_PLAN && !failed) failed = replay_plan(name, evs, samples, nsamples, marks, nmarks, plan, json);
  if (plan != REPLAY_NO_PLAN && !failed)
    failed = replay_planned(name, evs, samples, nsamples, marks, nmarks, plan, json, oo, check_every);
  free(samples), free(evs);
  free(marks);
  for (size_t i = 0; i < live.cap; i++)
    if (live.slot[i].ptr) gml_free(c, live.slot[i].ptr);
  free(live.slot), free(lat_a), free(lat_f);
  gml_close(c);
  gzclose(f);
  return failed;
}

/* Write the allocation id into its first and last 8 bytes (write=1) or
 * check they are still there (write=0): two live blocks that overlap would
 * overwrite each other's tags. gml_write/gml_read work on both backends. */
static int verify_tag(gml_client *c, void *p, uint64_t size, uint64_t id, int write) {
  uint64_t tag = id * 0x9E3779B97F4A7C15ull + 1, got[2] = {0, 0};
  size_t head = size >= 8 ? 8 : size;
  char *tail = (char *)p + (size >= 16 ? size - 8 : 0);
  int rc;
  if (write) {
    rc = gml_write(c, p, &tag, head);
    if (!rc && size >= 16) rc = gml_write(c, tail, &tag, 8);
    if (rc) fprintf(stderr, "gmlake-replay: writing block %llu: %s\n", (unsigned long long)id, gml_strerror(rc));
    return rc != 0;
  }
  rc = gml_read(c, &got[0], p, head);
  if (!rc && size >= 16) rc = gml_read(c, &got[1], tail, 8);
  uint64_t want0 = 0;
  memcpy(&want0, &tag, head);
  if (rc || got[0] != want0 || (size >= 16 && got[1] != tag)) {
    fprintf(stderr, "gmlake-replay: block %llu at %p was overwritten: overlapping blocks\n", (unsigned long long)id, p);
    return 1;
  }
  return 0;
}

static void usage(void) {
  fprintf(
      stderr,
      "usage: gmlake-replay [--backend auto|host|cuda] [--daemon SOCKET [--device N]] [--json] [--check N] [--steps]\n"
      "                     [--plan[=STEP]] [--guard[=end|both]] [--guard-grain BYTES] TRACE...\n"
      "  Replays allocation traces through libgmlake-client and prints peak allocated,\n"
      "  peak reserved, fragmentation at peak (beside PyTorch's from the trace header)\n"
      "  and allocator latency. Embedded unless --daemon is given.\n"
      "  --device N: the device the client opens (default 0): the daemon's (gmlaked --device N).\n"
      "  --steps: cut the trace into training steps and print the driver calls\n"
      "  (maps, unmaps, set-access, syncs) each step made, with a modelled cost.\n"
      "  --plan[=STEP]: cut it into steps and serve them from a placement planned\n"
      "  from step STEP (default: the first that repeats, rebuilt when another\n"
      "  repeats); prints per step max live, the planned range, hits and misses.\n"
      "  --guard[=end|both]: guard mode (every block's end abuts an inaccessible guard;\n"
      "  a false report would kill the replay); prints its memory overhead.\n"
      "  --guard-grain BYTES: guards of that size (a multiple of the chunk, or of the\n"
      "  host's page: --guard-grain 2MiB shows on the host what cuda's whole-chunk guards cost).\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"backend", required_argument, 0, 'b'},
                                       {"daemon", required_argument, 0, 'd'},
                                       {"json", no_argument, 0, 'j'},
                                       {"check", required_argument, 0, 'c'},
                                       {"help", no_argument, 0, 'h'},
                                       {"steps", no_argument, 0, 's'},
                                       {"guard", optional_argument, 0, 'g'},
                                       {"guard-grain", required_argument, 0, 'G'},
                                       {"device", required_argument, 0, 'D'},
                                       {"plan", optional_argument, 0, 'P'},
                                       {0, 0, 0, 0}};
  gml_open_opts oo = {0};
  oo.backend = "host";
  oo.mode = GML_MODE_EMBEDDED;
  int json = 0, check_every = 0, steps = 0, ch;
  long plan = REPLAY_NO_PLAN;
  uint64_t grain = 0;
  while ((ch = getopt_long(argc, argv, "b:d:jc:hs", opts, NULL)) != -1) {
    switch (ch) {
    case 'g':
      if (!optarg || !strcmp(optarg, "end") || !strcmp(optarg, "1")) oo.guard = GML_GUARD_END;
      else if (!strcmp(optarg, "both")) oo.guard = GML_GUARD_BOTH;
      else {
        usage();
        return 2;
      }
      break;
    case 'G':
      if (gmli_parse_size(optarg, 0, &grain) || !grain) {
        fprintf(stderr, "gmlake-replay: --guard-grain %s: a size was expected\n", optarg);
        return 2;
      }
      oo.guard_grain = (size_t)grain;
      break;
    case 'D': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (end == optarg || *end || v < 0 || v > 1023) {
        fprintf(stderr, "gmlake-replay: --device %s: a device index from 0 to 1023 was expected\n", optarg);
        return 2;
      }
      oo.device = (int)v;
      break;
    }
    case 'b': oo.backend = optarg; break;
    case 'd': oo.socket_path = optarg, oo.mode = GML_MODE_DAEMON; break;
    case 'j': json = 1; break;
    case 'c': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (end == optarg || *end || v < 0 || v > INT32_MAX) {
        fprintf(stderr, "gmlake-replay: --check %s: a count of operations (0: off) was expected\n", optarg);
        return 2;
      }
      check_every = (int)v;
      break;
    }
    case 's': steps = 1; break;
    case 'P': {
      char *end = NULL;
      plan = optarg ? strtol(optarg, &end, 10) : -1;
      if (optarg && (end == optarg || *end || plan < 0 || plan > INT32_MAX)) {
        fprintf(stderr, "gmlake-replay: --plan=%s: a step number (from 0) was expected\n", optarg);
        return 2;
      }
      break;
    }
    case 'h': usage(); return 0;
    default: usage(); return 2;
    }
  }
  if (optind >= argc) {
    usage();
    return 2;
  }
  if (oo.mode == GML_MODE_DAEMON) oo.backend = "auto";
  int failed = 0;
  char grain_desc[64] = "finest guards (host: pages)";
  if (oo.guard_grain) snprintf(grain_desc, sizeof grain_desc, "%zu-byte guards", oo.guard_grain);
  if (!json)
    printf("%-22s %9s %9s %6s | %9s %6s | %9s %6s | %9s %7s %7s %7s %7s %6s\n", "trace", "peak_alloc", "reserved",
           "frag", "torch_def", "frag", "torch_exp", "frag", "ops/s", "a_p50", "a_p99", "f_p50", "f_p99", "maps");
  for (int i = optind; i < argc; i++) {
    trace_result r;
    if (replay_one(argv[i], &oo, &r, check_every, steps, plan, json)) {
      failed = 1;
      continue;
    }
    const char *name = strrchr(r.trace, '/') ? strrchr(r.trace, '/') + 1 : r.trace;
    double fd =
        r.torch_default_reserved ? 1.0 - (double)r.torch_default_allocated / (double)r.torch_default_reserved : 0;
    double fe = r.torch_expandable_reserved
                    ? 1.0 - (double)r.torch_expandable_allocated / (double)r.torch_expandable_reserved
                    : 0;
    if (json) {
      printf("{\"trace\":");
      gmli_print_json_string(stdout, name); /* gmlakectl's JSON strings: " \\ and controls escaped */
      printf(",\"backend\":\"%s\",\"mode\":\"%s\",\"peak_allocated\":%llu,\"peak_reserved\":%llu,"
             "\"frag\":%.6f,\"torch_default_reserved\":%llu,\"torch_expandable_reserved\":%llu,\"ops_per_s\":%.0f,"
             "\"alloc_p50_ns\":%.0f,\"alloc_p99_ns\":%.0f,\"free_p50_ns\":%.0f,\"free_p99_ns\":%.0f,\"allocs\":%llu,"
             "\"frees\":%llu,\"maps\":%llu,\"unmaps\":%llu,\"chunks_leased\":%llu,\"wall_s\":%.3f,\"guard\":%d}\n",
             r.backend, r.mode == GML_MODE_DAEMON ? "daemon" : "embedded", (unsigned long long)r.peak_allocated,
             (unsigned long long)r.peak_reserved, r.frag, (unsigned long long)r.torch_default_reserved,
             (unsigned long long)r.torch_expandable_reserved, r.ops_per_s, r.alloc_p50, r.alloc_p99, r.free_p50,
             r.free_p99, (unsigned long long)r.allocs, (unsigned long long)r.frees, (unsigned long long)r.maps,
             (unsigned long long)r.unmaps, (unsigned long long)r.chunks_leased, r.wall_s, oo.guard > 0 ? oo.guard : 0);
    } else {
      printf(
          "%-22s %8.2fG %8.2fG %5.1f%% | %8.2fG %5.1f%% | %8.2fG %5.1f%% | %9.0f %6.0fn %6.0fn %6.0fn %6.0fn %6llu\n",
          name, r.peak_allocated / (double)GML_GIB, r.peak_reserved / (double)GML_GIB, r.frag * 100,
          r.torch_default_reserved / (double)GML_GIB, fd * 100, r.torch_expandable_reserved / (double)GML_GIB, fe * 100,
          r.ops_per_s, r.alloc_p50, r.alloc_p99, r.free_p50, r.free_p99, (unsigned long long)r.maps);
      if (oo.guard > 0) /* what the guards cost: reserved over what the trace asked for */
        printf("  %s guard (%s, %s): peak reserved %.2f GiB for %.2f GiB allocated: +%.1f%%; %llu chunks leased, %llu "
               "maps, "
               "%llu unmaps\n",
               name, oo.guard == GML_GUARD_BOTH ? "both ends" : "end", grain_desc, r.peak_reserved / (double)GML_GIB,
               r.peak_allocated / (double)GML_GIB,
               r.peak_allocated ? 100.0 * ((double)r.peak_reserved / (double)r.peak_allocated - 1) : 0.0,
               (unsigned long long)r.chunks_leased, (unsigned long long)r.maps, (unsigned long long)r.unmaps);
    }
    fflush(stdout);
  }
  return failed;
}
