/* gen_corpus.c: writes the fuzz targets' seed corpora (small valid inputs,
 * plus a few typical bad ones) into tests/fuzz/corpus/<target>/.
 * Built and run by `make fuzz-corpus`; the output is committed. */
#include "gmlake.pb-c.h"
#include "wire.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *root;

typedef struct buf {
  uint8_t b[1 << 16];
  size_t n;
} buf;

static void put(buf *o, const void *p, size_t n) {
  if (o->n + n > sizeof o->b) abort();
  memcpy(o->b + o->n, p, n);
  o->n += n;
}

static void save(const char *target, const char *name, const buf *o) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(o->b, 1, o->n, f) != o->n || fclose(f)) {
    perror(path);
    exit(1);
  }
}

static void frame(buf *o, Gmlake__Envelope *e) {
  uint8_t *f;
  size_t n;
  if (gmli_wire_encode(e, &f, &n)) abort();
  put(o, f, n);
  free(f);
}

/* client -> daemon frames */
static void hello(buf *o, uint64_t seq) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__Hello h = GMLAKE__HELLO__INIT;
  h.protocol_version = GML_PROTOCOL_VERSION;
  h.name = "python3";
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_HELLO, e.hello = &h;
  frame(o, &e);
}
static void lease(buf *o, uint64_t seq, uint32_t count, int optional) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__LeaseRequest l = GMLAKE__LEASE_REQUEST__INIT;
  l.count = count, l.optional = optional;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_LEASE, e.lease = &l;
  frame(o, &e);
}
static void ret(buf *o, uint64_t seq, size_t n) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReturnRequest r = GMLAKE__RETURN_REQUEST__INIT;
  uint64_t ids[4] = {1ull << 32 | 1, 1ull << 32 | 2, 3, 4};
  r.n_chunk_ids = n, r.chunk_ids = ids;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_RET, e.ret = &r;
  frame(o, &e);
}
static void usage(buf *o, uint64_t seq) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  u.allocated = 3 << 20, u.cached = 1 << 20, u.stitched = 2 << 20, u.largest_free = 1 << 20, u.alloc_count = 7;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_USAGE, e.usage = &u;
  frame(o, &e);
}

/* what a session does past the wire checks (fuzz_session: first byte's bit 0 sends fds with the
 * first piece; the lake's chunks are (1 << 32) | 1..8, a lease takes the highest free first) */
static void hello_adopting(buf *o, uint64_t seq) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__Hello h = GMLAKE__HELLO__INIT;
  h.protocol_version = GML_PROTOCOL_VERSION;
  h.name = "python3";
  h.adopting = 1;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_HELLO, e.hello = &h;
  frame(o, &e);
}
static void ret_ids(buf *o, uint64_t seq, uint64_t *ids, size_t n) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReturnRequest r = GMLAKE__RETURN_REQUEST__INIT;
  r.n_chunk_ids = n, r.chunk_ids = ids;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_RET, e.ret = &r;
  frame(o, &e);
}
static void share(buf *o, uint64_t seq, const char *key, uint64_t *ids, size_t n, int any) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__ShareRequest q = GMLAKE__SHARE_REQUEST__INIT;
  uint32_t allow[2] = {1001, 1002};
  q.key = (char *)key, q.n_chunk_ids = n, q.chunk_ids = ids, q.size = (uint64_t)n * (2 << 20) - 7;
  q.content_hash.data = (uint8_t *)"0123456789abcdef", q.content_hash.len = 16;
  q.meta.data = (uint8_t *)"layout", q.meta.len = 6;
  q.allow_uids = allow, q.n_allow_uids = 2, q.allow_any_uid = any;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_SHARE, e.share = &q;
  frame(o, &e);
}
static void attach(buf *o, uint64_t seq, const char *key, int by_hash, uint32_t first, uint32_t count) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__AttachRequest a = GMLAKE__ATTACH_REQUEST__INIT;
  a.key = by_hash ? "" : (char *)key;
  if (by_hash) a.content_hash.data = (uint8_t *)"0123456789abcdef", a.content_hash.len = 16;
  a.first = first, a.count = count;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_ATTACH, e.attach = &a;
  frame(o, &e);
}
static void detach(buf *o, uint64_t seq, const char *key) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__DetachRequest q = GMLAKE__DETACH_REQUEST__INIT;
  q.key = (char *)key;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_DETACH, e.detach = &q;
  frame(o, &e);
}
static void adopt(buf *o, uint64_t seq, size_t n) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__AdoptRequest a = GMLAKE__ADOPT_REQUEST__INIT;
  uint64_t old[3] = {7ull << 32 | 3, 7ull << 32 | 9, 7ull << 32 | 11};
  a.n_old_ids = n, a.old_ids = old;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_ADOPT, e.adopt = &a;
  frame(o, &e);
}

static void sessions(void) {
  const char *t = "fuzz_session";
  uint64_t c8 = 1ull << 32 | 8, c7 = 1ull << 32 | 7, c6 = 1ull << 32 | 6, two[2] = {c8, c7}, three[3] = {c8, c7, c6};
  buf o;
  o.n = 0, put(&o, "\x00", 1), hello(&o, 1), lease(&o, 2, 2, 0), usage(&o, 3), ret_ids(&o, 4, two, 2),
  save(t, "lease_return", &o);
  o.n = 0, put(&o, "\x10", 1), hello(&o, 1), lease(&o, 2, 3, 0), share(&o, 3, "weights", three, 3, 0),
  attach(&o, 4, "weights", 0, 0, 0), attach(&o, 5, "weights", 0, 0, 3), attach(&o, 6, NULL, 1, 1, 2),
  detach(&o, 7, "weights"), detach(&o, 8, "weights"), save(t, "share", &o);
  o.n = 0, put(&o, "\x20", 1), hello(&o, 1), lease(&o, 2, 2, 0), share(&o, 3, "open", two, 2, 1),
  share(&o, 4, "open", two, 2, 1), ret_ids(&o, 5, two, 1), attach(&o, 6, "nothing", 0, 0, 1),
  save(t, "share_twice", &o);
  o.n = 0, put(&o, "\x01", 1), hello_adopting(&o, 1), adopt(&o, 2, 1), usage(&o, 3), lease(&o, 4, 1, 0),
  adopt(&o, 5, 2), save(t, "adopt", &o);
  o.n = 0, put(&o, "\x01", 1), hello_adopting(&o, 1), adopt(&o, 2, 3), usage(&o, 3), save(t, "adopt_three", &o);
  o.n = 0, put(&o, "\x03", 1), hello_adopting(&o, 1), adopt(&o, 2, 1), adopt(&o, 3, 2), usage(&o, 4),
  save(t, "adopt_refused", &o);
  o.n = 0, put(&o, "\x00", 1), hello_adopting(&o, 1), adopt(&o, 2, 1), save(t, "adopt_no_fds", &o);
  o.n = 0, put(&o, "\x01", 1), hello(&o, 1), adopt(&o, 2, 3), save(t, "adopt_no_hello", &o);
}

static void frames(void) {
  const char *t = "fuzz_frame";
  buf o;
  o.n = 0, put(&o, "\x01", 1), hello(&o, 1), save(t, "hello", &o);
  o.n = 0, put(&o, "\x07", 1), hello(&o, 1), lease(&o, 2, 3, 0), usage(&o, 3), ret(&o, 4, 2), save(t, "session", &o);
  o.n = 0, put(&o, "\x42", 1), hello(&o, 1), lease(&o, 2, GML_MAX_LEASE_CHUNKS, 1), ret(&o, 3, 4),
  save(t, "optional", &o);
  o.n = 0, put(&o, "\x00", 1), lease(&o, 1, 1, 0), save(t, "before_hello", &o);
  o.n = 0, put(&o, "\x03", 1), hello(&o, 0), save(t, "seq0", &o);
  o.n = 0, put(&o, "\x05\xff\xff\x01\x00", 5), save(t, "oversize", &o);
}

/* control requests */
static void ctl(const char *name, Gmlake__CtlRequest *r) {
  buf o;
  o.n = gmlake__ctl_request__get_packed_size(r);
  gmlake__ctl_request__pack(r, o.b);
  save("fuzz_control", name, &o);
}

static void control(void) {
  Gmlake__CtlRequest r = GMLAKE__CTL_REQUEST__INIT;
  ctl("empty", &r);
  r.req_case = GMLAKE__CTL_REQUEST__REQ_STATS, r.stats = 1, ctl("stats", &r);
  r.req_case = GMLAKE__CTL_REQUEST__REQ_CLIENTS, r.clients = 1, ctl("clients", &r);
  r.req_case = GMLAKE__CTL_REQUEST__REQ_CHUNKS, r.chunks = 1, ctl("chunks", &r);
  Gmlake__TrimRequest tr = GMLAKE__TRIM_REQUEST__INIT;
  r.req_case = GMLAKE__CTL_REQUEST__REQ_TRIM, r.trim = &tr, ctl("trim", &r);
  tr.client_pid = 1001, ctl("trim_client", &r);
  tr.client_pid = 4242, ctl("trim_nobody", &r);
  r.req_case = GMLAKE__CTL_REQUEST__REQ_SET_LIMIT_BYTES;
  r.set_limit_bytes = 4 << 21, ctl("limit", &r);
  r.set_limit_bytes = 1, ctl("limit_tiny", &r);
  Gmlake__QuotaRequest q = GMLAKE__QUOTA_REQUEST__INIT;
  r.req_case = GMLAKE__CTL_REQUEST__REQ_SET_QUOTA, r.set_quota = &q;
  q.pid = 1000, q.bytes = 4 << 20, ctl("quota_pid", &r);
  q.pid = 0, q.by_uid = 1, q.uid = 1000, q.bytes = 8 << 20, ctl("quota_uid", &r);
}

/* daemon -> client records: [flags][len lo][len hi][frame]; flags & 8: (flags & 7) chunk fds ride along */
static void record(buf *o, int nfds, Gmlake__Envelope *e) {
  buf f;
  f.n = 0;
  frame(&f, e);
  uint8_t h[3] = {(uint8_t)(nfds ? 8 | nfds : 0), (uint8_t)f.n, (uint8_t)(f.n >> 8)};
  put(o, h, 3);
  put(o, f.b, f.n);
}
static void hello_reply(buf *o) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__HelloReply h = GMLAKE__HELLO_REPLY__INIT;
  h.protocol_version = GML_PROTOCOL_VERSION, h.chunk_size = 2 << 20, h.backend = "host", h.device = 0, h.client_id = 1;
  e.seq = 1, e.msg_case = GMLAKE__ENVELOPE__MSG_HELLO_REPLY, e.hello_reply = &h;
  record(o, 0, &e);
}
static void lease_reply(buf *o, uint64_t seq, int n) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__LeaseReply l = GMLAKE__LEASE_REPLY__INIT;
  uint64_t ids[7];
  for (int i = 0; i < n; i++) ids[i] = 1ull << 32 | (uint64_t)(seq * 8 + (uint64_t)i);
  l.n_chunk_ids = (size_t)n, l.chunk_ids = ids;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_LEASE_REPLY, e.lease_reply = &l;
  record(o, n, &e);
}
static void error_reply(buf *o, uint64_t seq, int code) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__Error er = GMLAKE__ERROR__INIT;
  er.code = code, er.message = "out of memory: the lake is full";
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_ERROR, e.error = &er;
  record(o, 0, &e);
}
static void ret_reply(buf *o, uint64_t seq, uint32_t n) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReturnReply r = GMLAKE__RETURN_REPLY__INIT;
  r.returned = n;
  e.seq = seq, e.msg_case = GMLAKE__ENVELOPE__MSG_RET_REPLY, e.ret_reply = &r;
  record(o, 0, &e);
}
static void reclaim(buf *o) {
  Gmlake__Envelope e = GMLAKE__ENVELOPE__INIT;
  Gmlake__ReclaimRequest r = GMLAKE__RECLAIM_REQUEST__INIT;
  r.bytes = 4 << 20;
  e.seq = 0, e.msg_case = GMLAKE__ENVELOPE__MSG_RECLAIM, e.reclaim = &r;
  record(o, 0, &e);
}

static void replies(void) {
  const char *t = "fuzz_reply";
  buf o;
  o.n = 0, hello_reply(&o), save(t, "hello", &o);
  o.n = 0, hello_reply(&o), error_reply(&o, 2, -1), save(t, "refused", &o);
  o.n = 0, hello_reply(&o);
  for (uint64_t s = 2; s < 8; s++) lease_reply(&o, s, (int)(s % 3) + 1);
  save(t, "leases", &o);
  o.n = 0, hello_reply(&o), reclaim(&o), lease_reply(&o, 2, 1), lease_reply(&o, 3, 2), ret_reply(&o, 4, 1),
  ret_reply(&o, 5, 2);
  save(t, "reclaim_return", &o);
  o.n = 0, hello_reply(&o), lease_reply(&o, 3, 1), save(t, "wrong_seq", &o);
}

int main(int argc, char **argv) {
  root = argc > 1 ? argv[1] : "tests/fuzz/corpus";
  frames();
  sessions();
  control();
  replies();
  return 0;
}
