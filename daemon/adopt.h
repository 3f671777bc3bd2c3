/* adopt.h: a client's chunks handed over after a daemon restart (adopt.c). */
#ifndef GML_ADOPT_H
#define GML_ADOPT_H
#include "session.h"

/* Why an Adopt request of s is malformed (NULL: it is not). */
const char *adopt_check(const session *s, const Gmlake__Envelope *env);
/* Import its chunks into the lake, leased to s (provisional: see adopt.c). */
void adopt_handle(session *s, const Gmlake__Envelope *req);
/* A message of kind came from s: anything but Hello/Adopt completes its hand-over. */
void adopt_seen(session *s, Gmlake__Envelope__MsgCase kind);
/* s is closing: a hand-over not complete is dropped from the lake (before parking). */
void adopt_session_closing(session *s);
#endif
