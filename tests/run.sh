#!/bin/sh
# Runs the unit and integration suites from $BUILD (default build).
set -e
BUILD=${BUILD:-build}
export BUILD
echo "== unit tests ($BUILD)"
"$BUILD/test_unit"
echo "== multi-process integration tests ($BUILD)"
"$BUILD/test_integration"
echo "== replay of the recorded PyTorch traces ($BUILD)"
"$BUILD/gmlake-replay" --check 5000 tests/traces/*.trace.gz
# The allocator's acceptance: fragmentation at peak <= 2% on every trace, and
# (plain build only: sanitizers slow the hot path) alloc/free medians <= 1 us;
# with the host backend's 2 MiB chunks and with the cuda backend's 4 MiB.
for cs in 2MiB 4MiB; do
echo "  chunks of $cs"
GMLAKE_CHUNK_SIZE=$cs "$BUILD/gmlake-replay" --json tests/traces/*.trace.gz | python3 -c '
import json, sys
san = sys.argv[1] == "1"
bad = 0
for line in sys.stdin:
    r = json.loads(line)
    ok = r["frag"] <= 0.02 and (san or (r["alloc_p50_ns"] <= 1000 and r["free_p50_ns"] <= 1000))
    print("  %-20s frag %.2f%%  alloc p50 %dns  free p50 %dns  %s" % (r["trace"], 100 * r["frag"], r["alloc_p50_ns"], r["free_p50_ns"], "ok" if ok else "FAILED"))
    bad += not ok
sys.exit(1 if bad else 0)' "${SAN:-0}"
done
echo "== systemd unit (systemd-analyze verify, ExecStart pointed at $BUILD/gmlaked)"
if command -v systemd-analyze >/dev/null; then
  d=$(mktemp -d)
  sed "s|/usr/local/bin/gmlaked|$(pwd)/$BUILD/gmlaked|" systemd/gmlaked@.service > "$d/gmlaked@.service"
  systemd-analyze verify "$d/gmlaked@.service"
  rm -rf "$d"
else
  echo "systemd-analyze missing (scripts/deps.sh installs it)" >&2; exit 1
fi
echo "all tests passed ($BUILD)"
