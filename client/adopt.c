/* adopt.c: what a reconnection says to the daemon on its new socket (keeper.c's
 * reconnect runs the hello before it takes its locks, the batches with them
 * held; no reader runs on the socket yet):
 * the adopting hello, whose failure says what happened (the connection
 * refused, the hello refused, another lake), and the Adopt batches that hand
 * our chunks over, an fd each. The daemon's side is daemon/adopt.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "log.h"
#include "util.h"
#include "wire.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void free_msg(Gmlake__Envelope *env, const int *fds, int nfds) {
  if (env) gmlake__envelope__free_unpacked(env, NULL);
  for (int i = 0; i < nfds; i++) close(fds[i]);
}

/* Send env on sock and receive its reply, or the daemon's refusal of the
 * connection (an Error of seq 0 before the close: max-clients), which is
 * read even when the send failed (the daemon closed first: EPIPE). Before,
 * the refusal was dropped as a message of no request, and the reason with it.
 * c->seq is conn_lock's: a caller without it (the hello) sets env->seq itself. */
static int direct_call(gml_client *c, int sock, Gmlake__Envelope *env, const int *fds, int nfds,
                       Gmlake__Envelope **reply) {
  if (!env->seq) env->seq = ++c->seq;
  uint8_t *frame;
  size_t len;
  int rc = gmli_wire_encode(env, &frame, &len);
  if (rc) return rc;
  int sent = gmli_wire_send(sock, frame, len, fds, nfds);
  free(frame);
  if (sent && !gmli_wire_refusal_waits(sock)) return sent; /* else a refusal's reason waits: read it */
  for (;;) {
    int rfds[GML_MAX_LEASE_CHUNKS], rn = 0;
    if ((rc = gmli_wire_recv(sock, reply, rfds, &rn, GML_MAX_LEASE_CHUNKS))) return sent ? sent : rc;
    free_msg(NULL, rfds, rn);
    if (!(*reply)->seq && (*reply)->msg_case == GMLAKE__ENVELOPE__MSG_ERROR) return 0; /* the connection refused */
    if (!sent && (*reply)->seq == env->seq) return 0;
    free_msg(*reply, NULL, 0); /* a request of the new daemon's (reclaim): nothing idle is handed over yet */
  }
}

int gmli_adopt_hello(gml_client *c, int sock, gml_hello_said *said, char *why, size_t whylen) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT, *r = NULL;
  Gmlake__Hello h;
  char name[GML_HELLO_NAME];
  gmli_hello_init(c, &h, name);
  h.adopting = 1;
  env.msg_case = GMLAKE__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  /* conn_lock only for the seq, not across the round trip (up to 5 s): an allocator call that
   * passed the daemon_gone check before the reader saw the end may still be sending with it */
  pthread_mutex_lock(&c->conn_lock);
  env.seq = ++c->seq;
  pthread_mutex_unlock(&c->conn_lock);
  int rc = direct_call(c, sock, &env, NULL, 0, &r);
  if (rc) {
    snprintf(why, whylen, "our hello got no reply (%s: the connection closed, or 5 s passed)", gml_strerror(rc));
    return rc;
  }
  const Gmlake__HelloReply *hr = r->hello_reply;
  char theirs[32], ours[32];
  if (r->msg_case == GMLAKE__ENVELOPE__MSG_ERROR) { /* max-clients, a protocol version, ...: the daemon says */
    snprintf(why, whylen, "it refused %s: %s", r->seq ? "our hello" : "the connection", r->error->message);
    rc = GML_EDAEMON;
  } else if (r->msg_case != GMLAKE__ENVELOPE__MSG_HELLO_REPLY) {
    snprintf(why, whylen, "it answered our hello with a message of kind %d", (int)r->msg_case);
    rc = GML_EPROTO;
  } else if (hr->chunk_size != c->be->chunk_size || strcmp(hr->backend, c->be->name)) { /* not where ours came from */
    snprintf(why, whylen, "it serves %s chunks of %s, we hold %s chunks of %s: not the lake we held chunks of",
             hr->backend, gmli_format_bytes(hr->chunk_size, theirs, sizeof theirs), c->be->name,
             gmli_format_bytes(c->be->chunk_size, ours, sizeof ours));
    rc = GML_EPROTO;
  } else {
    uint64_t inst = hr->instance;
    said->same = inst && inst == c->daemon_instance; /* 0: a daemon that does not say: adopt */
    said->no_adopt = hr->no_adopt;
    said->instance = inst;
    said->client_id = hr->client_id;
    said->max_stream = GML_MIN(hr->max_stream, (uint64_t)GML_LEASE_MAX); /* the new daemon may be older */
    said->mono_ns = hr->mono_ns;
    said->lease_wait_ns = (uint64_t)hr->lease_wait_ms * 1000000ull;
    said->mem_info = hr->mem_info;
  }
  free_msg(r, NULL, 0);
  return rc;
}

int gmli_adopt_flush(gml_adopt_batch *b) {
  if (!b->n || b->rc) return b->rc;
  gml_backend *be = b->c->be;
  int fds[GML_MAX_LEASE_CHUNKS];
  size_t k = 0;
  for (; k < b->n; k++)
    if ((b->rc = be->ops->chunk_export(be, b->phys[k], &fds[k]))) {
      GML_ERR("cannot hand chunk %zu over to the new daemon: its export failed: %s", b->total + k, gml_strerror(b->rc));
      break;
    }
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT, *r = NULL;
  Gmlake__AdoptRequest ar = GMLAKE__ADOPT_REQUEST__INIT;
  ar.n_old_ids = b->n;
  ar.old_ids = b->old;
  env.msg_case = GMLAKE__ENVELOPE__MSG_ADOPT;
  env.adopt = &ar;
  if (!b->rc) b->rc = direct_call(b->c, b->sock, &env, fds, (int)b->n, &r);
  free_msg(NULL, fds, (int)k); /* sent (the daemon has its own copies) or not */
  if (b->rc) return b->rc;
  if (r->msg_case != GMLAKE__ENVELOPE__MSG_ADOPT_REPLY || r->adopt_reply->n_chunk_ids != b->n) {
    GML_ERR("the new daemon did not adopt our chunks: %s",
            r->msg_case == GMLAKE__ENVELOPE__MSG_ERROR ? r->error->message : "unexpected reply");
    int code = r->msg_case == GMLAKE__ENVELOPE__MSG_ERROR ? r->error->code : 0;
    b->rc = code == GML_EQUOTA || code == GML_ENOMEM ? code : GML_EPROTO; /* refused: kept as ours (reconnect) */
  } else {
    for (size_t i = 0; i < b->n; i++) *b->idp[i] = r->adopt_reply->chunk_ids[i];
    b->total += b->n;
    b->n = 0;
  }
  free_msg(r, NULL, 0);
  return b->rc;
}

void gmli_adopt_add(void *ctx, gml_phys phys, uint64_t *id) {
  gml_adopt_batch *b = ctx;
  if (b->rc || !*id) return; /* id 0: not a chunk of the daemon's */
  b->phys[b->n] = phys;
  b->old[b->n] = *id & ~(GML_ID_PARKED | GML_ID_UNCOUNTED);
  b->idp[b->n++] = id;
  if (b->n == GML_MAX_LEASE_CHUNKS) gmli_adopt_flush(b);
}
