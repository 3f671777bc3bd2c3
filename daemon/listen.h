/* listen.h: the client socket and accepting connections (listen.c). */
#ifndef GML_LISTEN_H
#define GML_LISTEN_H
struct gmld;
int listen_start(struct gmld *d);             /* 0, or an error: the socket could not be made */
void sessions_stop_listening(struct gmld *d); /* the socket closed and its file removed */
#endif
