#!/usr/bin/env bash
# Runs the request-path benchmarks against a private redis-server on a free
# loopback port (started and stopped like scripts/test.sh does), COUNT times
# each (default 6), and summarises them with benchstat when it is installed
# (go install golang.org/x/perf/cmd/benchstat@latest).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v redis-server >/dev/null || { echo "bench.sh: install redis-server first (scripts/test.sh does)" >&2; exit 1; }
source scripts/private-redis.sh
dir=$(mktemp -d)
trap 'private_redis_stop; rm -rf "$dir"' EXIT
private_redis_start "$dir"
port=$PRIVATE_REDIS_PORT
out=${OUT:-bench.txt}
REQLOCK_REDIS_ADDR=127.0.0.1:$port go test -run '^$' -bench . -benchmem -count "${COUNT:-6}" ./internal/bench | tee "$out"
if command -v benchstat >/dev/null; then benchstat "$out"; elif [[ -x $(go env GOPATH)/bin/benchstat ]]; then "$(go env GOPATH)/bin/benchstat" "$out"; fi
