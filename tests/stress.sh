#!/bin/sh
# tests/stress.sh [-n RUNS] [-b BUSY] BUILD BINARY...: runs each multi-process test binary of
# BUILD (test_integration, test_elastic, test_security, or all three when none is named) RUNS
# times (20) with BUSY busy-loop processes beside it (2): a test that passes only on an idle
# machine fails here. GMLAKE_TESTS=NAME,... narrows a binary to those tests. BUILD build-san runs
# under the sanitizers' options as make check-san does. The output of a failed run is kept in
# BUILD/stress/BINARY.N.log ($STRESS_LOGS/ instead where set: streams run side by side). Exit 1 when any run failed.
#   e.g. tests/stress.sh build; tests/stress.sh -n 20 build-san test_elastic
runs=20 busy=2
while getopts n:b: o; do case $o in n) runs=$OPTARG;; b) busy=$OPTARG;; *) exit 2;; esac; done
shift $((OPTIND - 1))
BUILD=${1:?usage: tests/stress.sh [-n RUNS] [-b BUSY] BUILD [BINARY...]}
shift
[ $# -gt 0 ] || set -- test_integration test_elastic test_security
case $BUILD in *san*) export CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-3};; esac # as make check-san (tests/run.sh)
export BUILD ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
logs=${STRESS_LOGS:-$BUILD/stress}
mkdir -p "$logs"
pids=
for _ in $(seq "$busy"); do sh -c 'while :; do :; done' & pids="$pids $!"; done
trap 'kill $pids 2>/dev/null' EXIT
bad=0
for t in "$@"; do
  ok=0 start=$(date +%s)
  for i in $(seq "$runs"); do
    if "$BUILD/$t" > "$logs/$t.$i.log" 2>&1; then ok=$((ok + 1)); rm -f "$logs/$t.$i.log"
    else echo "  $t run $i FAILED: $(grep -m3 -E ':[EF]:' "$logs/$t.$i.log" | cut -c1-300)"; fi
  done
  echo "$t ($BUILD${GMLAKE_TESTS:+, $GMLAKE_TESTS}): $ok of $runs runs passed beside $busy busy loops ($(( $(date +%s) - start )) s)"
  [ $ok = "$runs" ] || bad=1
done
exit $bad
