#!/usr/bin/env bash
# Runs every `go test -fuzz` target of the module for $1 (default 60s) each.
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-60s}
for pkg in $(go list ./...); do
  for t in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "== $pkg $t ($time)"
    go test "$pkg" -run '^$' -fuzz "^$t\$" -fuzztime "$time"
  done
done
