/* fdbudget.c: the daemon's fd table, shared out once at start from its real
 * limit (RLIMIT_NOFILE, after gmli_raise_fd_limit raised it as far as it may):
 *
 *   a quarter  fds waiting in clients' unread replies (dups a send queue owns,
 *              conn.h), all connections together; one connection at most two
 *              replies' worth, and half of that quarter;
 *   an eighth  the connections themselves (a socket and a pidfd each):
 *              accepting refuses a connection past them (listen.c);
 *   the rest   the daemon's own work: the lake's chunks (an fd each, and a
 *              read-only one per shared chunk on the host backend), creating
 *              them, the control and metrics sockets, the pidfds of parked
 *              clients, share mappers and pid quotas.
 *
 * A reply goes out at once when its connection's queue is empty and the
 * socket takes it: its fds then go with it and cost the daemon nothing. Only
 * a reply that has to wait (the client does not read) dups its fds, and only
 * within the room left (fdbudget_room); a request whose reply has no room is
 * refused with a message that names the limit (fdbudget_refusal). Before, the
 * budget of all queues was a quarter of the limit but a connection with no fd
 * queued was always read and its reply queued: each of a group member's
 * connections held one more reply, the fd table filled (a limit of 20,000),
 * another user's client was disconnected, creating chunks failed and the log
 * said "device full?". */
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <errno.h>
#include <stdio.h>
#include <sys/resource.h>

void fdbudget_init(gmld *d) {
  struct rlimit rl;
  rlim_t n = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
  if (n == RLIM_INFINITY || n > (1u << 20)) n = 1u << 20;
  d->fdb.limit = (size_t)n;
  d->fdb.queued_max = d->fdb.limit / 4;
  d->fdb.session_max = GML_MIN((size_t)2 * GML_MAX_LEASE_CHUNKS, d->fdb.queued_max / 2);
  d->fdb.conns_max = d->fdb.limit / 16; /* two fds each: an eighth of the table */
}

/* Say the shares, and whether the lake at its limit fits in what is left. */
void fdbudget_say(const gmld *d) {
  const fd_budget *b = &d->fdb;
  size_t own = b->limit - b->queued_max - 2 * b->conns_max;
  uint64_t chunks = d->lk.limit_bytes / d->lk.cs;
  GML_INFO("fd limit (RLIMIT_NOFILE) %zu: %zu fds for unread replies (%zu a connection), %zu connections, %zu for the "
           "lake's chunks and the daemon's own work",
           b->limit, b->queued_max, b->session_max, b->conns_max, own);
  if (chunks + 64 > own)
    GML_WARN(
        "the fd limit (RLIMIT_NOFILE %zu) leaves %zu fds for the lake's chunks and the daemon's own work: the limit's "
        "%llu chunks do not fit; raise it (LimitNOFILE= in the unit, ulimit -n) or lower the limit",
        b->limit, own, (unsigned long long)chunks);
}

size_t fdbudget_room(const gmld *d, size_t session_queued) {
  const fd_budget *b = &d->fdb;
  size_t mine = session_queued < b->session_max ? b->session_max - session_queued : 0;
  size_t all = d->fds_queued < b->queued_max ? b->queued_max - d->fds_queued : 0;
  return GML_MIN(mine, all);
}

void fdbudget_refusal(const gmld *d, size_t session_queued, int nfds, char *out, size_t len) {
  const fd_budget *b = &d->fdb;
  snprintf(out, len,
           "the daemon's fd limit (RLIMIT_NOFILE %zu) leaves no room for this reply's %d fds: it allows %zu fds in "
           "one connection's unread replies (%zu in this one's now) and %zu in all connections' (%zu now); read the "
           "replies, "
           "then ask again",
           b->limit, nfds, b->session_max, session_queued, b->queued_max, d->fds_queued);
}

int fdbudget_out_of_fds(void) {
  FILE *f = fopen("/dev/null", "re");
  if (f) fclose(f);
  return !f && (errno == EMFILE || errno == ENFILE);
}
