/* ctl_tables.c: gmlakectl's human tables of a control reply; the numbers
 * that have no table of their own are printed from the descriptors
 * (common/statsview.c). */
#include "ctl_tables.h"
#include "statsview.h"
#include "util.h"
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* ---------- human tables ---------- */

void ctl_print_clients(const Gmlake__CtlReply *r) {
  time_t now = time(NULL);
  uint64_t uncounted = 0;
  size_t nuncounted = 0;
  printf("%-8s %-6s %-16s %12s %12s %12s %12s %8s %12s %12s  %s\n", "PID", "UID", "NAME", "LEASED", "ALLOCATED",
         "CACHED", "QUOTA", "SINCE", "GROWABLE", "SHARED", "CGROUP / PAUSED (SAVED) / UNCOUNTED");
  for (size_t i = 0; i < r->n_clients; i++) {
    const Gmlake__ClientInfo *c = r->clients[i];
    char a[32], b[32], d[32], q[32], g[32], sh[32];
    long age = (long)(now - (time_t)c->since);
    char since[32];
    if (age < 3600) snprintf(since, sizeof since, "%ldm%02lds", age / 60, age % 60);
    else snprintf(since, sizeof since, "%ldh%02ldm", age / 3600, age % 3600 / 60);
    char pz[96] = "";
    if (c->paused) {
      char p1[32], p2[32];
      snprintf(pz, sizeof pz, "  paused %s (saved %s)", gmli_format_bytes(c->paused, p1, 32),
               gmli_format_bytes(c->paused_saved, p2, 32));
    }
    char uc[48] = "";
    if (c->uncounted) { /* its allocated may exceed its leased by this much */
      char u1[32];
      snprintf(uc, sizeof uc, "  uncounted %s", gmli_format_bytes(c->uncounted, u1, 32));
      uncounted += c->uncounted, nuncounted++;
    }
    char pid[16] = "-"; /* 0: another user's process, not named to us */
    if (c->pid) snprintf(pid, sizeof pid, "%d", c->pid);
    printf("%-8s %-6u %-16.16s %12s %12s %12s %12s %8s %12s %12s  %s%s%s", pid, c->uid,
           c->pid ? c->name : "(another user)", gmli_format_bytes(c->leased_bytes, a, 32),
           gmli_format_bytes(c->allocated, b, 32), gmli_format_bytes(c->cached, d, 32),
           c->quota_bytes ? gmli_format_bytes(c->quota_bytes, q, 32) : "-", since,
           gmli_format_bytes(c->growable_mapped, g, 32), gmli_format_bytes(c->shared_bytes, sh, 32),
           c->cgroup && c->cgroup[0] ? c->cgroup : "-", pz, uc);
    gmli_print_client_other(c);
    putchar('\n');
  }
  if (!r->n_clients) printf("(no clients)\n");
  if (uncounted) {
    char u[32];
    printf("uncounted: %s on the device held by %zu client(s), not counted by the lake (a restarted daemon took no "
           "hand-over of it): in no limit or quota, theirs until they exit\n",
           gmli_format_bytes(uncounted, u, sizeof u), nuncounted);
  }
}

void ctl_print_chunks(const Gmlake__CtlReply *r) {
  /* one character a chunk, 64 a row: '.' free, a letter per client, '#' parked */
  int pids[52], npids = 0;
  printf(
      "%zu chunks of %llu MiB ('.' free, '#' parked by a process that left, 'S' shared, 'o' another user's, letters: "
      "clients)\n",
      r->n_chunks, (unsigned long long)(r->stats ? r->stats->chunk_size >> 20 : 0));
  for (size_t i = 0; i < r->n_chunks; i++) {
    int pid = r->chunks[i]->owner_pid;
    char ch = '.';
    if (pid == -2) ch = 'S';
    else if (pid == -3) ch = 'o';
    else if (pid < 0) ch = '#';
    else if (pid > 0) {
      int k = 0;
      while (k < npids && pids[k] != pid) k++;
      if (k == npids && npids < 52) pids[npids++] = pid;
      ch = k < 26 ? (char)('A' + k) : k < 52 ? (char)('a' + k - 26) : '?';
    }
    putchar(ch);
    if (i % 64 == 63 || i + 1 == r->n_chunks) putchar('\n');
  }
  for (int k = 0; k < npids; k++) printf("  %c = pid %d\n", k < 26 ? 'A' + k : 'a' + k - 26, pids[k]);
}

/* Shares: by hand, for --json too (the descriptor printer leaves repeated fields out: the pids). */
void ctl_print_shares(const Gmlake__CtlReply *r, int json) {
  printf(json ? "[" : "%-24s %12s %7s %8s %6s  %-10s %s\n", "KEY", "SIZE", "CHUNKS", "PUB.PID", "UID", "ALLOWS",
         "MAPPED BY (pids)");
  for (size_t i = 0; i < r->n_shares; i++) {
    const Gmlake__ShareInfo *s = r->shares[i];
    char sz[32], allows[32], pids[256] = "";
    for (size_t k = 0, o = 0; k < s->n_mapper_pids && o < sizeof pids - 12; k++)
      o += (size_t)snprintf(pids + o, sizeof pids - o, "%s%d", k ? (json ? "," : " ") : "", s->mapper_pids[k]);
    if (s->allow_any_uid) snprintf(allows, sizeof allows, "any uid");
    else if (s->n_allow_uids) snprintf(allows, sizeof allows, "uid +%zu", s->n_allow_uids);
    else snprintf(allows, sizeof allows, "same uid");
    char pub[16] = "-"; /* 0: another user's process, not named to us */
    if (s->publisher_pid) snprintf(pub, sizeof pub, "%d", s->publisher_pid);
    if (json) { /* a key may hold '"' and '\\' (any printable ASCII): escaped, as every string */
      printf("%s{\"key\":", i ? "," : "");
      gmli_print_json_string(stdout, s->key);
      printf(",\"size\":%llu,\"chunks\":%llu,\"publisher_pid\":%d,\"publisher_uid\":%u,"
             "\"mapper_pids\":[%s],\"allow_any_uid\":%s,\"since\":%.3f}",
             (unsigned long long)s->size, (unsigned long long)s->chunks, s->publisher_pid, s->publisher_uid, pids,
             s->allow_any_uid ? "true" : "false", s->since);
    } else
      printf("%-24.24s %12s %7llu %8s %6u  %-10s %s\n", s->key, gmli_format_bytes(s->size, sz, 32),
             (unsigned long long)s->chunks, pub, s->publisher_uid, allows, pids);
  }
  if (json) printf("]\n");
  else if (!r->n_shares) printf("(no shares)\n");
}
