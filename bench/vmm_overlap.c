/* vmm_overlap: do a client's driver calls overlap when two threads make
 * them? A process taking 40 GiB from the lake makes, per 4 MiB chunk, an
 * import (~50 us on the H100), a map (~1 us) and a set-access (~27 us):
 * 0.8 s for 10,240 chunks, all on one thread (issue 12's idle hog). If one
 * thread's imports and another's map + set-access ran at once, the
 * set-access could hide behind the imports. Measured here, on 3N chunks
 * of CS bytes made and exported by this process and imported by a child it
 * execs (a fresh CUDA process, like a client: the fds are inherited), a
 * new set of N for each phase's imports:
 *   serial    import N, then map them and set access in runs of 128
 *   overlap   one thread imports N others while another maps and sets
 *             access of the first N (at a second address: aliases)
 *   2 imports two threads import N/2 of the last N each, at once
 * and prints each phase's wall time against the serial sum. Built by
 * bench/gpu.sh (stage overlap) against cuda_driver.h, libcuda.so.1 loaded
 * with dlopen like the cuda backend.
 *   vmm_overlap [N [CS_MiB]]   (default 2048: 3 x 2048 chunks of 4 MiB, 24 GiB) */
#define _GNU_SOURCE
#include "cuda_driver.h"
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

// clang-format off
#define FUNCS(X) \
  X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemGetAllocationGranularity) \
  X(cuMemCreate) X(cuMemRelease) X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) \
  X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)
// clang-format on
#define DECL(f) static gml_pfn_##f p_##f;
FUNCS(DECL)

#define CK(call)                                                                                                       \
  do {                                                                                                                 \
    CUresult r_ = (call);                                                                                              \
    if (r_ != CUDA_SUCCESS) {                                                                                          \
      fprintf(stderr, "vmm_overlap: %s failed: %d (line %d)\n", #call, (int)r_, __LINE__);                             \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static CUcontext ctx;
static size_t cs;
static int n, *fds; /* 3n fds: one set of n per phase */
static CUmemAccessDesc acc;

static void init(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "vmm_overlap: cannot load libcuda.so.1: %s\n", dlerror());
    exit(2);
  }
#define LOAD(f)                                                                                                        \
  if (!(p_##f = (gml_pfn_##f)dlsym(lib, #f))) {                                                                        \
    fprintf(stderr, "vmm_overlap: libcuda has no %s\n", #f);                                                           \
    exit(2);                                                                                                           \
  }
  FUNCS(LOAD)
  CUdevice dev;
  CK(p_cuInit(0));
  CK(p_cuDeviceGet(&dev, 0));
  CK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(p_cuCtxSetCurrent(ctx));
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* ---------- the child: a fresh process importing the parent's chunks ---------- */

typedef struct job {
  int first, count; /* fds[first .. first+count) */
  CUmemGenericAllocationHandle *out;
  CUdeviceptr va; /* map: out[] at va, access set in runs of 128 */
  double us;
} job;

static void *import_job(void *arg) {
  job *j = arg;
  CK(p_cuCtxSetCurrent(ctx));
  double t0 = now_us();
  for (int i = 0; i < j->count; i++)
    CK(p_cuMemImportFromShareableHandle(&j->out[i], (void *)(long)fds[j->first + i],
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  j->us = now_us() - t0;
  return NULL;
}

static void *map_job(void *arg) {
  job *j = arg;
  CK(p_cuCtxSetCurrent(ctx));
  double t0 = now_us();
  for (int i = 0; i < j->count; i += 128) {
    int k = j->count - i < 128 ? j->count - i : 128;
    for (int m = 0; m < k; m++) CK(p_cuMemMap(j->va + (CUdeviceptr)(i + m) * cs, cs, 0, j->out[i + m], 0));
    CK(p_cuMemSetAccess(j->va + (CUdeviceptr)i * cs, (size_t)k * cs, &acc, 1));
  }
  j->us = now_us() - t0;
  return NULL;
}

static void release_all(CUmemGenericAllocationHandle *h, int count) {
  for (int i = 0; i < count; i++) CK(p_cuMemRelease(h[i]));
}

static int child(void) {
  init();
  CUmemGenericAllocationHandle *a = calloc((size_t)n, sizeof *a), *b = calloc((size_t)n, sizeof *b);
  CUdeviceptr ra, rb;
  /* aligned to cs's largest power-of-two divisor, as the cuda backend reserves: the driver
   * refuses an alignment that is no power of two (vmm_overlap N 6 failed here) */
  size_t align = cs & (~cs + 1);
  CK(p_cuMemAddressReserve(&ra, (size_t)n * cs, align, 0, 0));
  CK(p_cuMemAddressReserve(&rb, (size_t)n * cs, align, 0, 0));
  /* serial: import all, then map and set access */
  job imp = {0, n, a, 0, 0}, map = {0, n, a, ra, 0};
  import_job(&imp);
  map_job(&map);
  double serial = imp.us + map.us;
  printf("vmm_overlap: %d chunks of %zu MiB, one thread: import %.1f us/chunk, map + set-access (runs of 128) %.1f "
         "us/chunk: "
         "%.3f s\n",
         n, cs >> 20, imp.us / n, map.us / n, serial / 1e6);
  /* overlap: import the same fds again (new handles) while the first ones are mapped at a second address */
  job imp2 = {n, n, b, 0, 0}, map2 = {0, n, a, rb, 0};
  pthread_t t1, t2;
  double t0 = now_us();
  pthread_create(&t1, NULL, import_job, &imp2);
  pthread_create(&t2, NULL, map_job, &map2);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  double both = now_us() - t0;
  printf("vmm_overlap: import on one thread while another maps and sets access: %.3f s wall (import %.1f us/chunk, "
         "map + set-access %.1f us/chunk meanwhile), %.2fx the serial %.3f s: %s\n",
         both / 1e6, imp2.us / n, map2.us / n, both / serial, serial / 1e6,
         both < 0.8 * serial    ? "they overlap"
         : both < 0.95 * serial ? "they overlap in part"
                                : "no overlap (serialized)");
  CK(p_cuMemUnmap(ra, (size_t)n * cs));
  CK(p_cuMemUnmap(rb, (size_t)n * cs));
  release_all(b, n);
  /* two importers, half each */
  job h1 = {2 * n, n / 2, b, 0, 0}, h2 = {2 * n + n / 2, n - n / 2, b + n / 2, 0, 0};
  t0 = now_us();
  pthread_create(&t1, NULL, import_job, &h1);
  pthread_create(&t2, NULL, import_job, &h2);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  double two = now_us() - t0;
  printf("vmm_overlap: two threads importing %d chunks each: %.3f s wall, %.2fx one thread's %.3f s\n", n / 2,
         two / 1e6, two / imp.us, imp.us / 1e6);
  release_all(b, n);
  release_all(a, n);
  CK(p_cuMemAddressFree(ra, (size_t)n * cs));
  CK(p_cuMemAddressFree(rb, (size_t)n * cs));
  return 0;
}

/* ---------- the parent: makes and exports the chunks, execs the child ---------- */

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--child")) { /* --child N CS FD... */
    n = atoi(argv[2]);
    cs = (size_t)strtoull(argv[3], NULL, 10);
    fds = calloc(3 * (size_t)n, sizeof *fds);
    for (int i = 0; i < 3 * n; i++) fds[i] = atoi(argv[4 + i]);
    return child();
  }
  n = argc > 1 ? atoi(argv[1]) : 2048;
  cs = (size_t)(argc > 2 ? atoi(argv[2]) : 4) << 20;
  if (n < 2) return 2;
  init();
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  int all = 3 * n;
  CUmemGenericAllocationHandle *h = calloc((size_t)all, sizeof *h);
  fds = calloc((size_t)all, sizeof *fds);
  double t0 = now_us();
  for (int i = 0; i < all; i++) CK(p_cuMemCreate(&h[i], cs, &prop, 0));
  double t1 = now_us();
  for (int i = 0; i < all; i++) {
    CK(p_cuMemExportToShareableHandle(&fds[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    fcntl(fds[i], F_SETFD, 0); /* the child inherits it */
  }
  double t2 = now_us();
  printf("vmm_overlap: parent: create %.1f us/chunk, export %.1f us/chunk (%d chunks of %zu MiB)\n", (t1 - t0) / all,
         (t2 - t1) / all, all, cs >> 20);
  fflush(stdout);
  char **av = calloc((size_t)all + 5, sizeof *av);
  char nb[16], cb[32];
  snprintf(nb, sizeof nb, "%d", n);
  snprintf(cb, sizeof cb, "%zu", cs);
  av[0] = argv[0], av[1] = "--child", av[2] = nb, av[3] = cb;
  for (int i = 0; i < all; i++) {
    av[4 + i] = malloc(12);
    snprintf(av[4 + i], 12, "%d", fds[i]);
  }
  pid_t pid;
  if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, av, environ)) {
    perror("vmm_overlap: spawn");
    return 1;
  }
  int st = 0;
  waitpid(pid, &st, 0);
  for (int i = 0; i < all; i++) close(fds[i]), p_cuMemRelease(h[i]);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
