/* torchconf.c: PyTorch's allocator settings for the framework layer's clients
 * (gml_device_client): PYTORCH_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF, as
 * PyTorch reads them ("key:value,key:value", a value may be a [list] with
 * commas in it). The keys with a GMLake meaning are applied; PyTorch's
 * pinned host allocator, which GMLake does not replace, keeps its own keys;
 * every other key is warned about once a process, naming it and why it does
 * not apply, so a user's setting never silently means nothing. */
#include "alloc.h"
#include "client_priv.h"
#include "log.h"
#include "options.h"
#include "util.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Applies key's value to c: 0, or -1 when the value does not apply (said why in why[]). */
typedef int (*conf_apply_fn)(gml_client *c, const char *value, char *why, size_t len);

static int is_true(const char *v) { return !strcmp(v, "True") || !strcmp(v, "true") || !strcmp(v, "1"); }

static int apply_expandable(gml_client *c, const char *v, char *why, size_t len) {
  (void)c;
  if (is_true(v)) return 0; /* what GMLake always is */
  snprintf(why, len,
           "GMLake always maps chunks into reserved virtual ranges (what expandable segments are): "
           "it cannot be turned off");
  return -1;
}

static int apply_backend(gml_client *c, const char *v, char *why, size_t len) {
  (void)c;
  if (!strcmp(v, "native")) return 0;
  snprintf(why, len, "under gmlake.enable() GMLake is PyTorch's CUDA allocator, whichever backend is named");
  return -1;
}

static int fraction_of(const char *v, double *f) {
  char *end;
  *f = strtod(v, &end);
  return end != v && !*end && *f > 0.0 && *f <= 1.0 ? 0 : -1;
}

/* As torch.cuda.set_per_process_memory_fraction: the most this process holds, a share of the device. */
static int apply_fraction(gml_client *c, const char *v, char *why, size_t len) {
  double f;
  uint64_t free_b = 0, total = 0;
  if (fraction_of(v, &f) || c->be->ops->mem_info(c->be, &free_b, &total) || !total) {
    snprintf(why, len, "%s", total ? "not a fraction in (0, 1]" : "the device does not say its size");
    return -1;
  }
  if (f < 1.0) { /* gml_set_limit's work (track.c calls this file: no circle) */
    pthread_mutex_lock(&c->alloc.lock);
    c->alloc.limit_bytes = (size_t)(f * (double)total);
    pthread_mutex_unlock(&c->alloc.lock);
  }
  return 0;
}

/* Held memory over threshold * the limit goes back to the lake at a free (gmli_torch_conf_collect). */
static int apply_gc(gml_client *c, const char *v, char *why, size_t len) {
  double t;
  if (fraction_of(v, &t) || t >= 1.0) {
    snprintf(why, len, "not a fraction in (0, 1)");
    return -1;
  }
  c->gc_threshold = t;
  __atomic_store_n(&c->gc_on, 1, __ATOMIC_RELEASE);
  return 0;
}

static const struct conf_key {
  const char *key;
  conf_apply_fn apply; /* NULL: not GMLake's to apply (why says what happens to it; NULL why: PyTorch's own) */
  const char *why;
} conf_keys[] = {
    {"expandable_segments", apply_expandable, NULL},
    {"backend", apply_backend, NULL},
    {"per_process_memory_fraction", apply_fraction, NULL},
    {"garbage_collection_threshold", apply_gc, NULL},
    {"pinned_use_cuda_host_register", NULL, NULL}, /* PyTorch's pinned host allocator: GMLake leaves it be */
    {"pinned_use_hip_host_register", NULL, NULL},
    {"pinned_num_register_threads", NULL, NULL},
    {"pinned_use_background_threads", NULL, NULL},
    {"pinned_reserve_segment_size_mb", NULL, NULL},
    {"max_split_size_mb", NULL,
     "GMLake serves a request no free block fits by stitching whole free chunks of any blocks, so the large "
     "blocks that splitting strands (what this bounds) do not arise"},
    {"max_non_split_rounding_mb", NULL, "it goes with max_split_size_mb, which does not apply either"},
    {"roundup_power2_divisions", NULL,
     "GMLake rounds a request to 512 bytes only: freed chunks serve any size by stitching, so sizes need no buckets"},
    {"release_lock_on_cudamalloc", NULL, "GMLake calls no cudaMalloc: chunks come from the lake, leased or made ahead"},
    {"graph_capture_record_stream_reuse", NULL,
     "a rule of PyTorch's own graph pools; GMLake's pools keep what a capture frees for that pool"},
};

#define UNKNOWN_SEEN_MAX 32
static uint8_t warned[GML_ARRAY_LEN(conf_keys)];
static char unknown_seen[UNKNOWN_SEEN_MAX][48];
static size_t nunknown;
static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;

/* Once a process per known key; per unknown key, once each (the first UNKNOWN_SEEN_MAX names). */
static int first_time(long k, const char *key) {
  pthread_mutex_lock(&warn_lock);
  int first = 0;
  if (k >= 0) {
    first = !warned[k], warned[k] = 1;
  } else {
    size_t i = 0;
    while (i < nunknown && strncmp(unknown_seen[i], key, sizeof unknown_seen[i] - 1)) i++;
    first = i == nunknown;
    if (first && nunknown < UNKNOWN_SEEN_MAX) snprintf(unknown_seen[nunknown++], sizeof unknown_seen[0], "%s", key);
  }
  pthread_mutex_unlock(&warn_lock);
  return first;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
  return s;
}

static void one_key(gml_client *c, const char *var, char *item) {
  char *colon = strchr(item, ':');
  char *key = item, *value = (char *)"";
  if (colon) *colon = 0, value = trim(colon + 1);
  key = trim(key);
  if (!*key) return;
  long k = -1;
  for (size_t i = 0; i < GML_ARRAY_LEN(conf_keys) && k < 0; i++)
    if (!strcmp(conf_keys[i].key, key)) k = (long)i;
  char why[256];
  if (k >= 0 && conf_keys[k].apply) {
    if (!conf_keys[k].apply(c, value, why, sizeof why)) {
      GML_DEBUG("%s: %s:%s applied", var, key, value);
      return;
    }
    if (first_time(k, key)) GML_WARN("%s: %s:%s does not apply under GMLake: %s", var, key, value, why);
  } else if (k >= 0) {
    if (conf_keys[k].why && first_time(k, key))
      GML_WARN("%s: %s does not apply under GMLake (ignored): %s", var, key, conf_keys[k].why);
  } else if (first_time(-1, key)) {
    GML_WARN("%s: %s is no key PyTorch's allocator settings have that GMLake knows (ignored)", var, key);
  }
}

void gmli_torch_conf_apply(gml_client *c) {
  gml_env_id id = GML_ENV_PYTORCH_ALLOC_CONF; /* PyTorch reads the newer name first */
  const char *text = gmli_env(id);
  if (!text) text = gmli_env(id = GML_ENV_PYTORCH_CUDA_ALLOC_CONF);
  if (!text) return;
  size_t n = strlen(text);
  char *buf = malloc(n + 1);
  if (!buf) return;
  memcpy(buf, text, n + 1);
  int depth = 0;
  char *item = buf;
  for (char *p = buf;; p++) { /* items end at a comma outside brackets ([256:1,512:2] is one value) */
    if (*p == '[') depth++;
    else if (*p == ']' && depth) depth--;
    else if ((*p == ',' && !depth) || !*p) {
      int end = !*p;
      *p = 0;
      one_key(c, gmli_env_name(id), item);
      if (end) break;
      item = p + 1;
    }
  }
  free(buf);
}

void gmli_torch_conf_collect(gml_client *c) {
  double t = c->gc_threshold;
  uint64_t limit = __atomic_load_n(&c->alloc.limit_bytes, __ATOMIC_RELAXED);
  if (t <= 0.0 || !limit) return; /* as PyTorch: only with a limit (a memory fraction) */
  uint64_t keep = (uint64_t)(t * (double)limit),
           held = __atomic_load_n(&c->alloc.held, __ATOMIC_RELAXED) * c->be->chunk_size;
  /* idle chunks only, the device synchronized first where one is still mapped (PyTorch's collection
   * frees cached blocks with cudaFree, which synchronizes too); held past keep by live blocks stays */
  if (held > keep) gmli_alloc_release_idle(&c->alloc, held - keep);
}
