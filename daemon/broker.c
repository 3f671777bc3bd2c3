/* broker.c: the lease policy (no I/O: see broker.h). */
#include "broker.h"
#include "gmlake.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void broker_init(broker *b, lake *lk, Gmlake__LakeStats *counters, uint64_t prefetch_chunks,
                 uint64_t preallocate_chunks) {
  memset(b, 0, sizeof *b);
  b->lk = lk, b->counters = counters, b->lease_wait_ns = BROKER_LEASE_WAIT_MS * 1000000ull;
  b->promise_ns = MEMINFO_PROMISE_MS * 1000000ull;
  b->prefetch_chunks = prefetch_chunks, b->preallocate_chunks = preallocate_chunks;
}

void broker_add_client(broker *b, broker_client *c) {
  c->prev = NULL, c->next = b->clients;
  if (b->clients) b->clients->prev = c;
  b->clients = c, b->nclients++;
}

void broker_remove_client(broker *b, broker_client *c) {
  if (c->prev) c->prev->next = c->next;
  else b->clients = c->next;
  if (c->next) c->next->prev = c->prev;
  c->next = c->prev = NULL, b->nclients--;
}

static void decision_start(broker_decision *d, const broker_client *c) {
  d->verdict = BROKER_NONE;
  d->seq = c->lease.seq;
  d->count = c->lease.count;
  d->n = d->left = 0;
  d->code = 0;
  d->why[0] = d->message[0] = 0;
  d->reclaim_bytes = 0;
  d->from_idle = d->idle_short = 0;
}

/* Free chunks of other uids, when c's lease finds none of its own or clean:
 * a chunk whose uid has no process left is scrubbed and becomes clean; one
 * that a process of its uid may still reach is released to the driver when
 * the limit leaves no room to make a new one (the lease then waits for it). */
static void make_room(broker *b, const broker_client *c, uint32_t want) {
  lake *lk = b->lk;
  uint32_t asked_uid = 0;
  int asked = 0, gone = 0; /* uid_gone scans /proc: once per uid and call, not per chunk */
  for (uint32_t j = lk->nfree; j-- > 0 && want;) {
    uint32_t i = lk->free_stack[j];
    lake_chunk *ch = &lk->chunks[i];
    if (!ch->tainted || ch->tenant == c->uid) continue;
    if (b->trust.uid_gone && b->trust.scrub && (!asked || asked_uid != ch->tenant)) {
      asked = 1;
      asked_uid = ch->tenant;
      gone = b->trust.uid_gone(b->trust.arg, ch->tenant);
    }
    if (b->trust.uid_gone && b->trust.scrub && gone && b->trust.scrub(b->trust.arg, i) == 0) {
      lake_mark_clean(lk, i);
      b->counters->chunks_scrubbed++;
      want--;
    } else if (lake_headroom(lk) < want) {
      lake_destroy_chunk(lk, i); /* j now holds the top's chunk, looked at already */
      b->counters->chunks_remade++;
    } else {
      break; /* room enough: new chunks are made for it */
    }
  }
}

/* Serve c's lease from the free chunks it may have, all or part of it (a
 * streamed lease: up to BROKER_MAX_LEASE of what it still wants; it stays
 * pending until all went out). */
static int serve(broker *b, broker_client *c, broker_decision *d) {
  if (!c->lease.pending || !b->lk->nfree) return 0;
  /* the quota again: another connection of the process (or user) may have leased meanwhile */
  uint64_t room = broker_quota_room(b, c, NULL, NULL, 0);
  if (!room) return 0;
  uint32_t want = (uint32_t)GML_MIN(GML_MIN((uint64_t)c->lease.count, room), BROKER_MAX_LEASE);
  uint32_t n = lake_take_for(b->lk, c->id, c->uid, want, d->idx);
  if (!n) {
    /* served from idle clients: their chunks are its uid's; another uid's
     * released here would make room for new chunks, which it does not get */
    if (c->lease.from_idle) return 0;
    make_room(b, c, want);
    n = lake_take_for(b->lk, c->id, c->uid, want, d->idx);
    if (!n) return 0;
  }
  d->verdict = BROKER_SERVE;
  d->n = n;
  d->since_ns = c->lease.since_ns;
  c->leased_chunks += d->n;
  gmli_broker_note_peaks(b, c);
  c->lease.count -= n;
  if (c->lease.streamed && c->lease.count) {
    d->left = c->lease.count;
    c->lease.progressed = 1;
    c->lease.served_since_ask += n;
    return 1;
  }
  c->lease.pending = c->lease.reclaim_asked = c->lease.from_idle = 0;
  b->counters->lease_count++;
  return 1;
}

/* One process's part of the lake, for the out-of-memory message. */
typedef struct holder {
  pid_t pid;
  uint32_t uid;
  const char *name;
  uint64_t leased, allocated, cached, paused;
} holder;

static uint64_t process_of(const holder *h) { return (uint64_t)h->uid << 32 | (uint32_t)h->pid; }
static int by_process(const void *x, const void *y) {
  return (process_of(x) > process_of(y)) - (process_of(x) < process_of(y));
}
/* Who holds the lake, per process (its connections and parked chunks summed): the max that lease
 * the most, most first; returns how many processes in all (SIZE_MAX: out of memory). */
static size_t holders(const broker *b, holder *h, size_t max) {
  size_t n = 0, all = 0, listed = 0;
  for (const broker_client *o = b->parked; o; o = o->next) n++;
  holder *v = malloc((b->nclients + n + 1) * sizeof *v);
  if (!v) return SIZE_MAX;
  n = 0;
  for (int l = 0; l < 2; l++)
    for (const broker_client *o = l ? b->parked : b->clients; o; o = o->next)
      v[n++] = (holder){o->pid, o->uid, o->name, o->leased_chunks * b->lk->cs, o->allocated, o->cached, o->paused};
  qsort(v, n, sizeof *v, by_process); /* a process's entries side by side (a pid used again by another user: two) */
  for (size_t i = 0; i < n; all++) {
    holder p = v[i];
    for (i++; i < n && process_of(&v[i]) == process_of(&p); i++) {
      p.leased += v[i].leased, p.allocated += v[i].allocated, p.cached += v[i].cached, p.paused += v[i].paused;
      p.name = p.name[0] ? p.name : v[i].name;
    }
    if (listed == max && (!max || h[max - 1].leased >= p.leased)) continue; /* counted, not listed */
    size_t k = listed < max ? listed++ : max - 1;
    for (; k > 0 && h[k - 1].leased < p.leased; k--) h[k] = h[k - 1];
    h[k] = p;
  }
  free(v);
  return all;
}

/* "asked X; the lake holds H of limit L (F free, P parked); held by: pid N (name) leased .. allocated .. cached ..,
 * ...": the lake-wide picture an out-of-memory error carries to the client (and PyTorch's OOM message). Another
 * user's process is "a process of uid U": its numbers, not who. */
static void lake_picture(const broker *b, const broker_client *asker, char *out, size_t len) {
  const lake *lk = b->lk;
  char s1[32], s2[32], s3[32], s4[32], s5[32], s6[32], sent[64] = "";
  if (asker->lease.asked > asker->lease.count) /* a streamed lease, partly served */
    snprintf(sent, sizeof sent, " (%s of it sent)",
             gmli_format_bytes((uint64_t)(asker->lease.asked - asker->lease.count) * lk->cs, s6, sizeof s6));
  size_t o = (size_t)snprintf(out, len, "asked %s%s; the lake holds %s of limit %s (%s free, %s parked); held by:",
                              gmli_format_bytes((uint64_t)asker->lease.asked * lk->cs, s1, sizeof s1), sent,
                              gmli_format_bytes(lk->total * lk->cs, s2, sizeof s2),
                              gmli_format_bytes(lk->limit_bytes, s3, sizeof s3),
                              gmli_format_bytes((uint64_t)lk->nfree * lk->cs, s4, sizeof s4),
                              gmli_format_bytes(lk->parked * lk->cs, s5, sizeof s5));
  holder h[8];
  size_t all = holders(b, h, GML_ARRAY_LEN(h)), n = all == SIZE_MAX ? 0 : GML_MIN(all, GML_ARRAY_LEN(h));
  for (size_t i = 0; i < n && o < len; i++) {
    char who[96];
    if (h[i].uid == asker->uid)
      snprintf(who, sizeof who, "pid %d (%s%s)", (int)h[i].pid, h[i].name, h[i].pid == asker->pid ? ", the asker" : "");
    else snprintf(who, sizeof who, "a process of uid %u", (unsigned)h[i].uid);
    o += (size_t)snprintf(out + o, len - o, "%s %s leased %s allocated %s cached %s", i ? ";" : "", who,
                          gmli_format_bytes(h[i].leased, s1, sizeof s1),
                          gmli_format_bytes(h[i].allocated, s2, sizeof s2),
                          gmli_format_bytes(h[i].cached, s3, sizeof s3));
    if (o < len && h[i].paused)
      o += (size_t)snprintf(out + o, len - o, " paused %s", gmli_format_bytes(h[i].paused, s4, sizeof s4));
  }
  if (o < len && (!all || all == SIZE_MAX))
    snprintf(out + o, len - o, "%s", all ? " (not known: out of memory)" : " nobody");
  else if (o < len && all > n) snprintf(out + o, len - o, "; and %zu more process(es)", all - n);
}

static void refuse(broker *b, broker_client *c, broker_decision *d, int code, const char *why) {
  char h[32], l[32];
  d->verdict = BROKER_REFUSE;
  d->count = c->lease.wanted; /* a quota refusal's count after the quota is 0 */
  d->code = code;
  snprintf(d->why, sizeof d->why, "%s", why);
  if (code == GML_ENOMEM) {
    int o = snprintf(d->message, sizeof d->message, "%s: ", why);
    if (o > 0 && (size_t)o < sizeof d->message) lake_picture(b, c, d->message + o, sizeof d->message - (size_t)o);
  } else {
    snprintf(d->message, sizeof d->message, "%s (lake holds %s of limit %s)", why,
             gmli_format_bytes(b->lk->total * b->lk->cs, h, sizeof h),
             gmli_format_bytes(b->lk->limit_bytes, l, sizeof l));
  }
  c->lease.pending = 0;
  c->leases_refused++;
  b->counters->leases_refused++;
}

/* A lease the lake cannot serve: the lake is full, or over a limit set below what it held */
static void refuse_full(broker *b, broker_client *c, broker_decision *d, const char *why) {
  refuse(b, c, d, GML_ENOMEM,
         b->lk->total * b->lk->cs <= b->lk->limit_bytes ? why
                                                        : "out of memory: the lake is over its limit: what other "
                                                          "clients give back is released until it is within it");
}

static void list_push(broker_client **head, broker_client *c) {
  c->closing = 1;
  c->lease.pending = 0;
  c->prev = NULL;
  c->next = *head;
  if (*head) (*head)->prev = c;
  *head = c;
}

static void list_drop(broker_client **head, broker_client *c) {
  if (c->prev) c->prev->next = c->next;
  else *head = c->next;
  if (c->next) c->next->prev = c->prev;
  c->next = c->prev = NULL;
}

void broker_park(broker *b, broker_client *c) { list_push(&b->parked, c); }
void broker_unpark(broker *b, broker_client *c) { list_drop(&b->parked, c); }
void broker_publish(broker *b, broker_client *c) { list_push(&b->published, c); }
void broker_unpublish(broker *b, broker_client *c) { list_drop(&b->published, c); }

static int ask_idle(broker *b, broker_client *c, uint64_t now_ns, broker_decision *d);

static void lease_start(broker *b, broker_client *c, uint64_t seq, uint32_t count, int optional, int streamed,
                        uint64_t now_ns, broker_decision *d) {
  b->prefetch_suspended = 0; /* demand is back */
  uint64_t quota;
  char who[160];
  uint64_t allowed = GML_MIN((uint64_t)count, broker_quota_room(b, c, &quota, who, sizeof who));
  c->lease = (broker_request){.pending = 1,
                              .seq = seq,
                              .count = count > allowed ? (uint32_t)allowed : count,
                              .asked = count > allowed ? (uint32_t)allowed : count,
                              .wanted = count,
                              .streamed = streamed,
                              .since_ns = now_ns,
                              .deadline_ns = now_ns + b->lease_wait_ns};
  c->active_ns = now_ns; /* it allocates: not idle */
  decision_start(d, c);
  if (optional) { /* headroom: what is free now, else a quiet no; nobody waits or gives back for it */
    if (allowed && serve(b, c, d)) return;
    c->lease.pending = 0;
    b->counters->optional_declined++;
    d->verdict = BROKER_DECLINE;
    d->code = GML_ENOMEM;
    snprintf(d->why, sizeof d->why, "nothing free now");
    snprintf(d->message, sizeof d->message, "no free chunk at once (optional lease)");
    return;
  }
  if (!allowed) {
    char q[32], why[400];
    snprintf(why, sizeof why, "quota of %s reached (%s: its processes' connections and parked chunks together)",
             gmli_format_bytes(quota, q, sizeof q), who);
    refuse(b, c, d, GML_EQUOTA, why);
    return;
  }
  if ((uint64_t)c->leased_chunks + count > b->lk->limit_bytes / b->lk->cs) { /* never servable: said now, not */
    char a[32], why[160]; /* after taking others' idle caches and making chunks up to the limit */
    snprintf(why, sizeof why, "out of memory: %s more would pass the lake's limit with what this client leases",
             gmli_format_bytes((uint64_t)count * b->lk->cs, a, sizeof a));
    refuse(b, c, d, GML_ENOMEM, why);
    return;
  }
  /* idle clients first, before serve() may release another uid's free chunks to make room for it (and
   * before broker_refill orders chunks for it); then the free chunks it may take */
  ask_idle(b, c, now_ns, d);
  if (!serve(b, c, d)) d->verdict = BROKER_WAIT;
}

void broker_lease(broker *b, broker_client *c, uint64_t seq, uint32_t count, int optional, uint64_t now_ns,
                  broker_decision *d) {
  lease_start(b, c, seq, count, optional, 0, now_ns, d);
}

void broker_lease_streamed(broker *b, broker_client *c, uint64_t seq, uint32_t count, uint64_t now_ns,
                           broker_decision *d) {
  lease_start(b, c, seq, GML_MIN(count, BROKER_MAX_STREAM), 0, 1, now_ns, d);
}

static int can_give_back(const broker *b, const broker_client *asker, const broker_client *o) {
  uint64_t cs = b->lk->cs;
  /* what it reports, bounded by what it holds: a client that leases nothing
   * has nothing to give back, whatever cache it claims (one that claimed
   * some was asked, never answered, and held every lease on a full lake for
   * the whole lease-wait) */
  return o != asker && !o->closing && o->leased_chunks &&
         (o->cached >= cs || o->leased_chunks * cs >= o->allocated + o->growable_mapped + cs);
}

void broker_reported(broker *b, broker_client *c, uint64_t served) {
  (void)b;
  c->reclaims_answered = served;
}

void broker_allocations(broker *b, broker_client *c, uint64_t alloc_count, uint64_t now_ns) {
  (void)b;
  if (alloc_count != c->alloc_count) c->active_ns = now_ns;
  c->alloc_count = alloc_count;
}

void broker_reclaim_sent(broker_client *c) { c->reclaims_sent++; }

/* A usage report is the client's word, bounded by what it can hold (docs/operating.md, trust model; before: 16
 * EiB uncounted from anyone, wrapped lake-wide sums, a cache kept outside the lake shown as its own). */
void broker_usage_bound(const broker *b, broker_client *c, uint64_t device_total) {
  uint64_t cap = device_total ? device_total : (uint64_t)1 << 50, held = (uint64_t)c->leased_chunks * b->lk->cs;
  if (!c->reconnected) c->uncounted = 0;
  uint64_t *each[] = {&c->allocated,    &c->cached,          &c->stitched,          &c->largest_free, &c->paused,
                      &c->paused_saved, &c->growable_mapped, &c->growable_unmapped, &c->uncounted};
  for (size_t i = 0; i < sizeof each / sizeof *each; i++) *each[i] = GML_MIN(*each[i], cap);
  c->allocated = GML_MIN(c->allocated, held + c->uncounted);
  c->growable_mapped = GML_MIN(c->growable_mapped, held + c->uncounted); /* its ranges map chunks it holds */
  c->cached = GML_MIN(c->cached, held - GML_MIN(c->allocated + c->growable_mapped, held)); /* free in what it leases */
  c->idle = GML_MIN(c->idle, c->cached);
  c->fragment = GML_MIN(c->fragment, c->cached - c->idle);
}

/* Has every client asked for c's lease answered (reported since)? */
static int all_answered(const broker *b, const broker_client *c) {
  for (const broker_client *o = b->clients; o; o = o->next)
    if (o != c && !o->closing && o->reclaim_sent_ns >= c->lease.asked_ns && o->reclaims_answered < o->reclaims_sent)
      return 0;
  return 1;
}

/* c's lease asks the others now (a new request: broker_reclaim_targets lists
 * the clients ask_of marks for it). */
static void ask_start(broker *b, broker_client *c, uint64_t now_ns) {
  c->lease.reclaim_asked = 1;
  c->lease.asked_ns = now_ns;
  c->lease.served_since_ask = 0;
  c->lease.ask_id = ++b->asks;
}

static void ask_of(broker_client *o, const broker_client *c, uint64_t bytes, uint64_t now_ns) {
  o->reclaim_sent_ns = now_ns;
  o->reclaim_ask_id = c->lease.ask_id;
  o->reclaim_ask = bytes;
  o->reclaims_sent++;
}

/* The whole free chunks o could give c's lease as they are (its idle cache, at most what it leases):
 * o idle (no allocation for BROKER_IDLE_MS, no lease of its own waiting), of c's uid (another uid's
 * chunk is made anew for c: creating after all), not asked already (its report is then stale). */
static uint64_t idle_chunks(const broker *b, const broker_client *c, const broker_client *o, uint64_t now_ns) {
  if (o->uid != c->uid || o->lease.pending || !can_give_back(b, c, o) || o->reclaims_answered < o->reclaims_sent)
    return 0;
  if (now_ns < o->active_ns + BROKER_IDLE_MS * 1000000ull) return 0;
  return GML_MIN(o->idle / b->lk->cs, o->leased_chunks);
}

uint64_t gmli_broker_idle_chunks(const broker *b, const broker_client *asker, const broker_client *o, uint64_t now_ns) {
  return o == asker ? 0 : idle_chunks(b, asker, o, now_ns);
}

/* The policy for what free chunks cannot serve (broker.h, broker_lease):
 * when idle clients hold whole free chunks enough for all of it, ask them
 * alone, the most idle first, each for its part, and create nothing for the
 * lease. A plain lease asks ahead (BROKER_RECLAIM_AHEAD leases' worth: the
 * next leases of a large allocation), within what they hold. Returns 0 (and
 * asks nobody) when they cannot cover it. */
static int ask_idle(broker *b, broker_client *c, uint64_t now_ns, broker_decision *d) {
  /* what the free chunks it may take (clean, or its uid's) do not cover: one serve takes 128 at most, a
   * stream the rest (before: all but 128 asked; on the H100 A gave 39.5 GiB where 20 were wanted) */
  const lake *lk = b->lk;
  uint64_t free_now = (uint64_t)lk->nfree_clean + lake_free_of(lk, c->uid);
  uint64_t need = c->lease.count > free_now ? c->lease.count - free_now : 0, have = 0;
  for (const broker_client *o = b->clients; o; o = o->next) have += idle_chunks(b, c, o, now_ns);
  if (!need || have < need) return 0;
  uint64_t want = c->lease.streamed ? need : GML_MIN(need * BROKER_RECLAIM_AHEAD, have);
  ask_start(b, c, now_ns);
  c->lease.from_idle = 1;
  for (uint64_t left = want; left;) {
    broker_client *most = NULL;
    uint64_t most_n = 0;
    for (broker_client *o = b->clients; o; o = o->next) {
      uint64_t n = o->reclaim_ask_id == c->lease.ask_id ? 0 : idle_chunks(b, c, o, now_ns);
      if (n > most_n) most = o, most_n = n;
    }
    if (!most) break; /* cannot happen: have >= want */
    uint64_t n = GML_MIN(most_n, left);
    ask_of(most, c, n * b->lk->cs, now_ns);
    left -= n;
  }
  d->reclaim_bytes = want * b->lk->cs;
  d->from_idle = 1;
  return 1;
}

/* Ask the others for idle cache for c's lease (they get the request from
 * the session: broker_reclaim_targets). A plain lease asks for
 * BROKER_RECLAIM_AHEAD leases' worth; a streamed one for all it needs
 * beyond what is free and what can still be created, at once. Returns 0
 * when there is nobody to ask. */
static int ask_reclaim(broker *b, broker_client *c, uint64_t now_ns, broker_decision *d) {
  const lake *lk = b->lk;
  uint64_t bytes = (uint64_t)c->lease.count * lk->cs * BROKER_RECLAIM_AHEAD;
  if (c->lease.streamed) {
    uint64_t coming = (uint64_t)lk->nfree + lk->creating + lake_headroom(lk);
    if (c->lease.count <= coming) return 1; /* nothing to ask yet */
    bytes = (c->lease.count - coming) * lk->cs;
  }
  ask_start(b, c, now_ns);
  size_t n = 0;
  for (broker_client *o = b->clients; o; o = o->next) /* the session asks them (broker_reclaim_targets) */
    if (can_give_back(b, c, o)) ask_of(o, c, bytes, now_ns), n++;
  if (!n) return 0;
  d->reclaim_bytes = bytes;
  return 1;
}

/* A lease served from idle clients goes on as any other once they all
 * answered and it is still short (they gave less than their reports said),
 * or once they gave nothing for BROKER_IDLE_STALL_MS (at most half its
 * wait, so what is created still comes before its deadline). Returns 1 when
 * it still waits for them alone. */
static int idle_wait(broker *b, broker_client *c, uint64_t now_ns, broker_decision *d) {
  uint64_t stall = GML_MIN(b->lease_wait_ns / 2, BROKER_IDLE_STALL_MS * 1000000ull);
  uint64_t last = GML_MAX(c->lease.asked_ns, c->lease.deadline_ns - b->lease_wait_ns); /* asked, or last chunks sent */
  if (!all_answered(b, c) && now_ns < last + stall) return 1;
  c->lease.from_idle = 0;
  c->lease.reclaim_asked = 0; /* created as the limit allows, the rest asked of everyone with idle cache */
  d->idle_short = 1;
  return 0;
}

void broker_review(broker *b, broker_client *c, uint64_t now_ns, broker_decision *d) {
  decision_start(d, c);
  if (!c->lease.pending || c->closing) return;
  if (c->lease.progressed) { /* a streamed lease got chunks: its wait starts again */
    c->lease.progressed = 0;
    c->lease.deadline_ns = now_ns + b->lease_wait_ns;
  }
  if (serve(b, c, d)) { /* a streamed lease may want more than is free or coming: ask now */
    if (c->lease.pending && !c->lease.reclaim_asked) ask_reclaim(b, c, now_ns, d);
    return;
  }
  uint64_t quota;
  char who[160];
  if (!broker_quota_room(b, c, &quota, who, sizeof who)) { /* another connection of its process or user took the rest */
    char q[32], why[400];
    snprintf(why, sizeof why, "quota of %s reached (%s)", gmli_format_bytes(quota, q, sizeof q), who);
    refuse(b, c, d, GML_EQUOTA, why);
    return;
  }
  d->verdict = BROKER_WAIT;
  if (c->lease.from_idle && idle_wait(b, c, now_ns, d)) return; /* it stops waiting for them before its deadline */
  int nothing_coming = b->lk->creating == 0 && lake_headroom(b->lk) == 0;
  if (nothing_coming && c->lease.reclaim_asked && b->lk->parked == 0 && all_answered(b, c)) {
    if (!c->lease.served_since_ask) {
      refuse_full(b, c, d, "out of memory: the lake is full and no other client had idle cache to give back");
      return;
    }
    c->lease.reclaim_asked = 0; /* a streamed lease got what they gave: ask again for the rest */
  }
  /* a streamed lease asks at once for what creating cannot cover; a plain one once nothing else can come */
  if ((nothing_coming || c->lease.streamed) && !c->lease.reclaim_asked && !ask_reclaim(b, c, now_ns, d) &&
      nothing_coming && b->lk->parked == 0) {
    /* nobody holds idle cache to give back: say so now rather than wait */
    refuse_full(b, c, d, "out of memory: the lake is full");
    return;
  }
  if (now_ns < c->lease.deadline_ns) return;
  if (b->lk->creating) { /* chunks are being made under the limit: the lake is not full */
    if (now_ns < c->lease.deadline_ns + BROKER_CREATE_WAIT_MS * 1000000ull) return;
    char why[200];
    snprintf(why, sizeof why, "out of memory: timed out after %llu ms waiting for the %llu chunk(s) being made",
             (unsigned long long)((now_ns - c->lease.since_ns) / 1000000ull), (unsigned long long)b->lk->creating);
    refuse(b, c, d, GML_ENOMEM, why);
    return;
  }
  if (lake_headroom(b->lk) && now_ns < b->create_backoff_until_ns) { /* room under the limit, none made */
    char why[sizeof b->create_failed_why + 64];
    snprintf(why, sizeof why, "out of memory: %s could not make more chunks (creation failed)",
             b->create_failed_why[0] ? b->create_failed_why : "the device");
    refuse(b, c, d, GML_ENOMEM, why);
    return;
  }
  refuse_full(b, c, d, "out of memory: the lake is full");
}

int broker_serve_free(broker *b, broker_client *c, broker_decision *d) {
  decision_start(d, c);
  return !c->closing && serve(b, c, d);
}

size_t broker_reclaim_targets(const broker *b, const broker_client *asker, broker_client **out, size_t max) {
  size_t n = 0;
  for (broker_client *o = b->clients; o; o = o->next) {
    if (!asker->lease.ask_id || o->reclaim_ask_id != asker->lease.ask_id || o->closing) continue;
    size_t len = GML_MIN(n, max);
    if (len < max || (max && out[max - 1]->cached < o->cached)) { /* by idle cache, most first */
      size_t k = len < max ? len : max - 1;
      while (k > 0 && out[k - 1]->cached < o->cached) {
        out[k] = out[k - 1];
        k--;
      }
      out[k] = o;
    }
    n++;
  }
  return n;
}

void broker_adopted(broker *b, broker_client *c, uint32_t n) {
  c->leased_chunks += n;
  gmli_broker_note_peaks(b, c);
}

void broker_returned(broker *b, broker_client *c, const uint32_t *idx, size_t n) {
  for (size_t i = 0; i < n; i++) lake_give_back(b->lk, idx[i]);
  c->leased_chunks -= n;
}

void broker_unsent(broker *b, broker_client *c, const broker_decision *d) {
  broker_returned(b, c, d->idx, d->n);
  c->lease.pending = c->lease.reclaim_asked = c->lease.from_idle = 0;
  c->leases_refused++;
  b->counters->leases_refused++;
}

void broker_record_latency(broker *b, uint64_t ns) {
  static const uint64_t bounds_us[GML_LEASE_LAT_NBOUNDS] = GML_LEASE_LAT_BOUNDS_US;
  b->lat_ns[b->nlat % BROKER_LAT_RING] = ns;
  b->nlat++;
  b->lat_sum_ns += ns;
  for (int i = GML_LEASE_LAT_NBOUNDS - 1; i >= 0 && ns <= bounds_us[i] * 1000; i--) b->lat_bucket[i]++;
}
