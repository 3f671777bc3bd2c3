/* control.h: the control RPC (control.c: requests; ctlsock.c: its socket). */
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
/* The same for a peer that may (1) or may not (0) change the lake: requests
 * marked `changes` in control.c's table get GML_EPERM when it may not. A
 * viewer uid (not -1: a peer that is neither root nor the daemon's user)
 * sees other users' clients without pid, name or cgroup, their chunks as
 * another user's, and only the shares it may attach. */
int control_handle_as(struct gmld *d, int may_change, long viewer, const uint8_t *req, size_t req_len, uint8_t **reply,
                      size_t *reply_len);
void control_stop(struct gmld *d);
/* After the limit was set (by: "SIGHUP", "gmlakectl limit"): where the chunks clients hold pass
 * it, a warning that says how much they hold and what the daemon does about it, logged and (when
 * said is not NULL) put in said, len bytes ("" when none: the reply to gmlakectl limit); where the lake
 * still holds or makes more than it and the limit went below was (the limit before), or no reason
 * is known, that as the reason (gmld.over_limit_why) of the tick's line of chunks released past it:
 * a reload of the same limit leaves "handed over after the restart". */
void control_say_limit_below_held(struct gmld *d, const char *by, uint64_t was, char *said, size_t len);
#endif
