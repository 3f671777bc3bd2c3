/* session.h: a client's connection to the daemon (session.c); accepting
 * them within the connection limits is listen.c. */
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
  int pidfd;                /* of the process that connected (conn_peer_pidfd) */
  int peer_gone;            /* the kernel said that process had exited when it was accepted */
  int hello_done;
  uint64_t adopted;         /* chunks adopted on this connection while its hand-over is not complete (adopt.c) */
  int backlog;              /* complete frames wait in rx beyond this turn's read budget */
  uint64_t connect_ns;      /* hello must come within hello_timeout_ms of it */
  uint64_t partial_since_ns;/* a frame started arriving then and is not whole yet (0: none) */
  const char *close_why;    /* set when the session is doomed (closed at the next turn of the loop) */
  gml_rx rx;
  conn_txq txq;             /* frames waiting for the socket */
} session;

static inline session *session_of(broker_client *c) {
  return (session *)((char *)c - offsetof(session, bc));
}

/* A connection accepted by listen.c: a new session (0), or an error (the
 * caller closes fd). */
struct ucred;
int session_open(struct gmld *d, int fd, const struct ucred *cred);
int sessions_listen(struct gmld *d);          /* the client socket */
int listen_start(struct gmld *d);             /* listen.c */
void sessions_stop_listening(struct gmld *d); /* listen.c */
void sessions_close_all(struct gmld *d);
void sessions_serve_pending(struct gmld *d); /* after chunks became free (grant.c) */
/* grant.c: the broker's lease decisions carried out: a lease asked (the
 * tick reviews it while it waits), the tick's review of s's lease. */
void grant_lease(session *s, uint64_t seq, uint32_t count, int optional, int streamed);
void grant_review(session *s, uint64_t now_ns);
void grant_more(session *s); /* s's send queue drained: its streamed lease gets what is free */
/* Whether a streamed lease's next reply (up to a lease's fds) may go to s
 * now: nothing waits in its queue, or the fd budget has room for its dups. */
int session_fds_room(const session *s);
void sessions_tick(struct gmld *d);          /* waiting leases: reclaims, deadlines; timeouts */
void session_send_reclaim(session *s, uint64_t bytes, uint64_t valid_ms); /* valid_ms 0: until served */
/* For the other message handlers (shares.c): a reply with its fds (0; CONN_NO_FD_ROOM: not sent, the
 * daemon's fd budget has no room for them, fdbudget_refusal says why; else s is doomed), an error reply. */
int session_send_msg(session *s, Gmlake__Envelope *env, const int *fds, int nfds);
void session_send_error(session *s, uint64_t seq, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
session *session_by_pid(struct gmld *d, pid_t pid);
/* hello.c: a Hello on s (request seq): the reply saying what the lake is, or an Error and s doomed
 * (another protocol version, a process that exited, a device that is another GPU). */
void session_hello(session *s, const Gmlake__Envelope *env);
/* s cannot go on: it is closed at the next turn of the loop (nothing more read from or sent to it). */
void session_doom(session *s, const char *why);
#endif
