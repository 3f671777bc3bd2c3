/* torch.c: the older entry points (torch.cuda.memory.CUDAPluggableAllocator
 * could load them; gmlake.enable() now installs gmlake._C instead) and the
 * per-device block look-ups python/gmlake's block_of uses. They act on the
 * client devices.c opens per device, the one the PyTorch extension uses.
 * Safe from several threads (the allocator locks). */
#include "client_priv.h"
#include "gmlake.h"
#include "log.h"
#include "options.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64

/* The same client the PyTorch extension uses (devices.c: one per device,
 * with its refusal of host memory that was not asked for). */
static gml_client *client_for(int device) { return gml_device_client(device); }

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
  gml_client *c = gml_device_client_if_open(device);
  if (!c) return GML_EINVAL;
  return gml_stats_get(c, out);
}

int gmlake_torch_trim(int device) {
  if (device < 0 || device >= MAX_DEVICES) return GML_EINVAL;
  gml_client *c = gml_device_client_if_open(device);
  return c ? gml_trim(c, NULL) : GML_EINVAL;
}

int gmlake_torch_block_of(int device, uintptr_t addr, gml_block_info *out) {
  if (device < 0 || device >= MAX_DEVICES) return GML_EINVAL;
  gml_client *c = gml_device_client_if_open(device);
  return c ? gml_block_of(c, (const void *)addr, out) : GML_EINVAL;
}

ssize_t gmlake_torch_block_list(int device, gml_block_info *out, size_t max) {
  if (device < 0 || device >= MAX_DEVICES) return GML_EINVAL;
  gml_client *c = gml_device_client_if_open(device);
  return c ? gml_block_list(c, out, max) : GML_EINVAL;
}
