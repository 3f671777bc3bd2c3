# tests/lib.sh: sourced by tests/run.sh and the shell tests. What tests/skip.h is
# to the C tests: a check that cannot run here says so and is counted.
#   skip NAME WHY     "skipped NAME: WHY" into $GMLAKE_SKIP_LOG; as root (CI), where
#                     everything these tests need can be had, it fails instead (exit 1)
#   not_run NAME WHY  what this machine lacks whoever runs it (torch, a writable
#                     cgroup2, a mount namespace): counted as not run, never a failure
skip() {
  [ -z "${GMLAKE_SKIP_LOG:-}" ] || echo "skipped $1: $2" >> "$GMLAKE_SKIP_LOG"
  if [ "$(id -u)" = 0 ]; then echo "$1: skipped as root ($2): as root every test must run" >&2; exit 1; fi
  echo "  ($1: skipped: $2)"
}
not_run() {
  [ -z "${GMLAKE_SKIP_LOG:-}" ] || echo "not-run $1: $2" >> "$GMLAKE_SKIP_LOG"
  echo "  ($1: not run: $2)"
}
# wait_for SECONDS CMD...: runs CMD every 0.05 s until it succeeds (0), or SECONDS passed (1).
# What a test waits for is an event (a log line, a stats field), never a fixed sleep; SECONDS is
# generous, for a loaded machine under the sanitizers.
wait_for() {
  _wf_end=$(($(date +%s) + $1))
  shift
  until "$@"; do
    [ "$(date +%s)" -lt "$_wf_end" ] || return 1
    sleep 0.05
  done
}
