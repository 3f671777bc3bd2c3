#!/bin/sh
# tests/install.sh BUILD: `make install` into a scratch DESTDIR and what it
# promises: files where they belong, gmlake.pc for its PREFIX (and static
# linking), a default config that a reinstall keeps, man pages without groff
# warnings, ldconfig only for a real install, the README's C example built
# with pkg-config, and the installed unit's ExecStart run by hand with the
# installed config (systemd cannot start units here).
set -e
BUILD=${1:-build}
d=$(mktemp -d)
run=$(mktemp -d)
dpid=
cleanup() { [ -n "$dpid" ] && kill "$dpid" 2>/dev/null; rm -rf "$d" "$run"; }
trap cleanup EXIT
fail() { echo "install test FAILED: $*" >&2; exit 1; }
P=/opt/gmlake-test
make -s install BUILD="$BUILD" DESTDIR="$d" PREFIX=$P >/dev/null
for f in $P/bin/gmlaked $P/bin/gmlakectl $P/lib/libgmlake-client.so.1 $P/lib/libgmlake-client.a $P/include/gmlake.h \
         $P/lib/pkgconfig/gmlake.pc $P/share/man/man8/gmlaked.8 $P/share/man/man1/gmlakectl.1 $P/share/man/man3/gmlake.3 \
         /etc/gmlake/gmlaked.conf /lib/systemd/system/gmlaked@.service; do
  [ -e "$d$f" ] || fail "make install did not create $f"
done
echo "  files installed under PREFIX=$P"
grep -qx "prefix=$P" "$d$P/lib/pkgconfig/gmlake.pc" || fail "gmlake.pc ignores PREFIX: $(head -1 "$d$P/lib/pkgconfig/gmlake.pc")"
grep -q "^ExecStart=$P/bin/gmlaked .*--backend cuda .*--config /etc/gmlake/gmlaked.conf" "$d/lib/systemd/system/gmlaked@.service" \
  || fail "the installed unit does not run $P/bin/gmlaked --backend cuda with the installed config"
echo "  gmlake.pc and the unit follow PREFIX; the unit asks for the cuda backend"
echo "limit = 1GiB # an operator's edit" >> "$d/etc/gmlake/gmlaked.conf"
make -s install BUILD="$BUILD" DESTDIR="$d" PREFIX=$P >/dev/null
grep -q "an operator's edit" "$d/etc/gmlake/gmlaked.conf" || fail "a reinstall overwrote /etc/gmlake/gmlaked.conf"
sed -i '$d' "$d/etc/gmlake/gmlaked.conf"
echo "  a reinstall keeps an existing /etc/gmlake/gmlaked.conf"
make -n install BUILD="$BUILD" | grep -q '^if \[ -z "" \] && command -v ldconfig' || fail "make install does not run ldconfig"
make -n install BUILD="$BUILD" DESTDIR=/x | grep -q '^if \[ -z "/x" \]' || fail "ldconfig guard for DESTDIR missing"
echo "  make install runs ldconfig (not with DESTDIR)"
for m in man/man*/*.[0-9]; do
  w=$(groff -z -man -ww "$m" 2>&1) || fail "groff on $m: $w"
  [ -z "$w" ] || fail "groff warnings in $m: $w"
done
echo "  man pages: no groff warnings"
# The README's C example, dynamically and statically linked through gmlake.pc.
cat > "$d/prog.c" <<'C'
#include <gmlake.h>
#include <stdio.h>
int main(void) {
  gml_client *c;
  int rc = gml_open(NULL, &c);
  if (rc) { fprintf(stderr, "%s\n", gml_strerror(rc)); return 1; }
  void *p;
  if ((rc = gml_alloc(c, 64 << 20, 0, &p))) { fprintf(stderr, "%s: %s\n", gml_strerror(rc), gml_last_error(c)); return 1; }
  gml_free(c, p);
  gml_close(c);
  puts("ok");
  return 0;
}
C
export PKG_CONFIG_PATH="$d$P/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$d"
cc "$d/prog.c" -o "$d/prog" $(pkg-config --cflags --libs gmlake)
[ "$(GMLAKE_MODE=embedded GMLAKE_BACKEND=host LD_LIBRARY_PATH="$d$P/lib" "$d/prog")" = ok ] || fail "the C example (shared) did not run"
mkdir "$d/static" && cp "$d$P/lib/libgmlake-client.a" "$d/static/"
cc "$d/prog.c" -o "$d/prog-static" $(pkg-config --cflags gmlake) -L"$d/static" $(pkg-config --static --libs-only-l --libs-only-other gmlake)
[ "$(GMLAKE_MODE=embedded GMLAKE_BACKEND=host "$d/prog-static")" = ok ] || fail "the C example (static) did not run"
echo "  the README's C example builds with pkg-config, shared and static (Libs.private)"
v=$("$d$P/bin/gmlakectl" --version) || fail "gmlakectl --version failed"
echo "$v" | grep -q "^gmlakectl [0-9]" || fail "gmlakectl --version printed '$v'"
echo "  $v"
# The installed unit's ExecStart, %i = 0, its paths moved into the scratch folders.
cmd=$(sed -n 's/^ExecStart=//p' "$d/lib/systemd/system/gmlaked@.service" | sed "s|%i|0|g; s|$P/|$d$P/|g; s|/etc/gmlake/|$d/etc/gmlake/|g; s|/run/gmlake/|$run/|g")
if ! getent group gmlake >/dev/null; then
  # shellcheck disable=SC2086
  if $cmd 2>"$run/log"; then fail "the unit's daemon started without a gmlake group"; fi
  grep -q "no group 'gmlake'" "$run/log" || fail "the unit's daemon without a gmlake group did not say so: $(cat "$run/log")"
  echo "  ExecStart without a gmlake group (groupadd not run): refuses to start, and says why"
  cmd=$(echo "$cmd" | sed "s/--socket-group gmlake/--socket-group $(getent group 0 | cut -d: -f1)/")
fi
start() {
  # shellcheck disable=SC2086
  $cmd "$@" 2>"$run/log" &
  dpid=$!
  for _ in $(seq 400); do [ -S "$run/gmlake-0.sock" ] && return 0; kill -0 $dpid 2>/dev/null || return 1; sleep 0.05; done
  return 1
}
if ! start; then
  wait $dpid 2>/dev/null || true
  dpid=
  grep -qi "cuda" "$run/log" || fail "the unit's daemon failed without saying why: $(cat "$run/log")"
  echo "  ExecStart as installed: no GPU here, and it says so: $(grep -i -m1 cuda "$run/log")"
  start --backend host || fail "ExecStart (+ --backend host) did not start: $(cat "$run/log")"
  echo "  ExecStart + --backend host (no GPU): started with the installed config"
else
  echo "  ExecStart as installed: started (cuda backend)"
fi
"$d$P/bin/gmlakectl" --control "ipc://$run/gmlake-0.ctl" stats | grep -q "chunks of" || fail "gmlakectl stats against the unit's daemon"
kill -TERM $dpid
wait $dpid || fail "the unit's daemon did not stop cleanly on SIGTERM"
dpid=
[ ! -e "$run/gmlake-0.sock" ] || fail "socket left behind"
echo "  gmlakectl stats reached it; SIGTERM stopped it cleanly"
# ExecReload's first command (gmlaked --check-config): the installed config passes, a bad one fails the reload
# (before, kill -HUP exited 0 whatever the file said: the refusal was only a log line)
reload=$(sed -n 's/^ExecReload=\(.*--check-config.*\)/\1/p' "$d/lib/systemd/system/gmlaked@.service" |
  sed "s|%i|0|g; s|$P/|$d$P/|g; s|/etc/gmlake/|$d/etc/gmlake/|g; s|/run/gmlake/|$run/|g; s/--socket-group gmlake/--socket-group $(getent group 0 | cut -d: -f1)/")
[ -n "$reload" ] || fail "the unit's ExecReload does not run gmlaked --check-config first"
# shellcheck disable=SC2086
$reload > "$run/check.out" 2>&1 || fail "ExecReload's check on the installed config failed: $(cat "$run/check.out")"
cp "$d/etc/gmlake/gmlaked.conf" "$run/conf.saved" && echo "limit = lots" >> "$d/etc/gmlake/gmlaked.conf"
# shellcheck disable=SC2086
if $reload > "$run/check.out" 2>&1; then fail "ExecReload's check passed a config with 'limit = lots'"; fi
grep -q "bad value for limit: 'lots'" "$run/check.out" || fail "ExecReload's check did not say why: $(cat "$run/check.out")"
cp "$run/conf.saved" "$d/etc/gmlake/gmlaked.conf"
echo "  ExecReload checks the file first (gmlaked --check-config): the installed one passes, 'limit = lots' fails, said"
