/* settings.c: the library's options (common/options.h) as gml_open takes
 * them: what gml_open_opts sets over the environment; a mode, backend or
 * limit that cannot be read refused; the tuning knobs' bad values warned
 * about with what is used instead; the allocator's settings and its virtual
 * range. */
#include "alloc.h"
#include "backend.h"
#include "client_priv.h"
#include "gmlake.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gmli_env_flag(gml_env_id id, const char *value, int def) {
  if (!value || !*value) return def;
  if (!strcmp(value, "0") || !strcmp(value, "1")) return value[0] == '1';
  GML_WARN("%s=%s: 0 or 1 was expected; using %d", gmli_env_name(id), value, def);
  return def;
}

/* GMLAKE_VA_SIZE, else twice the device's memory within [64 GiB, 1 TiB].
 * A tuning knob: a value that is no size, or less than the 64 chunks the
 * allocator needs, warns and the default (or 64 chunks) holds. */
size_t gmli_va_size(const gml_options *opt, gml_backend *be) {
  uint64_t v, min = 64 * (uint64_t)be->chunk_size, freeb = 0, total = 0;
  be->ops->mem_info(be, &freeb, &total);
  uint64_t def = GML_MIN(GML_MAX(2 * total, 64 * GML_GIB), 1024 * GML_GIB);
  char s1[32], s2[32];
  if (!opt->va_size) return def;
  if (gmli_parse_size(opt->va_size, 0, &v)) {
    GML_WARN("GMLAKE_VA_SIZE=%s: not a size (bytes, e.g. 256GiB); using the default, %s", opt->va_size,
             gmli_format_bytes(def, s1, sizeof s1));
    return def;
  }
  if (v < min) {
    GML_WARN("GMLAKE_VA_SIZE=%s: less than the 64 chunks of %s the allocator needs; using %s", opt->va_size,
             gmli_format_bytes(be->chunk_size, s1, sizeof s1), gmli_format_bytes(min, s2, sizeof s2));
    return min;
  }
  return v;
}

/* The environment (options.h), read once, under what gml_open_opts set.
 * GML_EINVAL, said on stderr, for a mode, backend or limit that cannot be
 * read: running in the wrong place or without the limit asked for is worse
 * than not starting. */
int gmli_open_options(const gml_open_opts *o, gml_options *opt) {
  gmli_options_from_env(opt);
  if (o->mode) opt->mode = o->mode;
  if (o->limit_bytes) opt->limit = NULL;
  if (o->mode && o->mode != GML_MODE_DAEMON && o->mode != GML_MODE_EMBEDDED) {
    GML_ERR("gml_open_opts.mode %d: not a mode (0, GML_MODE_DAEMON, GML_MODE_EMBEDDED)", o->mode);
    return GML_EINVAL;
  }
  if (o->guard != 0 && o->guard != GML_GUARD_OFF && o->guard != GML_GUARD_END && o->guard != GML_GUARD_BOTH) {
    GML_ERR("gml_open_opts.guard %d: not a guard mode (0: as GMLAKE_GUARD says, GML_GUARD_OFF, GML_GUARD_END, "
            "GML_GUARD_BOTH)",
            o->guard);
    return GML_EINVAL;
  }
  if (o->borrow < -1 || o->borrow > 1) {
    GML_ERR("gml_open_opts.borrow %d: 0 (as GMLAKE_BORROW says), 1 (on) or -1 (off)", o->borrow);
    return GML_EINVAL;
  }
  if (opt->mode < 0) {
    GML_ERR("GMLAKE_MODE=%s: not a mode; it accepts %s (unset: the daemon if reachable, else embedded)", opt->mode_text,
            gmli_env_accepts(GML_ENV_MODE));
    return GML_EINVAL;
  }
  if (o->backend ? !gmli_backend_known(o->backend) : opt->backend_named && !gmli_backend_known(opt->backend)) {
    if (o->backend)
      GML_ERR("gml_open_opts.backend \"%s\": not a backend; it accepts %s", o->backend, gmli_backend_names());
    else GML_ERR("GMLAKE_BACKEND=%s: not a backend; it accepts %s", opt->backend, gmli_backend_names());
    return GML_EINVAL;
  }
  if (o->backend) opt->backend = o->backend, opt->backend_named = 1;
  uint64_t lim;
  /* any device size: only the form is checked here. 0 (or 0%) is no limit of bytes: it was taken as no limit at
   * all (limit_bytes 0), where the message below says 1% is the least */
  if (opt->limit && (gmli_parse_size(opt->limit, 1ull << 40, &lim) || !lim)) {
    GML_ERR("GMLAKE_LIMIT=%s: not a limit; it accepts bytes (8GiB, 8589934592) or a share of the device from 1%% to "
            "100%% (40%%); unset: no limit",
            opt->limit);
    return GML_EINVAL;
  }
  if (o->socket_path) opt->socket = o->socket_path;
  return 0;
}

/* The allocator's settings (alloc.h) from the library's options: it reads no
 * environment. GMLAKE_HEADROOM is a percentage, 0 turns it off; anything else
 * warns and keeps the default. */
void gmli_alloc_config_from_options(const gml_options *opt, gml_alloc_config *cfg) {
  *cfg = (gml_alloc_config)GML_ALLOC_CONFIG_DEFAULT;
  cfg->timing = gmli_env_flag(GML_ENV_TIMING, opt->timing, 0);
  cfg->stream_map = gmli_env_flag(GML_ENV_STREAM_MAP, opt->stream_map, 0);
  const char *hr = opt->headroom;
  if (hr && *hr) {
    char *end;
    double v = strtod(hr, &end);
    if (*end == '%') end++;
    if (*end || !(v >= 0 && v <= 100))
      GML_WARN("GMLAKE_HEADROOM=%s: not a percentage from 0 to 100; using %g", hr, cfg->headroom_pct);
    else cfg->headroom_pct = v;
  }
  /* guard mode (issue 16): GMLAKE_GUARD=0|1|end|both, GMLAKE_GUARD_GRAIN=BYTES, GMLAKE_GUARD_BACKTRACE=1 */
  const char *e = opt->guard;
  if (e && *e) {
    cfg->guard = !strcmp(e, "both") ? GML_GUARD_BOTH : !strcmp(e, "1") || !strcmp(e, "end") ? GML_GUARD_END : 0;
    if (!cfg->guard && strcmp(e, "0"))
      GML_WARN("GMLAKE_GUARD=%s: 0, 1 (or end) or both was expected; guard mode off", e);
  }
  uint64_t grain;
  if ((e = opt->guard_grain) && *e) {
    if (gmli_parse_size(e, 0, &grain) == 0) cfg->guard_grain = (size_t)grain;
    else GML_WARN("GMLAKE_GUARD_GRAIN=%s: a size was expected; the finest the backend can guard", e);
  }
  cfg->guard_bt = gmli_env_flag(GML_ENV_GUARD_BACKTRACE, opt->guard_backtrace, 0);
  /* cross-stream borrowing: GMLAKE_BORROW=0|1, GMLAKE_BORROW_RATIO (>= 1), GMLAKE_BORROW_MAX (0-64) */
  cfg->borrow = gmli_env_flag(GML_ENV_BORROW, opt->borrow, cfg->borrow);
  char *end;
  if ((e = opt->borrow_ratio) && *e) {
    double v = strtod(e, &end);
    if (!*end && v >= 1) cfg->borrow_ratio = v;
    else GML_WARN("GMLAKE_BORROW_RATIO=%s: a number >= 1 was expected; using %g", e, cfg->borrow_ratio);
  }
  if ((e = opt->borrow_max) && *e) {
    long v = strtol(e, &end, 10);
    if (!*end && v >= 0 && v <= GML_BORROW_MAX_CAP) cfg->borrow_max = (int)v;
    else GML_WARN("GMLAKE_BORROW_MAX=%s: 0 to %d was expected; using %d", e, GML_BORROW_MAX_CAP, cfg->borrow_max);
  }
  /* planned placement (issue 29): GMLAKE_PLAN=0|1|at:N */
  if ((e = opt->plan) && *e) {
    long long v;
    if (!strcmp(e, "1") || !strcmp(e, "0")) cfg->plan = *e == '1';
    else if (sscanf(e, "at:%lld", &v) == 1 && v >= 0 && v < INT32_MAX && strspn(e + 3, "0123456789") == strlen(e + 3))
      cfg->plan = 1, cfg->plan_at = v;
    else GML_WARN("GMLAKE_PLAN=%s: 0, 1 or at:N (an iteration number) was expected; planned placement off", e);
  }
}
