/* client_priv.h: the client handle as the library's parts see it (client.c
 * owns the connection and the allocator's chunk sources; growable.c maps
 * chunks from the same source into ranges of their own). Not installed. */
#ifndef GML_CLIENT_PRIV_H
#define GML_CLIENT_PRIV_H
#include "alloc.h"
#include "gmlake.h"
#include "wire.h"
#include <pthread.h>
#include <stdint.h>

#define REPORT_INTERVAL_NS (100 * 1000 * 1000ull)

/* Growable ranges of one client (growable.c). */
typedef struct gml_grow_state {
  pthread_mutex_t lock;     /* the list and every range's chunk table */
  struct gml_growable *head;
  uint64_t ranges;          /* live ranges */
  uint64_t reserved;        /* bytes of virtual range they reserve */
  uint64_t mapped;          /* bytes of chunks mapped into them */
  uint64_t chunks_leased, chunks_returned; /* over the client's life */
} gml_grow_state;

struct gml_client {
  gml_allocator alloc;
  gml_backend *be;
  int mode;
  int sock;                 /* daemon mode */
  pthread_mutex_t conn_lock;
  uint64_t seq;
  uint64_t client_id;
  int daemon_gone;          /* set by link.c's reader (atomic) */
  struct gml_link *link;    /* link.c: the reader and keeper threads (daemon mode) */
  uint64_t reclaims_served; /* reclaim requests the keeper served */
  struct gml_pause *pause;  /* pause.c: what is paused (NULL: nothing); under alloc.lock */
  uint64_t reclaim_pending; /* bytes the daemon asked back; served outside the allocator lock */
  uint64_t last_report_ns;
  uint32_t ops_since_check;
  gml_grow_state grow;
  char last_error[1400];
  char lake_error[1024];    /* the daemon's refusal of the last lease (the lake-wide picture), "" after a served one */
};

/* link.c: the daemon connection's threads (see there). start after hello;
 * quiesce (the keeper stops) before the allocator goes; stop at last. */
typedef struct gml_link gml_link;
int gml_link_start(gml_client *c);
void gml_link_quiesce(gml_client *c);
void gml_link_stop(gml_client *c);
/* Send env (its seq set here); with want_reply, wait for the reply the reader
 * routes back. conn_lock held. GML_EDAEMON when the connection is gone. */
int gml_link_call(gml_client *c, Gmlake__Envelope *env, int want_reply, Gmlake__Envelope **reply, int *fds, int *nfds);
/* client.c: send the allocator's numbers to the daemon now. */
void gml_client_report(gml_client *c);

/* pause.c: the paused bytes and saved content into st; freeing at close. */
void gml_pause_stats(gml_client *c, gml_stats *st);
void gml_pause_destroy(gml_client *c);

/* growable.c */
void gml_grow_init(gml_client *c);
void gml_grow_destroy_all(gml_client *c); /* at close: unmaps and returns every range's chunks */
void gml_grow_stats(gml_client *c, gml_stats *st);
#endif
