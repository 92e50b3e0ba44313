#!/usr/bin/env bash
# Runs every `go test -fuzz` target of the packages $2 (default ./...)
# for $1 each (default 60s; a count such as 200000x works too), all of
# them whatever fails,
# and prints a summary. A target fails when the fuzzer finds a failing
# input (it writes it under testdata/fuzz/) or the test does not build.
# A duration-limited run of Go 1.26 can also end with the fuzz
# coordinator's own "context deadline exceeded" at the time limit and no
# failing input (golang/go#75804, fixed in Go 1.27): such a run is
# reported apart, as "deadline", and does not fail the run; a count
# (-fuzztime Nx) has no deadline to race.
set -uo pipefail
cd "$(dirname "$0")/.."
time=${1:-60s}
passed=() failed=() deadline=()
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for pkg in $(go list "${2:-./...}"); do
  targets=$(go test -list '^Fuzz' "$pkg" 2>"$out") || { cat "$out"; failed+=("$pkg (does not build)"); continue; }
  for t in $(grep '^Fuzz' <<<"$targets"); do
    echo "== $pkg $t ($time)"
    dir=$(go list -f '{{.Dir}}' "$pkg")/testdata/fuzz/$t
    before=$(ls "$dir" 2>/dev/null | wc -l)
    go test "$pkg" -run '^$' -fuzz "^$t\$" -fuzztime "$time" >"$out" 2>&1
    rc=$?
    tail -n 3 "$out"
    after=$(ls "$dir" 2>/dev/null | wc -l)
    if [ "$rc" -eq 0 ]; then
      passed+=("$pkg $t")
    elif [ "$after" -eq "$before" ] && ! grep -q 'Failing input written' "$out" &&
      grep -q 'context deadline exceeded' "$out" && ! grep -Eq '^\s+[a-z_]+\.go:[0-9]+:' "$out"; then
      deadline+=("$pkg $t")
    else
      cat "$out"
      failed+=("$pkg $t")
    fi
  done
done
echo
echo "fuzz summary ($time each):"
for x in "${failed[@]}"; do echo "  FAIL      $x"; done
for x in "${deadline[@]}"; do echo "  deadline  $x (the Go fuzzer's own time-limit race, golang/go#75804: no failing input)"; done
echo "${#passed[@]} passed, ${#failed[@]} failed, ${#deadline[@]} ended on the fuzzer's deadline"
[ "${#failed[@]}" -eq 0 ]
