/* paths.h: multi-path copies' policy (issue 30, step 2): which of a GPU's
 * copy paths to use together, and the share of a copy each takes, from a
 * probe. Path 0 is the GPU's own link; path i > 0 goes through peer GPU i's
 * link and a P2P hop. The probe measures each path alone, then adds the
 * others one at a time, fastest first, keeping one only where the paths
 * together gain: two paths behind one PCIe switch or root complex move no
 * more than one, so the second is dropped, never counted twice. Pure policy:
 * the measurements are a callback, so it is tested with modelled topologies;
 * the mechanism that carries a plan out (peer staging, P2P) is not built yet. */
#ifndef GML_PATHS_H
#define GML_PATHS_H

#define GMLI_PATHS_MAX 8

typedef struct gmli_path_plan {
  int n;                        /* paths kept: path 0 first */
  int path[GMLI_PATHS_MAX];     /* their numbers */
  double share[GMLI_PATHS_MAX]; /* the fraction of a copy each takes (summing to 1) */
  double alone[GMLI_PATHS_MAX]; /* GB/s of every probed path alone (index: path number; <= 0: it failed) */
  double together;              /* GB/s of the kept ones at once, as measured */
} gmli_path_plan;

/* GB/s of one copy split over paths set[0..count) at once, path set[i] taking share[i] of it; <= 0 when
 * a path failed. */
typedef double (*gmli_path_measure)(const int *set, const double *share, int count, void *ctx);

/* The plan for npaths paths (1..GMLI_PATHS_MAX): a path is kept where adding it gains at least min_gain
 * (0.1: 10%) over the paths kept before it. 0, or GML_EINVAL (npaths), or GML_EBACKEND where path 0
 * itself fails (the plan is then path 0 alone, share 1). */
int gmli_paths_probe(int npaths, gmli_path_measure measure, void *ctx, double min_gain, gmli_path_plan *out);
#endif
