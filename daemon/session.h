/* session.h: the transport of a client's connection to the daemon
 * (session.c): its socket, frames in, the send queue out, its timeouts, its
 * life from accept to close. What a frame means is the protocol's
 * (dispatch.c and its handlers), which the transport calls through the hooks
 * of session_ops, installed at start (sessions_start), as nng's transports
 * call a protocol's pipe ops. Handlers use only the functions below, never
 * the socket, the receive buffer or the send queue themselves. Accepting
 * connections within the limits is listen.c. */
#ifndef GML_SESSION_H
#define GML_SESSION_H
#include "broker.h"
#include "conn.h"
#include "wire.h"
#include <stddef.h>
#include <uv.h>

struct gmld;

typedef struct session {
  broker_client bc; /* who it is, its numbers, its lease in flight (broker.h) */
  struct gmld *d;
  int fd; /* -1 once closed */
  uv_poll_t poll;
  int poll_events;
  int pidfd;                 /* of the process that connected (conn_peer_pidfd); on_closing may hand it on (-1) */
  int peer_gone;             /* the kernel said that process had exited when it was accepted */
  int hello_done;            /* set by the protocol; before it, only hello_timeout_ms is given */
  uint64_t adopted;          /* chunks adopted on this connection while its hand-over is not complete (adopt.c) */
  int backlog;               /* complete frames wait in rx beyond this turn's read budget */
  uint64_t connect_ns;       /* hello must come within hello_timeout_ms of it */
  uint64_t partial_since_ns; /* a frame started arriving then and is not whole yet (0: none) */
  const char *close_why;     /* set when the session is doomed (closed at the next turn of the loop) */
  gml_rx rx;
  conn_txq txq; /* frames waiting for the socket */
} session;

static inline session *session_of(broker_client *c) { return (session *)((char *)c - offsetof(session, bc)); }

/* Why a frame was refused, for the log and the close (on_frame's why). */
#define SESSION_WHY_MAX 160

/* The protocol's hooks. All are called on the loop thread, by the transport
 * only; none may close s or free it (session_doom asks for its close at the
 * next turn), and none is called again for s once it is doomed but
 * on_closing. */
typedef struct session_ops {
  /* One whole frame from s, in the order sent, at most read_budget a turn of the loop. May send to s
   * and doom it (then no more of its frames come). Returns 0, or -1 with why set (a protocol error: the
   * transport counts it, logs it and closes s at once, and reads nothing more of it). */
  int (*on_frame)(session *s, const uint8_t *frame, size_t len, char why[SESSION_WHY_MAX]);
  /* s's socket took frames its send queue held: room for more (a streamed lease's next reply). May send to s. */
  void (*on_writable)(session *s);
  /* s is closing (why): marked closing, still on the broker's client list, its socket open but neither
   * read nor written again. The end of its session: what it holds goes back to the lake or waits for its
   * process. May keep s->pidfd (setting it to -1: the transport closes it otherwise); may not send to s. */
  void (*on_closing)(session *s, const char *why);
  /* A session has left: off the client list, its socket closed. What it held may serve others now. */
  void (*on_closed)(struct gmld *d);
} session_ops;

/* At start, before any session opens: the protocol's hooks (kept, not copied) and the loop's next-turn
 * handle (doomed sessions closed, backlogs read). */
void sessions_start(struct gmld *d, const session_ops *ops);
/* A connection accepted by listen.c: a new session (0), or an error (the caller closes fd). */
struct ucred;
int session_open(struct gmld *d, int fd, const struct ucred *cred);
/* At exit: every session closed (on_closing, on_closed as ever), the next-turn handle closed. */
void sessions_close_all(struct gmld *d);
/* The tick's part of the transport, for s: doomed when its hello or a partial frame is overdue. */
void session_timeouts(session *s, uint64_t now_ns);
session *session_by_pid(struct gmld *d, pid_t pid);

/* ---------- the send API: what handlers may do to a session ---------- */

/* A reply with its fds: 0; CONN_NO_FD_ROOM: not sent, the daemon's fd budget has no room for them
 * (session_fd_refusal says why); else s is doomed. */
int session_send_msg(session *s, Gmlake__Envelope *env, const int *fds, int nfds);
/* An Error reply to request seq. */
void session_send_error(session *s, uint64_t seq, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* s cannot go on: it is closed at the next turn of the loop (nothing more read from or sent to it). */
void session_doom(session *s, const char *why);
/* Whether a streamed lease's next reply (up to a lease's fds) may go to s
 * now: nothing waits in its queue, or the fd budget has room for its dups. */
int session_fds_room(const session *s);
/* Bytes of replies waiting in s's send queue. */
static inline size_t session_queued_bytes(const session *s) { return s->txq.bytes; }
/* Why a reply of nfds fds to s was refused (CONN_NO_FD_ROOM), naming the limit. */
void session_fd_refusal(const session *s, int nfds, char *why, size_t len);
/* fds a client sends: none unless the protocol allows up to max to wait for the message that takes
 * them (0: none from now on, the default); how many wait now; n of them taken (the caller owns them). */
static inline void session_keep_fds(session *s, int max) { s->rx.keep_max = max; }
static inline int session_keeps_fds(const session *s) { return s->rx.keep_max != 0; }
static inline int session_fds_kept(const session *s) { return s->rx.nkept; }
static inline int session_take_fds(session *s, int n, int *fds) { return gmli_rx_take_fds(&s->rx, n, fds); }
#endif
