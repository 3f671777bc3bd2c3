/* ctl_node.c: the node view (ctl_node.h). An operator of an 8-GPU node sees
 * every lake at once, as nvidia-smi shows every GPU: each lake is found by
 * its control endpoint's file, asked once (stats and clients, the request
 * `gmlakectl clients` makes), and shown in one row; a lake that does not
 * answer in time is a row of its own that says so. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ctl_node.h"
#include "discover.h"
#include "gmlake.h"
#include "gmlake.pb-c.h"
#include "gpuname.h"
#include "options.h"
#include "statsview.h"
#include "util.h"
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NODE_LAKES_MAX 128 /* lakes shown; more are counted and said */
#define NODE_DIRS_MAX 2
#define NODE_TOP 3           /* processes shown per lake, by bytes held */
#define NODE_TIMEOUT_MS 2000 /* a lake silent this long is shown down: one stuck lake delays the view by it */

typedef struct node_lake {
  char path[PATH_MAX];     /* the endpoint's socket, its links resolved: one lake whatever its names */
  char name[GML_UUID_MAX]; /* what its file is named after (the UUID, or the index of a daemon given --socket) */
  char why[300];           /* down: what failed */
  Gmlake__CtlReply *reply; /* up: its stats and clients */
} node_lake;

/* The directories lakes put their control endpoints in (gpuname.h): beside GMLAKE_SOCKET's socket when it names one
 * (a daemon given --socket and no --control puts it there), else /run/gmlake and the per-user runtime directory. */
static int node_dirs(char dirs[NODE_DIRS_MAX][PATH_MAX], int *from_socket) {
  const char *sock = gmli_env(GML_ENV_SOCKET);
  int n = 0;
  *from_socket = sock && *sock;
  if (*from_socket) {
    const char *slash = strrchr(sock, '/');
    if (!slash) snprintf(dirs[n++], PATH_MAX, ".");
    else snprintf(dirs[n++], PATH_MAX, "%.*s", slash == sock ? 1 : (int)(slash - sock), sock);
    return n;
  }
  snprintf(dirs[n++], PATH_MAX, "%s", GML_SYSTEM_RUNTIME_DIR);
  char url[PATH_MAX + 16] = "";
  gmli_default_control_url("x", url, sizeof url); /* ipc://DIR/gmlake-x.ctl, DIR /run/gmlake or $XDG_RUNTIME_DIR */
  char *slash = strrchr(url, '/');
  if (!strncmp(url, "ipc://", 6) && slash && slash > url + 6) {
    *slash = 0;
    if (strcmp(url + 6, dirs[0])) snprintf(dirs[n++], PATH_MAX, "%.*s", PATH_MAX - 1, url + 6);
  }
  return n;
}

/* The lakes of one directory: each gmlake-*.ctl that is a socket (a link followed); a link and its target are one. */
static void node_scan(const char *dir, node_lake *lakes, int *n, int *more) {
  DIR *dp = opendir(dir);
  if (!dp) return;
  struct dirent *e;
  while ((e = readdir(dp))) {
    size_t len = strlen(e->d_name);
    if (len < 12 || strncmp(e->d_name, "gmlake-", 7) || strcmp(e->d_name + len - 4, ".ctl")) continue;
    char file[2 * PATH_MAX + sizeof e->d_name], real[PATH_MAX];
    struct stat st, lst;
    snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
    if (stat(file, &st) || !S_ISSOCK(st.st_mode) || !realpath(file, real)) continue; /* a dangling link: no lake */
    int islink = lstat(file, &lst) == 0 && S_ISLNK(lst.st_mode), k = 0;
    while (k < *n && strcmp(lakes[k].path, real)) k++;
    if (k == *n) {
      if (*n == NODE_LAKES_MAX) {
        (*more)++;
        continue;
      }
      memset(&lakes[k], 0, sizeof lakes[k]);
      snprintf(lakes[k].path, sizeof lakes[k].path, "%s", real);
      (*n)++;
    }
    /* the name of the file itself (the UUID) over a link's (an index) */
    if (!lakes[k].name[0] || !islink)
      snprintf(lakes[k].name, sizeof lakes[k].name, "%.*s", (int)(len - 11), e->d_name + 7);
  }
  closedir(dp);
}

/* One request to one lake: its stats and clients, or why not (l->why). */
static void node_ask(node_lake *l, int check_trust) {
  char url[PATH_MAX + 8];
  snprintf(url, sizeof url, "ipc://%s", l->path);
  int missing = 0;
  /* found from GMLAKE_SOCKET: used only where the clients would use a socket */
  if (check_trust && gmli_socket_path_trusted(l->path, l->why, sizeof l->why, &missing)) return;
  nng_socket s;
  int rv = nng_req0_open(&s);
  if (rv) {
    snprintf(l->why, sizeof l->why, "%s", nng_strerror(rv));
    return;
  }
  nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, NODE_TIMEOUT_MS);
  nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, NODE_TIMEOUT_MS);
  Gmlake__CtlRequest req = GMLAKE__CTL_REQUEST__INIT;
  req.req_case = GMLAKE__CTL_REQUEST__REQ_CLIENTS;
  req.clients = 1;
  uint8_t buf[64];
  size_t n = gmlake__ctl_request__pack(&req, buf);
  void *in = NULL;
  size_t len = 0;
  if ((rv = nng_dial(s, url, NULL, 0)) || (rv = nng_send(s, buf, n, 0)) ||
      (rv = nng_recv(s, &in, &len, NNG_FLAG_ALLOC))) {
    const char *why = rv == NNG_ECONNREFUSED ? "nothing answers at its endpoint (the daemon is not running)"
                      : rv == NNG_EPERM      ? "permission denied (the control socket's mode and group)"
                                             : nng_strerror(rv);
    snprintf(l->why, sizeof l->why, "%s", why);
    nng_close(s);
    return;
  }
  l->reply = gmlake__ctl_reply__unpack(NULL, len, in);
  nng_free(in, len);
  nng_close(s);
  if (!l->reply || !l->reply->stats) snprintf(l->why, sizeof l->why, "a malformed reply");
  else if (l->reply->code)
    snprintf(l->why, sizeof l->why, "the daemon says: %s", l->reply->message ? l->reply->message : "");
  else return;
  if (l->reply) gmlake__ctl_reply__free_unpacked(l->reply, NULL);
  l->reply = NULL;
}

/* Up lakes by GPU index, then the down ones by name. */
static int node_order(const void *a, const void *b) {
  const node_lake *x = a, *y = b;
  if (!x->reply != !y->reply) return x->reply ? -1 : 1;
  if (x->reply && x->reply->stats->device != y->reply->stats->device)
    return x->reply->stats->device < y->reply->stats->device ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* The indices of l's clients in decreasing bytes held (leased), at most NODE_TOP. */
static size_t node_top(const node_lake *l, size_t top[NODE_TOP]) {
  size_t n = 0;
  for (size_t i = 0; i < l->reply->n_clients; i++) {
    size_t k = n < NODE_TOP ? n++ : NODE_TOP;
    uint64_t held = l->reply->clients[i]->leased_bytes;
    while (k > 0 && l->reply->clients[top[k - 1]]->leased_bytes < held) {
      if (k < NODE_TOP) top[k] = top[k - 1];
      k--;
    }
    if (k < NODE_TOP) top[k] = i;
  }
  return n;
}

static void node_print_json(node_lake *lakes, int n) {
  putchar('[');
  for (int i = 0; i < n; i++) {
    node_lake *l = &lakes[i];
    char url[PATH_MAX + 8];
    snprintf(url, sizeof url, "ipc://%s", l->path);
    printf("%s{\"endpoint\":", i ? "," : "");
    gmli_print_json_string(stdout, url);
    printf(",\"name\":");
    gmli_print_json_string(stdout, l->name);
    if (!l->reply) {
      printf(",\"state\":\"down\",\"error\":");
      gmli_print_json_string(stdout, l->why);
      putchar('}');
      continue;
    }
    printf(",\"state\":\"up\",\"stats\":");
    gmli_print_json(&l->reply->stats->base);
    size_t top[NODE_TOP], nt = node_top(l, top);
    printf(",\"top\":[");
    for (size_t k = 0; k < nt; k++) {
      const Gmlake__ClientInfo *c = l->reply->clients[top[k]];
      printf("%s{\"pid\":%d,\"uid\":%u,\"name\":", k ? "," : "", c->pid, c->uid);
      gmli_print_json_string(stdout, c->pid ? c->name : "");
      printf(",\"leased_bytes\":%llu,\"allocated\":%llu}", (unsigned long long)c->leased_bytes,
             (unsigned long long)c->allocated);
    }
    printf("]}");
  }
  printf("]\n");
}

static void node_print_table(node_lake *lakes, int n, int up) {
  printf("GMLake lakes of this node: %d up, %d down\n", up, n - up);
  printf("%-4s %-40s %-26s %10s %21s %12s %7s %6s\n", "GPU", "UUID", "MODEL", "MEMORY", "LAKE HELD / LIMIT", "FREE",
         "CLIENTS", "FRAG");
  for (int i = 0; i < n; i++) {
    node_lake *l = &lakes[i];
    if (!l->reply) {
      printf("%-4s %-40s DOWN: %s (ipc://%s)\n", "-", l->name, l->why, l->path);
      continue;
    }
    const Gmlake__LakeStats *s = l->reply->stats;
    char mem[32], held[32], lim[32], fr[32], hl[72];
    gmli_format_bytes(s->chunks_total * s->chunk_size, held, sizeof held);
    gmli_format_bytes(s->limit_bytes, lim, sizeof lim);
    snprintf(hl, sizeof hl, "%s / %s", held, lim);
    const char *model = s->device_model && *s->device_model ? s->device_model : s->backend;
    if (!s->device_total_bytes) snprintf(mem, sizeof mem, "-");
    else gmli_format_bytes(s->device_total_bytes, mem, sizeof mem);
    printf("%-4d %-40s %-26.26s %10s %21s %12s %7llu %5.1f%%\n", s->device, s->gpu_uuid, model, mem, hl,
           gmli_format_bytes(s->chunks_free * s->chunk_size, fr, sizeof fr), (unsigned long long)s->clients,
           100 * s->fragmentation);
    size_t top[NODE_TOP], nt = node_top(l, top);
    for (size_t k = 0; k < nt; k++) {
      const Gmlake__ClientInfo *c = l->reply->clients[top[k]];
      char pid[16] = "-", b1[32], b2[32];
      if (c->pid) snprintf(pid, sizeof pid, "%d", c->pid);
      printf("       pid %-8s uid %-6u %-16.16s holds %s (allocated %s)\n", pid, c->uid,
             c->pid ? c->name : "(another user)", gmli_format_bytes(c->leased_bytes, b1, sizeof b1),
             gmli_format_bytes(c->allocated, b2, sizeof b2));
    }
    if (l->reply->n_clients > nt) printf("       and %zu more client(s)\n", l->reply->n_clients - nt);
  }
}

int gmli_ctl_node(int json) {
  char dirs[NODE_DIRS_MAX][PATH_MAX];
  int from_socket, ndirs = node_dirs(dirs, &from_socket), n = 0, more = 0, up = 0;
  node_lake *lakes = calloc(NODE_LAKES_MAX, sizeof *lakes);
  if (!lakes) return 1;
  for (int i = 0; i < ndirs; i++) node_scan(dirs[i], lakes, &n, &more);
  if (!n) {
    char msg[2 * PATH_MAX + 200];
    snprintf(msg, sizeof msg, "no GMLake daemon on this node: no control endpoint (gmlake-*.ctl) in %s%s%s%s", dirs[0],
             ndirs > 1 ? " nor " : "", ndirs > 1 ? dirs[1] : "",
             from_socket ? " (the directory of GMLAKE_SOCKET)" : "");
    fprintf(stderr, "gmlakectl: %s\n", msg);
    if (json) {
      printf("{\"error\":{\"code\":%d,\"message\":", GML_EDAEMON);
      gmli_print_json_string(stdout, msg);
      printf("}}\n");
    }
    free(lakes);
    return 1;
  }
  for (int i = 0; i < n; i++) node_ask(&lakes[i], from_socket), up += lakes[i].reply != NULL;
  qsort(lakes, (size_t)n, sizeof *lakes, node_order);
  if (json) node_print_json(lakes, n);
  else node_print_table(lakes, n, up);
  if (more) fprintf(stderr, "gmlakectl: %d more lake(s) not shown (at most %d)\n", more, NODE_LAKES_MAX);
  for (int i = 0; i < n; i++)
    if (lakes[i].reply) gmlake__ctl_reply__free_unpacked(lakes[i].reply, NULL);
  free(lakes);
  return 0;
}
