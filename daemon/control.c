/* control.c: the control RPC (nng REQ/REP, one CtlRequest -> one CtlReply).
 * The REP socket's receive fd is polled by the libuv loop, so every request
 * runs on the loop thread and sees consistent state. Commands:
 *   stats    lake size, limit, chunk states, client totals, fragmentation, lease latency
 *   clients  one row per connected client
 *   chunks   owner of every chunk slot
 *   trim     release free chunks to the driver; with a pid, ask that client for its idle cache
 *   limit    set the lake limit (free chunks over it are released at once)
 *   quota    set/clear a per-pid or per-uid quota */
#include "daemon.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <nng/protocol/reqrep0/rep.h>
#include <nng/transport/ipc/ipc.h>
#include <stdlib.h>
#include <string.h>

static void fill_stats(gmld *d, Gmlake__LakeStats *st) {
  st->device = d->cfg.device;
  st->backend = (char *)d->be->name;
  st->chunk_size = d->lk.cs;
  st->limit_bytes = d->lk.limit_bytes;
  st->chunks_total = d->lk.total;
  st->chunks_free = d->lk.nfree;
  st->chunks_leased = d->lk.leased;
  st->chunks_creating = d->lk.creating;
  st->chunks_quarantined = d->lk.parked;
  st->device_total_bytes = d->device_total;
  for (session *s = d->sessions; s; s = s->next) {
    st->allocated += s->allocated;
    st->cached += s->cached;
    st->stitched += s->stitched;
  }
  uint64_t leased_bytes = (d->lk.leased + d->lk.parked) * d->lk.cs;
  st->fragmentation = leased_bytes && st->allocated <= leased_bytes ? 1.0 - (double)st->allocated / (double)leased_bytes : 0;
  st->lease_count = d->lease_count;
  st->leases_refused = d->leases_refused;
  st->optional_declined = d->optional_declined;
  st->protocol_errors = d->protocol_errors;
  st->clients = d->nsessions;
  size_t n = d->nlat < LAT_RING ? d->nlat : LAT_RING;
  if (n) {
    uint64_t *tmp = malloc(n * sizeof *tmp);
    if (tmp) {
      memcpy(tmp, d->lat_ns, n * sizeof *tmp);
      st->lease_p50_us = gml_percentile_u64(tmp, n, 50) / 1e3;
      st->lease_p99_us = gml_percentile_u64(tmp, n, 99) / 1e3;
      free(tmp);
    }
  }
}

static void handle_request(gmld *d, const Gmlake__CtlRequest *req, Gmlake__CtlReply *rep, void **to_free) {
  static Gmlake__LakeStats st;
  gmlake__lake_stats__init(&st);
  switch (req->req_case) {
  case GMLAKE__CTL_REQUEST__REQ_STATS:
    fill_stats(d, &st);
    rep->stats = &st;
    break;
  case GMLAKE__CTL_REQUEST__REQ_CLIENTS: {
    Gmlake__ClientInfo *ci = calloc(d->nsessions ? d->nsessions : 1, sizeof *ci);
    Gmlake__ClientInfo **cp = calloc(d->nsessions ? d->nsessions : 1, sizeof *cp);
    to_free[0] = ci, to_free[1] = cp;
    if (!ci || !cp) {
      rep->code = GML_ENOMEM;
      break;
    }
    size_t i = 0;
    for (session *s = d->sessions; s; s = s->next, i++) {
      gmlake__client_info__init(&ci[i]);
      ci[i].client_id = s->id;
      ci[i].pid = s->pid;
      ci[i].uid = s->uid;
      ci[i].name = s->name;
      ci[i].leased_chunks = s->leased_chunks;
      ci[i].leased_bytes = s->leased_chunks * d->lk.cs;
      ci[i].allocated = s->allocated;
      ci[i].cached = s->cached;
      ci[i].stitched = s->stitched;
      ci[i].largest_free = s->largest_free;
      ci[i].quota_bytes = lake_quota_for(&d->lk, s->pid, s->uid);
      ci[i].since = s->since;
      ci[i].leases_refused = s->leases_refused;
      cp[i] = &ci[i];
    }
    rep->n_clients = i;
    rep->clients = cp;
    fill_stats(d, &st);
    rep->stats = &st;
    break;
  }
  case GMLAKE__CTL_REQUEST__REQ_CHUNKS: {
    size_t n = d->lk.nslots;
    Gmlake__ChunkInfo *ci = calloc(n ? n : 1, sizeof *ci);
    Gmlake__ChunkInfo **cp = calloc(n ? n : 1, sizeof *cp);
    to_free[0] = ci, to_free[1] = cp;
    if (!ci || !cp) {
      rep->code = GML_ENOMEM;
      break;
    }
    size_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
      lake_chunk *c = &d->lk.chunks[i];
      if (c->state == CHUNK_UNUSED) continue;
      gmlake__chunk_info__init(&ci[k]);
      ci[k].chunk_id = lake_chunk_id(&d->lk, i);
      ci[k].owner_pid = 0;
      if (c->state == CHUNK_LEASED)
        for (session *s = d->sessions; s; s = s->next)
          if (s->id == c->owner) ci[k].owner_pid = s->pid;
      if (c->state == CHUNK_PARKED) ci[k].owner_pid = -1;
      cp[k] = &ci[k];
      k++;
    }
    rep->n_chunks = k;
    rep->chunks = cp;
    fill_stats(d, &st);
    rep->stats = &st;
    break;
  }
  case GMLAKE__CTL_REQUEST__REQ_TRIM: {
    int pid = req->trim ? req->trim->client_pid : 0;
    if (pid) {
      session *s = session_by_pid(d, pid);
      if (!s) {
        rep->code = GML_EINVAL;
        rep->message = "no client with that pid";
        break;
      }
      session_send_reclaim(s, 0);
    }
    rep->trimmed_chunks = lake_trim(&d->lk, 0);
    d->prefetch_suspended = 1; /* stay trimmed until demand comes back */
    GML_INFO("trim: released %llu free chunk(s) to the driver%s", (unsigned long long)rep->trimmed_chunks,
             pid ? " and asked the client for its idle cache" : "");
    break;
  }
  case GMLAKE__CTL_REQUEST__REQ_SET_LIMIT_BYTES: {
    uint64_t lim = req->set_limit_bytes;
    if (lim < d->lk.cs) {
      rep->code = GML_EINVAL;
      rep->message = "limit below one chunk";
      break;
    }
    d->lk.limit_bytes = lim;
    uint64_t limit_chunks = lim / d->lk.cs;
    while (d->lk.total > limit_chunks && d->lk.nfree) lake_trim(&d->lk, d->lk.nfree - 1);
    GML_INFO("limit set to %llu bytes", (unsigned long long)lim);
    fill_stats(d, &st);
    rep->stats = &st;
    break;
  }
  case GMLAKE__CTL_REQUEST__REQ_SET_QUOTA: {
    const Gmlake__QuotaRequest *q = req->set_quota;
    if (!q || lake_set_quota(&d->lk, q->by_uid, q->by_uid ? q->uid : (uint32_t)q->pid, q->bytes)) {
      rep->code = GML_EINVAL;
      rep->message = "bad quota";
      break;
    }
    GML_INFO("quota of %s %u set to %llu bytes", q->by_uid ? "uid" : "pid", q->by_uid ? q->uid : (unsigned)q->pid,
             (unsigned long long)q->bytes);
    break;
  }
  default:
    rep->code = GML_EINVAL;
    rep->message = "unknown request";
  }
}

int control_handle(gmld *d, const uint8_t *req_buf, size_t req_len, uint8_t **reply, size_t *reply_len) {
  Gmlake__CtlReply rep = GMLAKE__CTL_REPLY__INIT;
  Gmlake__CtlRequest *req = NULL;
  if (req_len > GML_MAX_FRAME || !(req = gmlake__ctl_request__unpack(NULL, req_len, req_buf))) {
    rep.code = GML_EPROTO;
    rep.message = "malformed control request";
    d->protocol_errors++;
  }
  void *to_free[2] = {NULL, NULL};
  if (req) handle_request(d, req, &rep, to_free);
  size_t n = gmlake__ctl_reply__get_packed_size(&rep);
  uint8_t *out = malloc(n ? n : 1);
  if (out) gmlake__ctl_reply__pack(&rep, out);
  free(to_free[0]), free(to_free[1]);
  if (req) gmlake__ctl_request__free_unpacked(req, NULL);
  if (!out) return GML_ENOMEM;
  *reply = out;
  *reply_len = n;
  return 0;
}

static void on_ctl(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  gmld *d = h->data;
  for (;;) {
    nng_msg *msg;
    int rv = nng_recvmsg(d->ctl, &msg, NNG_FLAG_NONBLOCK);
    if (rv == NNG_EAGAIN) return;
    if (rv) {
      GML_WARN("control receive: %s", nng_strerror(rv));
      return;
    }
    uint8_t *out;
    size_t n;
    if (control_handle(d, nng_msg_body(msg), nng_msg_len(msg), &out, &n)) {
      nng_msg_free(msg);
      continue;
    }
    nng_msg_clear(msg);
    if (nng_msg_append(msg, out, n) == 0) {
      if ((rv = nng_sendmsg(d->ctl, msg, NNG_FLAG_NONBLOCK)) != 0) {
        GML_WARN("control send: %s", nng_strerror(rv));
        nng_msg_free(msg);
      }
    } else {
      nng_msg_free(msg);
    }
    free(out);
  }
}

int control_start(gmld *d) {
  int rv = nng_rep0_open(&d->ctl);
  if (rv) {
    GML_ERR("control socket: %s", nng_strerror(rv));
    return GML_ESYS;
  }
  nng_listener l;
  if ((rv = nng_listener_create(&l, d->ctl, d->cfg.control_url)) != 0) {
    GML_ERR("control %s: %s", d->cfg.control_url, nng_strerror(rv));
    nng_close(d->ctl);
    return GML_ESYS;
  }
  if (!strncmp(d->cfg.control_url, "ipc://", 6)) nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, (int)d->cfg.socket_mode);
  nng_socket_set_size(d->ctl, NNG_OPT_RECVMAXSZ, GML_MAX_FRAME);
  if ((rv = nng_listener_start(l, 0)) != 0) {
    GML_ERR("control %s: %s", d->cfg.control_url, nng_strerror(rv));
    nng_close(d->ctl);
    return GML_ESYS;
  }
  if ((rv = nng_socket_get_int(d->ctl, NNG_OPT_RECVFD, &d->ctl_fd)) != 0) {
    GML_ERR("control recv fd: %s", nng_strerror(rv));
    nng_close(d->ctl);
    return GML_ESYS;
  }
  uv_poll_init(d->loop, &d->ctl_poll, d->ctl_fd);
  d->ctl_poll.data = d;
  uv_poll_start(&d->ctl_poll, UV_READABLE, on_ctl);
  return 0;
}

void control_stop(gmld *d) {
  uv_poll_stop(&d->ctl_poll);
  uv_close((uv_handle_t *)&d->ctl_poll, NULL);
  nng_close(d->ctl);
}
