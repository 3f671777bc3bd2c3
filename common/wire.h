/* wire.h: framing of the client socket. A frame is a 4-byte little-endian
 * length and one serialized gmlake.Envelope; chunk fds ride in the same
 * sendmsg as SCM_RIGHTS, in the order of the chunk ids in the message. */
#ifndef GML_WIRE_H
#define GML_WIRE_H
#include "gmlake.pb-c.h"
#include <stddef.h>
#include <stdint.h>

#define GML_PROTOCOL_VERSION 1
#define GML_MAX_FRAME (64 * 1024) /* larger lengths close the connection */
#define GML_MAX_LEASE_CHUNKS 128  /* chunk ids (and fds) per message */
/* The most chunks one streamed lease asks (LeaseRequest.streamed): 256 GiB of
 * 4 MiB chunks, 384 GiB of 6 MiB ones (the cuda default); the daemon says
 * its own bound in HelloReply.max_stream. */
#define GML_MAX_STREAM_LEASE 65536
/* Upper bounds (microseconds) of LakeStats.lease_latency_bucket: the lease
 * latency histogram (Prometheus gmlake_lease_duration_seconds). */
#define GML_LEASE_LAT_BOUNDS_US                                                                                        \
  { 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000 }
#define GML_LEASE_LAT_NBOUNDS 15
/* What a ShareRequest may carry (the daemon refuses more as a protocol error,
 * which closes the connection: the library checks first). */
#define GML_SHARE_KEY_MAX 127   /* key bytes */
#define GML_SHARE_HASH_MAX 64   /* content hash bytes */
#define GML_SHARE_META_MAX 1024 /* meta bytes */
#define GML_SHARE_UIDS_MAX 64   /* allow_uids */

/* A share key: 1 to GML_SHARE_KEY_MAX bytes of '!' to '~'. 1 when k is one;
 * else 0, with *bad (may be NULL) the offset of its first byte outside that
 * range, or SIZE_MAX when its length is the fault (NULL: length). */
int gmli_share_key_ok(const char *k, size_t *bad);
/* "NAME@UID", user UID's share NAME as an attach names it (the last '@', then
 * decimal digits up to 2^32 - 1; NAME a key as above): 1 with name and *uid
 * set, else 0. The client checks an attach's key with it, the daemon finds
 * the share. */
int gmli_share_key_owner(const char *k, char name[GML_SHARE_KEY_MAX + 1], uint32_t *uid);

/* Serialize env into a malloc'd frame (length prefix included). */
int gmli_wire_encode(const Gmlake__Envelope *env, uint8_t **frame, size_t *len);
/* Send a whole frame and its fds (fds go with the first byte). Blocking
 * sockets only; returns 0 or GML_EDAEMON/GML_ESYS. */
int gmli_wire_send(int sock, const uint8_t *frame, size_t len, const int *fds, int nfds);
/* The same, bounded: where the socket's buffer stays full (a peer that reads
 * nothing: stopped, wedged) until deadline_ns (gmli_now_ns's clock), GML_EAGAIN,
 * the frame perhaps sent in part (the connection is then of no more use). */
int gmli_wire_send_until(int sock, const uint8_t *frame, size_t len, const int *fds, int nfds, uint64_t deadline_ns);
/* After a send that failed: 1 when a frame waits to be read all the same. A
 * daemon that refuses a connection sends why (an Error of seq 0) and closes;
 * if it closed before our first send, that send fails (EPIPE) with the reason
 * still unread: the caller receives it rather than giving up. */
int gmli_wire_refusal_waits(int sock);
/* One sendmsg; returns bytes sent (>= 0), GML_EAGAIN when it would block,
 * GML_EDAEMON when the peer is gone, else GML_ESYS (errno says why). For
 * non-blocking senders. */
long gmli_wire_sendmsg(int sock, const uint8_t *buf, size_t len, const int *fds, int nfds);
/* Blocking receive of one frame; fds received with it land in fds[0..*nfds).
 * Returns 0, GML_EDAEMON on EOF/error, GML_EPROTO on a bad length or too many fds.
 * *env must be freed with gmlake__envelope__free_unpacked. */
int gmli_wire_recv(int sock, Gmlake__Envelope **env, int *fds, int *nfds, int maxfds);

/* The checks every request from a client passes before the daemon acts on
 * it, whatever its state: a sequence number, hello first and only once, a
 * kind a client may send, chunk counts within 1..GML_MAX_LEASE_CHUNKS (a
 * streamed lease: 1..GML_MAX_STREAM_LEASE).
 * Returns NULL, or what is wrong (the daemon closes that client). */
const char *gmli_wire_check_request(const Gmlake__Envelope *env, int hello_done);

/* Incremental receiver for non-blocking sockets (the daemon). */
typedef struct gml_rx {
  uint8_t *buf;
  size_t off, len, cap; /* unread bytes are buf[off..len) */
  int fds_received;     /* fds that arrived and were not kept (closed): the daemon closes such a client */
  int keep_max;         /* fds kept for the message that carries them (adoption), at most this many; 0: none */
  int kept[GML_MAX_LEASE_CHUNKS];
  int nkept;
} gml_rx;
/* Read what is available. Returns >0 bytes read, 0 on EOF, GML_EAGAIN when
 * nothing is there, GML_EDAEMON when the peer reset, GML_ENOMEM, GML_EPROTO
 * (buffer full), or GML_ESYS (errno says why). Received fds are closed and counted. */
long gmli_rx_fill(gml_rx *rx, int sock);
/* 1 and the frame's body when one is complete, 0 when more is needed,
 * GML_EPROTO when the length is over GML_MAX_FRAME. */
int gmli_rx_next(gml_rx *rx, const uint8_t **body, size_t *len);
void gmli_rx_consume(gml_rx *rx, size_t body_len);
/* Take the n fds that came first (kept, keep_max > 0); -1 if fewer are there. */
int gmli_rx_take_fds(gml_rx *rx, int n, int *out);
void gmli_rx_free(gml_rx *rx);
#endif
