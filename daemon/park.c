/* park.c: the end of a client's session, its policy (the transport's
 * on_closing, dispatch.c). A hand-over not complete is dropped (adopt.c),
 * its shares' mappings wait for its process (shares.c), and the chunks it
 * held go back to the lake once its process is gone (a pidfd says when):
 * while the process lives on it may still map them, so they are parked,
 * counted in its quotas, and no mapping in a living process can alias a
 * chunk leased to someone else. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "park.h"
#include "adopt.h"
#include "daemon.h"
#include "grant.h"
#include "log.h"
#include "shares.h"
#include <stdlib.h>
#include <unistd.h>

static void parked_free(uv_handle_t *h) { free(h->data); }

static void release_owner_chunks(gmld *d, uint64_t owner) {
  for (uint32_t i = 0; i < d->lk.nslots; i++) {
    lake_chunk *c = &d->lk.chunks[i];
    if ((c->state == CHUNK_LEASED || c->state == CHUNK_PARKED) && c->owner == owner) lake_give_back(&d->lk, i);
  }
}

static void on_parked_exit(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  parked_owner *p = h->data;
  gmld *d = p->d;
  release_owner_chunks(d, p->owner);
  broker_unpark(&d->br, &p->bc);
  CONN_INFO(p->bc.uid, "process %d exited: its parked chunks are back in the lake", (int)p->pid);
  for (parked_owner **pp = &d->parked; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  uv_poll_stop(&p->poll);
  close(p->pidfd);
  uv_close((uv_handle_t *)&p->poll, parked_free);
  sessions_serve_pending(d);
}

void park_on_closing(session *s, const char *why) {
  gmld *d = s->d;
  adopt_session_closing(s); /* a hand-over not complete: dropped, not parked (the client offers it again) */
  uint64_t held = 0;
  for (uint32_t i = 0; i < d->lk.nslots; i++)
    held += d->lk.chunks[i].state == CHUNK_LEASED && d->lk.chunks[i].owner == s->bc.id;
  int gone = conn_process_gone(s->pidfd, s->bc.pid);
  shares_session_closed(s, gone); /* before its pidfd is closed or handed on */
  if (gone || !held || d->stopping) {
    release_owner_chunks(d, s->bc.id); /* its pidfd: the transport closes it */
  } else {
    /* Its process lives on and may still map them: park until it exits. */
    for (uint32_t i = 0; i < d->lk.nslots; i++)
      if (d->lk.chunks[i].state == CHUNK_LEASED && d->lk.chunks[i].owner == s->bc.id) lake_park(&d->lk, i);
    parked_owner *p = calloc(1, sizeof *p);
    if (p && s->pidfd >= 0) {
      p->d = d;
      p->owner = s->bc.id;
      p->pidfd = s->pidfd;
      s->pidfd = -1; /* the watch's now */
      p->pid = s->bc.pid;
      p->bc = s->bc; /* who it was, what it holds: still its process's */
      p->bc.leased_chunks = held;
      p->bc.allocated = p->bc.cached = p->bc.stitched = p->bc.paused = p->bc.paused_saved = 0;
      p->bc.idle = p->bc.fragment = p->bc.uncounted = 0;
      p->bc.reported.base.descriptor = NULL; /* no report of its own any more */
      uv_poll_init(d->loop, &p->poll, p->pidfd);
      p->poll.data = p;
      uv_poll_start(&p->poll, UV_READABLE, on_parked_exit);
      p->next = d->parked;
      d->parked = p;
      broker_park(&d->br, &p->bc);
    } else {
      free(p);
      CONN_WARN(s->bc.uid, "cannot watch pid %d: its %llu chunk(s) stay parked", (int)s->bc.pid,
                (unsigned long long)held);
    }
  }
  CONN_INFO(s->bc.uid, "client %llu (pid %d) left (%s); %llu chunk(s) %s", (unsigned long long)s->bc.id, (int)s->bc.pid,
            why, (unsigned long long)held,
            !held                 ? "held"
            : gone || d->stopping ? "back in the lake"
                                  : "parked until its process exits");
}

void park_release_all(gmld *d) {
  while (d->parked) {
    parked_owner *p = d->parked;
    d->parked = p->next;
    release_owner_chunks(d, p->owner);
    broker_unpark(&d->br, &p->bc);
    uv_poll_stop(&p->poll);
    close(p->pidfd);
    uv_close((uv_handle_t *)&p->poll, parked_free);
  }
}
