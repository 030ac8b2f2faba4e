#!/usr/bin/env bash
# Runs the request-path benchmarks against a private redis-server on a free
# loopback port (started and stopped like scripts/test.sh does), COUNT times
# each (default 6), and summarises them with benchstat when it is installed
# (go install golang.org/x/perf/cmd/benchstat@latest).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v redis-server >/dev/null || { echo "bench.sh: install redis-server first (scripts/test.sh does)" >&2; exit 1; }
dir=$(mktemp -d)
port=
pid=
trap '[[ -n $pid ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 20); do
	candidate=$((20000 + RANDOM % 40000))
	(exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null && continue
	redis-server --port "$candidate" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >"$dir/log" 2>&1 &
	pid=$!
	for _ in $(seq 50); do
		[[ $(redis-cli -p "$candidate" ping 2>/dev/null || true) == PONG ]] && { port=$candidate; break 2; }
		sleep 0.1
	done
	kill "$pid" 2>/dev/null || true
	pid=
done
[[ -n $port ]] || { echo "bench.sh: could not start redis-server" >&2; exit 1; }
out=${OUT:-bench.txt}
REQLOCK_REDIS_ADDR=127.0.0.1:$port go test -run '^$' -bench . -benchmem -count "${COUNT:-6}" ./internal/bench | tee "$out"
if command -v benchstat >/dev/null; then benchstat "$out"; elif [[ -x $(go env GOPATH)/bin/benchstat ]]; then "$(go env GOPATH)/bin/benchstat" "$out"; fi
