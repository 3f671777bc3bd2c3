/* A number a client reports reaches `gmlakectl clients --json` and the
 * metrics with no line but its field in UsageReport (proto/gmlake.proto) and
 * the one that fills it (client.c): every field of the descriptor, given a
 * value of its own in a client's report, must be in the JSON under its name
 * (ClientInfo's field of that name where there is one: the daemon's view)
 * and in gmlake_user_reported. A field added to UsageReport that either
 * misses fails here, as does one the client's change check cannot read. */
#include "client_priv.h"
#include "statsview.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What gmli_print_json writes to stdout, as a string (the caller frees it). */
static char *json_of(const ProtobufCMessage *m) {
  FILE *t = tmpfile();
  ck_assert_ptr_nonnull(t);
  fflush(stdout);
  int saved = dup(1);
  ck_assert_int_ge(saved, 0);
  ck_assert_int_ge(dup2(fileno(t), 1), 0);
  gmli_print_json(m);
  fflush(stdout);
  dup2(saved, 1), close(saved);
  long n = ftell(t);
  char *s = calloc(1, (size_t)n + 1);
  rewind(t);
  ck_assert_uint_eq(fread(s, 1, (size_t)n, t), (size_t)n);
  fclose(t);
  return s;
}

START_TEST(test_usage_fields) {
  const ProtobufCMessageDescriptor *d = &gmlake__usage_report__descriptor;
  Gmlake__UsageReport u = GMLAKE__USAGE_REPORT__INIT;
  ck_assert_uint_le(d->n_fields, GML_USAGE_KEYS); /* client.c's change check sees every field */
  for (unsigned i = 0; i < d->n_fields; i++) {
    ck_assert_msg(d->fields[i].type == PROTOBUF_C_TYPE_UINT64 && d->fields[i].label != PROTOBUF_C_LABEL_REPEATED,
                  "UsageReport.%s: a uint64 (the change check reads them so)", d->fields[i].name);
    *(uint64_t *)(void *)((char *)&u + d->fields[i].offset) = 1000 + i;
  }
  Gmlake__ClientInfo ci = GMLAKE__CLIENT_INFO__INIT, *cp = &ci;
  ci.uid = 4321, ci.allocated = 77, ci.reported = &u;
  char *json = json_of(&ci.base);
  Gmlake__LakeStats st = GMLAKE__LAKE_STATS__INIT;
  st.backend = "host", st.gpu_uuid = "host-0";
  Gmlake__CtlReply r = GMLAKE__CTL_REPLY__INIT;
  r.stats = &st, r.n_clients = 1, r.clients = &cp;
  char *text = NULL;
  size_t len = 0;
  FILE *o = open_memstream(&text, &len);
  ck_assert_ptr_nonnull(o);
  gmli_print_metrics(o, &r);
  fclose(o);
  for (unsigned i = 0; i < d->n_fields; i++) {
    const char *name = d->fields[i].name;
    const ProtobufCFieldDescriptor *own = protobuf_c_message_descriptor_get_field_by_name(ci.base.descriptor, name);
    unsigned long long v = own ? *(const uint64_t *)(const void *)((const char *)&ci + own->offset) : 1000 + i;
    char want[160];
    snprintf(want, sizeof want, "\"%s\":%llu", name, v);
    ck_assert_msg(strstr(json, want), "clients --json lacks %s: %s", want, json);
    snprintf(want, sizeof want, "uid=\"4321\",field=\"%s\"} %llu\n", name, v);
    ck_assert_msg(strstr(text, want), "the metrics lack gmlake_user_reported{%s", want);
  }
  ck_assert(strstr(json, "\"allocated\":77")); /* the daemon's view, not the report's 1000 */
  ck_assert(!strstr(json, "\"allocated\":1000"));
  free(json), free(text);
}
END_TEST

Suite *usage_suite(void) {
  Suite *s = suite_create("usage");
  TCase *tc = tcase_create("usage");
  tcase_add_test(tc, test_usage_fields);
  suite_add_tcase(s, tc);
  return s;
}
