/* discover.h: how a client finds and verifies its daemon.
 *
 * Unless a socket is named (gml_open_opts.socket_path or GMLAKE_SOCKET), a
 * client tries the system daemon's /run/gmlake/gmlake-N.sock first, then the
 * per-user $XDG_RUNTIME_DIR/gmlake-N.sock; never /tmp. Whatever the path, a
 * socket is used only when no one but root, the client's own user and the
 * system daemon's user could have put it there (discover.c, check_socket):
 *   - the path is walked from / with its symlinks resolved; every directory
 *     on it belongs to root or the client's user, except /run/gmlake, whose
 *     owner (root, or the service user systemd gave it to) is the system
 *     daemon's user when only root may write /run (and so are that user's
 *     directories below it);
 *   - no directory on it is writable by group or others, except a sticky one
 *     (/tmp) above the socket's own directory, and then what the path takes
 *     from it (a directory, a symlink) belongs to root or the client's user:
 *     a /tmp/gmlake made by a third user is refused, whatever it contains;
 *   - the socket's own directory is writable by nobody but its owner;
 *   - the socket file belongs to root, the client's user or the system
 *     daemon's user (the owner of /run/gmlake on its path),
 *   - the process that accepted the connection (SO_PEERCRED) runs as root or
 *     as the socket's owner.
 * So anyone who could replace the socket or a directory above it is already
 * trusted; a daemon of another user elsewhere (their home, their directory
 * in /tmp) is never used. */
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
/* 0 when a socket at path would be trusted by the rules above (its path and
 * owner only: nothing is connected, so no SO_PEERCRED), else -1 with why;
 * *missing then says whether nothing is at path. For gmlakectl, whose
 * control endpoint beside GMLAKE_SOCKET must pass what that socket would. */
int gml_socket_path_trusted(const char *path, char *why, size_t why_len, int *missing);

int gml_daemon_connect(int device, const char *named, char *path_out, size_t path_len, char *why, size_t why_len,
                       int *refused);
#endif
