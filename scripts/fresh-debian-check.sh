#!/bin/sh
# scripts/fresh-debian-check.sh [REPO [REF]]: issue 13's acceptance on a fresh
# Debian bookworm (a chroot, as root; not part of make test: it downloads a
# system and takes a while).
#
#   1. debootstrap bookworm (minbase) once into /var/tmp/gmlake-fresh-debian/base,
#      then a fresh copy of it for every run (downloaded .debs are kept in
#      /var/tmp/gmlake-fresh-debian/apt-archives, so reruns are faster);
#   2. a clean clone of REPO at REF (default: this checkout's HEAD) in /root/gmlake;
#      no CUDA headers anywhere; `make` is the one package installed by hand
#      (a fresh Debian has none, and the README's commands are make targets);
#   3. the README's two commands: make demo, make test (they install their own packages);
#   4. make install; group gmlake; a non-root user in it;
#   5. the daemon started exactly as the unit's ExecStart says (%i = 0; systemd is
#      not PID 1 in a chroot), with RuntimeDirectory=/run/gmlake made as systemd
#      would and a NOTIFY_SOCKET that records READY=1 and STATUS=; there is no GPU
#      here, so after ExecStart as installed fails (it must: the unit asks for
#      cuda), the same command + --backend host;
#   6. as that user: the README's C example built with
#      cc prog.c $(pkg-config --cflags --libs gmlake) and run (GMLAKE_MODE=daemon:
#      it must reach the daemon), and gmlakectl stats;
#   7. when gmlaked has --metrics-listen: curl of /metrics parsed by prometheus_client;
#   8. make uninstall leaves nothing; make deb (dpkg-buildpackage, lintian clean), the packages installed,
#      the packaged unit's ExecStart run as the unit would (systemd is not PID 1 in a chroot: the command line is
#      read from the installed unit file and run as its User=/Group= with no capability), then purged: nothing of
#      GMLake's left (the user and group stay, as Debian keeps system users).
#
# GMLAKE_FRESH_ONLY=deb runs steps 1, 2 and 8 only (minutes, not the suite's half hour).
# Prints PASS/FAIL per step and a summary; exits 1 when a step failed.
set -u
REPO=$(cd "${1:-$(dirname "$0")/..}" && pwd)
REF=${2:-HEAD}
ONLY=${GMLAKE_FRESH_ONLY:-} # "deb": only make deb, its packages installed, run, purged (steps 1, 2 and 8)
CACHE=${GMLAKE_FRESH_CACHE:-/var/tmp/gmlake-fresh-debian}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=$CACHE/base
ROOT=$CACHE/root
LOG=$CACHE/log
[ "$(id -u)" = 0 ] || { echo "run as root (debootstrap, chroot, mounts)" >&2; exit 2; }
mkdir -p "$CACHE" "$CACHE/apt-archives/partial" "$LOG"
results=""
failed=0
step() { # step NAME: the result of the last command
  if [ "$1" = 0 ]; then results="$results
PASS  $2"; echo "== PASS: $2"; else results="$results
FAIL  $2"; echo "== FAIL: $2"; failed=1; fi
}
note() { results="$results
NOTE  $1"; echo "== NOTE: $1"; }

command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
if [ ! -e "$BASE/.complete" ]; then
  echo "== debootstrap bookworm into $BASE (once)"
  rm -rf "$BASE"
  debootstrap --variant=minbase bookworm "$BASE" "$MIRROR" >"$LOG/debootstrap.log" 2>&1 || { echo "debootstrap failed: $LOG/debootstrap.log" >&2; exit 1; }
  touch "$BASE/.complete"
fi

umount_all() {
  for m in var/cache/apt/archives dev/pts dev/shm dev sys/fs/cgroup sys proc; do
    mountpoint -q "$ROOT/$m" 2>/dev/null && umount -l "$ROOT/$m"
  done
  if mountpoint -q "$ROOT" 2>/dev/null; then umount -l "$ROOT"; fi
}
trap umount_all EXIT INT TERM
umount_all
if grep -q " $ROOT/" /proc/mounts; then echo "something is still mounted under $ROOT: not removing it" >&2; exit 1; fi
rm -rf --one-file-system "$ROOT"
cp -a "$BASE" "$ROOT"
rm -f "$ROOT/.complete"
# the chroot's root a mount point of its own: unshare -m (util-linux makes / private first) works in it,
# so the tests that need a mount namespace run here as on a machine, not "not run"
mount --bind "$ROOT" "$ROOT" && mount --make-private "$ROOT"
mount -t proc proc "$ROOT/proc"
mount -t sysfs sys "$ROOT/sys"
# the host's cgroup hierarchies (v1 and/or v2), as a booted machine has them: the cgroup quota tests and
# Slurm's proctrack/cgroup run instead of "not run"; a slave copy, so nothing done here unmounts the host's
if [ -d /sys/fs/cgroup ] && mountpoint -q /sys/fs/cgroup; then
  mount --rbind /sys/fs/cgroup "$ROOT/sys/fs/cgroup" && mount --make-rslave "$ROOT/sys/fs/cgroup"
fi
mount --bind /dev "$ROOT/dev"
mount -t devpts -o newinstance devpts "$ROOT/dev/pts" 2>/dev/null || true
mount -t tmpfs shm "$ROOT/dev/shm"
mount --bind "$CACHE/apt-archives" "$ROOT/var/cache/apt/archives"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
echo "deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://security.debian.org/debian-security bookworm-security main" > "$ROOT/etc/apt/sources.list"
REV=$(git -C "$REPO" rev-parse --short "$REF")
git clone -q --no-hardlinks "$REPO" "$ROOT/root/gmlake" && git -C "$ROOT/root/gmlake" checkout -q "$REV"
step $? "clean clone of $REPO at $REV"

inch() { chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 /bin/sh -c "$1"; }

[ ! -e "$ROOT/usr/local/cuda/include/cuda.h" ] && ! ls "$ROOT"/usr/include/cuda*.h >/dev/null 2>&1
step $? "no CUDA headers in the chroot"
inch 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make >/dev/null' >"$LOG/make-pkg.log" 2>&1
step $? "apt-get install make (the only package installed by hand)"

leftovers() { # files and directories named after GMLake outside the clone, dpkg's and apt's records, /proc and /run
  inch 'find / -xdev \( -path /root/gmlake -o -path /var/lib/dpkg -o -path /var/cache -o -path /proc -o -path /run -o -path /var/log \) -prune -o -iname "*gmlake*" -print'
}
if [ "$ONLY" != deb ]; then
echo "== make demo (log: $LOG/demo.log)"
inch 'cd /root/gmlake && make demo' >"$LOG/demo.log" 2>&1
step $? "make demo"
tail -n 12 "$LOG/demo.log"

echo "== make test (log: $LOG/test.log)"
start=$(date +%s)
inch 'cd /root/gmlake && make test' >"$LOG/test.log" 2>&1
step $? "make test ($(( $(date +%s) - start )) s)"
grep -E "^(all tests passed|fuzz targets passed|summary |make test: )" "$LOG/test.log"

inch 'cd /root/gmlake && make install' >"$LOG/install.log" 2>&1
step $? "make install"
inch 'ldconfig -p | grep -q libgmlake-client.so.1'
step $? "make install ran ldconfig (libgmlake-client.so.1 in the cache)"
inch 'getent group gmlake >/dev/null || groupadd -r gmlake; id alice >/dev/null 2>&1 || useradd -m -G gmlake alice'
step $? "group gmlake and user alice in it"

fi
if [ "$ONLY" != deb ]; then
# The unit's ExecStart as systemd would run it (instance 0).
unit="$ROOT/usr/local/lib/systemd/system/gmlaked@.service" # make install PREFIX=/usr/local: systemd looks there
execstart=$(sed -n 's/^ExecStart=//p' "$unit" | sed 's/%i/0/g')
gmlaked_bin=$(echo "$execstart" | cut -d' ' -f1)
# as the unit runs it: its User= and Group= (make install made them from sysusers.d), no capability
uuser=$(sed -n 's/^User=//p' "$unit"); ugroup=$(sed -n 's/^Group=//p' "$unit")
inch "id $uuser >/dev/null && getent group $ugroup >/dev/null"
step $? "make install made the unit's user $uuser and group $ugroup (sysusers.d)"
execstart="setpriv --reuid=$uuser --regid=$ugroup --init-groups --bounding-set=-all --inh-caps=-all --no-new-privs $execstart"
echo "== ExecStart: $execstart"
fi
cat > "$ROOT/root/notify.py" <<'PY'
# Receives sd_notify datagrams like systemd does; prints each.
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
import os; os.chmod(sys.argv[1], 0o666)  # the daemon runs as the unit's user, as systemd's socket lets it
while True:
    print(s.recv(4096).decode(errors="replace").replace("\n", " | "), flush=True)
PY
start_daemon() { # start_daemon EXTRA...: returns 0 once the socket is there
  inch "mkdir -p /run/gmlake && chmod 0755 /run/gmlake && chown $uuser:$ugroup /run/gmlake && rm -f /run/gmlake/notify && (python3 /root/notify.py /run/gmlake/notify > /run/gmlake/notify.log 2>&1 &) && sleep 0.5 && (NOTIFY_SOCKET=/run/gmlake/notify $execstart $* > /run/gmlake/daemon.log 2>&1 & echo \$! > /run/gmlake/daemon.pid)"
  for _ in $(seq 100); do
    [ -S "$ROOT/run/gmlake/gmlake-0.sock" ] && return 0
    inch 'kill -0 $(cat /run/gmlake/daemon.pid) 2>/dev/null' || return 1
    sleep 0.1
  done
  return 1
}
stop_notify() { inch 'pkill -f "^python3 /root/notify.py" || true'; }
if [ "$ONLY" != deb ]; then
if start_daemon; then
  step 0 "the unit's ExecStart started the daemon (cuda backend)"
else
  sleep 0.2
  cp "$ROOT/run/gmlake/daemon.log" "$LOG/daemon-cuda.log"
  stop_notify
  grep -qi cuda "$LOG/daemon-cuda.log"
  step $? "ExecStart as installed, no GPU here: refuses to start and says why ($(grep -i -m1 cuda "$LOG/daemon-cuda.log" | cut -c1-120))"
  start_daemon --backend host
  step $? "ExecStart + --backend host started the daemon with the installed default config"
fi
sleep 0.5
cat "$ROOT/run/gmlake/notify.log" 2>/dev/null | sed 's/^/  notify: /'
grep -q "READY=1" "$ROOT/run/gmlake/notify.log" 2>/dev/null
step $? "sd_notify READY=1"
grep -q "STATUS=" "$ROOT/run/gmlake/notify.log" 2>/dev/null
step $? "sd_notify STATUS= line"
ls -l "$ROOT/run/gmlake/" | sed 's/^/  /'

# The README's C example, as alice.
sed -n '/^## Linking a C program/,/^```$/p' "$ROOT/root/gmlake/README.md" | sed -n '/^```c$/,/^```$/p' | sed '1d;$d' > "$LOG/readme-example.c"
{
  grep '^#include' "$LOG/readme-example.c"
  echo '#include <stdio.h>'
  echo 'int main(void) {'
  grep -v '^#include' "$LOG/readme-example.c"
  echo '  puts("README example: done");'
  echo '  return 0;'
  echo '}'
} > "$ROOT/home/alice/prog.c"
chmod 644 "$ROOT/home/alice/prog.c"
asalice() { inch "su -s /bin/sh alice -c '$1'"; }
asalice 'cd ~ && cc prog.c $(pkg-config --cflags --libs gmlake)' >"$LOG/alice-cc.log" 2>&1
step $? "alice: cc prog.c \$(pkg-config --cflags --libs gmlake)"
asalice 'cd ~ && GMLAKE_LOG=info ./a.out' >"$LOG/alice-run.log" 2>&1
step $? "alice: the README example runs"
sed 's/^/  /' "$LOG/alice-run.log" | tail -n 6
asalice 'cd ~ && GMLAKE_MODE=daemon ./a.out' >"$LOG/alice-run-daemon.log" 2>&1
step $? "alice: the README example with GMLAKE_MODE=daemon (reaches the system daemon)"
sed 's/^/  /' "$LOG/alice-run-daemon.log" | tail -n 4
alice_uid=$(inch 'id -u alice')
grep -q "uid $alice_uid" "$ROOT/run/gmlake/daemon.log"
step $? "the daemon saw a client of alice's uid ($alice_uid)"
inch 'gmlakectl stats' >"$LOG/root-stats.log" 2>&1
step $? "root: gmlakectl stats (the control endpoint found at /run/gmlake)"
asalice 'gmlakectl stats' >"$LOG/alice-stats.log" 2>&1
step $? "alice: gmlakectl stats"
sed 's/^/  /' "$LOG/alice-stats.log"

# /metrics over HTTP, once gmlaked has --metrics-listen.
if inch "$gmlaked_bin --help" 2>&1 | grep -q -- --metrics-listen; then
  inch 'kill $(cat /run/gmlake/daemon.pid)'; sleep 1; stop_notify
  start_daemon --backend host --metrics-listen 127.0.0.1:9464
  step $? "daemon restarted with --metrics-listen 127.0.0.1:9464"
  inch 'command -v curl >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl >/dev/null'
  inch 'curl -sf http://127.0.0.1:9464/metrics' >"$LOG/metrics.txt" 2>&1
  step $? "curl http://127.0.0.1:9464/metrics"
  inch 'python3 -c "
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = list(text_string_to_metric_families(sys.stdin.read()))
assert fams, \"no metric families\"
print(\"  parsed %d families, %d samples\" % (len(fams), sum(len(f.samples) for f in fams)))
"' <"$LOG/metrics.txt"
  step $? "/metrics parses with prometheus_client"
else
  note "gmlaked has no --metrics-listen yet: /metrics over HTTP not checked"
fi

inch 'kill -TERM $(cat /run/gmlake/daemon.pid); for i in $(seq 50); do kill -0 $(cat /run/gmlake/daemon.pid) 2>/dev/null || exit 0; sleep 0.1; done; exit 1'
step $? "the daemon stops on SIGTERM"
stop_notify
cp "$ROOT/run/gmlake/daemon.log" "$LOG/daemon.log" 2>/dev/null

# make uninstall: what make install wrote, gone (GMLake's files outside /root's clone; the user, group and /run stay)
inch 'cd /root/gmlake && make uninstall' >"$LOG/uninstall.log" 2>&1
step $? "make uninstall"
left=$(leftovers)
[ -z "$left" ]
step $? "make uninstall left nothing of GMLake's${left:+: $(echo $left | cut -c1-200)}"

fi
if [ "$ONLY" = deb ]; then
  inch 'DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 procps >/dev/null' >"$LOG/deb-tools.log" 2>&1
  step $? "apt-get install python3 procps (GMLAKE_FRESH_ONLY=deb: make test, which installs them, did not run)"
fi
# The Debian packages: built with the Debian tools, lintian clean (make deb), installed, the unit's command line
# run as the unit runs it, purged.
echo "== make deb (log: $LOG/deb.log)"
inch 'cd /root/gmlake && make deb' >"$LOG/deb.log" 2>&1
step $? "make deb (dpkg-buildpackage; lintian: no error or warning)"
grep -E "^(make deb: |[EWIP]: )" "$LOG/deb.log" | sed 's/^/  /'
inch 'cd /root/gmlake && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ./build/deb/*.deb' >"$LOG/deb-install.log" 2>&1
step $? "apt-get install ./build/deb/*.deb (gmlaked, libgmlake-client1, libgmlake-client-dev)"
inch 'id gmlaked && getent group gmlake && [ -d /run/gmlake ] && [ -f /etc/gmlake/gmlaked.conf ] && ldconfig -p | grep -q libgmlake-client.so.1 && pkg-config --modversion gmlake' >"$LOG/deb-check.log" 2>&1
step $? "the packages made user gmlaked, group gmlake (sysusers.d), /run/gmlake (tmpfiles.d), the conffile; the library in ld.so's cache; gmlake.pc"
# systemd is not PID 1 in a chroot: the unit cannot be started; its ExecStart, read from the installed unit file, is
# run as the unit runs it (User=, Group=, no capability, no new privileges), on the host backend (no GPU here)
unit="$ROOT/lib/systemd/system/gmlaked@.service"
execstart=$(sed -n 's/^ExecStart=//p' "$unit" | sed 's/%i/0/g')
uuser=$(sed -n 's/^User=//p' "$unit"); ugroup=$(sed -n 's/^Group=//p' "$unit")
case $execstart in /usr/bin/gmlaked\ *) true;; *) false;; esac
step $? "the packaged unit runs /usr/bin/gmlaked ($execstart)"
execstart="setpriv --reuid=$uuser --regid=$ugroup --init-groups --bounding-set=-all --inh-caps=-all --no-new-privs $execstart"
inch 'rm -f /run/gmlake/*'
start_daemon --backend host
step $? "the packaged unit's ExecStart (as $uuser, no capability; + --backend host) started the daemon"
inch 'gmlakectl stats && gmlakectl' >"$LOG/deb-stats.log" 2>&1
step $? "gmlakectl stats and the node view (gmlakectl) against the packaged daemon"
sed 's/^/  /' "$LOG/deb-stats.log"
inch 'kill -TERM $(cat /run/gmlake/daemon.pid); for i in $(seq 50); do kill -0 $(cat /run/gmlake/daemon.pid) 2>/dev/null || exit 0; sleep 0.1; done; exit 1'
step $? "the packaged daemon stops on SIGTERM"
stop_notify
inch 'DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq gmlaked libgmlake-client1 libgmlake-client-dev' >"$LOG/deb-purge.log" 2>&1
step $? "apt-get purge gmlaked libgmlake-client1 libgmlake-client-dev"
left=$(leftovers)
[ -z "$left" ]
step $? "purge left nothing of GMLake's (files, conffiles, directories)${left:+: $(echo $left | cut -c1-200)}"
inch 'id gmlaked >/dev/null 2>&1 && getent group gmlake >/dev/null' &&
  note "user gmlaked and group gmlake stay after purge, as Debian does for system users (files may still be theirs); /run/gmlake goes at reboot (tmpfs)"

echo
echo "fresh Debian bookworm check of $REV ($(date -u '+%Y-%m-%d %H:%M UTC')); logs in $LOG:$results"
echo "$results" > "$LOG/summary.txt"
exit $failed
