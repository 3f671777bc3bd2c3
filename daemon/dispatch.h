/* dispatch.h: the client protocol over the sessions' transport
 * (dispatch.c): its hooks installed at start, and everything of it ended at
 * exit. */
#ifndef GML_DISPATCH_H
#define GML_DISPATCH_H
struct gmld;
/* Before the socket listens (listen_start): the transport calls the protocol from then on. */
void dispatch_start(struct gmld *d);
/* At exit: no more connections, every session closed, parked chunks and shares released, pid watches closed. */
void dispatch_stop(struct gmld *d);
#endif
