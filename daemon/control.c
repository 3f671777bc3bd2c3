/* control.c: the control RPC (one CtlRequest -> one CtlReply; its socket,
 * served on the libuv loop, is ctlsock.c), so every request runs on the loop
 * thread and sees consistent state. Requests (the `routes` table below;
 * those marked `changes` only from root or the daemon's uid):
 *   stats    lake size, limit, chunk states, client totals, fragmentation, lease latency
 *   clients  one row per connected client
 *   chunks   owner of every chunk slot
 *   shares   shared read-only memory: key, size, publisher, who may attach, who maps it
 *   trim     release free chunks to the driver; with a pid, ask that client for its idle cache
 *   limit    set the lake limit (free chunks over it are released at once; below what clients hold,
 *            a warning in the reply's message, code 0)
 *   quota    set/clear a quota of a process (all its connections), a user or a cgroup; with a name (a job's, a
 *            pod's) its peak is kept and the reply says it (QuotaInfo), and the name alone changes or removes it
 *   quotas   every quota: holder, name, bytes, what its clients hold, its peak */
#include "control.h"
#include "daemon.h"
#include "grant.h"
#include "pidquota.h"
#include "session.h"
#include "shares.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"

#define GML_STR2(x) #x
#define GML_STR(x) GML_STR2(x)
#define GMLD_VERSION_STRING GML_STR(GML_VERSION_MAJOR) "." GML_STR(GML_VERSION_MINOR) "." GML_STR(GML_VERSION_PATCH)
#include <stdlib.h>
#include <string.h>

static void fill_stats(gmld *d, Gmlake__LakeStats *st) {
  const broker *b = &d->br;
  *st = d->counters; /* then the gauges */
  st->device = d->cfg.device;
  st->backend = (char *)d->be->name;
  st->chunk_size = d->lk.cs;
  st->limit_bytes = d->lk.limit_bytes;
  st->chunks_total = d->lk.total;
  st->chunks_free = d->lk.nfree;
  st->chunks_leased = d->lk.leased;
  st->chunks_creating = d->lk.creating;
  st->chunks_parked = d->lk.parked;
  st->device_total_bytes = d->device_total;
  uint64_t used = 0; /* in the lake's chunks: a client's part at most what it leases (uncounted chunks' are its own) */
  for (const broker_client *c = b->clients; c; c = c->next) {
    used += GML_MIN(c->allocated + c->growable_mapped, (uint64_t)c->leased_chunks * d->lk.cs);
    st->allocated += c->allocated;
    st->cached += c->cached;
    st->stitched += c->stitched;
    st->growable_mapped += c->growable_mapped;
    st->growable_unmapped += c->growable_unmapped;
    st->idle_cache_bytes += c->idle;
    st->fragment_bytes += c->fragment;
    st->uncounted += c->uncounted;
  }
  st->uncounted = GML_MIN(st->uncounted, d->device_total ? d->device_total : st->uncounted); /* what the device has */
  st->n_lease_latency_bucket = GML_LEASE_LAT_NBOUNDS;
  st->lease_latency_bucket = (uint64_t *)b->lat_bucket;
  st->lease_latency_sum_s = (double)b->lat_sum_ns / 1e9;
  st->lease_latency_count = b->nlat;
  st->gpu_uuid = d->be->uuid;
  st->device_model = d->be->model;
  st->version = (char *)GMLD_VERSION_STRING;
  st->chunks_shared = d->lk.shared;
  st->shares = shares_count(d);
  /* growable ranges' chunks are leased and in use, like allocated blocks */
  uint64_t leased_bytes = (d->lk.leased + d->lk.parked) * d->lk.cs;
  st->fragmentation = leased_bytes && used <= leased_bytes ? 1.0 - (double)used / (double)leased_bytes : 0;
  st->clients = b->nclients;
  size_t n = b->nlat < BROKER_LAT_RING ? b->nlat : BROKER_LAT_RING;
  if (n) {
    uint64_t *tmp = malloc(n * sizeof *tmp);
    if (tmp) {
      memcpy(tmp, b->lat_ns, n * sizeof *tmp);
      st->lease_p50_us = gmli_percentile_u64(tmp, n, 50) / 1e3;
      st->lease_p99_us = gmli_percentile_u64(tmp, n, 99) / 1e3;
      free(tmp);
    }
  }
}

/* One request being answered: what the handler fills and what is freed after the send. */
typedef struct ctl_call {
  gmld *d;
  const Gmlake__CtlRequest *req;
  Gmlake__CtlReply *rep;
  Gmlake__LakeStats stats;
  void *to_free[3];
  int may_change; /* the peer may send requests that change the lake */
  long viewer;    /* the peer's uid when it may see only its own user's processes (-1: all) */
} ctl_call;

static void with_stats(ctl_call *k) {
  fill_stats(k->d, &k->stats);
  k->rep->stats = &k->stats;
}

static void fail(ctl_call *k, int code, const char *message) {
  k->rep->code = code;
  if (message) k->rep->message = (char *)message;
}

static void ctl_stats(ctl_call *k) { with_stats(k); }

static void reply_quotas(ctl_call *k, long only);

static void ctl_clients(ctl_call *k) {
  const broker *b = &k->d->br;
  Gmlake__ClientInfo *ci = calloc(b->nclients ? b->nclients : 1, sizeof *ci);
  Gmlake__ClientInfo **cp = calloc(b->nclients ? b->nclients : 1, sizeof *cp);
  k->to_free[0] = ci, k->to_free[1] = cp;
  if (!ci || !cp) {
    fail(k, GML_ENOMEM, NULL);
    return;
  }
  size_t i = 0;
  for (const broker_client *c = b->clients; c; c = c->next, i++) {
    int other = !trust_sees(k->viewer, c->uid); /* another user's: its numbers, not who */
    gmlake__client_info__init(&ci[i]);
    ci[i].client_id = c->id;
    ci[i].pid = other ? 0 : c->pid;
    ci[i].uid = c->uid;
    ci[i].name = other ? "" : (char *)c->name;
    ci[i].leased_chunks = c->leased_chunks;
    ci[i].leased_bytes = c->leased_chunks * k->d->lk.cs;
    ci[i].allocated = c->allocated;
    ci[i].cached = c->cached;
    ci[i].stitched = c->stitched;
    ci[i].largest_free = c->largest_free;
    broker_quota_room(b, c, &ci[i].quota_bytes, NULL, 0); /* the quota that binds it most (0: none) */
    ci[i].cgroup = other ? "" : (char *)c->cgroup;
    ci[i].paused = c->paused;
    ci[i].paused_saved = c->paused_saved;
    ci[i].since = c->since;
    ci[i].leases_refused = c->leases_refused;
    ci[i].growable_mapped = c->growable_mapped;
    ci[i].growable_unmapped = c->growable_unmapped;
    ci[i].shared_bytes = shares_bytes_of(k->d, c->id);
    ci[i].uncounted = c->uncounted;
    ci[i].reported = c->reported.base.descriptor ? (Gmlake__UsageReport *)&c->reported : NULL;
    cp[i] = &ci[i];
  }
  k->rep->n_clients = i;
  k->rep->clients = cp;
  reply_quotas(k, -1); /* the metrics' gmlake_quota_bytes of named quotas (a job's, a pod's) */
  with_stats(k);
}

/* The reply's quotas: the one at index `only`, or every one (only -1), as they are now (to_free[2] holds
 * them). A reader other than root and the daemon's user sees another's pid and cgroup quotas nameless. */
static void reply_quotas(ctl_call *k, long only) {
  const lake *lk = &k->d->lk;
  size_t n = only >= 0 ? 1 : lk->nquotas, hl = GML_QUOTA_CGROUP_MAX + 16;
  struct qi {
    Gmlake__QuotaInfo info;
    char holder[GML_QUOTA_CGROUP_MAX + 16], group[GML_QUOTA_GROUP_MAX];
  } * qi;
  char *mem = k->to_free[2] =
      calloc(1, n * (sizeof *qi + sizeof(Gmlake__QuotaInfo *)) + 1); /* one block, freed after */
  if (!mem) {
    fail(k, GML_ENOMEM, NULL);
    return;
  }
  qi = (struct qi *)mem;
  Gmlake__QuotaInfo **list = (Gmlake__QuotaInfo **)(mem + n * sizeof *qi);
  for (size_t j = 0; j < n; j++) {
    size_t i = only >= 0 ? (size_t)only : j;
    const lake_quota *q = &lk->quotas[i];
    gmlake__quota_info__init(&qi[j].info);
    int own = k->viewer < 0 || (q->by_uid == LAKE_QUOTA_UID && q->key == (uint32_t)k->viewer);
    if (!own) snprintf(qi[j].holder, hl, "(hidden)");
    else if (q->by_uid == LAKE_QUOTA_CGROUP) snprintf(qi[j].holder, hl, "cgroup:%s", q->cgroup);
    else snprintf(qi[j].holder, hl, q->by_uid == LAKE_QUOTA_UID ? "uid:%u" : "%u", q->key);
    snprintf(qi[j].group, sizeof qi[j].group, "%s", q->group);
    qi[j].info.holder = qi[j].holder;
    qi[j].info.group = qi[j].group;
    qi[j].info.bytes = q->bytes;
    qi[j].info.held_bytes = gmli_broker_quota_held(&k->d->br, i) * lk->cs;
    qi[j].info.peak_bytes = GML_MAX(q->peak_chunks * lk->cs, qi[j].info.held_bytes);
    list[j] = &qi[j].info;
  }
  k->rep->n_quotas = n;
  k->rep->quotas = list;
}

static void ctl_quotas(ctl_call *k) {
  reply_quotas(k, -1);
  with_stats(k);
}

static void ctl_chunks(ctl_call *k) {
  const lake *lk = &k->d->lk;
  size_t n = lk->nslots;
  Gmlake__ChunkInfo *ci = calloc(n ? n : 1, sizeof *ci);
  Gmlake__ChunkInfo **cp = calloc(n ? n : 1, sizeof *cp);
  k->to_free[0] = ci, k->to_free[1] = cp;
  if (!ci || !cp) {
    fail(k, GML_ENOMEM, NULL);
    return;
  }
  size_t j = 0;
  for (uint32_t i = 0; i < n; i++) {
    const lake_chunk *c = &lk->chunks[i];
    if (c->state == CHUNK_UNUSED) continue;
    gmlake__chunk_info__init(&ci[j]);
    ci[j].chunk_id = lake_chunk_id(lk, i);
    ci[j].owner_pid = 0;
    if (c->state == CHUNK_LEASED)
      for (const broker_client *o = k->d->br.clients; o; o = o->next)
        if (o->id == c->owner) ci[j].owner_pid = trust_sees(k->viewer, o->uid) ? o->pid : -3;
    if (c->state == CHUNK_PARKED) ci[j].owner_pid = -1;
    if (c->state == CHUNK_SHARED) ci[j].owner_pid = -2;
    cp[j] = &ci[j];
    j++;
  }
  k->rep->n_chunks = j;
  k->rep->chunks = cp;
  with_stats(k);
}

static void ctl_shares(ctl_call *k) {
  k->rep->n_shares = shares_info(k->d, k->viewer, &k->rep->shares);
  with_stats(k);
}

static void ctl_trim(ctl_call *k) {
  gmld *d = k->d;
  int pid = k->req->trim ? k->req->trim->client_pid : 0;
  if (pid) {
    session *s = session_by_pid(d, pid);
    if (!s) {
      fail(k, GML_EINVAL, "no client with that pid");
      return;
    }
    grant_send_reclaim(s, 0, 0);
    broker_reclaim_sent(&s->bc);
  }
  k->rep->trimmed_chunks = lake_trim(&d->lk, 0);
  broker_trimmed(&d->br); /* stay trimmed until demand comes back */
  GML_INFO("trim: released %llu free chunk(s) to the driver%s", (unsigned long long)k->rep->trimmed_chunks,
           pid ? " and asked the client for its idle cache" : "");
}

void control_say_limit_below_held(gmld *d, const char *by, uint64_t was, char *said, size_t len) {
  const lake *lk = &d->lk;
  if (said && len) said[0] = 0;
  /* what is released past it from now on is for this, if it lowered the limit (else the reason stands) */
  if (lk->total + lk->creating > lk->limit_bytes / lk->cs && (lk->limit_bytes < was || !d->over_limit_why[0]))
    snprintf(d->over_limit_why, sizeof d->over_limit_why, "the limit was set below what it held, by %s", by);
  uint64_t held = lk->leased + lk->parked + lk->shared;
  if (held * lk->cs <= lk->limit_bytes) return;
  char l[32], h[32], le[32], p[32], s[32], text[1024];
  /* what broker_set_limit, the broker's leases and the tick's broker_trim_over_limit do: no chunk a client holds
   * can be taken back (its mappings keep it), so the lake stays over its limit until they return chunks; and a
   * chunk goes to another uid only made anew (trust.c), which waits for room under the limit (make_room, refill) */
  snprintf(text, sizeof text,
           "limit %s is below the %s clients hold now (%s leased, %s parked, %s in shares): nothing is taken back "
           "from them; the free chunks were released and no chunk is made while the lake is over its limit, so a lease "
           "is served only from chunks that clients of its own user give back (clients' idle cache is asked for, as on "
           "a full lake); another user's lease is refused until the lake is within its limit (a chunk goes to another "
           "user only released and made anew: what is given back is released, which may bring the lake within it); a "
           "lease that takes its client past the limit is refused at once; chunks given back that no lease takes are "
           "released until the lake is within its limit",
           gmli_format_bytes(lk->limit_bytes, l, sizeof l), gmli_format_bytes(held * lk->cs, h, sizeof h),
           gmli_format_bytes(lk->leased * lk->cs, le, sizeof le), gmli_format_bytes(lk->parked * lk->cs, p, sizeof p),
           gmli_format_bytes(lk->shared * lk->cs, s, sizeof s));
  GML_WARN("%s: %s", by, text);
  if (said && len) snprintf(said, len, "%s", text);
}

static void ctl_set_limit(ctl_call *k) {
  uint64_t lim = k->req->set_limit_bytes, was = k->d->lk.limit_bytes;
  lim -= lim % k->d->lk.cs; /* whole chunks, as the default limit (`limit 1%` was taken to the byte) */
  if (broker_set_limit(&k->d->br, lim)) {
    fail(k, GML_EINVAL, "limit below one chunk");
    return;
  }
  GML_INFO("limit set to %llu bytes", (unsigned long long)lim);
  /* the warning in the reply too (CtlReply.message with code 0): the caller sees it, not only the log */
  char *said = k->to_free[0] = malloc(1024);
  control_say_limit_below_held(k->d, "gmlakectl limit", was, said, said ? 1024 : 0);
  if (said && said[0]) k->rep->message = said;
  with_stats(k);
}

/* A named quota's change (the name alone in the request): its bytes, or removed (bytes 0); the reply says it (a
 * removed one as it was), with its peak (what a job's end reports). */
static void set_named_quota(ctl_call *k, const Gmlake__QuotaRequest *q) {
  lake *lk = &k->d->lk;
  long i = gmli_lake_quota_named(lk, q->group);
  if (i < 0) {
    fail(k, GML_ENOENT, "no quota of that name");
    return;
  }
  lake_quota *lq = &lk->quotas[i];
  if (q->bytes) lq->bytes = q->bytes;
  reply_quotas(k, i); /* changed: as it is now; removed: as it was */
  with_stats(k);
  char p[32];
  GML_INFO("quota %s %s (peak %s)", GML_LOG_ESC(q->group), q->bytes ? "changed" : "removed",
           gmli_format_bytes(lq->peak_chunks * lk->cs, p, sizeof p));
  if (q->bytes) return;
  if (lq->by_uid == LAKE_QUOTA_PID) pidquota_unwatch(k->d, (pid_t)lq->key);
  gmli_lake_remove_quota(lk, (size_t)i);
}

static void ctl_set_quota(ctl_call *k) {
  const Gmlake__QuotaRequest *q = k->req->set_quota;
  const char *group = q && q->group ? q->group : "";
  if (group[0] && !gmli_quota_group_ok(group)) {
    fail(k, GML_EINVAL, "bad quota name: 1-63 of letters, digits, '.', '_' and '-'");
    return;
  }
  if (q && group[0] && !(q->cgroup && q->cgroup[0]) && !q->by_uid && !q->pid) {
    set_named_quota(k, q);
    return;
  }
  lake *lk = &k->d->lk;
  int kind = !q ? -1 : q->cgroup && q->cgroup[0] ? LAKE_QUOTA_CGROUP : q->by_uid ? LAKE_QUOTA_UID : LAKE_QUOTA_PID;
  const char *cg = kind == LAKE_QUOTA_CGROUP ? q->cgroup : "";
  uint32_t key = kind == LAKE_QUOTA_UID ? q->uid : kind == LAKE_QUOTA_PID ? (uint32_t)q->pid : 0;
  long was = kind < 0 || strlen(cg) >= GML_QUOTA_CGROUP_MAX ? -1 : gmli_lake_quota_of(lk, kind, key, cg);
  if (was >= 0 && q && !q->bytes) reply_quotas(k, was); /* cleared: as it was, with its peak */
  if (kind == LAKE_QUOTA_CGROUP) {
    static char why[700]; /* the reply is packed after this returns */
    if (q->bytes && strlen(q->cgroup) < GML_QUOTA_CGROUP_MAX && conn_cgroup_check(q->cgroup, why, sizeof why))
      fail(k, GML_EINVAL, why); /* before: taken, and bound nothing */
    else if (lake_set_quota_cgroup(lk, q->cgroup, q->bytes)) fail(k, GML_EINVAL, "bad cgroup quota");
    else GML_INFO("quota of cgroup %s set to %llu bytes", GML_LOG_ESC(q->cgroup), (unsigned long long)q->bytes);
  } else {
    if (q && !q->by_uid && q->bytes) {
      int rc = pidquota_watch(k->d, (pid_t)q->pid);
      if (rc) {
        static char why[160]; /* the reply is packed after this returns */
        fail(k,
             rc == GML_ENOENT   ? GML_ENOENT
             : rc == GML_ENOMEM ? GML_ENOMEM
                                : GML_ESYS,
             pidquota_why((pid_t)q->pid, rc, why, sizeof why));
        return;
      }
    }
    if (!q || lake_set_quota(lk, q->by_uid, q->by_uid ? q->uid : (uint32_t)q->pid, q->bytes)) {
      fail(k, GML_EINVAL, "bad quota");
      return;
    }
    if (!q->by_uid && !q->bytes) pidquota_unwatch(k->d, (pid_t)q->pid);
    GML_INFO("quota of %s %u set to %llu bytes", q->by_uid ? "uid" : "pid", q->by_uid ? q->uid : (unsigned)q->pid,
             (unsigned long long)q->bytes);
  }
  long now = k->rep->code || !q->bytes ? -1 : gmli_lake_quota_of(lk, kind, key, cg);
  if (now < 0) return;
  if (group[0]) {
    gmli_lake_name_quota(lk, (size_t)now, group, gmli_broker_quota_held(&k->d->br, (size_t)now));
    if (kind == LAKE_QUOTA_CGROUP) GML_INFO("quota of cgroup %s is named %s", GML_LOG_ESC(cg), GML_LOG_ESC(group));
    else GML_INFO("quota of %s %u is named %s", kind == LAKE_QUOTA_UID ? "uid" : "pid", key, GML_LOG_ESC(group));
  }
  reply_quotas(k, now);
  with_stats(k);
}

/* A new control request: a case in CtlRequest (proto/gmlake.proto), a
 * handler above, one row here. `changes` marks requests that change the lake
 * (for who may send them). */
static const struct ctl_route {
  Gmlake__CtlRequest__ReqCase kind;
  const char *name;
  int changes;
  void (*handle)(ctl_call *k);
} routes[] = {
    {GMLAKE__CTL_REQUEST__REQ_STATS, "stats", 0, ctl_stats},
    {GMLAKE__CTL_REQUEST__REQ_CLIENTS, "clients", 0, ctl_clients},
    {GMLAKE__CTL_REQUEST__REQ_CHUNKS, "chunks", 0, ctl_chunks},
    {GMLAKE__CTL_REQUEST__REQ_SHARES, "shares", 0, ctl_shares},
    {GMLAKE__CTL_REQUEST__REQ_TRIM, "trim", 1, ctl_trim},
    {GMLAKE__CTL_REQUEST__REQ_SET_LIMIT_BYTES, "limit", 1, ctl_set_limit},
    {GMLAKE__CTL_REQUEST__REQ_SET_QUOTA, "quota", 1, ctl_set_quota},
    {GMLAKE__CTL_REQUEST__REQ_QUOTAS, "quotas", 0, ctl_quotas},
};

static void handle_request(ctl_call *k) {
  for (size_t i = 0; i < GML_ARRAY_LEN(routes); i++)
    if (routes[i].kind == k->req->req_case) {
      if (routes[i].changes && !k->may_change) {
        if (k->viewer >= 0) /* a user's share of the log (conn.c): a reader asking again and again is one user */
          CONN_WARN((uint32_t)k->viewer,
                    "control: '%s' of uid %ld refused: it changes the lake, for root or the daemon's user only",
                    routes[i].name, k->viewer);
        else GML_WARN("control: '%s' refused: it changes the lake, for root or the daemon's user only", routes[i].name);
        fail(k, GML_EPERM,
             "permission denied: changing the lake is for root or the daemon's user (reading is allowed)");
        return;
      }
      routes[i].handle(k);
      return;
    }
  fail(k, GML_EINVAL, "unknown request");
}

int control_handle(gmld *d, const uint8_t *req_buf, size_t req_len, uint8_t **reply, size_t *reply_len) {
  return control_handle_as(d, 1, -1, req_buf, req_len, reply, reply_len);
}

int control_handle_as(gmld *d, int may_change, long viewer, const uint8_t *req_buf, size_t req_len, uint8_t **reply,
                      size_t *reply_len) {
  Gmlake__CtlReply rep = GMLAKE__CTL_REPLY__INIT;
  Gmlake__CtlRequest *req = NULL;
  if (req_len > GML_MAX_FRAME) {
    rep.code = GML_EINVAL;
    rep.message = "control request over 64 KiB";
    d->counters.protocol_errors++;
  } else if (!(req = gmlake__ctl_request__unpack(NULL, req_len, req_buf))) {
    rep.code = GML_EPROTO;
    rep.message = "malformed control request";
    d->counters.protocol_errors++;
  }
  ctl_call k = {.d = d, .req = req, .rep = &rep, .may_change = may_change, .viewer = viewer};
  gmlake__lake_stats__init(&k.stats);
  if (req) handle_request(&k);
  size_t n = gmlake__ctl_reply__get_packed_size(&rep);
  uint8_t *out = malloc(n ? n : 1);
  if (out) gmlake__ctl_reply__pack(&rep, out);
  free(k.to_free[0]), free(k.to_free[1]), free(k.to_free[2]);
  shares_free_info(rep.shares, rep.n_shares);
  if (req) gmlake__ctl_request__free_unpacked(req, NULL);
  if (!out) return GML_ENOMEM;
  *reply = out;
  *reply_len = n;
  return 0;
}
