/* ctl_paths.h: `gmlakectl paths`: one GPU's host<->device copy paths, as the
 * copy engine of libgmlake-client probes them (its own link, and each peer
 * GPU's link followed by a P2P hop), with their measured bandwidth and the
 * shares a large copy is split in. */
#ifndef GML_CTL_PATHS_H
#define GML_CTL_PATHS_H
#include <stddef.h>

/* Opens device `device` (an index) embedded (the lake's daemon is not asked:
 * the probe's buffers come from the driver and go back at once), probes the
 * paths and prints them (json: one object). Returns 0, or a GML_E* code with
 * why in err. */
int gmli_ctl_paths(int device, int json, char *err, size_t errlen);
#endif
