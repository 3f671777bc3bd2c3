/* replay.h: what gmlake-replay's files share: the per-event samples a
 * replay keeps, the cut of a trace into training steps (replay_steps.c,
 * used by --steps and --plan) and the planned-placement replay
 * (replay_plan.c, --plan). */
#ifndef GML_REPLAY_H
#define GML_REPLAY_H
#include <stddef.h>
#include <stdint.h>

/* --steps: per-event counters, cut into training steps afterwards. */
typedef struct step_sample {
  uint64_t live, maps, unmaps, access, syncs, mapping, headroom, leased;
} step_sample;

/* --plan: one event of the trace. */
typedef struct replay_event {
  uint64_t size, stream; /* an allocation's */
  size_t alloc_event;    /* a free's allocation: the index of its event */
  int is_alloc;
} replay_event;

/* replay_steps.c */
/* Where each step ends (the index one past its last event) into ends (n
 * entries at most); returns how many steps. *floor: live bytes between steps. */
size_t replay_step_ends(const step_sample *v, size_t n, const size_t *marks, size_t nmarks, size_t *ends,
                        uint64_t *floor);
int print_steps(const char *name, const step_sample *v, size_t n, const size_t *marks, size_t nmarks);

/* replay_plan.c */
#define REPLAY_NO_PLAN (-2L) /* replay_plan's plan_step when --plan is not given */
/* Replays the events with a plan taken from step plan_step (< 0: the first
 * step that repeats, rebuilt when a new pattern repeats); prints per step and
 * overall, as JSON where json is set. */
int replay_plan(const char *name, const replay_event *ev, const step_sample *v, size_t n, const size_t *marks,
                size_t nmarks, long plan_step, int json);

/* replay_planned.c: the same steps replayed through the allocator with planned placement on (a client of
 * oo's, gml_step at each step's end; with check_every, its invariants checked every that many events). */
struct gml_open_opts;
int replay_planned(const char *name, const replay_event *ev, const step_sample *v, size_t n, const size_t *marks,
                   size_t nmarks, long plan_step, int json, const struct gml_open_opts *oo, int check_every);

#endif
