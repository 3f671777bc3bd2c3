/* adopt.h: a client's chunks handed over after a daemon restart (adopt.c). */
#ifndef GML_ADOPT_H
#define GML_ADOPT_H
#include "session.h"

/* Why an Adopt request of s is malformed (NULL: it is not). */
const char *adopt_check(const session *s, const Gmlake__Envelope *env);
/* Import its chunks into the lake, leased to s (provisional: see adopt.c). */
void adopt_handle(session *s, const Gmlake__Envelope *req);
/* Hand-overs of one user at once (adopting connections whose hand-over is not over). */
#define ADOPT_HANDOVERS_PER_UID 16
/* A message came from s (checked on the wire): anything but Hello/Adopt completes its hand-over, and
 * from then on it may send no fds. Why it is refused (an adopting hello over the bound per user, fds
 * kept for a message other than an Adopt), or NULL. */
const char *adopt_seen(session *s, const Gmlake__Envelope *env);
/* s is closing: a hand-over not complete is dropped from the lake (before parking). */
void adopt_session_closing(session *s);
#endif
