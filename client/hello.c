/* hello.c: finding this process's daemon and saying hello to it.
 *
 * The device is named by the UUID its driver gives this process's ordinal
 * (common/gpuname.h: under CUDA_VISIBLE_DEVICES=3, ordinal 0 is physical GPU
 * 3). The sockets tried are discover.h's (gmlake-<UUID>.sock, then
 * gmlake-N.sock), each only if trusted; the hello carries the UUID and the
 * daemon refuses one of its backend that is not its own, naming both GPUs.
 * The reply says which device the daemon serves, and it is compared here
 * too (a daemon of another backend cannot compare: a host daemon, a driver
 * with a GPU and backend auto; an older daemon says only its index). A
 * found socket whose daemon serves another GPU is passed over (a
 * gmlake-N.sock of an ordinal that names another GPU here); a named one
 * (GMLAKE_SOCKET) is the answer: its refusal is gml_open's error. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "client_priv.h"
#include "discover.h"
#include "gpuname.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include "wire.h"
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void gmli_hello_init(gml_client *c, Gmlake__Hello *h, char name[GML_HELLO_NAME]) {
  gmlake__hello__init(h);
  name[0] = 0;
  FILE *f = fopen("/proc/self/comm", "re");
  if (f) {
    if (fgets(name, GML_HELLO_NAME, f)) name[strcspn(name, "\n")] = 0;
    fclose(f);
  }
  h->protocol_version = GML_PROTOCOL_VERSION;
  h->name = name;
  h->gpu_uuid = c->gpu_uuid;
  h->device = c->device;
}

/* 0 when the daemon that replied serves this process's device: the UUID it
 * says is ours under its backend; where it says none (an older daemon), its
 * index is our ordinal, as before. Else GML_ENODEV, saying both. */
static int not_our_device(gml_client *c, const Gmlake__HelloReply *hr, const gml_backend_opts *bo) {
  char mine[GML_UUID_MAX] = "";
  if (hr->gpu_uuid && *hr->gpu_uuid) {
    if (!strcmp(gmli_uuid_backend(c->gpu_uuid), hr->backend)) snprintf(mine, sizeof mine, "%s", c->gpu_uuid);
    else
      gmli_backend_device_uuid(hr->backend, c->device, bo, mine); /* auto found a GPU; the daemon serves host memory */
  }
  if (mine[0]) {
    if (gmli_uuid_same(mine, hr->gpu_uuid)) return 0;
    gmli_gpu_mismatch(c->last_error, sizeof c->last_error, hr->gpu_uuid, hr->device, mine, c->device);
    return GML_ENODEV;
  }
  if (hr->device == c->device) return 0;
  snprintf(c->last_error, sizeof c->last_error,
           "the daemon serves device %d, not device %d (one daemon per GPU: name each device's socket, "
           "e.g. GMLAKE_SOCKET=/path/gmlake-%%d.sock, where %%d stands for the device)",
           hr->device, c->device);
  return GML_ENODEV;
}

static void free_reply(Gmlake__Envelope *env, const int *fds, int nfds) {
  if (env) gmlake__envelope__free_unpacked(env, NULL);
  for (int i = 0; i < nfds; i++) close(fds[i]);
}

/* Hello on c->sock: 0 with the daemon's backend and chunk size, or what
 * went wrong with c->last_error saying it (GML_ENODEV: another GPU's daemon). */
static int daemon_hello(gml_client *c, const gml_backend_opts *bo, char *backend, size_t blen, uint64_t *chunk_size) {
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT, *reply = NULL;
  Gmlake__Hello h;
  char name[GML_HELLO_NAME];
  int fds[GML_MAX_LEASE_CHUNKS], nfds = 0;
  gmli_hello_init(c, &h, name);
  env.msg_case = GMLAKE__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  c->last_error[0] = 0;
  int rc = gmli_client_call(c, &env, &reply, fds, &nfds);
  if (rc) {                /* e.g. gmlakectl's endpoint named as the socket: its nng closes what is no SP greeting */
    if (!c->last_error[0]) /* else the daemon said why it refused the connection */
      snprintf(c->last_error, sizeof c->last_error,
               "no hello reply (%s): not a gmlaked's clients' socket (gmlake-N.sock)? "
               "the control endpoint (gmlake-N.ctl) is gmlakectl's",
               gml_strerror(rc));
    return rc;
  }
  free_reply(NULL, fds, nfds);
  if (reply->msg_case != GMLAKE__ENVELOPE__MSG_HELLO_REPLY) {
    rc = reply->msg_case == GMLAKE__ENVELOPE__MSG_ERROR ? GML_EDAEMON : GML_EPROTO;
    if (rc == GML_EDAEMON && reply->error->code == GML_ENODEV) /* another GPU's: its words name both */
      snprintf(c->last_error, sizeof c->last_error, "%s", reply->error->message), rc = GML_ENODEV;
    else if (rc == GML_EDAEMON)
      snprintf(c->last_error, sizeof c->last_error, "daemon refused us: %s", reply->error->message);
    free_reply(reply, NULL, 0);
    return rc;
  }
  const Gmlake__HelloReply *hr = reply->hello_reply;
  if ((rc = not_our_device(c, hr, bo))) { /* its chunks are another GPU's memory: never map them for this one */
    free_reply(reply, NULL, 0);
    return rc;
  }
  snprintf(backend, blen, "%s", hr->backend);
  *chunk_size = hr->chunk_size;
  c->client_id = hr->client_id;
  c->daemon_instance = hr->instance;
  c->max_stream = GML_MIN(hr->max_stream, (uint64_t)GML_LEASE_MAX);
  c->lease_wait_ns = (uint64_t)hr->lease_wait_ms * 1000000ull;
  __atomic_store_n(&c->daemon_mem_info, hr->mem_info, __ATOMIC_RELAXED);
  gmli_daemon_clock(c, hr->mono_ns);
  free_reply(reply, NULL, 0);
  return 0;
}

int gmli_daemon_find(gml_client *c, const gml_options *opt, const gml_backend_opts *bo, char *path, size_t plen,
                     char *why, size_t whylen, char *backend, size_t blen, uint64_t *chunk_size) {
  char cand[GML_CANDIDATES_MAX][GML_PATH_MAX];
  int named = opt->socket && *opt->socket;
  gmli_backend_device_uuid(opt->backend, c->device, bo, c->gpu_uuid); /* "" when no backend has it: by index alone */
  int n = gmli_daemon_candidates(c->device, c->gpu_uuid, opt->socket, cand);
  why[0] = 0;
  for (int i = 0; i < n; i++) {
    char reason[sizeof c->last_error];
    int refused = 0, s = gmli_daemon_dial(cand[i], reason, sizeof reason, &refused);
    if (s >= 0) {
      c->sock = s, c->mode = GML_MODE_DAEMON, c->daemon_gone = 0;
      snprintf(path, plen, "%s", cand[i]);
      int rc = daemon_hello(c, bo, backend, blen, chunk_size);
      if (rc != GML_ENODEV || named) return rc; /* served, or this daemon's answer is gml_open's */
      snprintf(reason, sizeof reason, "%s", c->last_error);
      close(c->sock);
      c->sock = -1, c->mode = 0, c->last_error[0] = 0;
    }
    gmli_why_add(why, whylen, cand[i], reason);
  }
  return GML_EDAEMON;
}
