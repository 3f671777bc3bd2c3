#!/bin/sh
# tests/all.sh: make test's steps (the Makefile's test target runs it after scripts/deps.sh):
#   1. the plain build, then its suite (tests/run.sh);
#   2. beside that suite, niced, the sanitizer build and the fuzz targets' build (the suite mostly
#      waits on daemons and clients: on CI's two cores the builds cost it little, and the san suite
#      then starts at once);
#   3. the suite under ASan+UBSan+LeakSanitizer, then each fuzz target for FUZZ_SECONDS (tests/fuzz/run.sh,
#      as many at once as there are cores).
# Each step runs only if the one before passed; the background builds are waited for either way
# (nothing is left running), and a failed one prints its log's end.
set -u
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 1)}
MAKE=${MAKE:-make}
$MAKE -s -j"$JOBS" all || exit 1
mkdir -p build-san build-fuzz
( nice -n 10 $MAKE -s -j"$JOBS" BUILD=build-san SAN=1 all > build-san/build.log 2>&1 || exit 1
  nice -n 10 $MAKE -s -j"$JOBS" fuzz > build-fuzz/build.log 2>&1 || exit 2 ) &
builds=$!
$MAKE check-plain
rc=$?
wait $builds
b=$?
case $b in
  0) ;;
  1) echo "the sanitizer build failed (build-san/build.log):" >&2; tail -n 40 build-san/build.log >&2 ;;
  *) echo "the fuzz targets' build failed (build-fuzz/build.log):" >&2; tail -n 40 build-fuzz/build.log >&2 ;;
esac
[ $rc = 0 ] || exit $rc
[ $b = 0 ] || exit 1
$MAKE check-san || exit 1
$MAKE check-fuzz
