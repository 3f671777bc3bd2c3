/* gml-testclient: a client process the integration tests drive through
 * stdin/stdout, one command a line:
 *   alloc SIZE | free I | tag I TOKEN | readtags I | flush | stats | trim | close | exit
 * It opens the daemon at argv[1] ("embedded" for no daemon). */
#include "gmlake.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXB 4096

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: gml-testclient SOCKET|embedded\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  gml_open_opts o = {0};
  if (!strcmp(argv[1], "embedded")) {
    o.mode = GML_MODE_EMBEDDED;
    o.backend = "host";
  } else {
    o.mode = GML_MODE_DAEMON;
    o.socket_path = argv[1];
  }
  gml_client *c = NULL;
  int rc = gml_open(&o, &c);
  if (rc) {
    printf("err %d open: %s\n", rc, gml_strerror(rc));
    return 1;
  }
  gml_stats st;
  gml_stats_get(c, &st);
  size_t cs = st.chunk_size;
  printf("ready %d %zu\n", (int)getpid(), cs);
  void *blk[MAXB] = {0};
  size_t sz[MAXB] = {0};
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    char cmd[32];
    unsigned long long a = 0, b = 0;
    int n = sscanf(line, "%31s %llu %llu", cmd, &a, &b);
    if (n < 1) continue;
    if (!strcmp(cmd, "alloc")) {
      int i = 0;
      while (i < MAXB && blk[i]) i++;
      rc = i < MAXB ? gml_alloc(c, (size_t)a, 0, &blk[i]) : GML_ENOMEM;
      if (rc) printf("err %d %s\n", rc, gml_last_error(c));
      else sz[i] = (size_t)a, printf("ok %d\n", i);
    } else if (!strcmp(cmd, "free") && a < MAXB) {
      rc = gml_free(c, blk[a]);
      blk[a] = NULL;
      printf(rc ? "err %d\n" : "ok\n", rc);
    } else if (!strcmp(cmd, "tag") && a < MAXB && blk[a]) {
      /* chunk-sized pieces of the block each get TOKEN*1000+k in every word */
      for (size_t off = 0, k = 0; off < sz[a]; off += cs, k++) {
        uint64_t v = b * 1000 + k, *p = (uint64_t *)((char *)blk[a] + off);
        size_t words = (sz[a] - off < cs ? sz[a] - off : cs) / 8;
        for (size_t w = 0; w < words; w++) p[w] = v;
      }
      printf("ok\n");
    } else if (!strcmp(cmd, "readtags") && a < MAXB && blk[a]) {
      printf("tags");
      for (size_t off = 0; off < sz[a]; off += cs) {
        uint64_t *p = (uint64_t *)((char *)blk[a] + off);
        size_t words = (sz[a] - off < cs ? sz[a] - off : cs) / 8;
        int uniform = 1;
        for (size_t w = 1; w < words; w++) uniform &= p[w] == p[0];
        if (uniform) printf(" %llu", (unsigned long long)p[0]);
        else printf(" mixed");
      }
      printf("\n");
    } else if (!strcmp(cmd, "flush")) {
      rc = gml_flush(c);
      printf(rc ? "err %d\n" : "ok\n", rc);
    } else if (!strcmp(cmd, "stats")) {
      gml_stats_get(c, &st);
      printf("stats %llu %llu %llu %d\n", (unsigned long long)st.allocated, (unsigned long long)st.reserved,
             (unsigned long long)st.cached, st.mode);
    } else if (!strcmp(cmd, "trim")) {
      size_t r = 0;
      gml_trim(c, &r);
      printf("ok %zu\n", r);
    } else if (!strcmp(cmd, "close") || !strcmp(cmd, "exit")) {
      break;
    } else {
      printf("err bad command\n");
    }
  }
  gml_close(c);
  printf("closed\n");
  return 0;
}
