/* replay_planned.c: gmlake-replay --plan through the real allocator. The
 * trace, cut into steps as --steps cuts it, is replayed once more by a
 * client opened with planned placement on (GMLAKE_PLAN, through
 * gml_set_option), gml_step marking each step's end, as the PyTorch layer
 * marks optimizer steps. Prints per step the max live bytes, the highest
 * reserved, the driver calls (maps, unmaps) and the plan's hits and misses;
 * overall, from the step the plan first served on, reserved at its highest
 * against the highest max live, and the maps of the steps after that first
 * one. Every block carries its id in its first and last bytes (checked at its
 * free: overlapping blocks would overwrite them), and with --check N the
 * allocator's invariants (no planned slot handed out while something lives
 * in it among them) are checked every N events. */
#include "alloc.h"
#include "client_priv.h"
#include "gmlake.h"
#include "replay.h"
#include "statsview.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct planned_row {
  uint64_t max_live, reserved, maps, unmaps, hits, misses, plans;
} planned_row;

static int tag_io(gml_client *c, void *p, uint64_t size, uint64_t id, int write) {
  uint64_t tag = id * 0x9E3779B97F4A7C15ull + 1, got = 0;
  size_t n = size >= 8 ? 8 : size;
  char *tail = (char *)p + (size >= 16 ? size - 8 : 0);
  if (write) return gml_write(c, p, &tag, n) || gml_write(c, tail, &tag, n);
  uint64_t want = 0, got2 = 0;
  memcpy(&want, &tag, n);
  if (gml_read(c, &got, p, n) || gml_read(c, &got2, tail, n)) return 1;
  return got != want || got2 != want;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0; }

/* Replays events [0, ends[nsteps - 1]) on c, a gml_step after each step; rows per step. */
static int replay_steps_on(gml_client *c, const replay_event *ev, const step_sample *v, const size_t *ends,
                           size_t nsteps, int check_every, planned_row *rows) {
  size_t n = ends[nsteps - 1];
  void **ptr = calloc(n ? n : 1, sizeof *ptr);
  if (!ptr) return 1;
  gml_stats st;
  gml_stats_get(c, &st);
  int driver_streams = (gmli_backend_caps_named(st.backend) & GML_BACKEND_DRIVER_STREAMS) != 0, bad = 0;
  for (size_t s = 0, i = 0; s < nsteps && !bad; s++) {
    planned_row *r = &rows[s];
    gml_stats s0;
    gml_stats_get(c, &s0);
    for (; i < ends[s] && !bad; i++) {
      if (ev[i].is_alloc) {
        int rc = gml_alloc(c, ev[i].size, driver_streams ? 0 : (gml_stream)ev[i].stream, &ptr[i]);
        if (rc) {
          fprintf(stderr, "gmlake-replay: --plan through the allocator: event %zu, alloc of %llu bytes: %s (%s)\n", i,
                  (unsigned long long)ev[i].size, gml_strerror(rc), gml_last_error(c));
          bad = 1;
          break;
        }
        bad = tag_io(c, ptr[i], ev[i].size, i, 1);
        gml_stats_get(c, &st);
        r->reserved = st.reserved > r->reserved ? st.reserved : r->reserved;
      } else {
        size_t k = ev[i].alloc_event;
        if (tag_io(c, ptr[k], ev[k].size, k, 0)) {
          fprintf(stderr,
                  "gmlake-replay: --plan through the allocator: block of event %zu at %p overwritten: "
                  "overlapping blocks\n",
                  k, ptr[k]);
          bad = 1;
          break;
        }
        gml_free(c, ptr[k]);
        ptr[k] = NULL;
      }
      r->max_live = v[i].live > r->max_live ? v[i].live : r->max_live;
      if (check_every && (i + 1) % (size_t)check_every == 0 && gmli_alloc_check(&c->alloc)) {
        fprintf(stderr, "gmlake-replay: --plan through the allocator: event %zu: invariant broken: %s\n", i,
                c->alloc.last_error);
        bad = 1;
      }
    }
    gml_stats_get(c, &st);
    r->maps = st.maps - s0.maps, r->unmaps = st.unmaps - s0.unmaps, r->hits = st.plan_hits - s0.plan_hits;
    r->misses = st.plan_misses - s0.plan_misses;
    if (gml_step(c)) bad = 1;
    gml_stats_get(c, &st);
    r->plans = st.plans_taken;
  }
  if (!bad && gmli_alloc_check(&c->alloc)) {
    fprintf(stderr, "gmlake-replay: --plan through the allocator: invariant broken at the end: %s\n",
            c->alloc.last_error);
    bad = 1;
  }
  for (size_t i = 0; i < n; i++)
    if (ptr[i]) gml_free(c, ptr[i]);
  free(ptr);
  return bad;
}

int replay_planned(const char *name, const replay_event *ev, const step_sample *v, size_t n, const size_t *marks,
                   size_t nmarks, long plan_step, int json, const gml_open_opts *oo, int check_every) {
  if (!n) return 0;
  size_t *ends = malloc(n * sizeof *ends);
  planned_row *rows = calloc(n, sizeof *rows);
  uint64_t floor;
  size_t nsteps = ends && rows ? replay_step_ends(v, n, marks, nmarks, ends, &floor) : 0;
  char at[32] = "1";
  if (plan_step >= 0) snprintf(at, sizeof at, "at:%ld", plan_step);
  gml_client *c = NULL;
  int rc = nsteps ? gml_set_option("GMLAKE_PLAN", at) : GML_ENOMEM;
  if (!rc) rc = gml_open(oo, &c);
  gml_set_option("GMLAKE_PLAN", NULL);
  if (rc || replay_steps_on(c, ev, v, ends, nsteps, check_every, rows)) {
    if (rc) fprintf(stderr, "gmlake-replay: %s: --plan through the allocator: %s\n", name, gml_strerror(rc));
    if (c) gml_close(c);
    free(ends), free(rows);
    return 1;
  }
  /* the plan serves from the step after the one it was taken at */
  size_t first = nsteps;
  for (size_t s = 1; s < nsteps && first == nsteps; s++)
    if (rows[s - 1].plans && rows[s].hits) first = s;
  uint64_t peak = 0, live = 0, maps_after = 0, unmaps_after = 0, misses = 0;
  for (size_t s = first; s < nsteps; s++) {
    peak = rows[s].reserved > peak ? rows[s].reserved : peak;
    live = rows[s].max_live > live ? rows[s].max_live : live;
    misses += rows[s].misses;
    if (s > first) maps_after += rows[s].maps, unmaps_after += rows[s].unmaps;
  }
  gml_stats st;
  gml_stats_get(c, &st);
  if (json) {
    printf("{\"trace\":");
    gmli_print_json_string(stdout, name);
    printf(",\"planned_steps\":[");
    for (size_t s = 0; s < nsteps; s++)
      printf("%s{\"step\":%zu,\"max_live\":%llu,\"reserved\":%llu,\"maps\":%llu,\"unmaps\":%llu,\"hits\":%llu,"
             "\"misses\":%llu}",
             s ? "," : "", s, (unsigned long long)rows[s].max_live, (unsigned long long)rows[s].reserved,
             (unsigned long long)rows[s].maps, (unsigned long long)rows[s].unmaps, (unsigned long long)rows[s].hits,
             (unsigned long long)rows[s].misses);
    printf("],\"planned_first_step\":%ld,\"planned_reserved\":%llu,\"planned_max_live\":%llu,"
           "\"planned_reserved_over_max_live\":%.6f,\"planned_maps_after\":%llu,\"planned_unmaps_after\":%llu,"
           "\"planned_misses\":%llu,\"plans_taken\":%llu,\"plan_hits\":%llu}\n",
           first < nsteps ? (long)first : -1L, (unsigned long long)peak, (unsigned long long)live, ratio(peak, live),
           (unsigned long long)maps_after, (unsigned long long)unmaps_after, (unsigned long long)misses,
           (unsigned long long)st.plans_taken, (unsigned long long)st.plan_hits);
  } else {
    printf("%s: plan served by the allocator (GMLAKE_PLAN=%s, gml_step at each step's end)\n", name, at);
    printf("  %4s %9s %9s %7s %6s %6s %6s %6s\n", "step", "max_live", "reserved", "res/liv", "maps", "unmaps", "hits",
           "misses");
    for (size_t s = 0; s < nsteps; s++)
      printf("  %4zu %8.3fG %8.3fG %7.4f %6llu %6llu %6llu %6llu%s\n", s, rows[s].max_live / (double)GML_GIB,
             rows[s].reserved / (double)GML_GIB, ratio(rows[s].reserved, rows[s].max_live),
             (unsigned long long)rows[s].maps, (unsigned long long)rows[s].unmaps, (unsigned long long)rows[s].hits,
             (unsigned long long)rows[s].misses, s == first ? "  <- the plan serves from here" : "");
    if (first < nsteps)
      printf("  %s: from step %zu on: reserved %.3f GiB at its highest, max live %.3f GiB: x%.4f; maps after step %zu: "
             "%llu, unmaps %llu; %llu misses; %llu plan(s) taken\n",
             name, first, peak / (double)GML_GIB, live / (double)GML_GIB, ratio(peak, live), first,
             (unsigned long long)maps_after, (unsigned long long)unmaps_after, (unsigned long long)misses,
             (unsigned long long)st.plans_taken);
    else printf("  %s: no step was served from a plan\n", name);
  }
  gml_close(c);
  free(ends), free(rows);
  return 0;
}
