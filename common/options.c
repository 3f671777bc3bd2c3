/* options.c: the one place that reads the environment (options.h), and
 * what gml_set_option says in its place. */
#include "options.h"
#include "gmlake.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *name, *def, *accepts, *who;
} env_vars[GML_ENV_COUNT] = {
#define GML_ENV_ROW(id, name, type, def, who, help) [GML_ENV_##id] = {name, def, type, who},
    GML_ENV_VARS(GML_ENV_ROW)
#undef GML_ENV_ROW
};

/* gml_set_option's values, newest first. An older one is never freed: a
 * thread of the library may still hold what gmli_env returned. */
typedef struct set_value {
  struct set_value *older;
  int unset; /* gml_set_option(name, NULL): the environment's again */
  char text[];
} set_value;
static set_value *set_values[GML_ENV_COUNT];
static pthread_mutex_t set_lock = PTHREAD_MUTEX_INITIALIZER;

const char *gmli_env(gml_env_id id) {
  if ((unsigned)id >= GML_ENV_COUNT) return NULL;
  const set_value *s = __atomic_load_n(&set_values[id], __ATOMIC_ACQUIRE);
  const char *v = s && !s->unset ? s->text : getenv(env_vars[id].name);
  return v && *v ? v : NULL;
}

/* The library's own options only: a variable another program reads too
 * (CUDA_VISIBLE_DEVICES: the driver) would mean one thing to each. */
int gml_set_option(const char *name, const char *value) {
  for (int id = 0; id < GML_ENV_COUNT; id++) {
    if (!name || strcmp(name, env_vars[id].name) || strncmp(name, "GMLAKE_", 7) ||
        (!strstr(env_vars[id].who, "library") && strcmp(env_vars[id].who, "all")))
      continue;
    size_t n = value ? strlen(value) + 1 : 1;
    set_value *s = malloc(sizeof *s + n);
    if (!s) return GML_ENOMEM;
    s->unset = !value;
    memcpy(s->text, value ? value : "", n);
    pthread_mutex_lock(&set_lock);
    s->older = set_values[id];
    __atomic_store_n(&set_values[id], s, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&set_lock);
    return 0;
  }
  return GML_EINVAL;
}
const char *gmli_env_name(gml_env_id id) { return (unsigned)id < GML_ENV_COUNT ? env_vars[id].name : "?"; }
const char *gmli_env_default(gml_env_id id) { return (unsigned)id < GML_ENV_COUNT ? env_vars[id].def : ""; }
const char *gmli_env_accepts(gml_env_id id) { return (unsigned)id < GML_ENV_COUNT ? env_vars[id].accepts : ""; }

void gmli_options_from_env(gml_options *o) {
  memset(o, 0, sizeof *o);
  o->backend = gmli_env(GML_ENV_BACKEND);
  o->backend_named = o->backend != NULL;
  if (!o->backend) o->backend = gmli_env_default(GML_ENV_BACKEND);
  const char *m = gmli_env(GML_ENV_MODE);
  o->mode_text = m;
  if (m) o->mode = !strcmp(m, "daemon") ? GML_MODE_DAEMON : !strcmp(m, "embedded") ? GML_MODE_EMBEDDED : -1;
  o->socket = gmli_env(GML_ENV_SOCKET);
  o->limit = gmli_env(GML_ENV_LIMIT);
  o->va_size = gmli_env(GML_ENV_VA_SIZE);
  o->chunk_size = gmli_env(GML_ENV_CHUNK_SIZE);
  o->libcuda = gmli_env(GML_ENV_LIBCUDA);
  if (!o->libcuda) o->libcuda = gmli_env_default(GML_ENV_LIBCUDA);
  o->timing = gmli_env(GML_ENV_TIMING);
  o->stream_map = gmli_env(GML_ENV_STREAM_MAP);
  o->headroom = gmli_env(GML_ENV_HEADROOM);
  o->guard = gmli_env(GML_ENV_GUARD);
  o->guard_grain = gmli_env(GML_ENV_GUARD_GRAIN);
  o->guard_backtrace = gmli_env(GML_ENV_GUARD_BACKTRACE);
  o->borrow = gmli_env(GML_ENV_BORROW);
  o->borrow_ratio = gmli_env(GML_ENV_BORROW_RATIO);
  o->borrow_max = gmli_env(GML_ENV_BORROW_MAX);
  o->plan = gmli_env(GML_ENV_PLAN);
}
