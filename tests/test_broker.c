/* The daemon's lease policy (daemon/broker.c) on a real lake of host chunks:
 * serve, wait, reclaim from whom, refuse, quota, optional leases, refill. */
#include "broker.h"
#include "meminfo.h"
#include "gmlake.h"
#include "lake_fixture.h"
#include <check.h>
#include <stdio.h>
#include <string.h>

#define MS 1000000ull

static broker br;
static Gmlake__LakeStats counters;
static size_t cs;

static void setup(void) {
  lake_setup();
  cs = be->chunk_size;
  gmlake__lake_stats__init(&counters);
  broker_init(&br, &lk, &counters, 0, 0);
}

static void client(broker_client *c, uint64_t id, pid_t pid, uint64_t cached_chunks) {
  memset(c, 0, sizeof *c);
  c->id = id;
  c->pid = pid;
  c->uid = 1000;
  c->cached = cached_chunks * cs;
  broker_add_client(&br, c);
}

/* Fill the lake to its limit, every chunk leased to `holder`. */
static void fill_lake(broker_client *holder) {
  add_chunks(10);
  broker_decision d;
  broker_lease(&br, holder, 1, 10, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 10);
  ck_assert_uint_eq(lake_headroom(&lk), 0);
}

/* The trust model: a free chunk last leased to another uid is never served
 * as it is. Its uid's processes gone: scrubbed, then served; still there:
 * released when the limit leaves no room (the lease waits for a new one),
 * left alone when it does; the same uid gets its own chunks back as they are. */
static int fake_gone;
static int scrubs;
static int gone_q(void *arg, uint32_t uid) {
  (void)arg, (void)uid;
  return fake_gone;
}
static int scrub_q(void *arg, uint32_t idx) {
  (void)arg, (void)idx;
  scrubs++;
  return 0;
}
START_TEST(test_trust_between_uids) {
  br.trust = (broker_trust){.uid_gone = gone_q, .scrub = scrub_q};
  lk.limit_bytes = 2 * cs;
  broker_client a, a2, b;
  client(&a, 1, 100, 0);
  client(&a2, 2, 101, 0); /* another process of uid 1000 */
  client(&b, 3, 200, 0);
  b.uid = 2000;
  add_chunks(2);
  broker_decision d;
  broker_lease(&br, &a, 1, 2, 0, 0, &d);
  ck_assert_uint_eq(d.n, 2);
  broker_returned(&br, &a, d.idx, 2);
  ck_assert_uint_eq(lk.nfree_clean, 0);
  /* uid 2000, uid 1000 alive, lake at its limit: one of A's chunks is released, B waits */
  fake_gone = 0;
  broker_lease(&br, &b, 2, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(counters.chunks_remade, 1);
  ck_assert_uint_eq(lk.total, 1);
  ck_assert_uint_eq(broker_refill(&br, 0), 1); /* a new chunk is ordered for B */
  /* the same uid takes the other one as it is */
  broker_lease(&br, &a2, 3, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  broker_returned(&br, &a2, d.idx, 1);
  /* uid 1000 gone: its chunk is scrubbed and served to B */
  fake_gone = 1;
  broker_review(&br, &b, 1, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_int_eq(scrubs, 1);
  ck_assert_uint_eq(counters.chunks_scrubbed, 1);
  ck_assert_uint_eq(lk.chunks[d.idx[0]].tenant, 2000);
  br.trust = (broker_trust){0};
}
END_TEST

START_TEST(test_serve_now) {
  broker_client a;
  client(&a, 7, 100, 0);
  add_chunks(4);
  broker_decision d;
  broker_lease(&br, &a, 42, 3, 0, 5 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.seq, 42);
  ck_assert_uint_eq(d.n, 3);
  ck_assert_uint_eq(d.since_ns, 5 * MS);
  for (uint32_t i = 0; i < d.n; i++) /* the chunks are the client's in the lake */
    ck_assert_int_eq(lake_owned_index(&lk, lake_chunk_id(&lk, d.idx[i]), 7), (long)d.idx[i]);
  ck_assert_uint_eq(a.leased_chunks, 3);
  ck_assert_int_eq(a.lease.pending, 0);
  ck_assert_uint_eq(counters.lease_count, 1);
  /* more than is free: what is free now (a partial lease), as before */
  broker_lease(&br, &a, 43, 5, 0, 6 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 1);
  ck_assert_uint_eq(a.leased_chunks, 4);
  /* given back: the lake has them free again */
  broker_returned(&br, &a, d.idx, d.n);
  ck_assert_uint_eq(a.leased_chunks, 3);
  ck_assert_uint_eq(lk.nfree, 1);
}
END_TEST

START_TEST(test_quota) {
  broker_client a;
  client(&a, 7, 42, 0);
  add_chunks(8);
  ck_assert_int_eq(lake_set_quota(&lk, 0, 42, 3 * cs), 0);
  broker_decision d;
  broker_lease(&br, &a, 1, 5, 0, 0, &d); /* 5 asked, 3 allowed */
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 3);
  broker_lease(&br, &a, 2, 1, 0, 0, &d); /* over quota: refused at once, whatever is free */
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_uint_eq(d.count, 1); /* the count asked, for the log (it said 0: the count after the quota) */
  ck_assert_int_eq(d.code, GML_EQUOTA);
  ck_assert_uint_eq(d.seq, 2);
  ck_assert_ptr_nonnull(strstr(d.why, "quota of"));
  ck_assert_ptr_nonnull(strstr(d.message, "lake holds"));
  ck_assert_int_eq(a.lease.pending, 0);
  ck_assert_uint_eq(a.leases_refused, 1);
  ck_assert_uint_eq(counters.leases_refused, 1);
  ck_assert_uint_eq(lk.nfree, 5);
  /* an optional lease over quota is declined, not refused */
  broker_lease(&br, &a, 3, 1, 1, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_DECLINE);
  ck_assert_uint_eq(counters.leases_refused, 1);
  /* a uid quota counts all of the user's processes together: a's 3 chunks and b's */
  broker_client b;
  client(&b, 8, 43, 0);
  ck_assert_int_eq(lake_set_quota(&lk, 1, 1000, 4 * cs), 0);
  broker_lease(&br, &b, 4, 2, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 1);
  broker_lease(&br, &b, 5, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_int_eq(d.code, GML_EQUOTA);
  ck_assert_ptr_nonnull(strstr(d.why, "uid 1000"));
}
END_TEST

/* A process's quota counts all its connections and the chunks parked by
 * connections it closed; a cgroup's counts its processes. */
START_TEST(test_quota_per_process_and_cgroup) {
  broker_client a1, a2, parked, other;
  client(&a1, 1, 42, 0);
  client(&a2, 2, 42, 0); /* a second connection of pid 42 */
  client(&other, 3, 77, 0);
  add_chunks(10);
  ck_assert_int_eq(lake_set_quota(&lk, 0, 42, 4 * cs), 0);
  broker_decision d;
  broker_lease(&br, &a1, 1, 3, 0, 0, &d);
  ck_assert_uint_eq(d.n, 3);
  broker_lease(&br, &a2, 1, 3, 0, 0, &d); /* one chunk left to the process, not three */
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 1);
  broker_lease(&br, &a2, 2, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_int_eq(d.code, GML_EQUOTA);
  ck_assert_ptr_nonnull(strstr(d.why, "pid 42"));
  /* a1 closes while the process lives on: its 3 chunks are parked and still count */
  broker_remove_client(&br, &a1);
  parked = a1;
  parked.next = parked.prev = NULL;
  broker_park(&br, &parked);
  broker_client a3;
  client(&a3, 4, 42, 0);
  broker_lease(&br, &a3, 1, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_int_eq(d.code, GML_EQUOTA);
  /* the process exited: its parked chunks no longer count */
  broker_unpark(&br, &parked);
  broker_lease(&br, &a3, 2, 5, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 3);
  /* another process is not limited by pid 42's quota; a cgroup quota covers both */
  broker_lease(&br, &other, 1, 1, 0, 0, &d);
  ck_assert_uint_eq(d.n, 1);
  snprintf(other.cgroup, sizeof other.cgroup, "/job/a");
  snprintf(a3.cgroup, sizeof a3.cgroup, "/job/a");
  ck_assert_int_eq(lake_set_quota_cgroup(&lk, "/job/a", 4 * cs), 0); /* a3 3 + other 1 */
  broker_lease(&br, &other, 2, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_ptr_nonnull(strstr(d.why, "cgroup /job/a"));
  uint64_t q;
  char who[64];
  ck_assert_uint_eq(broker_quota_room(&br, &other, &q, who, sizeof who), 0);
  ck_assert_uint_eq(q, 4 * cs);
  ck_assert_int_eq(lake_set_quota_cgroup(&lk, "", 1), GML_EINVAL);
  ck_assert_int_eq(lake_set_quota_cgroup(&lk, "/job/a", 0), 0); /* cleared */
  ck_assert_uint_eq(broker_quota_room(&br, &other, &q, NULL, 0), UINT64_MAX);
}
END_TEST

/* A published share counts in its publisher's user quota until it ends. */
START_TEST(test_quota_counts_published_shares) {
  broker_client a, pub;
  client(&a, 1, 42, 0); /* uid 1000 */
  add_chunks(10);
  ck_assert_int_eq(lake_set_quota(&lk, 1, 1000, 4 * cs), 0);
  broker_decision d;
  broker_lease(&br, &a, 1, 3, 0, 0, &d);
  ck_assert_uint_eq(d.n, 3);
  /* the 3 chunks leave a's lease for a share (shares.c): a's quota still holds them */
  a.leased_chunks -= 3;
  pub = a;
  pub.leased_chunks = 3;
  broker_publish(&br, &pub);
  ck_assert_uint_eq(broker_quota_room(&br, &a, NULL, NULL, 0), 1);
  broker_lease(&br, &a, 2, 3, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 1);
  broker_unpublish(&br, &pub); /* the share ended */
  ck_assert_uint_eq(broker_quota_room(&br, &a, NULL, NULL, 0), 3);
}
END_TEST

/* After a restart one user hands over at most the lake's limit, so it cannot
 * take the room of the others' hand-overs; all together at most twice it. */
START_TEST(test_adopt_room_per_user) {
  broker_client a, b;
  client(&a, 1, 42, 0); /* uid 1000 */
  client(&b, 2, 43, 0);
  b.uid = 2000;
  ck_assert_uint_eq(broker_adopt_room(&br, &a, 128), 10); /* the limit: 10 chunks */
  broker_adopted(&br, &a, 10);
  ck_assert_uint_eq(broker_adopt_room(&br, &a, 1), 0);
  ck_assert_uint_eq(broker_adopt_room(&br, &b, 128), 10); /* another user's room is whole */
}
END_TEST

/* Free chunks past the limit (hand-overs after a restart) are released. */
START_TEST(test_trim_over_limit) {
  broker_client a;
  client(&a, 1, 42, 0);
  add_chunks(10);
  broker_decision d;
  broker_lease(&br, &a, 1, 4, 0, 0, &d);
  ck_assert_uint_eq(d.n, 4);
  lk.limit_bytes = 5 * cs; /* 10 held, 4 of them leased */
  ck_assert_uint_eq(broker_trim_over_limit(&br), 5);
  ck_assert_uint_eq(lk.total, 5);
  ck_assert_uint_eq(broker_trim_over_limit(&br), 0);
  lk.limit_bytes = 2 * cs; /* only free chunks go: the 4 leased stay */
  ck_assert_uint_eq(broker_trim_over_limit(&br), 1);
  ck_assert_uint_eq(lk.total, 4);
}
END_TEST

/* Out of memory says what was asked and who holds the lake, per process. */
START_TEST(test_out_of_memory_names_the_holders) {
  broker_client h1, h2, asker;
  client(&h1, 1, 101, 0);
  snprintf(h1.name, sizeof h1.name, "trainer");
  fill_lake(&h1);
  h1.allocated = 9 * cs;
  h1.cached = 1 * cs;
  client(&h2, 2, 101, 0); /* same process, second connection: summed */
  h2.paused = 3 * cs;
  client(&asker, 3, 202, 0);
  snprintf(asker.name, sizeof asker.name, "server");
  broker_decision d;
  broker_lease(&br, &asker, 7, 4, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  broker_review(&br, &asker, 1 * MS, &d); /* nobody idle enough (1 chunk cached is enough: asked) */
  broker_review(&br, &asker, BROKER_LEASE_WAIT_MS * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_int_eq(d.code, GML_ENOMEM);
  char want[256];
  snprintf(want, sizeof want,
           "asked 8.00 MiB; the lake holds 20.00 MiB of limit 20.00 MiB (0 B free, 0 B parked); held by: pid 101 "
           "(trainer) leased 20.00 MiB allocated 18.00 MiB cached 2.00 MiB paused 6.00 MiB");
  ck_assert_msg(strstr(d.message, want), "message: %s", d.message);
  ck_assert_msg(strstr(d.message, "pid 202 (server, the asker) leased 0 B"), "message: %s", d.message);
}
END_TEST

/* ... but another user's processes by their numbers only: "a process of uid
 * U", no pid, no name (before, any user's failed lease named every other
 * user's processes). */
START_TEST(test_out_of_memory_hides_other_users) {
  broker_client h1, asker;
  client(&h1, 1, 101, 0);
  h1.uid = 2000;
  snprintf(h1.name, sizeof h1.name, "secret-job");
  fill_lake(&h1);
  h1.allocated = 10 * cs;
  client(&asker, 3, 202, 0);
  snprintf(asker.name, sizeof asker.name, "server");
  broker_decision d;
  broker_lease(&br, &asker, 7, 4, 0, 0, &d);
  broker_review(&br, &asker, BROKER_LEASE_WAIT_MS * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_msg(strstr(d.message, "held by: a process of uid 2000 leased 20.00 MiB allocated 20.00 MiB"), "message: %s",
                d.message);
  ck_assert_msg(!strstr(d.message, "secret-job") && !strstr(d.message, "pid 101"), "message: %s", d.message);
  ck_assert_msg(strstr(d.message, "pid 202 (server, the asker)"), "message: %s", d.message);
}
END_TEST

/* A pid used again: a connection whose process exited (its socket passed
 * on, no name) and another user's process that got its pid later are two
 * holders, not one: the asker's user is not shown the other user's process
 * name under its own connection's pid (before, the picture summed them as
 * "pid 101 (secret-job)" for the asker of uid 1000: attacker trial 2). */
START_TEST(test_out_of_memory_pid_reused_by_another_user) {
  broker_client victim, stale, asker;
  client(&victim, 1, 101, 0);
  victim.uid = 2000;
  snprintf(victim.name, sizeof victim.name, "secret-job");
  fill_lake(&victim);
  client(&stale, 2, 101, 0); /* uid 1000, its hello named nothing */
  client(&asker, 3, 202, 0);
  broker_decision d;
  broker_lease(&br, &asker, 7, 4, 0, 0, &d);
  broker_review(&br, &asker, BROKER_LEASE_WAIT_MS * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_msg(!strstr(d.message, "secret-job"), "message: %s", d.message);
  ck_assert_msg(strstr(d.message, "a process of uid 2000 leased 20.00 MiB"), "message: %s", d.message);
}
END_TEST

/* More processes than the picture lists (8): the ones listed are those that
 * lease the most, and each process left out is counted once. Before, the
 * first 8 met were listed (the newest connections: the process that held the
 * whole lake, connected first, was left out), and a process left out was
 * counted once a connection ("and 4 more" for 3). */
START_TEST(test_out_of_memory_lists_the_most_leased) {
  static broker_client hog, asker, few[10];
  client(&hog, 1, 101, 0);
  snprintf(hog.name, sizeof hog.name, "hog");
  fill_lake(&hog);
  client(&few[0], 10, 301, 0); /* one process, two connections */
  client(&few[1], 11, 301, 0);
  for (int i = 2; i < 10; i++) client(&few[i], 10 + (uint64_t)i, 300 + i, 0);
  client(&asker, 3, 202, 0);
  broker_decision d;
  broker_lease(&br, &asker, 7, 4, 0, 0, &d);
  broker_review(&br, &asker, BROKER_LEASE_WAIT_MS * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_msg(strstr(d.message, "held by: pid 101 (hog) leased 20.00 MiB"), "message: %s", d.message);
  ck_assert_msg(strstr(d.message, "; and 3 more process(es)"), "message: %s", d.message); /* 11 processes, 8 listed */
}
END_TEST

/* A full lake: the lease waits, the clients with idle cache are asked (most
 * idle first, the asker and those with less than a chunk idle not at all),
 * once; the deadline passed, the lease is refused. */
START_TEST(test_wait_reclaim_refuse) {
  broker_client holder, small, big, asker, tiny, gone, one;
  client(&holder, 1, 101, 7); /* listed last, the most idle */
  fill_lake(&holder);
  client(&small, 2, 102, 3);
  client(&big, 3, 103, 5);
  client(&tiny, 4, 104, 0);
  tiny.cached = cs - 1;
  client(&one, 7, 107, 1); /* exactly one chunk idle: enough */
  client(&gone, 5, 105, 9);
  gone.closing = 1;
  client(&asker, 6, 106, 8);                                             /* its own cache does not count */
  small.leased_chunks = 3, big.leased_chunks = 5, one.leased_chunks = 1; /* their caches' chunks */
  broker_decision d;
  broker_lease(&br, &asker, 9, 2, 0, 100 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_int_eq(asker.lease.pending, 1);
  ck_assert_uint_eq(asker.lease.deadline_ns, 100 * MS + BROKER_LEASE_WAIT_MS * MS);
  broker_review(&br, &asker, 101 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, 2 * cs * BROKER_RECLAIM_AHEAD);
  broker_client *who[8];
  ck_assert_uint_eq(broker_reclaim_targets(&br, &asker, who, 8), 4);
  ck_assert_ptr_eq(who[0], &holder);
  ck_assert_ptr_eq(who[1], &big);
  ck_assert_ptr_eq(who[2], &small);
  ck_assert_ptr_eq(who[3], &one);
  ck_assert_uint_eq(broker_reclaim_targets(&br, &asker, who, 2), 4); /* counted beyond max */
  ck_assert_ptr_eq(who[0], &holder);
  ck_assert_ptr_eq(who[1], &big);
  /* asked once per lease */
  broker_review(&br, &asker, 102 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
  /* the deadline passed: refused */
  broker_review(&br, &asker, 100 * MS + BROKER_LEASE_WAIT_MS * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_int_eq(d.code, GML_ENOMEM);
  ck_assert_uint_eq(d.seq, 9);
  ck_assert_str_eq(d.why, "out of memory: the lake is full");
  ck_assert_int_eq(asker.lease.pending, 0);
  ck_assert_uint_eq(counters.leases_refused, 1);
  /* nothing pending any more: nothing to decide */
  broker_review(&br, &asker, 2000 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_NONE);
}
END_TEST

/* Chunks given back serve the waiting lease (before its deadline). */
START_TEST(test_reclaimed_chunks_serve_the_waiting_lease) {
  broker_client holder, asker;
  client(&holder, 1, 101, 4);
  fill_lake(&holder);
  client(&asker, 2, 102, 0);
  broker_decision d;
  broker_lease(&br, &asker, 5, 3, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_int_eq(broker_serve_free(&br, &asker, &d), 0); /* nothing free yet */
  broker_review(&br, &asker, 1 * MS, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 3 * cs * BROKER_RECLAIM_AHEAD);
  uint32_t back[2] = {0, 1};
  broker_returned(&br, &holder, back, 2);
  ck_assert_uint_eq(holder.leased_chunks, 8);
  ck_assert_int_eq(broker_serve_free(&br, &asker, &d), 1);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.seq, 5);
  ck_assert_uint_eq(d.n, 2);
  ck_assert_uint_eq(asker.leased_chunks, 2);
  ck_assert_int_eq(asker.lease.reclaim_asked, 0); /* the next lease may ask again */
}
END_TEST

/* A client that leases nothing is not asked for the idle cache it claims. */
START_TEST(test_claimed_cache_without_chunks_not_asked) {
  broker_client holder, liar, asker;
  client(&holder, 1, 101, 0);
  fill_lake(&holder);
  holder.allocated = 10 * cs;
  client(&liar, 3, 103, 0);
  liar.cached = 8 * cs; /* reports 8 chunks of cache, holds none */
  client(&asker, 2, 102, 0);
  broker_decision d;
  broker_lease(&br, &asker, 5, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  broker_review(&br, &asker, 1 * MS, &d); /* nobody can give back: refused now, not after the wait */
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_uint_eq(liar.reclaims_sent, 0);
}
END_TEST

START_TEST(test_full_lake_nobody_to_ask) {
  broker_client holder, asker;
  client(&holder, 1, 101, 0); /* no idle cache anywhere */
  fill_lake(&holder);
  holder.allocated = 10 * cs;
  client(&asker, 2, 102, 0);
  broker_decision d;
  broker_lease(&br, &asker, 5, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  broker_review(&br, &asker, 1 * MS, &d); /* refused now, not after the wait */
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_int_eq(d.code, GML_ENOMEM);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
}
END_TEST

/* A client whose report is late (leases more than it said it allocates) is
 * asked too; once every client asked has answered (reported since) and
 * nothing came free, the lease is refused without waiting for its deadline. */
START_TEST(test_refused_once_all_asked_answered) {
  broker_client holder, busy, asker;
  client(&holder, 1, 101, 0);
  fill_lake(&holder); /* leased 10, reported allocated 0: maybe idle */
  client(&busy, 2, 102, 0);
  client(&asker, 3, 103, 0);
  broker_decision d;
  broker_lease(&br, &asker, 4, 2, 0, 10 * MS, &d);
  broker_review(&br, &asker, 11 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, 2 * cs * BROKER_RECLAIM_AHEAD);
  broker_client *who[4];
  ck_assert_uint_eq(broker_reclaim_targets(&br, &asker, who, 4), 1);
  ck_assert_ptr_eq(who[0], &holder);
  broker_review(&br, &asker, 12 * MS, &d); /* not answered yet: waits */
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  holder.allocated = 10 * cs;       /* it answers: all of it is in use */
  broker_reported(&br, &holder, 0); /* a report of its own, not the answer */
  broker_review(&br, &asker, 13 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  broker_reported(&br, &holder, 1); /* the answer: it served the request */
  broker_review(&br, &asker, 14 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_int_eq(d.code, GML_ENOMEM);
  ck_assert_ptr_nonnull(strstr(d.why, "no other client had idle cache"));
}
END_TEST

/* Chunks on their way (being created, or parked until a process exits): the lease waits. */
START_TEST(test_wait_for_chunks_coming) {
  broker_client holder, asker;
  client(&holder, 1, 101, 0);
  fill_lake(&holder);
  holder.allocated = 10 * cs; /* all in use: nothing to reclaim */
  client(&asker, 2, 102, 0);
  broker_decision d;
  lake_park(&lk, 0); /* the holder left, its process lives on */
  broker_lease(&br, &asker, 5, 1, 0, 0, &d);
  broker_review(&br, &asker, 1 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
  lake_give_back(&lk, 0); /* its process exited */
  ck_assert_int_eq(broker_serve_free(&br, &asker, &d), 1);
  /* with room under the limit, a lease waits for the creators, asking nobody */
  broker_client c2;
  client(&c2, 3, 103, 0);
  holder.cached = 6 * cs;
  ck_assert_int_eq(broker_set_limit(&br, 12 * cs), 0);
  broker_lease(&br, &c2, 6, 2, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  broker_review(&br, &c2, 1 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
}
END_TEST

START_TEST(test_optional_leases) {
  broker_client holder, a;
  client(&holder, 1, 101, 5);
  fill_lake(&holder);
  client(&a, 2, 102, 0);
  broker_decision d;
  broker_lease(&br, &a, 8, 2, 1, 0, &d); /* nothing free: declined at once, quietly */
  ck_assert_int_eq(d.verdict, BROKER_DECLINE);
  ck_assert_int_eq(d.code, GML_ENOMEM);
  ck_assert_uint_eq(d.seq, 8);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
  ck_assert_int_eq(a.lease.pending, 0); /* nobody waits for it */
  ck_assert_uint_eq(counters.optional_declined, 1);
  ck_assert_uint_eq(counters.leases_refused, 0);
  ck_assert_uint_eq(a.leases_refused, 0);
  uint32_t back = 3;
  broker_returned(&br, &holder, &back, 1);
  broker_lease(&br, &a, 9, 2, 1, 0, &d); /* served from what is free */
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 1);
  ck_assert_uint_eq(counters.optional_declined, 1);
}
END_TEST

START_TEST(test_closing_client_is_not_served) {
  broker_client a;
  client(&a, 1, 101, 0);
  broker_decision d;
  broker_lease(&br, &a, 3, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  a.closing = 1;
  add_chunks(1);
  ck_assert_int_eq(broker_serve_free(&br, &a, &d), 0);
  broker_review(&br, &a, 5000 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_NONE);
  ck_assert_uint_eq(lk.nfree, 1);
}
END_TEST

START_TEST(test_refill) {
  broker_init(&br, &lk, &counters, 4, 0); /* prefetch 4 chunks */
  ck_assert_uint_eq(broker_refill(&br, 0), 4);
  ck_assert_uint_eq(lk.creating, 4);
  ck_assert_uint_eq(broker_refill(&br, 0), 0); /* already ordered */
  broker_client a;
  client(&a, 1, 101, 0);
  broker_decision d;
  broker_lease(&br, &a, 1, 5, 0, 0, &d); /* waits: 5 more wanted */
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(broker_refill(&br, 0), 5);
  ck_assert_uint_eq(broker_refill(&br, 0), 0);
  /* the limit (10 chunks) caps the order */
  a.lease.count = 20;
  ck_assert_uint_eq(broker_refill(&br, 0), 1);
  ck_assert_uint_eq(lake_headroom(&lk), 0);
  /* a failed creation: a back-off, logged once */
  lk.creating = 0;
  ck_assert_int_eq(broker_creation_failed(&br, 10 * MS), 1);
  ck_assert_int_eq(broker_creation_failed(&br, 20 * MS), 0);
  ck_assert_uint_eq(broker_refill(&br, 500 * MS), 0);
  ck_assert_uint_eq(broker_refill(&br, 20 * MS + BROKER_CREATE_BACKOFF_MS * MS), 10);
}
END_TEST

START_TEST(test_refill_after_trim_and_preallocation) {
  broker_init(&br, &lk, &counters, 2, 6);      /* prefetch 2, preallocate 6 */
  ck_assert_uint_eq(broker_refill(&br, 0), 6); /* the preallocation covers the prefetch */
  lk.creating = 0;
  add_chunks(6);
  ck_assert_uint_eq(broker_refill(&br, 0), 0);
  ck_assert_uint_eq(broker_keep_free(&br), UINT32_MAX);
  broker_trimmed(&br);
  ck_assert_uint_eq(lake_trim(&lk, 0), 6);
  ck_assert_uint_eq(broker_refill(&br, 0), 0); /* trimmed: stays trimmed */
  ck_assert_uint_eq(broker_keep_free(&br), 0); /* a creation landing now is released again */
  broker_client a;
  client(&a, 1, 101, 0);
  broker_decision d;
  broker_lease(&br, &a, 1, 1, 0, 0, &d); /* demand is back */
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(broker_refill(&br, 0), 6);
  ck_assert_uint_eq(broker_keep_free(&br), UINT32_MAX);
}
END_TEST

START_TEST(test_set_limit) {
  add_chunks(6);
  ck_assert_int_eq(broker_set_limit(&br, cs - 1), GML_EINVAL);
  ck_assert_uint_eq(lk.limit_bytes, 10 * cs);
  ck_assert_int_eq(broker_set_limit(&br, 4 * cs), 0);
  ck_assert_uint_eq(lk.total, 4); /* free chunks over it released */
  ck_assert_uint_eq(lake_headroom(&lk), 0);
}
END_TEST

/* A streamed lease (one request for more than one reply holds): served in
 * replies of up to BROKER_MAX_LEASE chunks, each saying how many are still
 * to come; pending until the last; counted as one lease. */
START_TEST(test_streamed_lease_in_replies) {
  lk.limit_bytes = 320 * cs; /* room for the plain lease below (290 + 20), 300 made */
  add_chunks(300);
  broker_client a;
  client(&a, 1, 101, 0);
  broker_decision d;
  broker_lease_streamed(&br, &a, 7, 290, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.seq, 7);
  ck_assert_uint_eq(d.n, BROKER_MAX_LEASE);
  ck_assert_uint_eq(d.left, 290 - BROKER_MAX_LEASE);
  ck_assert_int_eq(a.lease.pending, 1);
  ck_assert_int_eq(broker_serve_free(&br, &a, &d), 1);
  ck_assert_uint_eq(d.n, BROKER_MAX_LEASE);
  ck_assert_uint_eq(d.left, 290 - 2 * BROKER_MAX_LEASE);
  ck_assert_int_eq(broker_serve_free(&br, &a, &d), 1);
  ck_assert_uint_eq(d.n, 290 - 2 * BROKER_MAX_LEASE);
  ck_assert_uint_eq(d.left, 0);
  ck_assert_int_eq(a.lease.pending, 0);
  ck_assert_uint_eq(a.leased_chunks, 290);
  ck_assert_uint_eq(counters.lease_count, 1);
  ck_assert_int_eq(broker_serve_free(&br, &a, &d), 0); /* nothing pending */
  /* a plain lease never stays pending after a partial serve: the client asks again */
  broker_lease(&br, &a, 8, 20, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 10);
  ck_assert_uint_eq(d.left, 0);
  ck_assert_int_eq(a.lease.pending, 0);
}
END_TEST

/* A streamed lease asks the others at once, in one request each, for all it
 * needs beyond what is free and what can still be created (the old way: a
 * plain lease's worth times BROKER_RECLAIM_AHEAD, and only once nothing could
 * be created any more: 4 rounds for 40 GiB on the H100); what comes back
 * and what is created serve it as it lands. */
START_TEST(test_streamed_lease_asks_the_whole_shortfall) {
  lk.limit_bytes = 300 * cs;
  broker_client holder, asker;
  client(&holder, 1, 101, 0);
  add_chunks(250);
  broker_decision d;
  broker_lease_streamed(&br, &holder, 1, 250, 0, &d);
  while (holder.lease.pending) ck_assert_int_eq(broker_serve_free(&br, &holder, &d), 1);
  holder.cached = 250 * cs; /* it freed everything and idles */
  add_chunks(20);
  client(&asker, 2, 102, 0);
  broker_lease_streamed(&br, &asker, 5, 280, 10 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE); /* the 20 free ones at once */
  ck_assert_uint_eq(d.n, 20);
  ck_assert_uint_eq(d.left, 260);
  ck_assert_uint_eq(broker_refill(&br, 10 * MS), 30); /* the limit leaves room for 30 new ones */
  broker_review(&br, &asker, 10 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, (260 - 30) * cs); /* all of what creating cannot cover */
  ck_assert_uint_eq(holder.reclaims_sent, 1);
  broker_review(&br, &asker, 11 * MS, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 0); /* asked once */
  uint32_t back[128];
  for (uint32_t i = 0; i < 128; i++) back[i] = i;
  broker_returned(&br, &holder, back, 128);
  ck_assert_int_eq(broker_serve_free(&br, &asker, &d), 1);
  ck_assert_uint_eq(d.n, 128);
  ck_assert_uint_eq(d.left, 132);
  for (uint32_t i = 0; i < 102; i++) back[i] = 128 + i;
  broker_returned(&br, &holder, back, 102);
  ck_assert_int_eq(broker_serve_free(&br, &asker, &d), 1);
  ck_assert_uint_eq(d.left, 30);
  lk.creating = 0; /* the creators' 30 land */
  add_chunks(30);
  ck_assert_int_eq(broker_serve_free(&br, &asker, &d), 1);
  ck_assert_uint_eq(d.n, 30);
  ck_assert_uint_eq(d.left, 0);
  ck_assert_int_eq(asker.lease.pending, 0);
  ck_assert_uint_eq(asker.leased_chunks, 280);
  ck_assert_uint_eq(holder.reclaims_sent, 1);
}
END_TEST

/* A streamed lease's wait bound counts from the last chunks it got; once
 * everyone asked has answered, it asks again if they gave something, and is
 * refused (with what it asked and what it got) when nobody has more. */
START_TEST(test_streamed_lease_wait_and_refusal) {
  broker_client holder, asker;
  client(&holder, 1, 101, 10);
  fill_lake(&holder);
  client(&asker, 2, 102, 0);
  broker_decision d;
  broker_lease_streamed(&br, &asker, 3, 8, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  broker_review(&br, &asker, 1 * MS, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 8 * cs);
  uint32_t back[4] = {0, 1, 2, 3};
  broker_returned(&br, &holder, back, 4);
  ck_assert_int_eq(broker_serve_free(&br, &asker, &d), 1);
  ck_assert_uint_eq(d.left, 4);
  /* chunks came just before the deadline: the wait starts again */
  uint64_t t = BROKER_LEASE_WAIT_MS * MS - 1 * MS;
  broker_review(&br, &asker, t, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  broker_review(&br, &asker, BROKER_LEASE_WAIT_MS * MS + 1 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  /* the holder answered, having given those 4 (the rest was still in use on
   * its streams): asked again for the rest */
  broker_reported(&br, &holder, holder.reclaims_sent);
  holder.cached = 6 * cs;
  broker_review(&br, &asker, BROKER_LEASE_WAIT_MS * MS + 2 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, 4 * cs);
  ck_assert_uint_eq(holder.reclaims_sent, 2);
  /* it answers again, giving nothing: refused now, with what was asked and what was sent */
  broker_reported(&br, &holder, holder.reclaims_sent);
  broker_review(&br, &asker, BROKER_LEASE_WAIT_MS * MS + 3 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_str_eq(d.why, "out of memory: the lake is full and no other client had idle cache to give back");
  ck_assert_int_eq(d.code, GML_ENOMEM);
  ck_assert_msg(strstr(d.message, "asked 16.00 MiB (8.00 MiB of it sent); the lake holds"), "%s", d.message);
  ck_assert_int_eq(asker.lease.pending, 0);
  ck_assert_uint_eq(asker.leased_chunks, 4); /* what it got stays its own */
  /* the same without progress nor an answer: refused at its deadline */
  broker_lease_streamed(&br, &asker, 4, 6, 10000 * MS, &d);
  broker_review(&br, &asker, 10001 * MS, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 6 * cs);
  broker_review(&br, &asker, 10000 * MS + BROKER_LEASE_WAIT_MS * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_msg(strstr(d.message, "asked 12.00 MiB; the lake holds"), "%s", d.message);
  /* more than the limit could ever give it (4 leased + 7 > 10): refused at once, nobody asked (before:
   * it took others' idle caches and made chunks up to the limit, then was refused at its deadline) */
  uint64_t sent = holder.reclaims_sent;
  broker_lease_streamed(&br, &asker, 5, 7, 20000 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
  ck_assert_uint_eq(holder.reclaims_sent, sent);
  ck_assert_msg(strstr(d.message, "14.00 MiB more would pass the lake's limit"), "%s", d.message);
}

END_TEST

/* The idle hog (issue 12), scaled down: holder leased 250 chunks long ago,
 * freed them all and idles; the lake may create 50 more. */
#define HOG_AT (10000 * MS) /* the asker comes 10 s after holder's last lease: idle by any measure */
static void idle_hog(broker_client *holder, uint64_t limit_chunks) {
  lk.limit_bytes = limit_chunks * cs;
  client(holder, 1, 101, 0);
  add_chunks(250);
  broker_decision d;
  broker_lease_streamed(&br, holder, 1, 250, 0, &d);
  while (holder->lease.pending) ck_assert_int_eq(broker_serve_free(&br, holder, &d), 1);
  holder->cached = holder->idle = 250 * cs; /* its report: all of it whole free chunks */
}

/* holder gives back n of its chunks, as its library does when asked */
static void give_back(broker_client *holder, uint32_t n) {
  while (n) {
    uint32_t idx[BROKER_MAX_LEASE], k = 0;
    for (uint32_t i = 0; i < lk.nslots && k < n && k < BROKER_MAX_LEASE; i++)
      if (lk.chunks[i].state == CHUNK_LEASED && lk.chunks[i].owner == holder->id) idx[k++] = i;
    ck_assert_uint_gt(k, 0);
    broker_returned(&br, holder, idx, k);
    n -= k;
  }
}

/* what the waiting lease of c gets from the free chunks now */
static uint32_t serve_all(broker_client *c) {
  broker_decision d;
  uint32_t n = 0;
  while (broker_serve_free(&br, c, &d)) n += d.n;
  return n;
}

/* An idle client's whole free chunks cover the lease: it alone is asked, for
 * all of it, at once, and no chunk is created for the lease (before: the 50
 * the limit allowed were created and holder was asked for the other 200,
 * while the asker imported: on the H100 the creators' driver calls slowed the
 * asker's imports from ~33 to ~85 us a chunk). */
START_TEST(test_idle_cache_covers_the_lease) {
  broker_client holder, asker;
  idle_hog(&holder, 300);
  client(&asker, 2, 102, 0);
  broker_decision d;
  broker_lease_streamed(&br, &asker, 5, 250, HOG_AT, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(broker_refill(&br, HOG_AT), 0); /* nothing created for it */
  ck_assert_uint_eq(lk.creating, 0);
  ck_assert_uint_eq(d.reclaim_bytes, 250 * cs); /* the whole shortfall, asked with the lease */
  broker_client *who[4];
  ck_assert_uint_eq(broker_reclaim_targets(&br, &asker, who, 4), 1);
  ck_assert_ptr_eq(who[0], &holder);
  ck_assert_uint_eq(holder.reclaims_sent, 1);
  broker_review(&br, &asker, HOG_AT + 1 * MS, &d); /* asked once; still nothing created */
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
  ck_assert_uint_eq(broker_refill(&br, HOG_AT + 1 * MS), 0);
  give_back(&holder, 128);
  ck_assert_uint_eq(serve_all(&asker), 128);
  broker_review(&br, &asker, HOG_AT + 20 * MS, &d);
  ck_assert_uint_eq(broker_refill(&br, HOG_AT + 20 * MS), 0);
  give_back(&holder, 122);
  ck_assert_uint_eq(serve_all(&asker), 122);
  ck_assert_int_eq(asker.lease.pending, 0);
  ck_assert_uint_eq(asker.leased_chunks, 250);
  ck_assert_uint_eq(holder.leased_chunks, 0);
  ck_assert_uint_eq(lk.total, 250); /* the lake made nothing: the 50 it may make stay the driver's */
  ck_assert_uint_eq(counters.lease_count, 2);
}
END_TEST

/* The idle hog on a preallocated lake: 200 chunks free beside holder's idle
 * 250, the asker streams 300. The free chunks serve 200 of it (one serve
 * takes 128, the stream the rest), so holder is asked for the other 100
 * alone. Before, the broker asked holder for all but the first serve's 128
 * (172): on the H100, A gave 39.5 GiB where 20 were wanted, and B's imports
 * shared the driver with A's releases (1.07-1.12 s against 0.69-0.79). */
START_TEST(test_idle_cache_asked_beyond_free_only) {
  broker_client holder, asker;
  idle_hog(&holder, 500);
  add_chunks(200);
  client(&asker, 2, 102, 0);
  broker_decision d;
  broker_lease_streamed(&br, &asker, 5, 300, HOG_AT, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, BROKER_MAX_LEASE);
  ck_assert_uint_eq(d.reclaim_bytes, 100 * cs); /* 300 - 200 free */
  ck_assert_uint_eq(broker_refill(&br, HOG_AT), 0);
  ck_assert_uint_eq(serve_all(&asker), 200 - BROKER_MAX_LEASE);
  give_back(&holder, 100);
  ck_assert_uint_eq(serve_all(&asker), 100);
  ck_assert_int_eq(asker.lease.pending, 0);
  ck_assert_uint_eq(holder.leased_chunks, 150); /* it keeps what was not wanted */
  ck_assert_uint_eq(lk.total, 450);
  /* free chunks that cover the whole lease: nobody is asked */
  broker_client third;
  client(&third, 3, 103, 0);
  give_back(&holder, 150);
  broker_lease_streamed(&br, &third, 7, 140, HOG_AT + 2000 * MS, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
  ck_assert_uint_eq(serve_all(&third), 140 - BROKER_MAX_LEASE);
  ck_assert_int_eq(third.lease.pending, 0);
}
END_TEST

/* At the limit, with another uid's free chunks in the lake: a lease the idle
 * client covers releases none of them (before: the first serve made room,
 * releasing and remaking another uid's chunks, and then asked the idle
 * client anyway; attacker trial, chunks_remade 0 -> 10). */
START_TEST(test_idle_cache_before_making_room) {
  broker_client holder, other, asker;
  idle_hog(&holder, 300);
  client(&other, 3, 103, 0);
  other.uid = 2000;
  add_chunks(50);
  broker_decision d;
  broker_lease(&br, &other, 1, 50, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 50);
  broker_returned(&br, &other, d.idx, d.n); /* 50 free chunks tainted by uid 2000; the lake at its limit */
  ck_assert_uint_eq(lk.total, 300);
  client(&asker, 2, 102, 0);
  broker_lease(&br, &asker, 5, 10, 0, HOG_AT, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_gt(d.reclaim_bytes, 0);
  ck_assert_uint_eq(counters.chunks_remade, 0);
  ck_assert_uint_eq(lk.nfree, 50); /* uid 2000's stay */
  give_back(&holder, 10);
  ck_assert_uint_eq(serve_all(&asker), 10);
  ck_assert_uint_eq(counters.chunks_remade, 0);
}
END_TEST

/* A plain lease (a run of them makes a large allocation on an older
 * client) asks the idle client ahead too, within what it holds. */
START_TEST(test_idle_cache_covers_a_plain_lease) {
  broker_client holder, asker;
  idle_hog(&holder, 300);
  client(&asker, 2, 102, 0);
  broker_decision d;
  broker_lease(&br, &asker, 5, 100, 0, HOG_AT, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, 250 * cs); /* 16 leases' worth, bounded by its 250 */
  ck_assert_uint_eq(broker_refill(&br, HOG_AT), 0);
  give_back(&holder, 250);
  ck_assert_uint_eq(serve_all(&asker), 100);
  broker_lease(&br, &asker, 6, 100, 0, HOG_AT + 1 * MS, &d); /* the next one finds them free */
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 100);
  ck_assert_uint_eq(lk.total, 250);
}
END_TEST

/* Several idle clients: the most idle first, each asked for its part only;
 * a client that allocated within BROKER_IDLE_MS (a lease) and an idle one
 * of another uid (its chunks would be made anew: creating after all) are
 * neither counted nor asked. */

/* Idle caches too small for the lease: as before, what the limit allows is
 * created and the rest asked of everyone with idle cache. */

/* Fairness: a client that allocates is not drained before the lake creates.
 * Allocating is a lease, or a usage report that counts allocations since
 * the last one; BROKER_IDLE_MS after it, with reports that count none, it
 * is idle. */

/* The idle client gives less than it said (its streams still used part of
 * it): once it answered, the lease goes on as any other: what the limit
 * allows is created, the rest asked of everyone, and it is served. */

/* The idle client does not answer (stopped, its keeper stuck): after
 * BROKER_IDLE_STALL_MS without chunks, at most half the lease wait, the
 * lease creates what the limit allows and is served before its deadline. */

/* Several idle clients: the most idle first, each asked for its part only;
 * a client that allocated within BROKER_IDLE_MS (a lease) and an idle one
 * of another uid (its chunks would be made anew: creating after all) are
 * neither counted nor asked. */
START_TEST(test_idle_clients_share_the_shortfall) {
  lk.limit_bytes = 40 * cs;
  add_chunks(24);
  broker_client x, y, busy, other, asker;
  client(&x, 1, 101, 0);
  client(&y, 2, 102, 0);
  client(&busy, 3, 103, 0);
  client(&other, 4, 104, 0);
  other.uid = 2000;
  client(&asker, 5, 105, 0);
  broker_decision d;
  broker_lease(&br, &x, 1, 6, 0, 0, &d);
  broker_lease(&br, &y, 1, 4, 0, 0, &d);
  broker_lease(&br, &other, 1, 6, 0, 0, &d);
  broker_lease(&br, &busy, 1, 8, 0, HOG_AT - 100 * MS, &d); /* it allocated 0.1 s ago */
  ck_assert_uint_eq(lk.nfree, 0);
  x.cached = x.idle = 6 * cs;
  y.cached = y.idle = 4 * cs;
  other.cached = other.idle = 6 * cs;
  busy.cached = busy.idle = 8 * cs;
  broker_lease_streamed(&br, &asker, 9, 8, HOG_AT, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, 8 * cs);
  broker_client *who[8];
  ck_assert_uint_eq(broker_reclaim_targets(&br, &asker, who, 8), 2);
  ck_assert_ptr_eq(who[0], &x);
  ck_assert_ptr_eq(who[1], &y);
  ck_assert_uint_eq(x.reclaim_ask, 6 * cs);
  ck_assert_uint_eq(y.reclaim_ask, 2 * cs);
  ck_assert_uint_eq(busy.reclaims_sent, 0);
  ck_assert_uint_eq(other.reclaims_sent, 0);
  ck_assert_uint_eq(broker_refill(&br, HOG_AT), 0);
  /* x's cache is promised to that lease until x answers: another asker does
   * not count it, and y's 2 left are too few for 8: it is served as before */
  broker_client late;
  client(&late, 6, 106, 0);
  broker_lease_streamed(&br, &late, 1, 8, HOG_AT + 1 * MS, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
  ck_assert_uint_eq(broker_refill(&br, HOG_AT + 1 * MS), 8); /* the limit leaves room for 16 */
}
END_TEST

/* Idle caches too small for the lease: as before, what the limit allows is
 * created and the rest asked of everyone with idle cache. */
START_TEST(test_idle_cache_too_small) {
  broker_client holder, asker;
  idle_hog(&holder, 300);
  holder.idle = 100 * cs; /* the rest of its cache is in chunks partly used */
  client(&asker, 2, 102, 0);
  broker_decision d;
  broker_lease_streamed(&br, &asker, 5, 250, HOG_AT, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
  ck_assert_uint_eq(broker_refill(&br, HOG_AT), 50);
  broker_review(&br, &asker, HOG_AT, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 200 * cs);
  ck_assert_uint_eq(holder.reclaim_ask, 200 * cs);
}
END_TEST

/* Fairness: a client that allocates is not drained before the lake creates.
 * Allocating is a lease, or a usage report that counts allocations since
 * the last one; BROKER_IDLE_MS after it, with reports that count none, it
 * is idle. */
START_TEST(test_allocating_client_is_not_idle) {
  broker_client holder, asker;
  idle_hog(&holder, 300);
  client(&asker, 2, 102, 0);
  broker_allocations(&br, &holder, 40, HOG_AT - 200 * MS); /* its last allocations, reported 0.2 s ago */
  broker_decision d;
  broker_lease_streamed(&br, &asker, 5, 250, HOG_AT, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
  ck_assert_uint_eq(broker_refill(&br, HOG_AT), 50); /* as before: created, and the rest asked */
  broker_review(&br, &asker, HOG_AT, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 200 * cs);
  /* the same request a second later, its reports counting nothing new: idle */
  lk.creating = 0;
  asker.lease.pending = 0;
  broker_reported(&br, &holder, holder.reclaims_sent);
  broker_allocations(&br, &holder, 40, HOG_AT + 500 * MS);
  uint64_t t = HOG_AT - 200 * MS + BROKER_IDLE_MS * MS;
  broker_lease_streamed(&br, &asker, 6, 250, t - 1, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 0); /* 1 ns short of BROKER_IDLE_MS */
  asker.lease.pending = 0;
  broker_lease_streamed(&br, &asker, 7, 250, t, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 250 * cs);
  ck_assert_int_eq(d.from_idle, 1);
  ck_assert_uint_eq(broker_refill(&br, t), 0);
  /* a client waiting for a lease of its own is not idle, whatever its reports */
  asker.lease.pending = 0;
  broker_reported(&br, &holder, holder.reclaims_sent);
  holder.lease.pending = 1;
  broker_lease_streamed(&br, &asker, 8, 250, t + 10000 * MS, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 0);
  holder.lease.pending = 0;
}
END_TEST

/* The idle client gives less than it said (its streams still used part of
 * it): once it answered, the lease goes on as any other: what the limit
 * allows is created, the rest asked of everyone, and it is served. */
START_TEST(test_idle_client_answers_short) {
  broker_client holder, asker;
  idle_hog(&holder, 300);
  client(&asker, 2, 102, 0);
  broker_decision d;
  broker_lease_streamed(&br, &asker, 5, 250, HOG_AT, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 250 * cs);
  give_back(&holder, 100);
  ck_assert_uint_eq(serve_all(&asker), 100);
  broker_review(&br, &asker, HOG_AT + 5 * MS, &d);
  ck_assert_int_eq(d.idle_short, 0); /* not answered yet: it waits for holder */
  ck_assert_uint_eq(broker_refill(&br, HOG_AT + 5 * MS), 0);
  holder.cached = holder.idle = 0;
  broker_reported(&br, &holder, holder.reclaims_sent); /* the answer: that was all */
  broker_review(&br, &asker, HOG_AT + 6 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_int_eq(d.idle_short, 1);
  ck_assert_uint_eq(d.reclaim_bytes, 100 * cs); /* beyond the 50 the limit allows: asked of everyone */
  ck_assert_uint_eq(broker_refill(&br, HOG_AT + 6 * MS), 50);
  lk.creating = 0;
  add_chunks(50);
  ck_assert_uint_eq(serve_all(&asker), 50);
  give_back(&holder, 100); /* its streams are done with the rest */
  ck_assert_uint_eq(serve_all(&asker), 100);
  ck_assert_int_eq(asker.lease.pending, 0);
  ck_assert_uint_eq(asker.leased_chunks, 250);
}
END_TEST

/* The idle client does not answer (stopped, its keeper stuck): after
 * BROKER_IDLE_STALL_MS without chunks, at most half the lease wait, the
 * lease creates what the limit allows and is served before its deadline. */
START_TEST(test_idle_client_stalls) {
  broker_client holder, asker;
  idle_hog(&holder, 600);
  client(&asker, 2, 102, 0);
  broker_decision d;
  broker_lease_streamed(&br, &asker, 5, 250, HOG_AT, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 250 * cs);
  broker_review(&br, &asker, HOG_AT + BROKER_IDLE_STALL_MS * MS - 1, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_int_eq(d.idle_short, 0);
  ck_assert_uint_eq(broker_refill(&br, HOG_AT + BROKER_IDLE_STALL_MS * MS - 1), 0);
  broker_review(&br, &asker, HOG_AT + BROKER_IDLE_STALL_MS * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_int_eq(d.idle_short, 1);
  ck_assert_uint_eq(d.reclaim_bytes, 0); /* the limit covers it all: nobody else asked */
  ck_assert_uint_eq(broker_refill(&br, HOG_AT + BROKER_IDLE_STALL_MS * MS), 250);
  lk.creating = 0;
  add_chunks(250);
  ck_assert_uint_eq(serve_all(&asker), 250);
  ck_assert_int_eq(asker.lease.pending, 0);
  /* a short lease wait: it stops waiting for the idle clients at half of it */
  br.lease_wait_ns = 200 * MS;
  broker_reported(&br, &holder, holder.reclaims_sent); /* holder woke up, gave nothing: asked again, it stalls again */
  broker_client c2;
  client(&c2, 3, 103, 0);
  broker_lease_streamed(&br, &c2, 6, 100, 2 * HOG_AT, &d);
  ck_assert_uint_eq(d.reclaim_bytes, 100 * cs);
  broker_review(&br, &c2, 2 * HOG_AT + 99 * MS, &d);
  ck_assert_int_eq(d.idle_short, 0);
  broker_review(&br, &c2, 2 * HOG_AT + 100 * MS, &d);
  ck_assert_int_eq(d.idle_short, 1);
  ck_assert_uint_eq(broker_refill(&br, 2 * HOG_AT + 100 * MS), 100);
}
END_TEST

/* --lease-wait 0: a lease whose chunks are being made under the limit is not
 * refused as "full" at its deadline (the broker's next pass came before the
 * creators: 1-3 of 20 first leases on an idle daemon were refused so); one
 * whose chunks do not come says it timed out waiting for them, and one whose
 * creation failed says so. */
START_TEST(test_lease_wait_zero_waits_for_creation) {
  br.lease_wait_ns = 0;
  broker_client a;
  client(&a, 1, 101, 0);
  broker_decision d;
  broker_lease(&br, &a, 1, 2, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  ck_assert_uint_eq(broker_refill(&br, 0), 2);
  broker_review(&br, &a, 0, &d); /* the deadline is now: chunks are coming */
  ck_assert_msg(d.verdict == BROKER_WAIT, "refused while its chunks were being made: %s", d.message);
  broker_review(&br, &a, BROKER_CREATE_WAIT_MS * MS - 1, &d);
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  lk.creating = 0;
  add_chunks(2); /* made: served */
  ck_assert_int_eq(broker_serve_free(&br, &a, &d), 1);
  ck_assert_uint_eq(d.n, 2);
  ck_assert_uint_eq(counters.leases_refused, 0);
  /* chunks that never come: refused once the creation wait passed, saying so */
  broker_lease(&br, &a, 2, 1, 0, 10 * MS, &d);
  ck_assert_uint_eq(broker_refill(&br, 10 * MS), 1);
  broker_review(&br, &a, 10 * MS + BROKER_CREATE_WAIT_MS * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_msg(strstr(d.message, "timed out after 10000 ms waiting for the 1 chunk(s) being made"), "%s", d.message);
  ck_assert_ptr_null(strstr(d.message, "full"));
  /* creation failed (device full?): said, not "the lake is full" */
  lk.creating = 0;
  broker_lease(&br, &a, 3, 1, 0, 20 * MS, &d);
  broker_creation_failed(&br, 20 * MS);
  broker_review(&br, &a, 20 * MS, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_msg(strstr(d.message, "the device could not make more chunks"), "%s", d.message);
}
END_TEST

/* An idle lake gives its free chunks back to the driver past its reserve once
 * nothing was leased or given back for idle_release_ns (30 s after its last
 * client left it held 2.25 GiB); a lease or a return starts the wait again;
 * what keeps the lake at its preallocation stays; the prefetch waits for the
 * next lease. */
START_TEST(test_idle_release) {
  br.idle_release_ns = 1000 * MS;
  br.idle_reserve_chunks = 2;
  br.prefetch_chunks = 4;
  broker_client a;
  client(&a, 1, 101, 0);
  add_chunks(8);
  broker_decision d;
  broker_lease(&br, &a, 1, 3, 0, 0, &d);
  ck_assert_uint_eq(d.n, 3);
  ck_assert_uint_eq(broker_idle_release(&br, 0), 0); /* the idle time starts */
  ck_assert_uint_eq(broker_idle_release(&br, 999 * MS), 0);
  broker_returned(&br, &a, d.idx, 1); /* a return: it starts again */
  ck_assert_uint_eq(broker_idle_release(&br, 999 * MS), 0);
  ck_assert_uint_eq(broker_idle_release(&br, 1998 * MS), 0);
  ck_assert_uint_eq(lk.nfree, 6);
  ck_assert_uint_eq(broker_idle_release(&br, 1999 * MS), 4); /* 6 free, 2 kept */
  ck_assert_uint_eq(lk.nfree, 2);
  ck_assert_uint_eq(lk.total, 4);
  ck_assert_uint_eq(counters.chunks_released_idle, 4);
  ck_assert_uint_eq(broker_refill(&br, 2000 * MS), 0); /* the prefetch is not made again while idle */
  ck_assert_uint_eq(broker_idle_release(&br, 5000 * MS), 0);
  /* preallocated: the lake stays at that size (2 leased + 6 free), however long idle */
  br.preallocate_chunks = 8;
  br.prefetch_suspended = 0;
  ck_assert_uint_eq(broker_refill(&br, 5000 * MS), 4);
  lk.creating = 0;
  add_chunks(4);
  ck_assert_uint_eq(broker_idle_release(&br, 9000 * MS), 0);
  ck_assert_uint_eq(lk.total, 8);
  /* 0: never */
  br.preallocate_chunks = 0;
  br.idle_release_ns = 0;
  ck_assert_uint_eq(broker_idle_release(&br, 100000 * MS), 0);
  br.idle_release_ns = 1000 * MS;
  ck_assert_uint_eq(broker_idle_release(&br, 100000 * MS), 4);
}
END_TEST

/* A cgroup quota of a Kubernetes pod's path (150-200 bytes) holds: paths of 128 bytes and more were
 * stored empty, and their quota never applied (32 MiB leased against a 4 MiB quota). */
START_TEST(test_quota_long_cgroup_path) {
  const char *pod =
      "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3f1c5b2a_7d4e_4c1b_9a8f_2e6d0c4b7a19.slice/"
      "cri-containerd-8b0f6e2d4c1a9e7f5b3d1c0a8e6f4d2b0c9e7a5f3d1b8c6e4a2f0d9b7c5e3a1f.scope";
  ck_assert_int_gt(strlen(pod), 128);
  broker_client a;
  client(&a, 1, 42, 0);
  snprintf(a.cgroup, sizeof a.cgroup, "%s", pod);
  ck_assert_str_eq(a.cgroup, pod);
  add_chunks(10);
  ck_assert_int_eq(lake_set_quota_cgroup(&lk, pod, 2 * cs), 0);
  broker_decision d;
  broker_lease(&br, &a, 1, 3, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 2); /* the quota's 2, not 3 */
  broker_lease(&br, &a, 2, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_int_eq(d.code, GML_EQUOTA);
  ck_assert_ptr_nonnull(strstr(d.why, "cgroup /kubepods.slice/"));
}
END_TEST

/* What a client could get now (gmli_broker_mem_info): the limit's room, bounded by the device's free
 * memory; a promise for a moment that makes another asker wait, settled by the told client's lease
 * or its expiry; others' pending leases taken off; an idle client of the asker's uid counts, of
 * another uid not; a quota said apart. */
START_TEST(test_mem_info_answers) {
  broker_client a, b, o;
  client(&a, 1, 100, 0);
  client(&b, 2, 200, 0);
  gmli_mem_answer m;
  uint64_t big = 1ull << 40;
  gmli_broker_mem_info(&br, &a, 10 * MS, big, &m);
  ck_assert_uint_eq(m.limit_bytes, 10 * cs);
  ck_assert_uint_eq(m.free_bytes, 10 * cs); /* nothing made yet: all of it may be */
  ck_assert_uint_eq(m.wait_ms, 0);
  ck_assert_uint_eq(m.quota_bytes, 0);
  gmli_broker_mem_info(&br, &b, 11 * MS, big, &m); /* a was told it a moment ago */
  ck_assert_uint_gt(m.wait_ms, 0);
  ck_assert_uint_le(m.wait_ms, MEMINFO_PROMISE_MS);
  ck_assert_uint_eq(b.promise_ns, 0);                                            /* b promised nothing */
  gmli_broker_mem_info(&br, &b, 10 * MS + MEMINFO_PROMISE_MS * MS + 1, big, &m); /* a's promise ran out */
  ck_assert_uint_eq(m.wait_ms, 0);
  /* a asks again, then leases 6: b waits no more, and is told what is left */
  gmli_broker_mem_info(&br, &a, 5000 * MS, big, &m);
  gmli_broker_mem_info(&br, &b, 5001 * MS, big, &m);
  ck_assert_uint_gt(m.wait_ms, 0);
  broker_decision d;
  broker_lease(&br, &a, 1, 6, 0, 5002 * MS, &d); /* nothing made yet: it waits for chunks */
  ck_assert_int_eq(d.verdict, BROKER_WAIT);
  gmli_broker_mem_info(&br, &b, 5003 * MS, big, &m);
  ck_assert_uint_eq(m.wait_ms, 0);
  ck_assert_uint_eq(m.free_bytes, 4 * cs); /* a's pending 6 taken off */
  add_chunks(6);
  ck_assert_int_eq(broker_serve_free(&br, &a, &d), 1);
  ck_assert_uint_eq(d.n, 6);
  gmli_broker_mem_info(&br, &b, 5004 * MS, big, &m);
  ck_assert_uint_eq(m.free_bytes, 4 * cs);
  gmli_broker_mem_info(&br, &b, 5005 * MS, 3 * cs, &m); /* the device has room for 3 new chunks only */
  ck_assert_uint_eq(m.free_bytes, 3 * cs);
  /* a goes idle with 5 whole chunks cached: b's uid gets them; another uid's client does not */
  a.cached = a.idle = 5 * cs, a.allocated = cs, a.active_ns = 5002 * MS;
  gmli_broker_mem_info(&br, &b, 9000 * MS, big, &m);
  ck_assert_uint_eq(m.free_bytes, 9 * cs);
  client(&o, 3, 300, 0);
  o.uid = 2000;
  gmli_broker_mem_info(&br, &o, 9001 * MS, big, &m);
  ck_assert_uint_eq(m.wait_ms, MEMINFO_PROMISE_MS - 1); /* b's answer a moment ago holds */
  gmli_broker_mem_info(&br, &o, 9000 * MS + MEMINFO_PROMISE_MS * MS, big, &m);
  ck_assert_uint_eq(m.wait_ms, 0);
  ck_assert_uint_eq(m.free_bytes, 4 * cs);
  /* a quota of b's process: said apart, with its room */
  ck_assert_int_eq(lake_set_quota(&lk, LAKE_QUOTA_PID, 200, 2 * cs), 0);
  gmli_broker_mem_info(&br, &b, 20000 * MS, big, &m);
  ck_assert_uint_eq(m.quota_bytes, 2 * cs);
  ck_assert_uint_eq(m.quota_room_bytes, 2 * cs);
  /* --meminfo-promise-ms: a longer promise holds longer; 0 promises nothing */
  br.promise_ns = 60000 * MS;
  gmli_broker_mem_info(&br, &a, 30000 * MS, big, &m);
  gmli_broker_mem_info(&br, &b, 30000 * MS + MEMINFO_PROMISE_MS * MS + 1, big, &m);
  ck_assert_uint_gt(m.wait_ms, MEMINFO_PROMISE_MS);
  ck_assert_uint_le(m.wait_ms, 60000);
  br.promise_ns = 0;
  gmli_broker_mem_info(&br, &a, 200000 * MS, big, &m);
  ck_assert_uint_eq(a.promise_ns, 0);
  gmli_broker_mem_info(&br, &b, 200000 * MS + 1, big, &m);
  ck_assert_uint_eq(m.wait_ms, 0);
}
END_TEST

/* A cgroup v1 quota ("freezer:/slurm/uid_0/job_7", as Slurm's proctrack/cgroup tracks a job on a v1 host) binds the
 * clients whose freezer line is that cgroup or below it, not a sibling whose name it prefixes nor another
 * hierarchy's line; a named quota keeps its peak as chunks come and go, and a refusal names it. */
START_TEST(test_quota_cgroup_v1_named_peak) {
  broker_client a, b, sib, other;
  client(&a, 1, 42, 0);
  client(&b, 2, 43, 0);
  client(&sib, 3, 44, 0);
  client(&other, 4, 45, 0);
  snprintf(a.cgroup_v1, sizeof a.cgroup_v1, "cpu,cpuacct:/\nfreezer:/slurm/uid_0/job_7/step_0\nname=systemd:/\n");
  snprintf(b.cgroup_v1, sizeof b.cgroup_v1, "freezer:/slurm/uid_0/job_7/step_batch\n");
  snprintf(sib.cgroup_v1, sizeof sib.cgroup_v1, "freezer:/slurm/uid_0/job_70/step_0\n");
  snprintf(other.cgroup_v1, sizeof other.cgroup_v1, "cpu,cpuacct:/slurm/uid_0/job_7\nfreezer:/\n");
  snprintf(a.cgroup, sizeof a.cgroup, "/"); /* a hybrid host's v2 line says nothing of the job */
  add_chunks(10);
  ck_assert_int_eq(lake_set_quota_cgroup(&lk, "freezer:/slurm/uid_0/job_7", 3 * cs), 0);
  long i = gmli_lake_quota_of(&lk, LAKE_QUOTA_CGROUP, 0, "freezer:/slurm/uid_0/job_7");
  ck_assert_int_ge(i, 0);
  gmli_lake_name_quota(&lk, (size_t)i, "slurm-job-7", 0);
  ck_assert_int_eq(gmli_lake_quota_named(&lk, "slurm-job-7"), i);
  broker_decision d;
  broker_lease(&br, &a, 1, 2, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(lk.quotas[i].peak_chunks, 2);
  broker_returned(&br, &a, d.idx, 1); /* 1 held, the peak stays */
  ck_assert_uint_eq(gmli_broker_quota_held(&br, (size_t)i), 1);
  broker_lease(&br, &b, 2, 5, 0, 0, &d); /* b is in the job too: 2 more, the quota's room */
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 2);
  ck_assert_uint_eq(lk.quotas[i].peak_chunks, 3);
  broker_lease(&br, &a, 3, 1, 0, 0, &d);
  ck_assert_int_eq(d.verdict, BROKER_REFUSE);
  ck_assert_int_eq(d.code, GML_EQUOTA);
  ck_assert_msg(strstr(d.why, "slurm-job-7 of cgroup freezer:/slurm/uid_0/job_7"), "why: %s", d.why);
  broker_lease(&br, &sib, 4, 3, 0, 0, &d); /* job_70 is not below job_7 */
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 3);
  broker_lease(&br, &other, 5, 2, 0, 0, &d); /* job_7 in another hierarchy than the quota's */
  ck_assert_int_eq(d.verdict, BROKER_SERVE);
  ck_assert_uint_eq(d.n, 2);
  ck_assert_uint_eq(lk.quotas[i].peak_chunks, 3);
  /* named again the same: the peak kept; another quota taking the name: it moves, the first is nameless */
  gmli_lake_name_quota(&lk, (size_t)i, "slurm-job-7", 0);
  ck_assert_uint_eq(lk.quotas[i].peak_chunks, 3);
  ck_assert_int_eq(lake_set_quota(&lk, 1, 1000, 8 * cs), 0);
  long u = gmli_lake_quota_of(&lk, LAKE_QUOTA_UID, 1000, "");
  gmli_lake_name_quota(&lk, (size_t)u, "slurm-job-7", 0);
  ck_assert_int_eq(gmli_lake_quota_named(&lk, "slurm-job-7"), u);
  ck_assert_str_eq(lk.quotas[i].group, "");
  gmli_lake_remove_quota(&lk, (size_t)u);
  ck_assert_int_eq(gmli_lake_quota_named(&lk, "slurm-job-7"), -1);
}
END_TEST

/* Holders as gmlakectl quota and the config take them: a v1 hierarchy's cgroup, a named quota. */
START_TEST(test_quota_holders_parse) {
  int kind;
  uint32_t key;
  const char *cg;
  ck_assert_int_eq(gmli_parse_quota_holder("cgroup:freezer:/slurm/uid_0/job_7", &kind, &key, &cg), 0);
  ck_assert_int_eq(kind, GML_QUOTA_CGROUP);
  ck_assert_str_eq(cg, "freezer:/slurm/uid_0/job_7");
  ck_assert_int_eq(gmli_parse_quota_holder("cgroup:name=systemd:/user.slice", &kind, &key, &cg), 0);
  ck_assert_int_eq(gmli_parse_quota_holder("group:slurm-job-7", &kind, &key, &cg), 0);
  ck_assert_int_eq(kind, GML_QUOTA_GROUP);
  ck_assert_str_eq(cg, "slurm-job-7");
  const char *bad[] = {"cgroup:freezer:slurm",
                       "cgroup::/x",
                       "cgroup:free zer:/x",
                       "cgroup:freezer:/x/../y",
                       "group:",
                       "group:a b",
                       "group:job/7",
                       "group:0123456789012345678901234567890123456789012345678901234567890123"};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
    ck_assert_msg(gmli_parse_quota_holder(bad[k], &kind, &key, &cg) == GML_EINVAL, "%s taken", bad[k]);
  ck_assert(gmli_quota_group_ok("k8s-ml.trainer_0"));
}
END_TEST

Suite *broker_suite(void) {
  Suite *s = suite_create("broker");
  TCase *tc = tcase_create("broker");
  tcase_add_checked_fixture(tc, setup, lake_teardown);
  tcase_add_test(tc, test_serve_now);
  tcase_add_test(tc, test_quota);
  tcase_add_test(tc, test_quota_per_process_and_cgroup);
  tcase_add_test(tc, test_quota_counts_published_shares);
  tcase_add_test(tc, test_adopt_room_per_user);
  tcase_add_test(tc, test_trim_over_limit);
  tcase_add_test(tc, test_out_of_memory_names_the_holders);
  tcase_add_test(tc, test_out_of_memory_hides_other_users);
  tcase_add_test(tc, test_out_of_memory_lists_the_most_leased);
  tcase_add_test(tc, test_out_of_memory_pid_reused_by_another_user);
  tcase_add_test(tc, test_wait_reclaim_refuse);
  tcase_add_test(tc, test_reclaimed_chunks_serve_the_waiting_lease);
  tcase_add_test(tc, test_full_lake_nobody_to_ask);
  tcase_add_test(tc, test_claimed_cache_without_chunks_not_asked);
  tcase_add_test(tc, test_refused_once_all_asked_answered);
  tcase_add_test(tc, test_wait_for_chunks_coming);
  tcase_add_test(tc, test_lease_wait_zero_waits_for_creation);
  tcase_add_test(tc, test_idle_release);
  tcase_add_test(tc, test_quota_long_cgroup_path);
  tcase_add_test(tc, test_quota_cgroup_v1_named_peak);
  tcase_add_test(tc, test_quota_holders_parse);
  tcase_add_test(tc, test_optional_leases);
  tcase_add_test(tc, test_closing_client_is_not_served);
  tcase_add_test(tc, test_refill);
  tcase_add_test(tc, test_refill_after_trim_and_preallocation);
  tcase_add_test(tc, test_set_limit);
  tcase_add_test(tc, test_trust_between_uids);
  tcase_add_test(tc, test_streamed_lease_in_replies);
  tcase_add_test(tc, test_streamed_lease_asks_the_whole_shortfall);
  tcase_add_test(tc, test_streamed_lease_wait_and_refusal);
  tcase_add_test(tc, test_idle_cache_covers_the_lease);
  tcase_add_test(tc, test_idle_cache_asked_beyond_free_only);
  tcase_add_test(tc, test_idle_cache_before_making_room);
  tcase_add_test(tc, test_idle_cache_covers_a_plain_lease);
  tcase_add_test(tc, test_idle_clients_share_the_shortfall);
  tcase_add_test(tc, test_idle_cache_too_small);
  tcase_add_test(tc, test_allocating_client_is_not_idle);
  tcase_add_test(tc, test_idle_client_answers_short);
  tcase_add_test(tc, test_idle_client_stalls);
  tcase_add_test(tc, test_mem_info_answers);
  suite_add_tcase(s, tc);
  return s;
}
