/* daemon.h: the state of gmlaked shared by its parts: main.c (config,
 * start-up, signals), session.c (client sockets), creator.c (the worker that
 * pre-creates chunks off the loop), control.c (nng control RPC). All state
 * is touched on the libuv loop thread only, except the creator's queue. */
#ifndef GML_DAEMON_H
#define GML_DAEMON_H
#include "backend.h"
#include "lake.h"
#include "wire.h"
#include <nng/nng.h>
#include <pthread.h>
#include <sys/types.h>
#include <uv.h>

#define LEASE_WAIT_MS 1000      /* a lease waits this long for reclaimed chunks before ENOMEM */
#define LAT_RING 4096

typedef struct gmld_config {
  int device;
  char backend[16];
  char socket_path[256];
  char control_url[300];
  char limit[64];           /* bytes or PCT% of the device */
  uint64_t prefetch_bytes;  /* created ahead of demand */
  uint64_t preallocate_bytes; /* the lake holds at least this much, created at start */
  int creators;             /* worker threads creating chunks */
  int foreground;
  int log_level;
  unsigned socket_mode;
  char socket_group[64];
  char config_path[256];
} gmld_config;

typedef struct tx_item {
  struct tx_item *next;
  uint8_t *buf;
  size_t len, off;
  int fds[GML_MAX_LEASE_CHUNKS];
  int nfds;                 /* sent with the first byte */
} tx_item;

typedef struct session {
  struct session *next, *prev;
  struct gmld *d;
  uint64_t id;
  int fd;
  uv_poll_t poll;
  int poll_events;
  int pidfd;
  uv_poll_t pid_poll;
  int pid_polling;
  pid_t pid;
  uid_t uid;
  char name[64];
  int hello_done;
  int closing;
  gml_rx rx;
  tx_item *tx_head, *tx_tail;
  /* pending lease (a client has at most one request in flight) */
  int pending;
  uint64_t pending_seq;
  uint32_t pending_count;
  uint64_t pending_since_ns, pending_deadline_ns;
  int reclaim_sent;
  /* numbers */
  uint64_t leased_chunks;
  uint64_t allocated, cached, stitched, largest_free;
  uint64_t leases_refused;
  double since;
} session;

typedef struct parked_owner {       /* a client gone while its process lives on */
  struct parked_owner *next;
  struct gmld *d;
  uint64_t owner;
  int pidfd;
  pid_t pid;
  uv_poll_t poll;
} parked_owner;

typedef struct creator {
  pthread_t *threads;
  int nthreads;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t requested;       /* chunks still to create */
  size_t inflight;          /* being created right now */
  int stop;
  struct created { gml_phys phys; int fd; } *done;
  size_t ndone, done_cap;
  uint64_t failures;
  uv_async_t async;
} creator;

typedef struct gmld {
  gmld_config cfg;
  uv_loop_t *loop;
  gml_backend *be;
  lake lk;
  creator cr;
  uint64_t prefetch_chunks, preallocate_chunks;
  uint64_t device_total;
  int listen_fd;
  uv_poll_t listen_poll;
  nng_socket ctl;
  int ctl_fd;
  uv_poll_t ctl_poll;
  uv_signal_t sigterm, sigint;
  uv_timer_t tick;
  session *sessions;
  size_t nsessions;
  parked_owner *parked;
  uint64_t next_client_id;
  uint64_t lease_count, leases_refused, protocol_errors;
  uint64_t optional_declined; /* optional (headroom) leases with nothing free at once */
  uint64_t lat_ns[LAT_RING];
  size_t nlat;
  int stopping;
  int prefetch_suspended;   /* after a trim, until the next lease */
  uint64_t create_backoff_until_ns; /* creating failed (device full?): wait before trying again */
} gmld;

/* session.c */
int sessions_listen(gmld *d);
void sessions_close_all(gmld *d);
void sessions_serve_pending(gmld *d);   /* after chunks became free */
void sessions_tick(gmld *d);            /* deadlines of waiting leases */
void session_send_reclaim(session *s, uint64_t bytes);
session *session_by_pid(gmld *d, pid_t pid);
/* creator.c */
int creator_start(gmld *d);
void creator_stop(gmld *d);
void creator_request(gmld *d, uint64_t n);
/* Ask for what free + pending demand need, within the limit. */
void lake_refill(gmld *d);
/* control.c */
int control_start(gmld *d);
/* One control request (a serialized CtlRequest) in, its serialized CtlReply
 * out (malloc'd): decoding, dispatch and encoding without nng, so the fuzz
 * target runs what the daemon runs. Returns 0 or GML_ENOMEM. */
int control_handle(gmld *d, const uint8_t *req, size_t req_len, uint8_t **reply, size_t *reply_len);
void control_stop(gmld *d);
#endif
