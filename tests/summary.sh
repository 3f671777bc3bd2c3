#!/bin/sh
# tests/summary.sh DIR...: make test's last line, from each build's test-summary
# ("PASSED FAILED SKIPPED NOT_RUN", written by tests/run.sh and tests/fuzz/run.sh);
# a build that wrote none did not run (an earlier one failed).
p=0 f=0 s=0 n=0 parts=
for d in "$@"; do
  if [ -f "$d/test-summary" ]; then
    read -r a b c e < "$d/test-summary"
    p=$((p + a)) f=$((f + b)) s=$((s + c)) n=$((n + e))
    parts="$parts, $d: $a/$b/$c/$e"
  else
    parts="$parts, $d: did not run"
  fi
done
echo "make test: $p passed, $f failed, $s skipped, $n not run (passed/failed/skipped/not run${parts})"
