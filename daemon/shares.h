/* shares.h: shared read-only memory in the lake. A client publishes chunks
 * it leased under a key (ShareRequest); they leave its lease and belong to
 * the share, counted once in the lake (CHUNK_SHARED). Other clients of an
 * allowed user attach (AttachRequest: the chunks' fds, read-only ones on the
 * host backend) and map them read-only. Every process that maps a share is
 * one of its mappers: the publisher, each attacher. A mapper goes away when
 * its client detaches (it unmapped) or when its process exits (a pidfd says
 * when, so a client that closed its socket but lives on still counts, like
 * parked chunks); SIGKILL included. The chunks go back to the lake when the
 * last mapper is gone.
 *
 * Who may attach: the publisher's uid always; other uids only when the
 * publisher listed them (allow_uids) or allowed any (allow_any_uid). */
#ifndef GML_SHARES_H
#define GML_SHARES_H
#include "daemon.h"
#include "session.h"

typedef struct share share;

/* A share message from s (share, attach, detach): shares_check says why it
 * is malformed against the daemon's state (NULL: it is not; else the
 * session closes the connection), shares_handle answers it (a reply, or an
 * error such as GML_ENOENT / GML_EPERM / GML_EEXIST). */
const char *shares_check(session *s, const Gmlake__Envelope *env);
void shares_handle(session *s, const Gmlake__Envelope *env);
/* s is closing; gone: its process has exited. Called before its pidfd is closed or handed on. */
void shares_session_closed(session *s, int gone);
void shares_close_all(gmld *d);
/* The control RPC's view: one ShareInfo a share (freed with shares_free_info). */
size_t shares_info(gmld *d, long viewer, Gmlake__ShareInfo ***out); /* viewer: control_handle_as */
void shares_free_info(Gmlake__ShareInfo **info, size_t n);
/* Bytes of shares the session maps. */
uint64_t shares_bytes_of(gmld *d, uint64_t session_id);
uint64_t shares_count(gmld *d);
#endif
