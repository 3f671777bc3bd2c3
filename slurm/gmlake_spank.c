/* gmlake_spank.c: a Slurm SPANK plugin that gives each job its share of the lakes of the GPUs it was
 * allocated, and takes it back when the job ends (README "Slurm", docs/cluster.md).
 *
 *   plugstack.conf:  optional /usr/local/lib/slurm/gmlake_spank.so default=8GiB
 *   job:             srun --gmlake-mem=16GiB ...   (per GPU; #SBATCH --gmlake-mem=16GiB)
 *
 * Plugin arguments: default=SIZE (the quota of a job that gives no --gmlake-mem; 0 or none: such a job
 * gets no quota), dir=DIR (where the daemons' control endpoints are, gmlake-N.ctl; /run/gmlake),
 * ctl=PATH (gmlakectl), scontrol=PATH, nogpu=N[,N...] (the lakes a job allocated no GPU gets a quota on: host-memory
 * lakes, or a node whose GPUs Slurm does not schedule; none by default), required (a step whose quota
 * cannot be set fails, instead of running without one).
 *
 * What binds the job's processes is its cgroup, which Slurm made and which no process of the job can
 * leave: with ProctrackType=proctrack/cgroup, cgroup v2 puts every task under .../job_<ID>/ (the
 * quota is "cgroup:/.../job_<ID>") and cgroup v1 under the freezer hierarchy's
 * /slurm[_<node>]/uid_<UID>/job_<ID>/ (the quota is "cgroup:freezer:/slurm.../job_<ID>": the daemon
 * reads each client's v1 lines too). The quota is a named one ("slurm-job-<ID>"): the daemon keeps its
 * peak and its metrics carry the name. It is set in task_post_fork, in slurmstepd as root, after the
 * step's tasks were put in their cgroup and before any of them runs the job's program (Slurm starts
 * them only once every task's post_fork is done); every step sets it again (the same quota: its peak
 * is kept), so a daemon restarted while the job runs has it back at the next step.
 *
 * The job's tasks find their lakes themselves: under the CUDA_VISIBLE_DEVICES Slurm sets, a client asks
 * its driver for the UUID of its device and connects to /run/gmlake/gmlake-<UUID>.sock; the plugin
 * sets nothing in the job's environment.
 *
 * At the end of a step each node's last task prints, to the step's stderr (srun's, or the batch
 * job's output file), the job's peak so far on each lake, and writes the same into the job's
 * AdminComment (scontrol show job, sacct -o AdminComment), which the last step leaves as the job's
 * peak (on a job of several nodes: the peak of the node whose step ended last). The job's epilog (slurmd, as root, once the job is over: ended, failed or cancelled)
 * removes the quota from every lake of the node; a slurmd restarted meanwhile runs the epilog when it
 * is back (slurmctld keeps the job completing until the node's epilog is done). */
#include "util.h"
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <slurm/spank.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

SPANK_PLUGIN(gmlake, 1);

#ifndef GMLAKE_BINDIR
#define GMLAKE_BINDIR "/usr/local/bin"
#endif
#define LAKES_MAX 64
#define CTL_TIMEOUT_MS 15000 /* one gmlakectl or scontrol call at most: a daemon that does not answer holds no step */

static struct {
  char dflt[32];      /* default= */
  char dir[256];      /* dir= */
  char ctl[256];      /* ctl= */
  char scontrol[256]; /* scontrol= */
  char nogpu[256];    /* nogpu= */
  int required;
} cfg = {"", "/run/gmlake", GMLAKE_BINDIR "/gmlakectl", "/usr/bin/scontrol", "", 0};

static char opt_mem[32]; /* --gmlake-mem */
static int opt_given;

/* What this slurmstepd set: the lakes and their UUIDs (reported at the step's end). */
static struct {
  int n;
  char lake[LAKES_MAX][64];
  char uuid[LAKES_MAX][64];
  int tasks_exited;
} step;

static int check_size(const char *s) {
  uint64_t v;
  return gmli_parse_size(s, 0, &v) == 0 ? 0 : -1;
}

static int opt_cb(int val, const char *optarg, int remote) {
  (void)val, (void)remote;
  if (!optarg || strlen(optarg) >= sizeof opt_mem || check_size(optarg)) {
    slurm_error("gmlake: --gmlake-mem=%s: a size per GPU is wanted (16GiB, 512MiB, 0 for none)", optarg ? optarg : "");
    return -1;
  }
  snprintf(opt_mem, sizeof opt_mem, "%s", optarg);
  opt_given = 1;
  return 0;
}

static struct spank_option mem_option = {
    "gmlake-mem",
    "SIZE",
    "GMLake: the job's quota on the memory lake of each GPU it is allocated (16GiB; 0 for none; the site's default "
    "otherwise)",
    1,
    0,
    opt_cb};

static int parse_args(int ac, char **av) {
  for (int i = 0; i < ac; i++) {
    const char *a = av[i];
    if (!strncmp(a, "default=", 8) && strlen(a + 8) < sizeof cfg.dflt && !check_size(a + 8))
      snprintf(cfg.dflt, sizeof cfg.dflt, "%s", a + 8);
    else if (!strncmp(a, "dir=", 4) && a[4] == '/' && strlen(a + 4) < sizeof cfg.dir)
      snprintf(cfg.dir, sizeof cfg.dir, "%s", a + 4);
    else if (!strncmp(a, "ctl=", 4) && a[4] == '/' && strlen(a + 4) < sizeof cfg.ctl)
      snprintf(cfg.ctl, sizeof cfg.ctl, "%s", a + 4);
    else if (!strncmp(a, "scontrol=", 9) && a[9] == '/' && strlen(a + 9) < sizeof cfg.scontrol)
      snprintf(cfg.scontrol, sizeof cfg.scontrol, "%s", a + 9);
    else if (!strncmp(a, "nogpu=", 6) && strlen(a + 6) < sizeof cfg.nogpu)
      snprintf(cfg.nogpu, sizeof cfg.nogpu, "%s", a + 6);
    else if (!strcmp(a, "required")) cfg.required = 1;
    else {
      slurm_error(
          "gmlake: bad plugin argument '%s' (default=SIZE dir=/DIR ctl=/PATH scontrol=/PATH nogpu=N,N required)", a);
      return -1;
    }
  }
  return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av) {
  if (spank_option_register(sp, &mem_option) != ESPANK_SUCCESS) return -1;
  return parse_args(ac, av);
}

/* The job's quota per GPU: its option, else the site's default; "" for none. */
static const char *job_bytes(spank_t sp) {
  char *v = NULL;
  if (!opt_given && spank_option_getopt(sp, &mem_option, &v) == ESPANK_SUCCESS && v && !check_size(v) &&
      strlen(v) < sizeof opt_mem)
    snprintf(opt_mem, sizeof opt_mem, "%s", v), opt_given = 1;
  const char *b = opt_given ? opt_mem : cfg.dflt;
  uint64_t n = 0;
  return b[0] && !gmli_parse_size(b, 0, &n) && n ? b : "";
}

/* Runs prog ARGS... (args NULL-terminated, at most 10), the first line of its output (stdout and stderr) that
 * starts with match (NULL: its first line) into out; returns its exit status (-1: it could not be run, or ran past
 * CTL_TIMEOUT_MS and was killed). */
static int run_cmd(const char *prog, const char *const *args, const char *match, char *out, size_t len) {
  const char *argv[12] = {prog};
  int n = 1;
  for (; args[n - 1] && n < 11; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  out[0] = 0;
  int fds[2];
  if (pipe(fds)) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]), close(fds[1]);
    return -1;
  }
  if (pid == 0) {                     /* slurmstepd has threads: nothing but async-signal-safe calls until exec */
    dup2(fds[1], 1), dup2(fds[1], 2); /* its errors too: said to the job's user */
    close(fds[0]), close(fds[1]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(fds[1]);
  char all[8192];
  size_t got = 0;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    long left = CTL_TIMEOUT_MS - ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
    struct pollfd p = {fds[0], POLLIN, 0};
    if (left <= 0 || (poll(&p, 1, (int)left) < 0 && errno != EINTR)) {
      kill(pid, SIGKILL);
      break;
    }
    char buf[512];
    ssize_t r = read(fds[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    for (ssize_t i = 0; i < r && got + 1 < sizeof all; i++) all[got++] = buf[i];
  }
  all[got] = 0;
  for (char *l = all; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (!match || !strncmp(l, match, strlen(match))) {
      snprintf(out, len, "%.*s", (int)strcspn(l, "\n"), l);
      break;
    }
  close(fds[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* gmlakectl --control ipc://DIR/gmlake-LAKE.ctl ARGS...: as run_cmd. */
static int run_ctl(const char *lake, const char *const *args, const char *match, char *out, size_t len) {
  char url[400];
  const char *argv[12] = {"--control", url};
  int n = 2;
  for (; args[n - 2] && n < 11; n++) argv[n] = args[n - 2];
  argv[n] = NULL;
  snprintf(url, sizeof url, "ipc://%s/gmlake-%s.ctl", cfg.dir, lake);
  return run_cmd(cfg.ctl, argv, match, out, len);
}

/* The job's cgroup from its task's /proc/PID/cgroup: "cgroup:/PATH/job_ID" (v2) or
 * "cgroup:CONTROLLER:/PATH/job_ID" (v1: freezer first, where proctrack/cgroup tracks). 0, or -1. */
static int job_cgroup(pid_t pid, uint32_t job, char *out, size_t len) {
  char path[64], line[4200], comp[32], v1[4200] = "";
  snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
  snprintf(comp, sizeof comp, "/job_%u", job);
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *ctrl = strchr(line, ':'), *cg = ctrl ? strchr(ctrl + 1, ':') : NULL;
    if (!cg) continue;
    *cg++ = 0, ctrl++;
    char *at = strstr(cg, comp);
    while (at && at[strlen(comp)] && at[strlen(comp)] != '/') at = strstr(at + 1, comp);
    if (!at) continue;
    at[strlen(comp)] = 0;
    char *comma = strchr(ctrl, ',');
    if (comma) *comma = 0;
    if (!*ctrl) found = snprintf(out, len, "cgroup:%s", cg) < (int)len; /* v2: what the daemon reads first */
    else if (!v1[0] || !strcmp(ctrl, "freezer")) snprintf(v1, sizeof v1, "cgroup:%s:%s", ctrl, cg);
  }
  fclose(f);
  if (!found && v1[0] && strlen(v1) < len) found = snprintf(out, len, "%s", v1) > 0;
  return found ? 0 : -1;
}

/* The lakes of the job on this node, "0,1" (Slurm's GPU indices: nvidia-smi's, the daemons' gmlake-N links). */
static void job_lakes(spank_t sp, char *out, size_t len) {
  out[0] = 0;
  if (spank_getenv(sp, "SLURM_JOB_GPUS", out, (int)len) == ESPANK_SUCCESS && out[0]) return;
  if (spank_getenv(sp, "SLURM_STEP_GPUS", out, (int)len) == ESPANK_SUCCESS && out[0]) return;
  snprintf(out, len, "%s", cfg.nogpu);
}

static int say_failure(spank_t sp, uint32_t job, const char *what) {
  (void)sp;
  slurm_error("gmlake: job %u: %s", job, what);
  slurm_spank_log("gmlake: job %u: %s%s", job, what, cfg.required ? "" : " (the job runs without a lake quota)");
  return cfg.required ? -1 : 0;
}

int slurm_spank_task_post_fork(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  int task = -1;
  uint32_t job = 0;
  pid_t pid = 0;
  if (!spank_remote(sp) || spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS || task != 0) return 0;
  const char *bytes = job_bytes(sp);
  char lakes[256], holder[4200], name[48], out[512], why[1400];
  job_lakes(sp, lakes, sizeof lakes);
  if (!bytes[0] || !lakes[0]) return 0; /* no quota asked for, or no lake */
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS || spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS)
    return say_failure(sp, job, "cannot tell the job or its task");
  if (job_cgroup(pid, job, holder, sizeof holder))
    return say_failure(sp, job,
                       "its tasks are in no cgroup of the job (ProctrackType=proctrack/cgroup makes one): "
                       "no quota could bind them");
  snprintf(name, sizeof name, "slurm-job-%u", job);
  step.n = 0;
  int rc = 0;
  for (char *save = NULL, *l = strtok_r(lakes, ",", &save); l && step.n < LAKES_MAX; l = strtok_r(NULL, ",", &save)) {
    const char *args[] = {"quota", holder, bytes, "--group", name, NULL};
    int st = run_ctl(l, args, NULL, out, sizeof out);
    if (st) {
      snprintf(why, sizeof why, "the quota of %s on lake %s (%s/gmlake-%s.ctl) could not be set: gmlakectl exit %d%s%s",
               bytes, l, cfg.dir, l, st, out[0] ? ": " : "", out);
      rc |= say_failure(sp, job, why);
      continue;
    }
    const char *on = strstr(out, " on "); /* "quota of HOLDER set to N bytes on UUID: quota ..." */
    snprintf(step.lake[step.n], sizeof step.lake[0], "%s", l);
    snprintf(step.uuid[step.n], sizeof step.uuid[0], "%.*s", on ? (int)strcspn(on + 4, ":") : 0, on ? on + 4 : "");
    step.n++;
    slurm_info("gmlake: job %u: %s", job, out);
  }
  return rc;
}

/* "UUID: peak P of Q" for each lake this step set, into out, "; " between (the job's peak so far: a named quota
 * keeps its peak for as long as it is set, across steps). */
static void job_peaks(uint32_t job, char *out, size_t len) {
  char name[48], row[512];
  size_t n = 0;
  out[0] = 0;
  snprintf(name, sizeof name, "slurm-job-%u ", job);
  for (int i = 0; i < step.n && n + 1 < len; i++) {
    const char *args[] = {"quotas", NULL};
    double q, h, p;
    char qu[16], hu[16], pu[16];
    /* its row: NAME QUOTA HELD PEAK HOLDER, sizes as "8.00 MiB" */
    if (run_ctl(step.lake[i], args, name, row, sizeof row) ||
        sscanf(row + strlen(name), "%lf %15s %lf %15s %lf %15s", &q, qu, &h, hu, &p, pu) != 6)
      continue;
    int k = snprintf(out + n, len - n, "%s%s: peak %.2f %s of %.2f %s", n ? "; " : "",
                     step.uuid[i][0] ? step.uuid[i] : step.lake[i], p, pu, q, qu);
    if (k > 0) n += (size_t)k < len - n ? (size_t)k : len - n - 1;
  }
}

/* A node's last task of the step has exited: the job's peak so far to the step's stderr (srun's, the batch job's
 * output) and into the job's AdminComment (while the job still runs: at the step's end it may be over, and
 * slurmctld takes no update of a finished job), which the job's last step leaves as the job's peak. */
int slurm_spank_task_exit(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  uint32_t job = 0, ntasks = 0;
  if (!spank_remote(sp) || !step.n || spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS || ++step.tasks_exited < (int)ntasks)
    return 0;
  char peaks[1024], comment[1100], jobarg[32], out[256];
  job_peaks(job, peaks, sizeof peaks);
  if (!peaks[0]) return 0;
  slurm_spank_log("gmlake: job %u: lake usage %s", job, peaks);
  snprintf(comment, sizeof comment, "AdminComment=gmlake %s", peaks);
  snprintf(jobarg, sizeof jobarg, "job=%u", job);
  const char *argv[] = {"update", jobarg, comment, NULL};
  int st = run_cmd(cfg.scontrol, argv, NULL, out, sizeof out);
  if (st) slurm_info("gmlake: job %u: AdminComment not updated (scontrol exit %d: %s): %s", job, st, out, peaks);
  return 0;
}

/* Lakes of the node, from DIR's control endpoints (gmlake-<UUID>.ctl and its gmlake-N.ctl link name one daemon:
 * its quota removed through the first, the second finds none). */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av) {
  uint32_t job = 0;
  if (parse_args(ac, av)) return -1; /* slurm_spank_init is not called before it */
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) return 0;
  char name[48], out[512];
  snprintf(name, sizeof name, "group:slurm-job-%u", job);
  DIR *d = opendir(cfg.dir);
  if (!d) {
    slurm_error("gmlake: job %u ended: cannot list %s for its lakes: %s", job, cfg.dir, strerror(errno));
    return 0;
  }
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n < 11 || n > 120 || strncmp(e->d_name, "gmlake-", 7) || strcmp(e->d_name + n - 4, ".ctl")) continue;
    char lake[128];
    snprintf(lake, sizeof lake, "%.*s", (int)(n - 11), e->d_name + 7);
    const char *args[] = {"quota", name, "0", NULL};
    if (run_ctl(lake, args, NULL, out, sizeof out) == 0) slurm_info("gmlake: job %u ended: %s", job, out);
  }
  closedir(d);
  return 0;
}
