/* statsview.h: printing the daemon's reply messages through their protobuf-c
 * descriptors (statsview.c), for gmlakectl and the daemon's /metrics (not in
 * the client library: those that print link it). */
#ifndef GML_STATSVIEW_H
#define GML_STATSVIEW_H
#include "gmlake.pb-c.h"
#include <stddef.h>
#include <stdio.h>

/* Every string and number field under its name, as one JSON object. */
void gmli_print_json(const ProtobufCMessage *m);
/* s as a JSON string, quoted and escaped. */
void gmli_print_json_string(FILE *o, const char *s);
/* A JSON array of such objects (no newline after it). */
void gmli_print_json_list(ProtobufCMessage *const *items, size_t n);
/* `gmlakectl stats`: the text templates, then any field they leave out. */
void gmli_print_stats(const Gmlake__LakeStats *s);
/* Prometheus text of LakeStats and of the clients summed per user (reply to
 * a `clients` request), into o: `gmlakectl metrics` and the daemon's HTTP
 * /metrics (daemon/metrics.c) print the same. */
void gmli_print_metrics(FILE *o, const Gmlake__CtlReply *r);
/* `gmlakectl quotas`: one row a quota (name, bytes, held, peak, holder); json: a JSON array of QuotaInfo. */
void gmli_print_quotas(const Gmlake__CtlReply *r, int json);
/* `gmlakectl clients`: a client's reported numbers that no column shows (a
 * field added to UsageReport), each as "  name size", at its row's end. */
void gmli_print_client_other(const Gmlake__ClientInfo *c);
#endif
