#!/usr/bin/env bash
# The tests under load: the unit tests with the race detector three times
# over (-race -count=3), then the network-namespace suite once
# (scripts/netns.sh), while stress-ng keeps one CPU hog per core busy the
# whole time, so that a test that counts periodic work, compares a timing
# field or meets a tight deadline fails here rather than on a developer's
# busy machine. The hogs run at the tests' own priority (no nice): the
# machine is as busy as one running two guests. They are stopped on any
# exit. Prints each stage's result and the time it took, then a summary
# line; exits non-zero if either stage failed (both always run).
# Environment: LOAD_HOGS (CPU hogs, default one per core), and
# NETNS_TIMEOUT as scripts/netns.sh reads it (its default of 60m leaves
# room for the suite, which runs at about half speed under the hogs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
command -v stress-ng >/dev/null || { echo "test-load: stress-ng missing (scripts/deps.sh installs it)" >&2; exit 1; }
hogs=${LOAD_HOGS:-$(nproc)}
stress-ng --cpu "$hogs" --cpu-method matrixprod --quiet &
hog=$!
stop() {
  # stress-ng stops its workers on SIGTERM; wait reaps it, so the PID is
  # never signalled again once the kernel may reuse it.
  kill -TERM "$hog" 2>/dev/null
  wait "$hog" 2>/dev/null
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
echo "test-load: $hogs CPU hogs (stress-ng, pid $hog) on $(nproc) cores"
declare -A took rc
stage() { # name command...
  local name=$1 t0=$SECONDS
  shift
  echo "== test-load: $name"
  "$@"
  rc[$name]=$?
  took[$name]=$((SECONDS - t0))
}
pkgs=$(go list ./... | grep -v /test/netns)
# shellcheck disable=SC2086 # a list of packages
stage unit go test -race -count=3 -timeout 60m $pkgs
stage netns ./scripts/netns.sh
echo "== test-load summary (load average $(cut -d' ' -f1-3 /proc/loadavg))"
fail=0
for s in unit netns; do
  if [ "${rc[$s]}" -eq 0 ]; then r=ok; else r="FAIL (exit ${rc[$s]})"; fail=1; fi
  printf '  %-6s %-16s %5d s\n' "$s" "$r" "${took[$s]}"
done
exit "$fail"
