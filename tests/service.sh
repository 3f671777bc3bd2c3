#!/bin/sh
# tests/service.sh BUILD: the daemon as a service (issue 13, item 9):
# --version of gmlaked and gmlakectl; the sd_notify lines (READY=1, STATUS=)
# as systemd would receive them; SIGHUP reloads the limit, the quotas and the
# log level from the config file (a flag on the command line still wins), a
# config that does not parse leaves everything as it was, and the daemon
# lives on through both.
set -e
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
B="$(pwd)/$BUILD"
d=$(mktemp -d)
dpid= npid=
cleanup() { for x in $dpid $npid; do kill "$x" 2>/dev/null || true; done; rm -rf "$d"; }
trap cleanup EXIT
fail() { echo "service test FAILED: $*" >&2; [ -f "$d/daemon.log" ] && tail -n 20 "$d/daemon.log" >&2; exit 1; }
ctl() { "$B/gmlakectl" --control "ipc://$d/ctl" "$@"; }
# SIGHUP with the config just written: refused, its reason (REASON, a grep pattern) in the logged error
# line itself (before: a bare stderr line, then "(see above)"), the limit unchanged (32 MiB)
reload_refused() { # REASON WHAT
  kill -HUP $dpid
  for _ in $(seq 400); do grep -q "SIGHUP: .*$1.*: nothing reloaded" "$d/daemon.log" && break; sleep 0.05; done
  grep -q "\[error\] SIGHUP: .*$1.*: nothing reloaded" "$d/daemon.log" || fail "SIGHUP with $2: $(tail -n 3 "$d/daemon.log")"
  ctl stats --json | grep -q '"limit_bytes":33554432' || fail "a reload with $2 changed the limit: $(ctl stats --json)"
  # and systemd's STATUS= says so (systemctl status showed the last good state)
  wait_for 20 grep -q "STATUS=.*; last reload refused: .*$1" "$d/notify.log" || fail "STATUS= does not say the reload with $2 was refused"
}

for t in gmlaked gmlakectl; do
  v=$("$B/$t" --version) || fail "$t --version failed"
  echo "$v" | grep -Eq "^$t [0-9]+\.[0-9]+\.[0-9]+ " || fail "$t --version printed '$v'"
  echo "  $v"
done

python3 - "$d/notify" "$d/notify.log" <<'PY' &
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
log = open(sys.argv[2], "a")
open(sys.argv[2] + ".ready", "w").close()
while True:
    log.write(s.recv(4096).decode() + "\n"); log.flush()
PY
npid=$!
for _ in $(seq 400); do [ -e "$d/notify.log.ready" ] && break; sleep 0.05; done

cat > "$d/gmlaked.conf" <<'C'
backend = host
limit = 64MiB
prefetch = 0
log-level = warn
C
NOTIFY_SOCKET="$d/notify" "$B/gmlaked" --config "$d/gmlaked.conf" --socket "$d/sock" --control "ipc://$d/ctl" 2>"$d/daemon.log" &
dpid=$!
for _ in $(seq 400); do [ -S "$d/sock" ] && break; sleep 0.05; done
[ -S "$d/sock" ] || fail "daemon did not start"
for _ in $(seq 400); do grep -q "^READY=1" "$d/notify.log" && break; sleep 0.05; done
grep -q "READY=1" "$d/notify.log" || fail "no READY=1"
grep -q "STATUS=.*host.*limit 64.00 MiB" "$d/notify.log" || fail "no STATUS= line with the backend and the limit: $(cat "$d/notify.log")"
echo "  sd_notify: $(grep -m1 STATUS= "$d/notify.log")"
ctl stats --json | grep -q '"limit_bytes":67108864' || fail "limit from the config not in effect"

# SIGHUP: new limit, a quota, log level info
cat > "$d/gmlaked.conf" <<C
backend = host
limit = 32MiB
prefetch = 0
log-level = info
quota = uid:$(id -u) 8MiB
C
kill -HUP $dpid
for _ in $(seq 400); do ctl stats --json 2>/dev/null | grep -q '"limit_bytes":33554432' && break; sleep 0.05; done
kill -0 $dpid 2>/dev/null || fail "SIGHUP killed the daemon"
ctl stats --json | grep -q '"limit_bytes":33554432' || fail "SIGHUP did not reload the limit: $(ctl stats --json)"
echo "  SIGHUP: limit 64MiB -> 32MiB as gmlakectl sees it"
grep -q "reloaded" "$d/daemon.log" || fail "no log line at info level after the reload set log-level = info"
echo "  SIGHUP: log level warn -> info (the reload is logged: $(grep -m1 reloaded "$d/daemon.log" | sed 's/^.*\] //'))"
for _ in $(seq 400); do grep -q "STATUS=.*limit 32.00 MiB" "$d/notify.log" && break; sleep 0.05; done
grep -q "STATUS=.*limit 32.00 MiB" "$d/notify.log" || fail "STATUS= not updated after the reload"
grep -q "RELOADING=1" "$d/notify.log" || fail "no RELOADING=1 around the reload"
echo "  sd_notify after the reload: $(grep STATUS= "$d/notify.log" | tail -1)"
out=$(printf 'alloc 16777216\nclose\n' | "$B/gml-testclient" "$d/sock" 2>/dev/null | sed -n 2p)
echo "$out" | grep -q "^err $(sed -n 's/^ *X(EQUOTA, \(-[0-9]*\),.*/\1/p' include/gmlake.h) .*quota" || fail "quota uid:$(id -u) 8MiB from the config not applied: a 16 MiB allocation said '$out'"
echo "  SIGHUP: quota uid:$(id -u) 8MiB applied (a 16 MiB allocation: $out)"
# a cgroup's quota in the file (it was refused: a reload could not keep one)
cg=$(sed -n 's/^0:://p' /proc/self/cgroup)
# (the daemon takes a cgroup quota only where it sees the cgroup2 hierarchy: a chroot may not mount it)
if [ -n "$cg" ] && ! grep -q ' - cgroup2 ' /proc/self/mountinfo; then
  not_run "service: a cgroup quota from the config" "no cgroup2 hierarchy mounted here"
elif [ -n "$cg" ]; then
  printf 'backend = host\nlimit = 32MiB\nprefetch = 0\nlog-level = info\nquota = cgroup:%s 4MiB\n' "$cg" > "$d/gmlaked.conf"
  kill -HUP $dpid
  for _ in $(seq 400); do [ "$(grep -c reloaded "$d/daemon.log")" -ge 2 ] && break; sleep 0.05; done
  grep "reloaded" "$d/daemon.log" | tail -1 | grep -q "1 quota(s)" || fail "SIGHUP with quota = cgroup:$cg: $(tail -n 3 "$d/daemon.log")"
  out=$(printf 'alloc 6291456\nclose\n' | "$B/gml-testclient" "$d/sock" 2>/dev/null | sed -n 2p)
  echo "$out" | grep -q "^err .*quota.*cgroup" || fail "quota cgroup:$cg 4MiB from the config not applied: a 6 MiB allocation said '$out'"
  echo "  SIGHUP: quota cgroup:$cg 4MiB applied (a 6 MiB allocation: $out)"
else
  not_run "service: a cgroup quota from the config" "no cgroup v2 line in /proc/self/cgroup" # (else above)
fi

# a pid quota of no living process: said, and not counted as set (the reload said "1 quota(s)")
sh -c 'exit 0' & gone=$!
wait $gone
n=$(grep -c reloaded "$d/daemon.log")
printf 'backend = host\nlimit = 32MiB\nprefetch = 0\nlog-level = info\nquota = %s 10MiB\n' "$gone" > "$d/gmlaked.conf"
kill -HUP $dpid
for _ in $(seq 400); do [ "$(grep -c reloaded "$d/daemon.log")" -gt "$n" ] && break; sleep 0.05; done
grep -q "quota of pid $gone not set: no process $gone" "$d/daemon.log" || fail "SIGHUP with a quota of a gone pid: $(tail -n 3 "$d/daemon.log")"
grep "reloaded" "$d/daemon.log" | tail -1 | grep -q " 0 quota(s) (1 not set" || fail "SIGHUP counted a quota not set: $(grep reloaded "$d/daemon.log" | tail -1)"
echo "  SIGHUP: a quota of pid $gone (gone) is said not set and not counted: $(grep reloaded "$d/daemon.log" | tail -1 | sed 's/^.*: limit/limit/')"

# a socket-group that names no group: the reload is refused (the next start would fail on it)
printf 'backend = host\nlimit = 48MiB\nprefetch = 0\nlog-level = info\nsocket-group = gmlake-no-such-group\n' > "$d/gmlaked.conf"
reload_refused "gmlaked.conf:5: bad value for socket-group: no group 'gmlake-no-such-group' (create it first" \
  "a socket-group of no group"
echo "  SIGHUP: socket-group of no group refused, nothing reloaded"
printf 'backend = host\nlimit = 32MiB\nprefetch = 0\nlog-level = info\n' > "$d/gmlaked.conf"

# a key given twice: refused as any other mistake (before, the last one won without a word), nothing changes
printf 'backend = host\nlimit = 32MiB\nprefetch = 0\nlog-level = info\nlimit = 16MiB\n' > "$d/gmlaked.conf"
reload_refused "gmlaked.conf:5: limit given twice (lines 2 and 5): give it once" "limit given twice"
echo "  SIGHUP: a key given twice refused, naming both lines, nothing reloaded"

# quota lines add up, but two of one holder are a key given twice (before: the last one won, and the
# reload said "2 quota(s)"): refused at start and on SIGHUP, nothing changes
printf 'backend = host\nlimit = 16MiB\nquota = uid:1001 4MiB\nquota = uid:1000 8MiB\nquota = uid:1001 64MiB\n' > "$d/twice.conf"
rc=0; timeout 5 "$B/gmlaked" --config "$d/twice.conf" --socket "$d/twice.sock" --control "ipc://$d/twice.ctl" 2>"$d/twice.log" || rc=$?
[ $rc = 2 ] && grep -q "twice.conf:5: quota of uid:1001 given twice (lines 3 and 5): give one quota line a holder" "$d/twice.log" ||
  fail "a start with one holder's quota twice: exit $rc, $(cat "$d/twice.log")"
cp "$d/twice.conf" "$d/gmlaked.conf"
reload_refused "gmlaked.conf:5: quota of uid:1001 given twice (lines 3 and 5)" "one holder's quota twice"
echo "  one holder's quota twice: refused at start (exit 2) and on SIGHUP, naming the holder and both lines"

# a config that does not parse: nothing changes, the daemon lives on (a whole file: an appended
# "limit = lots" is now a key given twice)
printf 'backend = host\nlimit = lots\nprefetch = 0\nlog-level = info\n' > "$d/gmlaked.conf"
reload_refused "bad value for limit" "a bad config"
kill -0 $dpid 2>/dev/null || fail "a bad config on SIGHUP killed the daemon"
echo "  SIGHUP with a bad config: reported, nothing changed, still serving"
kill -TERM $dpid
wait $dpid || fail "daemon did not stop cleanly"
dpid=

# a SIGHUP the moment the socket is there (a service manager may send one): a reload, not the end
# (the handlers were set after the listeners: under ASan 8 of 20 such daemons died of the SIGHUP)
for i in $(seq 10); do
  "$B/gmlaked" --backend host --socket "$d/hup.sock" --control "ipc://$d/hup.ctl" --prefetch 0 2>"$d/hup.log" &
  dpid=$!
  for _ in $(seq 200000); do [ -S "$d/hup.sock" ] && break; done
  kill -HUP $dpid
  wait_for 20 grep -q "SIGHUP: reloaded" "$d/hup.log" || ! kill -0 $dpid 2>/dev/null ||
    fail "a SIGHUP right after the socket appeared: no reload in 20 s (try $i): $(tail -n 3 "$d/hup.log")"
  kill -0 $dpid 2>/dev/null || fail "a SIGHUP right after the socket appeared ended the daemon (try $i): $(tail -n 3 "$d/hup.log")"
  kill -TERM $dpid
  wait $dpid || fail "daemon did not stop cleanly after an early SIGHUP"
done
dpid=
echo "  SIGHUP as soon as the socket appears: reloaded, 10 of 10 daemons serve on"

# a socket in a directory others may write (as /tmp itself): the daemon says clients refuse it
mkdir "$d/open" && chmod 1777 "$d/open"
"$B/gmlaked" --backend host --socket "$d/open/s" --control "ipc://$d/open.ctl" --prefetch 0 2>"$d/open.log" &
dpid=$!
for _ in $(seq 400); do grep -q "serving device" "$d/open.log" && break; sleep 0.05; done
grep -q "a directory others may write: clients refuse such a socket" "$d/open.log" ||
  fail "no warning for a socket in a directory others may write: $(cat "$d/open.log")"
kill -TERM $dpid
wait $dpid || fail "daemon did not stop cleanly"
dpid=
echo "  a socket in a directory others may write: the daemon warns that clients refuse it"
# its own directory 0755, but one above it others may write and not sticky: clients refuse it all the
# same (client/discover.c walks the whole path), and the daemon said nothing (new-user trial)
mkdir -p "$d/wide/own" && chmod 0777 "$d/wide" && chmod 0755 "$d/wide/own"
"$B/gmlaked" --backend host --socket "$d/wide/own/s" --control "ipc://$d/wide.ctl" --prefetch 0 2>"$d/wide.log" &
dpid=$!
for _ in $(seq 400); do grep -q "serving device" "$d/wide.log" && break; sleep 0.05; done
grep -q "lies under $d/wide, a directory others may write (mode 0777, not sticky): clients refuse such a socket" "$d/wide.log" ||
  fail "no warning for a socket under a directory others may write: $(cat "$d/wide.log")"
! grep -q "others may write" "$d/hup.log" || fail "a warning for a socket in a directory of the daemon's own: $(cat "$d/hup.log")"
kill -TERM $dpid
wait $dpid || fail "daemon did not stop cleanly"
dpid=
echo "  a socket under a directory others may write (not sticky): the daemon warns that clients refuse it"

# a flag on the command line wins over the file, across a reload too
printf 'backend = host\nlimit = 64MiB\nprefetch = 0\n' > "$d/gmlaked.conf"
"$B/gmlaked" --config "$d/gmlaked.conf" --limit 16MiB --socket "$d/sock" --control "ipc://$d/ctl" 2>"$d/daemon.log" &
dpid=$!
for _ in $(seq 400); do [ -S "$d/sock" ] && break; sleep 0.05; done
printf 'backend = host\nlimit = 48MiB\nprefetch = 0\n' > "$d/gmlaked.conf"
kill -HUP $dpid
wait_for 20 grep -q "SIGHUP: reloaded" "$d/daemon.log" || fail "no reload in 20 s after SIGHUP: $(tail -n 3 "$d/daemon.log")"
ctl stats --json | grep -q '"limit_bytes":16777216' || fail "--limit 16MiB did not win over the file after SIGHUP: $(ctl stats --json)"
echo "  --limit on the command line still wins after SIGHUP"
kill -TERM $dpid
wait $dpid || fail "daemon did not stop cleanly"
dpid=

# the system file (/etc/gmlake/gmlaked.conf) is the system daemon's: root's daemon reads it when no --config is
# given; a user's private daemon does not (it failed on the system's settings, or took its quotas and metrics port).
# In a mount namespace, with a bad file of our own over /etc/gmlake; gmlaked --check-config opens nothing.
if [ "$(id -u)" != 0 ]; then
  skip "service: a private daemon does not read the system file" "needs root (a file over /etc/gmlake in a mount namespace)"
elif ! unshare -m true 2>/dev/null; then
  not_run "service: a private daemon does not read the system file" "no mount namespace here (unshare -m)"
else
  chmod 711 "$d" && mkdir -m 755 "$d/bin" && cp "$B/gmlaked" "$d/bin/" && chmod 755 "$d/bin/gmlaked"
  cat > "$d/sys.sh" <<SH
set -e
mkdir -p /etc/gmlake && mount -t tmpfs tmpfs /etc/gmlake
printf 'limit = lots\n' > /etc/gmlake/gmlaked.conf
rc=0; "$d/bin/gmlaked" --check-config --backend host > "$d/root.out" 2>&1 || rc=\$?
[ \$rc = 2 ] && grep -q "/etc/gmlake/gmlaked.conf:1: bad value for limit: 'lots'" "$d/root.out" || exit 3
setpriv --reuid=65534 --regid=65534 --clear-groups env XDG_RUNTIME_DIR=/nonexistent "$d/bin/gmlaked" --check-config \
  --backend host --socket "$d/u.sock" > "$d/user.out" 2>&1 || exit 4
SH
  unshare -m sh "$d/sys.sh" || fail "the system file: root's daemon must read it, a user's must not (exit $?): $(cat "$d/root.out" "$d/user.out" 2>/dev/null)"
  echo "  /etc/gmlake/gmlaked.conf: read by root's daemon ('limit = lots' refused), not by uid 65534's (valid: $(cat "$d/user.out"))"
fi

# one shared file, one per GPU (--instance-config, as the unit passes /etc/gmlake/gmlaked@N.conf): two
# instances with metrics-listen on their own ports (with it in the shared file only, every instance after
# the first failed: "Address already in use", a flag nobody gave)
pa=$((20000 + $$ % 20000)) && pb=$((pa + 1))
printf 'backend = host\nlimit = 32MiB\nprefetch = 0\nmetrics-listen = 127.0.0.1:%d\n' $pa > "$d/shared.conf"
printf 'metrics-listen = 127.0.0.1:%d # GPU 1 only\n' $pb > "$d/inst1.conf"
ipids=
for i in 0 1; do
  "$B/gmlaked" --device $i --config "$d/shared.conf" --instance-config "$d/inst$i.conf" --socket "$d/i$i.sock" \
    --control "ipc://$d/i$i.ctl" 2>"$d/i$i.log" &
  ipids="$ipids $!"
done
metrics() { /usr/bin/python3 -c "import sys, urllib.request; sys.exit(0 if b'gmlake_lake_limit_bytes' in urllib.request.urlopen('http://127.0.0.1:$1/metrics', timeout=5).read() else 1)" 2>/dev/null; }
wait_for 20 metrics $pa && wait_for 20 metrics $pb || { kill $ipids; fail "two instances, metrics on $pa and $pb: $(cat "$d/i0.log" "$d/i1.log")"; }
for p in $ipids; do kill -TERM $p; wait $p || fail "an instance did not stop cleanly"; done
echo "  two instances of one shared file: GPU 0's metrics on :$pa (the shared file's), GPU 1's on :$pb (its own file's)"

# a cgroup quota that cannot bind is refused, saying why (it was taken, and bound nothing): a cgroup that
# does not exist; on a host with no cgroup v2 hierarchy, any (checked where this host has one or not)
"$B/gmlaked" --backend host --socket "$d/cg.sock" --control "ipc://$d/cg.ctl" --prefetch 0 2>"$d/cg.log" &
dpid=$!
wait_for 20 test -S "$d/cg.sock" || fail "daemon for the cgroup quota checks did not start: $(cat "$d/cg.log")"
if "$B/gmlakectl" --control "ipc://$d/cg.ctl" quota "cgroup:/gmlake-no-such-cgroup-$$" 64MiB > "$d/cg.out" 2>&1; then
  fail "a quota of a cgroup that does not exist was taken"
fi
if grep -q " - cgroup2 " /proc/self/mountinfo; then
  grep -q "no cgroup /gmlake-no-such-cgroup-$$ on this host" "$d/cg.out" || fail "quota of no cgroup: $(cat "$d/cg.out")"
  "$B/gmlakectl" --control "ipc://$d/cg.ctl" quota "cgroup:/" 64MiB > "$d/cg.out" 2>&1 || fail "quota of cgroup / refused: $(cat "$d/cg.out")"
else
  grep -q "no cgroup v2 hierarchy" "$d/cg.out" || fail "a cgroup quota on a cgroup v1 host: $(cat "$d/cg.out")"
fi
"$B/gmlakectl" --control "ipc://$d/cg.ctl" quota "cgroup:/gmlake-no-such-cgroup-$$" 0 > "$d/cg.out" 2>&1 ||
  fail "removing a quota of a cgroup gone was refused: $(cat "$d/cg.out")"
kill -TERM $dpid; wait $dpid || fail "daemon did not stop cleanly"; dpid=
echo "  a cgroup quota that cannot bind (no such cgroup; no cgroup v2 here) is refused, saying why; removing one is not"
