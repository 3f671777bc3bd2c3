/* streams.c: allocations used on more streams than the one they were
 * allocated on (gml_record_stream). Their free waits: an event is recorded on
 * each such stream at the free, and the memory goes back only once every
 * event is done (polled at each allocation and free; waited for before an
 * out-of-memory, at a trim and at close). While a private pool captures a
 * graph no event may be recorded or queried, so such frees wait unrecorded
 * until the capture ends, as PyTorch's own allocator does. With borrowing,
 * a request that would otherwise lease more memory takes such frees of its
 * own stream first, with waits on the device (gmli_streams_borrow). */
#include "client_priv.h"
#include "log.h"
#include <stdlib.h>

int gml_record_stream(gml_client *c, void *ptr, gml_stream stream) {
  if (!c) return GML_EINVAL;
  pthread_mutex_lock(&c->track_lock);
  gml_rec *r = gmli_recmap_get(&c->recs, (uintptr_t)ptr, 0);
  int rc = 0;
  if (!r || r->state != GML_BLOCK_ALLOCATED) {
    rc = gmli_fail(c, GML_EBADPTR, "gml_record_stream: %p is not a live allocation of this client", ptr);
  } else if (stream != r->stream) {
    int seen = 0;
    for (int i = 0; i < r->nuses; i++) seen |= r->uses[i] == stream;
    if (!seen && r->nuses < GML_REC_STREAMS) r->uses[r->nuses++] = stream;
    else if (!seen) r->uses_overflow = 1; /* the free will wait for the whole device */
  }
  pthread_mutex_unlock(&c->track_lock);
  return rc;
}

/* Record r's events now; 0, or nonzero if they could not all be recorded
 * (then the caller waits for the device). */
static int record_events(gml_client *c, gml_rec *r) {
  if (r->uses_overflow) return 1;
  for (; r->nevents < r->nuses; r->nevents++)
    if (c->be->ops->event_record(c->be, r->uses[r->nevents], &r->events[r->nevents])) return 1;
  return 0;
}

static void destroy_events(gml_client *c, gml_rec *r) {
  for (int i = 0; i < r->nevents; i++) c->be->ops->event_destroy(c->be, r->events[i]);
  r->nevents = 0;
}

static void pending_unlink(gml_client *c, gml_rec *r) {
  if (r->lprev) r->lprev->lnext = r->lnext;
  else c->pending = r->lnext;
  if (r->lnext) r->lnext->lprev = r->lprev;
  r->lnext = r->lprev = NULL;
  c->npending--;
}

int gmli_streams_defer(gml_client *c, gml_rec *r) {
  if (!c->ncapturing && record_events(c, r)) {
    /* no event: wait for everything the device has queued */
    if (c->be->ops->synchronize(c->be) == 0) {
      c->ctr.waits++;
      destroy_events(c, r);
      gmli_rec_release(c, r);
      return 0;
    }
    GML_ERR("cannot order the free of %#lx after its streams; it stays held", (unsigned long)r->ptr);
  }
  r->lprev = NULL;
  r->lnext = c->pending;
  if (c->pending) c->pending->lprev = r;
  c->pending = r;
  c->npending++;
  return 0;
}

void gmli_streams_poll(gml_client *c, int wait) {
  if (!c->pending || c->ncapturing) return;
  int synced = 0;
  for (gml_rec *r = c->pending, *n; r; r = n) {
    n = r->lnext;
    int done = synced;
    if (!done && record_events(c, r)) {
      if (!wait) continue;
      done = 1;
    }
    for (int i = 0; !done && i < r->nevents; i++)
      if (c->be->ops->event_done(c->be, r->events[i]) != 1) break;
      else if (i == r->nevents - 1) done = 1;
    if (!done && r->nevents == 0) done = 1;
    if (!done && wait) {
      if (c->be->ops->synchronize(c->be)) continue;
      c->ctr.waits++;
      synced = done = 1;
    }
    if (!done) continue;
    destroy_events(c, r);
    pending_unlink(c, r);
    gmli_rec_release(c, r);
  }
}

int gmli_streams_lendable(gml_client *c) {
  for (gml_rec *r = c->pending; r; r = r->lnext)
    if (r->pool < 0) return 1;
  return 0;
}

/* Oldest first. A freed block goes back to the pool of the stream it was
 * allocated on, which may reuse it at once: so that stream is the one made
 * to wait for the uses (its work enqueued from now on runs after them).
 * Another stream, the requester too, gets the memory from there by the
 * allocator's own rules (an event on the block's stream, recorded later,
 * covers these waits). Every wait is for an event recorded earlier: no
 * cycle, no deadlock. */
size_t gmli_streams_borrow(gml_client *c, size_t size) {
  gml_rec *r = c->pending;
  size_t got = 0;
  if (!r || c->ncapturing || !c->be->ops->stream_wait_event) return 0;
  while (r->lnext) r = r->lnext;
  for (gml_rec *p; r && got < size; r = p) {
    p = r->lprev;
    if (r->pool >= 0 || record_events(c, r)) continue;
    int ok = 1, waits = 0;
    for (int i = 0; ok && i < r->nevents; i++) {
      if (c->be->ops->event_done(c->be, r->events[i]) == 1) continue;
      if (c->be->ops->stream_wait_event(c->be, r->stream, r->events[i])) ok = 0; /* a stream being captured */
      else waits++;
    }
    pthread_mutex_lock(&c->alloc.lock);
    c->alloc.borrow_waits += (uint64_t)waits;
    c->alloc.borrows += ok;
    pthread_mutex_unlock(&c->alloc.lock);
    if (!ok) continue;
    got += r->size;
    destroy_events(c, r);
    pending_unlink(c, r);
    gmli_rec_release(c, r);
  }
  return got;
}
