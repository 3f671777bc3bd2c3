#!/bin/sh
# tests/fuzz/run.sh BUILD SECONDS TARGET...: runs each libFuzzer target for
# SECONDS from its seed corpus (tests/fuzz/corpus/TARGET, read only: new
# inputs go to a scratch folder). A crash, leak, sanitizer report or timeout
# fails, and the input that did it is kept under $BUILD/fuzz-artifacts/.
set -e
build=$1 secs=$2
shift 2
mkdir -p "$build/fuzz-artifacts"
n=0
trap 'echo "$n $(($# - n)) 0 0" > "$build/test-summary"' EXIT # passed, failed (the rest: not run past a failure)
for t in "$@"; do
  echo "== fuzz $t for ${secs}s (seeds: tests/fuzz/corpus/$t)"
  scratch=$(mktemp -d)
  if ! "$build/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$build/fuzz-artifacts/$t-" "$scratch" "tests/fuzz/corpus/$t" >"$scratch.log" 2>&1; then
    tail -n 60 "$scratch.log"
    echo "fuzz $t FAILED: the input is in $build/fuzz-artifacts/ (reproduce: $build/$t FILE)" >&2
    rm -rf "$scratch" "$scratch.log"
    exit 1
  fi
  grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added)" "$scratch.log" | sed 's/^/  /'
  rm -rf "$scratch" "$scratch.log"
  n=$((n + 1))
done
echo "fuzz targets passed"
