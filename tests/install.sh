#!/bin/sh
# tests/install.sh BUILD: `make install` into a scratch DESTDIR and what it
# promises: files where they belong, gmlake.pc for its PREFIX (and static
# linking), a default config that a reinstall keeps, man pages without groff
# warnings, ldconfig only for a real install, the README's C example built
# with pkg-config, and the installed unit's ExecStart run by hand with the
# installed config (systemd cannot start units here).
set -e
. "$(dirname "$0")/lib.sh"
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
         /etc/gmlake/gmlaked.conf /etc/systemd/system/gmlaked@.service /etc/sysusers.d/gmlake.conf; do
  [ -e "$d$f" ] || fail "make install did not create $f"
done
if [ -e "$BUILD/gmlake_spank.so" ]; then # the Slurm plugin, where libslurm-dev was there to build it
  [ -e "$d$P/lib/gmlake/gmlake_spank.so" ] || fail "make install did not install the Slurm plugin"
  grep -q "^optional $P/lib/gmlake/gmlake_spank.so .*ctl=$P/bin/gmlakectl" "$d$P/share/gmlake/plugstack.conf.example" ||
    fail "share/gmlake/plugstack.conf.example does not name PREFIX's plugin and gmlakectl"
fi
echo "  files installed under PREFIX=$P"
# every manual of man/, and `man 3 FUNCTION` for every function a man 3 page names (a .so link to the page)
for m in man/man*/*.[0-9]; do
  [ -e "$d$P/share/$m" ] || fail "make install did not install $m"
  for f in $(scripts/man-names.sh "$m"); do
    i="$d$P/share/man/${m#man/}"; i="${i%/*}/$f.${m##*.}"
    [ -e "$i" ] || fail "make install: no page for $f (named in $m)"
    [ "$f.${m##*.}" = "${m##*/}" ] || grep -qx ".so ${m#man/}" "$i" || fail "$i is not a link to ${m#man/}"
  done
done
MANPATH="$d$P/share/man" man -w gml_pool_create >/dev/null 2>&1 || ! command -v man >/dev/null ||
  fail "man -w gml_pool_create finds no page in the installed manuals"
echo "  manuals installed: $(ls man/man*/*.[0-9] | wc -l) pages, each function of a man 3 page's NAME a link to it"
grep -qx "prefix=$P" "$d$P/lib/pkgconfig/gmlake.pc" || fail "gmlake.pc ignores PREFIX: $(head -1 "$d$P/lib/pkgconfig/gmlake.pc")"
grep -q "^ExecStart=$P/bin/gmlaked .*--backend cuda .*--config /etc/gmlake/gmlaked.conf" "$d/etc/systemd/system/gmlaked@.service" \
  || fail "the installed unit does not run $P/bin/gmlaked --backend cuda with the installed config"
echo "  gmlake.pc and the unit follow PREFIX; the unit asks for the cuda backend"
# the units where systemd looks for that PREFIX (PREFIX=/opt/...: /etc/systemd/system; it put them in /lib/systemd/system
# whatever the PREFIX), python/'s sources and nothing of a local build (python/build, egg-info were copied)
for pu in /usr/local:/usr/local/lib/systemd/system:/usr/local/lib/sysusers.d /usr:/lib/systemd/system:/usr/lib/sysusers.d; do
  make -s -n install BUILD="$BUILD" DESTDIR=/x PREFIX=${pu%%:*} > "$run/n" 2>&1
  u=${pu#*:}
  grep -q "> /x${u%%:*}/\$u;" "$run/n" && grep -q "/x${u#*:}/gmlake.conf" "$run/n" ||
    fail "PREFIX=${pu%%:*}: the units not in ${u%%:*} or sysusers.d not in ${u#*:}: $(grep -E 'systemd|sysusers' "$run/n")"
done
[ -f "$d$P/share/gmlake/python/build_backend/gmlake_build.py" ] && [ -f "$d$P/share/gmlake/python/gmlake/__init__.py" ] ||
  fail "python/'s sources not installed"
# every file of the extension's build (setup.py's sources and depends: a header missing there made pip
# install the pure-Python package on the GPU machine, its compile failing) and every module is shipped
for f in $(cd python && git ls-files gmlake build_backend setup.py pyproject.toml 2>/dev/null || ls gmlake/* build_backend/*.py setup.py pyproject.toml); do
  case $f in *.py|*.cpp|*.h|*.toml) [ -f "$d$P/share/gmlake/python/$f" ] || fail "make install did not ship python/$f (setup.py builds with it)";; esac
done
extra=$(find "$d$P/share/gmlake/python" -name build -o -name '*.egg-info' -o -name '*.so' -o -name __pycache__)
[ -z "$extra" ] || fail "make install copied a local build of python/: $extra"
echo "  units: /usr/local/lib/systemd/system (PREFIX=/usr/local), /lib/systemd/system (/usr), /etc/systemd/system (else);"
echo "  python/'s sources without build/, egg-info or __pycache__"
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
# The unit names no socket: the daemon's defaults (/run/gmlake/gmlake-<UUID>.sock, gmlake-0.sock a link to it).
# Outside a mount namespace, the scratch folder stands in for /run/gmlake (the last flags win).
cmd=$(sed -n 's/^ExecStart=//p' "$d/etc/systemd/system/gmlaked@.service" | sed "s|%i|0|g; s|$P/|$d$P/|g; s|/etc/gmlake/|$d/etc/gmlake/|g")
cmd="$cmd --socket $run/gmlake-0.sock --control ipc://$run/gmlake-0.ctl"
# As the unit runs it: its User= and Group= (made from the installed sysusers.d file, as make install does
# on a real install), no capability (its CapabilityBoundingSet= is empty), no new privileges.
user=$(sed -n 's/^User=//p' "$d/etc/systemd/system/gmlaked@.service")
group=$(sed -n 's/^Group=//p' "$d/etc/systemd/system/gmlaked@.service")
[ "$user" = gmlaked ] && [ "$group" = gmlake ] || fail "the unit's User=/Group= are '$user'/'$group', not gmlaked/gmlake"
grep -qx 'CapabilityBoundingSet=' "$d/etc/systemd/system/gmlaked@.service" || fail "the unit keeps capabilities"
as_unit=
if [ "$(id -u)" = 0 ] && command -v systemd-sysusers >/dev/null; then
  systemd-sysusers "$d/etc/sysusers.d/gmlake.conf" || fail "systemd-sysusers on the installed sysusers.d file failed"
  id "$user" >/dev/null && getent group "$group" >/dev/null || fail "sysusers.d did not make $user and $group"
  as_unit="setpriv --reuid=$user --regid=$group --init-groups --bounding-set=-all --inh-caps=-all --no-new-privs"
else
  skip "install: the unit's daemon as its user with no capability" "needs root and systemd-sysusers"
fi
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
reload=$(sed -n 's/^ExecReload=\(.*--check-config.*\)/\1/p' "$d/etc/systemd/system/gmlaked@.service" |
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
# The unit's daemon as the unit runs it, in a mount namespace with its own /run/gmlake (RuntimeDirectory=, owned
# by the unit's user): a client trusts a daemon of a service user there only, as it would on a real node.
if [ -n "$as_unit" ]; then
  if ! unshare -m true 2>/dev/null; then
    not_run "install: the unit's daemon as its user with no capability" "no mount namespace here (unshare -m)"
  else
    ucmd=$(sed -n 's/^ExecStart=//p' "$d/etc/systemd/system/gmlaked@.service" | sed "s|%i|0|g; s|$P/|$d$P/|g; s|/etc/gmlake/|$d/etc/gmlake/|g")
    [ -e /dev/nvidiactl ] || ucmd="$ucmd --backend host" # no GPU here
    chmod 711 "$d" "$run" && mkdir -m 755 "$run/bin" && cp "$BUILD/gml-testclient" "$run/bin/" && chmod 755 "$run/bin/gml-testclient"
    gid=$(getent group "$group" | cut -d: -f3)
    cat > "$run/unit.sh" <<SH
set -e
mkdir -p /run/gmlake && mount -t tmpfs -o mode=0755 tmpfs /run/gmlake && chown $user:$group /run/gmlake
$as_unit $ucmd 2> "$run/unit.log" &
pid=\$!
trap 'kill \$pid 2>/dev/null' EXIT # a failed step leaves no daemon behind
for _ in \$(seq 400); do [ -S /run/gmlake/gmlake-0.sock ] && break; kill -0 \$pid || exit 3; sleep 0.05; done
[ -S /run/gmlake/gmlake-0.sock ] || exit 3
[ "\$(stat -c %U /proc/\$pid)" = "$user" ] || exit 4
for cap in CapEff CapPrm CapBnd CapAmb; do grep -q "^\$cap:[[:space:]]*0*\$" /proc/\$pid/status || exit 5; done
[ "\$(stat -L -c '%G %a' /run/gmlake/gmlake-0.sock)" = "$group 660" ] || exit 6 # gmlake-0.sock: a link to the UUID's
printf 'alloc 4096\\nclose\\n' | setpriv --reuid=65534 --regid=65534 --groups=$gid env GMLAKE_MODE=daemon "$run/bin/gml-testclient" default:0 > "$run/client.out" 2>&1 || exit 7
grep -q "^ok 0" "$run/client.out" || exit 7
kill -TERM \$pid
wait \$pid || exit 8
trap - EXIT
SH
    unshare -m sh "$run/unit.sh" || fail "the unit's daemon as $user (step $?: 3 start, 4 user, 5 capabilities, 6 socket, 7 client, 8 stop): $(cat "$run/unit.log" "$run/client.out" 2>/dev/null | tail -n 8)"
    echo "  as the unit runs it: uid $user, no capability (CapEff/CapPrm/CapBnd/CapAmb 0), /run/gmlake/gmlake-0.sock $group 0660; a client of uid 65534 in group $group allocated"
  fi
fi
# make uninstall: every file make install wrote goes, and GMLake's own directories; an edited config stays
echo "limit = 2GiB # an operator's edit" >> "$d/etc/gmlake/gmlaked.conf"
make -s uninstall BUILD="$BUILD" DESTDIR="$d" PREFIX=$P > "$run/un" 2>&1 || fail "make uninstall: $(cat "$run/un")"
left=$(cd "$d" && find . \( -type f -o -type l \) ! -path ./prog.c ! -path ./prog ! -path ./prog-static ! -path ./static/\*)
[ "$left" = "./etc/gmlake/gmlaked.conf" ] || fail "make uninstall left: $left"
grep -q "kept /etc/gmlake/gmlaked.conf: edited" "$run/un" || fail "make uninstall did not say it kept the edited config"
sed -i '$d' "$d/etc/gmlake/gmlaked.conf"
make -s install BUILD="$BUILD" DESTDIR="$d" PREFIX=$P >/dev/null && make -s uninstall BUILD="$BUILD" DESTDIR="$d" PREFIX=$P >/dev/null
left=$(cd "$d" && find . \( -type f -o -type l \) ! -path ./prog.c ! -path ./prog ! -path ./prog-static ! -path ./static/\*)
[ -z "$left" ] || fail "make uninstall after a fresh install left: $left"
[ ! -e "$d$P/share/gmlake" ] && [ ! -e "$d$P/libexec/gmlake" ] && [ ! -e "$d/etc/gmlake" ] || fail "make uninstall left GMLake's directories"
echo "  make uninstall: every installed file gone, and share/gmlake, libexec/gmlake, /etc/gmlake; an edited config kept, said"
