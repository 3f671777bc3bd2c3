/* fuzz_control.c: libFuzzer target for the control RPC: the input is one
 * request as it arrives from nng, handled by control_handle (decoding,
 * dispatch to stats/clients/chunks/trim/limit/quota, encoding of the reply)
 * on a lake of the host backend that holds free, leased and parked chunks and
 * two connected clients. The reply must decode. Each input starts from the
 * same limit, no quotas and at least 8 chunks, so a crash reproduces alone. */
#include "control.h"
#include "daemon.h"
#include "dispatch.h"
#include "session.h"
#include "gmlake.h"
#include "log.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static gmld *d;
static session sess[2];
static int peer[2];

/* The chunk creator is not under test: refills are what the harness does. */
void creator_make(creator *cr, uint64_t n) { (void)cr, (void)n; }

static void fill_lake(void) {
  while (d->lk.total < 8) {
    gml_phys phys;
    int fd = -1;
    if (d->be->ops->chunk_create(d->be, &phys, &fd)) abort();
    if (lake_add_created(&d->lk, phys, fd)) abort();
  }
}

static void setup(void) {
  gmli_log_set_level(GML_LOG_ERROR - 1); /* quiet: the fuzzer prints its own */
  d = calloc(1, sizeof *d);
  char msg[256];
  if (!d || gmli_backend_open("host", 0, NULL, &d->be, msg, sizeof msg)) abort();
  d->loop = uv_default_loop();
  lake_init(&d->lk, d->be, 16 * d->be->chunk_size);
  gmlake__lake_stats__init(&d->counters);
  broker_init(&d->br, &d->lk, &d->counters, 0, 0);
  d->device_total = 64 * d->be->chunk_size;
  d->listen_fd = -1;
  dispatch_start(d); /* the protocol's hooks, as gmlaked installs them */
  d->cfg.send_queue_max = 1 << 20;
  d->cfg.read_budget = 64;
  fill_lake();
  for (int i = 0; i < 2; i++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) abort();
    session *s = &sess[i];
    s->d = d;
    s->fd = sv[0];
    peer[i] = sv[1];
    s->bc.id = ++d->next_client_id;
    s->bc.pid = 1000 + i;
    s->bc.uid = 1000;
    s->pidfd = -1;
    s->hello_done = 1;
    snprintf(s->bc.name, sizeof s->bc.name, "client%d", i);
    uv_poll_init(d->loop, &s->poll, s->fd);
    s->poll.data = s;
    broker_add_client(&d->br, &s->bc);
    uint32_t idx[2];
    s->bc.leased_chunks = lake_take(&d->lk, s->bc.id, 2, idx);
    s->bc.allocated = 3 * d->lk.cs;
    s->bc.cached = d->lk.cs;
  }
  for (uint32_t i = 0; i < d->lk.nslots; i++) /* one of client 1's chunks parked, as after a disconnect */
    if (d->lk.chunks[i].state == CHUNK_LEASED && d->lk.chunks[i].owner == sess[1].bc.id) {
      lake_park(&d->lk, i);
      sess[1].bc.leased_chunks--;
      break;
    }
  for (int i = 0; i < 50; i++) broker_record_latency(&d->br, 1000 + 37u * (unsigned)i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!d) setup();
  d->lk.limit_bytes = 16 * d->lk.cs;
  d->lk.nquotas = 0;
  fill_lake();
  uint8_t *out = NULL;
  size_t n = 0;
  if (control_handle(d, data, size, &out, &n)) return 0;
  Gmlake__CtlReply *rep = gmlake__ctl_reply__unpack(NULL, n, out);
  if (!rep) abort(); /* the daemon's own reply must decode */
  gmlake__ctl_reply__free_unpacked(rep, NULL);
  free(out);
  /* a trim asked a client for its cache: the reclaim went to its socket */
  uint8_t tmp[4096];
  for (int i = 0; i < 2; i++)
    while (recv(peer[i], tmp, sizeof tmp, MSG_DONTWAIT) > 0) {}
  return 0;
}
