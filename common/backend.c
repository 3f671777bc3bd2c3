/* backend.c: picks a physical backend by name. */
#include "backend.h"
#include "gmlake.h"
#include "log.h"
#include <stdio.h>
#include <string.h>

int gml_backend_open(const char *name, int device, gml_backend **out, char *msg, size_t msglen) {
  if (!name || !strcmp(name, "auto")) {
    char why[256] = "";
    if (gml_backend_cuda_open(device, out, why, sizeof why) == 0) {
      snprintf(msg, msglen, "backend auto: picked cuda (device %d)", device);
      return 0;
    }
    int rc = gml_backend_host_open(device, out, msg, msglen);
    if (rc == 0) snprintf(msg, msglen, "backend auto: picked host (no usable GPU: %s)", why);
    return rc;
  }
  if (!strcmp(name, "cuda")) return gml_backend_cuda_open(device, out, msg, msglen);
  if (!strcmp(name, "host")) return gml_backend_host_open(device, out, msg, msglen);
  snprintf(msg, msglen, "unknown backend '%s' (auto, cuda or host)", name);
  return GML_EINVAL;
}

void gml_backend_close(gml_backend *be) {
  if (be) be->ops->destroy(be);
}
