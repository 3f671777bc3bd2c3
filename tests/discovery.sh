#!/bin/sh
# tests/discovery.sh BUILD: how a client finds its daemon (client/discover.h).
# A fake daemon in a world-writable directory is never connected to, whether
# named by GMLAKE_SOCKET or found through XDG_RUNTIME_DIR; GMLAKE_MODE=daemon
# without a usable daemon is an error that says why; falling back to embedded
# says so on stderr; as root, a socket owned by another user and a daemon
# whose process runs as a user other than the socket's owner are refused, and
# so is a daemon of a third user in its directory below a sticky
# world-writable one (a squatted /tmp/gmlake), while the caller's own and
# root's daemons, and the system daemon of a service user in /run/gmlake, are
# used.
set -e
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
TC="$(pwd)/$BUILD/gml-testclient"
w=$(mktemp -d)
p=$(mktemp -d)
pids=
cleanup() { for x in $pids; do kill "$x" 2>/dev/null || true; done; rm -rf "$w" "$p"; }
trap cleanup EXIT
fail() { echo "discovery test FAILED: $*" >&2; exit 1; }
DEV=63 # a device number no daemon of this machine serves
unset GMLAKE_SOCKET GMLAKE_MODE
# A fake daemon: accepts, writes one line per connection to its log, hangs up.
fake() { # fake SOCKET LOG [UID]: serve SOCKET, listening as UID (bound as the caller)
  python3 - "$@" <<'PY' &
import os, socket, sys
path, log = sys.argv[1], sys.argv[2]
f = open(log, "a")                # opened before any setuid
ready = open(log + ".ready", "w")
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o777)
if len(sys.argv) > 3:
    os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[3]))
s.listen(8)  # SO_PEERCRED reports the process that called listen()
ready.write("1"); ready.close()
while True:
    c, _ = s.accept()
    f.write("connected\n"); f.flush()
    c.close()
PY
  pids="$pids $!"
  for _ in $(seq 400); do [ -s "$2.ready" ] && return 0; sleep 0.05; done
  fail "fake daemon did not start"
}
chmod 1777 "$w" # like /tmp
fake "$w/gmlake-$DEV.sock" "$p/fake.log"

# 1. named by GMLAKE_SOCKET, GMLAKE_MODE=daemon: refused, an error that says why
if echo close | GMLAKE_SOCKET="$w/gmlake-$DEV.sock" GMLAKE_MODE=daemon "$TC" "default:$DEV" >"$p/out" 2>"$p/err"; then
  fail "a client used the socket in a world-writable directory: $(cat "$p/out")"
fi
grep -q "writable by everyone" "$p/err" && grep -q "GMLAKE_MODE=daemon" "$p/err" || fail "no clear error: $(cat "$p/err")"
echo "  GMLAKE_SOCKET in a world-writable directory, GMLAKE_MODE=daemon: refused: $(grep -m1 "no daemon" "$p/err" | cut -c1-160)..."

# 2. found through XDG_RUNTIME_DIR, mode unset: not used; embedded, and it says so
echo close | XDG_RUNTIME_DIR="$w" "$TC" "default:$DEV" >"$p/out" 2>"$p/err" || fail "client failed: $(cat "$p/err")"
grep -q "^ready .* embedded$" "$p/out" || fail "expected embedded: $(cat "$p/out")"
# by the device's UUID (the host backend's host-63), then by its ordinal (a daemon's gmlake-N link, an older daemon)
grep -q "no daemon at /run/gmlake/gmlake-host-$DEV.sock (.*); $w/gmlake-host-$DEV.sock (.*writable by everyone.*); /run/gmlake/gmlake-$DEV.sock (.*); $w/gmlake-$DEV.sock (.*writable by everyone.*); running embedded" "$p/err" \
  || fail "the fallback does not say where it looked and why: $(cat "$p/err")"
echo "  XDG_RUNTIME_DIR world-writable: the system path, then it, by UUID then by ordinal, all refused; stderr: $(grep -m1 "running embedded" "$p/err" | cut -c1-120)..."
[ ! -s "$p/fake.log" ] || fail "the fake daemon in a world-writable directory was connected to"
echo "  the fake daemon saw no connection"

# 3. no daemon anywhere, GMLAKE_MODE=daemon: an error
if echo close | GMLAKE_SOCKET="$p/none.sock" GMLAKE_MODE=daemon "$TC" "default:$DEV" >"$p/out" 2>"$p/err"; then
  fail "GMLAKE_MODE=daemon ran without a daemon"
fi
grep -q "no daemon at $p/none.sock (No such file or directory); GMLAKE_MODE=daemon: not running embedded" "$p/err" || fail "unclear error: $(cat "$p/err")"
echo "  GMLAKE_MODE=daemon without a daemon: $(grep -m1 "no daemon" "$p/err" | sed 's/^.*\] //')"

# 4. the same fake daemon in a private directory is connected to (the checks refuse only what they should)
mkdir "$p/priv" && chmod 700 "$p/priv"
fake "$p/priv/gmlake-$DEV.sock" "$p/priv.log"
echo close | GMLAKE_SOCKET="$p/priv/gmlake-$DEV.sock" GMLAKE_MODE=daemon "$TC" "default:$DEV" >/dev/null 2>&1 || true
[ -s "$p/priv.log" ] || fail "a socket in a private directory was not even tried"
echo "  a socket in a private directory is used"

# 4b. one socket per GPU: "%d" in GMLAKE_SOCKET stands for the device; a daemon of another
#     device is refused (its chunks are another GPU's memory), with a message that says what to do
mkdir "$p/gpus" && chmod 700 "$p/gpus"
"$(pwd)/$BUILD/gmlaked" --backend host --device 5 --socket "$p/gpus/gmlake-5.sock" --control "ipc://$p/gpus/ctl" \
  --limit 64MiB --log-level warn 2>"$p/d5.log" &
pids="$pids $!"
for _ in $(seq 400); do [ -S "$p/gpus/gmlake-5.sock" ] && break; sleep 0.05; done
echo close | GMLAKE_SOCKET="$p/gpus/gmlake-%d.sock" GMLAKE_MODE=daemon "$TC" "default:5" >"$p/out" 2>"$p/err" ||
  fail "GMLAKE_SOCKET with %d did not reach device 5's daemon: $(cat "$p/err")"
grep -q "^ready .* daemon$" "$p/out" || fail "expected daemon mode: $(cat "$p/out")"
echo "  GMLAKE_SOCKET=.../gmlake-%d.sock: device 5's client reached device 5's daemon"
echo close | GMLAKE_SOCKET="$p/gpus/gmlake-5.sock" "$TC" "default:6" >"$p/out" 2>"$p/err" &&
  fail "device 6's client used device 5's daemon: $(cat "$p/out")"
grep -q "this daemon serves host-5 (device 5); the client's device 6 is host-6" "$p/err" || fail "unclear error: $(cat "$p/err")"
echo "  device 6's client and device 5's daemon: refused: $(grep -m1 "daemon serves" "$p/err" | cut -c1-160)..."

# 4c. gmlakectl --device N and a private daemon given only --socket PATH: its control endpoint is
#     beside the socket (gmlake-N.ctl there), found from GMLAKE_SOCKET as clients find the socket
#     (gmlakectl looked in /run/gmlake and XDG_RUNTIME_DIR only, and said only "does not exist");
#     device 62: no system daemon (gmlaked@N of a GPU host) answers for it
mkdir "$p/priv62" "$p/xdg62" && chmod 700 "$p/priv62" "$p/xdg62"
"$(pwd)/$BUILD/gmlaked" --backend host --device 62 --socket "$p/priv62/gmlake-62.sock" --limit 64MiB --log-level warn 2>"$p/d62.log" &
pids="$pids $!"
for _ in $(seq 400); do [ -S "$p/priv62/gmlake-62.ctl" ] && break; sleep 0.05; done
[ -S "$p/priv62/gmlake-62.ctl" ] || fail "gmlaked --socket alone made no $p/priv62/gmlake-62.ctl: $(cat "$p/d62.log")"
GMLAKE_SOCKET="$p/priv62/gmlake-%d.sock" "$BUILD/gmlakectl" --device 62 --json stats >"$p/out" 2>"$p/err" ||
  fail "gmlakectl --device 62 did not find the daemon beside GMLAKE_SOCKET: $(cat "$p/err")"
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["limit_bytes"] == 64 << 20' "$p/out" ||
  fail "gmlakectl --device 62 --json stats: $(cat "$p/out")"
GMLAKE_SOCKET="$p/priv62/gmlake-62.sock" "$BUILD/gmlakectl" stats >/dev/null 2>"$p/err" &&
  fail "gmlakectl without --device reached device 62's daemon through a GMLAKE_SOCKET without %d"
grep -q "$p/priv62/gmlake-0.ctl does not exist" "$p/err" || fail "unclear error: $(cat "$p/err")"
echo "  gmlakectl --device 62, GMLAKE_SOCKET=.../gmlake-%d.sock: the daemon started with --socket alone, found beside it"
if env -u GMLAKE_SOCKET -u GMLAKE_CONTROL XDG_RUNTIME_DIR="$p/xdg62" "$BUILD/gmlakectl" --device 62 stats >"$p/out" 2>"$p/err"; then
  fail "gmlakectl --device 62 found a daemon nobody told it of: $(cat "$p/out")"
fi
# what it says it tried is what it tried: XDG_RUNTIME_DIR only where /run/gmlake is not its own
# (root, or a user who may write /run/gmlake, never looks there; it was named as tried all the same)
dialled=$(sed -n 's|.*cannot reach the daemon at ipc://\([^ ]*\): .*|\1|p' "$p/err")
[ -n "$dialled" ] || fail "gmlakectl's error names no endpoint: $(cat "$p/err")"
for want in "/run/gmlake/gmlake-62.ctl" "Tried for device 62: /run/gmlake/gmlake-62.ctl" "$dialled" \
            "--socket PATH and no --control serves ipc://<PATH's directory>/gmlake-62.ctl" \
            "give that as --control, or set GMLAKE_SOCKET=PATH"; do
  W="$want" awk 'index($0, ENVIRON["W"]) { f = 1 } END { exit !f }' "$p/err" || fail "gmlakectl's error lacks '$want': $(cat "$p/err")"
done
if [ "$dialled" != "$p/xdg62/gmlake-62.ctl" ] && grep -q "$p/xdg62" "$p/err"; then
  fail "gmlakectl says it tried $p/xdg62/gmlake-62.ctl, but dialled only $dialled: $(cat "$p/err")"
fi
echo "  without GMLAKE_SOCKET: $(cut -c1-200 "$p/err")..."
# 4d. ...but only where the client library would take the socket: a control endpoint in a directory
#     anyone may write ($w, like /tmp) is never dialled (anyone could have put a fake daemon there,
#     and gmlakectl would show its numbers and "limit set" for a limit nobody set); device 61
mkdir "$p/priv61" && chmod 700 "$p/priv61"
"$(pwd)/$BUILD/gmlaked" --backend host --device 61 --socket "$p/priv61/gmlake-61.sock" --control "ipc://$w/gmlake-61.ctl" \
  --limit 64MiB --log-level warn 2>"$p/d61.log" &
pids="$pids $!"
for _ in $(seq 400); do [ -S "$w/gmlake-61.ctl" ] && break; sleep 0.05; done
[ -S "$w/gmlake-61.ctl" ] || fail "gmlaked made no $w/gmlake-61.ctl: $(cat "$p/d61.log")"
if GMLAKE_SOCKET="$w/gmlake-%d.sock" "$BUILD/gmlakectl" --device 61 stats >"$p/out" 2>"$p/err"; then
  fail "gmlakectl took the control endpoint in a world-writable directory from GMLAKE_SOCKET: $(cat "$p/out")"
fi
grep -q "writable by everyone" "$p/err" || fail "unclear error: $(cat "$p/err")"
GMLAKE_SOCKET="$w/gmlake-%d.sock" "$BUILD/gmlakectl" --control "ipc://$w/gmlake-61.ctl" stats >/dev/null 2>"$p/err2" ||
  fail "gmlakectl --control (named, so taken as given) failed: $(cat "$p/err2")"
echo "  GMLAKE_SOCKET in a world-writable directory: gmlakectl does not dial the endpoint beside it: $(cut -c1-160 "$p/err")..."

if [ "$(id -u)" = 0 ]; then
  # 5. as root: a socket owned by another user (not the directory's owner) is refused
  mkdir "$p/root" && chmod 755 "$p/root"
  fake "$p/root/a.sock" "$p/a.log"
  chown 12345 "$p/root/a.sock"
  echo close | GMLAKE_SOCKET="$p/root/a.sock" GMLAKE_MODE=daemon "$TC" "default:$DEV" >/dev/null 2>"$p/err" && fail "used a socket owned by uid 12345"
  grep -q "belongs to uid 12345" "$p/err" || fail "unclear error: $(cat "$p/err")"
  [ ! -s "$p/a.log" ] || fail "connected to a socket owned by uid 12345"
  echo "  a socket owned by uid 12345 in root's directory: refused"
  # 6. as root: a root-owned socket whose listener runs as nobody: SO_PEERCRED refuses it
  nobody=$(id -u nobody 2>/dev/null || echo 65534)
  fake "$p/root/b.sock" "$p/b.log" "$nobody"
  echo close | GMLAKE_SOCKET="$p/root/b.sock" GMLAKE_MODE=daemon "$TC" "default:$DEV" >/dev/null 2>"$p/err" && fail "used a daemon running as uid $nobody behind a root socket"
  grep -q "runs as uid $nobody, neither root nor the socket's owner (0)" "$p/err" || fail "unclear error: $(cat "$p/err")"
  echo "  a root-owned socket served by uid $nobody: refused after SO_PEERCRED"
  # 6b. a user outside the socket's group (a new member who has not logged in again): the error says so
  chmod 711 "$p"
  # uid nobody runs copies of the programs: the checkout may lie where nobody may not look (/root, mode 700)
  mkdir -m 755 "$p/bin" && cp "$TC" "$(pwd)/$BUILD/gmlaked" "$p/bin/" && chmod 755 "$p/bin/"*
  fake "$p/root/c.sock" "$p/c.log"
  chmod 660 "$p/root/c.sock" && chgrp 0 "$p/root/c.sock"
  if echo close | setpriv --reuid="$nobody" --regid="$nobody" --clear-groups env GMLAKE_SOCKET="$p/root/c.sock" GMLAKE_MODE=daemon \
       "$p/bin/gml-testclient" "default:$DEV" >"$p/out" 2>"$p/err"; then fail "uid $nobody used a socket of mode 0660"; fi
  if grep -q "^ready\|not found\|denied.*gml-testclient" "$p/err" "$p/out"; then
    skip "discovery: group hint to a client outside the socket's group" "uid $nobody cannot run the test client here: $(head -c 200 "$p/err")"
  else
    grep -q "only its owner (root) and group $(getent group 0 | cut -d: -f1) may use it" "$p/err" || fail "no group hint: $(cat "$p/err")"
    echo "  uid $nobody outside the socket's group: $(grep -m1 "no daemon" "$p/err" | sed 's/^.*\] //' | cut -c1-150)..."
  fi
  # 6c. gmlakectl says the same of a control socket (it said only "Permission denied")
  cp "$(pwd)/$BUILD/gmlakectl" "$p/bin/" && chmod 755 "$p/bin/gmlakectl"
  "$p/bin/gmlaked" --backend host --limit 16MiB --prefetch 0 --socket "$p/root/e.sock" --control "ipc://$p/root/e.ctl" \
    --socket-mode 0660 --socket-group "$(getent group 0 | cut -d: -f1)" 2>"$p/e.log" &
  epid=$!
  pids="$pids $epid"
  for _ in $(seq 400); do [ -S "$p/root/e.ctl" ] && break; sleep 0.05; done
  [ -S "$p/root/e.ctl" ] || fail "gmlaked with a control socket of mode 0660 did not start: $(cat "$p/e.log")"
  if setpriv --reuid="$nobody" --regid="$nobody" --clear-groups "$p/bin/gmlakectl" --control "ipc://$p/root/e.ctl" stats \
       >"$p/out" 2>"$p/err"; then fail "uid $nobody used a control socket of mode 0660"; fi
  if grep -q "not found\|denied.*gmlakectl" "$p/err"; then
    skip "discovery: gmlakectl's group hint" "uid $nobody cannot run gmlakectl here: $(head -c 200 "$p/err")"
  else
    grep -q "Permission denied: only its owner (root) and group $(getent group 0 | cut -d: -f1) may use it" "$p/err" ||
      fail "gmlakectl gave no group hint: $(cat "$p/err")"
    echo "  gmlakectl as uid $nobody outside the control socket's group: $(cut -c1-170 "$p/err")"
  fi
  kill "$epid"
  # 7. a daemon that may not write /run/gmlake and has no XDG_RUNTIME_DIR does not fall back to /tmp
  if [ ! -e /run/gmlake ] || [ "$(stat -c %a /run/gmlake)" != 777 ]; then
    if env -u XDG_RUNTIME_DIR timeout 10 setpriv --reuid="$nobody" --regid="$nobody" --clear-groups "$p/bin/gmlaked" --backend host \
         >"$p/out" 2>&1; then fail "gmlaked without /run/gmlake or XDG_RUNTIME_DIR started"; fi
    grep -q "XDG_RUNTIME_DIR is unset: give --socket" "$p/out" || fail "unclear error: $(cat "$p/out")"
    echo "  gmlaked as uid $nobody without XDG_RUNTIME_DIR: refuses to start (no socket in /tmp)"
  fi
  # 8. the squatted directory: another user (nobody) made $w/gmlake in a sticky world-writable
  #    directory (like /tmp/gmlake) and runs a real gmlaked there, socket mode 0666. A client of
  #    root and one of an ordinary user naming it must refuse it, saying which directory and why;
  #    before, the socket belonged to its directory's owner, the daemon ran as that owner, and the
  #    client wrote its memory into chunks the squatter reads from /proc/PID/fd.
  victim=12346
  # nobody_daemon DIR LOG: a directory of nobody's and a gmlaked of nobody's serving in it (socket mode 0666)
  nobody_daemon() {
    mkdir -m 755 "$1" && chown "$nobody:$nobody" "$1"
    setpriv --reuid="$nobody" --regid="$nobody" --clear-groups "$p/bin/gmlaked" --backend host --device "$DEV" --limit 64MiB \
      --socket "$1/gmlake-$DEV.sock" --control "ipc://$1/gmlake-$DEV.ctl" --socket-mode 0666 --log-level warn 2>"$2" &
    pids="$pids $!"
    for _ in $(seq 400); do [ -S "$1/gmlake-$DEV.sock" ] && return 0; sleep 0.05; done
    return 1
  }
  nobody_daemon "$w/gmlake" "$p/squat.log" || fail "the squatter's gmlaked did not start: $(cat "$p/squat.log")"
  squat_why="$w/gmlake belongs to uid $nobody, neither root nor this user"
  for who in 0 "$victim"; do
    if echo close | setpriv --reuid="$who" --regid="$who" --clear-groups env GMLAKE_SOCKET="$w/gmlake/gmlake-%d.sock" \
         GMLAKE_MODE=daemon "$p/bin/gml-testclient" "default:$DEV" >"$p/out" 2>"$p/err"; then
      fail "uid $who used the daemon of uid $nobody in a squatted directory: $(cat "$p/out")"
    fi
    grep -q "$squat_why ($who)" "$p/err" && grep -q "anyone may create a name" "$p/err" || fail "unclear error for uid $who: $(cat "$p/err")"
  done
  echo "  a daemon of uid $nobody in its directory in a sticky world-writable one: refused: $(grep -m1 "no daemon" "$p/err" | sed 's/^.*\] //' | cut -c1-200)..."
  # the same directory reached through a symlink of root's own: resolved, and refused the same
  ln -s "$w/gmlake" "$p/root/alias"
  echo close | GMLAKE_SOCKET="$p/root/alias/gmlake-$DEV.sock" GMLAKE_MODE=daemon "$TC" "default:$DEV" >"$p/out" 2>"$p/err" &&
    fail "a symlink led root to the squatter's daemon: $(cat "$p/out")"
  grep -q "$squat_why (0)" "$p/err" || fail "unclear error through a symlink: $(cat "$p/err")"
  echo "  the same through a symlink in root's directory: refused"
  # a symlink that nobody put in the sticky directory, to a directory root trusts: refused (nobody may change it)
  setpriv --reuid="$nobody" --regid="$nobody" --clear-groups ln -s "$p/gpus" "$w/gpus-link"
  echo close | GMLAKE_SOCKET="$w/gpus-link/gmlake-5.sock" GMLAKE_MODE=daemon "$TC" "default:5" >"$p/out" 2>"$p/err" &&
    fail "followed a symlink of uid $nobody in a sticky directory: $(cat "$p/out")"
  grep -q "$w/gpus-link belongs to uid $nobody" "$p/err" || fail "unclear error for a symlink: $(cat "$p/err")"
  echo "  a symlink of uid $nobody in a sticky directory: refused"
  # a directory of another user that is not the system daemon's, even where only root may write: refused
  nobody_daemon "$p/root/other" "$p/other.log" || fail "nobody's gmlaked did not start: $(cat "$p/other.log")"
  echo close | GMLAKE_SOCKET="$p/root/other/gmlake-$DEV.sock" GMLAKE_MODE=daemon "$TC" "default:$DEV" >"$p/out" 2>"$p/err" &&
    fail "root used a daemon of uid $nobody outside /run/gmlake: $(cat "$p/out")"
  grep -q "$p/root/other belongs to uid $nobody, neither root nor this user (0)" "$p/err" || fail "unclear error: $(cat "$p/err")"
  echo "  a daemon of uid $nobody in its own directory (not /run/gmlake): refused"

  # 9. what must keep working: root through a symlink of its own in the sticky directory to its
  #    own daemon; an ordinary user's own daemon in its own directory below the sticky one,
  #    named and found through XDG_RUNTIME_DIR
  ln -s "$p/gpus" "$w/root-link"
  echo close | GMLAKE_SOCKET="$w/root-link/gmlake-%d.sock" GMLAKE_MODE=daemon "$TC" "default:5" >"$p/out" 2>"$p/err" ||
    fail "root's symlink to its own daemon was refused: $(cat "$p/err")"
  echo "  root's own symlink in a sticky directory to root's daemon: used"
  mkdir -m 700 "$w/mine" && chown "$victim:$victim" "$w/mine"
  setpriv --reuid="$victim" --regid="$victim" --clear-groups "$p/bin/gmlaked" --backend host --device "$DEV" --limit 64MiB \
    --socket "$w/mine/gmlake-$DEV.sock" --control "ipc://$w/mine/gmlake-$DEV.ctl" --log-level warn 2>"$p/mine.log" &
  pids="$pids $!"
  for _ in $(seq 400); do [ -S "$w/mine/gmlake-$DEV.sock" ] && break; sleep 0.05; done
  echo close | setpriv --reuid="$victim" --regid="$victim" --clear-groups env GMLAKE_SOCKET="$w/mine/gmlake-$DEV.sock" \
    GMLAKE_MODE=daemon "$p/bin/gml-testclient" "default:$DEV" >"$p/out" 2>"$p/err" || fail "uid $victim's own daemon refused: $(cat "$p/err")"
  grep -q "^ready .* daemon$" "$p/out" || fail "expected daemon mode: $(cat "$p/out")"
  echo close | setpriv --reuid="$victim" --regid="$victim" --clear-groups env XDG_RUNTIME_DIR="$w/mine" \
    GMLAKE_MODE=daemon "$p/bin/gml-testclient" "default:$DEV" >"$p/out" 2>"$p/err" || fail "uid $victim's XDG_RUNTIME_DIR daemon refused: $(cat "$p/err")"
  echo "  uid $victim's own daemon in its own directory below a sticky one: used (named, and through XDG_RUNTIME_DIR)"

  # 10. the system daemon run as a service user: /run/gmlake is that user's (root made it, as
  #     systemd's RuntimeDirectory= with User= does); clients of root find and use it. In a mount
  #     namespace of its own (a tmpfs on /run), where this machine allows one.
  if unshare -m true 2>/dev/null; then
    cat >"$p/sysd.sh" <<EOF
set -e
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -m 755 /run/gmlake && chown $nobody:$nobody /run/gmlake
setpriv --reuid=$nobody --regid=$nobody --clear-groups "$p/bin/gmlaked" --backend host --device $DEV --limit 64MiB \
  --socket /run/gmlake/gmlake-$DEV.sock --control ipc:///run/gmlake/gmlake-$DEV.ctl --socket-mode 0666 --log-level warn 2>"$p/sysd.log" &
d=\$!
for _ in \$(seq 100); do [ -S /run/gmlake/gmlake-$DEV.sock ] && break; sleep 0.05; done
rc=0
echo close | env -u XDG_RUNTIME_DIR GMLAKE_MODE=daemon "$TC" "default:$DEV" >"$p/out" 2>"$p/err" || rc=1
kill \$d; wait \$d || true
exit \$rc
EOF
    unshare -m sh "$p/sysd.sh" || fail "the system daemon of service uid $nobody in /run/gmlake was refused: $(cat "$p/err" "$p/sysd.log")"
    grep -q "^ready .* daemon$" "$p/out" || fail "expected daemon mode: $(cat "$p/out")"
    echo "  the system daemon as service uid $nobody in its /run/gmlake: found and used"
  else
    not_run "discovery: the service user's /run/gmlake" "no mount namespace here (unshare -m)"
  fi
else
  skip "discovery: the socket-owner, SO_PEERCRED and daemon-default cases" "they need root"
fi

# 11. GPUs by UUID (issue 27): a job given physical GPU 1 (CUDA_VISIBLE_DEVICES=1) sees it as its device
#     0; it must reach GPU 1's daemon, not GPU 0's (before: gmlake-0.sock, GPU 0's, whose chunks are
#     another GPU's memory). The host backend stands in for two GPUs: host-0 and host-1, its
#     CUDA_VISIBLE_DEVICES mapping visible ordinals as the driver does. Two daemons on their default
#     endpoints (--device host-0, and 1 for nvidia-smi's index): sockets and control endpoints named by
#     UUID, gmlake-N links to them; the client's allocation in host-1's lake only; a client forced to
#     the wrong daemon (GMLAKE_SOCKET) refused with both UUIDs named; gmlakectl --device host-1 / 1; a
#     found gmlake-N.sock of another GPU passed over; the links gone with their daemons. As root in a
#     mount namespace of its own (a tmpfs on /run: the defaults are /run/gmlake), else in XDG_RUNTIME_DIR.
mkdir -m 700 "$p/uuid"
cat >"$p/uuid.sh" <<EOF
set -e
B="$(pwd)/$BUILD"; P="$p/uuid"
if [ "\$(id -u)" = 0 ]; then
  mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -m 755 /run/gmlake
  DIR=/run/gmlake; unset XDG_RUNTIME_DIR
else
  DIR="\$P/xdg"; mkdir -m 700 "\$DIR"; export XDG_RUNTIME_DIR="\$DIR"
fi
unset GMLAKE_SOCKET GMLAKE_CONTROL GMLAKE_MODE CUDA_VISIBLE_DEVICES
fail() { echo "\$*" >"\$P/failed"; kill \$d0 \$d1 2>/dev/null; exit 1; }
"\$B/gmlaked" --backend host --device host-0 --limit 64MiB --prefetch 0 --log-level info 2>"\$P/d0.log" & d0=\$!
"\$B/gmlaked" --backend host --device 1 --limit 64MiB --prefetch 0 --log-level info 2>"\$P/d1.log" & d1=\$!
for _ in \$(seq 400); do [ -L "\$DIR/gmlake-0.ctl" ] && [ -L "\$DIR/gmlake-1.ctl" ] && break; sleep 0.05; done
for n in 0 1; do
  [ -S "\$DIR/gmlake-host-\$n.sock" ] && [ -S "\$DIR/gmlake-host-\$n.ctl" ] || fail "no gmlake-host-\$n.sock/.ctl in \$DIR: \$(ls -l "\$DIR"; cat "\$P/d\$n.log")"
  [ "\$(readlink "\$DIR/gmlake-\$n.sock")" = "gmlake-host-\$n.sock" ] && [ "\$(readlink "\$DIR/gmlake-\$n.ctl")" = "gmlake-host-\$n.ctl" ] ||
    fail "gmlake-\$n.sock/.ctl are no links to gmlake-host-\$n.sock/.ctl: \$(ls -l "\$DIR")"
done
grep -q "serving device 1 (host-1) on \$DIR/gmlake-host-1.sock, control ipc://\$DIR/gmlake-host-1.ctl" "\$P/d1.log" ||
  fail "the serving line does not name host-1: \$(cat "\$P/d1.log")"
# the job's device 0 is host-1: its allocation lands in host-1's lake, none in host-0's
mkfifo "\$P/in"
GMLAKE_BACKEND=host CUDA_VISIBLE_DEVICES=1 GMLAKE_MODE=daemon "\$B/gml-testclient" default:0 <"\$P/in" >"\$P/out" 2>"\$P/err" & c=\$!
exec 3>"\$P/in"
echo "alloc 4194304" >&3
for _ in \$(seq 400); do [ "\$(wc -l <"\$P/out")" -ge 2 ] && break; sleep 0.05; done
grep -q "^ready .* daemon\$" "\$P/out" && grep -q "^ok 0\$" "\$P/out" || fail "CUDA_VISIBLE_DEVICES=1 did not reach a daemon: \$(cat "\$P/out" "\$P/err")"
"\$B/gmlakectl" --device host-1 --json stats >"\$P/s1" && "\$B/gmlakectl" --device host-0 --json stats >"\$P/s0" || fail "gmlakectl --device host-N"
python3 - "\$P/s0" "\$P/s1" <<'PY' || fail "the allocation is not in host-1's lake alone: \$(cat "\$P/s0" "\$P/s1")"
import json, sys
s0, s1 = (json.load(open(f)) for f in sys.argv[1:])
assert s1["gpu_uuid"] == "host-1" and s1["device"] == 1 and s1["clients"] == 1 and s1["chunks_leased"] >= 2, s1
assert s0["gpu_uuid"] == "host-0" and s0["clients"] == 0 and s0["chunks_leased"] == 0, s0
PY
"\$B/gmlakectl" --device 1 stats >"\$P/h1" || fail "gmlakectl --device 1 (the link) failed"
grep -q "^device 1 (host-1, host backend)" "\$P/h1" || fail "gmlakectl --device 1 stats: \$(cat "\$P/h1")"
echo close >&3
exec 3>&-
wait \$c || fail "the client failed: \$(cat "\$P/err")"
# forced to host-0's daemon: refused, both GPUs named, by the daemon and by the client's error
if echo close | GMLAKE_BACKEND=host CUDA_VISIBLE_DEVICES=1 GMLAKE_SOCKET="\$DIR/gmlake-host-0.sock" "\$B/gml-testclient" default:0 >"\$P/out" 2>"\$P/err"; then
  fail "a client of host-1 used host-0's daemon: \$(cat "\$P/out")"
fi
why="this daemon serves host-0 (device 0); the client's device 0 is host-1: set GMLAKE_SOCKET to host-1's daemon or unset it"
grep -qF "\$why" "\$P/err" || fail "the refusal does not name both GPUs: \$(cat "\$P/err")"
grep -qF "refused: \$why" "\$P/d0.log" || fail "host-0's daemon did not log the refusal: \$(cat "\$P/d0.log")"
# device 0 of CUDA_VISIBLE_DEVICES=5 is host-5, which no daemon serves: host-0's gmlake-0.sock is passed over
echo close | GMLAKE_BACKEND=host CUDA_VISIBLE_DEVICES=5 "\$B/gml-testclient" default:0 >"\$P/out" 2>"\$P/err" || fail "host-5's client failed: \$(cat "\$P/err")"
grep -q "^ready .* embedded\$" "\$P/out" || fail "host-5's client used a daemon: \$(cat "\$P/out")"
grep -qF "\$DIR/gmlake-0.sock (this daemon serves host-0 (device 0); the client's device 0 is host-5" "\$P/err" ||
  fail "host-5's client does not say why gmlake-0.sock was passed over: \$(cat "\$P/err")"
kill \$d0 \$d1
wait \$d0 \$d1 || true
for f in gmlake-0.sock gmlake-0.ctl gmlake-1.sock gmlake-1.ctl; do
  [ ! -e "\$DIR/\$f" ] && [ ! -L "\$DIR/\$f" ] || fail "\$f left behind: \$(ls -l "\$DIR")"
done
EOF
if [ "$(id -u)" != 0 ]; then sh "$p/uuid.sh" || fail "GPUs by UUID: $(cat "$p/uuid/failed" 2>/dev/null)"
elif unshare -m true 2>/dev/null; then unshare -m sh "$p/uuid.sh" || fail "GPUs by UUID: $(cat "$p/uuid/failed" 2>/dev/null)"
else not_run "discovery: GPUs by UUID" "no mount namespace here (unshare -m) and, as root, the defaults are /run/gmlake's"; fi
if [ ! -e "$p/uuid/failed" ] && [ -e "$p/uuid/d1.log" ]; then
  echo "  GPUs by UUID: gmlake-host-N.sock/.ctl and gmlake-N links; CUDA_VISIBLE_DEVICES=1's device 0 in host-1's lake; forced to host-0: refused naming both; host-5's passes gmlake-0.sock over"
fi
