/* conn.h: a client connection's plumbing, free of daemon state (conn.c):
 * the send queue (frames and their fds, sent as the socket takes them), the
 * listening Unix socket, and whether a client's process still lives. */
#ifndef GML_CONN_H
#define GML_CONN_H
#include "wire.h"
#include <stddef.h>
#include <sys/types.h>

typedef struct tx_item {
  struct tx_item *next;
  uint8_t *buf;
  size_t len, off;
  int fds[GML_MAX_LEASE_CHUNKS];
  int nfds;                 /* sent with the first byte */
} tx_item;

typedef struct conn_txq {
  tx_item *head, *tail;
} conn_txq;

/* Encode env into a frame and queue it with its fds (the fds stay the
 * caller's: the kernel duplicates them when sent). 0 or GML_ENOMEM. */
int conn_queue(conn_txq *q, const Gmlake__Envelope *env, const int *fds, int nfds);
/* Send what the socket takes now. 0, or -1 when it failed (peer gone). */
int conn_flush(conn_txq *q, int fd);
void conn_txq_free(conn_txq *q);

/* A listening, non-blocking Unix stream socket at path (a file left by a
 * dead daemon is replaced, a live daemon's is not) with that mode and group
 * ("" = the daemon's). Returns the fd or a GML_E* code (logged). */
int conn_listen_unix(const char *path, unsigned mode, const char *group);

/* A pidfd of pid (-1 where the kernel has none), and whether that process is gone. */
int conn_pidfd_open(pid_t pid);
int conn_process_gone(int pidfd, pid_t pid);
/* Its cgroup: the v2 (unified) path of /proc/PID/cgroup ("" when none or
 * unreadable), printable characters only. */
void conn_process_cgroup(pid_t pid, char *out, size_t len);
#endif
