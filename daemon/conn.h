/* conn.h: a client connection's plumbing, free of daemon state (conn.c):
 * the send queue (frames and their fds, sent as the socket takes them), the
 * listening Unix socket, and whether a client's process still lives. */
#ifndef GML_CONN_H
#define GML_CONN_H
#include "wire.h"
#include <stddef.h>
#include <sys/types.h>

/* Every fd that waits in a send queue is a reference the queue owns: dup'ed
 * when the frame is queued, closed once it is sent or dropped. A lease reply
 * that waits while its chunk is returned and trimmed (the lake closes its
 * fd, the next accept() takes the number) still carries that chunk, never
 * whatever file got the number. */
typedef struct tx_item {
  struct tx_item *next;
  uint8_t *buf;
  size_t len, off;
  size_t cost; /* counted in conn_txq.bytes */
  int nfds;    /* sent with the first byte */
  int fds[];   /* owned */
} tx_item;

typedef struct conn_txq {
  tx_item *head, *tail;
  size_t bytes;     /* memory the queue holds, items included (send-queue-max) */
  size_t nfds;      /* fds the queue owns (dups not yet sent) */
  size_t *nfds_all; /* NULL, or a count of every queue's fds that this one adds its own to */
} conn_txq;

/* Encode env into a frame and send it on sock now where nothing waits before
 * it and the socket takes it (its fds go with its first byte: no dup); what
 * the socket does not take is queued, with dups of the fds when none of it
 * went, at most fd_room of them. 0; CONN_NO_FD_ROOM when its fds would need
 * more dups than fd_room (nothing sent or queued: the caller refuses the
 * request); GML_ENOMEM, GML_ESYS (out of fds) or GML_EDAEMON (the peer is
 * gone); nothing is queued on error. */
#define CONN_NO_FD_ROOM 1
int conn_send_or_queue(conn_txq *q, int sock, const Gmlake__Envelope *env, const int *fds, int nfds, size_t fd_room);
/* Queue len bytes of frame as they are (taken over: freed by the queue). */
int conn_queue_bytes(conn_txq *q, uint8_t *frame, size_t len);
/* Send what the socket takes now. 0, or a GML_E* code when it failed
 * (GML_EDAEMON: the peer is gone). */
int conn_flush(conn_txq *q, int fd);
void conn_txq_free(conn_txq *q); /* drops every frame, closes the fds it owns */

/* A listening, non-blocking Unix stream socket at path with that mode and
 * group ("" = the daemon's). Returns the fd or a GML_E* code (logged). */
int conn_listen_unix(const char *path, unsigned mode, const char *group);
/* path may be bound: it is free, or a socket nobody answers on (a dead
 * daemon's: removed). A live daemon's socket, or a file of another kind
 * (never deleted), is an error said on stderr and in the log. */
int conn_claim_path(const char *path);
/* --socket-mode and --socket-group on a socket file ("" = the daemon's group). */
void conn_set_mode_group(const char *path, unsigned mode, const char *group);

/* A user's share of the log: a line about one of its connections (connected,
 * left, a protocol error) may be written when this says 1: 40 at once, 10 a
 * second after that, per uid, so that no group member can make the daemon
 * log as fast as it can connect. The lines left out are counted and said in
 * one line, at the user's next line let through or by conn_log_tick (called
 * every tick: a second after the user's last). */
int conn_log_ok(uint32_t uid);
void conn_log_tick(void);
#define CONN_LOG(lvl, uid, ...) ((lvl) <= gmli_log_level() && conn_log_ok(uid) ? gmli_log((lvl), __VA_ARGS__) : (void)0)
#define CONN_INFO(uid, ...) CONN_LOG(GML_LOG_INFO, uid, __VA_ARGS__)
#define CONN_WARN(uid, ...) CONN_LOG(GML_LOG_WARN, uid, __VA_ARGS__)

/* A pidfd of pid (-1 where the kernel has none), and whether that process is gone. */
int conn_pidfd_open(pid_t pid);
/* A pidfd of the process that connected socket sock (SO_PEERPIDFD: that
 * process, even if its pid was reused since; else pidfd_open(pid)). -1 with
 * *gone set when the kernel says it has exited (a process that connected,
 * handed the socket on and exited: its pid and cgroup are no one's quotas). */
int conn_peer_pidfd(int sock, pid_t pid, int *gone);
int conn_process_gone(int pidfd, pid_t pid);
/* Its cgroup: the v2 (unified) path of /proc/PID/cgroup ("" when none or
 * unreadable), printable characters only. */
/* Can a cgroup quota of PATH bind here? 0; GML_EINVAL with why (for the operator) when this host
 * mounts no cgroup2 hierarchy (v1 only: no client's cgroup can be told) or PATH is no cgroup in it;
 * "CONTROLLER:/PATH": the same of the v1 hierarchy that has CONTROLLER. */
int conn_cgroup_check(const char *path, char *why, size_t len);
void conn_process_cgroup(pid_t pid, char *out, size_t len);
/* Its cgroup v1 lines, "CONTROLLERS:PATH\n" each ("freezer:/slurm/uid_0/job_7/step_0"), as many as fit in len. */
void gmli_conn_process_cgroup_v1(pid_t pid, char *out, size_t len);
#endif
