/* ctl_paths.c: `gmlakectl paths` (ctl_paths.h). The probe and the plan are
 * the client library's (client/mpath.c, gml_copy_probe); this prints them. */
#include "ctl_paths.h"
#include "gmlake.h"
#include <stdio.h>
#include <string.h>

static void print_json(const gml_copy_info *in, int device, const char *backend) {
  printf("{\"device\":%d,\"backend\":\"%s\",\"npaths\":%u,\"paths_used\":%u,\"h2d_gbps\":%.3f,\"d2h_gbps\":%.3f,"
         "\"paths\":[",
         device, backend, in->npaths, in->paths_used, in->h2d_gbps, in->d2h_gbps);
  for (uint32_t i = 0; i < in->npaths && i < GML_COPY_PATHS_MAX; i++) {
    const gml_copy_path *p = &in->paths[i];
    printf("%s{\"path\":%u,\"device\":%d,\"route\":\"%s\",\"used\":%s,\"h2d_gbps\":%.3f,\"d2h_gbps\":%.3f,"
           "\"h2d_share\":%.4f,\"d2h_share\":%.4f}",
           i ? "," : "", i, p->device, i ? "peer link + P2P" : "own link", p->used ? "true" : "false", p->h2d_gbps,
           p->d2h_gbps, p->h2d_share, p->d2h_share);
  }
  printf("]}\n");
}

static void print_table(const gml_copy_info *in, int device, const char *backend) {
  printf("Copy paths of GPU %d (%s backend%s), host <-> device:\n", device, backend,
         strcmp(backend, "host") ? "" : ": memcpy stands in for the links, bandwidths modelled");
  if (in->npaths <= 1) {
    printf("  its own link only: %s\n", in->npaths ? "no peer GPU with P2P access to it"
                                                   : "not probed (GMLAKE_COPY_PATHS=1, or no peer copies here)");
    return;
  }
  printf("%-5s %-7s %-17s %9s %9s %5s %10s %10s\n", "PATH", "DEVICE", "ROUTE", "H2D GB/s", "D2H GB/s", "USED",
         "H2D SHARE", "D2H SHARE");
  for (uint32_t i = 0; i < in->npaths && i < GML_COPY_PATHS_MAX; i++) {
    const gml_copy_path *p = &in->paths[i];
    printf("%-5u %-7d %-17s %9.1f %9.1f %5s %9.0f%% %9.0f%%\n", i, p->device, i ? "peer link + P2P" : "own link",
           p->h2d_gbps, p->d2h_gbps, p->used ? "yes" : "no", 100 * p->h2d_share, 100 * p->d2h_share);
  }
  printf("together: H2D %.1f GB/s, D2H %.1f GB/s (%u of %u paths used; a page-locked copy of 64 MiB or more is "
         "split so)\n",
         in->h2d_gbps, in->d2h_gbps, in->paths_used, in->npaths);
}

int gmli_ctl_paths(int device, int json, char *err, size_t errlen) {
  gml_open_opts o = {.device = device, .mode = GML_MODE_EMBEDDED};
  gml_client *c = NULL;
  int rc = gml_open(&o, &c);
  if (rc) {
    snprintf(err, errlen, "paths: cannot open GPU %d: %s", device, gml_strerror(rc));
    return rc;
  }
  gml_copy_info in;
  gml_stats st;
  if (!(rc = gml_copy_probe(c)) && !(rc = gml_copy_info_get(c, &in)) && !(rc = gml_stats_get(c, &st))) {
    const char *backend = st.backend ? st.backend : "?";
    if (json) print_json(&in, device, backend);
    else print_table(&in, device, backend);
  } else {
    snprintf(err, errlen, "paths: probing GPU %d's copy paths failed: %s (%s)", device, gml_strerror(rc),
             gml_last_error(c));
  }
  gml_close(c);
  return rc;
}
