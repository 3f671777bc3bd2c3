/* devices.c: one client per device for a process's framework layer (the
 * PyTorch extension), opened on first use: the daemon of that device if one
 * runs, else embedded, with the library's one default backend, auto; it must
 * serve device memory unless GMLAKE_BACKEND names another backend. Never
 * closed: tensors may be freed until the very end. */
#include "client_priv.h"
#include "gmlake.h"
#include "log.h"
#include "options.h"
#include <pthread.h>
#include <string.h>

#define MAX_DEVICES 64

static gml_client *clients[MAX_DEVICES];
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

/* GMLAKE_BACKEND names the backend a client in this process gets. */
static int backend_named_by_env(void) {
  gml_options opt;
  gmli_options_from_env(&opt);
  return opt.backend_named;
}

gml_client *gml_device_client_if_open(int device) {
  if (device < 0 || device >= MAX_DEVICES) return NULL;
  return __atomic_load_n(&clients[device], __ATOMIC_ACQUIRE);
}

gml_client *gml_device_client(int device) {
  gml_client *c = gml_device_client_if_open(device);
  if (c) return c;
  if (device < 0 || device >= MAX_DEVICES) { /* said: the caller's error points at the log (python's "the log above") */
    GML_ERR("cannot open the lake of device %d: not a device index (0 to %d)", device, MAX_DEVICES - 1);
    return NULL;
  }
  pthread_mutex_lock(&open_lock);
  if (!clients[device]) {
    gml_open_opts o = {0}; /* the backend: GMLAKE_BACKEND, else the one default, auto */
    o.device = device;
    int rc = gml_open(&o, &c);
    if (rc == 0 && !(c->be->caps & GML_BACKEND_DEVICE_MEMORY) && !backend_named_by_env()) {
      /* auto fell back to host memory (or a daemon serves it): a framework
       * would take it for device memory */
      GML_ERR("device %d: the lake serves %s memory, not device memory; PyTorch needs cuda "
              "(GMLAKE_BACKEND=%s to use it anyway)",
              device, c->be->name, c->be->name);
      gml_close(c);
      rc = GML_ENODEV;
    }
    if (rc) GML_ERR("cannot open the lake of device %d: %s", device, gml_strerror(rc));
    else gmli_torch_conf_apply(c), __atomic_store_n(&clients[device], c, __ATOMIC_RELEASE);
  }
  c = clients[device];
  pthread_mutex_unlock(&open_lock);
  return c;
}
