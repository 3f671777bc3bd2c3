/* client_priv.h: the client handle as the library's parts see it, and the
 * map of their internal functions, grouped under the file that defines each
 * (client.c the handle's base; open.c puts the parts together; link.c,
 * lease.c, report.c, keeper.c, hello.c and adopt.c the daemon conversation;
 * the allocator's chunk sources are lease.c's and open.c's; growable.c maps
 * chunks from the same source into ranges of their own; track.c, streams.c
 * and pools.c keep what a framework layer needs on top of the allocator:
 * per-allocation records, PyTorch's counters, history, recorded streams,
 * private pools, on records.c and release.c beneath them; checkpoint.c their
 * checkpoints). Not installed. */
#ifndef GML_CLIENT_PRIV_H
#define GML_CLIENT_PRIV_H
#include "alloc.h"
#include "gmlake.h"
#include "options.h"
#include "wire.h"
#include <pthread.h>
#include <stdint.h>

#define REPORT_INTERVAL_NS (100 * 1000 * 1000ull)
#define GML_USAGE_KEYS 32 /* the most numbers of a usage report compared for a change (report.c usage_key) */

/* A growable range (growable.c); share.c publishes or attaches whole ones. */
enum { GML_GROW_OWN = 0, GML_GROW_PUBLISHED = 1, GML_GROW_ATTACHED = 2 };
struct gml_growable {
  gml_client *c;
  struct gml_growable *next, *prev;
  uintptr_t base;
  size_t size, cs;
  size_t nslots, nmapped;
  gml_phys *phys; /* per slot, valid where mapped[] */
  uint64_t *ids;
  uint8_t *mapped;
  int shared;    /* GML_GROW_*: a shared range is read-only; its chunks are the share's */
  char key[144]; /* the share's key when shared (NAME@UID for another user's) */
  int broken;    /* a failed dedup could not put all its own chunks back (share.c): only destroy works */
  /* what the publisher asked (share.c), to publish again to a restarted daemon */
  struct gml_share_opts_kept {
    size_t size;
    uint8_t hash[64];
    size_t hash_len;
    uint8_t *meta;
    size_t meta_len;
    uint32_t *allow;
    size_t n_allow;
    int any;
  } pub;
  int lost; /* GML_SHARE_*: where the share stands with a daemon that restarted (share.c) */
};
/* A shared range after a daemon restart (keeper.c hands its chunks over, share.c
 * restores): PUBLISH, its chunks were adopted and it is to be published again;
 * REGISTER, attached: to be counted a mapper again once its share is back;
 * OWNED, its publication failed: its chunks are plainly leased to us. */
enum { GML_SHARE_OK = 0, GML_SHARE_PUBLISH = 1, GML_SHARE_REGISTER = 2, GML_SHARE_OWNED = 3, GML_SHARE_ORPHAN = 4 };
/* ORPHAN: attached, but its share did not come back (its publisher gone, or
 * another content under its key): we map it on, the daemon does not count it. */
#define GML_SHARE_REGISTER_FOR_NS (60 * 1000000000ull) /* how long an attached range waits for its share to come back */

#define GML_REC_STREAMS 4 /* recorded streams kept per allocation; more: the free waits for the device */

/* One allocation the client knows of: live, waiting for recorded streams,
 * or free in a private pool. */
typedef struct gml_rec {
  uintptr_t ptr;
  size_t size, requested;
  gml_stream stream;
  uint64_t tag;
  int32_t pool;  /* index into c->pools, -1: none */
  uint8_t state; /* GML_BLOCK_* */
  uint8_t nuses; /* recorded streams in uses[] */
  uint8_t uses_overflow;
  uint8_t nevents;
  uint8_t exported; /* gml_ipc_export handed out a handle to it */
  gml_stream uses[GML_REC_STREAMS];
  uintptr_t events[GML_REC_STREAMS];
  struct gml_rec *hnext;         /* hash chain */
  struct gml_rec *lnext, *lprev; /* pending list, or its pool's free list */
} gml_rec;

typedef struct gml_recmap {
  gml_rec **buckets;
  size_t cap, count;
} gml_recmap;

typedef struct gml_priv_pool {
  gml_pool_id id;
  int used; /* slot in use */
  int use_count;
  int capturing; /* between gml_pool_begin and gml_pool_end */
  gml_stream_filter filter;
  void *filter_ctx;
  size_t live;        /* its allocations (live or pending free) */
  gml_rec *free_head; /* its free blocks */
} gml_priv_pool;

#define GML_MAX_POOLS 64

typedef struct gml_counters {
  gml_stat allocation, active, allocated_bytes, active_bytes, requested_bytes, inactive_split_bytes;
  int64_t retries, ooms, waits;
  uint64_t reserved_peak;                /* bytes; the allocator's own peak is not reset */
  uint64_t base_acquired, base_released; /* chunk counts at the last reset_accumulated */
} gml_counters;

typedef struct gml_trace_ring {
  gml_trace_entry *e;
  size_t cap, head, count;
  uint64_t seq;
} gml_trace_ring;

/* Growable ranges of one client (growable.c). */
typedef struct gml_grow_state {
  pthread_mutex_t lock; /* the list and every range's chunk table */
  struct gml_growable *head;
  uint64_t ranges;                         /* live ranges */
  uint64_t reserved;                       /* bytes of virtual range they reserve */
  uint64_t mapped;                         /* bytes of chunks mapped into them */
  uint64_t chunks_leased, chunks_returned; /* over the client's life */
  uint64_t shared;                         /* bytes of shared chunks mapped (published or attached ranges) */
  int lost_shares;                         /* ranges whose share a restarted daemon does not know yet (GML_SHARE_*) */
  uint64_t restore_ns;                     /* the last attempt to restore them */
  uint64_t lost_since_ns;                  /* when the last hand-over marked them */
  /* How a shared range's chunks go at destroy or close: share.c's, set when it
   * first shares a range (growable.c calls it, never share.c by name). grow.lock held. */
  int (*release_shared)(struct gml_growable *g);
} gml_grow_state;

/* A chunk holder: a part of the client that keeps leased chunks across a
 * reconnection to the daemon (the allocator: open.c; growable ranges:
 * growable.c; shares: share.c), or numbers for the usage report (pause.c).
 * gml_open registers each (gmli_holder_add) in the order their locks nest; the
 * daemon conversation calls them through these ops (keeper.c's reconnection
 * and tick, report.c's usage report), never by name, as nng's transports call
 * a protocol's pipe ops. Any op may be NULL. */
typedef void (*gml_chunk_fn)(void *ctx, gml_phys phys, uint64_t *id);
/* What a reconnection does with the chunks (handover's and reconnected's how):
 * ADOPT, a restarted daemon takes them (fn hands each over, its id replaced in
 * place); PARKED, the same daemon, which closed our connection, keeps them
 * parked under our pid; UNCOUNTED, a restarted daemon takes none (fn marks
 * each id local: ours, counted by no lake, until we exit). */
enum { GML_HANDOVER_ADOPT = 0, GML_HANDOVER_PARKED = 1, GML_HANDOVER_UNCOUNTED = 2 };
typedef struct gml_holder_ops {
  /* lock, unlock: around a reconnection's hand-over, lock in registration order
   * (then conn_lock), unlock in reverse, so that no chunk comes or goes
   * meanwhile. They take or drop the holder's own lock and do nothing else. */
  void (*lock)(gml_client *c);
  void (*unlock)(gml_client *c);
  /* handover: fn(ctx, phys, &id) for every chunk it holds that the daemon is
   * to know of; fn may rewrite the id. Every holder's lock and conn_lock are
   * held: it may not take a lock, lease or return chunks, or send a message. */
  void (*handover)(gml_client *c, gml_chunk_fn fn, void *ctx, int how);
  /* reconnected: once a hand-over succeeded and the usage report followed it;
   * on the keeper thread, no lock held: it may talk to the daemon
   * (gmli_client_call), never wait for the keeper. */
  void (*reconnected)(gml_client *c, int how);
  /* tick: the keeper thread, about every REPORT_INTERVAL_NS while connected
   * and idle (work a reconnection left, retried); as reconnected, and returns
   * at once when there is nothing to do. */
  void (*tick)(gml_client *c);
  /* usage: its numbers into st for the usage report (report.c); any thread,
   * no lock of the conversation held: it takes its own lock only, and sends nothing. */
  void (*usage)(gml_client *c, gml_stats *st);
} gml_holder_ops;
#define GML_MAX_HOLDERS 8

/* A chunk id with this bit: the chunk belongs to a session of this daemon
 * instance that it closed while we lived on (keeper.c): it is parked under our
 * pid there and freed when we exit, so we release it locally only, never
 * return it by id; a real restart hands it over like any other. */
#define GML_ID_PARKED (1ull << 63)
/* With GML_ID_PARKED: a restarted daemon took no hand-over of the chunk (past
 * its adopt-window, or refused): no lake counts it; ours until we exit or
 * hand it over to a later daemon (keeper.c). c->uncounted_chunks counts them. */
#define GML_ID_UNCOUNTED (1ull << 62)

struct gml_client {
  gml_allocator alloc;
  gml_backend *be;
  int mode;
  int sock; /* daemon mode */
  pthread_mutex_t conn_lock;
  uint64_t seq;
  uint64_t client_id;
  uint64_t
      daemon_instance; /* HelloReply.instance of the daemon we are (or were last) connected to (0: unknown; keeper.c) */
  uint64_t lease_wait_ns; /* HelloReply.lease_wait_ms: a reply may rightly take this long more (link.c) */
  uint64_t max_stream;    /* HelloReply.max_stream: the most chunks one streamed lease may ask (0: none); set under
                              * conn_lock (atomic: daemon_acquire_stream peeks without it) */
  int64_t clock_skew;     /* our CLOCK_MONOTONIC minus the daemon's, from its hello reply (a time namespace may
                              * set them apart; 0 and unused when the daemon does not say) */
  int clock_known;
  double gc_threshold;        /* PyTorch's garbage_collection_threshold (torchconf.c), set before gc_on */
  int gc_on;                  /* ... set: gml_free_ex collects (atomic) */
  int daemon_mem_info;        /* HelloReply.mem_info: it answers MemInfoRequest (meminfo.c); atomic */
  int lease_refused;          /* a streamed lease ended with this refusal: the next acquire returns it at once */
  int daemon_gone;            /* set by link.c's reader (atomic) */
  struct gml_link *link;      /* link.c: the reader and keeper threads (daemon mode) */
  uint64_t reclaims_served;   /* reclaim requests the keeper served (the usage report says so) */
  uint64_t uncounted_chunks;  /* chunks we hold with GML_ID_UNCOUNTED (atomic; the usage report says so) */
  struct gml_pause *pause;    /* pause.c: what is paused (NULL: nothing); under alloc.lock */
  struct gmli_copier *copier; /* copy.c: the copy engine, made at the first copy (atomic) */
  void *pause_kept;           /* pause.c: GMLAKE_PAUSE_HOST=pinned's page-locked memory, kept for the next pause */
  size_t pause_kept_size;
  /* swapping, as the framework layer carried it out (gml_swap_note, swap_use.c; atomic): bytes copied to host and
   * back, the copies' time, host memory held for it now */
  uint64_t swap_out, swap_in, swap_ns, swap_host;
  uint64_t reclaim_pending; /* bytes the daemon asked back; served outside the allocator lock */
  uint64_t last_report_ns;
  uint64_t last_usage
      [GML_USAGE_KEYS]; /* the numbers of the last usage report (gmli_client_report_changed skips an unchanged one) */
  uint32_t ops_since_check;
  const gml_holder_ops *holders[GML_MAX_HOLDERS]; /* gmli_holder_add's, in registration order */
  int nholders;
  gml_grow_state grow;
  char last_error[1400];
  char lake_error[1024]; /* the daemon's refusal of the last lease (the lake-wide picture), "" after a served one */
  int device;
  char gpu_uuid
      [48]; /* its UUID (gpuname.h): the driver's for device, then the backend's we map with; the hello says it */
  /* what a framework layer needs (track.c, streams.c, pools.c), under
   * track_lock; the allocator's lock nests inside it */
  pthread_mutex_t track_lock;
  gml_recmap recs;
  gml_rec *pending; /* frees waiting for recorded streams */
  size_t npending;
  gml_priv_pool pools[GML_MAX_POOLS];
  int ncapturing;
  gml_counters ctr;
  gml_trace_ring trace;
  struct gml_ipc_map *ipc_maps; /* what gml_ipc_open mapped (ipc.c), under track_lock */
};

/* keeper.c: the daemon connection's threads (see there). start after hello;
 * quiesce (the keeper stops) before the allocator goes; stop at last. */
typedef struct gml_link gml_link;
/* hello.c: a Hello with this process's protocol version, name
 * (/proc/self/comm, into name) and device (c->gpu_uuid, c->device): gml_open's
 * and a reconnection's. */
#define GML_HELLO_NAME 64
void gmli_hello_init(gml_client *c, Gmlake__Hello *h, char name[GML_HELLO_NAME]);
/* gml_open's daemon: c->gpu_uuid found for c->device (opt->backend's), then
 * the sockets of discover.h tried in turn until a daemon of this device says
 * hello (0: connected, c->mode GML_MODE_DAEMON, the daemon's backend and
 * chunk size out). A daemon that refuses us or is wrong and was named
 * (GMLAKE_SOCKET): its error, c->mode GML_MODE_DAEMON, c->last_error saying
 * why. None (another GPU's are passed over): GML_EDAEMON, why saying for each
 * path what was wrong. */
struct gml_options;
int gmli_daemon_find(gml_client *c, const struct gml_options *opt, const gml_backend_opts *bo, char *path, size_t plen,
                     char *why, size_t whylen, char *backend, size_t blen, uint64_t *chunk_size);
/* keeper.c */
int gmli_link_start(gml_client *c, const char *socket_path);
void gmli_link_quiesce(gml_client *c);
void gmli_link_stop(gml_client *c);
/* link.c: send env (its seq set here); with want_reply, wait for the reply
 * (the reader routes it back; before the threads start, read here, the
 * daemon's requests meanwhile noted). conn_lock held. GML_EDAEMON when the
 * connection is gone. */
int gmli_link_call(gml_client *c, Gmlake__Envelope *env, int want_reply, Gmlake__Envelope **reply, int *fds, int *nfds);
/* A message from the daemon and the fds that came with it: every path that
 * receives one ends here (fds set to -1 were taken over). */
void gmli_link_free(Gmlake__Envelope *env, const int *fds, int nfds);
/* The same in steps, for a request with several replies (a streamed lease):
 * send (with want_reply its replies are queued by the reader from now on),
 * take the next reply (waiting; GML_EDAEMON once the connection went and
 * nothing is queued), end (what is still queued is dropped). conn_lock held
 * throughout. */
int gmli_link_send(gml_client *c, Gmlake__Envelope *env, int want_reply, int import);
int gmli_link_next(gml_client *c, Gmlake__Envelope **reply, int *fds, int *nfds);
/* With import set at the send, the reader imports each lease reply's chunks
 * itself: gmli_link_next_chunks gives them (phys/ids, up to
 * GML_MAX_LEASE_CHUNKS), the fds already taken. */
int gmli_link_next_chunks(gml_client *c, Gmlake__Envelope **reply, int *fds, int *nfds, gml_phys *phys, uint64_t *ids,
                          size_t *nchunks);
void gmli_link_end(gml_client *c);
/* adopt.c: a reconnection's messages on its new socket (keeper.c's reconnect; no reader runs on it
 * yet). The adopting hello, sent before reconnect takes its locks: 0, or a failure with why saying
 * what happened. What the reply says of the new connection goes to *said, not to c: reconnect sets
 * it under conn_lock (an allocator call reads max_stream and seq under it meanwhile). */
typedef struct gml_hello_said {
  int same, no_adopt; /* the daemon we were connected to (it closed our connection); one that takes no hand-over */
  uint64_t instance;  /* HelloReply.instance (0: not said) */
  uint64_t client_id, max_stream, mono_ns, lease_wait_ns;
  int mem_info; /* HelloReply.mem_info */
} gml_hello_said;
int gmli_adopt_hello(gml_client *c, int sock, gml_hello_said *said, char *why, size_t whylen);
/* Our chunks handed over in Adopt batches of up to GML_MAX_LEASE_CHUNKS: gmli_adopt_add (an fn of
 * gml_grow_each_chunk and gml_share_handover, ctx a batch) sends each full batch, gmli_adopt_flush the
 * rest; the daemon's ids replace the old ones in place; the first failure stays in rc. */
typedef struct gml_adopt_batch {
  gml_client *c;
  int sock, rc;
  size_t n, total;
  gml_phys phys[GML_MAX_LEASE_CHUNKS];
  uint64_t old[GML_MAX_LEASE_CHUNKS], *idp[GML_MAX_LEASE_CHUNKS];
} gml_adopt_batch;
void gmli_adopt_add(void *ctx, gml_phys phys, uint64_t *id);
int gmli_adopt_flush(gml_adopt_batch *b);
/* keeper.c and link.c, tests only (gml-testclient's `nostream`): lease as from a daemon that streams
 * nothing; how long a reply is waited for. */
void gmli_client_test_nostream(gml_client *c);
void gmli_client_test_reply_timeout(gml_client *c, uint64_t ms);
/* link.c: the daemon's clock against ours, from a hello reply's mono_ns (0: not said). */
void gmli_daemon_clock(gml_client *c, uint64_t daemon_mono_ns);
/* A reclaim request that came after its valid_ms on our clock (we were
 * stopped): its lease is over; answered without giving anything back. */
int gmli_reclaim_moot(gml_client *c, const Gmlake__ReclaimRequest *r);
/* report.c: send the allocator's numbers to the daemon now. */
void gmli_client_report(gml_client *c);
/* From the keeper thread every REPORT_INTERVAL_NS: a report only where the
 * numbers changed since the last one and no other thread is talking to the
 * daemon, so `gmlakectl clients` is never more than that behind an idle
 * process. */
void gmli_client_report_changed(gml_client *c);
/* lease.c: the daemon as the allocator's chunk source (gml_open's). */
gml_chunk_source gmli_lease_source(gml_client *c);
/* Give chunks back that processes of other users may still map (the daemon
 * releases them and never leases them again); our handles and mappings stay. */
void gmli_client_return_tainted(gml_client *c, const uint64_t *ids, size_t n);
/* client.c: a chunk holder's ops, kept (not copied) for the handle's life;
 * registered by gml_open before the daemon's threads start. */
void gmli_holder_add(gml_client *c, const gml_holder_ops *ops);
/* A chunk with GML_ID_UNCOUNTED let go (released locally): one less kept outside the lake. */
void gmli_client_uncounted_gone(gml_client *c);
/* Why a call on c fails, for gml_last_error (the call and the
 * argument that was wrong, so the message is never the last call's); returns rc. */
int gmli_fail(gml_client *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* settings.c: gml_open's options (GML_EINVAL, said on stderr, for a mode,
 * backend or limit that cannot be read) and its virtual range's size. */
struct gml_options;
int gmli_open_options(const gml_open_opts *o, struct gml_options *opt);
size_t gmli_va_size(const struct gml_options *opt, gml_backend *be);
/* A "0, 1" variable's value: def when unset; anything but 0 or 1 warns,
 * naming the variable, the value and def, and gives def. Here, not in
 * common/options.c: that file is below the log, which reads GMLAKE_LOG. */
int gmli_env_flag(gml_env_id id, const char *value, int def);

/* pause.c: the paused bytes and saved content into st; freeing at close. */
void gmli_pause_stats(gml_client *c, gml_stats *st);
/* pause.c: an overlapped pause's group, in bytes of blocks (256 MiB; tests make it small). */
extern size_t gmli_pause_group;
void gmli_pause_destroy(gml_client *c);
extern const gml_holder_ops gmli_pause_holder; /* its numbers in the usage report */

/* report.c: serve a reclaim, report usage now and then (force: now) */
void gmli_client_housekeeping(gml_client *c, int force);

/* PyTorch's counters (gml_counters): a use begins, a use ends. */
static inline void gmli_stat_inc(gml_stat *s, int64_t v) {
  s->current += v;
  s->allocated += v;
  if (s->current > s->peak) s->peak = s->current;
}

static inline void gmli_stat_dec(gml_stat *s, int64_t v) {
  s->current -= v;
  s->freed += v;
}

/* records.c */
int gmli_recmap_put(gml_recmap *m, gml_rec *r);
gml_rec *gmli_recmap_get(gml_recmap *m, uintptr_t ptr, int remove);
void gmli_recmap_destroy(gml_recmap *m);
/* gmli_trace_add without first moving the allocator's segment events in (snapshot.c's) */
void gmli_trace_put(gml_client *c, int action, uintptr_t addr, size_t size, gml_stream stream, int32_t pool,
                    uint64_t tag);
/* snapshot.c: the allocator's segment events into the history; the log on or off; an entry after them */
void gmli_trace_add(gml_client *c, int action, uintptr_t addr, size_t size, gml_stream stream, int32_t pool,
                    uint64_t tag);
void gmli_trace_segments(gml_client *c);
void gmli_trace_segments_enable(gml_client *c, int on);
/* track.c */
void gmli_track_destroy(gml_client *c);
/* release.c: the allocation of rec r is done with (no stream uses it any more): back to its pool or the allocator. */
void gmli_rec_release(gml_client *c, gml_rec *r);
void gmli_pools_put(gml_client *c, gml_rec *r); /* a freed pool block */
/* track.c: r becomes a live allocation of `size` bytes asked on stream (in pool, -1: none): counters, history. */
void gmli_rec_activate(gml_client *c, gml_rec *r, int32_t pool, size_t size, gml_stream stream, uint64_t tag);
/* The live allocation r is freed (tag: the free's, 0 keeps its own): counters, history, then released
 * at once or once its recorded streams have passed (streams.c). */
void gmli_rec_free(gml_client *c, gml_rec *r, uint64_t tag);

/* streams.c: frees that wait for recorded streams. wait: block until all are done. */
int gmli_streams_defer(gml_client *c, gml_rec *r);
void gmli_streams_poll(gml_client *c, int wait);
/* Borrowing: does a free wait for streams that used the block? Then
 * gmli_streams_borrow makes the block's own stream wait for those uses on
 * the device (no CPU wait) and releases such frees, oldest first, until
 * `size` bytes are back; returns the bytes released. */
int gmli_streams_lendable(gml_client *c);
size_t gmli_streams_borrow(gml_client *c, size_t size);

/* pools.c */
int32_t gmli_pools_route(gml_client *c, gml_stream stream); /* pool an allocation on stream goes to, -1: none */
int gmli_pools_find(gml_client *c, gml_pool_id id);         /* index of the pool, -1: none */
gml_rec *gmli_pools_take(gml_client *c, int32_t pool, size_t size, gml_stream stream);
void gmli_pools_unlink(gml_client *c, gml_rec *r); /* take r off its pool's free list */
void gmli_pools_trim(gml_client *c);               /* give back free blocks of pools no one uses */
/* ipc.c */
void gmli_ipc_forget(gml_client *c, uintptr_t ptr); /* the allocation at ptr is freed */
void gmli_ipc_client_gone(gml_client *c);           /* at close: exports dropped, mappings unmapped */

/* growable.c */
/* The ranges as a chunk holder: grow.lock, their own chunks, their numbers. */
extern const gml_holder_ops gmli_grow_holder;
void gmli_grow_init(gml_client *c);
void gmli_grow_destroy_all(gml_client *c); /* at close: unmaps and returns every range's chunks */
void gmli_grow_stats(gml_client *c, gml_stats *st);
/* grow.lock held: unmap slots [s0, s1) and give the chunks back (own ranges) */
int gmli_grow_unmap_slots(gml_growable *g, size_t s0, size_t s1);
/* share.c as a chunk holder: a reconnection hands over (or keeps local) the
 * chunks of published ranges; shared ranges are published or registered again
 * (reconnected, then at most once a second from tick while any is left). */
extern const gml_holder_ops gmli_share_holder;
/* link.c: one request to the daemon and its reply (fds: up to GML_MAX_LEASE_CHUNKS); takes conn_lock. */
struct Gmlake__Envelope;
int gmli_client_call(gml_client *c, struct Gmlake__Envelope *env, struct Gmlake__Envelope **reply, int *fds, int *nfds);
/* torchconf.c: PyTorch's allocator settings on a framework client (gml_device_client), and its
 * garbage_collection_threshold carried out after a free (gml_free_ex, c->gc_threshold set). */
void gmli_torch_conf_apply(gml_client *c);
/* ipc_fds.c: close the fds gml_ipc_export_fds keeps for ptr's allocation (ptr 0: all of c's). */
void gmli_ipc_fds_forget(gml_client *c, uintptr_t ptr);
void gmli_torch_conf_collect(gml_client *c);
#endif
