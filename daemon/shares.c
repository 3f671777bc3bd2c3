/* shares.c: shared read-only memory (see shares.h): publish, attach,
 * detach, and the mappers that keep a share's chunks alive. Runs on the
 * loop thread like the sessions. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "shares.h"
#include "daemon.h"
#include "grant.h"
#include "session.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SHARE_KEY_MAX GML_SHARE_KEY_MAX /* wire.h: what a request may carry */
#define SHARE_HASH_MAX GML_SHARE_HASH_MAX
#define SHARE_META_MAX GML_SHARE_META_MAX
#define SHARE_UIDS_MAX GML_SHARE_UIDS_MAX

typedef struct mapper {
  struct mapper *next;
  share *sh;
  uint64_t session_id; /* 0 once its session closed (its process lives on) */
  pid_t pid;
  uid_t uid;
  uint32_t refs; /* attaches not yet detached (the publisher's share counts one) */
  int pidfd;     /* watched once the session closed */
  uv_poll_t poll;
  int polling;
} mapper;

struct share {
  share *next;
  gmld *d;
  uint64_t id;
  char key[SHARE_KEY_MAX + 1];
  uint8_t hash[SHARE_HASH_MAX];
  size_t hash_len;
  uint8_t meta[SHARE_META_MAX];
  size_t meta_len;
  uint64_t size;
  uint32_t n;
  uint32_t *idx; /* lake chunk indices, in order */
  int *ro_fds;   /* host backend: read-only fds of the chunks, sent to attachers */
  pid_t publisher_pid;
  uid_t uid;
  int allow_any;
  int foreign; /* fds went to a process of another uid: it may keep them past its detach */
  uint32_t allow[SHARE_UIDS_MAX];
  size_t nallow;
  double since;
  mapper *mappers;
  broker_client pub; /* its publisher holding its chunks, in the broker's quotas while it lives */
};

/* Keys are per user: uid's share of that name. */
static share *find_key(gmld *d, const char *key, uid_t uid) {
  for (share *sh = d->shares; sh; sh = sh->next)
    if (sh->uid == uid && !strcmp(sh->key, key)) return sh;
  return NULL;
}

/* A key as a client of uid names it: its own user's share of that name,
 * else, for "NAME@UID", user UID's share NAME. A plain name never finds
 * another user's share: a user who published it first (to feed its weights
 * to a victim's attachers, or to take the name) gets nobody's attach. */
static share *find_named(gmld *d, const char *key, uid_t uid) {
  share *sh = find_key(d, key, uid);
  char name[SHARE_KEY_MAX + 1];
  uint32_t owner;
  if (sh || !gmli_share_key_owner(key, name, &owner)) return sh; /* wire.c: as the client checked it */
  return find_key(d, name, (uid_t)owner);
}

/* uid's share with this content hash. Only the caller's own user's: a
 * publisher keeps the write access its lease gave it (its fds, its cuda
 * handles), so mapping another user's share trusts that user, which an
 * attach by key says (NAME@UID) and a lookup by hash (dedup) cannot: a user
 * who published a well-known hash allowing everyone had every other user's
 * dedup map its chunks, then rewrote them. */
static share *find_hash(gmld *d, const uint8_t *h, size_t n, uid_t uid) {
  for (share *sh = d->shares; sh && n; sh = sh->next)
    if (sh->uid == uid && sh->hash_len == n && !memcmp(sh->hash, h, n)) return sh;
  return NULL;
}

static int allowed(const share *sh, uid_t uid) {
  if (uid == sh->uid || sh->allow_any) return 1;
  for (size_t i = 0; i < sh->nallow; i++)
    if (sh->allow[i] == uid) return 1;
  return 0;
}

static int send_reply(session *s, Gmlake__Envelope *env, const int *fds, int nfds) {
  return session_send_msg(s, env, fds, nfds);
}

static void share_destroy(share *sh) {
  gmld *d = sh->d;
  for (uint32_t i = 0; i < sh->n; i++) {
    lake_give_back(&d->lk, sh->idx[i]);
    if (sh->foreign) { /* an attacher of another uid may still map it: never leased again (the trust model) */
      lake_destroy_chunk(&d->lk, sh->idx[i]);
      d->counters.chunks_remade++;
    }
    if (sh->ro_fds && sh->ro_fds[i] >= 0) close(sh->ro_fds[i]);
  }
  for (share **pp = &d->shares; *pp; pp = &(*pp)->next)
    if (*pp == sh) {
      *pp = sh->next;
      break;
    }
  broker_unpublish(&d->br, &sh->pub);
  CONN_INFO(sh->uid, "share '%s' has no mapper left: its %u chunk(s) are back in the lake", GML_LOG_ESC(sh->key),
            sh->n);
  free(sh->idx), free(sh->ro_fds), free(sh);
  if (!d->stopping) sessions_serve_pending(d);
}

static void mapper_free_cb(uv_handle_t *h) { free(h->data); }

/* Take m off its share (and free it); the share goes when it was the last. */
static void mapper_remove(mapper *m) {
  share *sh = m->sh;
  for (mapper **pp = &sh->mappers; *pp; pp = &(*pp)->next)
    if (*pp == m) {
      *pp = m->next;
      break;
    }
  if (m->polling) {
    uv_poll_stop(&m->poll);
    close(m->pidfd);
    uv_close((uv_handle_t *)&m->poll, mapper_free_cb);
  } else {
    free(m);
  }
  if (!sh->mappers) share_destroy(sh);
}

static mapper *mapper_of(share *sh, uint64_t session_id) {
  for (mapper *m = sh->mappers; m; m = m->next)
    if (m->session_id == session_id) return m;
  return NULL;
}

static int mapper_add(share *sh, session *s) {
  mapper *m = mapper_of(sh, s->bc.id);
  if (!m) {
    if (!(m = calloc(1, sizeof *m))) return GML_ENOMEM;
    m->sh = sh;
    m->session_id = s->bc.id;
    m->pid = s->bc.pid, m->uid = s->bc.uid;
    m->pidfd = -1;
    m->next = sh->mappers;
    sh->mappers = m;
  }
  m->refs++;
  return 0;
}

static void on_mapper_exit(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  mapper *m = h->data;
  CONN_INFO(m->uid, "process %d exited: it maps share '%s' no more", (int)m->pid, GML_LOG_ESC(m->sh->key));
  mapper_remove(m);
}

/* ---------- requests ---------- */

/* What a share request must be, against the lake: a valid key, a size its
 * chunks cover exactly, chunks the client holds, each once (their lake
 * indices into idx). */
static const char *check_share(session *s, const Gmlake__ShareRequest *r, uint32_t *idx) {
  gmld *d = s->d;
  size_t n = r->n_chunk_ids;
  if (!gmli_share_key_ok(r->key, NULL)) return "share key empty, too long or not printable";
  if (strchr(r->key, '@')) return "share key has a '@' (NAME@UID names another user's share)";
  if (n < 1 || r->size == 0 || r->size > (uint64_t)n * d->lk.cs || r->size <= (uint64_t)(n - 1) * d->lk.cs)
    return "share size does not match its chunks";
  if (r->content_hash.len > SHARE_HASH_MAX || r->meta.len > SHARE_META_MAX || r->n_allow_uids > SHARE_UIDS_MAX)
    return "share hash, meta or uid list too long";
  /* the duplicate check below is quadratic: bounded by what the client holds (one chunk named 8,000
   * times in a 64 KiB frame cost the loop ~9 ms a frame, and went on as "out of memory") */
  if (n > s->bc.leased_chunks) return "share of more chunks than the client holds";
  for (size_t i = 0; i < n; i++) {
    long k = lake_owned_index(&d->lk, r->chunk_ids[i], s->bc.id);
    for (size_t j = 0; j < i && k >= 0; j++)
      if (idx[j] == (uint32_t)k) k = -1;
    if (k < 0) return "share of a chunk the client does not hold (or twice)";
    idx[i] = (uint32_t)k;
  }
  return NULL;
}

static void handle_share(session *s, uint64_t seq, const Gmlake__ShareRequest *r) {
  gmld *d = s->d;
  size_t n = r->n_chunk_ids;
  uint32_t *idx = calloc(n, sizeof *idx);
  if (!idx || check_share(s, r, idx)) { /* checked before: only out of memory here */
    free(idx);
    session_send_error(s, seq, GML_ENOMEM, "out of memory");
    return;
  }
  int code = 0;
  share *old = find_key(d, r->key, s->bc.uid);
  if (!old && r->content_hash.len) old = find_hash(d, r->content_hash.data, r->content_hash.len, s->bc.uid);
  if (old) code = GML_EEXIST;
  share *sh = code ? NULL : calloc(1, sizeof *sh);
  int *ro = NULL;
  if (!code && sh && (d->be->caps & GML_BACKEND_REOPEN_READ_ONLY) && (ro = malloc(n * sizeof *ro))) {
    /* attachers get fds that cannot map writable: read-only is enforced, not asked */
    for (size_t i = 0; i < n; i++) {
      char path[64];
      snprintf(path, sizeof path, "/proc/self/fd/%d", d->lk.chunks[idx[i]].fd);
      ro[i] = open(path, O_RDONLY | O_CLOEXEC);
      if (ro[i] < 0)
        GML_WARN("no read-only fd for a shared chunk (%s): attachers get the chunk's own", strerror(errno));
    }
  }
  if (!code && (!sh || ((d->be->caps & GML_BACKEND_REOPEN_READ_ONLY) && !ro))) code = GML_ENOMEM;
  if (code == GML_EEXIST) { /* who holds it, so the user knows what ends it */
    char who[200] = "";
    int pub_maps = 0;
    size_t k = 0;
    for (mapper *m = old->mappers; m; m = m->next) {
      pub_maps |= m->pid == old->publisher_pid;
      /* another user's mapper (the share allows it): its uid, not its pid (control.c's rule) */
      if (k >= sizeof who - 40) continue;
      if (m->uid == s->bc.uid) k += (size_t)snprintf(who + k, sizeof who - k, "%spid %d", k ? ", " : "", (int)m->pid);
      else k += (size_t)snprintf(who + k, sizeof who - k, "%sa process of uid %u", k ? ", " : "", (unsigned)m->uid);
    }
    session_send_error(s, seq, code,
                       "share '%s' exists%s%s: published by pid %d%s, mapped by %s; it ends when they detach "
                       "or exit",
                       old->key, strcmp(old->key, r->key) ? " with that content hash, for " : "",
                       strcmp(old->key, r->key) ? r->key : "", (int)old->publisher_pid,
                       pub_maps ? "" : " (which no longer maps it)", who);
    free(idx), free(ro);
    return;
  }
  if (code) {
    session_send_error(s, seq, code, "out of memory");
    free(idx), free(sh), free(ro);
    return;
  }
  sh->d = d;
  sh->id = ++d->next_share_id;
  snprintf(sh->key, sizeof sh->key, "%s", r->key);
  if ((sh->hash_len = r->content_hash.len)) memcpy(sh->hash, r->content_hash.data, sh->hash_len);
  if ((sh->meta_len = r->meta.len)) memcpy(sh->meta, r->meta.data, sh->meta_len);
  sh->size = r->size;
  sh->n = (uint32_t)n;
  sh->idx = idx;
  sh->ro_fds = ro;
  sh->publisher_pid = s->bc.pid;
  sh->uid = s->bc.uid;
  sh->allow_any = r->allow_any_uid;
  if ((sh->nallow = r->n_allow_uids)) memcpy(sh->allow, r->allow_uids, sh->nallow * sizeof sh->allow[0]);
  /* published again after a restart: what other users attached before it, and
   * may still map, this daemon never saw; when it ends its chunks are not leased again */
  for (size_t i = 0; r->restored && i < sh->nallow; i++) sh->foreign |= sh->allow[i] != sh->uid;
  sh->foreign |= r->restored && sh->allow_any;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  sh->since = (double)ts.tv_sec + ts.tv_nsec / 1e9;
  for (size_t i = 0; i < n; i++) lake_share(&d->lk, idx[i], sh->id);
  s->bc.leased_chunks -= n;
  sh->pub = s->bc; /* its chunks leave the publisher's lease, not its quotas */
  sh->pub.leased_chunks = n;
  broker_publish(&d->br, &sh->pub);
  sh->next = d->shares;
  d->shares = sh;
  mapper_add(sh, s);
  CONN_INFO(s->bc.uid, "client %llu (pid %d, uid %u) shares '%s': %u chunk(s), %llu bytes",
            (unsigned long long)s->bc.id, (int)s->bc.pid, (unsigned)s->bc.uid, GML_LOG_ESC(sh->key), sh->n,
            (unsigned long long)sh->size);
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__ShareReply rep = GMLAKE__SHARE_REPLY__INIT;
  rep.share_id = sh->id;
  env.seq = seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_SHARE_REPLY;
  env.share_reply = &rep;
  send_reply(s, &env, NULL, 0);
}

/* An attach's or detach's key: a share key, or NAME@UID for another user's
 * (what the library sends). Anything else (empty but for an attach by
 * content hash) is refused as invalid, and logged escaped: before, a refused
 * key was logged raw, and a newline in it wrote a line of the client's. */
static int key_refused(session *s, uint64_t seq, const char *key, const char *what) {
  char name[SHARE_KEY_MAX + 1];
  uint32_t uid;
  if (!key || !*key || gmli_share_key_ok(key, NULL) || gmli_share_key_owner(key, name, &uid)) return 0;
  CONN_WARN(s->bc.uid, "client %llu (pid %d, uid %u) asked to %s '%s': not a share key: refused",
            (unsigned long long)s->bc.id, (int)s->bc.pid, (unsigned)s->bc.uid, what, GML_LOG_ESC(key));
  session_send_error(s, seq, GML_EINVAL,
                     "%s: not a share key (1 to %d bytes of '!' to '~', or NAME@UID for another user's "
                     "share)",
                     what, SHARE_KEY_MAX);
  return 1;
}

static void handle_attach(session *s, uint64_t seq, const Gmlake__AttachRequest *r) {
  gmld *d = s->d;
  if (key_refused(s, seq, r->key, "attach")) return;
  share *sh = r->key && *r->key ? find_named(d, r->key, s->bc.uid)
                                : find_hash(d, r->content_hash.data, r->content_hash.len, s->bc.uid);
  if (sh && !allowed(sh, s->bc.uid)) { /* said to the operator; to the client as a share that does not exist */
    CONN_WARN(s->bc.uid, "client %llu (pid %d, uid %u) may not attach share '%s' of uid %u",
              (unsigned long long)s->bc.id, (int)s->bc.pid, (unsigned)s->bc.uid, GML_LOG_ESC(sh->key),
              (unsigned)sh->uid);
    sh = NULL;
  } else if (!sh && r->key &&
             strchr(r->key, '@')) { /* logged as a refusal is: the same work, no timing to tell them apart */
    CONN_WARN(s->bc.uid, "client %llu (pid %d, uid %u) attached no share '%s': none of that name it may attach",
              (unsigned long long)s->bc.id, (int)s->bc.pid, (unsigned)s->bc.uid, GML_LOG_ESC(r->key));
  }
  if (!sh) { /* one answer whether NAME@UID exists or not: no user learns another's share names by trying */
    if (r->key && strchr(r->key, '@'))
      session_send_error(s, seq, GML_ENOENT, "no share %s that uid %u may attach", r->key, (unsigned)s->bc.uid);
    else
      session_send_error(s, seq, GML_ENOENT, "no share %s%s", r->key && *r->key ? r->key : "with that content hash",
                         r->key && *r->key ? " of this user (another user's is NAME@UID)" : "");
    return;
  }
  if (r->first > sh->n || r->count > sh->n - r->first) {
    session_send_error(s, seq, GML_EINVAL, "share '%s' has %u chunks", sh->key, sh->n);
    return;
  }
  /* a mapper from its first attach that takes chunks, whichever it asks for first (before, only from chunk 0: a
   * client that took chunk 1 alone was none, its publisher's detach ended the share, and the chunk it maps went
   * back to the lake); and once more for each attach from chunk 0 (gml_attach takes [0, 128), [128, 256) ... and
   * detaches once) */
  int counted = r->count && (r->first == 0 || !mapper_of(sh, s->bc.id));
  if (counted && mapper_add(sh, s)) {
    session_send_error(s, seq, GML_ENOMEM, "out of memory");
    return;
  }
  uint64_t ids[GML_MAX_LEASE_CHUNKS];
  int fds[GML_MAX_LEASE_CHUNKS];
  sh->foreign |= r->count && s->bc.uid != sh->uid;
  for (uint32_t i = 0; i < r->count; i++) {
    uint32_t k = sh->idx[r->first + i];
    ids[i] = lake_chunk_id(&d->lk, k);
    fds[i] = sh->ro_fds && sh->ro_fds[r->first + i] >= 0 ? sh->ro_fds[r->first + i] : d->lk.chunks[k].fd;
  }
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__AttachReply rep = GMLAKE__ATTACH_REPLY__INIT;
  char named[SHARE_KEY_MAX + 16]; /* how this client names it: NAME@UID for another user's */
  snprintf(named, sizeof named, sh->uid == s->bc.uid ? "%s" : "%s@%u", sh->key, (unsigned)sh->uid);
  rep.key = named;
  rep.size = sh->size;
  rep.nchunks = sh->n;
  rep.content_hash.data = sh->hash;
  rep.content_hash.len = sh->hash_len;
  rep.meta.data = sh->meta;
  rep.meta.len = sh->meta_len;
  rep.n_chunk_ids = r->count;
  rep.chunk_ids = ids;
  env.seq = seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH_REPLY;
  env.attach_reply = &rep;
  if (send_reply(s, &env, fds, (int)r->count) == CONN_NO_FD_ROOM) { /* not sent: refused, naming the fd limit */
    char why[512];
    session_fd_refusal(s, (int)r->count, why, sizeof why);
    CONN_WARN(s->bc.uid, "attach of %u chunk(s) of share '%s' refused to client %llu (pid %d): %s", r->count,
              GML_LOG_ESC(sh->key), (unsigned long long)s->bc.id, (int)s->bc.pid, why);
    session_send_error(s, seq, GML_EAGAIN, "attach of %u chunk(s) of share '%s' refused: %s", r->count, named, why);
    mapper *m = counted ? mapper_of(sh, s->bc.id) : NULL; /* not its mapper by this attach */
    if (m && --m->refs == 0) mapper_remove(m);            /* never the share's last: it had its mappers before */
  }
}

static void handle_detach(session *s, uint64_t seq, const Gmlake__DetachRequest *r) {
  if (key_refused(s, seq, r->key, "detach")) return;
  share *sh = r->key ? find_named(s->d, r->key, s->bc.uid) : NULL;
  mapper *m = sh ? mapper_of(sh, s->bc.id) : NULL;
  if (!m) {
    session_send_error(s, seq, GML_ENOENT, "this client maps no share '%s'", r->key ? r->key : "");
    return;
  }
  uint32_t left = 0;
  if (--m->refs == 0) {
    for (mapper *o = sh->mappers; o; o = o->next) left += o != m;
    mapper_remove(m); /* may free the share */
  } else {
    for (mapper *o = sh->mappers; o; o = o->next) left++;
  }
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__DetachReply rep = GMLAKE__DETACH_REPLY__INIT;
  rep.mappers_left = left;
  env.seq = seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_DETACH_REPLY;
  env.detach_reply = &rep;
  send_reply(s, &env, NULL, 0);
  return;
}

const char *shares_check(session *s, const Gmlake__Envelope *env) {
  switch (env->msg_case) {
  case GMLAKE__ENVELOPE__MSG_SHARE: {
    uint32_t *idx = calloc(env->share->n_chunk_ids ? env->share->n_chunk_ids : 1, sizeof *idx);
    const char *why = idx ? check_share(s, env->share, idx) : NULL; /* out of memory: the handler says so */
    free(idx);
    return why;
  }
  case GMLAKE__ENVELOPE__MSG_ATTACH:
    if (env->attach->count > GML_MAX_LEASE_CHUNKS) return "attach count out of range";
    return env->attach->content_hash.len > SHARE_HASH_MAX ? "attach hash too long" : NULL;
  case GMLAKE__ENVELOPE__MSG_DETACH: return NULL;
  default: return "unexpected message kind";
  }
}

void shares_handle(session *s, const Gmlake__Envelope *env) {
  switch (env->msg_case) {
  case GMLAKE__ENVELOPE__MSG_SHARE: handle_share(s, env->seq, env->share); break;
  case GMLAKE__ENVELOPE__MSG_ATTACH: handle_attach(s, env->seq, env->attach); break;
  case GMLAKE__ENVELOPE__MSG_DETACH: handle_detach(s, env->seq, env->detach); break;
  default: break;
  }
}

void shares_session_closed(session *s, int gone) {
  gmld *d = s->d;
  for (share *sh = d->shares, *next; sh; sh = next) {
    next = sh->next; /* sh may go */
    mapper *m = mapper_of(sh, s->bc.id);
    if (!m) continue;
    /* its process is watched for this share already (an earlier connection of it): one watch a process,
     * not one a connection (before, a process that attached, closed and connected again left one pidfd
     * each time: 20,000 connections filled the daemon's fd table and no one could connect) */
    mapper *o = sh->mappers;
    while (o && !(o->polling && o->pid == s->bc.pid && !conn_process_gone(o->pidfd, o->pid))) o = o->next;
    if (o && !gone) {
      mapper_remove(m); /* not the last: o stays */
      continue;
    }
    int fd = gone || d->stopping || s->pidfd < 0 ? -1 : fcntl(s->pidfd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
      if (!gone && !d->stopping)
        CONN_WARN(s->bc.uid, "cannot watch pid %d: share '%s' forgets it", (int)s->bc.pid, GML_LOG_ESC(sh->key));
      mapper_remove(m);
      continue;
    }
    /* its process lives on and may still map the chunks: keep it until it exits */
    m->session_id = 0;
    m->pidfd = fd;
    uv_poll_init(d->loop, &m->poll, fd);
    m->poll.data = m;
    uv_poll_start(&m->poll, UV_READABLE, on_mapper_exit);
    m->polling = 1;
  }
}

void shares_close_all(gmld *d) {
  while (d->shares) {
    share *sh = d->shares;
    while (sh->mappers && sh->mappers->next) mapper_remove(sh->mappers);
    mapper_remove(sh->mappers); /* the last one frees the share */
  }
}

size_t shares_info(gmld *d, long viewer, Gmlake__ShareInfo ***out) {
  size_t n = 0, k = 0;
  for (share *sh = d->shares; sh; sh = sh->next) n++;
  Gmlake__ShareInfo **v = calloc(n ? n : 1, sizeof *v);
  for (share *sh = d->shares; v && sh; sh = sh->next) {
    if (viewer >= 0 && !allowed(sh, (uid_t)viewer)) continue; /* another user's that it may not attach: not shown */
    Gmlake__ShareInfo *i = calloc(1, sizeof *i);
    size_t nm = 0;
    for (mapper *m = sh->mappers; m; m = m->next) nm++;
    int32_t *pids = calloc(nm ? nm : 1, sizeof *pids);
    if (!i || !pids) {
      free(i), free(pids);
      break;
    }
    gmlake__share_info__init(i);
    i->key = sh->key;
    i->size = sh->size;
    i->chunks = sh->n;
    i->publisher_pid = trust_sees(viewer, sh->uid) ? sh->publisher_pid : 0;
    i->publisher_uid = sh->uid;
    nm = 0;
    for (mapper *m = sh->mappers; m; m = m->next)
      if (trust_sees(viewer, m->uid)) pids[nm++] = m->pid; /* other users' processes: not named */
    i->mapper_pids = pids;
    i->n_mapper_pids = nm;
    i->content_hash.data = sh->hash;
    i->content_hash.len = sh->hash_len;
    i->since = sh->since;
    i->allow_any_uid = sh->allow_any;
    i->allow_uids = sh->allow;
    i->n_allow_uids = sh->nallow;
    v[k++] = i;
  }
  *out = v;
  return k;
}

void shares_free_info(Gmlake__ShareInfo **info, size_t n) {
  for (size_t i = 0; info && i < n; i++) {
    free(info[i]->mapper_pids);
    free(info[i]);
  }
  free(info);
}

uint64_t shares_bytes_of(gmld *d, uint64_t session_id) {
  uint64_t b = 0;
  for (share *sh = d->shares; sh; sh = sh->next)
    if (mapper_of(sh, session_id)) b += (uint64_t)sh->n * d->lk.cs;
  return b;
}

uint64_t shares_count(gmld *d) {
  uint64_t n = 0;
  for (share *sh = d->shares; sh; sh = sh->next) n++;
  return n;
}
