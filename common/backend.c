/* backend.c: picks a physical backend by name. */
#include "backend.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static int backend_open_named(const char *name, int device, gml_backend **out, char *msg, size_t msglen);

/* GMLAKE_CHUNK_SIZE: another chunk than the backend's default, a multiple of
 * the device's granularity: larger is fewer mappings to move when stitching,
 * smaller is finer sharing and less rounding. */
int gml_backend_open(const char *name, int device, gml_backend **out, char *msg, size_t msglen) {
  int rc = backend_open_named(name, device, out, msg, msglen);
  const char *env = getenv("GMLAKE_CHUNK_SIZE");
  uint64_t cs;
  if (rc == 0 && env && *env) {
    if (gml_backend_set_chunk_size(*out, gml_parse_size(env, 0, &cs) == 0 ? cs : 0) == 0) {
      size_t n = strlen(msg);
      if (n < msglen) snprintf(msg + n, msglen - n, "; chunks of %zu bytes (GMLAKE_CHUNK_SIZE)", (*out)->chunk_size);
    } else {
      GML_WARN("GMLAKE_CHUNK_SIZE=%s ignored: a size that is a multiple of %zu bytes (at most 1 GiB) was expected; "
               "chunks of %zu bytes", env, (*out)->granularity, (*out)->chunk_size);
    }
  }
  return rc;
}

int gml_backend_set_chunk_size(gml_backend *be, uint64_t cs) {
  if (!cs || cs % be->granularity || cs > (1ull << 30)) return GML_EINVAL;
  be->chunk_size = (size_t)cs;
  return 0;
}

static int backend_open_named(const char *name, int device, gml_backend **out, char *msg, size_t msglen) {
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
