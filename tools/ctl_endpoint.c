/* ctl_endpoint.c: the control endpoint gmlakectl dials when --control names
 * none (ctl_endpoint.h). A device is named as gmlaked names its endpoints
 * (common/gpuname.h): --device GPU-... or host-N dials gmlake-<UUID>.ctl,
 * --device N the link gmlake-N.ctl (N nvidia-smi's index). */
#include "ctl_endpoint.h"
#include "discover.h"
#include "gmlake.h"
#include "gpuname.h"
#include "options.h"
#include <stdio.h>
#include <string.h>

int ctl_find_endpoint(const char *device, int device_given, char *url, size_t urllen, char *how, size_t howlen,
                      char *err, size_t errlen) {
  const char *sock = gmli_env(GML_ENV_SOCKET);
  how[0] = 0;
  if (gmli_env(GML_ENV_CONTROL) && !device_given) { /* --device wins over GMLAKE_CONTROL */
    snprintf(url, urllen, "%s", gmli_env(GML_ENV_CONTROL));
    return 0;
  }
  if (sock && *sock) { /* the clients' daemon: its control endpoint where gmlaked --socket alone puts it */
    char path[256];
    gmli_socket_of_device(sock, device, path, sizeof path);
    gmli_control_url_beside(path, device, url, urllen);
    snprintf(how, howlen,
             " It is where gmlaked --socket %s puts it without --control (found from GMLAKE_SOCKET); "
             "a daemon given --control URL: give gmlakectl --control URL",
             path);
    /* only where the client library would take that socket (client/discover.h): an endpoint in a
     * directory others may write is anyone's, and its answers (stats, "limit set") would be believed */
    char why[512];
    int missing = 0;
    if (!gmli_socket_path_trusted(url + 6, why, sizeof why, &missing)) return 0;
    if (missing)
      snprintf(err, errlen,
               "cannot reach the daemon at %s: %s does not exist: is the daemon running, with this "
               "control endpoint?%s",
               url, url + 6, how);
    else
      snprintf(err, errlen,
               "not using %s, found from GMLAKE_SOCKET: %s (clients do not use a socket there "
               "either); give --control URL to use it anyway",
               url, why);
    return GML_EDAEMON;
  }
  gmli_client_control_url(device, url, urllen);
  /* what was tried: /run/gmlake, then the default endpoint where that is another (XDG_RUNTIME_DIR: not
   * for root or a user who may write /run/gmlake, who never look there) */
  char sys[96], then[310] = "";
  snprintf(sys, sizeof sys, "/run/gmlake/gmlake-%s.ctl", device);
  if (!strncmp(url, "ipc://", 6) && strcmp(url + 6, sys)) snprintf(then, sizeof then, ", then %s", url + 6);
  int index = gmli_device_spec_index(device) >= 0; /* beside a --socket, the control endpoint is named by index */
  snprintf(how, howlen,
           " Tried for device %s: %s%s. A daemon started with --socket PATH "
           "and no --control serves ipc://<PATH's directory>/gmlake-%s.ctl%s: give that as --control, or set "
           "GMLAKE_SOCKET=PATH",
           device, sys, then, index ? device : "N", index ? "" : " (N its index)");
  if (url[0]) return 0;
  snprintf(err, errlen,
           "no daemon of device %s: /run/gmlake/gmlake-%s.ctl does not exist and XDG_RUNTIME_DIR is "
           "unset (give --control).%s",
           device, device, how);
  return GML_EDAEMON;
}
