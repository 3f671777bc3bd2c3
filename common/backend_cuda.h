/* backend_cuda.h: what backend_cuda.c shares with backend_cuda_peer.c (the
 * peers' operations: a multi-path copy's staging on another GPU): the driver's
 * entry points, the backend's private state, and the peer ops. */
#ifndef GML_BACKEND_CUDA_H
#define GML_BACKEND_CUDA_H
#include "backend.h"
#include "cuda_driver.h"
#include "fdkeep.h"
#include <pthread.h>

/* The driver entry points we use (cuda_driver.h), by their exported names. */
typedef struct cuda_api {
#define DECLARE_FN(name, params) gml_pfn_##name name;
  GML_CUDA_FUNCS(DECLARE_FN)
#undef DECLARE_FN
} cuda_api;

#define GML_CUDA_PEERS_MAX 16
typedef struct cuda_priv {
  void *lib;
  cuda_api api;
  CUdevice dev;
  CUcontext ctx;
  CUmemAllocationProp prop;
  CUmemAccessDesc access;
  /* The fd each imported chunk came with, kept (fdkeep.h): an imported
   * handle cannot be exported again (cuMemExportToShareableHandle: invalid
   * argument, seen on the H100), so sharing it on (gml_ipc_export) or
   * handing it to a restarted daemon hands out a dup. */
  gml_fdkeep kept;
  gml_pfn_cuMemcpyBatchAsync_v2 batch; /* NULL: the driver has none (before CUDA 13) */
  pthread_mutex_t peer_lock;
  CUcontext peer_ctx[GML_CUDA_PEERS_MAX]; /* peers' primary contexts, retained at first use */
} cuda_priv;

#define PRIV(be) ((cuda_priv *)(be)->priv)

/* backend_cuda_peer.c: backend.h's peer_* operations. */
int gmli_cuda_peer_count(gml_backend *be);
int gmli_cuda_peer_access(gml_backend *be, int peer);
int gmli_cuda_peer_alloc(gml_backend *be, int peer, size_t size, uintptr_t *va);
void gmli_cuda_peer_free(gml_backend *be, int peer, uintptr_t va, size_t size);
int gmli_cuda_peer_stream(gml_backend *be, int peer, uintptr_t *stream);
void gmli_cuda_peer_stream_destroy(gml_backend *be, int peer, uintptr_t stream);
int gmli_cuda_peer_copy_async(gml_backend *be, int peer, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream);
int gmli_cuda_peer_event_record(gml_backend *be, int peer, uintptr_t stream, uintptr_t *event);
#endif
