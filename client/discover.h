/* discover.h: how a client finds and verifies its daemon.
 *
 * Unless a socket is named (gml_open_opts.socket_path or GMLAKE_SOCKET), a
 * client tries the system daemon's /run/gmlake/gmlake-N.sock first, then the
 * per-user $XDG_RUNTIME_DIR/gmlake-N.sock; never /tmp. Whatever the path, a
 * socket is used only when
 *   - its directory is writable by nobody but its owner (no group or other
 *     write bit: /tmp and other world-writable directories are refused),
 *   - the socket file belongs to root, to the client's own user or to the
 *     owner of that directory (the daemon's user),
 *   - the process that accepted the connection (SO_PEERCRED) runs as root or
 *     as the socket's owner.
 * Anyone who could replace the socket would need write access to that
 * directory, which the first rule leaves to its owner and root. */
#ifndef GML_DISCOVER_H
#define GML_DISCOVER_H
#include <stddef.h>

#define GML_SYSTEM_RUNTIME_DIR "/run/gmlake"
#define GML_PATH_MAX 256

/* The socket paths to try for device `device`, in order; `named` (may be
 * NULL) replaces the search. Returns how many (at most 2). */
int gml_daemon_candidates(int device, const char *named, char out[][GML_PATH_MAX]);

/* Connect to the first candidate that exists and passes the checks. Returns
 * a connected socket and its path in path_out, or -1 with `why` saying, for
 * every candidate, what was there and what was wrong. *refused is set when a
 * socket was found but failed a check (an untrusted daemon, not a missing one). */
int gml_daemon_connect(int device, const char *named, char *path_out, size_t path_len, char *why, size_t why_len,
                       int *refused);
#endif
