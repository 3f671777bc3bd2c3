/* backend_cuda.c: the CUDA VMM backend. libcuda.so.1 is loaded with dlopen
 * so one binary runs on machines with and without a GPU. Chunks come from
 * cuMemCreate with POSIX-fd handles; the fd is exported once by the creator
 * (it costs ~1 ms) and kept for the chunk's whole life. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "backend.h"
#include "cuda_driver.h"
#include "fdkeep.h"
#include "gmlake.h"
#include "gpuname.h"
#include "log.h"
#include "util.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_cuda.h"

static const char *api_errstr(const cuda_api *a, CUresult r) {
  const char *s = NULL;
  if (a->cuGetErrorString && a->cuGetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown CUDA error";
}

static const char *cu_errstr(cuda_priv *p, CUresult r) { return api_errstr(&p->api, r); }

/* Driver calls run in whatever thread the caller is (PyTorch's, the
 * daemon's worker): make our primary context current there. */
static inline void cu_bind(cuda_priv *p) {
  CUcontext cur = NULL;
  if (p->api.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != p->ctx) p->api.cuCtxSetCurrent(p->ctx);
}

static int cu_fail(cuda_priv *p, const char *what, CUresult r) {
  GML_ERR("cuda %s: %s (%d)", what, cu_errstr(p, r), (int)r);
  return r == CUDA_ERROR_OUT_OF_MEMORY ? GML_ENOMEM : GML_EBACKEND;
}

#define CU_CALL(p, call)                                                                                               \
  do {                                                                                                                 \
    CUresult r_ = (p)->api.call;                                                                                       \
    if (r_ != CUDA_SUCCESS) return cu_fail((p), #call, r_);                                                            \
  } while (0)

static int cuda_chunk_create(gml_backend *be, gml_phys *phys, int *fd) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CUmemGenericAllocationHandle h;
  CU_CALL(p, cuMemCreate(&h, be->chunk_size, &p->prop, 0));
  *phys = (gml_phys)h;
  if (!fd) return 0; /* embedded: nobody else will import it */
  int efd = -1;
  CUresult r = p->api.cuMemExportToShareableHandle(&efd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) {
    p->api.cuMemRelease(h);
    return cu_fail(p, "cuMemExportToShareableHandle", r);
  }
  *fd = efd;
  return 0;
}

static int cuda_chunk_import(gml_backend *be, int fd, gml_phys *phys) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CUmemGenericAllocationHandle h;
  CUresult r =
      p->api.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) {
    close(fd);
    return cu_fail(p, "cuMemImportFromShareableHandle", r);
  }
  if (gmli_fdkeep_put(&p->kept, (uint64_t)h, fd)) close(fd); /* not kept: this chunk cannot be shared on */
  *phys = (gml_phys)h;
  return 0;
}

static int cuda_chunk_export(gml_backend *be, gml_phys phys, int *fd) {
  cuda_priv *p = PRIV(be);
  int d = gmli_fdkeep_dup(&p->kept, (uint64_t)phys);
  if (d >= 0 || errno != ENOENT) {
    if (d < 0) return GML_ESYS;
    *fd = d;
    return 0;
  }
  cu_bind(p); /* a chunk this process created */
  int efd = -1;
  CU_CALL(p, cuMemExportToShareableHandle(&efd, (CUmemGenericAllocationHandle)phys,
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  *fd = efd;
  return 0;
}

static void cuda_chunk_release(gml_backend *be, gml_phys phys) {
  cuda_priv *p = PRIV(be);
  gmli_fdkeep_drop(&p->kept, (uint64_t)phys);
  cu_bind(p);
  CUresult r = p->api.cuMemRelease((CUmemGenericAllocationHandle)phys);
  if (r != CUDA_SUCCESS) cu_fail(p, "cuMemRelease", r);
}

static int cuda_va_reserve(gml_backend *be, size_t size, uintptr_t *va) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CUdeviceptr d;
  /* aligned to the largest power of two dividing the chunk: the driver refuses
   * an alignment that is no power of two (GMLAKE_CHUNK_SIZE=6MiB failed every
   * reservation), and a granularity multiple is all a mapping needs */
  size_t align = be->chunk_size & (~be->chunk_size + 1);
  CU_CALL(p, cuMemAddressReserve(&d, size, align, 0, 0));
  *va = (uintptr_t)d;
  return 0;
}

static void cuda_va_free(gml_backend *be, uintptr_t va, size_t size) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CUresult r = p->api.cuMemAddressFree((CUdeviceptr)va, size);
  if (r != CUDA_SUCCESS) cu_fail(p, "cuMemAddressFree", r);
}

static int cuda_map(gml_backend *be, uintptr_t va, gml_phys phys) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CU_CALL(p, cuMemMap((CUdeviceptr)va, be->chunk_size, 0, (CUmemGenericAllocationHandle)phys, 0));
  return 0;
}

static int cuda_set_access(gml_backend *be, uintptr_t va, size_t size, int flags) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CUmemAccessDesc d = p->access;
  if (flags & GML_ACCESS_READ_ONLY) d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ; /* a write is an illegal-address fault */
  CU_CALL(p, cuMemSetAccess((CUdeviceptr)va, size, &d, 1));
  return 0;
}

static int cuda_unmap(gml_backend *be, uintptr_t va, size_t size) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CU_CALL(p, cuMemUnmap((CUdeviceptr)va, size));
  return 0;
}

static int cuda_event_record(gml_backend *be, uintptr_t stream, uintptr_t *event) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CUevent ev;
  CU_CALL(p, cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CUresult r = p->api.cuEventRecord(ev, (CUstream)stream);
  if (r != CUDA_SUCCESS) {
    p->api.cuEventDestroy_v2(ev);
    return cu_fail(p, "cuEventRecord", r);
  }
  *event = (uintptr_t)ev;
  return 0;
}

static int cuda_event_done(gml_backend *be, uintptr_t event) {
  cuda_priv *p = PRIV(be);
  CUresult r = p->api.cuEventQuery((CUevent)event);
  if (r == CUDA_SUCCESS) return 1;
  if (r == CUDA_ERROR_NOT_READY) return 0;
  return cu_fail(p, "cuEventQuery", r);
}

static void cuda_event_destroy(gml_backend *be, uintptr_t event) {
  cuda_priv *p = PRIV(be);
  p->api.cuEventDestroy_v2((CUevent)event);
}

/* Borrowing inserts this wait on the borrowing stream. Never on a stream
 * being captured into a CUDA graph: a wait on an event recorded outside the
 * capture would break the capture, so the caller does not borrow. */
static int cuda_stream_wait_event(gml_backend *be, uintptr_t stream, uintptr_t event) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  CU_CALL(p, cuStreamIsCapturing((CUstream)stream, &cs));
  if (cs != CU_STREAM_CAPTURE_STATUS_NONE) return GML_EBACKEND;
  CU_CALL(p, cuStreamWaitEvent((CUstream)stream, (CUevent)event, 0));
  return 0;
}

static int cuda_synchronize(gml_backend *be) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CU_CALL(p, cuCtxSynchronize());
  return 0;
}

static int cuda_write(gml_backend *be, uintptr_t va, const void *src, size_t n) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CU_CALL(p, cuMemcpyHtoD_v2((CUdeviceptr)va, src, n));
  return 0;
}

static int cuda_read(gml_backend *be, uintptr_t va, void *dst, size_t n) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CU_CALL(p, cuMemcpyDtoH_v2(dst, (CUdeviceptr)va, n));
  return 0;
}

static int cuda_host_alloc(gml_backend *be, size_t size, void **ptr) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CU_CALL(p, cuMemAllocHost_v2(ptr, size));
  return 0;
}

static void cuda_host_free(gml_backend *be, void *ptr) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  p->api.cuMemFreeHost(ptr);
}

static int cuda_copy_async(gml_backend *be, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  CU_CALL(p, cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, (CUstream)stream));
  return 0;
}

/* One attribute for all: sources read in stream order (after the stream's
 * earlier work), which is what every copy of the engine asks. */
static int cuda_copy_batch(gml_backend *be, uintptr_t *dst, uintptr_t *src, size_t *n, size_t count, uintptr_t stream) {
  cuda_priv *p = PRIV(be);
  if (!p->batch || !stream) return GML_EINVAL; /* the legacy stream 0 is refused by the driver */
  cu_bind(p);
  CUmemcpyAttributes attr = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
  size_t first = 0;
  CUresult r = p->batch((CUdeviceptr *)dst, (CUdeviceptr *)src, n, count, &attr, &first, 1, (CUstream)stream);
  return r == CUDA_SUCCESS ? 0 : cu_fail(p, "cuMemcpyBatchAsync_v2", r);
}

/* Page-locked (cuMemAllocHost, cuMemHostRegister): the driver knows it as
 * host memory; pageable memory is unknown to it (an error, not a type). */
static int cuda_host_pinned(gml_backend *be, const void *ptr, size_t n) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  unsigned int t[2] = {0, 0};
  uintptr_t at[2] = {(uintptr_t)ptr, (uintptr_t)ptr + (n ? n - 1 : 0)};
  for (int i = 0; i < 2; i++)
    if (p->api.cuPointerGetAttribute(&t[i], CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)at[i]) != CUDA_SUCCESS)
      return 0;
  return t[0] == CU_MEMORYTYPE_HOST && t[1] == CU_MEMORYTYPE_HOST;
}

static int cuda_event_wait(gml_backend *be, uintptr_t event) {
  cuda_priv *p = PRIV(be);
  CU_CALL(p, cuEventSynchronize((CUevent)event));
  return 0;
}

static int cuda_mem_info(gml_backend *be, uint64_t *free_bytes, uint64_t *total_bytes) {
  cuda_priv *p = PRIV(be);
  cu_bind(p);
  size_t f, t;
  CU_CALL(p, cuMemGetInfo_v2(&f, &t));
  *free_bytes = f;
  *total_bytes = t;
  return 0;
}

static void cuda_destroy(gml_backend *be) {
  cuda_priv *p = PRIV(be);
  gmli_fdkeep_destroy(&p->kept);
  for (int i = 0; i < GML_CUDA_PEERS_MAX; i++) {
    CUdevice d;
    if (p->peer_ctx[i] && p->api.cuDeviceGet(&d, i) == CUDA_SUCCESS) p->api.cuDevicePrimaryCtxRelease_v2(d);
  }
  pthread_mutex_destroy(&p->peer_lock);
  if (p->ctx) p->api.cuDevicePrimaryCtxRelease_v2(p->dev);
  /* libcuda stays loaded: unloading a driver library mid-process is unsafe. */
  free(p);
  free(be);
}

static const struct gml_backend_ops cuda_ops = {
    .chunk_create = cuda_chunk_create,
    .chunk_import = cuda_chunk_import,
    .chunk_release = cuda_chunk_release,
    .chunk_export = cuda_chunk_export,
    .va_reserve = cuda_va_reserve,
    .va_free = cuda_va_free,
    .map = cuda_map,
    .set_access = cuda_set_access,
    .unmap = cuda_unmap,
    .event_record = cuda_event_record,
    .event_done = cuda_event_done,
    .event_destroy = cuda_event_destroy,
    .synchronize = cuda_synchronize,
    .write = cuda_write,
    .read = cuda_read,
    .mem_info = cuda_mem_info,
    .destroy = cuda_destroy,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .stream_wait_event = cuda_stream_wait_event,
    .copy_async = cuda_copy_async,
    .copy_batch = cuda_copy_batch,
    .host_pinned = cuda_host_pinned,
    .event_wait = cuda_event_wait,
    .protect = NULL, /* a guard is a whole chunk left unmapped */
    .peer_count = gmli_cuda_peer_count,
    .peer_access = gmli_cuda_peer_access,
    .peer_alloc = gmli_cuda_peer_alloc,
    .peer_free = gmli_cuda_peer_free,
    .peer_stream = gmli_cuda_peer_stream,
    .peer_stream_destroy = gmli_cuda_peer_stream_destroy,
    .peer_copy_async = gmli_cuda_peer_copy_async,
    .peer_event_record = gmli_cuda_peer_event_record,
};

/* libcuda (GMLAKE_LIBCUDA) loaded, every entry point we use found, cuInit
 * done, and how many devices it shows: the library's handle (never closed:
 * the driver keeps threads of its own), or NULL with why in msg. */
static void *cuda_load(const gml_backend_opts *opts, cuda_api *api, int *count, char *msg, size_t msglen) {
  const char *libname = opts && opts->libcuda ? opts->libcuda : "libcuda.so.1";
  void *lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(msg, msglen, "cannot load %s (%s)", libname, dlerror());
    return NULL;
  }
#define LOAD_FN(name, params)                                                                                          \
  api->name = (gml_pfn_##name)dlsym(lib, #name);                                                                       \
  if (!api->name) {                                                                                                    \
    snprintf(msg, msglen, "%s lacks %s (driver too old for VMM)", libname, #name);                                     \
    return NULL;                                                                                                       \
  }
  GML_CUDA_FUNCS(LOAD_FN)
#undef LOAD_FN
  CUresult r = api->cuInit(0);
  if (r != CUDA_SUCCESS) {
    snprintf(msg, msglen, "cuInit failed: %s", api_errstr(api, r));
    return NULL;
  }
  *count = 0;
  api->cuDeviceGetCount(count);
  return lib;
}

/* The device's UUID as nvidia-smi -L prints it ("cuda-N" where the driver does not say). */
static void uuid_text(const cuda_api *a, CUdevice dev, int ordinal, char *out) {
  CUuuid id;
  if (a->cuDeviceGetUuid_v2(&id, dev) == CUDA_SUCCESS) {
    const unsigned char *u = (const unsigned char *)id.bytes;
    snprintf(out, GML_UUID_MAX, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  } else {
    snprintf(out, GML_UUID_MAX, "cuda-%d", ordinal);
  }
}

/* This process's ordinal under its CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, as PyTorch's index is. */
int gmli_backend_cuda_uuid(int device, const gml_backend_opts *opts, char *uuid, char *msg, size_t msglen) {
  cuda_api api;
  int count = 0;
  CUdevice dev;
  if (!cuda_load(opts, &api, &count, msg, msglen)) return GML_ENODEV;
  if (device < 0 || device >= count || api.cuDeviceGet(&dev, device) != CUDA_SUCCESS) {
    snprintf(msg, msglen, "no CUDA device %d (%d visible)", device, count);
    return GML_ENODEV;
  }
  uuid_text(&api, dev, device, uuid);
  return 0;
}

/* gmlaked's --device: an index (CUDA's ordinal, which is nvidia-smi's index
 * once gmlaked has set CUDA_DEVICE_ORDER=PCI_BUS_ID), a UUID or a PCI bus id. */
int gmli_backend_cuda_resolve(const char *spec, const gml_backend_opts *opts, int *device, char *msg, size_t msglen) {
  cuda_api api;
  int count = 0, idx = gmli_device_spec_index(spec);
  unsigned want[4], got[4];
  int pci = gmli_pci_bus_id_parse(spec, want),
      any_domain = pci && strchr(spec, ':') == strrchr(spec, ':'); /* "3b:00.0" */
  if (!cuda_load(opts, &api, &count, msg, msglen)) return GML_ENODEV;
  if (idx >= 0) {
    if (idx < count) return *device = idx, 0;
    snprintf(msg, msglen, "no GPU %d (%d present)", idx, count);
    return GML_ENODEV;
  }
  for (int i = 0; i < count; i++) {
    CUdevice dev;
    char text[64];
    if (api.cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    if (pci) {
      if (api.cuDeviceGetPCIBusId(text, sizeof text, dev) == CUDA_SUCCESS && gmli_pci_bus_id_parse(text, got) &&
          (any_domain || want[0] == got[0]) && !memcmp(want + 1, got + 1, 3 * sizeof *got))
        return *device = i, 0;
    } else {
      uuid_text(&api, dev, i, text);
      if (gmli_uuid_same(text, spec)) return *device = i, 0;
    }
  }
  snprintf(msg, msglen,
           "no GPU %s among the %d here (nvidia-smi -L lists their UUIDs; nvidia-smi -q their PCI bus ids)", spec,
           count);
  return GML_ENODEV;
}

int gmli_backend_cuda_open(int device, const gml_backend_opts *opts, gml_backend **out, char *msg, size_t msglen) {
  cuda_priv *p = calloc(1, sizeof *p);
  gml_backend *be = calloc(1, sizeof *be);
  if (!p || !be) {
    free(p), free(be);
    return GML_ENOMEM;
  }
  int count = 0;
  if (!(p->lib = cuda_load(opts, &p->api, &count, msg, msglen))) goto fail;
  CUresult r;
  if (device < 0 || device >= count) {
    snprintf(msg, msglen, "no CUDA device %d (%d present)", device, count);
    goto fail;
  }
  p->api.cuDeviceGet(&p->dev, device);
  int vmm = 0, posix = 0;
  p->api.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, p->dev);
  p->api.cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, p->dev);
  if (!vmm || !posix) {
    snprintf(msg, msglen, "device %d lacks virtual memory management or POSIX fd handles", device);
    goto fail;
  }
  r = p->api.cuDevicePrimaryCtxRetain(&p->ctx, p->dev);
  if (r != CUDA_SUCCESS) {
    snprintf(msg, msglen, "cannot retain the primary context: %s", cu_errstr(p, r));
    p->ctx = NULL;
    goto fail;
  }
  p->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p->prop.location.id = p->dev;
  p->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  p->access.location = p->prop.location;
  p->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t gran = 0;
  p->api.cuMemGetAllocationGranularity(&gran, &p->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  be->name = "cuda";
  be->device = device;
  uuid_text(&p->api, p->dev, device, be->uuid);
  if (p->api.cuDeviceGetName(be->model, (int)sizeof be->model, p->dev) != CUDA_SUCCESS) be->model[0] = 0;
  be->granularity = gran > (2u << 20) ? gran : (2u << 20);
  /* 6 MiB by default: a chunk costs the same driver time whatever its size
   * (import ~35-55 us, cuMemSetAccess ~25-35 us, cuMemUnmap ~18 us; bench/results/history.md),
   * so the chunk count is what moving memory costs: 40 GiB taken from an idle
   * process in 0.53-0.56 s against 0.75-0.99 s with 4 MiB (run70), steady-state
   * maps a third fewer; reserved/allocated 1.018-1.025 on the three PyTorch
   * trainings against 1.018-1.020 with 4 MiB, 1.034 with 8 MiB (gpt2_ckpt). */
  be->chunk_size = gmli_round_up(GML_CUDA_DEFAULT_CHUNK, be->granularity);
  be->ops = &cuda_ops;
  be->priv = p;
  p->batch = (gml_pfn_cuMemcpyBatchAsync_v2)dlsym(p->lib, "cuMemcpyBatchAsync_v2");
  if (p->batch) be->caps |= GML_BACKEND_COPY_BATCH;
  pthread_mutex_init(&p->peer_lock, NULL);
  gmli_fdkeep_init(&p->kept, SIZE_MAX); /* last: a failed open has no table to undo */
  snprintf(msg, msglen, "cuda backend: device %d (%s), chunks of %zu bytes", device, be->uuid, be->chunk_size);
  *out = be;
  return 0;
fail:
  if (p->ctx) p->api.cuDevicePrimaryCtxRelease_v2(p->dev);
  free(p);
  free(be);
  return GML_ENODEV;
}
