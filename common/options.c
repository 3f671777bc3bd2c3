/* options.c: the one place that reads the environment (options.h). */
#include "options.h"
#include "gmlake.h"
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *name, *def;
} env_vars[GML_ENV_COUNT] = {
#define GML_ENV_ROW(id, name, type, def, who, help) [GML_ENV_##id] = {name, def},
    GML_ENV_VARS(GML_ENV_ROW)
#undef GML_ENV_ROW
};

const char *gml_env(gml_env_id id) { return (unsigned)id < GML_ENV_COUNT ? getenv(env_vars[id].name) : NULL; }
const char *gml_env_name(gml_env_id id) { return (unsigned)id < GML_ENV_COUNT ? env_vars[id].name : "?"; }
const char *gml_env_default(gml_env_id id) { return (unsigned)id < GML_ENV_COUNT ? env_vars[id].def : ""; }

void gml_options_from_env(gml_options *o) {
  memset(o, 0, sizeof *o);
  o->backend = gml_env(GML_ENV_BACKEND);
  o->backend_named = o->backend != NULL;
  if (!o->backend) o->backend = gml_env_default(GML_ENV_BACKEND);
  const char *m = gml_env(GML_ENV_MODE);
  if (m) o->mode = !strcmp(m, "daemon") ? GML_MODE_DAEMON : !strcmp(m, "embedded") ? GML_MODE_EMBEDDED : 0;
  o->socket = gml_env(GML_ENV_SOCKET);
  o->limit = gml_env(GML_ENV_LIMIT);
  o->va_size = gml_env(GML_ENV_VA_SIZE);
  o->chunk_size = gml_env(GML_ENV_CHUNK_SIZE);
  o->libcuda = gml_env(GML_ENV_LIBCUDA);
  if (!o->libcuda) o->libcuda = gml_env_default(GML_ENV_LIBCUDA);
  const char *t = gml_env(GML_ENV_TIMING);
  o->timing = t && atoi(t) > 0;
  const char *sm = gml_env(GML_ENV_STREAM_MAP);
  o->stream_map = sm && atoi(sm) > 0;
  o->headroom = gml_env(GML_ENV_HEADROOM);
  o->guard = gml_env(GML_ENV_GUARD);
  o->guard_grain = gml_env(GML_ENV_GUARD_GRAIN);
  o->guard_backtrace = gml_env(GML_ENV_GUARD_BACKTRACE);
  o->borrow = gml_env(GML_ENV_BORROW);
  o->borrow_ratio = gml_env(GML_ENV_BORROW_RATIO);
  o->borrow_max = gml_env(GML_ENV_BORROW_MAX);
}
