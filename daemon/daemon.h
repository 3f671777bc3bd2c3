/* daemon.h: the state of gmlaked that its parts share, all touched on the
 * libuv loop thread only (the creator pool keeps its own queue).
 *
 * The parts, each using only those above it (no include or call cycle; the
 * files a part uses in brackets):
 *   lake.c      chunks, owners, the limit, quotas                     no I/O
 *   quotas.c    which clients a quota binds (pid, uid, cgroup v2/v1), no I/O
 *               the room it leaves, named quotas' peaks                (lake)
 *   broker.c    every lease decision: serve, wait, reclaim from whom,  no I/O
 *               refuse, optional leases declined, quotas, refill       (lake, quotas)
 *   lakesize.c  how big the lake is: chunks to order, trim, the limit  (broker)
 *   creator.c   a worker pool that makes N chunks and hands them back  (backend only)
 *   config.c    settings: one option table for the file, flags, --help
 *   conn.c      a connection's send queue, the listening socket, pidfds (wire only)
 *   fdbudget.c  the fd table shared out from RLIMIT_NOFILE: unread replies,
 *               connections, the daemon's own work                    (no I/O)
 *   trust.c     the trust model's answers: none (a chunk for another uid is
 *               made anew); trust_sees, who a control peer may see
 *   pidquota.c  a pid quota lasts as long as its process              (conn)
 *   names.c     the endpoints named after the GPU's UUID, gmlake-N links (config, backend)
 *   session.c   the sessions' transport: frames read within bounds, the send
 *               queue, timeouts, a session's life; what frames mean it hands
 *               to the protocol's hooks (session_ops)                 (broker, conn, fdbudget)
 *   listen.c    accepting, within the connection limits               (session, conn)
 *   grant.c     the broker's lease decisions carried out on a session:
 *               chunks sent (streamed leases reply after reply), refusals,
 *               reclaim requests; the tick's review of waiting leases  (broker, session)
 *   hello.c     a client's hello: who, its GPU (another's is refused), the reply (session)
 *   adopt.c     chunks handed over after a restart, all or nothing     (lake, broker, session)
 *   shares.c    shared read-only memory: shares, their mappers         (lake, session, grant)
 *   park.c      the end of a session: chunks back, or parked until its
 *               process exits                          (lake, broker, adopt, shares, grant)
 *   control.c   the control RPC, handlers in a table                   (broker, quotas, session, grant, shares,
 *                                                                       pidquota)
 *   dispatch.c  the client protocol: requests by table to the handlers
 *               above, the transport's hooks installed at start        (grant, hello, adopt, shares, park,
 *                                                                       listen, pidquota)
 *   ctlsock.c   the control socket on the loop; who may change what   (control, conn)
 *   metrics.c   Prometheus text over HTTP                              (control)
 *   main.c      start-up, signals, the tick, the creators' callback    (all)
 * The calls upwards go through tables installed from above: the creator
 * pool's completion callback (main.c), the transport's session_ops
 * (dispatch.c) and the broker's trust hooks (trust.c). */
#ifndef GML_DAEMON_H
#define GML_DAEMON_H
#include "backend.h"
#include "broker.h"
#include "config.h"
#include "creator.h"
#include "lake.h"
#include "util.h"
#include <sys/types.h>
#include <uv.h>

typedef struct parked_owner { /* a client gone while its process lives on */
  struct parked_owner *next;
  struct gmld *d;
  uint64_t owner;
  int pidfd;
  pid_t pid;
  uv_poll_t poll;
  broker_client bc; /* on the broker's parked list: its chunks count in its quotas */
} parked_owner;

#define GMLD_NAME_MAX 320 /* a socket's path (sun_path is 108), with room */

/* The fd table's shares, set at start from RLIMIT_NOFILE (fdbudget.c). */
typedef struct fd_budget {
  size_t limit;       /* RLIMIT_NOFILE */
  size_t queued_max;  /* fds in all connections' unread replies */
  size_t session_max; /* ... in one connection's */
  size_t conns_max;   /* connections (a socket and a pidfd each) */
} fd_budget;

typedef struct gmld {
  gmld_config cfg;
  uv_loop_t *loop;
  gml_backend *be;
  lake lk;
  broker br; /* the lease policy; its client list is the sessions' */
  creator cr;
  uint64_t device_total;
  int listen_fd;
  uv_poll_t listen_poll;
  uv_timer_t accept_pause;                 /* accepting paused (out of fds) until it fires (listen.c) */
  uint64_t accept_log_ns, accept_log_held; /* accept warnings: one a second */
  uv_idle_t kick;                          /* the next turn: doomed sessions closed, backlogs read (session.c) */
  const struct session_ops *session_ops;   /* the protocol the sessions' transport calls (dispatch.c installs it) */
  int ctl_fd;                              /* the control socket (ctlsock.c) */
  uv_poll_t ctl_poll;
  struct ctl_conn *ctl_conns;
  size_t nctl_conns;
  uv_timer_t ctl_tick;   /* control connections' timeouts, accepting resumed (ctlsock.c) */
  int ctl_accept_paused; /* accept() was out of fds: polled again at the next ctl_tick */
  uint64_t ctl_log_ns;   /* refused control connections: one warning a second */
  size_t fds_queued;     /* fds waiting in all sessions' send queues (dups the queues own) */
  fd_budget fdb;         /* what the fd limit allows them, and the connections (fdbudget.c) */
  int http_fd;           /* --metrics-listen (metrics.c); -1: none */
  uv_poll_t http_poll;
  struct http_conn *http_conns;
  size_t nhttp_conns;
  int http_accept_paused; /* accept() was out of fds: polled again at the next tick (metrics.c) */
  uv_signal_t sigterm, sigint, sighup;
  int argc; /* the command line, read again with the config file on SIGHUP */
  char **argv;
  char status[512];         /* the last STATUS= sent to systemd */
  char reload_refused[200]; /* why the last SIGHUP changed nothing ("" when it took): in STATUS= */
  uint64_t status_ns;
  uv_timer_t tick;
  parked_owner *parked;
  struct pid_watch *pid_watches; /* the processes that have a pid quota (pidquota.c) */
  struct share *shares;          /* published read-only memory (shares.c) */
  uint64_t next_share_id;
  uint64_t next_client_id;
  uint64_t start_ns; /* gmli_now_ns() at start: the hand-over window counts from it */
  uint64_t instance; /* random at start, never 0: HelloReply.instance (a client reconnecting to it does not adopt) */
  char over_limit_why[80]; /* why the lake holds (or makes) more than its limit, for the tick's line of chunks released
                             * past it: a hand-over after the restart (adopt.c), or a limit set below it (control.c) */
  /* Counters, in the message that reports them: a new one is a field of
   * LakeStats and the line that counts it (control.c and gmlakectl show it). */
  Gmlake__LakeStats counters;
  int stopping;
  char links[2][GMLD_NAME_MAX];        /* names.c: the gmlake-N links made (socket, control); "": none */
  char link_targets[2][GMLD_NAME_MAX]; /* what each points at (gmlake-<UUID>.sock, .ctl) */
} gmld;

/* The endpoints' names (names.c): the defaults a config leaves out, after
 * the device's UUID and index (be NULL: not opened yet, only whether there
 * are defaults at all), and which of the two (socket, control) took theirs;
 * the gmlake-N links to those, made once they listen and removed at exit. */
int names_defaults(gmld_config *c, const gml_backend *be, int took_default[2]);
void names_link(gmld *d, const int took_default[2]);
void names_unlink(gmld *d);

/* HTTP /metrics (metrics.c): start (0, or an error said on stderr), the
 * tick's timeouts, stop. */
int metrics_start(gmld *d);
void metrics_tick(gmld *d);
void metrics_stop(gmld *d);

/* The fd budget (fdbudget.c): set from RLIMIT_NOFILE (at start, after
 * gmli_raise_fd_limit), said in the log with a warning when the lake's limit
 * does not fit; the fds one more reply may dup into a queue that holds
 * session_queued; why a reply of nfds fds is refused, naming the limit; 1
 * when the daemon's fd table is full now (a failed creation says so). */
void fdbudget_init(gmld *d);
void fdbudget_say(const gmld *d);
size_t fdbudget_room(const gmld *d, size_t session_queued);
void fdbudget_refusal(const gmld *d, size_t session_queued, int nfds, char *out, size_t len);
int fdbudget_out_of_fds(void);

/* The trust model's hooks into the broker (trust.c). */
void trust_install(gmld *d);
/* Whether a control peer of uid viewer (-1: root or the daemon's user, who see all) sees who a process
 * of uid is (its pid, name, cgroup): the trust model's, so the control RPC and the shares it lists ask
 * it alike without one of them calling the other. */
static inline int trust_sees(long viewer, uint32_t uid) { return viewer < 0 || uid == (uint32_t)viewer; }

/* Order from the creators what the broker says the lake needs now. */
static inline void daemon_refill(gmld *d) {
  if (!d->stopping) creator_make(&d->cr, broker_refill(&d->br, gmli_now_ns()));
}
#endif
