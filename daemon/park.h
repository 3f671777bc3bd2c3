/* park.h: the end of a client's session (park.c): chunks back in the lake,
 * or parked until the process that held them exits. */
#ifndef GML_PARK_H
#define GML_PARK_H
#include "session.h"

/* The transport's on_closing: s ends (why, for the log). Keeps s->pidfd to watch a process that lives on. */
void park_on_closing(session *s, const char *why);
/* At exit: every parked chunk back in the lake, every watch closed. */
void park_release_all(struct gmld *d);
#endif
