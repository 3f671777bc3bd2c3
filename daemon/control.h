/* control.h: the control RPC over nng (control.c). */
#ifndef GML_CONTROL_H
#define GML_CONTROL_H
#include <stddef.h>
#include <stdint.h>
struct gmld;
int control_start(struct gmld *d);
/* One control request (a serialized CtlRequest) in, its serialized CtlReply
 * out (malloc'd): decoding, dispatch and encoding without nng, so the fuzz
 * target runs what the daemon runs. Returns 0 or GML_ENOMEM. */
int control_handle(struct gmld *d, const uint8_t *req, size_t req_len, uint8_t **reply, size_t *reply_len);
void control_stop(struct gmld *d);
#endif
