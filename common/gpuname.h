/* gpuname.h: how a GPU is named, end to end (daemon, discovery, hello,
 * metrics, tools).
 *
 * A device's name is its UUID: a GPU's as the driver and nvidia-smi -L give
 * it ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"), the host backend's
 * "host-N". An ordinal is only ever a local name:
 *   - in a client process it is CUDA's, relative to that process's
 *     CUDA_VISIBLE_DEVICES (and CUDA_DEVICE_ORDER), as PyTorch's device index
 *     is: the client asks the driver for that ordinal's UUID (the host
 *     backend maps visible ordinal i to host-M where CUDA_VISIBLE_DEVICES's
 *     i-th entry is M, so host tests take the same path);
 *   - for gmlaked and gmlakectl it is nvidia-smi's index: gmlaked sets
 *     CUDA_DEVICE_ORDER=PCI_BUS_ID and clears CUDA_VISIBLE_DEVICES before it
 *     loads the driver, so CUDA's ordinal N there is nvidia-smi's GPU N.
 * A daemon's default socket and control endpoint are named by the UUID
 * (/run/gmlake/gmlake-<UUID>.sock and .ctl); gmlake-N.sock and gmlake-N.ctl
 * beside them are symlinks to those (N the index), for older clients and
 * for people (daemon/names.c). */
#ifndef GML_GPUNAME_H
#define GML_GPUNAME_H
#include <stddef.h>

#define GML_UUID_MAX 48 /* a UUID's text and its NUL */
#define GML_DEVICE_INDEX_MAX 1023

/* spec as an index: N for "N" (decimal digits, 0..GML_DEVICE_INDEX_MAX), else -1. */
int gmli_device_spec_index(const char *spec);
/* N for "host-N" (a host backend's device), else -1. */
int gmli_host_device_of_name(const char *name);
/* A PCI bus id as nvidia-smi ("00000000:3B:00.0") or the driver
 * ("0000:3b:00.0") write it, or without its domain ("3b:00.0"): 1 and
 * v = {domain, bus, device, function}; 0 if it is none. */
int gmli_pci_bus_id_parse(const char *s, unsigned v[4]);
/* 1 when s names a device as an endpoint's name may: an index, host-N, a
 * GPU's UUID ("GPU-" and hex digits and '-', as nvidia-smi -L prints it; any
 * case) or cuda-N (a driver that gives no UUID); below GML_UUID_MAX bytes. */
int gmli_device_name_ok(const char *s);
/* What gmlaked --device accepts: a device name (gmli_device_name_ok) or a PCI bus id. */
int gmli_device_spec_valid(const char *spec);
/* UUIDs compared without regard to case (nvidia-smi and the driver agree on lower case, people may not). */
int gmli_uuid_same(const char *a, const char *b);
/* The backend whose devices a UUID names: "host" for host-N, else "cuda". A
 * daemon compares a client's UUID with its own only within one backend. */
const char *gmli_uuid_backend(const char *uuid);
/* The refusal of a client whose device is not the daemon's, said the same by
 * the daemon and by the client: "this daemon serves GPU-a (device 1); the
 * client's device 0 is GPU-b: set GMLAKE_SOCKET to GPU-b's daemon or unset it". */
void gmli_gpu_mismatch(char *buf, size_t len, const char *daemon_uuid, int daemon_index, const char *client_uuid,
                       int client_device);

/* Where a daemon puts its socket and control endpoint by default: in
 * /run/gmlake when it may write there, else $XDG_RUNTIME_DIR ("" when
 * neither: never /tmp), named gmlake-<name>.sock / .ctl, name being the
 * device's UUID (or an index, for the compatibility links). */
void gmli_default_socket_path(const char *name, char *buf, size_t len);
void gmli_default_control_url(const char *name, char *buf, size_t len);
/* The control endpoint gmlakectl talks to for a device name: the system
 * daemon's ipc:///run/gmlake/gmlake-<name>.ctl when it exists (whether or not
 * the caller may write there), else the default above. */
void gmli_client_control_url(const char *name, char *buf, size_t len);
/* "%d" in a socket path stands for the device (GMLAKE_SOCKET's rule: one
 * setting for every GPU of a process): path with it replaced by name. */
void gmli_socket_of_device(const char *path, const char *name, char *out, size_t len);
/* The control endpoint of a daemon given a socket and no --control:
 * ipc://<the socket's directory>/gmlake-<name>.ctl (a relative socket path
 * taken from the working directory; name: the daemon's index). gmlaked picks
 * it; gmlakectl finds it from GMLAKE_SOCKET, as the client library finds the
 * socket. */
void gmli_control_url_beside(const char *socket_path, const char *name, char *buf, size_t len);
#endif
