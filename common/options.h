/* options.h: every environment variable GMLake reads, in one table, and the
 * client library's options built from it.
 *
 * common/options.c is the only file that calls getenv, as tests/run.sh
 * checks. The library reads its GMLAKE_* variables once, at gml_open, into a
 * gml_options that explicit gml_open_opts override and that is passed down
 * to the backend and the allocator; the daemon and the tools read theirs
 * through gmli_env(). docs/environment.md's table of environment variables lists the same
 * names (tests/run.sh checks that too). A new variable is one line here, its
 * use, and its row in docs/environment.md. */
#ifndef GML_OPTIONS_H
#define GML_OPTIONS_H
#include <stdint.h>

/* (id, name, type, default, who reads it, help). type and default say what
 * is accepted and what holds when it is unset ("" = nothing). */
#define GML_ENV_VARS(X)                                                                                                \
  X(BACKEND, "GMLAKE_BACKEND", "auto, cuda, host", "auto", "library",                                                  \
    "physical backend; auto: cuda when a GPU is usable, else host (and it says which). "                               \
    "In daemon mode the daemon's backend is used; naming another is an error. The PyTorch entry points "               \
    "refuse the host memory auto falls back to unless host is named. Another value: gml_open fails (GML_EINVAL)")      \
  X(MODE, "GMLAKE_MODE", "daemon, embedded", "", "library",                                                            \
    "daemon: the daemon or an error; embedded: never connect; unset: the daemon if reachable, else embedded "          \
    "(and it says so on stderr). Another value: gml_open fails (GML_EINVAL)")                                          \
  X(SOCKET, "GMLAKE_SOCKET", "path", "/run/gmlake/gmlake-UUID.sock", "library",                                        \
    "the daemon's socket (gml_open_opts.socket_path wins; %d in it stands for the device); unset: "                    \
    "/run/gmlake/gmlake-UUID.sock, then $XDG_RUNTIME_DIR/gmlake-UUID.sock (UUID: the device's, from the "              \
    "driver), then gmlake-N.sock in each; a daemon of another GPU is refused; a socket in a directory others "         \
    "may write is never used")                                                                                         \
  X(LIMIT, "GMLAKE_LIMIT", "bytes, N%", "", "library",                                                                 \
    "embedded mode: the most this process holds, bytes or a share of the device (gml_open_opts.limit_bytes wins); "    \
    "through a daemon, the daemon's limit and quotas hold. A value that is neither, or 0 (unset is no limit): "        \
    "gml_open fails (GML_EINVAL)")                                                                                     \
  X(VA_SIZE, "GMLAKE_VA_SIZE", "bytes", "2x device memory, 64 GiB-1 TiB", "library",                                   \
    "virtual address space the allocator reserves (at least 64 chunks: less warns and takes 64); one "                 \
    "allocation may take at most half of it (the default's bound: the device's memory)")                               \
  X(CHUNK_SIZE, "GMLAKE_CHUNK_SIZE", "bytes", "cuda 6 MiB, host 2 MiB", "library, gmlaked",                            \
    "chunk size, a multiple of the device's granularity, at most 1 GiB; a client in daemon mode takes its "            \
    "daemon's")                                                                                                        \
  X(LIBCUDA, "GMLAKE_LIBCUDA", "path", "libcuda.so.1", "library, gmlaked", "the CUDA driver library to dlopen")        \
  X(TIMING, "GMLAKE_TIMING", "0, 1", "0", "library",                                                                   \
    "1: sum the time spent in every allocation (gml_stats.malloc_ns)")                                                 \
  X(STREAM_MAP, "GMLAKE_STREAM_MAP", "0, 1", "0", "library",                                                           \
    "1: a large allocation through a daemon that streams has its chunks imported by the library's reader "             \
    "thread as the replies come and mapped by the allocating thread meanwhile (two threads making driver "             \
    "calls at once); 0: imported, then mapped, on the allocating thread")                                              \
  X(HEADROOM, "GMLAKE_HEADROOM", "percent", "2", "library",                                                            \
    "fresh chunks leased beyond need, percent of the peak allocated, so a remap takes a chunk no other layout "        \
    "uses; 0 turns it off")                                                                                            \
  X(GUARD, "GMLAKE_GUARD", "0, 1 (end), both", "0", "library",                                                         \
    "guard mode: every allocation's end (both: and start) abuts memory never mapped (cuda: a chunk) or "               \
    "protected (host: a page); an access past it faults and is named (gml_block_of)")                                  \
  X(GUARD_GRAIN, "GMLAKE_GUARD_GRAIN", "bytes", "host: a page; cuda: a chunk", "library",                              \
    "guard mode: bytes per guard, a multiple of the finest dividing the chunk (2MiB on the host shows cuda's cost)")   \
  X(GUARD_BACKTRACE, "GMLAKE_GUARD_BACKTRACE", "0, 1", "0", "library",                                                 \
    "guard mode: keep each allocation's backtrace for the fault report")                                               \
  X(BORROW, "GMLAKE_BORROW", "0, 1", "0", "library",                                                                   \
    "cross-stream borrowing: a stream takes a block another stream freed, waiting for it on the device")               \
  X(BORROW_RATIO, "GMLAKE_BORROW_RATIO", "number >= 1", "1.5", "library",                                              \
    "a stream waits for another for a free block of at most this times the request (that stream's free "               \
    "blocks then join its own and are split as usual: client/policy.c, borrow_slow)")                                  \
  X(BORROW_MAX, "GMLAKE_BORROW_MAX", "0-64", "8", "library",                                                           \
    "the most borrows waiting on another stream's event at once")                                                      \
  X(COPY_STAGING, "GMLAKE_COPY_STAGING", "bytes", "256MiB", "library",                                                 \
    "the copy engine's (gml_copy) page-locked staging pool, taken at the first copy that needs it and kept: "          \
    "pageable host memory is copied through it in four slots, pipelined; 0: no staging (the driver's own)")            \
  X(COPY_THREADS, "GMLAKE_COPY_THREADS", "0-64", "the cores less one, at most 16", "library",                          \
    "threads that copy between pageable memory and the staging pool (beside the calling one); 0: the caller alone")    \
  X(COPY_PATHS, "GMLAKE_COPY_PATHS", "auto, 1", "auto", "library",                                                     \
    "auto: a large page-locked host<->device copy is split between this GPU's link and peer GPUs' links (a P2P "       \
    "hop), as a probe at the first such copy finds them to gain; 1: this GPU's link alone")                            \
  X(PAUSE_HOST, "GMLAKE_PAUSE_HOST", "pageable, pinned", "pageable", "library",                                        \
    "where gml_pause saves content: pageable memory through the copy engine's staging (nothing to page-lock), "        \
    "or page-locked memory kept after resume for the next pause (page-locking costs the first pause)")                 \
  X(PAUSE_OVERLAP, "GMLAKE_PAUSE_OVERLAP", "0, 1", "1", "library",                                                     \
    "1: gml_pause gives a block's chunks back as soon as its content is copied while later blocks copy, and "          \
    "gml_resume copies a block's content back while it maps the next; 0: every copy, then every give-back or map")     \
  X(SWAP, "GMLAKE_SWAP", "0, 1, bytes, N%", "0", "library",                                                            \
    "1: the PyTorch layer moves tensors saved for backward to host memory and back where a recorded iteration "        \
    "would not fit the process's limit (torch's memory fraction, GMLAKE_LIMIT), planned by the library "               \
    "(gml_swap_plan_build); bytes or N% of the device: that cap instead. gmlake.enable(swap=...) sets it")             \
  X(PLAN, "GMLAKE_PLAN", "0, 1, at:N", "0", "library",                                                                 \
    "planned placement: 1 records each iteration between gml_step marks (the PyTorch layer marks every "               \
    "optimizer step) and, once one repeats, serves iterations that follow it at offsets planned in one range "         \
    "(no search, no driver call), the rest as without a plan; given up (a warning) once 4 of the last 6 planned "      \
    "iterations depart from their plan; at:N plans iteration N only; 0: off (not in guard mode)")                      \
  X(RECONNECT, "GMLAKE_RECONNECT", "0, 1", "1", "library",                                                             \
    "1: when the daemon goes away (a restart, a crash), reconnect and hand it the chunks held; 0: go on "              \
    "without a daemon (leases fail with GML_EDAEMON)")                                                                 \
  X(LOG, "GMLAKE_LOG", "error, warn, info, debug", "warn (gmlaked: info)", "all",                                      \
    "log level (gmlaked: its --log-level or config file's log-level wins; a bad value warns, naming what is "          \
    "used)")                                                                                                           \
  X(CONTROL, "GMLAKE_CONTROL", "url", "ipc:///run/gmlake/gmlake-N.ctl", "gmlakectl",                                   \
    "the daemon's control endpoint (--control or --device wins)")                                                      \
  X(REPLAY_COST, "GMLAKE_REPLAY_COST", "unmap,map,access,sync", "18,28,0,100", "gmlake-replay",                        \
    "modelled cost of each driver call in microseconds (--steps)")                                                     \
  X(REPLAY_PROGRESS, "GMLAKE_REPLAY_PROGRESS", "any", "", "gmlake-replay",                                             \
    "set: print progress every 10,000 operations")                                                                     \
  X(DAEMON_CONFIG, "GMLAKED_CONFIG", "path", "/etc/gmlake/gmlaked.conf", "gmlaked",                                    \
    "config file (--config wins); when set, it must exist")                                                            \
  X(NOTIFY_SOCKET, "NOTIFY_SOCKET", "path", "", "gmlaked", "set by systemd: where READY=1 / STOPPING=1 go")            \
  X(JOURNAL_STREAM, "JOURNAL_STREAM", "DEVICE:INODE", "", "all",                                                       \
    "set by systemd: log lines carry priority prefixes for journald while stderr is the stream it names "              \
    "(st_dev:st_ino); inherited where stderr is elsewhere (a terminal, a file), it is ignored")                        \
  X(PYTORCH_ALLOC_CONF, "PYTORCH_ALLOC_CONF", "key:value,...", "", "library",                                          \
    "PyTorch's allocator settings, read for the PyTorch layer's clients (gml_device_client): "                         \
    "per_process_memory_fraction, garbage_collection_threshold, expandable_segments:True (always so) and "             \
    "backend:native apply; the pinned_* keys stay PyTorch's (its host allocator); any other key or value is "          \
    "warned about once, naming it and why it does not apply")                                                          \
  X(PYTORCH_CUDA_ALLOC_CONF, "PYTORCH_CUDA_ALLOC_CONF", "key:value,...", "", "library",                                \
    "the older name of PYTORCH_ALLOC_CONF, read where that is unset")                                                  \
  X(CUDA_VISIBLE_DEVICES, "CUDA_VISIBLE_DEVICES", "indices or UUIDs, comma-separated", "", "library, gmlaked",         \
    "read by the CUDA driver: which GPUs a process sees, as ordinals 0, 1, ...; the library names its device "         \
    "by the UUID the driver gives for its ordinal, so it finds that GPU's daemon. The host backend maps "              \
    "visible ordinal i to host-M where the i-th entry is M (or host-M); other entries, or none: host-i. "              \
    "gmlaked clears it (and sets CUDA_DEVICE_ORDER=PCI_BUS_ID) before it loads the driver: --device N is "             \
    "nvidia-smi's GPU N")                                                                                              \
  X(XDG_RUNTIME_DIR, "XDG_RUNTIME_DIR", "path", "", "all",                                                             \
    "a daemon that cannot write /run/gmlake puts its socket and control endpoint here (unset: it asks for "            \
    "--socket/--control); clients and gmlakectl look here after /run/gmlake (never in /tmp)")

typedef enum gml_env_id {
#define GML_ENV_ID(id, name, type, def, who, help) GML_ENV_##id,
  GML_ENV_VARS(GML_ENV_ID)
#undef GML_ENV_ID
      GML_ENV_COUNT
} gml_env_id;

/* The variable's value as gml_set_option last set it, else as the
 * environment has it now (NULL when unset; an empty value is unset too, so
 * VAR= in front of a command clears it). */
const char *gmli_env(gml_env_id id);
const char *gmli_env_name(gml_env_id id);
/* The table's default, documentation ("" when there is none). */
const char *gmli_env_default(gml_env_id id);
/* What the table says the variable accepts ("daemon, embedded"). */
const char *gmli_env_accepts(gml_env_id id);

/* The client library's options, read once at gml_open; gml_open_opts
 * override what they set. Strings are NULL when unset and are parsed where
 * they are used (sizes and percentages depend on the device), which is also
 * where a bad value is reported: gml_open refuses values of the variables
 * that say where memory comes from and how much a process may take (mode,
 * backend, limit: misread, a job would run in the wrong place or without
 * its limit), and warns about a tuning knob's, saying what it uses
 * instead. Reading them here says nothing. */
typedef struct gml_options {
  const char *backend;    /* GMLAKE_BACKEND, else "auto" */
  int backend_named;      /* the backend was asked for (by gml_open_opts or GMLAKE_BACKEND) */
  int mode;               /* GML_MODE_* from GMLAKE_MODE, 0 when unset, -1 when not a mode */
  const char *mode_text;  /* GMLAKE_MODE as it was set */
  const char *socket;     /* GMLAKE_SOCKET */
  const char *limit;      /* GMLAKE_LIMIT */
  const char *va_size;    /* GMLAKE_VA_SIZE */
  const char *chunk_size; /* GMLAKE_CHUNK_SIZE */
  const char *libcuda;    /* GMLAKE_LIBCUDA, else "libcuda.so.1" */
  const char *timing;     /* GMLAKE_TIMING */
  const char *stream_map; /* GMLAKE_STREAM_MAP */
  const char *headroom;   /* GMLAKE_HEADROOM */
  const char *guard, *guard_grain, *guard_backtrace; /* GMLAKE_GUARD, _GRAIN, _BACKTRACE */
  const char *borrow, *borrow_ratio, *borrow_max;    /* GMLAKE_BORROW, _RATIO, _MAX */
  const char *plan;                                  /* GMLAKE_PLAN */
} gml_options;

void gmli_options_from_env(gml_options *o);
#endif
