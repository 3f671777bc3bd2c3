#!/bin/sh
# tests/fuzz/run.sh BUILD SECONDS TARGET...: runs each libFuzzer target for
# SECONDS from its seed corpus (tests/fuzz/corpus/TARGET, read only: new
# inputs go to a scratch folder), FUZZ_JOBS of them at once (default: the
# cores). A crash, leak, sanitizer report or timeout fails, and the input
# that did it is kept under $BUILD/fuzz-artifacts/.
set -u
build=$1 secs=$2
shift 2
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
mkdir -p "$build/fuzz-artifacts"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
passed=0 failed=0
# one target, its output to $scratch/T.log, its status to $scratch/T.rc
one() {
  mkdir "$scratch/$1"
  "$build/$1" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-artifacts/$1-" "$scratch/$1" "tests/fuzz/corpus/$1" >"$scratch/$1.log" 2>&1
  echo $? > "$scratch/$1.rc"
}
report() {
  if [ "$(cat "$scratch/$1.rc")" = 0 ]; then
    echo "== fuzz $1 for ${secs}s (seeds: tests/fuzz/corpus/$1)"
    grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added)" \
      "$scratch/$1.log" | sed 's/^/  /'
    passed=$((passed + 1))
  else
    echo "== fuzz $1 for ${secs}s (seeds: tests/fuzz/corpus/$1): FAILED"
    tail -n 60 "$scratch/$1.log"
    echo "fuzz $1 FAILED: the input is in $build/fuzz-artifacts/ (reproduce: $build/$1 FILE)" >&2
    failed=$((failed + 1))
  fi
}
set -- "$@"
while [ $# -gt 0 ]; do
  group=
  i=0
  while [ $# -gt 0 ] && [ $i -lt "$jobs" ]; do
    one "$1" &
    group="$group $1"
    i=$((i + 1))
    shift
  done
  wait
  for t in $group; do report "$t"; done
  [ $failed = 0 ] || break
done
# passed, failed (the targets not run past a failure count as failed), skipped, not run
echo "$passed $((failed + $#)) 0 0" > "$build/test-summary"
[ $failed = 0 ] || exit 1
echo "fuzz targets passed ($jobs at once)"
