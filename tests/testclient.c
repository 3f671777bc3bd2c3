/* gml-testclient: a client process the integration tests drive through
 * stdin/stdout, one command a line:
 *   alloc SIZE | free I | tag I TOKEN | readtags I | leasebench N | flush | stats | trim | close | exit
 * and on one growable range: grow MAX | gmap OFF LEN | gunmap OFF LEN | gensure N | gshrink N |
 *   gtag K TOKEN (chunk k of the range) | gread K | ginfo | gdestroy
 * pause and tags: settag T | pause FLAGS TAG [PATH] | resume | addr I (the block's address)
 * the lease path: cost IMPORT_US UNMAP_US ACCESS_US (the host backend spends a driver's time per chunk) |
 *   nostream (leases of up to 128 chunks, one reply each) | replytimeout MS (a reply waited for at most) | timing (where new chunks' time went)
 * more connections of this process: conns N SIZE (N more clients, each allocates SIZE; kept until close)
 * shared memory: share KEY SIZE [any|none] [HASHTEXT] | dedup SIZE HASHTEXT | attach KEY | aread K | adetach |
 *   gwrite K / awrite K (a child process writes to chunk k of the range / the attached one:
 *   "fault" when it died of it, then "protected" when mprotect cannot make it writable)
 * It opens the daemon at argv[1] ("embedded" for no daemon; "default" or
 * "default:N": gml_open as a program that names nothing would, for device N,
 * GMLAKE_MODE and GMLAKE_SOCKET from the environment). The first line says
 * "ready PID CHUNK_SIZE BACKEND MODE". */
#include "backends.h"
#include "gmlake.h"
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* A child writes one byte at p: "fault" when that killed it (under the
 * sanitizers their SEGV report exits 1), else "wrote". */
static void on_fault(int sig) {
  (void)sig;
  _exit(97);
}

static const char *child_write(volatile char *p) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    *p = 1;
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS)) return "fault";
  if (WIFEXITED(st) && WEXITSTATUS(st) == 97) return "fault"; /* its handler saw the fault */
#if defined(__SANITIZE_ADDRESS__)
  if (WIFEXITED(st) && WEXITSTATUS(st) == 1) return "fault";
#endif
  return "wrote";
}

#define MAXB 4096

/* The library's test hooks (hidden in the shared library; this links the static one). */
void gmli_client_test_nostream(gml_client *c);
void gmli_client_test_reply_timeout(gml_client *c, uint64_t ms);

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: gml-testclient SOCKET|embedded|default[:N]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (gml_host_test_costs_install()) return 1; /* `cost`: no cost until it says one */
  gml_open_opts o = {0};
  if (!strncmp(argv[1], "default", 7)) {
    o.device = argv[1][7] == ':' ? atoi(argv[1] + 8) : 0;
  } else if (!strcmp(argv[1], "embedded")) {
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
  uint64_t *buf = malloc(cs);
  if (!buf) return 1;
  printf("ready %d %zu %s %s\n", (int)getpid(), cs, st.backend, st.mode == GML_MODE_DAEMON ? "daemon" : "embedded");
  gml_growable *g = NULL, *att = NULL;
  gml_client *conns[8];
  int nconns = 0;
  void *blk[MAXB] = {0};
  size_t sz[MAXB] = {0};
  char line[512];
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
      /* chunk-sized pieces of the block each get TOKEN*1000+k in every word,
       * written through the backend (device memory on cuda) */
      rc = 0;
      for (size_t off = 0, k = 0; off < sz[a] && !rc; off += cs, k++) {
        size_t words = (sz[a] - off < cs ? sz[a] - off : cs) / 8;
        for (size_t w = 0; w < words; w++) buf[w] = b * 1000 + k;
        rc = gml_write(c, (char *)blk[a] + off, buf, words * 8);
      }
      printf(rc ? "err %d\n" : "ok\n", rc);
    } else if (!strcmp(cmd, "readtags") && a < MAXB && blk[a]) {
      printf("tags");
      for (size_t off = 0; off < sz[a]; off += cs) {
        size_t words = (sz[a] - off < cs ? sz[a] - off : cs) / 8;
        if (gml_read(c, buf, (char *)blk[a] + off, words * 8)) {
          printf(" error");
          continue;
        }
        int uniform = 1;
        for (size_t w = 1; w < words; w++) uniform &= buf[w] == buf[0];
        if (uniform) printf(" %llu", (unsigned long long)buf[0]);
        else printf(" mixed");
      }
      printf("\n");
    } else if (!strcmp(cmd, "leasebench")) {
      /* a chunk-sized block at a time, never freed: each needs one new chunk,
       * so each is one lease round trip */
      void **p = calloc(a, sizeof *p);
      uint64_t calls0;
      gml_stats_get(c, &st);
      calls0 = st.lease_calls;
      for (size_t i = 0; i < a && p; i++)
        if (gml_alloc(c, cs, 0, &p[i])) break;
      gml_stats_get(c, &st);
      printf("lease calls %llu p50 %llu ns p99 %llu ns\n", (unsigned long long)(st.lease_calls - calls0),
             (unsigned long long)st.lease_p50_ns, (unsigned long long)st.lease_p99_ns);
      for (size_t i = 0; i < a && p; i++)
        if (p[i]) gml_free(c, p[i]);
      free(p);
    } else if (!strcmp(cmd, "cost")) {
      unsigned long long imp = 0, unm = 0, acc = 0;
      sscanf(line, "%*s %llu %llu %llu", &imp, &unm, &acc);
      gml_host_test_costs(imp * 1000, unm * 1000, acc * 1000);
      printf("ok\n");
    } else if (!strcmp(cmd, "nostream")) {
      gmli_client_test_nostream(c);
      printf("ok\n");
    } else if (!strcmp(cmd, "replytimeout")) {
      gmli_client_test_reply_timeout(c, (uint64_t)a);
      printf("ok\n");
    } else if (!strcmp(cmd, "timing")) {
      gml_stats_get(c, &st);
      printf("timing calls %llu streamed %llu wait_us %llu import_us %llu map_us %llu mapcall_us %llu access_us %llu "
             "maps %llu unmaps %llu\n",
             (unsigned long long)st.lease_calls, (unsigned long long)st.chunks_streamed,
             (unsigned long long)st.lease_wait_ns / 1000, (unsigned long long)st.import_ns / 1000,
             (unsigned long long)st.map_ns / 1000, (unsigned long long)st.map_call_ns / 1000,
             (unsigned long long)st.access_ns / 1000, (unsigned long long)st.maps, (unsigned long long)st.unmaps);
    } else if (!strcmp(cmd, "flush")) {
      rc = gml_flush(c);
      printf(rc ? "err %d\n" : "ok\n", rc);
    } else if (!strcmp(cmd, "stats")) {
      gml_stats_get(c, &st);
      printf("stats %llu %llu %llu %d\n", (unsigned long long)st.allocated, (unsigned long long)st.reserved,
             (unsigned long long)st.cached, st.mode);
    } else if (!strcmp(cmd, "meminfo") || !strcmp(cmd, "takefree")) {
      /* meminfo: "meminfo FREE TOTAL"; takefree PCT: allocate PCT% of what gml_mem_info says is free */
      size_t fr = 0, to = 0;
      rc = gml_mem_info(c, &fr, &to);
      int i = 0;
      while (i < MAXB && blk[i]) i++;
      size_t want = (size_t)((double)fr * (double)a / 100.0);
      if (!rc && !strcmp(cmd, "takefree")) rc = i < MAXB ? gml_alloc(c, want, 0, &blk[i]) : GML_ENOMEM;
      if (rc) printf("err %d %s\n", rc, gml_last_error(c));
      else if (!strcmp(cmd, "meminfo")) printf("meminfo %zu %zu\n", fr, to);
      else sz[i] = want, printf("ok %d %zu %zu\n", i, want, fr);
    } else if (!strcmp(cmd, "trim")) {
      size_t r = 0;
      gml_trim(c, &r);
      printf("ok %zu\n", r);
    } else if (!strcmp(cmd, "grow") && !g) {
      rc = gml_growable_create(c, (size_t)a, &g);
      gml_growable_info gi;
      if (!rc) gml_growable_info_get(g, &gi);
      if (rc) printf("err %d %s\n", rc, gml_last_error(c));
      else printf("ok %p\n", gi.base);
    } else if (g &&
               (!strcmp(cmd, "gmap") || !strcmp(cmd, "gunmap") || !strcmp(cmd, "gensure") || !strcmp(cmd, "gshrink"))) {
      rc = !strcmp(cmd, "gmap")      ? gml_growable_map(g, (size_t)a, (size_t)b)
           : !strcmp(cmd, "gunmap")  ? gml_growable_unmap(g, (size_t)a, (size_t)b)
           : !strcmp(cmd, "gensure") ? gml_growable_ensure(g, (size_t)a)
                                     : gml_growable_shrink(g, (size_t)a);
      if (rc) printf("err %d %s\n", rc, gml_last_error(c));
      else printf("ok\n");
    } else if (g && (!strcmp(cmd, "gtag") || !strcmp(cmd, "gread"))) {
      gml_growable_info gi;
      gml_growable_info_get(g, &gi);
      char *p = (char *)gi.base + a * cs;
      if (!strcmp(cmd, "gtag")) {
        for (size_t w = 0; w < cs / 8; w++) buf[w] = b * 1000 + a;
        rc = gml_write(c, p, buf, cs);
        printf(rc ? "err %d\n" : "ok\n", rc);
      } else if (gml_growable_is_mapped(g, a * cs) != 1) {
        printf("unmapped\n"); /* reading it would fault */
      } else if (gml_read(c, buf, p, cs)) {
        printf("err read\n");
      } else {
        int uniform = 1;
        for (size_t w = 1; w < cs / 8; w++) uniform &= buf[w] == buf[0];
        if (uniform) printf("tag %llu\n", (unsigned long long)buf[0]);
        else printf("mixed\n");
      }
    } else if (g && !strcmp(cmd, "ginfo")) {
      gml_growable_info gi;
      gml_growable_info_get(g, &gi);
      gml_stats_get(c, &st);
      printf("ginfo %p %zu %zu %zu stats %llu %llu %llu\n", gi.base, gi.reserved, gi.mapped, gi.mapped_prefix,
             (unsigned long long)st.growable_ranges, (unsigned long long)st.growable_mapped,
             (unsigned long long)st.growable_unmapped);
    } else if (g && !strcmp(cmd, "gdestroy")) {
      rc = gml_growable_destroy(g);
      g = NULL;
      printf(rc ? "err %d\n" : "ok\n", rc);
    } else if (!strcmp(cmd, "settag")) {
      rc = gml_set_tag(c, (uint32_t)a);
      printf(rc ? "err %d\n" : "ok\n", rc);
    } else if (!strcmp(cmd, "pause")) {
      char path[200] = "";
      sscanf(line, "%*s %*s %*s %199s", path);
      rc = path[0] ? gml_pause_file(c, (unsigned)a, (uint32_t)b, path) : gml_pause(c, (unsigned)a, (uint32_t)b);
      if (rc) printf("err %d %s\n", rc, gml_last_error(c));
      else printf("ok\n");
    } else if (!strcmp(cmd, "resume")) {
      rc = gml_resume(c);
      if (rc) printf("err %d %s\n", rc, gml_last_error(c));
      else printf("ok\n");
    } else if (!strcmp(cmd, "addr") && a < MAXB) {
      printf("addr %p\n", blk[a]);
    } else if (!strcmp(cmd, "conns") && a <= 8 && !nconns) {
      printf("conns");
      for (unsigned long long i = 0; i < a; i++) {
        rc = gml_open(&o, &conns[nconns]);
        if (rc) {
          printf(" open%d", rc);
          continue;
        }
        void *p;
        rc = gml_alloc(conns[nconns++], (size_t)b, 0, &p);
        printf(" %d", rc);
      }
      printf("\n");
    } else if (g && !strcmp(cmd, "share")) {
      char key[320], who[32] = "", hash[128] = ""; /* a key past the daemon's 127 bytes: the library refuses it */
      unsigned long long size = 0;
      if (sscanf(line, "%*s %319s %llu %31s %127s", key, &size, who, hash) < 2) size = 0;
      gml_share_opts so = {.allow_any_uid = !strcmp(who, "any")};
      uint32_t uids[100]; /* who "uids:N": N uids allowed */
      if (!strncmp(who, "uids:", 5)) {
        so.n_allow_uids = (size_t)(atoi(who + 5) > 100 ? 100 : atoi(who + 5));
        for (size_t i = 0; i < so.n_allow_uids; i++) uids[i] = 5000 + (uint32_t)i;
        so.allow_uids = uids;
      }
      if (hash[0]) so.hash = hash, so.hash_len = strlen(hash);
      rc = gml_share(g, (size_t)size, key, &so);
      if (rc) printf("err %d %s\n", rc, gml_last_error(c));
      else printf("ok\n");
    } else if (g && !strcmp(cmd, "dedup")) {
      char hash[128];
      int deduped = -1;
      if (sscanf(line, "%*s %llu %127s", &a, hash) != 2) a = 0;
      rc = gml_dedup(g, (size_t)a, hash, strlen(hash), &deduped);
      if (rc) printf("err %d %s\n", rc, gml_last_error(c));
      else printf("ok deduped %d\n", deduped);
    } else if (!strcmp(cmd, "attach") && !att) {
      char key[512], meta[64]; /* the rest of the line: a key with a space or past 127 bytes reaches gml_attach */
      size_t size = 0, ml = sizeof meta;
      const char *k = strstr(line, "attach") + strlen("attach");
      snprintf(key, sizeof key, "%s", *k == ' ' ? k + 1 : k);
      key[strcspn(key, "\n")] = 0;
      rc = gml_attach(c, key, &att, &size, meta, &ml);
      if (rc) printf("err %d %s\n", rc, gml_last_error(c));
      else printf("ok %zu\n", size);
    } else if ((att && !strcmp(cmd, "aread")) || (att && !strcmp(cmd, "awrite")) || (g && !strcmp(cmd, "gwrite"))) {
      gml_growable_info gi;
      gml_growable_info_get(cmd[0] == 'g' ? g : att, &gi);
      char *p = (char *)gi.base + a * cs;
      if (a * cs >= gi.reserved) {
        printf("err range\n");
      } else if (!strcmp(cmd, "aread")) {
        if (gml_read(c, buf, p, cs)) printf("err read\n");
        else printf("tag %llu\n", (unsigned long long)buf[0]);
      } else {
        const char *w = child_write(p);
        /* on the host backend an attached chunk's fd is read-only: not even mprotect makes it writable */
        int prot = strcmp(st.backend, "host") ? -1 : mprotect(p, cs, PROT_READ | PROT_WRITE);
        if (prot == 0) mprotect(p, cs, PROT_READ);
        printf("%s%s\n", w, prot < 0 && !strcmp(st.backend, "host") ? " protected" : "");
      }
    } else if (att && !strcmp(cmd, "adetach")) {
      rc = gml_growable_destroy(att);
      att = NULL;
      printf(rc ? "err %d\n" : "ok\n", rc);
    } else if (!strcmp(cmd, "close") || !strcmp(cmd, "exit")) {
      break;
    } else {
      printf("err bad command\n");
    }
  }
  for (int i = 0; i < nconns; i++) gml_close(conns[i]);
  gml_close(c);
  free(buf);
  printf("closed\n");
  return 0;
}
