/* trust.c: the daemon's answers to the trust model's two questions
 * (broker.h, broker_trust; README "Trust model"): may a process of uid still
 * reach its chunks, and zero a chunk's content.
 *
 * A uid's processes: any process whose real, effective, saved or filesystem
 * uid is it. The daemon cannot revoke a handle it passed out: a client may
 * have dup'ed the fds, a forked child keeps its mappings after its parent's
 * connection (and pid) is gone, so "the client's process exited" is not
 * enough; "no process of that uid is left" is. A /proc scan, made only when
 * a lease finds no free chunk of its own uid or clean, and found one of
 * another uid. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "daemon.h"
#include <dirent.h>
#include <stdio.h>

static int uid_gone(void *arg, uint32_t uid) {
  (void)arg;
  DIR *dir = opendir("/proc");
  if (!dir) return 0; /* cannot tell: as if alive (the chunk is made anew) */
  int found = 0;
  struct dirent *e;
  while (!found && (e = readdir(dir))) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%.20s/status", e->d_name);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
      unsigned u[4];
      if (sscanf(line, "Uid: %u %u %u %u", &u[0], &u[1], &u[2], &u[3]) == 4) {
        found = u[0] == uid || u[1] == uid || u[2] == uid || u[3] == uid;
        break;
      }
    }
    if (f) fclose(f);
  }
  closedir(dir);
  return !found;
}

static int scrub_chunk(void *arg, uint32_t idx) {
  gmld *d = arg;
  return d->be->ops->chunk_scrub(d->be, d->lk.chunks[idx].phys);
}

/* A backend without chunk_scrub (cuda) gets every such chunk made anew. */
void trust_install(gmld *d) {
  d->br.trust = (broker_trust){.uid_gone = uid_gone, .scrub = d->be->ops->chunk_scrub ? scrub_chunk : NULL, .arg = d};
}
