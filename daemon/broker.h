/* broker.h: every lease decision of the daemon, in one place and free of I/O
 * (like lake.h) so it can be unit-tested: a lease is served now, waits (until
 * a deadline), makes the broker ask other clients for idle cache (whom, how
 * much), is refused (lake full, quota) or, when optional (headroom), quietly
 * declined; and how many chunks the creators should make. The broker keeps
 * the lake's accounting as it decides (chunks taken for a served lease,
 * chunks ordered from the creators); sessions (session.c) and the loop
 * (main.c) carry its decisions out: they send, log and create.
 *
 * Extending it: a new outcome is a new broker_verdict (or a new field of
 * broker_decision, such as reclaim_bytes) that the session carries out; a new
 * input is a field of broker_client (what a client is and reports) or of
 * broker (settings, counters); a new decision is a broker_* function that
 * fills a broker_decision. Time is always passed in (now_ns), never read. */
#ifndef GML_BROKER_H
#define GML_BROKER_H
#include "gmlake.pb-c.h"
#include "lake.h"
#include "wire.h"
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define BROKER_MAX_LEASE 128 /* chunks one lease may ask for (the wire's limit), and one reply carries */
#define BROKER_MAX_STREAM GML_MAX_STREAM_LEASE /* chunks one streamed lease may ask for (HelloReply.max_stream) */
#define BROKER_LEASE_WAIT_MS 3000              /* a lease waits this long for reclaimed chunks (--lease-wait) */
#define MEMINFO_PROMISE_MS 2000 /* a mem-info answer holds this long as a promise (meminfo.h; --meminfo-promise-ms) */
#define BROKER_RECLAIM_AHEAD                                                                                           \
  16 /* a reclaim asks for this many leases' worth: a large allocation
                                       * comes as a run of leases of at most BROKER_MAX_LEASE chunks, and
                                       * each waiting for its own reclaim round trip made 40 GiB take 1.16 s */
#define BROKER_IDLE_MS                                                                                                 \
  1000 /* a client that has not allocated for this long is idle: its whole free
                                       * chunks may serve another lease instead of new chunks (its library
                                       * reports within ~100 ms of an allocation, so 10 reports' worth) */
#define BROKER_IDLE_STALL_MS                                                                                           \
  500                                 /* a lease served from idle clients alone creates what they have not
                                       * given after this long without progress (at most half the lease wait) */
#define BROKER_CREATE_BACKOFF_MS 1000 /* after a failed creation (device full?) */
#define BROKER_CREATE_WAIT_MS                                                                                          \
  10000                      /* past its deadline, a lease still waits this long for chunks being
                                       * made under the limit (the lake is not full: --lease-wait 0 refused
                                       * a first lease before the creators had run); well within the
                                       * client's reply timeout (30 s + the lease wait) */
#define BROKER_LAT_RING 4096 /* recent lease latencies kept for p50/p99 */

typedef struct broker_request { /* a client's lease request in flight (at most one) */
  int pending;
  uint64_t seq;    /* the request's seq, echoed by the answer */
  uint32_t count;  /* chunks wanted, after the quota (streamed: still to send) */
  uint32_t asked;  /* chunks wanted in all, after the quota */
  uint32_t wanted; /* chunks the client asked for, before the quota (what a refusal says) */
  int streamed;    /* served in replies of up to BROKER_MAX_LEASE as chunks come free */
  int progressed;  /* streamed: chunks went out since the last review (its wait starts again) */
  uint64_t since_ns, deadline_ns;
  int reclaim_asked;         /* other clients were asked for idle cache for it */
  uint64_t asked_ns;         /* ... when */
  uint64_t ask_id;           /* ... which request (broker_reclaim_targets lists the clients asked by it) */
  int from_idle;             /* idle clients' caches cover it: asked of them alone, no chunk created for it
                                * (until they answered short or stalled: then as any lease) */
  uint32_t served_since_ask; /* streamed: chunks sent since they were asked */
} broker_request;

/* A client as the broker sees it: who it is, what it holds and reported.
 * The session embeds one and registers it with broker_add_client. */
typedef struct broker_client {
  struct broker_client *next, *prev;
  uint64_t id; /* owner id of its chunks in the lake */
  pid_t pid;
  uid_t uid;
  char name[64];
  char cgroup[GML_QUOTA_CGROUP_MAX];    /* its process's cgroup (v2 path from /proc/PID/cgroup), "" if unknown */
  char cgroup_v1[GML_QUOTA_CGROUP_MAX]; /* ... its v1 hierarchies' lines, "CONTROLLERS:PATH\n" each ("" none) */
  double since;                         /* unix time of connect */
  int closing;                          /* going away: nothing is served to it or asked of it */
  uint64_t leased_chunks;
  uint64_t allocated, cached, stitched, largest_free; /* its last usage report, bytes */
  uint64_t paused, paused_saved;                      /* ... paused blocks (gml_pause) and their saved content, bytes */
  uint64_t growable_mapped, growable_unmapped;        /* ... and its growable ranges' */
  uint64_t idle, fragment; /* of cached: whole free chunks (reclaimable), free bytes in used chunks */
  uint64_t uncounted; /* bytes it holds that no lake counts (its hand-over we did not take): in no limit or quota */
  int reconnected;    /* its hello said adopting: only then may it report uncounted bytes */
  uint64_t leases_refused;
  uint64_t refusal_logged_ns;   /* grant.c: when its last refusal was logged at warn level, */
  int refusal_logged_code;      /* ... and its code (a retry's refusal is not logged again) */
  uint64_t active_ns;           /* when it was last seen allocating: a lease, or a usage report that counted
                                * allocations since the one before (idle after BROKER_IDLE_MS without) */
  uint64_t alloc_count;         /* allocations its last usage report counted */
  uint64_t reclaim_sent_ns;     /* when it was last asked for idle cache */
  uint64_t reclaim_ask_id;      /* ... by which request (broker_request.ask_id), */
  uint64_t reclaim_ask;         /* ... for how many bytes */
  uint64_t reclaims_sent;       /* reclaim requests the broker had sent it */
  uint64_t reclaims_answered;   /* ... that its reports say it served */
  Gmlake__UsageReport reported; /* its last usage report as sent (descriptor NULL: none yet), for the clients RPC */
  uint64_t promise_ns;          /* meminfo.c: when it was last told what it could get (0: never) */
  uint64_t promise_leased;      /* ... and the chunks it leased then (a lease since settles the promise) */
  broker_request lease;
} broker_client;

/* The trust model (docs/design.md): a chunk goes to another uid only clean. The
 * broker asks the daemon two things about a free chunk last leased to
 * another uid (both may be NULL: then such a chunk is always released and
 * made anew). */
typedef struct broker_trust {
  /* 1 when no process of uid is left (none can still map its chunks) */
  int (*uid_gone)(void *arg, uint32_t uid);
  /* overwrite chunk idx's content with zeros: 0, or an error (then it is released) */
  int (*scrub)(void *arg, uint32_t idx);
  void *arg;
} broker_trust;

typedef struct broker {
  lake *lk;
  broker_trust trust;
  broker_client *clients; /* newest first */
  size_t nclients;
  /* Clients gone whose process lives on: their chunks are parked (the process
   * may still map them), and still count in its process's, user's and
   * cgroup's quotas until broker_unpark. */
  broker_client *parked;
  /* Published shares, each as its publisher (pid, uid, cgroup) holding the
   * share's chunks: they count in those quotas for as long as the share lives
   * (a publisher that shared its leased chunks and leased again, over and
   * over, took the whole lake past its quota). */
  broker_client *published;
  /* settings */
  uint64_t lease_wait_ns;
  uint64_t promise_ns;         /* how long a mem-info answer holds (meminfo.h; --meminfo-promise-ms) */
  uint64_t prefetch_chunks;    /* kept free ahead of demand */
  uint64_t preallocate_chunks; /* the lake holds at least this many */
  /* state */
  uint64_t idle_release_ns;     /* free chunks past the reserve go once the lake is idle this long (0: never) */
  uint64_t idle_reserve_chunks; /* what an idle lake keeps free (and preallocate_chunks in all) */
  /* state */
  int prefetch_suspended;              /* after a trim or an idle release, until the next lease */
  uint64_t idle_leased, idle_since_ns; /* chunks leased when last seen to change, and when */
  uint64_t create_backoff_until_ns;
  char create_failed_why[160]; /* why the last creation failed when it was not the device ("": the device) */
  uint64_t asks;               /* reclaim requests made (each lease's ask gets the next id) */
  /* The daemon's counters are LakeStats' own fields (proto/gmlake.proto):
   * the broker counts lease_count, leases_refused, optional_declined there. */
  Gmlake__LakeStats *counters;
  uint64_t lat_ns[BROKER_LAT_RING];
  size_t nlat;
  uint64_t lat_bucket[GML_LEASE_LAT_NBOUNDS]; /* all leases, cumulative, by GML_LEASE_LAT_BOUNDS_US */
  uint64_t lat_sum_ns;
} broker;

enum broker_verdict {
  BROKER_NONE = 0, /* no lease to answer */
  BROKER_WAIT,     /* nothing to send yet: the lease waits for chunks, until lease.deadline_ns */
  BROKER_SERVE,    /* send n chunks: idx[] are already leased to the client in the lake */
  BROKER_REFUSE,   /* send error code/message; counted and logged as a refusal (why) */
  BROKER_DECLINE,  /* an optional lease: send error code/message, quietly */
};

typedef struct broker_decision {
  enum broker_verdict verdict;
  uint64_t seq;   /* of the lease answered */
  uint32_t count; /* chunks the lease asked for (after the quota; BROKER_REFUSE: as the client asked) */
  uint32_t n;     /* BROKER_SERVE: chunks served (may be fewer than count) */
  uint32_t left;  /* BROKER_SERVE of a streamed lease: chunks still to come (0: its last reply) */
  uint32_t idx[BROKER_MAX_LEASE];
  uint64_t since_ns;  /* BROKER_SERVE: when the lease was asked (its latency) */
  int code;           /* BROKER_REFUSE / BROKER_DECLINE: a GML_E* code */
  char why[160];      /* ... the reason, for the log */
  char message[1024]; /* ... the text the client gets: out of memory says what was asked
                                * and which processes hold the lake (pid, name, leased, allocated, cached) */
  /* Before the verdict, ask every client broker_reclaim_targets() lists to
   * give back its reclaim_ask bytes of idle cache; this many in all (0: ask nobody). */
  uint64_t reclaim_bytes;
  int from_idle;  /* ... idle clients alone, for the whole shortfall: nothing is created for it */
  int idle_short; /* the idle clients asked answered short, or gave nothing for BROKER_IDLE_STALL_MS:
                                * the lease goes on as any other (creates what the limit allows, asks the rest) */
} broker_decision;

void broker_init(broker *b, lake *lk, Gmlake__LakeStats *counters, uint64_t prefetch_chunks,
                 uint64_t preallocate_chunks);
void broker_add_client(broker *b, broker_client *c);
void broker_remove_client(broker *b, broker_client *c);

/* A connection is gone but its process lives on: c (a copy of its client,
 * on no list, leased_chunks = the chunks parked) goes on the parked list;
 * the caller keeps c's memory until broker_unpark. */
void broker_park(broker *b, broker_client *c);
void broker_unpark(broker *b, broker_client *c);
/* Hand-overs after a restart may take the lake past its limit (up to twice
 * it): free chunks past the limit are released, from the tick. How many. */
uint32_t broker_trim_over_limit(broker *b);
/* A share is published: c (a copy of its publisher, on no list,
 * leased_chunks = the share's chunks) counts in its quotas until
 * broker_unpublish. */
void broker_publish(broker *b, broker_client *c);
void broker_unpublish(broker *b, broker_client *c);

/* Chunks the clients that quota i binds hold now (every connection, parked chunk and published share). */
uint64_t gmli_broker_quota_held(const broker *b, size_t i);
/* quotas.c: c holds more (a lease served, a hand-over taken): the named quotas that bind it keep their peak. */
void gmli_broker_note_peaks(broker *b, const broker_client *c);

/* Quotas count per process (all its connections, parked chunks and published shares), per
 * user (all its processes) and per cgroup: every quota that covers c binds.
 * The chunks c may still lease (UINT64_MAX: no quota covers it); *quota and
 * *holder (may be NULL) say which quota binds most ("pid 42", "uid 1000",
 * "cgroup /x"). */
uint64_t broker_quota_room(const broker *b, const broker_client *c, uint64_t *quota, char *holder, size_t holder_len);

/* A client asks for count chunks (1..BROKER_MAX_LEASE). Quota first; an
 * optional lease is served from free chunks or declined at once; a needed one
 * is served from free chunks or waits (BROKER_WAIT: review all waiting leases
 * with broker_review after ordering chunks with broker_refill).
 *
 * What free chunks cannot serve comes from idle clients or from new chunks:
 * when the idle clients of the asker's uid (none has allocated for
 * BROKER_IDLE_MS, none is asked already) hold enough whole free chunks for
 * all of it, they alone are asked, the most idle first, each for its part,
 * and no chunk is created for the lease (d->from_idle): memory the lake has
 * not created stays the driver's, and the asker's imports do not share the
 * driver with the creators'. A client that allocates is never drained before
 * the lake creates. Where they cannot cover it (or answer short, or give
 * nothing for BROKER_IDLE_STALL_MS: d->idle_short from broker_review), the
 * lease is served as ever: new chunks as far as the limit allows, the rest
 * asked of every client with idle cache. */
void broker_lease(broker *b, broker_client *c, uint64_t seq, uint32_t count, int optional, uint64_t now_ns,
                  broker_decision *d);
/* A streamed lease: count (1..BROKER_MAX_STREAM) chunks, served in decisions
 * of up to BROKER_MAX_LEASE (d->left says how many are still to come; the
 * lease stays pending until then), each as soon as chunks are free: call
 * broker_serve_free again while it returns 1. Its wait bound counts from
 * the last chunks sent, and the other clients are asked at once for the
 * idle cache it needs beyond what is free and what can still be created,
 * all of it in one request each. */
void broker_lease_streamed(broker *b, broker_client *c, uint64_t seq, uint32_t count, uint64_t now_ns,
                           broker_decision *d);
/* Look again at c's waiting lease (the loop's tick, after a lease): serve it
 * from free chunks; a lease served from idle clients goes on as any other
 * once they all answered and it is still short, or after BROKER_IDLE_STALL_MS
 * (at most half the lease wait) without chunks (d->idle_short); when no chunk
 * can come any more (nothing being created, the
 * lake at its limit) ask the others for idle cache once, or refuse when nobody
 * has any and nothing is parked; refuse once every client asked has answered
 * (reported after the request) and still nothing is free, or once its
 * deadline has passed. */
void broker_review(broker *b, broker_client *c, uint64_t now_ns, broker_decision *d);
/* Serve c's waiting lease only if chunks are free now (chunks came back).
 * Returns 1 with d filled (BROKER_SERVE), else 0. */
int broker_serve_free(broker *b, broker_client *c, broker_decision *d);
/* The clients asker's last decision asks for idle cache (each for its
 * reclaim_ask bytes), the one with the most cached first: a lease served
 * from idle clients, those that cover it; any other, every client but asker,
 * not closing, with at least one chunk's worth cached, or leasing a chunk
 * more than it last reported allocated (its report may be late: asking costs
 * it nothing). Fills out[0..max) and returns how many there are. */
size_t broker_reclaim_targets(const broker *b, const broker_client *asker, broker_client **out, size_t max);
/* c's usage report says it served `served` reclaim requests so far (its
 * library reports after giving back what it could: nothing more comes). */
void broker_reported(broker *b, broker_client *c, uint64_t served);
/* c's usage report counts alloc_count allocations so far: more than its last
 * report did, and c is active (not idle) from now_ns. */
void broker_allocations(broker *b, broker_client *c, uint64_t alloc_count, uint64_t now_ns);
/* Someone beside the broker (an operator's `gmlakectl trim --client`) asked c
 * for its idle cache: the client counts every request it serves, so the broker
 * counts this one as sent (else its answered count runs ahead for ever and a
 * later lease takes c's answer as given before c has answered). */
void broker_reclaim_sent(broker_client *c);
/* c's usage report is its word: bound it by what c can hold (broker.c). */
void broker_usage_bound(const broker *b, broker_client *c, uint64_t device_total);
/* After a restart, c hands over n chunks it held (the dead daemon's): how
 * many the lake takes. All of them, whatever the limit and quotas (they are
 * the client's memory already; the lake is then over its limit until they
 * come back, and c's quotas refuse new leases meanwhile), up to a bound
 * against a client passing any memory it likes: twice the limit in all. */
uint32_t broker_adopt_room(const broker *b, const broker_client *c, uint32_t n);
/* The lake took n chunks of c's (lake_adopt): counted as leased to it. */
void broker_adopted(broker *b, broker_client *c, uint32_t n);
/* The whole free chunks o would give a lease of asker's as they are (broker_lease's idle clients:
 * asker's uid, idle for BROKER_IDLE_MS, not asked already); 0 for others (meminfo.c counts them). */
uint64_t gmli_broker_idle_chunks(const broker *b, const broker_client *asker, const broker_client *o, uint64_t now_ns);
/* c gave back n chunks it holds (idx[], checked by the caller): into the lake. */
void broker_returned(broker *b, broker_client *c, const uint32_t *idx, size_t n);
/* A BROKER_SERVE decision d for c could not be sent (the daemon's fd budget
 * had no room for its reply): its chunks go back to the lake, and c's lease
 * ends, counted as refused. */
void broker_unsent(broker *b, broker_client *c, const broker_decision *d);
/* A served lease's latency as the client saw it (measured after the send). */
void broker_record_latency(broker *b, uint64_t ns);

/* How many chunks the creators should make now: the waiting leases plus the
 * prefetch (unless suspended by a trim) and the preallocation, within the
 * limit and outside a back-off after failures. A lease served from idle
 * clients counts for nothing, and no prefetch is made while one waits (it
 * would take the new chunks). They are counted in lake.creating at once;
 * the caller hands the number to the creators. */
uint64_t broker_refill(broker *b, uint64_t now_ns);
/* Creating chunks failed (the device is probably full): no new order for a
 * while. Returns 1 when this starts a back-off (worth a log line), else 0. */
int broker_creation_failed(broker *b, uint64_t now_ns);
/* The operator trimmed the lake: no prefetch until demand comes back. */
void broker_trimmed(broker *b);
/* How many free chunks to keep once created chunks landed and waiting
 * leases took theirs: all (UINT32_MAX), or none while the lake stays trimmed
 * (a creation ordered before the trim must not refill it). */
uint32_t broker_keep_free(const broker *b);
/* From the tick: once nothing was leased or given back for idle_release_ns
 * (the count of leased chunks unchanged), free chunks past the reserve
 * (idle_reserve_chunks, and what keeps the lake at preallocate_chunks) go back
 * to the driver, and the prefetch waits for the next lease. How many went. */
uint32_t broker_idle_release(broker *b, uint64_t now_ns);
/* A new limit for the lake: GML_EINVAL below one chunk, else 0; free chunks
 * over it are released at once. */
int broker_set_limit(broker *b, uint64_t limit_bytes);
#endif
