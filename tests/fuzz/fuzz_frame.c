/* fuzz_frame.c: libFuzzer target for what the daemon runs on every byte a
 * client sends: the input goes through a real Unix socket pair in pieces
 * (their sizes drawn from the input's first byte), is reassembled by the
 * daemon's incremental receiver (gmli_rx_fill/next/consume), each complete
 * frame is decoded as an Envelope and passes gmli_wire_check_request, as in
 * daemon/session.c. The session stops at the first bad frame, as the daemon
 * closes such a client. */
#include "gmlake.h"
#include "wire.h"
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int sp[2] = {-1, -1};

static void drain_pair(void) {
  uint8_t tmp[4096];
  while (recv(sp[0], tmp, sizeof tmp, MSG_DONTWAIT) > 0) {}
}

/* Returns 0 to go on, -1 when the daemon would close this client. */
static int take_frames(gml_rx *rx, int *hello_done) {
  const uint8_t *body;
  size_t len;
  int k;
  while ((k = gmli_rx_next(rx, &body, &len)) == 1) {
    Gmlake__Envelope *env = gmlake__envelope__unpack(NULL, len, body);
    const char *bad = env ? gmli_wire_check_request(env, *hello_done) : "undecodable";
    if (!bad && env->msg_case == GMLAKE__ENVELOPE__MSG_HELLO) *hello_done = 1;
    if (!bad && env->msg_case == GMLAKE__ENVELOPE__MSG_RET) /* what handle_return reads */
      for (size_t i = 0; i < env->ret->n_chunk_ids; i++) (void)*(volatile uint64_t *)&env->ret->chunk_ids[i];
    if (env) gmlake__envelope__free_unpacked(env, NULL);
    if (bad) return -1;
    gmli_rx_consume(rx, len);
  }
  return k < 0 ? -1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (sp[0] < 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp) != 0) abort();
  if (size < 1) return 0;
  uint32_t rng = data[0] * 2654435761u + 1;
  data++, size--;
  gml_rx rx = {0};
  int hello_done = 0, closed = 0;
  size_t off = 0;
  while (off < size && !closed) {
    rng = rng * 1103515245u + 12345u;
    size_t piece = 1 + (rng >> 16) % 8192;
    if (piece > size - off) piece = size - off;
    ssize_t w = send(sp[1], data + off, piece, MSG_NOSIGNAL);
    if (w <= 0) abort(); /* the pair is drained after every piece: it has room */
    off += (size_t)w;
    for (;;) {
      long r = gmli_rx_fill(&rx, sp[0]);
      if (r == GML_EAGAIN) break;
      if (r <= 0) { /* EOF or an error: the daemon closes the client */
        closed = 1;
        break;
      }
      if (take_frames(&rx, &hello_done)) {
        closed = 1;
        break;
      }
    }
  }
  drain_pair();
  gmli_rx_free(&rx);
  return 0;
}
