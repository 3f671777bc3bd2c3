/* options.c: the one place that reads the environment (options.h). */
#include "options.h"
#include "gmlake.h"
#include "log.h"
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *name, *def, *accepts;
} env_vars[GML_ENV_COUNT] = {
#define GML_ENV_ROW(id, name, type, def, who, help) [GML_ENV_##id] = {name, def, type},
    GML_ENV_VARS(GML_ENV_ROW)
#undef GML_ENV_ROW
};

const char *gml_env(gml_env_id id) {
  const char *v = (unsigned)id < GML_ENV_COUNT ? getenv(env_vars[id].name) : NULL;
  return v && *v ? v : NULL;
}
const char *gml_env_name(gml_env_id id) { return (unsigned)id < GML_ENV_COUNT ? env_vars[id].name : "?"; }
const char *gml_env_default(gml_env_id id) { return (unsigned)id < GML_ENV_COUNT ? env_vars[id].def : ""; }
const char *gml_env_accepts(gml_env_id id) { return (unsigned)id < GML_ENV_COUNT ? env_vars[id].accepts : ""; }

int gml_env_flag(gml_env_id id, const char *value, int def) {
  if (!value || !*value) return def;
  if (!strcmp(value, "0") || !strcmp(value, "1")) return value[0] == '1';
  GML_WARN("%s=%s: 0 or 1 was expected; using %d", gml_env_name(id), value, def);
  return def;
}

void gml_options_from_env(gml_options *o) {
  memset(o, 0, sizeof *o);
  o->backend = gml_env(GML_ENV_BACKEND);
  o->backend_named = o->backend != NULL;
  if (!o->backend) o->backend = gml_env_default(GML_ENV_BACKEND);
  const char *m = gml_env(GML_ENV_MODE);
  o->mode_text = m;
  if (m) o->mode = !strcmp(m, "daemon") ? GML_MODE_DAEMON : !strcmp(m, "embedded") ? GML_MODE_EMBEDDED : -1;
  o->socket = gml_env(GML_ENV_SOCKET);
  o->limit = gml_env(GML_ENV_LIMIT);
  o->va_size = gml_env(GML_ENV_VA_SIZE);
  o->chunk_size = gml_env(GML_ENV_CHUNK_SIZE);
  o->libcuda = gml_env(GML_ENV_LIBCUDA);
  if (!o->libcuda) o->libcuda = gml_env_default(GML_ENV_LIBCUDA);
  o->timing = gml_env(GML_ENV_TIMING);
  o->stream_map = gml_env(GML_ENV_STREAM_MAP);
  o->headroom = gml_env(GML_ENV_HEADROOM);
  o->guard = gml_env(GML_ENV_GUARD);
  o->guard_grain = gml_env(GML_ENV_GUARD_GRAIN);
  o->guard_backtrace = gml_env(GML_ENV_GUARD_BACKTRACE);
  o->borrow = gml_env(GML_ENV_BORROW);
  o->borrow_ratio = gml_env(GML_ENV_BORROW_RATIO);
  o->borrow_max = gml_env(GML_ENV_BORROW_MAX);
}
