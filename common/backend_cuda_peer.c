/* backend_cuda_peer.c: the cuda backend's peers (backend.h's peer_*): a
 * multi-path copy's staging memory and streams on another GPU of the node
 * (client/mpath.c). */
#include "backend_cuda.h"
#include "gmlake.h"
#include "log.h"
#include "util.h"

/* What failed, logged (backend_cuda.c's cu_fail; this file's own, so the two files do not call each
 * other): GML_ENOMEM for the driver's out of memory, else GML_EBACKEND. */
static int peer_fail(cuda_priv *p, const char *what, CUresult r) {
  const char *s = NULL;
  if (!p->api.cuGetErrorString || p->api.cuGetErrorString(r, &s) != CUDA_SUCCESS || !s) s = "unknown CUDA error";
  GML_ERR("cuda %s: %s (%d)", what, s, (int)r);
  return r == CUDA_ERROR_OUT_OF_MEMORY ? GML_ENOMEM : GML_EBACKEND;
}

/* A peer's calls run under its primary context, and the caller's context is
 * current again after each: PyTorch reads its current device from it. */
int gmli_cuda_peer_count(gml_backend *be) {
  int n = 0;
  return PRIV(be)->api.cuDeviceGetCount(&n) == CUDA_SUCCESS && n > 0 ? GML_MIN(n, GML_CUDA_PEERS_MAX) : 1;
}

/* Make peer's context current; *prev: the one to put back (peer_unbind). */
static int peer_bind(gml_backend *be, int peer, CUcontext *prev) {
  cuda_priv *p = PRIV(be);
  if (peer < 0 || peer >= GML_CUDA_PEERS_MAX) return GML_EINVAL;
  if (p->api.cuCtxGetCurrent(prev) != CUDA_SUCCESS) *prev = NULL;
  if (peer == be->device) return p->api.cuCtxSetCurrent(p->ctx) == CUDA_SUCCESS ? 0 : GML_EBACKEND;
  pthread_mutex_lock(&p->peer_lock);
  CUdevice d;
  CUresult r = p->peer_ctx[peer] ? CUDA_SUCCESS : p->api.cuDeviceGet(&d, peer);
  if (r == CUDA_SUCCESS && !p->peer_ctx[peer]) r = p->api.cuDevicePrimaryCtxRetain(&p->peer_ctx[peer], d);
  pthread_mutex_unlock(&p->peer_lock);
  if (r == CUDA_SUCCESS) r = p->api.cuCtxSetCurrent(p->peer_ctx[peer]);
  return r == CUDA_SUCCESS ? 0 : peer_fail(p, "a peer's context", r);
}
static void peer_unbind(cuda_priv *p, CUcontext prev) {
  p->api.cuCtxSetCurrent(prev); /* none too: a thread without one must not find the peer's */
}

int gmli_cuda_peer_access(gml_backend *be, int peer) {
  cuda_priv *p = PRIV(be);
  CUdevice d;
  int there = 0, back = 0;
  if (peer == be->device) return 1;
  if (p->api.cuDeviceGet(&d, peer) != CUDA_SUCCESS) return 0;
  p->api.cuDeviceCanAccessPeer(&there, p->dev, d);
  p->api.cuDeviceCanAccessPeer(&back, d, p->dev);
  return there && back;
}

/* Created on the peer, mapped, readable and writable from it and from this device (VMM access flags:
 * no cuCtxEnablePeerAccess needed). */
int gmli_cuda_peer_alloc(gml_backend *be, int peer, size_t size, uintptr_t *va) {
  cuda_priv *p = PRIV(be);
  CUcontext prev;
  int rc = peer_bind(be, peer, &prev);
  if (rc) return rc;
  CUmemAllocationProp prop = p->prop;
  CUmemAccessDesc acc[2] = {p->access, p->access};
  CUmemGenericAllocationHandle h;
  CUdeviceptr d = 0;
  CUresult r = p->api.cuDeviceGet(&prop.location.id, peer);
  acc[1].location.id = prop.location.id;
  const char *what = "cuMemCreate on a peer";
  if (r == CUDA_SUCCESS && (r = p->api.cuMemCreate(&h, size, &prop, 0)) == CUDA_SUCCESS) {
    what = "cuMemAddressReserve";
    if ((r = p->api.cuMemAddressReserve(&d, size, 0, 0, 0)) == CUDA_SUCCESS) {
      what = "cuMemMap";
      if ((r = p->api.cuMemMap(d, size, 0, h, 0)) == CUDA_SUCCESS) {
        what = "cuMemSetAccess for both devices";
        if ((r = p->api.cuMemSetAccess(d, size, acc, peer == be->device ? 1 : 2)) != CUDA_SUCCESS)
          p->api.cuMemUnmap(d, size);
      }
      if (r != CUDA_SUCCESS) p->api.cuMemAddressFree(d, size);
    }
    p->api.cuMemRelease(h); /* the mapping holds it */
  }
  peer_unbind(p, prev);
  if (r != CUDA_SUCCESS) return peer_fail(p, what, r);
  *va = (uintptr_t)d;
  return 0;
}

void gmli_cuda_peer_free(gml_backend *be, int peer, uintptr_t va, size_t size) {
  cuda_priv *p = PRIV(be);
  CUcontext prev;
  if (peer_bind(be, peer, &prev)) return;
  p->api.cuMemUnmap((CUdeviceptr)va, size);
  p->api.cuMemAddressFree((CUdeviceptr)va, size);
  peer_unbind(p, prev);
}

int gmli_cuda_peer_stream(gml_backend *be, int peer, uintptr_t *stream) {
  cuda_priv *p = PRIV(be);
  CUcontext prev;
  int rc = peer_bind(be, peer, &prev);
  if (rc) return rc;
  CUstream s;
  CUresult r = p->api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  peer_unbind(p, prev);
  if (r != CUDA_SUCCESS) return peer_fail(p, "cuStreamCreate on a peer", r);
  *stream = (uintptr_t)s;
  return 0;
}

void gmli_cuda_peer_stream_destroy(gml_backend *be, int peer, uintptr_t stream) {
  cuda_priv *p = PRIV(be);
  CUcontext prev;
  if (peer_bind(be, peer, &prev)) return;
  p->api.cuStreamDestroy_v2((CUstream)stream);
  peer_unbind(p, prev);
}

int gmli_cuda_peer_copy_async(gml_backend *be, int peer, uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream) {
  cuda_priv *p = PRIV(be);
  CUcontext prev;
  int rc = peer_bind(be, peer, &prev);
  if (rc) return rc;
  CUresult r = p->api.cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, (CUstream)stream);
  peer_unbind(p, prev);
  return r == CUDA_SUCCESS ? 0 : peer_fail(p, "cuMemcpyAsync on a peer's stream", r);
}

int gmli_cuda_peer_event_record(gml_backend *be, int peer, uintptr_t stream, uintptr_t *event) {
  cuda_priv *p = PRIV(be);
  CUcontext prev;
  int rc = peer_bind(be, peer, &prev);
  if (rc) return rc;
  CUevent ev;
  CUresult r = p->api.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
  if (r == CUDA_SUCCESS && (r = p->api.cuEventRecord(ev, (CUstream)stream)) != CUDA_SUCCESS)
    p->api.cuEventDestroy_v2(ev);
  peer_unbind(p, prev);
  if (r != CUDA_SUCCESS) return peer_fail(p, "cuEventRecord on a peer's stream", r);
  *event = (uintptr_t)ev;
  return 0;
}
