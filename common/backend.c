/* backend.c: the table of physical backends, and opening one by name. */
#include "backend.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* In the order "auto" tries them. skipped: what auto says when it passes
 * over one; default_limit: a daemon's limit when none is configured;
 * resolve and uuid: its devices named without opening them. */
static const struct backend_entry {
  const char *name;
  gml_backend_open_fn open;
  const char *skipped;
  const char *default_limit;
  gml_backend_resolve_fn resolve;
  gml_backend_uuid_fn uuid;
} backends[] = {
    {"cuda", gml_backend_cuda_open, "no usable GPU", "90%", gml_backend_cuda_resolve, gml_backend_cuda_uuid},
    {"host", gml_backend_host_open, "", "50%", gml_backend_host_resolve, gml_backend_host_uuid},
};

static const struct backend_entry *backend_entry(const char *name) {
  for (size_t i = 0; i < GML_ARRAY_LEN(backends); i++)
    if (name && !strcmp(name, backends[i].name)) return &backends[i];
  return NULL;
}

int gml_backend_known(const char *name) { return name && (!strcmp(name, "auto") || backend_entry(name)); }

const char *gml_backend_names(void) {
  static char names[128];
  if (!names[0]) {
    size_t n = (size_t)snprintf(names, sizeof names, "auto");
    for (size_t i = 0; i < GML_ARRAY_LEN(backends) && n < sizeof names; i++)
      n += (size_t)snprintf(names + n, sizeof names - n, ", %s", backends[i].name);
  }
  return names;
}

const char *gml_backend_default_limit(const gml_backend *be) {
  const struct backend_entry *e = backend_entry(be->name);
  return e ? e->default_limit : "50%";
}

static int backend_open_auto(int device, const gml_backend_opts *opts, gml_backend **out, char *msg, size_t msglen) {
  char why[512] = "";
  int rc = GML_ENODEV;
  for (size_t i = 0; i < GML_ARRAY_LEN(backends); i++) {
    char m[256] = "";
    rc = backends[i].open(device, opts, out, m, sizeof m);
    if (rc == 0) {
      if (why[0]) snprintf(msg, msglen, "backend auto: picked %s (%s)", backends[i].name, why);
      else snprintf(msg, msglen, "backend auto: picked %s (device %d)", backends[i].name, device);
      return 0;
    }
    if (!why[0]) snprintf(why, sizeof why, "%s: %s", backends[i].skipped, m);
    snprintf(msg, msglen, "%s", m);
  }
  return rc;
}

int gml_backend_resolve(const char *name, const char *spec, const gml_backend_opts *opts, const char **picked,
                        int *device, char *msg, size_t msglen) {
  int is_auto = !name || !strcmp(name, "auto");
  const struct backend_entry *e = is_auto ? NULL : backend_entry(name);
  if (!is_auto && !e) {
    snprintf(msg, msglen, "unknown backend '%s' (%s)", name, gml_backend_names());
    return GML_EINVAL;
  }
  char why[512] = "";
  for (size_t i = 0; i < GML_ARRAY_LEN(backends); i++) {
    if (e && e != &backends[i]) continue;
    char m[256] = "";
    if (backends[i].resolve(spec, opts, device, m, sizeof m) == 0) {
      *picked = backends[i].name;
      if (is_auto && why[0]) snprintf(msg, msglen, "backend auto: picked %s for device %s (%s)", backends[i].name, spec, why);
      else msg[0] = 0;
      return 0;
    }
    size_t n = strlen(why);
    snprintf(why + n, sizeof why - n, "%s%s: %s", n ? "; " : "", backends[i].name, m);
  }
  snprintf(msg, msglen, "no device %s: %s", spec, why);
  return GML_ENODEV;
}

int gml_backend_device_uuid(const char *name, int device, const gml_backend_opts *opts, char *uuid) {
  int is_auto = !name || !strcmp(name, "auto");
  const struct backend_entry *e = is_auto ? NULL : backend_entry(name);
  uuid[0] = 0;
  if (!is_auto && !e) return GML_ENODEV;
  for (size_t i = 0; i < GML_ARRAY_LEN(backends); i++) {
    char m[256];
    if ((!e || e == &backends[i]) && backends[i].uuid(device, opts, uuid, m, sizeof m) == 0) return 0;
  }
  uuid[0] = 0;
  return GML_ENODEV;
}

/* opts->chunk_size (GMLAKE_CHUNK_SIZE): another chunk than the backend's
 * default, a multiple of the device's granularity: larger is fewer mappings
 * to move when stitching, smaller is finer sharing and less rounding. */
int gml_backend_open(const char *name, int device, const gml_backend_opts *opts, gml_backend **out, char *msg,
                     size_t msglen) {
  const struct backend_entry *e = NULL;
  int rc;
  if (!name || !strcmp(name, "auto")) {
    rc = backend_open_auto(device, opts, out, msg, msglen);
  } else if ((e = backend_entry(name))) {
    rc = e->open(device, opts, out, msg, msglen);
  } else {
    snprintf(msg, msglen, "unknown backend '%s' (%s)", name, gml_backend_names());
    return GML_EINVAL;
  }
  const char *cs_text = opts ? opts->chunk_size : NULL;
  uint64_t cs;
  if (rc == 0 && cs_text && *cs_text) {
    if (gml_backend_set_chunk_size(*out, gml_parse_size(cs_text, 0, &cs) == 0 ? cs : 0) == 0) {
      size_t n = strlen(msg);
      if (n < msglen) snprintf(msg + n, msglen - n, "; chunks of %zu bytes (GMLAKE_CHUNK_SIZE)", (*out)->chunk_size);
    } else {
      GML_WARN("GMLAKE_CHUNK_SIZE=%s ignored: a size that is a multiple of %zu bytes (at most 1 GiB) was expected; "
               "chunks of %zu bytes", cs_text, (*out)->granularity, (*out)->chunk_size);
    }
  }
  return rc;
}

int gml_backend_set_chunk_size(gml_backend *be, uint64_t cs) {
  if (!cs || cs % be->granularity || cs > (1ull << 30)) return GML_EINVAL;
  be->chunk_size = (size_t)cs;
  return 0;
}

void gml_backend_close(gml_backend *be) {
  if (be) be->ops->destroy(be);
}
