/* torch.c: the entry points torch.cuda.memory.CUDAPluggableAllocator loads.
 * One client per device, opened on first use (daemon of that device if one
 * runs, else embedded) with the library's one default backend, auto; it must
 * serve device memory unless GMLAKE_BACKEND names another backend. Safe from
 * several threads (the allocator locks). */
#include "client_priv.h"
#include "gmlake.h"
#include "log.h"
#include "options.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64

static gml_client *clients[MAX_DEVICES];
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

/* GMLAKE_BACKEND names the backend a client in this process gets. */
static int backend_named_by_env(void) {
  gml_options opt;
  gml_options_from_env(&opt);
  return opt.backend_named;
}

static gml_client *client_for(int device) {
  if (device < 0 || device >= MAX_DEVICES) return NULL;
  gml_client *c = __atomic_load_n(&clients[device], __ATOMIC_ACQUIRE);
  if (c) return c;
  pthread_mutex_lock(&open_lock);
  if (!clients[device]) {
    gml_open_opts o = {0}; /* the backend: GMLAKE_BACKEND, else the one default, auto */
    o.device = device;
    int rc = gml_open(&o, &c);
    if (rc == 0 && strcmp(c->be->name, "cuda") && !backend_named_by_env()) {
      /* auto fell back to host memory (or a daemon serves it): PyTorch would
       * take it for device memory */
      GML_ERR("device %d: the lake serves %s memory, not device memory; PyTorch needs cuda "
              "(GMLAKE_BACKEND=%s to use it anyway)", device, c->be->name, c->be->name);
      gml_close(c);
      rc = GML_ENODEV;
    }
    if (rc) GML_ERR("cannot open the lake of device %d: %s", device, gml_strerror(rc));
    else __atomic_store_n(&clients[device], c, __ATOMIC_RELEASE);
  }
  c = clients[device];
  pthread_mutex_unlock(&open_lock);
  return c;
}

void *gmlake_torch_malloc(ssize_t size, int device, void *stream) {
  gml_client *c = client_for(device);
  if (!c || size <= 0) return NULL;
  void *p = NULL;
  int rc = gml_alloc(c, (size_t)size, (gml_stream)stream, &p);
  if (rc) {
    /* PyTorch turns NULL into its OutOfMemoryError; say why here */
    fprintf(stderr, "gmlake: %s\n", gml_last_error(c));
    return NULL;
  }
  return p;
}

void gmlake_torch_free(void *ptr, ssize_t size, int device, void *stream) {
  (void)size, (void)stream;
  gml_client *c = client_for(device);
  if (!c || !ptr) return;
  int rc = gml_free(c, ptr);
  if (rc) GML_ERR("free %p on device %d: %s", ptr, device, gml_strerror(rc));
}

int gmlake_torch_stats(int device, gml_stats *out) {
  if (device < 0 || device >= MAX_DEVICES) return GML_EINVAL;
  gml_client *c = __atomic_load_n(&clients[device], __ATOMIC_ACQUIRE);
  if (!c) return GML_EINVAL;
  return gml_stats_get(c, out);
}

int gmlake_torch_trim(int device) {
  if (device < 0 || device >= MAX_DEVICES) return GML_EINVAL;
  gml_client *c = __atomic_load_n(&clients[device], __ATOMIC_ACQUIRE);
  return c ? gml_trim(c, NULL) : GML_EINVAL;
}

int gmlake_torch_block_of(int device, uintptr_t addr, gml_block_info *out) {
  if (device < 0 || device >= MAX_DEVICES) return GML_EINVAL;
  gml_client *c = __atomic_load_n(&clients[device], __ATOMIC_ACQUIRE);
  return c ? gml_block_of(c, (const void *)addr, out) : GML_EINVAL;
}

ssize_t gmlake_torch_block_list(int device, gml_block_info *out, size_t max) {
  if (device < 0 || device >= MAX_DEVICES) return GML_EINVAL;
  gml_client *c = __atomic_load_n(&clients[device], __ATOMIC_ACQUIRE);
  return c ? gml_block_list(c, out, max) : GML_EINVAL;
}
