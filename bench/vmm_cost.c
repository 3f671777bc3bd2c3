/* vmm_cost: what CUDA VMM calls cost on this GPU, the numbers the
 * allocator's placement policy and gmlake-replay's cost model rest on.
 *   - cuMemMap / cuMemSetAccess / cuMemUnmap per 2 MiB chunk, and
 *     cuMemSetAccess / cuMemUnmap over a run of chunks in one call;
 *   - the same calls while the GPU is busy with queued work: does the call
 *     wait for it (a hidden synchronize), or return at once?
 *   - on a busy GPU, set-access over runs of 1/4/16/64 new chunks, and over the
 *     same run again (per call or per chunk? is re-setting free?);
 *   - whether the calls cost more with 1k-16k mappings already in the context;
 *   - map + set-access and unmap of one 2, 4 and 8 MiB chunk (is the cost per
 *     chunk, whatever its size? the 4 MiB default rests on that);
 *   - one chunk mapped at two addresses: both see the same bytes (aliases).
 * Built by bench/gpu.sh (stage vmm) with the CUDA headers; libcuda.so.1 is
 * loaded with dlopen like the cuda backend. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STR2(x) #x
#define STR(x) STR2(x)
// clang-format off
#define FUNCS(X) \
  X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemCreate) X(cuMemAddressReserve) \
  X(cuMemMap) X(cuMemSetAccess) X(cuMemUnmap) X(cuMemRelease) X(cuMemAlloc) X(cuMemsetD8Async) X(cuStreamCreate) \
  X(cuStreamQuery) X(cuCtxSynchronize) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemGetAllocationGranularity)
// clang-format on
#define DECL(f) static __typeof__(&f) p_##f;
FUNCS(DECL)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

#define CK(call)                                                                                                       \
  do {                                                                                                                 \
    CUresult r_ = (call);                                                                                              \
    if (r_ != CUDA_SUCCESS) {                                                                                          \
      fprintf(stderr, "vmm_cost: %s failed: %d (line %d)\n", #call, r_, __LINE__);                                     \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

enum { N = 512 };
static const size_t CS = 2u << 20;
static CUmemAccessDesc acc;
static CUmemGenericAllocationHandle h[N];

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp);
  return v[n / 2];
}

/* map every chunk at va, one call each; set access per chunk or in one run */
static void map_all(CUdeviceptr va, int access_per_chunk, double *t_map, double *t_acc) {
  static double m[N], s[N];
  for (int i = 0; i < N; i++) {
    double t0 = now_us();
    CK(p_cuMemMap(va + (size_t)i * CS, CS, 0, h[i], 0));
    m[i] = now_us() - t0;
    if (access_per_chunk) {
      t0 = now_us();
      CK(p_cuMemSetAccess(va + (size_t)i * CS, CS, &acc, 1));
      s[i] = now_us() - t0;
    }
  }
  *t_map = median(m, N);
  if (access_per_chunk) {
    *t_acc = median(s, N);
  } else {
    double t0 = now_us();
    CK(p_cuMemSetAccess(va, N * CS, &acc, 1));
    *t_acc = now_us() - t0;
  }
}

int main(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "vmm_cost: %s\n", dlerror());
    return 1;
  }
#define LOAD(f)                                                                                                        \
  if (!(p_##f = (__typeof__(&f))dlsym(lib, STR(f)))) {                                                                 \
    fprintf(stderr, "vmm_cost: no %s in libcuda\n", STR(f));                                                           \
    return 1;                                                                                                          \
  }
  FUNCS(LOAD)
  CK(p_cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CK(p_cuDeviceGet(&dev, 0));
  CK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(p_cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int i = 0; i < N; i++) CK(p_cuMemCreate(&h[i], CS, &prop, 0));
  CUdeviceptr va, va2;
  CK(p_cuMemAddressReserve(&va, N * CS, 0, 0, 0));
  CK(p_cuMemAddressReserve(&va2, N * CS, 0, 0, 0));

  double tm, ta, tu1, tun;
  printf("VMM call cost, %d chunks of 2 MiB, GPU idle (median per call, us)\n", N);
  map_all(va, 1, &tm, &ta);
  static double u[N];
  for (int i = 0; i < N; i++) {
    double t0 = now_us();
    CK(p_cuMemUnmap(va + (size_t)i * CS, CS));
    u[i] = now_us() - t0;
  }
  tu1 = median(u, N);
  printf("  cuMemMap per chunk            %8.1f\n", tm);
  printf("  cuMemSetAccess per chunk      %8.1f\n", ta);
  printf("  cuMemUnmap per chunk          %8.1f\n", tu1);
  map_all(va, 0, &tm, &ta);
  printf("  cuMemSetAccess, one call over %d chunks: %8.1f (%.2f per chunk)\n", N, ta, ta / N);
  double t0 = now_us();
  CUresult r = p_cuMemUnmap(va, N * CS);
  tun = now_us() - t0;
  printf("  cuMemUnmap, one call over %d mappings: %s, %8.1f (%.2f per chunk)\n", N,
         r == CUDA_SUCCESS ? "ok" : "refused", tun, tun / N);
  if (r != CUDA_SUCCESS)
    for (int i = 0; i < N; i++) CK(p_cuMemUnmap(va + (size_t)i * CS, CS));
  for (int k = 8; k <= 64; k *= 8) {
    map_all(va, 0, &tm, &ta);
    double s = 0;
    for (int i = 0; i < N; i += k) {
      t0 = now_us();
      CK(p_cuMemSetAccess(va + (size_t)i * CS, (size_t)k * CS, &acc, 1)); /* again: already accessible */
      s += now_us() - t0;
    }
    printf("  cuMemSetAccess over runs of %2d chunks: %.1f per call (%.2f per chunk)\n", k, s / (N / k), s / N);
    for (int i = 0; i < N; i++) CK(p_cuMemUnmap(va + (size_t)i * CS, CS));
  }

  /* busy GPU: queue ~0.3 s of memsets on a stream, then time the calls */
  CUdeviceptr big;
  size_t bigsz = 4ull << 30;
  CK(p_cuMemAlloc(&big, bigsz));
  CUstream st;
  CK(p_cuStreamCreate(&st, 1 /* non-blocking */));
  map_all(va, 0, &tm, &ta);
  printf("GPU busy (memsets queued on another stream; 'waited' = the queue drained during the call)\n");
  const char *what[3] = {"cuMemUnmap 1 chunk", "cuMemMap 1 chunk", "cuMemSetAccess 1 chunk"};
  for (int w = 0; w < 3; w++) {
    CK(p_cuCtxSynchronize());
    double q0 = now_us();
    for (int i = 0; i < 100; i++) CK(p_cuMemsetD8Async(big, (unsigned char)i, bigsz, st));
    double q1 = now_us();
    t0 = now_us();
    if (w == 0) CK(p_cuMemUnmap(va, CS));
    if (w == 1) CK(p_cuMemMap(va, CS, 0, h[0], 0));
    if (w == 2) CK(p_cuMemSetAccess(va, CS, &acc, 1));
    double dt = now_us() - t0;
    int busy = p_cuStreamQuery(st) == CUDA_ERROR_NOT_READY;
    t0 = now_us();
    CK(p_cuCtxSynchronize());
    double drain = now_us() - t0;
    printf("  %-24s %10.1f us  (%s; queueing took %.0f us, the rest of the queue %.0f us)\n", what[w], dt,
           busy ? "returned while the GPU was busy" : "waited", q1 - q0, drain);
  }

  /* Busy GPU, set-access over a run of K chunks mapped just before, and again
   * over the same, already accessible run: is the busy cost per call or per
   * chunk, and does re-setting cost anything? (one call per allocation over
   * its whole range would include slots that are accessible already) */
  printf("GPU busy, cuMemSetAccess over K new chunks in one call, then over the same K again (us): K, new, again\n");
  for (int K = 1; K <= 64; K *= 4) {
    CK(p_cuCtxSynchronize());
    for (int i = 0; i < N; i++) (void)p_cuMemUnmap(va + (size_t)i * CS, CS);
    for (int i = 0; i < K; i++) CK(p_cuMemMap(va + (size_t)i * CS, CS, 0, h[i], 0));
    for (int i = 0; i < 100; i++) CK(p_cuMemsetD8Async(big, (unsigned char)i, bigsz, st));
    t0 = now_us();
    CK(p_cuMemSetAccess(va, (size_t)K * CS, &acc, 1));
    double dnew = now_us() - t0;
    t0 = now_us();
    CK(p_cuMemSetAccess(va, (size_t)K * CS, &acc, 1));
    double dagain = now_us() - t0;
    int busy = p_cuStreamQuery(st) == CUDA_ERROR_NOT_READY;
    printf("  %4d %10.1f %10.1f%s\n", K, dnew, dagain, busy ? "" : "  (the queue drained: not a busy measurement)");
  }

  /* Does a call cost more when the context already has many mappings (an
   * allocator that keeps aliases has thousands)? One chunk mapped at K
   * addresses, then N chunks mapped, set accessible and unmapped again. */
  CK(p_cuCtxSynchronize());
  for (int i = 0; i < N; i++) (void)p_cuMemUnmap(va + (size_t)i * CS, CS); /* whatever is still mapped */
  enum { KMAX = 16384 };
  CUdeviceptr many;
  CK(p_cuMemAddressReserve(&many, (size_t)KMAX * CS, 0, 0, 0));
  printf("cost with K mappings already in the context (median per chunk, us): K, map, set-access, unmap\n");
  int have = 0;
  for (int K = 0; K <= KMAX; K = K ? K * 4 : 1024) {
    for (; have < K; have++) {
      CK(p_cuMemMap(many + (size_t)have * CS, CS, 0, h[2], 0));
      CK(p_cuMemSetAccess(many + (size_t)have * CS, CS, &acc, 1));
    }
    map_all(va, 1, &tm, &ta);
    for (int i = 0; i < N; i++) {
      t0 = now_us();
      CK(p_cuMemUnmap(va + (size_t)i * CS, CS));
      u[i] = now_us() - t0;
    }
    printf("  %6d %8.1f %8.1f %8.1f\n", K, tm, ta, median(u, N));
  }
  for (int i = 0; i < have; i++) CK(p_cuMemUnmap(many + (size_t)i * CS, CS));

  /* Is a new mapping's cost per chunk whatever its size? 64 chunks each of
   * 2, 4, 8 MiB: map + set access, then unmap. */
  printf("cost by chunk size (median per chunk, us): size MiB, map + set-access, unmap\n");
  for (size_t sz = CS; sz <= 4 * CS; sz *= 2) {
    enum { M = 64 };
    CUmemGenericAllocationHandle hs[M];
    CUdeviceptr vs;
    CK(p_cuMemAddressReserve(&vs, M * sz, 0, 0, 0));
    static double mm[M], uu[M];
    for (int i = 0; i < M; i++) CK(p_cuMemCreate(&hs[i], sz, &prop, 0));
    for (int i = 0; i < M; i++) {
      t0 = now_us();
      CK(p_cuMemMap(vs + i * sz, sz, 0, hs[i], 0));
      CK(p_cuMemSetAccess(vs + i * sz, sz, &acc, 1));
      mm[i] = now_us() - t0;
    }
    for (int i = 0; i < M; i++) {
      t0 = now_us();
      CK(p_cuMemUnmap(vs + i * sz, sz));
      uu[i] = now_us() - t0;
    }
    for (int i = 0; i < M; i++) CK(p_cuMemRelease(hs[i]));
    printf("  %4zu %8.1f %8.1f\n", sz >> 20, median(mm, M), median(uu, M));
  }
  map_all(va, 0, &tm, &ta); /* the alias check below reads through va */

  /* aliases: one chunk at two addresses */
  CK(p_cuMemMap(va2, CS, 0, h[1], 0));
  CK(p_cuMemSetAccess(va2, CS, &acc, 1));
  unsigned long long x = 0x1234567890abcdefull, y = 0;
  CK(p_cuMemcpyHtoD(va + CS + 4096, &x, sizeof x));
  CK(p_cuMemcpyDtoH(&y, va2 + 4096, sizeof y));
  printf("alias: one chunk mapped at two addresses, written at one, read at the other: %s\n",
         x == y ? "same bytes" : "DIFFERENT");
  return x == y ? 0 : 1;
}
