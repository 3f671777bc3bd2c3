/* backends.c: the tests' backends, outside the library: the host backend
 * with fake events (stream ordering driven by hand, test_borrow and
 * bench/borrow_model), the host backend spending a driver's time
 * (gml-testclient's `cost`), both over the library's own host backend. */
#include "backends.h"
#include "gmlake.h"
#include "util.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---------- fake events ----------
 * A vector clock per stream: vc[t][s] is the last position of stream s that
 * work enqueued on t from now on is ordered after (vc[t][t]: t's own).
 * An event copies its stream's clock when recorded; a wait merges it in. */
#define FAKE_STREAMS 64
typedef struct fake_event {
  int stream; /* -1: free slot */
  uint64_t vc[FAKE_STREAMS];
} fake_event;
typedef struct fake_wait {
  int stream;  /* the waiting stream */
  uint64_t at; /* its work after position `at` waits */
  int on;      /* for position `pos` of stream `on` to be done */
  uint64_t pos;
} fake_wait;
typedef struct fake_state {
  pthread_mutex_t lock;
  const struct gml_backend_ops *base; /* the backend's own operations, under the fake ones */
  struct gml_backend_ops ops;
  int nstreams;
  uintptr_t ids[FAKE_STREAMS];
  uint64_t enq[FAKE_STREAMS], done[FAKE_STREAMS];
  uint64_t vc[FAKE_STREAMS][FAKE_STREAMS];
  fake_event *ev;
  size_t nev;
  fake_wait *waits;
  size_t nwaits, cap_waits;
  uint64_t total_waits;
} fake_state;

static int fake_stream(fake_state *f, uintptr_t id) {
  for (int i = 0; i < f->nstreams; i++)
    if (f->ids[i] == id) return i;
  if (f->nstreams == FAKE_STREAMS) abort(); /* a test with too many streams: a bug in the test */
  f->ids[f->nstreams] = id;
  return f->nstreams++;
}

static int fake_event_record(gml_backend *be, uintptr_t stream, uintptr_t *event) {
  fake_state *f = be->priv;
  pthread_mutex_lock(&f->lock);
  int s = fake_stream(f, stream);
  size_t i = 0;
  while (i < f->nev && f->ev[i].stream >= 0) i++;
  if (i == f->nev) {
    fake_event *n = realloc(f->ev, (f->nev * 2 + 16) * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&f->lock);
      return GML_ENOMEM;
    }
    for (size_t k = f->nev; k < f->nev * 2 + 16; k++) n[k].stream = -1;
    f->ev = n, f->nev = f->nev * 2 + 16;
  }
  f->ev[i].stream = s;
  memcpy(f->ev[i].vc, f->vc[s], sizeof f->vc[s]);
  f->ev[i].vc[s] = f->enq[s];
  *event = i + 1;
  pthread_mutex_unlock(&f->lock);
  return 0;
}

static int fake_event_done(gml_backend *be, uintptr_t event) {
  fake_state *f = be->priv;
  pthread_mutex_lock(&f->lock);
  fake_event *e = &f->ev[event - 1];
  int done = e->stream >= 0 && f->done[e->stream] >= e->vc[e->stream];
  pthread_mutex_unlock(&f->lock);
  return done;
}

static void fake_event_destroy(gml_backend *be, uintptr_t event) {
  fake_state *f = be->priv;
  pthread_mutex_lock(&f->lock);
  f->ev[event - 1].stream = -1;
  pthread_mutex_unlock(&f->lock);
}

static int fake_stream_wait_event(gml_backend *be, uintptr_t stream, uintptr_t event) {
  fake_state *f = be->priv;
  pthread_mutex_lock(&f->lock);
  int t = fake_stream(f, stream);
  fake_event *e = &f->ev[event - 1];
  for (int s = 0; s < FAKE_STREAMS; s++)
    if (e->vc[s] > f->vc[t][s]) f->vc[t][s] = e->vc[s];
  if (f->nwaits == f->cap_waits) {
    fake_wait *n = realloc(f->waits, (f->cap_waits * 2 + 16) * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&f->lock);
      return GML_ENOMEM;
    }
    f->waits = n, f->cap_waits = f->cap_waits * 2 + 16;
  }
  f->waits[f->nwaits++] = (fake_wait){t, f->enq[t], e->stream, e->vc[e->stream]};
  f->total_waits++;
  pthread_mutex_unlock(&f->lock);
  return 0;
}

static int fake_synchronize(gml_backend *be) {
  fake_state *f = be->priv;
  pthread_mutex_lock(&f->lock);
  memcpy(f->done, f->enq, sizeof f->done);
  f->nwaits = 0;
  pthread_mutex_unlock(&f->lock);
  return 0;
}

static void fake_destroy(gml_backend *be) {
  fake_state *f = be->priv;
  be->ops = f->base, be->priv = NULL;
  pthread_mutex_destroy(&f->lock);
  free(f->ev), free(f->waits), free(f);
  be->ops->destroy(be);
}

/* The backend's operations with the stream-ordering ones faked: a backend
 * with state of its own (priv) cannot be switched. */
int gml_host_fake_events(gml_backend *be) {
  if (be->priv) return GML_EINVAL;
  fake_state *f = calloc(1, sizeof *f);
  if (!f) return GML_ENOMEM;
  pthread_mutex_init(&f->lock, NULL);
  f->base = be->ops;
  f->ops = *be->ops;
  f->ops.event_record = fake_event_record, f->ops.event_done = fake_event_done;
  f->ops.event_destroy = fake_event_destroy, f->ops.stream_wait_event = fake_stream_wait_event;
  f->ops.synchronize = fake_synchronize, f->ops.destroy = fake_destroy;
  be->priv = f;
  be->ops = &f->ops;
  return 0;
}

uint64_t gml_host_fake_launch(gml_backend *be, uintptr_t stream) {
  fake_state *f = be->priv;
  pthread_mutex_lock(&f->lock);
  int s = fake_stream(f, stream);
  uint64_t pos = ++f->enq[s];
  f->vc[s][s] = pos;
  pthread_mutex_unlock(&f->lock);
  return pos;
}

void gml_host_fake_progress(gml_backend *be, uintptr_t stream, uint64_t n) {
  fake_state *f = be->priv;
  pthread_mutex_lock(&f->lock);
  int s = fake_stream(f, stream);
  uint64_t to = f->done[s] + n < f->enq[s] ? f->done[s] + n : f->enq[s];
  for (size_t i = 0; i < f->nwaits; i++) { /* an unfinished wait stops the stream where it was inserted */
    fake_wait *w = &f->waits[i];
    if (w->stream == s && f->done[w->on] < w->pos && w->at < to) to = w->at > f->done[s] ? w->at : f->done[s];
  }
  f->done[s] = to;
  for (size_t i = 0; i < f->nwaits;) /* a wait whose event is done holds nothing any more */
    if (f->done[f->waits[i].on] >= f->waits[i].pos) f->waits[i] = f->waits[--f->nwaits];
    else i++;
  pthread_mutex_unlock(&f->lock);
}

int gml_host_fake_ordered(gml_backend *be, uintptr_t from, uint64_t pos, uintptr_t to) {
  fake_state *f = be->priv;
  pthread_mutex_lock(&f->lock);
  int s = fake_stream(f, from), t = fake_stream(f, to);
  int ok = s == t || f->done[s] >= pos || f->vc[t][s] >= pos;
  pthread_mutex_unlock(&f->lock);
  return ok;
}

uint64_t gml_host_fake_position(gml_backend *be, uintptr_t stream) {
  fake_state *f = be->priv;
  pthread_mutex_lock(&f->lock);
  uint64_t p = f->enq[fake_stream(f, stream)];
  pthread_mutex_unlock(&f->lock);
  return p;
}

uint64_t gml_host_fake_waits(gml_backend *be) {
  fake_state *f = be->priv;
  return f->total_waits;
}

/* ---------- a driver's costs ----------
 * The backend's import, unmap and set-access, each after spinning the CPU
 * time per chunk a driver would spend (a 50 us sleep is a timer's slack). */
static uint64_t cost_import_ns, cost_unmap_ns, cost_access_ns;
static const struct gml_backend_ops *costed_base; /* the host backend's own operations */
static struct gml_backend_ops costed_ops;
static gml_backend_open_fn host_open;

void gml_host_test_costs(uint64_t import_ns, uint64_t unmap_ns, uint64_t access_ns) {
  __atomic_store_n(&cost_import_ns, import_ns, __ATOMIC_RELAXED);
  __atomic_store_n(&cost_unmap_ns, unmap_ns, __ATOMIC_RELAXED);
  __atomic_store_n(&cost_access_ns, access_ns, __ATOMIC_RELAXED);
}

static void spin_cost(const uint64_t *cost, uint64_t times) {
  uint64_t ns = __atomic_load_n(cost, __ATOMIC_RELAXED) * times;
  for (uint64_t t0 = ns ? gmli_now_ns() : 0; ns && gmli_now_ns() - t0 < ns;) {}
}

static int costed_chunk_import(gml_backend *be, int fd, gml_phys *phys) {
  spin_cost(&cost_import_ns, 1);
  return costed_base->chunk_import(be, fd, phys);
}

static int costed_set_access(gml_backend *be, uintptr_t va, size_t size, int flags) {
  spin_cost(&cost_access_ns, size / be->chunk_size);
  return costed_base->set_access(be, va, size, flags);
}

static int costed_unmap(gml_backend *be, uintptr_t va, size_t size) {
  spin_cost(&cost_unmap_ns, size / be->chunk_size);
  return costed_base->unmap(be, va, size);
}

/* Every host backend shares one table of operations: the costed one is made
 * from the first opened (this process opens its clients from one thread). */
static int costed_open(int device, const gml_backend_opts *opts, gml_backend **out, char *msg, size_t msglen) {
  int rc = host_open(device, opts, out, msg, msglen);
  if (rc) return rc;
  if (!costed_base) {
    costed_base = (*out)->ops, costed_ops = *costed_base;
    costed_ops.chunk_import = costed_chunk_import, costed_ops.set_access = costed_set_access;
    costed_ops.unmap = costed_unmap;
  }
  if ((*out)->ops == costed_base) (*out)->ops = &costed_ops;
  return 0;
}

int gml_host_test_costs_install(void) {
  const gml_backend_entry *host = gmli_backend_find("host");
  if (!host) return GML_ENODEV;
  gml_backend_entry e = *host;
  host_open = host->open;
  e.open = costed_open;
  return gmli_backend_register(&e);
}
