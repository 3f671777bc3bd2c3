/* gpuname.c: device names (UUIDs, indices, PCI bus ids) and the endpoint
 * names made of them (gpuname.h says which name means what). */
#include "gpuname.h"
#include "options.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

int gmli_device_spec_index(const char *spec) {
  if (!spec || !*spec || strlen(spec) > 4) return -1;
  for (const char *p = spec; *p; p++)
    if (!isdigit((unsigned char)*p)) return -1;
  int n = atoi(spec);
  return n <= GML_DEVICE_INDEX_MAX ? n : -1;
}

int gmli_host_device_of_name(const char *name) {
  return name && !strncmp(name, "host-", 5) ? gmli_device_spec_index(name + 5) : -1;
}

int gmli_pci_bus_id_parse(const char *s, unsigned v[4]) {
  unsigned d = 0, b, dev, fn;
  int end = 0;
  if (!s || !strchr(s, '.')) return 0;
  if (sscanf(s, "%x:%x:%x.%x%n", &d, &b, &dev, &fn, &end) != 4 || s[end]) {
    d = 0, end = 0;
    if (sscanf(s, "%x:%x.%x%n", &b, &dev, &fn, &end) != 3 || s[end]) return 0;
  }
  for (const char *p = s; *p; p++) /* sscanf's %x takes a sign and "0x" too */
    if (!isxdigit((unsigned char)*p) && *p != ':' && *p != '.') return 0;
  if (b > 0xff || dev > 0x1f || fn > 7) return 0;
  v[0] = d, v[1] = b, v[2] = dev, v[3] = fn;
  return 1;
}

int gmli_device_name_ok(const char *s) {
  if (!s || !*s || strlen(s) >= GML_UUID_MAX) return 0;
  if (gmli_device_spec_index(s) >= 0 || gmli_host_device_of_name(s) >= 0) return 1;
  if (!strncmp(s, "cuda-", 5)) return gmli_device_spec_index(s + 5) >= 0; /* a driver that gave no UUID */
  if (strncasecmp(s, "GPU-", 4) || !s[4]) return 0;
  for (const char *p = s + 4; *p; p++)
    if (!isxdigit((unsigned char)*p) && *p != '-') return 0;
  return 1;
}

int gmli_device_spec_valid(const char *spec) {
  unsigned v[4];
  return gmli_device_name_ok(spec) || gmli_pci_bus_id_parse(spec, v);
}

int gmli_uuid_same(const char *a, const char *b) { return a && b && *a && !strcasecmp(a, b); }

const char *gmli_uuid_backend(const char *uuid) { return uuid && !strncmp(uuid, "host-", 5) ? "host" : "cuda"; }

void gmli_gpu_mismatch(char *buf, size_t len, const char *daemon_uuid, int daemon_index, const char *client_uuid,
                       int client_device) {
  snprintf(buf, len,
           "this daemon serves %s (device %d); the client's device %d is %s: set GMLAKE_SOCKET to %s's "
           "daemon or unset it",
           daemon_uuid, daemon_index, client_device, client_uuid, client_uuid);
}

static void runtime_dir(char *buf, size_t len) {
  if (access("/run/gmlake", W_OK) == 0 || (geteuid() == 0 && access("/run", W_OK) == 0)) {
    snprintf(buf, len, "/run/gmlake");
    return;
  }
  const char *x = gmli_env(GML_ENV_XDG_RUNTIME_DIR);
  snprintf(buf, len, "%s", x && *x == '/' ? x : ""); /* never /tmp: no client would look there */
}

void gmli_default_socket_path(const char *name, char *buf, size_t len) {
  char dir[256];
  runtime_dir(dir, sizeof dir);
  if (dir[0]) snprintf(buf, len, "%s/gmlake-%s.sock", dir, name);
  else if (len) buf[0] = 0;
}

void gmli_default_control_url(const char *name, char *buf, size_t len) {
  char dir[256];
  runtime_dir(dir, sizeof dir);
  if (dir[0]) snprintf(buf, len, "ipc://%s/gmlake-%s.ctl", dir, name);
  else if (len) buf[0] = 0;
}

void gmli_client_control_url(const char *name, char *buf, size_t len) {
  char path[300];
  struct stat st;
  snprintf(path, sizeof path, "/run/gmlake/gmlake-%s.ctl", name);
  if (stat(path, &st) == 0 && S_ISSOCK(st.st_mode)) { /* the system daemon first, whoever we are */
    snprintf(buf, len, "ipc://%s", path);
    return;
  }
  gmli_default_control_url(name, buf, len);
}

void gmli_socket_of_device(const char *path, const char *name, char *out, size_t len) {
  const char *d = strstr(path, "%d");
  if (d) snprintf(out, len, "%.*s%s%s", (int)(d - path), path, name, d + 2);
  else snprintf(out, len, "%s", path);
}

void gmli_control_url_beside(const char *socket_path, const char *name, char *buf, size_t len) {
  char cwd[256] = "";
  if (socket_path[0] != '/' && !getcwd(cwd, sizeof cwd)) cwd[0] = 0; /* an ipc:// URL that works from anywhere */
  const char *slash = strrchr(socket_path, '/');
  int dirlen = slash ? (int)(slash - socket_path) : 0;
  snprintf(buf, len, "ipc://%s%s%.*s/gmlake-%s.ctl", cwd, cwd[0] && dirlen ? "/" : "", dirlen, socket_path, name);
}
