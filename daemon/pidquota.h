/* A pid quota belongs to one process: the daemon watches the process (a
 * pidfd) and drops the quota when it exits, so the pid, once reused, is not
 * bound by it (another user's process, say). */
#pragma once
#include <sys/types.h>

struct gmld;
/* Watch pid for its quota: GML_ENOENT when no such process exists (the quota
 * must not be set), 0 when watched (or already). */
int pidquota_watch(struct gmld *d, pid_t pid);
/* Why pidquota_watch(pid) failed with rc, for the operator, into why: no
 * such process, a thread of another process (a tid: the quota is the
 * process's), or the pidfd could not be had. Returns why. */
const char *pidquota_why(pid_t pid, int rc, char *why, size_t len);
/* The quota of pid was cleared: stop watching. */
void pidquota_unwatch(struct gmld *d, pid_t pid);
/* At exit: every watch closed. */
void pidquota_close_all(struct gmld *d);
