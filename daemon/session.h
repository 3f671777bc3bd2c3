/* session.h: a client's connection to the daemon (session.c). */
#ifndef GML_SESSION_H
#define GML_SESSION_H
#include "broker.h"
#include "conn.h"
#include "wire.h"
#include <stddef.h>
#include <uv.h>

struct gmld;

typedef struct session {
  broker_client bc;         /* who it is, its numbers, its lease in flight (broker.h) */
  struct gmld *d;
  int fd;                   /* -1 once closed */
  uv_poll_t poll;
  int poll_events;
  int pidfd;
  int hello_done;
  gml_rx rx;
  conn_txq txq;             /* frames waiting for the socket */
} session;

static inline session *session_of(broker_client *c) {
  return (session *)((char *)c - offsetof(session, bc));
}

int sessions_listen(struct gmld *d);
void sessions_close_all(struct gmld *d);
void sessions_serve_pending(struct gmld *d); /* after chunks became free */
void sessions_tick(struct gmld *d);          /* waiting leases: reclaims, deadlines */
void session_send_reclaim(session *s, uint64_t bytes);
/* For the other message handlers (shares.c): a reply with its fds, an error reply. */
int session_send_msg(session *s, Gmlake__Envelope *env, const int *fds, int nfds);
void session_send_error(session *s, uint64_t seq, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
session *session_by_pid(struct gmld *d, pid_t pid);
#endif
