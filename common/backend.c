/* backend.c: the table of physical backends, and opening one by name. */
#include "backend.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The backends, in the order "auto" tries them: name, what auto says when
 * it passes over it, a daemon's limit on it when none is configured, and
 * its capabilities. Backend NAME's file defines gml_backend_NAME_open, its
 * devices' names without opening them (_resolve for a daemon's --device,
 * _uuid for a process's ordinal) and nothing else outside it. */
#define BACKEND_TABLE(X)                                                                                               \
  X(cuda, "no usable GPU", "90%",                                                                                      \
    GML_BACKEND_DEVICE_MEMORY | GML_BACKEND_DRIVER_STREAMS | GML_BACKEND_PEER_COPY | GML_BACKEND_COPY_TIMING)          \
  X(host, "", "50%",                                                                                                   \
    GML_BACKEND_FAULT_SIGNALS | GML_BACKEND_REOPEN_READ_ONLY | GML_BACKEND_RESOLVES_OFFLINE | GML_BACKEND_COPY_BATCH | \
        GML_BACKEND_PEER_COPY)

#define BACKEND_DECLARE(n, skipped, limit, caps)                                                                       \
  int gmli_backend_##n##_open(int device, const gml_backend_opts *opts, gml_backend **out, char *msg, size_t msglen);  \
  int gmli_backend_##n##_resolve(const char *spec, const gml_backend_opts *opts, int *device, char *msg,               \
                                 size_t msglen);                                                                       \
  int gmli_backend_##n##_uuid(int device, const gml_backend_opts *opts, char *uuid, char *msg, size_t msglen);
BACKEND_TABLE(BACKEND_DECLARE)
#define BACKEND_LINE(n, skipped, limit, caps)                                                                          \
  {#n, gmli_backend_##n##_open, skipped, limit, gmli_backend_##n##_resolve, gmli_backend_##n##_uuid, caps},

#define BACKEND_COUNT(n, skipped, limit, caps) +1

/* The table and, after it, those registered (gmli_backend_register). */
#define MAX_BACKENDS (0 BACKEND_TABLE(BACKEND_COUNT) + 8)
static gml_backend_entry backends[MAX_BACKENDS] = {BACKEND_TABLE(BACKEND_LINE)};
static size_t nbackends = 0 BACKEND_TABLE(BACKEND_COUNT);
static char names[128]; /* gmli_backend_names, made on first use */

const gml_backend_entry *gmli_backend_find(const char *name) {
  for (size_t i = 0; i < nbackends; i++)
    if (name && !strcmp(name, backends[i].name)) return &backends[i];
  return NULL;
}

int gmli_backend_register(const gml_backend_entry *e) {
  if (!e || !e->name || !e->open || !strcmp(e->name, "auto")) return GML_EINVAL;
  gml_backend_entry *old = (gml_backend_entry *)gmli_backend_find(e->name);
  if (!old && nbackends == MAX_BACKENDS) return GML_ENOMEM;
  *(old ? old : &backends[nbackends++]) = *e;
  names[0] = 0;
  return 0;
}

unsigned gmli_backend_caps_named(const char *name) {
  const gml_backend_entry *e = gmli_backend_find(name);
  return e ? e->caps : 0;
}

int gmli_backend_known(const char *name) { return name && (!strcmp(name, "auto") || gmli_backend_find(name)); }

const char *gmli_backend_names(void) {
  if (!names[0]) {
    size_t n = (size_t)snprintf(names, sizeof names, "auto");
    for (size_t i = 0; i < nbackends && n < sizeof names; i++)
      n += (size_t)snprintf(names + n, sizeof names - n, ", %s", backends[i].name);
  }
  return names;
}

const char *gmli_backend_default_limit(const gml_backend *be) {
  const gml_backend_entry *e = gmli_backend_find(be->name);
  return e ? e->default_limit : "50%";
}

static int backend_open_auto(int device, const gml_backend_opts *opts, gml_backend **out, char *msg, size_t msglen) {
  char why[512] = "";
  int rc = GML_ENODEV;
  for (size_t i = 0; i < nbackends; i++) {
    char m[256] = "";
    rc = backends[i].open(device, opts, out, m, sizeof m);
    if (rc == 0) {
      (*out)->caps |= backends[i].caps;
      if (why[0]) snprintf(msg, msglen, "backend auto: picked %s (%s)", backends[i].name, why);
      else snprintf(msg, msglen, "backend auto: picked %s (device %d)", backends[i].name, device);
      return 0;
    }
    if (!why[0]) snprintf(why, sizeof why, "%s: %s", backends[i].skipped, m);
    snprintf(msg, msglen, "%s", m);
  }
  return rc;
}

int gmli_backend_resolve(const char *name, const char *spec, const gml_backend_opts *opts, const char **picked,
                         int *device, char *msg, size_t msglen) {
  int is_auto = !name || !strcmp(name, "auto");
  const gml_backend_entry *e = is_auto ? NULL : gmli_backend_find(name);
  if (!is_auto && !e) {
    snprintf(msg, msglen, "unknown backend '%s' (%s)", name, gmli_backend_names());
    return GML_EINVAL;
  }
  char why[512] = "";
  for (size_t i = 0; i < nbackends; i++) {
    if (e && e != &backends[i]) continue;
    char m[256] = "";
    if (backends[i].resolve(spec, opts, device, m, sizeof m) == 0) {
      *picked = backends[i].name;
      if (is_auto && why[0])
        snprintf(msg, msglen, "backend auto: picked %s for device %s (%s)", backends[i].name, spec, why);
      else msg[0] = 0;
      return 0;
    }
    size_t n = strlen(why);
    snprintf(why + n, sizeof why - n, "%s%s: %s", n ? "; " : "", backends[i].name, m);
  }
  snprintf(msg, msglen, "no device %s: %s", spec, why);
  return GML_ENODEV;
}

int gmli_backend_device_uuid(const char *name, int device, const gml_backend_opts *opts, char *uuid) {
  int is_auto = !name || !strcmp(name, "auto");
  const gml_backend_entry *e = is_auto ? NULL : gmli_backend_find(name);
  uuid[0] = 0;
  if (!is_auto && !e) return GML_ENODEV;
  for (size_t i = 0; i < nbackends; i++) {
    char m[256];
    if ((!e || e == &backends[i]) && backends[i].uuid(device, opts, uuid, m, sizeof m) == 0) return 0;
  }
  uuid[0] = 0;
  return GML_ENODEV;
}

/* opts->chunk_size (GMLAKE_CHUNK_SIZE): another chunk than the backend's
 * default, a multiple of the device's granularity: larger is fewer mappings
 * to move when stitching, smaller is finer sharing and less rounding. */
int gmli_backend_open(const char *name, int device, const gml_backend_opts *opts, gml_backend **out, char *msg,
                      size_t msglen) {
  const gml_backend_entry *e = NULL;
  int rc;
  if (!name || !strcmp(name, "auto")) {
    rc = backend_open_auto(device, opts, out, msg, msglen);
  } else if ((e = gmli_backend_find(name))) {
    rc = e->open(device, opts, out, msg, msglen);
    if (rc == 0) (*out)->caps |= e->caps; /* and what the backend found at open (GML_BACKEND_COPY_BATCH) */
  } else {
    snprintf(msg, msglen, "unknown backend '%s' (%s)", name, gmli_backend_names());
    return GML_EINVAL;
  }
  const char *cs_text = opts ? opts->chunk_size : NULL;
  uint64_t cs;
  if (rc == 0 && cs_text && *cs_text) {
    if (gmli_backend_set_chunk_size(*out, gmli_parse_size(cs_text, 0, &cs) == 0 ? cs : 0) == 0) {
      size_t n = strlen(msg);
      if (n < msglen) snprintf(msg + n, msglen - n, "; chunks of %zu bytes (GMLAKE_CHUNK_SIZE)", (*out)->chunk_size);
    } else {
      GML_WARN("GMLAKE_CHUNK_SIZE=%s ignored: a size that is a multiple of %zu bytes (at most 1 GiB) was expected; "
               "chunks of %zu bytes",
               cs_text, (*out)->granularity, (*out)->chunk_size);
    }
  }
  return rc;
}

int gmli_backend_set_chunk_size(gml_backend *be, uint64_t cs) {
  if (!cs || cs % be->granularity || cs > (1ull << 30)) return GML_EINVAL;
  be->chunk_size = (size_t)cs;
  return 0;
}

void gmli_backend_close(gml_backend *be) {
  if (be) be->ops->destroy(be);
}
