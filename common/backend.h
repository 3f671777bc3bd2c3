/* backend.h: the physical memory layer. One small interface, two
 * implementations (cuda: CUDA VMM; host: memfd + mmap), chosen at run time
 * by name from the table in backend.c.
 * Everything above it (lake, allocator) is policy and never calls the driver. */
#ifndef GML_BACKEND_H
#define GML_BACKEND_H
#include <stddef.h>
#include <stdint.h>

typedef uint64_t gml_phys; /* host: the chunk's memfd; cuda: CUmemGenericAllocationHandle */
typedef struct gml_backend gml_backend;

struct gml_backend_ops {
  /* Create one chunk of chunk_size bytes and export it: *fd is a shareable
   * handle the caller owns (close it when done), independent of *phys. */
  int (*chunk_create)(gml_backend *be, gml_phys *phys, int *fd); /* fd NULL: no export */
  /* Import a chunk from a shareable fd; takes ownership of fd. */
  int (*chunk_import)(gml_backend *be, int fd, gml_phys *phys);
  void (*chunk_release)(gml_backend *be, gml_phys phys);
  /* Reserve/free a virtual range (size a multiple of chunk_size, chunk-aligned). */
  int (*va_reserve)(gml_backend *be, size_t size, uintptr_t *va);
  void (*va_free)(gml_backend *be, uintptr_t va, size_t size);
  /* Map one chunk at va; set_access makes a mapped range usable (batched:
   * it is the expensive step on cuda); unmap leaves the range reserved. */
  int (*map)(gml_backend *be, uintptr_t va, gml_phys phys);
  int (*set_access)(gml_backend *be, uintptr_t va, size_t size);
  int (*unmap)(gml_backend *be, uintptr_t va, size_t size);
  /* Stream ordering: an event recorded on a stream is done once the stream
   * has passed it. Host: no asynchronous work, events are done at once. */
  int (*event_record)(gml_backend *be, uintptr_t stream, uintptr_t *event);
  int (*event_done)(gml_backend *be, uintptr_t event); /* 1 done, 0 not yet, <0 error */
  void (*event_destroy)(gml_backend *be, uintptr_t event);
  int (*synchronize)(gml_backend *be); /* wait for all work on the device */
  /* Copy between host memory and mapped device memory (tests, replay). */
  int (*write)(gml_backend *be, uintptr_t va, const void *src, size_t n);
  int (*read)(gml_backend *be, uintptr_t va, void *dst, size_t n);
  int (*mem_info)(gml_backend *be, uint64_t *free_bytes, uint64_t *total_bytes);
  void (*destroy)(gml_backend *be);
  /* Host memory that read/write copy to and from fast (pause's saved
   * content): page-locked on cuda (cuMemAllocHost), plain on host. */
  int (*host_alloc)(gml_backend *be, size_t size, void **p);
  void (*host_free)(gml_backend *be, void *p);
};

struct gml_backend {
  const char *name;   /* "cuda" or "host" */
  int device;
  size_t granularity; /* the smallest chunk the device allows: 2 MiB on the H100 */
  size_t chunk_size;  /* the chunk this backend creates and maps: a multiple of granularity */
  const struct gml_backend_ops *ops;
  void *priv;
};

/* The cuda backend's chunk unless GMLAKE_CHUNK_SIZE says otherwise. */
#define GML_CUDA_DEFAULT_CHUNK (4u << 20)

/* What the caller's options (options.h: GMLAKE_CHUNK_SIZE, GMLAKE_LIBCUDA)
 * say to the backends; NULL opts or members keep the defaults. */
typedef struct gml_backend_opts {
  const char *chunk_size; /* another chunk than the backend's default (a size) */
  const char *libcuda;    /* the CUDA driver library to dlopen (libcuda.so.1) */
} gml_backend_opts;

/* Every backend, once (backend.c's table): name, its open function, and
 * what it means for a daemon's limit when none is given. A new backend is
 * its file and one line in that table. */
typedef int (*gml_backend_open_fn)(int device, const gml_backend_opts *opts, gml_backend **out, char *msg,
                                   size_t msglen);

/* name: "auto" or a backend of the table. auto takes the first of the table
 * that opens (cuda when a GPU is usable, else host) and says which. Asking
 * for cuda without one is GML_ENODEV with the reason in msg. */
int gml_backend_open(const char *name, int device, const gml_backend_opts *opts, gml_backend **out, char *msg,
                     size_t msglen);
/* 1 when name is "auto" or a backend of the table. */
int gml_backend_known(const char *name);
/* "auto, cuda, host": for usage and error messages. */
const char *gml_backend_names(void);
/* The limit a daemon on this backend applies when none is configured
 * ("90%" of the device for cuda, "50%" of RAM for host). */
const char *gml_backend_default_limit(const gml_backend *be);
/* Use chunks of cs bytes (before any is created): GML_EINVAL unless cs is a
 * multiple of the granularity (at most 1 GiB). */
int gml_backend_set_chunk_size(gml_backend *be, uint64_t cs);
void gml_backend_close(gml_backend *be);

int gml_backend_host_open(int device, const gml_backend_opts *opts, gml_backend **out, char *msg, size_t msglen);
int gml_backend_cuda_open(int device, const gml_backend_opts *opts, gml_backend **out, char *msg, size_t msglen);
#endif
