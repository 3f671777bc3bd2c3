/* adopt.c: a client's chunks handed over after a daemon restart (the
 * client's side is client/link.c). Its hello says `adopting`; Adopt
 * requests follow, up to GML_MAX_LEASE_CHUNKS chunks each with an fd each
 * (kept by the receiver), and each chunk is imported into the lake, leased
 * to that client under a new id.
 *
 * The hand-over is one transaction: the chunks adopted on a connection are
 * provisional until the client sends anything but an Adopt (its usage
 * report follows at once: then it has every reply and counts the hand-over
 * done). A connection that ends before that (a batch refused, an export
 * that failed on the client's side, the connection dropped) had its
 * hand-over fail: the client goes on holding and mapping every chunk and
 * offers them all again on its next connection, so what this connection
 * adopted is dropped from the lake (our imported handle released, the
 * client's keeps the memory), not parked: parked, it would be counted a
 * second time by the next hand-over. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "adopt.h"
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include <fcntl.h>
#include <unistd.h>

const char *adopt_check(const session *s, const Gmlake__Envelope *env) {
  if (!session_keeps_fds(s)) return "adopt without hello's adopting";
  return session_fds_kept(s) < (int)env->adopt->n_old_ids ? "adopt without its fds" : NULL;
}

void adopt_handle(session *s, const Gmlake__Envelope *req) {
  gmld *d = s->d;
  uint32_t n = (uint32_t)req->adopt->n_old_ids, done = 0;
  int fds[GML_MAX_LEASE_CHUNKS];
  uint64_t ids[GML_MAX_LEASE_CHUNKS];
  session_take_fds(s, (int)n, fds); /* adopt_check: they are there */
  if (broker_adopt_room(&d->br, &s->bc, n) < n) {
    for (uint32_t i = 0; i < n; i++) close(fds[i]);
    CONN_WARN(s->bc.uid,
              "client %llu (pid %d, uid %u): its hand-over of %u more chunk(s) is past what the lake adopts (its limit "
              "for one "
              "user, twice its limit for all): refused, it keeps its chunks uncounted",
              (unsigned long long)s->bc.id, (int)s->bc.pid, (unsigned)s->bc.uid, n);
    session_send_error(s, req->seq, GML_ENOMEM, "the lake takes no more adopted chunks");
    return;
  }
  char who[160] = "";
  if (broker_quota_room(&d->br, &s->bc, NULL, who, sizeof who) < n) { /* what it holds counts as any lease does */
    for (uint32_t i = 0; i < n; i++) close(fds[i]);
    CONN_WARN(
        s->bc.uid,
        "client %llu (pid %d, uid %u): its hand-over is over the quota of %s: refused, it keeps its chunks uncounted",
        (unsigned long long)s->bc.id, (int)s->bc.pid, (unsigned)s->bc.uid, GML_LOG_ESC(who));
    session_send_error(s, req->seq, GML_EQUOTA, "handing over %u more chunk(s) is over the quota of %s", n, who);
    return;
  }
  const char *why = "cannot be imported";
  for (; done < n; done++) {
    gml_phys phys;
    uint64_t ident = 0;
    /* only a chunk a daemon (of our uid) made, and none the lake holds already: a client that hands over its own
     * file (read by it later), or one chunk many times, would have it leased to others or fill the lake */
    if (d->be->ops->chunk_ident && d->be->ops->chunk_ident(d->be, fds[done], &ident)) {
      why = "is not a chunk of the lake's (another file, size or owner, or read-only)";
      break;
    }
    if (lake_find_ident(&d->lk, ident) >= 0) {
      why = "is a chunk the lake holds already";
      break;
    }
    if (lake_retired(&d->lk,
                     ident)) { /* returned (tainted, or made room for another) and kept: its memory is the client's */
      why = "is a chunk this lake released, whose fd the client kept";
      break;
    }
    int imp = fcntl(fds[done], F_DUPFD_CLOEXEC, 0); /* the import takes one fd, the lake keeps the other */
    if (imp < 0 || d->be->ops->chunk_import(d->be, imp, &phys)) break;
    long idx = lake_adopt(&d->lk, s->bc.id, (uint32_t)s->bc.uid, phys, fds[done]);
    if (idx < 0) {
      d->be->ops->chunk_release(d->be, phys);
      break;
    }
    ids[done] = lake_chunk_id(&d->lk, (uint32_t)idx);
  }
  broker_adopted(&d->br, &s->bc, done);
  s->adopted += done;
  if (done) /* the lake may pass its limit now, or once the chunks being made land */
    snprintf(d->over_limit_why, sizeof d->over_limit_why, "handed over after the restart");
  if (done < n) { /* not a chunk of ours (wrong size, not importable): the client is confused or hostile */
    for (uint32_t i = done; i < n; i++) close(fds[i]);
    CONN_WARN(s->bc.uid, "client %llu (pid %d, uid %u): chunk %u of its adoption %s: closing it",
              (unsigned long long)s->bc.id, (int)s->bc.pid, (unsigned)s->bc.uid, done, why);
    session_send_error(s, req->seq, GML_EPROTO, "chunk %u of an adoption %s", done, why);
    session_doom(s, "an adoption of what is not a chunk of the lake's");
    return;
  }
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__AdoptReply r = GMLAKE__ADOPT_REPLY__INIT;
  r.n_chunk_ids = n;
  r.chunk_ids = ids;
  env.seq = req->seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_ADOPT_REPLY;
  env.adopt_reply = &r;
  session_send_msg(s, &env, NULL, 0);
  CONN_INFO(s->bc.uid, "client %llu (pid %d) handed over %u chunk(s) it held before the restart (%llu now)",
            (unsigned long long)s->bc.id, (int)s->bc.pid, n, (unsigned long long)s->bc.leased_chunks);
}

const char *adopt_seen(session *s, const Gmlake__Envelope *env) {
  if (env->msg_case == GMLAKE__ENVELOPE__MSG_HELLO) {
    if (!env->hello->adopting) return NULL;
    /* an adopting connection keeps up to GML_MAX_LEASE_CHUNKS fds until its Adopt: bounded per user, or one
     * user's connections (max-clients-per-uid of them) would hold the daemon's fd limit (20,000 here: 158 did) */
    int n = 0;
    for (broker_client *c = s->d->br.clients; c; c = c->next)
      n += c->uid == s->bc.uid && session_keeps_fds(session_of(c));
    return n >= ADOPT_HANDOVERS_PER_UID ? "too many hand-overs of this user at once (it may try again)" : NULL;
  }
  if (env->msg_case == GMLAKE__ENVELOPE__MSG_ADOPT) return NULL;
  if (session_fds_kept(s)) return "file descriptors with a message other than an Adopt";
  session_keep_fds(s, 0); /* the hand-over is over: no more fds from it */
  if (!s->adopted) return NULL;
  CONN_INFO(s->bc.uid, "client %llu (pid %d): its hand-over of %llu chunk(s) is complete", (unsigned long long)s->bc.id,
            (int)s->bc.pid, (unsigned long long)s->adopted);
  s->adopted = 0;
  return NULL;
}

void adopt_session_closing(session *s) {
  if (!s->adopted) return;
  gmld *d = s->d;
  uint64_t dropped = 0;
  for (uint32_t i = 0; i < d->lk.nslots; i++) /* nothing but Adopts came: every chunk it holds was adopted here */
    if (d->lk.chunks[i].state == CHUNK_LEASED && d->lk.chunks[i].owner == s->bc.id) {
      lake_unadopt(&d->lk, i);
      dropped++;
    }
  s->bc.leased_chunks -= dropped;
  s->adopted = 0;
  CONN_WARN(s->bc.uid,
            "client %llu (pid %d) left before its hand-over was complete: the %llu chunk(s) it handed over are dropped "
            "from the lake (it keeps them and offers them all again when it reconnects)",
            (unsigned long long)s->bc.id, (int)s->bc.pid, (unsigned long long)dropped);
}
