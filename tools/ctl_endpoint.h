/* ctl_endpoint.h: which control endpoint gmlakectl talks to when --control
 * names none (ctl_endpoint.c). */
#ifndef GML_CTL_ENDPOINT_H
#define GML_CTL_ENDPOINT_H
#include <stddef.h>

/* For device (--device's text: nvidia-smi's index or a UUID; "0" when not
 * given): GMLAKE_CONTROL unless --device was given; else beside
 * GMLAKE_SOCKET (where gmlaked --socket alone puts it) when a client would
 * trust a socket there; else the system daemon's
 * /run/gmlake/gmlake-<device>.ctl, then $XDG_RUNTIME_DIR's. 0 with the URL
 * and, in how, what was tried (said if nothing answers there); or GML_EDAEMON
 * with err saying why there is none to dial. */
int ctl_find_endpoint(const char *device, int device_given, char *url, size_t urllen, char *how, size_t howlen,
                      char *err, size_t errlen);
#endif
