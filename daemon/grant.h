/* grant.h: the broker's lease decisions carried out on sessions (grant.c),
 * and the tick that reviews the leases that wait. */
#ifndef GML_GRANT_H
#define GML_GRANT_H
#include "session.h"

/* A lease asked by s (request seq); the tick reviews it while it waits. */
void grant_lease(session *s, uint64_t seq, uint32_t count, int optional, int streamed);
void grant_review(session *s, uint64_t now_ns);
void grant_more(session *s);                 /* s's send queue drained: its streamed lease gets what is free */
void sessions_serve_pending(struct gmld *d); /* after chunks became free */
void sessions_tick(struct gmld *d);          /* waiting leases: reclaims, deadlines; the transport's timeouts */
/* Ask s for bytes of its idle cache (0: all of it); valid_ms 0: until served. */
void grant_send_reclaim(session *s, uint64_t bytes, uint64_t valid_ms);
#endif
