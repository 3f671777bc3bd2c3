/* trust.c: the daemon's answers to the trust model's questions (broker.h,
 * broker_trust; docs/operating.md, "Security and trust model").
 *
 * None, on purpose: a free chunk last leased to another uid is never
 * scrubbed and handed on; it goes to another uid only made anew (released
 * to the driver, a new one created). The daemon cannot revoke a handle it
 * passed out, nor see every holder of one: a client may have dup'ed its
 * fds, and handed them to a process of another uid (a second account, a
 * user namespace's subuid, a share's attacher) that outlives every process
 * of the chunk's uid. Scrubbing once "no process of that uid is left" (the
 * /proc scan this file did) let such a holder read the next tenant's bytes:
 * uid eve passed a leased chunk's fd to uid mallory (not even in the
 * socket's group) and exited; alice was leased the scrubbed chunk and
 * mallory read what she wrote. A chunk made anew is memory no one else
 * holds. */
#include "daemon.h"

void trust_install(gmld *d) { d->br.trust = (broker_trust){.uid_gone = NULL, .scrub = NULL, .arg = d}; }
