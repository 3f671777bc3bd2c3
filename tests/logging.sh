#!/bin/sh
# tests/logging.sh BUILD: what gmlaked logs and how.
# The level: --log-level or the config file's log-level, else GMLAKE_LOG (a
# bad value warned about, naming what it accepts and what is used), else
# info; a reload without log-level goes back to GMLAKE_LOG's. Priority
# prefixes ("<6>") only when stderr is the stream JOURNAL_STREAM names
# (DEVICE:INODE), not when the variable was merely inherited.
set -e
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
B="$(pwd)/$BUILD"
d=$(mktemp -d)
dpid=
cleanup() { [ -z "$dpid" ] || kill "$dpid" 2>/dev/null || true; rm -rf "$d"; }
trap cleanup EXIT
fail() { echo "logging test FAILED: $*" >&2; [ -f "$d/log" ] && tail -n 20 "$d/log" >&2; exit 1; }

printf 'backend = host\nlimit = 32MiB\nprefetch = 0\n' > "$d/plain.conf"
printf 'backend = host\nlimit = 32MiB\nprefetch = 0\nlog-level = info\n' > "$d/info.conf"
# start [VAR=value ...] -- [gmlaked flags]: a daemon with stderr appended to $d/log, until it serves
start() {
  vars=
  while [ "$1" != -- ]; do vars="$vars $1"; shift; done
  shift
  # shellcheck disable=SC2086
  env -u GMLAKE_LOG -u JOURNAL_STREAM $vars "$B/gmlaked" --socket "$d/sock" --control "ipc://$d/ctl" "$@" 2>>"$d/log" &
  dpid=$!
  for _ in $(seq 400); do [ -S "$d/sock" ] && break; kill -0 "$dpid" 2>/dev/null || break; sleep 0.05; done
  [ -S "$d/sock" ] || fail "the daemon did not start ($vars $*)"
}
stop() { kill -TERM "$dpid"; wait "$dpid" || fail "the daemon did not stop cleanly"; dpid=; }
# run [VAR=value ...] -- [flags]: start, stop; $d/log holds what it said
run() { : > "$d/log"; start "$@"; stop; }
serving() { grep -q "gmlaked\[info\] serving device" "$d/log" || grep -q "^<6>serving device" "$d/log"; }

run -- --config "$d/plain.conf"
serving || fail "no info line without GMLAKE_LOG (the default is info)"
! grep -q '\[debug\]' "$d/log" || fail "debug lines without GMLAKE_LOG"
echo "  GMLAKE_LOG unset: info"
for l in error warn; do
  run GMLAKE_LOG=$l -- --config "$d/plain.conf"
  ! serving || fail "GMLAKE_LOG=$l: the daemon logged at info"
done
echo "  GMLAKE_LOG=error, GMLAKE_LOG=warn: no info line"
run GMLAKE_LOG=debug -- --config "$d/plain.conf"
grep -q "gmlaked\[debug\] log level debug (GMLAKE_LOG)" "$d/log" && serving || fail "GMLAKE_LOG=debug: no debug line"
echo "  GMLAKE_LOG=debug: $(grep -m1 '\[debug\]' "$d/log" | sed 's/^.*\] //')"
run GMLAKE_LOG=bogus -- --config "$d/plain.conf"
grep -q "gmlaked\[warn\] GMLAKE_LOG=bogus: not a level (error, warn, info, debug); using info" "$d/log" && serving ||
  fail "GMLAKE_LOG=bogus: not warned about, or not info"
echo "  GMLAKE_LOG=bogus: $(grep -m1 'GMLAKE_LOG=bogus' "$d/log" | sed 's/^.*\] //')"
run GMLAKE_LOG=error -- --config "$d/plain.conf" --log-level info
serving || fail "GMLAKE_LOG=error won over --log-level info"
run GMLAKE_LOG=error -- --config "$d/info.conf"
serving || fail "GMLAKE_LOG=error won over the config file's log-level = info"
run GMLAKE_LOG=bogus -- --config "$d/info.conf"
! grep -q GMLAKE_LOG "$d/log" || fail "GMLAKE_LOG=bogus warned about where the config file sets the level"
echo "  --log-level and the config file's log-level win over GMLAKE_LOG (a bad one then unread)"

# SIGHUP: a file without log-level takes GMLAKE_LOG's again; one with it, its own
: > "$d/log"
cp "$d/info.conf" "$d/live.conf"
start GMLAKE_LOG=warn -- --config "$d/live.conf"
serving || fail "log-level = info in the file: no info line"
printf 'backend = host\nlimit = 30MiB\nprefetch = 0\n' > "$d/live.conf" # its limit tells the reload happened
kill -HUP "$dpid"
limit30() { "$B/gmlakectl" --control "ipc://$d/ctl" stats --json 2>/dev/null | grep -q '"limit_bytes":31457280'; }
wait_for 20 limit30 || fail "SIGHUP with limit = 30MiB: not reloaded in 20 s"
cp "$d/info.conf" "$d/live.conf"
kill -HUP "$dpid"
for _ in $(seq 400); do grep -q reloaded "$d/log" && break; sleep 0.05; done
[ "$(grep -c reloaded "$d/log")" = 1 ] && grep -q "reloaded .*log level info (--log-level or the config file)" "$d/log" ||
  fail "SIGHUP: a file without log-level did not go back to GMLAKE_LOG=warn, or one with it did not take it"
stop
echo "  SIGHUP: without log-level in the file GMLAKE_LOG=warn holds (that reload unlogged), with log-level = info it is logged"

# JOURNAL_STREAM: prefixes only when stderr is the stream it names
run JOURNAL_STREAM=8:1 -- --config "$d/plain.conf"
serving && ! grep -q '^<' "$d/log" || fail "JOURNAL_STREAM=8:1 (not stderr's): priority prefixes on a file"
: > "$d/log"
js=$(stat -c '%d:%i' "$d/log")
start JOURNAL_STREAM="$js" -- --config "$d/plain.conf"
stop
grep -q '^<6>serving device' "$d/log" && ! grep -q 'gmlaked\[' "$d/log" ||
  fail "JOURNAL_STREAM=$js (stderr's own DEVICE:INODE): no priority prefixes"
for bad in junk 8 "$js"x; do
  run JOURNAL_STREAM="$bad" -- --config "$d/plain.conf"
  serving && ! grep -q '^<' "$d/log" || fail "JOURNAL_STREAM=$bad: priority prefixes"
done
echo "  JOURNAL_STREAM: prefixes (<6>) when it names stderr ($js), none for another stream (8:1) or junk"
# why a start failed is an error to journald (<3>), whatever the level: `journalctl -p err` shows it (it was info)
: > "$d/log"
js=$(stat -c '%d:%i' "$d/log")
printf 'backend = host\nlimit = lots\n' > "$d/bad.conf"
if env JOURNAL_STREAM="$js" GMLAKE_LOG=error "$B/gmlaked" --config "$d/bad.conf" --socket "$d/sock" --control "ipc://$d/ctl" 2>>"$d/log"; then
  fail "gmlaked started with limit = lots"
fi
grep -q "^<3>gmlaked: $d/bad.conf:2: bad value for limit: 'lots'" "$d/log" || fail "a fatal config error under journald: $(cat "$d/log")"
# a socket already served (another daemon): refused at <3>, and its control endpoint, which it made, not left behind
start -- --config "$d/plain.conf"
: > "$d/log2"
js2=$(stat -c '%d:%i' "$d/log2")
if env JOURNAL_STREAM="$js2" "$B/gmlaked" --config "$d/plain.conf" --socket "$d/sock2" --control "ipc://$d/ctl" 2>>"$d/log2"; then
  fail "a second daemon on the same control endpoint started"
fi
grep -q "^<3>gmlaked: another daemon already serves $d/ctl" "$d/log2" || fail "a control endpoint in use, under journald: $(cat "$d/log2")"
[ ! -e "$d/sock2" ] || fail "a failed start left its socket $d/sock2"
stop
echo "  a failed start under journald: its reason at <3> (journalctl -p err), no socket of its own left behind"
