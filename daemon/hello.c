/* hello.c: a client's first message. It says who it is (its name; pid and
 * uid come from SO_PEERCRED), whether it hands chunks over after a restart,
 * and which device it is on: the UUID its driver gives its device
 * (common/gpuname.h). A UUID of this daemon's backend that is not this
 * daemon's is refused, naming both GPUs: the client reached another GPU's
 * daemon (a GMLAKE_SOCKET of another GPU, an ordinal taken for another
 * under CUDA_VISIBLE_DEVICES) and would map that GPU's memory for its own.
 * No UUID (an older client), or one of another backend (a client on auto
 * whose driver has a GPU, at a host daemon): taken, and the client compares
 * what the reply says (HelloReply.gpu_uuid, device) with its own device. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "conn.h"
#include "daemon.h"
#include "gmlake.h"
#include "gpuname.h"
#include "hello.h"
#include "log.h"
#include "util.h"
#include <stdio.h>
#include <string.h>

/* 1 when the hello's device is not ours, why saying so. */
static int gpu_refused(const gmld *d, const Gmlake__Hello *h, char *why, size_t len) {
  const char *theirs = h->gpu_uuid;
  if (!theirs || !*theirs || strcmp(gmli_uuid_backend(theirs), d->be->name) || gmli_uuid_same(theirs, d->be->uuid))
    return 0;
  gmli_gpu_mismatch(why, len, d->be->uuid, d->cfg.device,
                    gmli_device_name_ok(theirs) ? theirs : "(a name no device has)", h->device);
  return 1;
}

void hello_handle(session *s, const Gmlake__Envelope *msg) {
  const Gmlake__Hello *h = msg->hello;
  gmld *d = s->d;
  char why[512];
  if (h->protocol_version != GML_PROTOCOL_VERSION) {
    session_send_error(s, msg->seq, GML_EPROTO, "protocol version %u not supported (daemon speaks %d)",
                       h->protocol_version, GML_PROTOCOL_VERSION);
    session_doom(s, "protocol version not supported");
    return;
  }
  if (gpu_refused(d, h, why, sizeof why)) { /* its chunks would be another GPU's memory */
    session_send_error(s, msg->seq, GML_ENODEV, "%s", why);
    CONN_INFO(s->bc.uid, "client %llu (pid %d) refused: %s", (unsigned long long)s->bc.id, (int)s->bc.pid, why);
    session_doom(s, "its device is another GPU");
    return;
  }
  snprintf(s->bc.name, sizeof s->bc.name, "%s", h->name ? h->name : "");
  for (char *p = s->bc.name; *p; p++)
    if ((unsigned char)*p < 32 || (unsigned char)*p > 126) *p = '?';
  s->hello_done = 1;
  /* a hand-over comes right after a restart: later, a client would hand over
   * chunks it returned but kept the fds of, past its quota and the limit */
  s->bc.reconnected = h->adopting;
  int late = h->adopting && gmli_now_ns() - d->start_ns > (uint64_t)d->cfg.adopt_window_s * 1000000000ull;
  if (h->adopting && !late) session_keep_fds(s, GML_MAX_LEASE_CHUNKS); /* its chunks' fds come with Adopt requests */
  static uint64_t late_logged_ns; /* one warning a second at most: any client may say adopting */
  int loud = late && gmli_now_ns() - late_logged_ns > 1000000000ull;
  if (loud) late_logged_ns = gmli_now_ns();
  if (late)
    gmli_log(loud ? GML_LOG_WARN : GML_LOG_DEBUG,
             "client %llu (pid %d, uid %u) would hand over chunks %.0f s after "
             "start (adopt-window %d s): refused, it keeps them uncounted",
             (unsigned long long)s->bc.id, (int)s->bc.pid, (unsigned)s->bc.uid,
             (double)(gmli_now_ns() - d->start_ns) / 1e9, d->cfg.adopt_window_s);
  conn_process_cgroup(s->bc.pid, s->bc.cgroup, sizeof s->bc.cgroup);
  gmli_conn_process_cgroup_v1(s->bc.pid, s->bc.cgroup_v1, sizeof s->bc.cgroup_v1);
  if (s->peer_gone || conn_process_gone(s->pidfd, s->bc.pid)) { /* after the cgroup read: it was that process's */
    /* its pid and cgroup are what pid and cgroup quotas bind: a process that connected, handed the socket on
     * and exited left a connection in no cgroup (before: a lease past its cgroup's quota) */
    session_send_error(s, msg->seq, GML_EPERM,
                       "the process that connected (pid %d) has exited: a connection is served "
                       "to the process that made it",
                       (int)s->bc.pid);
    session_doom(s, "the process that connected has exited");
    return;
  }
  Gmlake__Envelope env = GMLAKE__ENVELOPE__INIT;
  Gmlake__HelloReply r = GMLAKE__HELLO_REPLY__INIT;
  r.protocol_version = GML_PROTOCOL_VERSION;
  r.chunk_size = d->lk.cs;
  r.backend = (char *)d->be->name;
  r.device = d->cfg.device;
  r.gpu_uuid = d->be->uuid;
  r.client_id = s->bc.id;
  r.instance = d->instance;
  r.max_stream = BROKER_MAX_STREAM, r.lease_wait_ms = (uint32_t)(d->br.lease_wait_ns / 1000000u);
  r.no_adopt = late, r.mono_ns = gmli_now_ns(), r.mem_info = 1;
  env.seq = msg->seq;
  env.msg_case = GMLAKE__ENVELOPE__MSG_HELLO_REPLY;
  env.hello_reply = &r;
  session_send_msg(s, &env, NULL, 0);
  CONN_INFO(s->bc.uid, "client %llu connected: pid %d uid %u (%s) cgroup %s", (unsigned long long)s->bc.id,
            (int)s->bc.pid, (unsigned)s->bc.uid, GML_LOG_ESC(s->bc.name),
            s->bc.cgroup[0] ? GML_LOG_ESC(s->bc.cgroup) : "-");
}
