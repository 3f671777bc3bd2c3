/* A pid quota belongs to one process: the daemon watches the process (a
 * pidfd) and drops the quota when it exits, so the pid, once reused, is not
 * bound by it (another user's process, say). */
#pragma once
#include <sys/types.h>

struct gmld;
/* Watch pid for its quota: GML_ENOENT when no such process exists (the quota
 * must not be set), 0 when watched (or already). */
int pidquota_watch(struct gmld *d, pid_t pid);
/* The quota of pid was cleared: stop watching. */
void pidquota_unwatch(struct gmld *d, pid_t pid);
/* At exit: every watch closed. */
void pidquota_close_all(struct gmld *d);
