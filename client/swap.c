/* swap.c: the swap planner (AutoSwap, issue 29): which saved tensors go to
 * host memory and when, so that a recorded iteration's peak fits a cap with
 * the fewest bytes moved. include/gmlake.h (gml_swap_plan_build) says what it
 * decides; here is how. Pure C with no client or allocator in it:
 * tests/test_swap.c checks it alone against an exhaustive search.
 *
 * The model. Events are the iteration's saves and reads in order; live[e] is
 * the most bytes allocated from event e - 1 to e. A moved tensor frees its
 * bytes in the events strictly between gone_at (the first event whose time is
 * past its copy out) and in_at (the event that starts its copy back, the
 * latest whose time leaves the copy room to land before the read). So moving
 * it lowers live[] by its bytes over one run of events, its window, and
 * moving more only lowers live[] further: a covering problem (each event over
 * the cap needs windows covering its excess). The fewest bytes is NP-hard in
 * general (it holds knapsack), so: a greedy plan by AutoSwap's priorities
 * (relief where the excess is largest; a tensor that covers it without
 * overshooting, the largest, then the longest idle; else the smallest that
 * covers it), redundant moves dropped, then a branch and bound seeded with
 * it. Bound: any plan moves at least the largest remaining excess of one
 * event, as a tensor lowers an event by at most its own bytes; branching: the
 * event with the largest excess is covered by one of its undecided tensors,
 * the k-th branch taking the k-th and leaving out those before it, so no set
 * is visited twice. Windows are computed per tensor alone for the choice
 * (the widest each can have); the chosen set is then scheduled through one
 * copy queue per direction in order (outs by save, ins by read, backwards:
 * each copy back lands before the read and before the next copy back must
 * start), which can only narrow windows; where that breaks the cap, more
 * tensors are added and the queues scheduled again, a few rounds at most. */
#include "gmlake.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SWAP_DEFAULT_WORK 10000000 /* default search budget: nodes x (candidates + over-cap events), ~0.3 s */
#define SWAP_ROUNDS 16             /* queue scheduling rounds before the plan is reported as it stands */

typedef struct cand {
  uint32_t t; /* index of the tensor */
  uint64_t bytes;
  uint32_t o, p; /* window: memory gone in events o+1 .. p-1 (alone: the widest) */
  uint32_t a, b; /* the over-cap events it covers: indices [a, b) of viol[] */
  uint64_t out_ns, in_ns, idle_ns;
} cand;

typedef struct planner {
  const gml_swap_input *in;
  uint32_t *viol; /* events whose live[] is over the cap, ascending */
  uint32_t nviol;
  int64_t *need; /* per over-cap event: bytes still over the cap (<= 0: fits) */
  cand *c;
  uint32_t nc;
  uint8_t *state; /* per candidate: 0 undecided, 1 moved, 2 left out (search) */
  uint8_t *best;
  uint64_t cur_bytes, best_bytes;
  int64_t nodes, max_nodes;
  int aborted;
} planner;

static uint64_t copy_ns(uint64_t bytes, double bps) { /* rounded up, at least 1 (no libm: the library links none) */
  double ns = (double)bytes / bps * 1e9;
  if (ns > 1e18) return (uint64_t)1e18;
  uint64_t n = (uint64_t)ns;
  n += (double)n < ns;
  return n ? n : 1;
}

/* The first event after s whose time is done or later; u when none comes before u. */
static uint32_t first_at_or_after(const gml_swap_input *in, uint32_t s, uint32_t u, uint64_t done) {
  uint32_t e = s + 1;
  while (e < u && in->time_ns[e] < done) e++;
  return e;
}
/* The last event before u (and after lo) whose time is at most start; lo when none. */
static uint32_t last_at_or_before(const gml_swap_input *in, uint32_t lo, uint32_t u, uint64_t start, int fits) {
  uint32_t e = u;
  if (!fits) return lo;
  while (e > lo + 1 && in->time_ns[e - 1] > start) e--;
  return e - 1 > lo ? e - 1 : lo;
}
static uint32_t lower_bound(const uint32_t *v, uint32_t n, uint32_t x) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    uint32_t m = lo + (hi - lo) / 2;
    if (v[m] < x) lo = m + 1;
    else hi = m;
  }
  return lo;
}
static void set_cover(planner *s, cand *k) {
  k->a = lower_bound(s->viol, s->nviol, k->o + 1);
  k->b = k->p > k->o + 1 ? lower_bound(s->viol, s->nviol, k->p) : k->a;
  if (k->b < k->a) k->b = k->a;
}

static void apply(planner *s, const cand *k, int64_t sign) {
  for (uint32_t v = k->a; v < k->b; v++) s->need[v] -= sign * (int64_t)k->bytes;
  s->cur_bytes += sign > 0 ? k->bytes : -k->bytes;
}

/* The over-cap event with the most bytes still over (-1: none). */
static int64_t worst_event(const planner *s, int64_t *worst) {
  int64_t w = -1;
  *worst = 0;
  for (uint32_t v = 0; v < s->nviol; v++)
    if (s->need[v] > *worst) *worst = s->need[v], w = v;
  return w;
}

/* AutoSwap's order for relieving an event short of need bytes: a tensor that
 * does not overshoot, the largest first, then the longest idle; then those
 * that overshoot, the smallest first. */
static int better(const cand *x, const cand *y, int64_t need) {
  int xo = (int64_t)x->bytes > need, yo = (int64_t)y->bytes > need;
  if (xo != yo) return !xo;
  if (x->bytes != y->bytes) return xo ? x->bytes < y->bytes : x->bytes > y->bytes;
  if (x->idle_ns != y->idle_ns) return x->idle_ns > y->idle_ns;
  return x->t < y->t;
}

typedef struct order_ctx {
  const cand *c;
  int64_t need;
} order_ctx;
static int cmp_better(const void *x, const void *y, void *ctx) {
  const order_ctx *k = ctx;
  const cand *a = &k->c[*(const uint32_t *)x], *b = &k->c[*(const uint32_t *)y];
  return better(a, b, k->need) ? -1 : better(b, a, k->need) ? 1 : 0;
}

/* Undecided candidates covering over-cap event w into list, best first; their bytes summed into *sum. */
static uint32_t covering(const planner *s, uint32_t w, uint32_t *list, uint64_t *sum) {
  uint32_t n = 0;
  *sum = 0;
  for (uint32_t i = 0; i < s->nc; i++)
    if (!s->state[i] && s->c[i].a <= w && w < s->c[i].b) list[n++] = i, *sum += s->c[i].bytes;
  order_ctx ctx = {s->c, s->need[w]};
  qsort_r(list, n, sizeof *list, cmp_better, &ctx);
  return n;
}

/* Greedy: relieve the worst event with the best tensor until every event fits; 0, or -1 when one cannot. */
static int greedy(planner *s, uint32_t *list) {
  int64_t worst;
  int64_t w;
  while ((w = worst_event(s, &worst)) >= 0) {
    uint64_t sum;
    if (!covering(s, (uint32_t)w, list, &sum)) return -1;
    s->state[list[0]] = 1;
    apply(s, &s->c[list[0]], 1);
  }
  return 0;
}

/* Drop moves that the others make redundant, the largest first. */
static void prune(planner *s) {
  for (;;) {
    int64_t drop = -1;
    for (uint32_t i = 0; i < s->nc; i++) {
      if (s->state[i] != 1 || (drop >= 0 && s->c[i].bytes <= s->c[drop].bytes)) continue;
      int ok = 1;
      for (uint32_t v = s->c[i].a; v < s->c[i].b && ok; v++) ok = s->need[v] + (int64_t)s->c[i].bytes <= 0;
      if (ok) drop = i;
    }
    if (drop < 0) return;
    s->state[drop] = 0;
    apply(s, &s->c[drop], -1);
  }
}

static int search(planner *s) {
  if (s->aborted) return 0;
  if (++s->nodes > s->max_nodes) return s->aborted = 1, 0;
  int64_t worst, w = worst_event(s, &worst);
  if (w < 0) {
    if (s->cur_bytes < s->best_bytes) {
      s->best_bytes = s->cur_bytes;
      for (uint32_t i = 0; i < s->nc; i++) s->best[i] = s->state[i] == 1;
    }
    return 0;
  }
  if (s->cur_bytes + (uint64_t)worst >= s->best_bytes) return 0;
  uint32_t *list = malloc((s->nc ? s->nc : 1) * sizeof *list);
  if (!list) return -ENOMEM;
  uint64_t left;
  uint32_t n = covering(s, (uint32_t)w, list, &left);
  int rc = 0;
  uint32_t k = 0;
  for (; k < n && left >= (uint64_t)worst && !rc; k++) {
    cand *x = &s->c[list[k]];
    if (s->cur_bytes + x->bytes < s->best_bytes) {
      s->state[list[k]] = 1;
      apply(s, x, 1);
      rc = search(s);
      apply(s, x, -1);
    }
    s->state[list[k]] = 2; /* the branches after this one leave it out */
    left -= x->bytes;
  }
  for (uint32_t j = 0; j < k; j++) s->state[list[j]] = 0;
  free(list);
  return rc;
}

/* ---- the chosen set through the copy queues ---- */

typedef struct sched {
  uint32_t c;    /* candidate */
  uint32_t o, p; /* its window through the queues (p <= o + 1: none) */
  uint64_t late_ns;
} sched;

typedef struct sort_ctx {
  const gml_swap_input *in;
  const cand *c;
} sort_ctx;

static int cmp_save(const void *x, const void *y, void *ctx) {
  const sort_ctx *k = ctx;
  uint32_t cx = ((const sched *)x)->c, cy = ((const sched *)y)->c;
  uint32_t a = k->in->tensors[k->c[cx].t].saved_at, b = k->in->tensors[k->c[cy].t].saved_at;
  return a != b ? (a < b ? -1 : 1) : (cx < cy ? -1 : cx > cy);
}
static int cmp_use_desc(const void *x, const void *y, void *ctx) {
  const sort_ctx *k = ctx;
  uint32_t cx = ((const sched *)x)->c, cy = ((const sched *)y)->c;
  uint32_t a = k->in->tensors[k->c[cx].t].used_at, b = k->in->tensors[k->c[cy].t].used_at;
  return a != b ? (a > b ? -1 : 1) : (cx > cy ? -1 : cx < cy);
}

/* The moved candidates (state 1) through the queues into q: outs in the
 * order of their saves, each after the one before; ins from the last read
 * backwards, each landing before its read and before the next in starts.
 * Returns how many. */
static uint32_t schedule(const planner *s, sched *q) {
  const gml_swap_input *in = s->in;
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->nc; i++)
    if (s->state[i] == 1) q[n++] = (sched){.c = i};
  sort_ctx ctx = {in, s->c};
  qsort_r(q, n, sizeof *q, cmp_save, &ctx);
  uint64_t busy = 0;
  for (uint32_t j = 0; j < n; j++) {
    const cand *k = &s->c[q[j].c];
    const gml_swap_tensor *t = &in->tensors[k->t];
    uint64_t start = in->time_ns[t->saved_at] > busy ? in->time_ns[t->saved_at] : busy;
    busy = start + k->out_ns;
    q[j].o = first_at_or_after(in, t->saved_at, t->used_at, busy);
  }
  qsort_r(q, n, sizeof *q, cmp_use_desc, &ctx);
  uint64_t next = UINT64_MAX;
  for (uint32_t j = 0; j < n; j++) {
    const cand *k = &s->c[q[j].c];
    const gml_swap_tensor *t = &in->tensors[k->t];
    uint64_t finish = in->time_ns[t->used_at] < next ? in->time_ns[t->used_at] : next;
    int fits = finish >= k->in_ns;
    q[j].p = last_at_or_before(in, q[j].o, t->used_at, fits ? finish - k->in_ns : 0, fits);
    if (q[j].p <= q[j].o + 1) continue; /* no window left: it is dropped, and takes no time in the queue */
    uint64_t lands = in->time_ns[q[j].p] + k->in_ns;
    q[j].late_ns = lands > in->time_ns[t->used_at] ? lands - in->time_ns[t->used_at] : 0;
    next = in->time_ns[q[j].p];
  }
  return n;
}

/* The highest live[] with the scheduled windows' bytes taken off, and where; over[v] (may be NULL): per over-cap
 * event, the bytes still over the cap. diff: nevents + 1 scratch. */
static uint64_t peak_with(const planner *s, const sched *q, uint32_t n, int64_t *diff, uint32_t *at, int64_t *over) {
  const gml_swap_input *in = s->in;
  memset(diff, 0, (in->nevents + 1) * sizeof *diff);
  for (uint32_t j = 0; j < n; j++)
    if (q[j].p > q[j].o + 1) {
      diff[q[j].o + 1] -= (int64_t)s->c[q[j].c].bytes;
      diff[q[j].p] += (int64_t)s->c[q[j].c].bytes;
    }
  int64_t run = 0;
  uint64_t peak = 0;
  uint32_t v = 0;
  *at = 0;
  for (uint32_t e = 0; e < in->nevents; e++) {
    run += diff[e];
    int64_t l = (int64_t)in->live[e] + run;
    uint64_t live = l > 0 ? (uint64_t)l : 0;
    if (live > peak || e == 0) peak = live, *at = e;
    if (over && v < s->nviol && s->viol[v] == e) over[v++] = (int64_t)live - (int64_t)in->cap;
  }
  return peak;
}

static int valid(const gml_swap_input *in) {
  if (!in || !in->nevents || !in->time_ns || !in->live || (in->ntensors && !in->tensors)) return 0;
  if (in->out_bps < 0 || in->in_bps < 0 || in->out_bps != in->out_bps || in->in_bps != in->in_bps) return 0;
  for (uint32_t e = 1; e < in->nevents; e++)
    if (in->time_ns[e] < in->time_ns[e - 1]) return 0;
  for (uint32_t i = 0; i < in->ntensors; i++) {
    const gml_swap_tensor *t = &in->tensors[i];
    if (t->saved_at >= in->nevents) return 0;
    if (t->used_at != GML_SWAP_NEVER && (t->used_at >= in->nevents || t->used_at <= t->saved_at)) return 0;
  }
  return 1;
}

/* The candidates: tensors read back whose window, alone, covers an over-cap event. */
static int candidates(planner *s) {
  const gml_swap_input *in = s->in;
  double obps = in->out_bps > 0 ? in->out_bps : GML_SWAP_DEFAULT_BPS;
  double ibps = in->in_bps > 0 ? in->in_bps : GML_SWAP_DEFAULT_BPS;
  s->c = calloc(in->ntensors ? in->ntensors : 1, sizeof *s->c);
  if (!s->c) return -ENOMEM;
  for (uint32_t i = 0; i < in->ntensors; i++) {
    const gml_swap_tensor *t = &in->tensors[i];
    if (t->used_at == GML_SWAP_NEVER || !t->bytes) continue;
    cand k = {.t = i, .bytes = t->bytes, .out_ns = copy_ns(t->bytes, obps), .in_ns = copy_ns(t->bytes, ibps)};
    uint64_t use = in->time_ns[t->used_at];
    k.o = first_at_or_after(in, t->saved_at, t->used_at, in->time_ns[t->saved_at] + k.out_ns);
    k.p = last_at_or_before(in, k.o, t->used_at, use >= k.in_ns ? use - k.in_ns : 0, use >= k.in_ns);
    if (k.p <= k.o + 1) continue;
    k.idle_ns = in->time_ns[k.p] - in->time_ns[k.o];
    set_cover(s, &k);
    if (k.a < k.b) s->c[s->nc++] = k;
  }
  return 0;
}

static int plan_moves(planner *s, gml_swap_plan *plan) {
  uint32_t *list = malloc((s->nc ? s->nc : 1) * sizeof *list);
  int64_t *need0 = malloc((s->nviol ? s->nviol : 1) * sizeof *need0);
  if (!list || !need0) return free(list), free(need0), -ENOMEM;
  memcpy(need0, s->need, s->nviol * sizeof *need0);
  int64_t lb;
  worst_event(s, &lb);
  int rc = 0;
  if (greedy(s, list) < 0) { /* cannot fit: move every candidate, the peak as low as it goes */
    for (uint32_t i = 0; i < s->nc; i++) s->state[i] = 1;
  } else {
    prune(s);
    s->best_bytes = s->cur_bytes;
    for (uint32_t i = 0; i < s->nc; i++) s->best[i] = s->state[i] == 1;
    plan->optimal = s->best_bytes == (uint64_t)lb;
    if (!plan->optimal && s->max_nodes >= 0) {
      memset(s->state, 0, s->nc);
      memcpy(s->need, need0, s->nviol * sizeof *need0);
      s->cur_bytes = 0;
      rc = search(s);
      plan->optimal = !rc && !s->aborted;
    }
    for (uint32_t i = 0; i < s->nc; i++) s->state[i] = s->best[i];
  }
  plan->nodes = (uint64_t)s->nodes;
  free(list);
  free(need0);
  return rc;
}

int gml_swap_plan_build(const gml_swap_input *in, gml_swap_plan **out) {
  if (!out) return GML_EINVAL;
  *out = NULL;
  if (!valid(in)) return GML_EINVAL;
  gml_swap_plan *plan = calloc(1, sizeof *plan);
  if (!plan) return GML_ENOMEM;
  plan->cap = in->cap;
  for (uint32_t e = 0; e < in->nevents; e++)
    if (in->live[e] > plan->peak_before || e == 0) plan->peak_before = in->live[e], plan->peak_event = e;
  plan->peak_after = plan->peak_before;
  plan->feasible = plan->optimal = plan->peak_before <= in->cap;
  if (plan->feasible) return *out = plan, 0;

  planner s = {.in = in, .max_nodes = in->max_nodes};
  uint32_t n = in->nevents;
  s.viol = malloc(n * sizeof *s.viol);
  s.need = malloc(n * sizeof *s.need);
  int64_t *diff = malloc((n + 1) * sizeof *diff);
  int rc = s.viol && s.need && diff ? 0 : -ENOMEM;
  for (uint32_t e = 0; !rc && e < n; e++)
    if (in->live[e] > in->cap) s.viol[s.nviol] = e, s.need[s.nviol++] = (int64_t)(in->live[e] - in->cap);
  if (!rc) rc = candidates(&s);
  if (!s.max_nodes) s.max_nodes = 1000 + SWAP_DEFAULT_WORK / ((int64_t)s.nc + s.nviol + 1);
  sched *q = NULL;
  uint32_t *list = NULL;
  if (!rc) {
    s.state = calloc(s.nc ? s.nc : 1, 1);
    s.best = calloc(s.nc ? s.nc : 1, 1);
    q = malloc((s.nc ? s.nc : 1) * sizeof *q);
    list = malloc((s.nc ? s.nc : 1) * sizeof *list);
    rc = s.state && s.best && q && list ? plan_moves(&s, plan) : -ENOMEM;
  }
  /* through the queues; where narrowed windows break the cap, add tensors and schedule again */
  uint32_t nq = 0, at = 0;
  for (int round = 0; !rc; round++) {
    nq = schedule(&s, q);
    for (uint32_t j = 0; j < nq; j++)
      if (q[j].p <= q[j].o + 1) s.state[q[j].c] = 2, plan->optimal = 0; /* no window left: never again */
    plan->peak_after = peak_with(&s, q, nq, diff, &at, s.need);
    if (plan->peak_after <= in->cap || round == SWAP_ROUNDS) break;
    uint32_t before = 0;
    for (uint32_t i = 0; i < s.nc; i++) before += s.state[i] == 1;
    for (uint32_t v = 0; v < s.nviol; v++) /* need[] is over the cap with the queued windows: cover it greedily */
      if (s.need[v] > 0) {
        uint64_t sum;
        uint32_t nl = covering(&s, v, list, &sum);
        for (uint32_t j = 0; j < nl && s.need[v] > 0; j++) s.state[list[j]] = 1, apply(&s, &s.c[list[j]], 1);
      }
    uint32_t after = 0;
    for (uint32_t i = 0; i < s.nc; i++) after += s.state[i] == 1;
    if (after == before) break;
    plan->optimal = 0;
  }
  if (!rc) {
    plan->feasible = plan->peak_after <= in->cap;
    plan->moves = calloc(nq ? nq : 1, sizeof *plan->moves);
    if (!plan->moves) rc = -ENOMEM;
  }
  if (!rc) {
    sort_ctx ctx = {in, s.c};
    qsort_r(q, nq, sizeof *q, cmp_save, &ctx);
    for (uint32_t j = 0; j < nq; j++) {
      if (q[j].p <= q[j].o + 1) continue;
      const cand *k = &s.c[q[j].c];
      const gml_swap_tensor *t = &in->tensors[k->t];
      plan->moves[plan->nmoves++] = (gml_swap_move){.id = t->id,
                                                    .bytes = k->bytes,
                                                    .tensor = k->t,
                                                    .out_at = t->saved_at,
                                                    .gone_at = q[j].o,
                                                    .in_at = q[j].p,
                                                    .used_at = t->used_at,
                                                    .out_ns = k->out_ns,
                                                    .in_ns = k->in_ns,
                                                    .late_ns = q[j].late_ns};
      plan->bytes_moved += k->bytes;
      plan->late_ns += q[j].late_ns;
    }
  }
  free(list), free(q), free(diff), free(s.viol), free(s.need), free(s.c), free(s.state), free(s.best);
  if (rc) return gml_swap_plan_free(plan), rc == -ENOMEM ? GML_ENOMEM : GML_EINVAL;
  *out = plan;
  return 0;
}

void gml_swap_plan_free(gml_swap_plan *p) {
  if (!p) return;
  free(p->moves);
  free(p);
}
