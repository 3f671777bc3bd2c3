/* hello.h: a client's hello (hello.c). */
#ifndef GML_HELLO_H
#define GML_HELLO_H
#include "session.h"

/* A Hello on s (request seq): the reply saying what the lake is, or an Error and s doomed
 * (another protocol version, a process that exited, a device that is another GPU). */
void hello_handle(session *s, const Gmlake__Envelope *env);
#endif
