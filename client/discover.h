/* discover.h: how a client finds and verifies its daemon.
 *
 * Unless a socket is named (gml_open_opts.socket_path or GMLAKE_SOCKET), a
 * client tries the system daemon's /run/gmlake/gmlake-<UUID>.sock first, then
 * the per-user $XDG_RUNTIME_DIR/gmlake-<UUID>.sock, UUID being the one its
 * driver gives its device (common/gpuname.h: under CUDA_VISIBLE_DEVICES=3,
 * device 0 is physical GPU 3, whose daemon serves gmlake-<its UUID>.sock);
 * then gmlake-N.sock in each (N its ordinal: a daemon's link by index, or an
 * older daemon's socket), where the hello tells whether that daemon serves
 * this GPU: one of another GPU is passed over (client/hello.c). Never /tmp.
 * Whatever the path, a
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
#define GML_CANDIDATES_MAX 4

/* The socket paths to try for this process's device (its ordinal `device`,
 * its UUID `uuid`, "" when no driver gave one), in order; `named` (may be
 * NULL; "%d" in it stands for the ordinal) replaces the search. Returns how
 * many (at most GML_CANDIDATES_MAX). */
int gmli_daemon_candidates(int device, const char *uuid, const char *named, char out[][GML_PATH_MAX]);

/* Connect to path if it passes the checks: the connected socket, or -1 with
 * why saying what was there and what was wrong (*refused set when a socket
 * was found but failed a check: an untrusted daemon, not a missing one). */
int gmli_daemon_dial(const char *path, char *why, size_t why_len, int *refused);
/* "PATH (REASON)" appended to why, after "; " when it holds some already. */
void gmli_why_add(char *why, size_t len, const char *path, const char *reason);
/* 0 when a socket at path would be trusted by the rules above (its path and
 * owner only: nothing is connected, so no SO_PEERCRED), else -1 with why;
 * *missing then says whether nothing is at path. For gmlakectl, whose
 * control endpoint beside GMLAKE_SOCKET must pass what that socket would. */
int gmli_socket_path_trusted(const char *path, char *why, size_t why_len, int *missing);

/* gmli_daemon_dial of the named socket (a reconnection's), its path in path_out, why as "PATH (REASON)". */
int gmli_daemon_connect(const char *named, char *path_out, size_t path_len, char *why, size_t why_len, int *refused);
#endif
