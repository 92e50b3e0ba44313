#!/usr/bin/env bash
# Runs the network-namespace tests (test/netns) verbosely with an explicit
# timeout (NETNS_TIMEOUT, default 30m: one pass takes 6-8 minutes on a
# 2-core machine, and go test's default of 10 minutes would panic a run
# on a loaded one), then lists the slowest tests. Arguments go to go test
# (e.g. -skip 'TestVMRxe'). Exits with go test's status.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
go test -count=1 -v -timeout "${NETNS_TIMEOUT:-30m}" "$@" ./test/netns/ 2>&1 |
  grep --line-buffered -Ev '^=== (RUN|PAUSE|CONT)' | tee "$log"
rc=${PIPESTATUS[0]}
echo "slowest netns tests:"
grep -E '^\s*--- (PASS|FAIL): Test[^ /]* \(' "$log" |
  sed -E 's/^\s*--- (PASS|FAIL): ([^ ]+) \(([0-9.]+)s\)/\3 \2 \1/' | sort -rn | head -10 |
  awk '{printf "  %8.1fs  %s (%s)\n", $1, $2, $3}'
exit "$rc"
