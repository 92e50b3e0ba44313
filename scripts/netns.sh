#!/usr/bin/env bash
# Runs the network-namespace tests (test/netns) verbosely with an explicit
# timeout (NETNS_TIMEOUT, default 60m: the first pass, with the QEMU
# tests, takes about 16 minutes on a quiet 2-core machine and more than
# 30 on one as busy as make test-load makes it, where 30m ended a passing
# run; a hung test still ends with go test's goroutine dump), then lists the slowest tests and, last, each failed
# test's own messages (its t.Log/t.Error lines, cut to one line each),
# so that they are in the tail of a long log whose middle a CI summary
# may cut. Arguments go to go test (e.g. -skip 'TestVMRxe'). Exits with
# go test's status.
set -uo pipefail
cd "$(dirname "$0")/.."
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
go test -count=1 -v -timeout "${NETNS_TIMEOUT:-60m}" "$@" ./test/netns/ 2>&1 | tee "$raw" |
  grep --line-buffered -Ev '^=== (RUN|PAUSE|CONT)'
rc=${PIPESTATUS[0]}
echo "slowest netns tests:"
grep -E '^\s*--- (PASS|FAIL): Test[^ /]* \(' "$raw" |
  sed -E 's/^\s*--- (PASS|FAIL): ([^ ]+) \(([0-9.]+)s\)/\3 \2 \1/' | sort -rn | head -10 |
  awk '{printf "  %8.1fs  %s (%s)\n", $1, $2, $3}'
if grep -qE '^--- FAIL: ' "$raw"; then
  echo "failed netns tests, their messages (the last 15 of each, cut at 300 characters):"
  awk '
    /^=== (RUN|NAME|CONT) +Test[^\/ ]*$/ { t = $3; n[t] = 0 }
    /^ +[A-Za-z0-9_]+_test\.go:[0-9]+: / { m[t, n[t]++ % 15] = substr($0, 1, 300) }
    /^--- FAIL: Test/ {
      f = $3; print "  " f ":"
      k = n[f] > 15 ? n[f] - 15 : 0
      for (i = k; i < n[f]; i++) print "  " m[f, i % 15]
    }' "$raw"
fi
exit "$rc"
