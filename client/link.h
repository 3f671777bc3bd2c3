/* link.h: the daemon connection's state, shared by link.c (the reader
 * thread, requests and their replies) and keeper.c (the keeper thread and
 * reconnection). Locks: mu guards the fields below and is the innermost lock;
 * no thread holds it across a socket call or another lock. */
#ifndef GML_LINK_H
#define GML_LINK_H
#include "client_priv.h"
#include <pthread.h>
#include <stdint.h>

struct gml_link {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* a reply came, the connection went, the keeper has work, or stop */
  pthread_t reader, keeper;
  int reader_on, keeper_on;
  int stop;               /* gmli_link_stop: the keeper ends */
  int gone;               /* the reader saw the connection end */
  uint64_t adopt_refused; /* the instance (1: unnamed) of a restarted daemon that refused our hand-over (over a quota,
                            * or past what it adopts): our next connection to it keeps our chunks, uncounted */
  uint64_t wait_seq;      /* the request whose replies a caller waits for (0: none) */
  uint64_t import_seq;    /* ... whose lease replies the reader imports itself (GMLAKE_STREAM_MAP) */
  struct link_msg *head, *tail; /* its replies, not taken yet */
  int lost;                     /* one of them could not be queued (no memory): the call fails */
  uint64_t reclaim_want;        /* bytes the daemon asked back, not served yet (UINT64_MAX: all idle) */
  uint64_t reclaims_got;        /* reclaim requests received */
  uint64_t moot;                /* ... of them moot when they came (gmli_reclaim_moot), not answered yet */
  char path[256];               /* the daemon's socket, to reconnect to ("": never) */
  int rsock;                    /* the socket of a reconnection under way (-1: none): shut down by gmli_link_stop */
  uint64_t reconnects;
  uint64_t reply_timeout_ns; /* REPLY_TIMEOUT_MS, or a test's */
  char said[320];            /* why the last reconnection's hello failed, as logged ("": it did not) */
};

/* link.c: the link's state and its reader thread (gmli_link_open; the reader
 * alone again after a reconnection: gmli_link_reader_start), and its end once
 * the keeper is gone (gmli_link_close). */
int gmli_link_open(gml_client *c, const char *socket_path);
int gmli_link_reader_start(gml_client *c);
void gmli_link_close(gml_client *c);
/* Wait on l->cv (l->mu held) for at most ns: pthread_cond_timedwait's result. */
int gmli_link_wait_ns(gml_link *l, uint64_t ns);
#endif
