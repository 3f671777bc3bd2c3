#!/bin/sh
# Runs the unit and integration suites from $BUILD (default build).
set -e
BUILD=${BUILD:-build}
export BUILD
echo "== unit tests ($BUILD)"
"$BUILD/test_unit"
echo "== multi-process integration tests ($BUILD)"
"$BUILD/test_integration"
echo "== replay of the shared traces ($BUILD)"
for t in ../shared/traces/*.trace.gz shared/traces/*.trace.gz; do
  [ -f "$t" ] && "$BUILD/gmlake-replay" --check 5000 "$t"
done
echo "== systemd unit"
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify systemd/gmlaked@.service 2>&1 | grep -v -e 'not executable' -e 'No such file' || true
  systemd-analyze verify systemd/gmlaked@.service
fi
echo "all tests passed ($BUILD)"
