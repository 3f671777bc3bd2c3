/* paths.c: which copy paths a multi-path copy uses, and in what shares (paths.h). */
#include "paths.h"
#include "gmlake.h"
#include <string.h>

/* Shares proportional to each path's bandwidth alone: each path then takes as long as the others. */
static void shares(const gmli_path_plan *p, const int *set, int count, double *share) {
  double sum = 0;
  for (int i = 0; i < count; i++) sum += p->alone[set[i]];
  for (int i = 0; i < count; i++) share[i] = p->alone[set[i]] / sum;
}

int gmli_paths_probe(int npaths, gmli_path_measure measure, void *ctx, double min_gain, gmli_path_plan *out) {
  memset(out, 0, sizeof *out);
  out->n = 1, out->share[0] = 1; /* path 0 alone, whatever happens */
  if (npaths < 1 || npaths > GMLI_PATHS_MAX || !measure) return GML_EINVAL;
  double one = 1;
  for (int i = 0; i < npaths; i++) out->alone[i] = measure(&i, &one, 1, ctx);
  out->together = out->alone[0];
  if (out->alone[0] <= 0) return GML_EBACKEND;
  int order[GMLI_PATHS_MAX], m = 0;
  for (int i = 1; i < npaths; i++) { /* the others that work, fastest first */
    if (out->alone[i] <= 0) continue;
    int at = m++;
    while (at > 0 && out->alone[order[at - 1]] < out->alone[i]) order[at] = order[at - 1], at--;
    order[at] = i;
  }
  for (int k = 0; k < m; k++) {
    int set[GMLI_PATHS_MAX];
    double share[GMLI_PATHS_MAX];
    memcpy(set, out->path, sizeof(int) * (size_t)out->n);
    set[out->n] = order[k];
    shares(out, set, out->n + 1, share);
    double bw = measure(set, share, out->n + 1, ctx);
    if (bw < out->together * (1 + min_gain)) continue; /* a shared link, or a path that failed with the others */
    out->path[out->n++] = order[k];
    out->together = bw;
  }
  shares(out, out->path, out->n, out->share);
  return 0;
}
