/* cuda_driver.h: the part of the CUDA driver API (NVIDIA's cuda.h) that
 * backend_cuda.c uses, declared here so that building GMLake needs no CUDA
 * package: libcuda.so.1 is loaded with dlopen at run time, so only the names,
 * values and layouts are needed at build time, never the library.
 *
 * Every name, value, layout and prototype below is NVIDIA's, taken from cuda.h
 * (CUDA 13.0, /usr/local/cuda/include/cuda.h on the lent GPU machine; the same
 * in CUDA 12.4's copy vendored at triton-lang/triton
 * third_party/nvidia/backend/include/cuda.h). They have not changed since the
 * VMM API appeared (CUDA 10.2) because the driver's ABI depends on them.
 * `make cuda-header-check CUDA_INC=/usr/local/cuda/include` compares each of
 * them with a real cuda.h (tools/cuda_header_check.c): every constant, every
 * struct size/offset, every typedef and every prototype, and that cuda.h
 * resolves each API name to the versioned symbol we dlsym.
 *
 * To use another driver entry point or constant: add it to the lists below
 * (the enums, typedefs and the check are generated from them), then run the
 * check where a cuda.h is installed. */
#ifndef GML_CUDA_DRIVER_H
#define GML_CUDA_DRIVER_H
#ifdef __cuda_cuda_h__
#error "cuda_driver.h replaces cuda.h: include one of them, not both"
#endif
#include <stddef.h>

/* Plain types: (name, C type). cuda.h's CUdeviceptr is unsigned long long on
 * LP64, the only ABI GMLake builds for. */
#define GML_CUDA_TYPEDEFS(X)                                                                                           \
  X(CUdeviceptr, unsigned long long)                                                                                   \
  X(CUdevice, int)                                                                                                     \
  X(CUcontext, struct CUctx_st *)                                                                                      \
  X(CUevent, struct CUevent_st *)                                                                                      \
  X(CUstream, struct CUstream_st *)                                                                                    \
  X(CUmemGenericAllocationHandle, unsigned long long)

/* Enumerations: (enumerator, value), one list per enum type; only the
 * enumerators GMLake uses. */
#define GML_CUDA_RESULT_VALUES(X)                                                                                      \
  X(CUDA_SUCCESS, 0)                                                                                                   \
  X(CUDA_ERROR_OUT_OF_MEMORY, 2)                                                                                       \
  X(CUDA_ERROR_NOT_READY, 600)
#define GML_CUDA_DEVICE_ATTRIBUTE_VALUES(X)                                                                            \
  X(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 102)                                                      \
  X(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 103)
#define GML_CUDA_EVENT_FLAG_VALUES(X) X(CU_EVENT_DISABLE_TIMING, 0x2)
#define GML_CUDA_STREAM_FLAG_VALUES(X) X(CU_STREAM_NON_BLOCKING, 0x1)
#define GML_CUDA_HANDLE_TYPE_VALUES(X) X(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0x1)
#define GML_CUDA_ACCESS_FLAG_VALUES(X) X(CU_MEM_ACCESS_FLAGS_PROT_READ, 0x1) X(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 0x3)
#define GML_CUDA_LOCATION_TYPE_VALUES(X) X(CU_MEM_LOCATION_TYPE_DEVICE, 0x1)
#define GML_CUDA_ALLOCATION_TYPE_VALUES(X) X(CU_MEM_ALLOCATION_TYPE_PINNED, 0x1)
#define GML_CUDA_GRANULARITY_FLAG_VALUES(X) X(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, 0x1)
#define GML_CUDA_CAPTURE_STATUS_VALUES(X) X(CU_STREAM_CAPTURE_STATUS_NONE, 0) X(CU_STREAM_CAPTURE_STATUS_ACTIVE, 1)
#define GML_CUDA_POINTER_ATTRIBUTE_VALUES(X) X(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 2)
#define GML_CUDA_MEMORYTYPE_VALUES(X) X(CU_MEMORYTYPE_HOST, 0x1) X(CU_MEMORYTYPE_DEVICE, 0x2)
#define GML_CUDA_MEMCPY_SRC_ACCESS_ORDER_VALUES(X) X(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, 0x1)

/* (enum tag, typedef name, list): the tags are cuda.h's. */
#define GML_CUDA_ENUMS(X)                                                                                              \
  X(cudaError_enum, CUresult, GML_CUDA_RESULT_VALUES)                                                                  \
  X(CUdevice_attribute_enum, CUdevice_attribute, GML_CUDA_DEVICE_ATTRIBUTE_VALUES)                                     \
  X(CUevent_flags_enum, CUevent_flags, GML_CUDA_EVENT_FLAG_VALUES)                                                     \
  X(CUstream_flags_enum, CUstream_flags, GML_CUDA_STREAM_FLAG_VALUES)                                                  \
  X(CUmemAllocationHandleType_enum, CUmemAllocationHandleType, GML_CUDA_HANDLE_TYPE_VALUES)                            \
  X(CUmemAccess_flags_enum, CUmemAccess_flags, GML_CUDA_ACCESS_FLAG_VALUES)                                            \
  X(CUmemLocationType_enum, CUmemLocationType, GML_CUDA_LOCATION_TYPE_VALUES)                                          \
  X(CUmemAllocationType_enum, CUmemAllocationType, GML_CUDA_ALLOCATION_TYPE_VALUES)                                    \
  X(CUmemAllocationGranularity_flags_enum, CUmemAllocationGranularity_flags, GML_CUDA_GRANULARITY_FLAG_VALUES)         \
  X(CUstreamCaptureStatus_enum, CUstreamCaptureStatus, GML_CUDA_CAPTURE_STATUS_VALUES)                                 \
  X(CUpointer_attribute_enum, CUpointer_attribute, GML_CUDA_POINTER_ATTRIBUTE_VALUES)                                  \
  X(CUmemorytype_enum, CUmemorytype, GML_CUDA_MEMORYTYPE_VALUES)                                                       \
  X(CUmemcpySrcAccessOrder_enum, CUmemcpySrcAccessOrder, GML_CUDA_MEMCPY_SRC_ACCESS_ORDER_VALUES)

#define GML_CUDA_DECLARE_TYPEDEF(name, type) typedef type name;
GML_CUDA_TYPEDEFS(GML_CUDA_DECLARE_TYPEDEF)
#undef GML_CUDA_DECLARE_TYPEDEF

#define GML_CUDA_ENUMERATOR(name, value) name = value,
#define GML_CUDA_DECLARE_ENUM(tag, name, list) typedef enum tag { list(GML_CUDA_ENUMERATOR) } name;
GML_CUDA_ENUMS(GML_CUDA_DECLARE_ENUM)
#undef GML_CUDA_DECLARE_ENUM
#undef GML_CUDA_ENUMERATOR

typedef struct CUmemLocation_st {
  CUmemLocationType type;
  int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void *win32HandleMetaData; /* Windows only: must be zero here */
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

typedef struct CUuuid_st { /* a device's UUID, for the metrics' gpu_uuid label */
  char bytes[16];
} CUuuid;

typedef struct CUmemAccessDesc_st {
  CUmemLocation location;
  CUmemAccess_flags flags;
} CUmemAccessDesc;

/* What one copy of a batch (cuMemcpyBatchAsync, CUDA >= 12.8) may assume. */
typedef struct CUmemcpyAttributes_st {
  CUmemcpySrcAccessOrder srcAccessOrder;
  CUmemLocation srcLocHint;
  CUmemLocation dstLocHint;
  unsigned int flags;
} CUmemcpyAttributes;

/* Every member of the structs above, (struct, member): the check compares
 * each one's offset and size, and each struct's size and alignment. */
#define GML_CUDA_STRUCTS(X) X(CUmemLocation) X(CUmemAllocationProp) X(CUmemAccessDesc) X(CUuuid) X(CUmemcpyAttributes)
#define GML_CUDA_FIELDS(X)                                                                                             \
  X(CUmemLocation, type)                                                                                               \
  X(CUmemLocation, id)                                                                                                 \
  X(CUmemAllocationProp, type)                                                                                         \
  X(CUmemAllocationProp, requestedHandleTypes)                                                                         \
  X(CUmemAllocationProp, location)                                                                                     \
  X(CUmemAllocationProp, location.type)                                                                                \
  X(CUmemAllocationProp, location.id)                                                                                  \
  X(CUmemAllocationProp, win32HandleMetaData)                                                                          \
  X(CUmemAllocationProp, allocFlags)                                                                                   \
  X(CUmemAllocationProp, allocFlags.compressionType)                                                                   \
  X(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable)                                                              \
  X(CUmemAllocationProp, allocFlags.usage)                                                                             \
  X(CUmemAllocationProp, allocFlags.reserved)                                                                          \
  X(CUmemAccessDesc, location)                                                                                         \
  X(CUmemAccessDesc, flags)                                                                                            \
  X(CUuuid, bytes)                                                                                                     \
  X(CUmemcpyAttributes, srcAccessOrder)                                                                                \
  X(CUmemcpyAttributes, srcLocHint)                                                                                    \
  X(CUmemcpyAttributes, dstLocHint)                                                                                    \
  X(CUmemcpyAttributes, flags)

/* The driver entry points backend_cuda.c loads, by the symbol it dlsyms: the
 * versioned name (_v2) where cuda.h maps the API name to one, as a program
 * compiled against cuda.h would call. (symbol, parameter list); each returns
 * CUresult. */
#define GML_CUDA_FUNCS(X)                                                                                              \
  X(cuInit, (unsigned int))                                                                                            \
  X(cuDriverGetVersion, (int *))                                                                                       \
  X(cuDeviceGet, (CUdevice *, int))                                                                                    \
  X(cuDeviceGetCount, (int *))                                                                                         \
  X(cuDeviceGetAttribute, (int *, CUdevice_attribute, CUdevice))                                                       \
  X(cuDeviceGetUuid_v2, (CUuuid *, CUdevice))                                                                          \
  X(cuDeviceGetPCIBusId, (char *, int, CUdevice))                                                                      \
  X(cuDeviceGetName, (char *, int, CUdevice))                                                                          \
  X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                                                 \
  X(cuDevicePrimaryCtxRelease_v2, (CUdevice))                                                                          \
  X(cuCtxSetCurrent, (CUcontext))                                                                                      \
  X(cuCtxGetCurrent, (CUcontext *))                                                                                    \
  X(cuCtxSynchronize, (void))                                                                                          \
  X(cuGetErrorString, (CUresult, const char **))                                                                       \
  X(cuMemGetAllocationGranularity, (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))          \
  X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))            \
  X(cuMemRelease, (CUmemGenericAllocationHandle))                                                                      \
  X(cuMemExportToShareableHandle,                                                                                      \
    (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long))                             \
  X(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType))               \
  X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))                             \
  X(cuMemAddressFree, (CUdeviceptr, size_t))                                                                           \
  X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))                         \
  X(cuMemUnmap, (CUdeviceptr, size_t))                                                                                 \
  X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))                                            \
  X(cuMemGetInfo_v2, (size_t *, size_t *))                                                                             \
  X(cuMemcpyHtoD_v2, (CUdeviceptr, const void *, size_t))                                                              \
  X(cuMemcpyDtoH_v2, (void *, CUdeviceptr, size_t))                                                                    \
  X(cuMemAllocHost_v2, (void **, size_t))                                                                              \
  X(cuMemFreeHost, (void *))                                                                                           \
  X(cuEventCreate, (CUevent *, unsigned int))                                                                          \
  X(cuEventRecord, (CUevent, CUstream))                                                                                \
  X(cuEventQuery, (CUevent))                                                                                           \
  X(cuEventDestroy_v2, (CUevent))                                                                                      \
  X(cuStreamWaitEvent, (CUstream, CUevent, unsigned int))                                                              \
  X(cuStreamIsCapturing, (CUstream, CUstreamCaptureStatus *))                                                          \
  X(cuMemcpyAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                                                       \
  X(cuEventSynchronize, (CUevent))                                                                                     \
  X(cuPointerGetAttribute, (void *, CUpointer_attribute, CUdeviceptr))                                                 \
  X(cuDeviceCanAccessPeer, (int *, CUdevice, CUdevice))                                                                \
  X(cuStreamCreate, (CUstream *, unsigned int))                                                                        \
  X(cuStreamDestroy_v2, (CUstream))

/* Entry points used where the driver has them and done without where it does
 * not (dlsym'd one by one, a NULL pointer when absent): cuMemcpyBatchAsync as
 * CUDA 13 declares it (CUDA 12.8's had a failIdx before the stream, under the
 * unversioned name: not used, those drivers take the one-by-one copies). */
#define GML_CUDA_OPTIONAL_FUNCS(X)                                                                                     \
  X(cuMemcpyBatchAsync_v2,                                                                                             \
    (CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t, CUstream))

/* gml_pfn_cuMemCreate and so on: the pointer type each dlsym result is cast to. */
#define GML_CUDA_DECLARE_PFN(name, params) typedef CUresult(*gml_pfn_##name) params;
GML_CUDA_FUNCS(GML_CUDA_DECLARE_PFN)
GML_CUDA_OPTIONAL_FUNCS(GML_CUDA_DECLARE_PFN)
#undef GML_CUDA_DECLARE_PFN
#endif
